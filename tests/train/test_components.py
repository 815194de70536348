"""The parts `train()` delegates to, each owning its cadence, and the fault seam.

- `Faults`: the default injects nothing (loss scale 1 at every step, no corruption, no kill); a
  request parses from `FACTORY_FAULTS` through `settings.faults()`, and a misspelt key is refused
  naming it (it used to inject nothing and let a recovery test pass untested);
- `train()` called as a library ignores `FACTORY_FAULTS`: only the entry point hands faults
  down, so a NaN asked for in the environment skips nothing in an in-process run, while the
  same request passed as `faults=` does;
- the tracker registry: one builder per `TrackerBackend` name, which `TrackerResource` and the
  deploy profile accept too; an unknown name is refused listing the known ones;
- cadences: `MultiTracker.due` (log_every), `Checkpointer.due` (every N and the last step), and
  an empty `MultiTracker` / a single-process `ReplicaChecker` do nothing.

Runs on CPU; milliseconds, except the two 3-step trainings on one training lake (~3 s to build,
~2 s each on 2 idle cores).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
from typing import get_args

import pytest
import torch
from pydantic import ValidationError
from pyiceberg.expressions import EqualTo

from configs.experiments import smoke
from factory import settings
from factory.experiments import plan_experiment
from factory.faults import NO_FAULTS, Faults
from factory.train.checkpointer import Checkpointer
from factory.train.config import ReplicaCheckConfig, TrackerBackend, TrackerConfig
from factory.train.distributed import Dist
from factory.train.replicas import ReplicaChecker
from factory.train.trackers import BACKENDS, MultiTracker, build_tracker
from factory.train.trainer import train
from resources.tracker import TrackerResource


def test_the_default_faults_do_nothing(monkeypatch):
    model = torch.nn.Linear(2, 2)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    killed: list[int] = []
    monkeypatch.setattr(os, "kill", lambda pid, sig: killed.append(sig))
    for step in range(1, 50):
        assert NO_FAULTS.loss_scale(step) == 1.0
        NO_FAULTS.corrupt_replica(step, model, rank=0)
        NO_FAULTS.kill_after(step)
    assert killed == [] and all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert Faults() == NO_FAULTS


def test_faults_parse_from_the_environment_and_act_only_where_asked(monkeypatch):
    monkeypatch.delenv(settings.FAULTS, raising=False)
    assert settings.faults() is NO_FAULTS
    monkeypatch.setenv(settings.FAULTS, json.dumps({"nan_at_steps": [4], "spike_at_steps": [6], "kill_at_step": 5,
                                                    "corrupt": {"step": 3, "rank": 1, "param": "weight"}}))
    faults = settings.faults()
    scales = [faults.loss_scale(s) for s in range(1, 8)]
    assert scales[3] != scales[3] and scales[:3] + scales[4:5] + scales[6:] == [1.0] * 5 and scales[5] == 1e3
    model = torch.nn.Linear(2, 2)
    weight = model.weight.detach().clone()
    faults.corrupt_replica(3, model, rank=0)  # another rank's corruption
    faults.corrupt_replica(2, model, rank=1)  # another step's
    assert torch.equal(model.weight, weight)
    faults.corrupt_replica(3, model, rank=1)
    assert torch.allclose(model.weight, weight + 1e-3)
    killed: list[int] = []
    monkeypatch.setattr(os, "kill", lambda pid, sig: killed.append(sig))
    faults.kill_after(4)
    faults.kill_after(5)
    assert killed == [signal.SIGKILL]


def test_a_misspelt_fault_is_refused_naming_it(monkeypatch):
    monkeypatch.setenv(settings.FAULTS, json.dumps({"crash_at_step": 5}))
    with pytest.raises(ValueError, match="FACTORY_FAULTS=.*crash_at_step: Extra inputs are not permitted"):
        settings.faults()
    monkeypatch.setenv(settings.FAULTS, "{kill_at_step: 5}")
    with pytest.raises(ValueError, match="FACTORY_FAULTS is not JSON"):
        settings.faults()
    with pytest.raises(ValidationError):
        Faults(kill_at_step=0)


@pytest.mark.slow
def test_train_as_a_library_ignores_the_environment_and_takes_faults_as_an_argument(shared_lake, training_env):
    training_env.setenv(settings.FAULTS, json.dumps({"nan_at_steps": [2]}))
    plan = plan_experiment(shared_lake, smoke().derive(steps=3, tracker={"backends": ["iceberg"]}))

    untouched = train(plan, shared_lake, run="env-ignored")
    injected = train(plan, shared_lake, run="injected", faults=Faults(nan_at_steps=[2]))

    assert (untouched.steps, untouched.skipped_steps, untouched.incidents) == (3, 0, 0)
    assert (injected.steps, injected.skipped_steps, injected.incidents) == (3, 1, 1)
    incidents = shared_lake.table("train.incidents").scan().to_arrow().to_pylist()
    assert [(r["run"], r["step"], r["kind"]) for r in incidents] == [("injected", 2, "nonfinite")]
    skipped = shared_lake.table("train.metrics").scan(row_filter=EqualTo("name", "skipped")).to_arrow().to_pylist()
    assert sorted((r["run"], r["step"], r["value"]) for r in skipped if r["value"]) == [("injected", 2, 1.0)]


def test_one_registry_of_backend_names(tmp_path):
    assert list(BACKENDS) == list(get_args(TrackerBackend)) == ["mlflow", "neptune", "iceberg"]
    assert TrackerResource(backends=list(BACKENDS)).backends == list(BACKENDS)
    with pytest.raises(ValueError, match="unknown tracker backends"):
        TrackerResource(backends=["wandb"])
    with pytest.raises(ValueError, match="unknown tracker backend 'wandb' \\(expected one of mlflow, neptune, iceberg\\)"):
        build_tracker(TrackerConfig(backends=["iceberg"]), None, tmp_path, "r",
                      environ={settings.TRACKER_BACKENDS: "wandb"})


@pytest.mark.slow
def test_each_component_owns_its_cadence(shared_lake):
    tracker = MultiTracker(log_every=3)
    assert [s for s in range(1, 10) if tracker.due(s)] == [3, 6, 9]
    tracker.start("r", {}, {})  # no backends: every call is a no-op (the tracker of ranks > 0)
    tracker.log_metrics(1, {"loss": 1.0})
    tracker.flush()
    tracker.finish("FAILED")

    plan = plan_experiment(shared_lake, smoke().derive(steps=10, checkpoint={"every": 4}))
    model = torch.nn.Linear(2, 2)
    single = Dist(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))
    saver = Checkpointer(plan, shared_lake, single, model, torch.optim.SGD(model.parameters(), lr=0.1),
                         run="cadence", run_id="", reporter=None)
    assert [s for s in range(1, 11) if saver.due(s)] == [4, 8, 10], "every 4, and the last step"

    recorded: list = []
    replicas = ReplicaChecker(ReplicaCheckConfig(hash_every=1, redundant_dry_run=True), single, model, model,
                              micro_batch=1, autocast=contextlib.nullcontext(),
                              record=lambda *a: recorded.append(a), warn=recorded.append)
    replicas.before_step(0, torch.zeros(2, 3, dtype=torch.long))  # would need a process group if it ran
    replicas.after_step(1)
    assert recorded == [] and model.weight.grad is None
