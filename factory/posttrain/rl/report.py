"""What an RL run's page shows: the reward curve (an inline plot), pass rates by task family at the
start and the end of the run, and the run's numbers; read from rl.rollouts, so a resumed run's page
covers the whole run, not only the part after its last relaunch. `final_reward` is the one number an
RL sweep ranks its cells by: the mean reward over the last `FINAL_FRACTION` of the steps (an average
over several steps, as one step's batch is a few dozen noisy samples). Matplotlib is imported only
to draw the curve: `factory sweep results` ranks cells without it."""

from __future__ import annotations

import math
from collections import defaultdict

from factory.lake import Lake
from factory.posttrain.rl.store import rollouts

FINAL_FRACTION = 0.2  # "the end of the run": its last 20 % of steps (at least one)


def reward_curve(rows: list[dict]) -> list[tuple[int, float]]:
    """(step, mean reward of the batch that update used), from rl.rollouts rows."""
    by_step: dict[int, list[float]] = defaultdict(list)
    for r in rows:
        if r["used"]:
            by_step[r["step"]].append(r["reward"])
    return [(step, sum(v) / len(v)) for step, v in sorted(by_step.items())]


def _cut(steps: list[int], fraction: float) -> int:
    return max(1, round(len(steps) * fraction))


def final_reward(rows: list[dict], fraction: float = FINAL_FRACTION) -> dict | None:
    """The mean reward of the used samples of the last `fraction` of the run's steps, with its standard
    error (sample std / sqrt(n); None for one sample), the sample count and the steps it covers; None
    when the run has no used sample yet."""
    steps = sorted({r["step"] for r in rows if r["used"]})
    if not steps:
        return None
    last = set(steps[-_cut(steps, fraction):])
    rewards = [r["reward"] for r in rows if r["used"] and r["step"] in last]
    n, mean = len(rewards), sum(rewards) / len(rewards)
    stderr = math.sqrt(sum((x - mean) ** 2 for x in rewards) / (n - 1) / n) if n > 1 else None
    return {"value": mean, "stderr": stderr, "samples": n, "first_step": min(last), "step": max(last)}


def pass_rates(rows: list[dict], fraction: float = FINAL_FRACTION) -> list[dict]:
    """Pass rate per task family (the task id up to its last `/`) over the first and the last `fraction`
    of the run's steps."""
    steps = sorted({r["step"] for r in rows if r["used"]})
    if not steps:
        return []
    cut = _cut(steps, fraction)
    first, last = set(steps[:cut]), set(steps[-cut:])
    families: dict[str, dict[str, list[float]]] = defaultdict(lambda: {"first": [], "last": []})
    for r in rows:
        if not r["used"]:
            continue
        family = r["task_id"].rsplit("/", 1)[0] if "/" in r["task_id"] else "tasks"
        if r["step"] in first:
            families[family]["first"].append(r["reward"] == 1.0)
        if r["step"] in last:
            families[family]["last"].append(r["reward"] == 1.0)
    return [{"family": name, "first": _share(v["first"]), "last": _share(v["last"]), "samples": len(v["last"])}
            for name, v in sorted(families.items())]


def rl_summary(lake: Lake, config, reported: dict) -> dict:
    from factory.train.plot import loss_curve_markdown

    rows = rollouts(lake, config.name)
    curve = reward_curve(rows)
    return {
        "reward_curve": loss_curve_markdown(curve, f"{config.name}: mean reward per step") if curve else "no steps",
        "steps": reported.get("steps"), "checkpoints": reported.get("checkpoints"),
        "pass_rates": pass_rates(rows), "sync_share": reported.get("sync_share"),
        "dropped_batches": reported.get("dropped_batches"), "resumed_from": reported.get("resumed_from"),
        "rollouts": len(rows), "seconds": reported.get("seconds"),
        "details": {"start": config.start, "reward": config.reward, "mode": config.mode,
                    "group_size": config.rollout.group_size, "prompts_per_step": config.rollout.prompts_per_step},
    }


def _share(values: list[bool]) -> float | None:
    return round(sum(values) / len(values), 4) if values else None
