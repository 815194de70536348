"""Reinforcement learning from code execution: GRPO over vLLM rollouts with sandboxed rewards.

    from factory.posttrain.rl import RLConfig, run_rl
    run_rl(RLConfig(name="toy", start="ckpt/smoke@120", reward="toy", steps=40), lake)

Modules: config (RLConfig), grpo (advantages and loss), rollout (the vLLM actor), sync (verified
weight sync), components (registered rewards, actor, algorithm), toy (the learnable curriculum),
store (rl.rollouts), loop (the run).
"""

from factory.posttrain.rl.config import RLConfig, RLConfigError, check_rl_config

__all__ = ["RLConfig", "RLConfigError", "check_rl_config", "run_rl"]


def run_rl(*args, **kwargs):
    from factory.posttrain.rl.loop import run_rl as run

    return run(*args, **kwargs)
