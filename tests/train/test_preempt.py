"""Preemption of real training processes (`factory.train.preempt`), on CPU, against a tmp lake of
standard-library text (the `shared_lake` of tests/train/conftest.py):

- SIGTERM to `python -m factory.train` mid-run: it finishes the step in progress, checkpoints that
  step, records a `preempted` incident and exits 75 (`PREEMPTED_EXIT`); a relaunch resumes from
  that step and ends bit-identical (every tensor, `torch.equal`) to an uninterrupted run;
- a second SIGTERM while the preemption checkpoint is being written (the `checkpoint_stall_s`
  fault holds each file between fsync and rename) changes nothing: the new checkpoint is whole,
  the previous one still valid, exit 75;
- a SIGKILL at that moment (the end of the grace period) leaves the previous checkpoint the
  latest valid one, and nothing half-written is taken for a checkpoint;
- two gloo ranks under torchrun with the signal to rank 1 only: both stop after the same step
  (the per-step agreement), one checkpoint, one incident naming rank 1;
- SIGINT, as Dagster Pipes forwards a run's termination, preempts the same way under
  `--sigint-is-preemption` (what the `training_run` asset's launch passes);
- fast, in process: the handler only flags, and is put back when `train()` returns.

Evals and synthetic batches, interrupted the same way (their commits come at the end):
- a SIGTERM to a real process running a synthetic pipeline mid-batch leaves `synthetic.<name>` and
  its rejected table without a commit; the rerun commits every row once;
- an eval interrupted between its samples commit and its results commit shows no scores, and the
  retry's write leaves one eval's samples and results, not two.

Each subprocess test takes ~15-40 s on 2 shared cores (startup, a few smoke steps); marked slow.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from configs.experiments import smoke
from factory.deploy.session import children, environ
from factory.experiments import plan_experiment
from factory.lake import Lake
from factory.train.checkpoint import checkpoint_dir, latest_valid, load_checkpoint, validate
from factory.train.config import CheckpointConfig, ParallelConfig
from factory.train.incidents import INCIDENTS_TABLE
from factory.train.launch import launch_command
from factory.train.preempt import PREEMPTED_EXIT, Preemption, preemption_of
from factory.train.trainer import train

REPO = Path(__file__).resolve().parents[2]
STEPS, EVERY = 8, 2


def experiment(name: str, **kw):
    return smoke().derive(name=name, steps=STEPS, checkpoint=CheckpointConfig(every=EVERY, keep_last=10),
                          tracker={"backends": ["iceberg"]}, **kw)


def start(lake: Lake, name: str, faults: dict | None = None, *, run_id: str = "", extra: tuple[str, ...] = (),
          **kw) -> subprocess.Popen:
    plan = plan_experiment(lake, experiment(name, **kw))
    env = {k: v for k, v in os.environ.items() if k not in ("FACTORY_FAULTS", "DAGSTER_PIPES_CONTEXT")}
    env.update(FACTORY_HOME=str(lake.home), OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1")
    if faults:
        env["FACTORY_FAULTS"] = json.dumps(faults)
    command = [*launch_command(plan, home=str(lake.home), run=name, run_id=run_id), *extra]
    return subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def wait_for(predicate, proc: subprocess.Popen, what: str, timeout: float = 180):
    deadline = time.monotonic() + timeout
    while not (found := predicate()):
        if proc.poll() is not None:
            raise AssertionError(f"exited {proc.returncode} before {what}:\n{proc.stdout.read()[-3000:]}")
        assert time.monotonic() < deadline, f"no {what} after {timeout:.0f} s"
        time.sleep(0.05)
    return found


def saved(lake: Lake, run: str, step: int):
    """Predicate: the checkpoint of `step` is complete (manifest written, bytes match)."""
    path = checkpoint_dir(lake.home, run) / f"step-{step:08d}.pt"
    return lambda: path.with_suffix(".json").exists() and validate(path) is None


def writing(lake: Lake, run: str, after: int):
    """Predicate: a checkpoint newer than `after` is being written (its temp file exists)."""
    directory = checkpoint_dir(lake.home, run)
    def probe():
        temps = sorted(directory.glob(".step-*.tmp")) if directory.exists() else []
        return [t for t in temps if int(t.name.split("-")[1].split(".")[0]) > after]
    return probe


def incidents(lake: Lake, run: str) -> list[dict]:
    rows = lake.table(INCIDENTS_TABLE).scan().to_arrow().to_pylist() if lake.has_table(INCIDENTS_TABLE) else []
    return [{**r, "detail": json.loads(r["detail"])} for r in rows if r["run"] == run]


def finish(proc: subprocess.Popen, timeout: float = 120) -> str:
    out, _ = proc.communicate(timeout=timeout)
    return out


@pytest.mark.slow
def test_sigterm_checkpoints_the_next_step_exits_75_and_the_resume_is_bit_identical(shared_lake, training_env):
    lake, run = shared_lake, "pre_term"
    proc = start(lake, run, run_id="dagster-run-1")
    wait_for(saved(lake, run, EVERY), proc, "the first checkpoint")
    proc.send_signal(signal.SIGTERM)
    out = finish(proc)
    assert proc.returncode == PREEMPTED_EXIT, out[-3000:]

    (incident,) = [i for i in incidents(lake, run) if i["kind"] == "preempted"]
    stop = incident["step"]
    assert EVERY < stop < STEPS, f"stopped at {stop}: the signal came after step {EVERY}'s checkpoint"
    detail = incident["detail"]
    assert detail["checkpoint"] == f"ckpt/{run}@{stop}" and detail["step"] == stop
    assert detail["signal"] == "SIGTERM" and detail["signals"] == 1 and detail["ranks_signalled"] == [0]
    assert 0 < detail["seconds_to_checkpoint"] < detail["grace_s"] == 60.0 and detail["within_grace"]
    assert latest_valid(checkpoint_dir(lake.home, run), print).step == stop  # the step in progress, saved
    assert f"preempted at step {stop}" in out
    assert preemption_of(lake, run, "dagster-run-1")["step"] == stop and preemption_of(lake, run, "other") is None

    resumed = train(plan_experiment(lake, experiment(run)), lake, run=run)
    straight = train(plan_experiment(lake, experiment("pre_straight")), lake, run="pre_straight")
    assert (resumed.resumed_from, resumed.steps, straight.steps) == (stop, STEPS, STEPS)
    a = load_checkpoint(latest_valid(checkpoint_dir(lake.home, "pre_straight"), print))
    b = load_checkpoint(latest_valid(checkpoint_dir(lake.home, run), print))
    assert a["step"] == b["step"] == STEPS
    differ = [k for k in a["model"] if not torch.equal(a["model"][k], b["model"][k])]
    assert differ == [], f"parameters differ after a preemption: {differ}"
    moments = [(i, k) for i, st in a["optimizer"]["state"].items() for k in ("exp_avg", "exp_avg_sq")
               if not torch.equal(st[k], b["optimizer"]["state"][i][k])]
    assert moments == [], moments
    assert straight.final_loss == resumed.final_loss


@pytest.mark.slow
def test_sigint_from_dagster_pipes_preempts_like_sigterm(shared_lake, training_env):
    lake, run = shared_lake, "pre_int"
    proc = start(lake, run, extra=("--sigint-is-preemption",))
    wait_for(saved(lake, run, EVERY), proc, "the first checkpoint")
    proc.send_signal(signal.SIGINT)  # PipesSubprocessClient(forward_termination=True) sends this
    out = finish(proc)
    assert proc.returncode == PREEMPTED_EXIT, out[-3000:]
    (incident,) = [i for i in incidents(lake, run) if i["kind"] == "preempted"]
    assert latest_valid(checkpoint_dir(lake.home, run), print).step == incident["step"] > EVERY


@pytest.mark.slow
def test_a_second_sigterm_during_the_checkpoint_write_loses_nothing(shared_lake, training_env):
    lake, run = shared_lake, "pre_twice"
    proc = start(lake, run, {"checkpoint_stall_s": 1.5})
    wait_for(saved(lake, run, EVERY), proc, "the first checkpoint")
    proc.send_signal(signal.SIGTERM)
    temps = wait_for(writing(lake, run, after=EVERY), proc, "the preemption checkpoint's write")
    proc.send_signal(signal.SIGTERM)  # mid-write: between the temp file's fsync and its rename
    time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    out = finish(proc)
    assert proc.returncode == PREEMPTED_EXIT, out[-3000:]

    (incident,) = [i for i in incidents(lake, run) if i["kind"] == "preempted"]
    stop = incident["step"]
    assert f".step-{stop:08d}.pt." in temps[0].name  # the write the signals landed in is the one kept
    assert incident["detail"]["signals"] == 3
    directory = checkpoint_dir(lake.home, run)
    assert validate(directory / f"step-{stop:08d}.pt") is None  # whole
    assert validate(directory / f"step-{EVERY:08d}.pt") is None  # the previous one untouched
    assert not list(directory.glob(".step-*.tmp"))


@pytest.mark.slow
def test_a_sigkill_during_the_preemption_write_leaves_the_previous_checkpoint_valid(shared_lake, training_env):
    lake, run = shared_lake, "pre_kill"
    proc = start(lake, run, {"checkpoint_stall_s": 2.0})
    wait_for(saved(lake, run, EVERY), proc, "the first checkpoint")
    proc.send_signal(signal.SIGTERM)
    wait_for(writing(lake, run, after=EVERY), proc, "the preemption checkpoint's write")
    proc.kill()  # the grace ran out
    finish(proc)
    assert proc.returncode == -signal.SIGKILL

    directory = checkpoint_dir(lake.home, run)
    assert latest_valid(directory, print).step == EVERY
    assert validate(directory / f"step-{EVERY:08d}.pt") is None
    assert not [i for i in incidents(lake, run) if i["kind"] == "preempted"]  # nothing claims a checkpoint


@pytest.mark.slow
def test_two_ranks_stop_at_the_same_step_when_only_one_is_signalled(shared_lake, training_env):
    lake, run = shared_lake, "pre_ddp"
    proc = start(lake, run, parallel=ParallelConfig(nproc_per_node=2))
    wait_for(saved(lake, run, EVERY), proc, "the first checkpoint", timeout=240)
    (worker,) = [pid for pid in children(proc.pid) if environ(pid).get("RANK") == "1"]
    os.kill(worker, signal.SIGTERM)  # one pod of two preempted: rank 0 never gets a signal
    out = finish(proc)
    assert proc.returncode != 0, out[-3000:]  # the agent exits 1 when a worker exits non-zero

    (incident,) = [i for i in incidents(lake, run) if i["kind"] == "preempted"]
    stop = incident["step"]
    assert incident["detail"]["ranks_signalled"] == [1] and EVERY < stop < STEPS
    assert latest_valid(checkpoint_dir(lake.home, run), print).step == stop
    # each rank says where it stopped: the same step on both
    assert out.count(f"WARNING: preempted at step {stop}:") == 2, out[-3000:]
    assert "exitcode  : 75" in out or "exitcode: 75" in out.replace("  ", " "), out[-3000:]


def test_the_handler_only_flags_and_is_put_back(shared_lake, training_env):
    from factory.train.distributed import Dist

    before = signal.getsignal(signal.SIGTERM)
    p = Preemption(Dist(0, 1, 0, torch.device("cpu")), 30, record=None, warn=print)
    assert not p.agreed()
    os.kill(os.getpid(), signal.SIGTERM)  # delivered to this (main) thread: only sets the flag
    os.kill(os.getpid(), signal.SIGTERM)
    assert p.agreed() and p.signals == 2
    p.close()
    assert signal.getsignal(signal.SIGTERM) is before
    with pytest.raises(ValueError, match="grace"):
        Preemption(Dist(0, 1, 0, torch.device("cpu")), 0, record=None, warn=print)


SYNTH_MODULE = """
import os, time
from pathlib import Path

def seeds():
    return [{"id": f"s{i}", "n": i} for i in range(8)]

def port(fields):
    marker = os.environ.get("SYNTH_MARKER")
    if marker and fields["n"] == 5:  # mid-run: batches of 2, the third in progress
        Path(marker).write_text("in batch 3")
        time.sleep(60)
    return f"value = {fields['n']} * 2\\n"
"""

SYNTH_SCRIPT = """
import json, sys
from factory.lake import Lake
from factory.synth import PipelineConfig, run_pipeline

config = PipelineConfig(name="toy", seeds={"function": "synth_slow:seeds"}, text="{program}",
    stages=[{"name": "port", "output": "program", "generator": {"kind": "function", "function": "synth_slow:port"}}],
    validators=[{"kind": "python_syntax"}])
result = run_pipeline(Lake.open(home=sys.argv[1]), config, log=print, batch_size=2)
print(json.dumps({"accepted": result.accepted}))
"""


@pytest.mark.slow
def test_sigterm_mid_synthetic_batch_commits_nothing_and_the_rerun_commits_once(tmp_path):
    (tmp_path / "synth_slow.py").write_text(SYNTH_MODULE)
    home, marker = tmp_path / "home", tmp_path / "marker"
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}:{REPO}", "SYNTH_MARKER": str(marker), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-c", SYNTH_SCRIPT, str(home)], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    wait_for(marker.exists, proc, "a later batch", timeout=120)
    proc.send_signal(signal.SIGTERM)
    out = finish(proc)
    assert proc.returncode == -signal.SIGTERM and "2/8 seeds" in out, out[-2000:]  # a batch was done before
    lake = Lake.open(home=home)
    assert not lake.has_table("synthetic.toy") or lake.table("synthetic.toy").current_snapshot() is None
    assert not lake.has_table("synthetic.toy_rejected")

    del env["SYNTH_MARKER"]
    again = subprocess.run([sys.executable, "-c", SYNTH_SCRIPT, str(home)], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stderr[-2000:]
    rows = Lake.open(home=home).table("synthetic.toy").scan().to_arrow().to_pylist()
    assert sorted(r["seed_id"] for r in rows) == [f"s{i}" for i in range(8)]  # each once


def test_an_eval_interrupted_between_its_commits_shows_no_scores_and_the_retry_writes_it_once(tmp_path):
    import datetime as dt

    from factory.evals.results import RESULTS_TABLE, SAMPLES_TABLE, results, write_results

    lake = Lake.open(home=tmp_path)
    eval_id, now = "eval/toy@4/quick", dt.datetime.now(dt.timezone.utc)
    rows = [{"eval_id": eval_id, "checkpoint_id": "ckpt/toy@4", "export_id": "export/toy@4", "run": "toy", "step": 4,
             "tokens": 4096, "suite": "quick", "task": "bpb", "metric": "all", "value": 1.5, "n": 10, "stderr": None,
             "engine": "transformers", "config_hash": "test", "created_at": now}]
    samples = [{"task": "bpb", "item": f"doc:{i}", "reference": None, "completion": "c", "outcome": "scored",
                "score": 1.0} for i in range(3)]
    commit = lake.commit

    def interrupted(table, *args, **kw):
        if table == RESULTS_TABLE:
            raise KeyboardInterrupt("SIGTERM")  # what Dagster's run worker turns a SIGTERM into, mid-eval
        return commit(table, *args, **kw)

    lake.commit = interrupted
    with pytest.raises(KeyboardInterrupt):
        write_results(lake, eval_id=eval_id, rows=rows, samples=[dict(s) for s in samples], upstream=[],
                      config={}, config_hash="test")
    lake.commit = commit
    assert results(lake, "toy") == []  # no scores: the sensor and dashboards see nothing half-done
    write_results(lake, eval_id=eval_id, rows=rows, samples=[dict(s) for s in samples], upstream=[], config={},
                  config_hash="test")
    assert [r["value"] for r in results(lake, "toy")] == [1.5]
    assert len(lake.table(SAMPLES_TABLE).scan().to_arrow()) == 3  # overwritten by eval id, not doubled
