"""Checkpoints: a payload of model, optimizer, RNG and Python state round-trips through
`torch.load(weights_only=True)`; a truncated, corrupt or manifest-less newest checkpoint is skipped
with its reason in the log; `prune` keeps the newest N intact ones; a process SIGKILLed in the
middle of a save leaves no valid half checkpoint; `record_checkpoint` writes the
`train.checkpoints` row and the lineage row.

These run on CPU with tiny tensors, a real child process for the kills (~2 s each) and a real
pyiceberg `SqlCatalog` on sqlite in `tmp_path`.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from factory.train.checkpoint import (
    checkpoint_dir,
    checkpoints,
    latest_valid,
    load_checkpoint,
    manifest_path,
    prune,
    record_checkpoint,
    save_checkpoint,
    validate,
)


def same(a, b) -> bool:
    """Deep equality over tensors, dicts, lists, tuples and scalars (types must match too)."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


def training_payload(step: int) -> dict:
    torch.manual_seed(step)
    model = torch.nn.Linear(4, 3)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    return {
        "model": model.state_dict(), "optimizer": opt.state_dict(), "rng": torch.get_rng_state(),
        "loader": {"step": step, "sources": [{"table": "refined.a", "offset": 17}], "name": "toy",
                   "weights": [0.25, 0.75], "blob": b"\x00\x01", "nothing": None},
    }


def save(directory: Path, step: int, **kw):
    return save_checkpoint(directory, step, training_payload(step), run="toy", tokens=step * 1024,
                           loss=1.0 / step, **kw)


def test_round_trip_with_weights_only(tmp_path):
    payload = training_payload(3)
    assert payload["optimizer"]["state"][0]["exp_avg"].abs().sum() > 0  # the step really ran
    ref = save_checkpoint(tmp_path, 3, payload, run="toy", tokens=3072, loss=0.5)

    assert ref.path == tmp_path / "step-00000003.pt" and manifest_path(ref.path).exists()
    assert ref.bytes == ref.path.stat().st_size and validate(ref.path) is None
    assert ref.checkpoint_id == "ckpt/toy@3" and ref.uri == ref.path.resolve().as_uri()
    assert list(tmp_path.glob(".*.tmp")) == []

    loaded = load_checkpoint(ref)
    assert same(payload, loaded)
    torch.set_rng_state(payload["rng"])
    expected = torch.rand(3)
    torch.set_rng_state(loaded["rng"])
    assert torch.equal(torch.rand(3), expected)
    assert latest_valid(tmp_path, log=pytest.fail) == ref


def test_truncated_newest_falls_back_with_a_warning(tmp_path):
    save(tmp_path, 1)
    second = save(tmp_path, 2)
    third = save(tmp_path, 3)
    with open(third.path, "r+b") as f:
        f.truncate(third.bytes // 2)

    logged: list[str] = []
    assert latest_valid(tmp_path, logged.append) == second
    assert len(logged) == 1 and "step-00000003.pt" in logged[0] and "size mismatch" in logged[0]


def test_file_without_manifest_is_skipped(tmp_path):
    first = save(tmp_path, 1)
    manifest_path(save(tmp_path, 2).path).unlink()  # as if killed between the two renames

    logged: list[str] = []
    assert latest_valid(tmp_path, logged.append) == first
    assert len(logged) == 1 and "step-00000002.pt" in logged[0] and "no manifest" in logged[0]


def test_flipped_byte_is_a_sha256_mismatch(tmp_path):
    first = save(tmp_path, 1)
    second = save(tmp_path, 2)
    data = bytearray(second.path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    second.path.write_bytes(bytes(data))

    assert second.path.stat().st_size == second.bytes
    assert validate(second.path).startswith("sha256 mismatch")
    logged: list[str] = []
    assert latest_valid(tmp_path, logged.append) == first
    assert "step-00000002.pt" in logged[0] and "sha256" in logged[0]


def test_nothing_valid(tmp_path):
    assert latest_valid(tmp_path / "missing", log=pytest.fail) is None
    manifest_path(save(tmp_path, 1).path).unlink()
    logged: list[str] = []
    assert latest_valid(tmp_path, logged.append) is None and len(logged) == 1


def test_prune_keeps_newest_valid(tmp_path):
    refs = [save(tmp_path, step) for step in range(1, 7)]
    stale = tmp_path / ".step-00000004.pt.abc.tmp"  # an unfinished write from before a crash
    stale.write_bytes(b"half")
    old = refs[0].path.stat().st_mtime - 60
    os.utime(stale, (old, old))
    with open(refs[5].path, "r+b") as f:  # the newest (step 6) is broken
        f.truncate(10)
    with open(refs[1].path, "r+b") as f:  # an old one is broken too
        f.truncate(10)

    deleted = prune(tmp_path, keep_last=2)

    assert sorted(p.name for p in deleted) == sorted(
        [f"step-0000000{s}.{ext}" for s in (1, 2, 3) for ext in ("pt", "json")] + [stale.name])
    remaining = sorted(p.name for p in tmp_path.glob("step-*.pt"))
    assert remaining == ["step-00000004.pt", "step-00000005.pt", "step-00000006.pt"]  # broken 6 kept
    assert latest_valid(tmp_path, log=lambda _: None) == refs[4]
    assert prune(tmp_path, keep_last=2) == []  # idempotent
    assert [p.name for p in prune(tmp_path, keep_last=1)] == ["step-00000004.json", "step-00000004.pt"]
    assert latest_valid(tmp_path, log=lambda _: None) == refs[4]  # the newest valid one survives
    with pytest.raises(ValueError, match="keep_last"):
        prune(tmp_path, keep_last=0)


CHILD = textwrap.dedent(
    """
    import os, signal, sys
    from pathlib import Path
    import torch
    from factory.train.checkpoint import save_checkpoint

    directory, kill_before = Path(sys.argv[1]), sys.argv[2]

    def die(final):
        if final.name.endswith(kill_before):
            os.kill(os.getpid(), signal.SIGKILL)

    save_checkpoint(directory, 1, {"w": torch.ones(64)}, run="toy", tokens=1, loss=None)
    save_checkpoint(directory, 2, {"w": torch.zeros(64)}, run="toy", tokens=2, loss=None, _before_rename=die)
    print("saved")  # must never happen
    """
)


@pytest.mark.parametrize("kill_before", [".pt", ".json"])
@pytest.mark.slow
def test_sigkill_during_save_leaves_no_valid_half_checkpoint(tmp_path, kill_before):
    child = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path), kill_before],
                           capture_output=True, text=True, timeout=120)
    assert child.returncode == -signal.SIGKILL, child.stderr[-3000:]
    assert "saved" not in child.stdout

    assert len(list(tmp_path.glob(".step-00000002.*.tmp"))) == 1  # the temp file the kill left
    assert (tmp_path / "step-00000002.pt").exists() == (kill_before == ".json")
    assert not (tmp_path / "step-00000002.json").exists()
    logged: list[str] = []
    ref = latest_valid(tmp_path, logged.append)
    assert ref.step == 1 and torch.equal(load_checkpoint(ref)["w"], torch.ones(64))
    assert len(logged) == (kill_before == ".json")


def test_record_checkpoint(lake):
    assert checkpoints(lake) == []
    directory = checkpoint_dir(lake.home, "toy")
    assert directory == lake.home / "artifacts" / "runs" / "toy" / "checkpoints"
    first, second = save(directory, 10), save(directory, 20)
    common = dict(experiment="toy-exp", mix_version="mix/toy@1", config_hash="cafe", eval_every=10, run_id="r1")
    record_checkpoint(lake, second, upstream=["mix/toy@1", "tokenizer/bpe@abc", first.checkpoint_id], **common)
    record_checkpoint(lake, first, upstream=["mix/toy@1", "tokenizer/bpe@abc"], **common)

    rows = checkpoints(lake)
    assert [r["step"] for r in rows] == [10, 20] and checkpoints(lake, run="toy") == rows
    assert checkpoints(lake, run="other") == []
    row = rows[1]
    assert row["checkpoint_id"] == "ckpt/toy@20" and row["uri"] == second.uri
    assert (row["sha256"], row["bytes"], row["tokens"]) == (second.sha256, second.bytes, 20 * 1024)
    assert row["loss"] == pytest.approx(0.05) and row["mix_version"] == "mix/toy@1"
    assert (row["experiment"], row["config_hash"], row["eval_every"]) == ("toy-exp", "cafe", 10)

    records = {r.version_id: r for r in lake.lineage.records()}
    assert set(records) == {"ckpt/toy@10", "ckpt/toy@20"}
    rec = records["ckpt/toy@20"]
    assert (rec.kind, rec.name, rec.uri, rec.content_hash) == ("checkpoint", "run/toy", second.uri, second.sha256)
    assert rec.upstream == ["mix/toy@1", "tokenizer/bpe@abc", "ckpt/toy@10"]
    assert rec.metadata["step"] == 20 and rec.metadata["tokens"] == 20480 and rec.metadata["loss"] == pytest.approx(0.05)
    assert rec.run_id == "r1" and rec.snapshot_id is not None
    assert lake.lineage.upstream_of("ckpt/toy@20")["upstream"][2]["record"].version_id == "ckpt/toy@10"
