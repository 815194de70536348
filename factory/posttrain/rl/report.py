"""What an RL run's page shows: the reward curve (an inline plot), pass rates by task family at the
start and the end of the run, and the run's numbers; read from rl.rollouts, so a resumed run's page
covers the whole run, not only the part after its last relaunch."""

from __future__ import annotations

from collections import defaultdict

from factory.lake import Lake
from factory.posttrain.rl.store import rollouts
from factory.train.plot import loss_curve_markdown


def reward_curve(rows: list[dict]) -> list[tuple[int, float]]:
    """(step, mean reward of the batch that update used), from rl.rollouts rows."""
    by_step: dict[int, list[float]] = defaultdict(list)
    for r in rows:
        if r["used"]:
            by_step[r["step"]].append(r["reward"])
    return [(step, sum(v) / len(v)) for step, v in sorted(by_step.items())]


def pass_rates(rows: list[dict], fraction: float = 0.2) -> list[dict]:
    """Pass rate per task family (the task id up to its last `/`) over the first and the last `fraction`
    of the run's steps."""
    steps = sorted({r["step"] for r in rows if r["used"]})
    if not steps:
        return []
    cut = max(1, round(len(steps) * fraction))
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
