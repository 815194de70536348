"""Run names as people type them (factory/train/runs.py): an experiment's name stands for its latest
run, the CLI says which, and an unknown id gets the closest real ones. CPU; a sqlite lake with
checkpoint rows (no training)."""

from __future__ import annotations

import datetime as dt

import pytest

from factory import cli
from factory.lake import Lake
from factory.train.checkpoint import CheckpointRef, record_checkpoint
from factory.train.runs import UnknownRun, resolve_ref, resolve_run

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)


@pytest.fixture
def lake(tmp_path) -> Lake:
    lake = Lake.open(home=tmp_path / "home")
    # two runs of experiment `smoke` (the second is newer) and one run named without a hash
    for minute, run in enumerate(["smoke-aaaaaaaa", "evalsmoke", "smoke-bbbbbbbb"]):
        for step in (4, 8):
            ref = CheckpointRef(run=run, step=step, path=tmp_path / f"{run}-{step}.pt", sha256="0" * 64, bytes=1,
                                tokens=step, loss=2.0, created_at=T0 + dt.timedelta(minutes=minute, seconds=step))
            record_checkpoint(lake, ref, experiment=run.split("-")[0], mix_version="mix/default@v1",
                              config_hash="c", eval_every=4, upstream=[])
    return lake


def test_an_experiment_name_means_its_latest_run_and_says_so(lake):
    assert resolve_run(lake, "smoke-aaaaaaaa").note is None  # a real run is itself, silently
    found = resolve_run(lake, "smoke")
    assert found.value == "smoke-bbbbbbbb"
    assert found.note == "smoke -> smoke-bbbbbbbb (experiment smoke's latest run of 2)"
    assert resolve_run(lake, "evalsmoke").value == "evalsmoke"
    for typed, meant in [("smoke@8", "smoke-bbbbbbbb@8"), ("ckpt/smoke@4", "ckpt/smoke-bbbbbbbb@4"),
                         ("export/smoke@8", "export/smoke-bbbbbbbb@8"), ("ckpt/evalsmoke@4", "ckpt/evalsmoke@4")]:
        assert resolve_ref(lake, typed).value == meant
    for untouched in ("/some/export/dir", "raw.python_stdlib", "export/smoke@latest", "ckpt/smok@8"):
        assert resolve_ref(lake, untouched).value == untouched


def test_unknown_runs_name_the_closest_real_ones(lake, tmp_path):
    with pytest.raises(UnknownRun, match=r"run 'smok': not a run or an experiment with checkpoints; closest: "
                                         r"smoke-bbbbbbbb, smoke-aaaaaaaa"):
        resolve_run(lake, "smok")
    with pytest.raises(UnknownRun, match=r"run 'zzz': .*; newest of 3: smoke-aaaaaaaa, evalsmoke, smoke-bbbbbbbb"):
        resolve_run(lake, "zzz")
    with pytest.raises(UnknownRun, match="no run has a checkpoint yet"):
        resolve_run(Lake.open(home=tmp_path / "empty"), "smoke")


def test_the_cli_accepts_experiment_names(lake, capsys):
    home = str(lake.home)
    assert cli.main(["evals", "--home", home, "--run", "smoke"]) == 0
    out, err = capsys.readouterr()
    assert "smoke -> smoke-bbbbbbbb" in err and "no eval results yet" in out

    assert cli.main(["lineage", "--home", home, "--json", "ckpt/smoke@8"]) == 0
    out, err = capsys.readouterr()
    assert '"version_id": "ckpt/smoke-bbbbbbbb@8"' in out and "smoke -> smoke-bbbbbbbb" in err

    assert cli.main(["eval", "--home", home, "smoke@12"]) == 1  # no such step: the run's real ids
    err = capsys.readouterr().err
    assert "checkpoint ckpt/smoke-bbbbbbbb@12: not in train.checkpoints; closest: " in err
    assert "ckpt/smoke-bbbbbbbb@4" in err or "ckpt/smoke-bbbbbbbb@8" in err

    assert cli.main(["export", "--home", home, "smok@8"]) == 1  # a typo: the exact lookup's closest ids
    err = capsys.readouterr().err
    assert "checkpoint ckpt/smok@8: not in train.checkpoints; closest: ckpt/smoke-bbbbbbbb@8" in err


def test_unknown_tables_name_the_closest_few(lake, capsys):
    from factory.suggest import hint

    tables = [f"raw.source_{i}" for i in range(20)] + ["raw.python_stdlib", "refined.python_stdlib"]
    assert hint("raw.python_stdlb", tables) == "closest: raw.python_stdlib, refined.python_stdlib; "
    assert hint("zzz", tables) == ""  # nothing close: the caller points at `factory tables`
    assert hint("zzz", ["raw.a", "raw.b"]) == "known: raw.a, raw.b; "  # a handful: all of them
    assert cli.main(["sql", "--home", str(lake.home), "select * from train.checkpoint"]) == 1
    assert "unknown table train.checkpoint (known: factory.lineage, train.checkpoints; " in capsys.readouterr().err
