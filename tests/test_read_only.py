"""Read commands write nothing: every `factory` command that only looks (tables, sql, lineage, drops,
mix list/show, evals, experiment list/show, sweep list/show/results, doctor, deploy show) leaves the
home's files and every table's current snapshot as they were; `sweep results --write` is the one
that commits (the counter-check that the fingerprint sees a write). And they start fast: a read
command run as a process imports none of torch, pyspark, vllm, transformers, mlflow, dagster or
matplotlib (the guard for "under 2 s"; bench/cli_bench.py measures the times).

The lake is the training lake of tests/conftest.py (refined tables, tokenizer, mix `default`) plus
checkpoint and eval rows for two cells of the `smoke_lr` sweep (`run_rows`, no training), so
`sweep results` has a scored, a trained and pending cells. Embedded sqlite catalog, CPU, ~10 s."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from factory import cli
from factory.deploy import open_lake

READS = [
    ["tables"], ["tables", "--json"],
    ["sql", "select count(*) as n from train.checkpoints"],
    ["lineage", "mixes.versions"], ["lineage", "mix/default@v1"],
    ["drops"],
    ["mix", "list"], ["mix", "show", "default"],
    ["evals"],
    ["experiment", "list"], ["experiment", "show", "smoke"],
    ["sweep", "list"], ["sweep", "show", "smoke_lr"], ["sweep", "results", "smoke_lr"],
    ["doctor", "--json"],
    ["deploy", "show"],
]


@pytest.fixture
def sweep_home(tmp_path, build_training_lake, run_rows, monkeypatch) -> dict:
    from configs.deploy import embedded
    from factory.experiments.registry import get_sweep
    from factory.experiments.sweep import expand

    monkeypatch.delenv("FACTORY_DEPLOY", raising=False)
    monkeypatch.delenv("FACTORY_DEPLOY_JSON", raising=False)
    home = tmp_path / "home"
    lake = build_training_lake(home, profile=embedded())
    cells = [c.run for c in expand(get_sweep("smoke_lr"))]
    run_rows.checkpoint(lake, cells[0], 30, loss=5.0)
    run_rows.evaluate(lake, cells[0], 30, {"all": 2.5})
    run_rows.checkpoint(lake, cells[1], 30, loss=5.5)  # trained, not scored
    return {"home": home, "cells": cells}


def _fingerprint(home: Path) -> dict:
    """Every file under the home (size, mtime) and every table's current snapshot."""
    files = {str(p.relative_to(home)): (p.stat().st_size, p.stat().st_mtime_ns)
             for p in sorted(home.rglob("*")) if p.is_file()}
    from configs.deploy import embedded

    lake = open_lake(embedded(), home)
    snapshots = {name: lake.table(name).metadata.current_snapshot_id for name in lake.tables()}
    return {"files": files, "snapshots": snapshots}


def _run(capsys, home: Path, argv: list[str]) -> tuple[int, str]:
    code = cli.main(["--home", str(home), *argv])
    return code, capsys.readouterr().out


@pytest.mark.slow
def test_read_commands_write_nothing(sweep_home, capsys):
    wrote, silent = {}, []
    for argv in READS:
        before = _fingerprint(sweep_home["home"])
        code, out = _run(capsys, sweep_home["home"], argv)
        if code not in (0, 1) or not out:  # doctor may fail a machine check (no bwrap); it still answers
            silent.append((argv, code))
        after = _fingerprint(sweep_home["home"])
        changed = sorted(k for k in before["files"].keys() | after["files"].keys()
                         if before["files"].get(k) != after["files"].get(k))
        committed = sorted(t for t in after["snapshots"] if after["snapshots"][t] != before["snapshots"].get(t))
        if changed or committed:
            wrote[" ".join(argv)] = {"files": changed, "tables": committed}
    assert wrote == {} and silent == []


def test_sweep_results_reads_ranks_only_scored_cells_and_writes_with_write(sweep_home, capsys):
    home, cells = sweep_home["home"], sweep_home["cells"]
    code, out = _run(capsys, home, ["sweep", "results", "smoke_lr"])
    assert code == 0
    lines = {c: next(line for line in out.splitlines() if c in line) for c in cells}
    assert lines[cells[0]].split()[1] == "1" and "2.5000" in lines[cells[0]] and "evaluated" in lines[cells[0]]
    for c in cells[1:]:  # unscored: listed, not ranked
        assert lines[c].split()[1] == "—", lines[c]
    assert "trained" in lines[cells[1]] and all("pending" in lines[c] for c in cells[2:])
    assert "4 cells: 1 evaluated, 1 trained, 2 pending" in out and "{" not in out  # no Python dict
    assert "read only" in out

    before = _fingerprint(home)
    code, out = _run(capsys, home, ["sweep", "results", "smoke_lr", "--write"])
    after = _fingerprint(home)
    assert code == 0 and "wrote sweeps.results snapshot" in out
    assert after["snapshots"]["sweeps.results"] is not None and "sweeps.results" not in before["snapshots"]
    assert (home / "artifacts" / "sweeps" / "smoke_lr" / "summary.png").is_file()


HEAVY = ("torch", "pyspark", "vllm", "transformers", "mlflow", "dagster", "matplotlib")
_PROBE = """
import json, sys
from factory import cli
code = cli.main(sys.argv[1:])
print(json.dumps({"code": code, "heavy": sorted({m.split('.')[0] for m in sys.modules} & set(%r))}))
""" % (HEAVY,)


@pytest.mark.slow
def test_read_commands_import_no_heavy_package(sweep_home):
    heavy = {}
    for argv in (["tables"], ["lineage", "mix/default@v1"], ["evals"], ["sweep", "results", "smoke_lr"],
                 ["mix", "show", "default"], ["experiment", "list"], ["doctor"]):
        done = subprocess.run([sys.executable, "-c", _PROBE, "--home", str(sweep_home["home"]), *argv],
                              capture_output=True, text=True, timeout=300)
        answer = json.loads(done.stdout.strip().splitlines()[-1])
        assert answer["code"] in (0, 1), done.stderr[-2000:]
        if answer["heavy"]:
            heavy[" ".join(argv)] = answer["heavy"]
    assert heavy == {}
