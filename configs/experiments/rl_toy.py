"""RL from code execution on the toy curriculum: GRPO on the smoke model, rewards only from sandboxed
checks (factory/posttrain/rl/toy.py), rollouts on vLLM, the weight sync verified after every update.

Run it with `python -m factory.posttrain.rl --experiment rl_toy` (after `make demo` trained smoke),
or materialize the `rl_run` asset's `rl_toy` partition from the UI (`rl_job`).
"""

from __future__ import annotations

from factory.posttrain.rl import RLConfig
from factory.posttrain.rl.config import OptimConfig, RolloutConfig


def rl_toy() -> RLConfig:
    """Goal: the smoke model's reward on the toy curriculum rises within minutes on a CPU."""
    return RLConfig(
        name="rl_toy",
        description="GRPO on the toy curriculum from the demo's smoke checkpoint: does the reward rise?",
        start="ckpt/smoke@120",
        reward="toy",
        steps=40,
        rollout=RolloutConfig(prompts_per_step=8, group_size=4, max_tokens=1),
        optimizer=OptimConfig(lr=3e-3),
        checkpoint_every=10,
        eval_every=20,
    )


def rl_toy_async() -> RLConfig:
    """The same run with the actor one update ahead of the trainer (bounded staleness 1)."""
    return RLConfig.model_validate({**rl_toy().model_dump(), "name": "rl_toy_async", "mode": "async",
                                    "max_staleness": 1})
