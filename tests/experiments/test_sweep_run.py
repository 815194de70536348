"""`factory sweep run` on the Iceberg REST catalog: every cell's trainer writes to the profile's lake.

`run_sweep(lake, sweep, evaluate=False)` — what `factory sweep run NAME --no-eval` calls, with the
profile it resolves (here: the one the `catalog` fixture hands down in FACTORY_DEPLOY_JSON) — on a
2-cell grid (learning rate 1e-3 / 3e-3) of 3 smoke steps, one `python -m factory.train` process per
cell. Both cells' checkpoint rows, loss rows and lineage land in the REST warehouse bucket, with
the experiment each cell asked for, and no sqlite catalog appears under FACTORY_HOME (a cell that
re-resolved its profile by name would have opened the embedded one there).

Runs on CPU against the session's SeaweedFS (free loopback ports, a fresh S3 Tables bucket), one
intra-op thread per process; REST only (the sqlite path is the default every other trainer test
takes); the `slow` tier, ~20 s on 2 cores (a training lake on S3, two trainer processes of ~7 s).
"""

from __future__ import annotations

import pytest

from configs.experiments import smoke
from factory.experiments.local import run_sweep
from factory.experiments.sweep import SweepConfig, expand
from factory.train.checkpoint import checkpoints
from factory.train.config import CheckpointConfig, TrackerConfig

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("catalog", ["rest"], indirect=True)
def test_each_cell_trains_into_the_rest_lake(catalog, build_training_lake, tmp_path, monkeypatch):
    for name in ("FACTORY_FAULTS", "FACTORY_TRACKER_BACKENDS", "FACTORY_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # see tests/train/conftest.py: training_env
    home = tmp_path / "home"
    lake = build_training_lake(home)
    sweep = SweepConfig(name="restgrid", base=smoke().derive(
        steps=3, checkpoint=CheckpointConfig(every=3, keep_last=1), tracker=TrackerConfig(backends=["iceberg"])),
        params={"optimizer.lr": [1e-3, 3e-3]})
    cells, logged = expand(sweep), []

    assert run_sweep(lake, sweep, evaluate=False, log=logged.append) == []

    fresh = catalog.lake(home)  # a new client: what the cells' trainer processes committed
    for cell in cells:
        [row] = checkpoints(fresh, cell.run)
        assert (row["checkpoint_id"], row["experiment"]) == (f"ckpt/{cell.run}@3", "restgrid")
    started = [line.split(":")[0] for line in logged if line.startswith("[")]
    assert started == [f"[{c.index + 1}/2] {c.run}" for c in cells]
    assert sum("trained 3 steps" in line for line in logged) == 2, logged
    losses = [r for r in fresh.table("train.metrics").scan().to_arrow().to_pylist() if r["name"] == "loss"]
    assert sorted((r["run"], r["step"]) for r in losses) == sorted((c.run, s) for c in cells for s in (1, 2, 3))
    lineage = {r.version_id for r in fresh.lineage.records() if r.kind == "checkpoint"}
    assert lineage == {f"ckpt/{c.run}@3" for c in cells}
    warehouse = catalog.profile.catalog.warehouse + "/"
    assert all(fresh.table(t).location().startswith(warehouse) for t in ("train.checkpoints", "train.metrics"))
    assert list(home.rglob("catalog.db")) == [] and not (home / "lake").exists(), "an embedded catalog was opened"
