"""The RL loop end to end on CPU: checkpoints of the session's smoke run, vLLM in-process rollouts,
toy-curriculum rewards from the sandbox through the task engine (one local Ray on loopback for the
module), GRPO updates and a verified weight sync after each. Sync and async modes, a corrupted sync
that stops the run, a SIGKILLed run that resumes, rl.rollouts and train.checkpoints rows."""

import json
import os
import subprocess
import sys

import pytest

from factory.faults import Faults, SyncCorruption
from factory.posttrain.rl import RLConfig, run_rl
from factory.posttrain.rl.components import toy_reward
from factory.posttrain.rl.config import RolloutConfig
from factory.posttrain.rl.loop import open_scorer
from factory.posttrain.rl.store import rollouts
from factory.posttrain.rl.sync import SyncError
from factory.train.checkpoint import checkpoints

SMALL = RolloutConfig(prompts_per_step=4, group_size=4, max_tokens=3)
Q = "model.layers.0.self_attn.q_proj.weight"


@pytest.fixture(scope="module")
def start(trained_checkpoints):
    return trained_checkpoints.lake, trained_checkpoints.checkpoint_ids[-1]


@pytest.fixture(scope="module")
def scorer(start):
    lake, ckpt = start
    config = RLConfig(name="scorer", start=ckpt, reward="toy", steps=1, rollout=SMALL)
    with open_scorer(config, toy_reward(config, lake), lake) as engine:
        yield engine


def test_sync_run_records_every_rollout_with_its_policy_version(start, scorer):
    lake, ckpt = start
    config = RLConfig(name="rl-sync", start=ckpt, reward="toy", steps=3, checkpoint_every=2, rollout=SMALL)
    result = run_rl(config, lake, scorer=scorer)
    assert result.steps == 3 and result.checkpoints == ["ckpt/rl-sync@2", "ckpt/rl-sync@3"]
    assert 0 < result.sync_share < 0.5
    rows = rollouts(lake, "rl-sync")
    assert [(r["step"], r["policy_version"], r["lag"], r["used"]) for r in rows] == \
        [(s, s - 1, 0, True) for s in (1, 2, 3) for _ in range(16)]
    assert {(r["group"], r["sample"]) for r in rows if r["step"] == 1} == {(g, s) for g in range(4) for s in range(4)}
    assert all(r["outcome"] in {"passed", "failed", "timeout", "oom", "crashed"} and r["reason"] for r in rows)
    assert all(r["reward"] == (1.0 if r["outcome"] == "passed" else 0.0) for r in rows)
    attempts = {r["attempt_key"]: r for r in lake.table("tasks.attempts").scan().to_arrow().to_pylist()}
    assert all(attempts[r["attempt_key"]]["reward"] == r["reward"] for r in rows)  # each row leads to its scoring
    # RL checkpoints are checkpoints: the eval sensor, `factory export` and lineage take them as they are
    [row] = [c for c in checkpoints(lake, "rl-sync") if c["step"] == 3]
    assert row["eval_every"] == config.eval_every
    [first] = lake.lineage.records(version_id="ckpt/rl-sync@2")
    [second] = lake.lineage.records(version_id="ckpt/rl-sync@3")
    assert first.upstream[0] == ckpt and second.upstream[0] == "ckpt/rl-sync@2"


def test_async_run_never_uses_a_sample_older_than_the_bound(start, scorer):
    lake, ckpt = start
    config = RLConfig(name="rl-async", start=ckpt, reward="toy", steps=4, mode="async", max_staleness=1,
                      checkpoint_every=4, rollout=SMALL)
    result = run_rl(config, lake, scorer=scorer)
    rows = rollouts(lake, "rl-async")
    used = [r for r in rows if r["used"]]
    assert sorted({r["step"] for r in used}) == [1, 2, 3, 4] and len(used) == 4 * 16
    assert all(0 <= r["lag"] <= 1 for r in used)
    assert all(r["lag"] > 1 for r in rows if not r["used"]) and result.dropped_batches * 16 == len(rows) - len(used)


def test_a_corrupted_sync_stops_the_run_with_an_incident(start, scorer):
    lake, ckpt = start
    config = RLConfig(name="rl-corrupt", start=ckpt, reward="toy", steps=3, rollout=SMALL)
    with pytest.raises(SyncError, match="policy version 2"):
        run_rl(config, lake, scorer=scorer, faults=Faults(corrupt_sync=SyncCorruption(version=2, tensor=Q, mode="skip")))
    [incident] = [i for i in lake.table("train.incidents").scan().to_arrow().to_pylist() if i["run"] == "rl-corrupt"]
    assert incident["kind"] == "weight_sync_mismatch" and incident["step"] == 2
    assert json.loads(incident["detail"])["wrong"] == ["model.layers.0.self_attn.qkv_proj.weight"]
    # the update that made version 2 never had its rollouts recorded: the run stopped first
    assert sorted({r["step"] for r in rollouts(lake, "rl-corrupt")}) == [1]


def test_a_killed_run_resumes_with_the_same_versions_and_counts_no_rollout_twice(start):
    lake, ckpt = start
    config = RLConfig(name="rl-resume", start=ckpt, reward="toy", steps=4, checkpoint_every=2, rollout=SMALL)
    argv = [sys.executable, "-m", "factory.posttrain.rl", "--config-json", config.model_dump_json(),
            "--home", str(lake.home)]
    killed = subprocess.run(argv, env={**os.environ, "FACTORY_FAULTS": json.dumps({"kill_at_step": 3})},
                            capture_output=True, text=True, timeout=600)
    assert killed.returncode == -9, killed.stderr[-3000:]
    before = rollouts(lake, "rl-resume")
    assert sorted({r["step"] for r in before}) == [1, 2, 3]  # step 3 was recorded, its checkpoint never made
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "resuming at policy version 2, 16 later rollouts dropped" in done.stderr
    rows = rollouts(lake, "rl-resume")
    keys = [(r["step"], r["group"], r["sample"]) for r in rows]
    assert len(keys) == len(set(keys)) == 4 * 16
    assert [(r["step"], r["policy_version"]) for r in rows] == [(s, s - 1) for s in (1, 2, 3, 4) for _ in range(16)]
    # the same weights and seeds: step 3 sampled again what the killed run had sampled
    assert [r["completion"] for r in rows if r["step"] == 3] == [r["completion"] for r in before if r["step"] == 3]
    assert [c["step"] for c in checkpoints(lake, "rl-resume")] == [2, 4]


def test_bad_lake_references_fail_before_anything_starts(start):
    lake, ckpt = start
    bad = RLConfig(name="rl-bad", start="ckpt/nonesuch@1", reward="toy", steps=1)
    run = subprocess.run([sys.executable, "-m", "factory.posttrain.rl", "--config-json", bad.model_dump_json(),
                          "--home", str(lake.home)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 2 and "start: checkpoint ckpt/nonesuch@1: not in train.checkpoints" in run.stderr
    tasks = bad.model_copy(update={"start": ckpt, "reward": "repo_tasks", "task_table": "tasks.nonesuch"})
    run = subprocess.run([sys.executable, "-m", "factory.posttrain.rl", "--config-json", tasks.model_dump_json(),
                          "--home", str(lake.home)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 2 and "task_table: tasks.nonesuch does not exist" in run.stderr
    assert not rollouts(lake, "rl-bad")
