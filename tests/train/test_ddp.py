"""Data-parallel training on two real gloo ranks: `launch_command` of `smoke_ddp` (torchrun
`--standalone --nproc-per-node=2` as `python -m torch.distributed.run`) run as a subprocess, on
CPU, against a tmp lake of real standard-library text, the `default` mix (seq 256) and a 512-token
BPE.

- a clean 6-step run exits 0 with checkpoints at steps 2, 4, 6, a loss row per step and no incident;
- the redundant dry run (every rank runs rank 0's micro-batch and compares gradient hashes) passes
  and leaves training bit-identical to the clean run;
- one replica corrupted after step 3 (`FACTORY_FAULTS` "corrupt" seam) stops the run at the next
  parameter-hash check (step 4 with `hash_every=2`) before anything after step 3 is checkpointed;
  stderr and the `replica_mismatch` incident name rank 1 and the parameter. With two ranks there is
  no majority: the reference is rank 0 (`replicas.divergent`), which is right here.

Each run takes ~20-30 s on 2 cores (torchrun start, two model builds, six steps); the module ~90 s.
One fast test parses the launch command with torchrun's own parser.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

import configs.mixes
from configs.experiments import smoke_ddp
from factory.experiments import plan_experiment
from factory.lake import Lake
from factory.mix import register_mix_version
from factory.tokenize import TokenizerConfig, train_tokenizer
from factory.train.checkpoint import checkpoint_dir, checkpoints
from factory.train.config import CheckpointConfig, ReplicaCheckConfig
from factory.train.launch import launch_command
from factory.train.incidents import INCIDENTS_TABLE
from factory.train.trackers import METRICS_TABLE

REPO = Path(__file__).resolve().parents[2]
STEPS = 6
PARAM = "layers.0.mlp.up_proj.weight"
# the default mix's three sources; site_packages needs enough files for 8 logical shards
SOURCES = {"refined.python_stdlib": ["json", "email", "asyncio"],
           "refined.site_packages": ["http", "urllib", "logging", "importlib", "concurrent", "xml", "unittest"]}


@pytest.fixture(scope="module")
def ddp_lake(tmp_path_factory, corpus) -> Lake:
    """refined.python_stdlib / site_packages (stdlib packages as code) and package_docs (module
    docstrings), tokenizer `default` (512 tokens) and mix `default` v1 from configs/mixes."""
    lake = Lake.open(home=tmp_path_factory.mktemp("ddp"))
    for table, packages in SOURCES.items():
        corpus.write(lake, table, corpus.code(table, packages))
    corpus.write(lake, "refined.package_docs", corpus.docstrings("refined.package_docs"))
    train_tokenizer(lake, TokenizerConfig(name="default", vocab_size=512, sources=[*SOURCES, "refined.package_docs"],
                                          sample_bytes_per_source=200_000, measure_bytes_per_source=50_000))
    register_mix_version(lake, configs.mixes.mix_spec("default"))
    return lake


def launch(lake: Lake, name: str, *, every: int = 2, dry_run: bool = False,
           faults: dict | None = None) -> subprocess.CompletedProcess:
    """Plan `smoke_ddp` as experiment `name` (its own run directory and rows) and run its torchrun
    command to the end."""
    experiment = smoke_ddp().derive(name=name, steps=STEPS, checkpoint=CheckpointConfig(every=every),
                                    replicas=ReplicaCheckConfig(hash_every=2, redundant_dry_run=dry_run))
    command = launch_command(plan_experiment(lake, experiment), home=str(lake.home), run=name)
    assert command[1:5] == ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
    env = {k: v for k, v in os.environ.items() if k not in ("FACTORY_FAULTS", "DAGSTER_PIPES_CONTEXT")}
    env.update(FACTORY_HOME=str(lake.home), HF_HUB_OFFLINE="1", FACTORY_TRACKER_BACKENDS="iceberg")
    if faults:
        env["FACTORY_FAULTS"] = json.dumps(faults)
    return subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=150)


def rows(lake: Lake, table: str, run: str) -> list[dict]:
    if not lake.has_table(table):
        return []
    return sorted((r for r in lake.table(table).scan().to_arrow().to_pylist() if r["run"] == run),
                  key=lambda r: (r["step"], r.get("name", "")))


def losses(lake: Lake, run: str) -> list[tuple[int, float]]:
    return [(r["step"], r["value"]) for r in rows(lake, METRICS_TABLE, run) if r["name"] == "loss"]


@pytest.fixture(scope="module")
def clean(ddp_lake) -> subprocess.CompletedProcess:
    return launch(ddp_lake, "ddp_clean")


@pytest.mark.slow
def test_clean_run_checkpoints_every_two_steps_without_incidents(ddp_lake, clean):
    assert clean.returncode == 0, clean.stderr[-3000:]
    assert f"ddp_clean: {STEPS} steps, final loss" in clean.stderr + clean.stdout
    assert [r["step"] for r in checkpoints(ddp_lake, "ddp_clean")] == [2, 4, 6]
    assert rows(ddp_lake, INCIDENTS_TABLE, "ddp_clean") == []
    curve = losses(ddp_lake, "ddp_clean")
    assert [s for s, _ in curve] == list(range(1, STEPS + 1))  # rank 0 logs once per step
    assert curve[-1][1] < curve[0][1]


@pytest.mark.slow
def test_redundant_dry_run_passes_and_changes_nothing(ddp_lake, clean):
    run = launch(ddp_lake, "ddp_dry", dry_run=True)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "redundant gradient dry runs" in (checkpoint_dir(ddp_lake.home, "ddp_dry").parent / "card.md").read_text()
    assert rows(ddp_lake, INCIDENTS_TABLE, "ddp_dry") == []
    assert [r["step"] for r in checkpoints(ddp_lake, "ddp_dry")] == [2, 4, 6]
    # the dry run's broadcast of rank 0's micro-batch must not leak into the real step (each rank
    # still trains on its own data): the loss curve is bit-identical to the clean run's
    assert losses(ddp_lake, "ddp_dry") == losses(ddp_lake, "ddp_clean")


@pytest.mark.slow
def test_corrupted_replica_stops_the_run_at_the_next_hash_check(ddp_lake):
    run = launch(ddp_lake, "ddp_corrupt", every=1, faults={"corrupt": {"step": 3, "rank": 1, "param": PARAM}})

    assert run.returncode != 0
    assert "ReplicaMismatch: parameters differ across replicas at step 4: rank(s) [1] diverge" in run.stderr
    assert PARAM in run.stderr
    # corrupted after step 3, caught at step 4 (hash_every=2) before step 4 is checkpointed
    assert [r["step"] for r in checkpoints(ddp_lake, "ddp_corrupt")] == [1, 2, 3]
    assert sorted(p.name for p in checkpoint_dir(ddp_lake.home, "ddp_corrupt").glob("step-*.pt")) == [
        "step-00000001.pt", "step-00000002.pt", "step-00000003.pt"]
    incidents = rows(ddp_lake, INCIDENTS_TABLE, "ddp_corrupt")
    assert [(i["step"], i["kind"]) for i in incidents] == [(4, "replica_mismatch")]
    assert json.loads(incidents[0]["detail"]) == {"ranks": [1], "parameters": [PARAM]}


def test_launch_command_with_a_run_name_parses_under_torchrun():
    """Fast: torchrun's own parser must hand every factory.train argument through untouched."""
    from torch.distributed.run import get_args_parser

    from factory.experiments.spec import Plan

    plan = Plan(experiment=smoke_ddp(), model=smoke_ddp().model.model_copy(update={"vocab_size": 512}),
                mix_version="mix/default@v1", tokenizer="tokenizer/default@x", seq_len=256, steps=120,
                tokens_per_step=4096, grad_accum=1, parameters=1, config_hash="h")
    command = launch_command(plan, home="/h", run_id="rid", run="named")
    try:
        args = get_args_parser().parse_args(command[3:])
    except SystemExit as e:  # argparse prints the reason to stderr and exits 2
        raise AssertionError(f"torchrun refused the command (exit {e.code})") from None
    assert (args.module, args.training_script) == (True, "factory.train")
    assert args.training_script_args[-2:] == ["--run-name", "named"]
