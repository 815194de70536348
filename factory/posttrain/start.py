"""Where a post-training run starts: a checkpoint named `ckpt/<run>@<step>`, or `ckpt/<experiment>@<step>`
for that experiment's newest run with that step (`make demo` trains `smoke` as run `smoke-<hash8>`, and
a config file cannot know the hash). Shared by SFT and RL."""

from __future__ import annotations


def check_start_field(value: str) -> str:
    """The pydantic check of a `start` field."""
    if not value.startswith("ckpt/") or "@" not in value:
        raise ValueError(f"start={value!r}: name a checkpoint as ckpt/<run>@<step>")
    return value


def resolve_start(lake, start: str):
    """The start checkpoint, verified on disk (`TrainedCheckpoint`); ExportError when it is not there."""
    from factory.infer.export import find_checkpoint
    from factory.train.checkpoint import checkpoints

    name, _, step = start.removeprefix("ckpt/").rpartition("@")
    known = checkpoints(lake)
    rows = [r for r in known if r["checkpoint_id"] == start]
    if not rows:
        rows = sorted((r for r in known if r["experiment"] == name and str(r["step"]) == step),
                      key=lambda r: r["created_at"])
    return find_checkpoint(lake, rows[-1]["checkpoint_id"] if rows else start)
