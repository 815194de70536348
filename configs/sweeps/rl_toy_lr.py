"""Goal: which learning rate and group size make the smoke model's toy reward rise fastest?

A 2 x 2 grid on `rl_toy` (GRPO from the demo's smoke checkpoint on the toy curriculum), each cell
20 steps: learning rate x completions per task. Each cell is an `rl_run` partition named
`rl_toy_lr-<hash8>`; the cells rank by their mean reward over the last 20 % of steps in
rl.rollouts (higher is better). Launch: `factory sweep launch rl_toy_lr` (after `make demo`
trained smoke); compare: `factory sweep results rl_toy_lr`.
"""

from __future__ import annotations

from configs.experiments.rl_toy import rl_toy
from factory.experiments.sweep import SweepBudget, SweepConfig
from factory.posttrain.rl import RLConfig


def rl_toy_lr() -> SweepConfig:
    base = RLConfig.model_validate({**rl_toy().model_dump(), "steps": 20, "checkpoint_every": 10, "eval_every": 20})
    return SweepConfig(
        name="rl_toy_lr",
        description="GRPO learning rate x group size on the toy curriculum, 20 steps per cell.",
        base=base,
        search="grid",
        params={"optimizer.lr": [1e-3, 3e-3], "rollout.group_size": [4, 8]},
        budget=SweepBudget(max_runs=4, max_tokens=10_000),  # rollout tokens: 20 x 8 x 8 x 1 = 1,280 at most per cell
    )
