"""Post-training: reinforcement learning from code execution (`rl/`); SFT follows."""
