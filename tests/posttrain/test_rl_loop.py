"""The RL loop end to end on CPU: a smoke model trained for this module (60 steps: the session's 8-step
run is too close to random to earn any toy reward), vLLM in-process rollouts, toy-curriculum rewards
from the sandbox through the task engine (one local Ray on loopback for the module), GRPO updates and a
verified weight sync after each. The reward rises over three seeds; rl.rollouts and train.checkpoints
hold what the runs did; async mode respects its staleness bound; a corrupted sync stops the run with
an incident; bad lake references fail before anything starts. Slow tier: ~4 min on 2 cores."""

import json
import statistics
import subprocess
import sys

import pytest

from factory.faults import Faults, SyncCorruption
from factory.infer.export import export_checkpoint, find_checkpoint
from factory.posttrain.rl import RLConfig, run_rl
from factory.posttrain.rl.components import toy_reward
from factory.posttrain.rl.config import OptimConfig, RolloutConfig
from factory.posttrain.rl.loop import open_scorer
from factory.posttrain.rl.store import rollouts
from factory.posttrain.rl.sync import SyncError
from factory.train.checkpoint import checkpoints

pytestmark = pytest.mark.slow

TOY = RolloutConfig(prompts_per_step=8, group_size=4, max_tokens=1)
SMALL = RolloutConfig(prompts_per_step=4, group_size=4, max_tokens=1)
Q = "model.layers.0.self_attn.q_proj.weight"
START_STEPS = 60
# measured on 2 cores (3 seeds x 24 steps of this config): first-20% mean reward 0.00-0.06, last-20%
# 0.16-0.27; gains 0.09-0.22, mean 0.16, std 0.065; over the first 16 steps, gains 0.11-0.15. The
# bounds sit about two stds below: each seed gains at least MIN_GAIN, the mean gain at least MIN_MEAN_GAIN.
MIN_GAIN, MIN_MEAN_GAIN = 0.03, 0.08


@pytest.fixture(scope="module")
def start(tmp_path_factory, build_training_lake):
    from configs.experiments import smoke
    from factory.experiments import plan_experiment
    from factory.train.config import CheckpointConfig
    from factory.train.trainer import train

    lake = build_training_lake(tmp_path_factory.mktemp("rl") / "home")
    # 16 sequences per step, as when MIN_GAIN was measured (the smoke experiment trains 8 since)
    experiment = smoke().derive(name="rlstart", steps=START_STEPS, checkpoint=CheckpointConfig(every=START_STEPS),
                                global_batch=16, micro_batch=8, tracker={"backends": ["iceberg"]})
    # run `rlstart-1` of experiment `rlstart`, as `make demo` trains `smoke` as run `smoke-<hash8>`: configs name
    # the experiment (ckpt/rlstart@60) and the run resolves to that experiment's newest run
    train(plan_experiment(lake, experiment), lake, run="rlstart-1")
    return lake, f"ckpt/rlstart@{START_STEPS}"


@pytest.fixture(scope="module")
def scorer(start):
    lake, ckpt = start
    config = RLConfig(name="scorer", start=ckpt, reward="toy", steps=1, rollout=TOY)
    with open_scorer(config, toy_reward(config, lake), lake) as engine:
        yield engine


def test_the_toy_reward_rises_over_three_seeds(start, scorer):
    lake, ckpt = start
    gains = []
    for seed in (0, 1, 2):
        config = RLConfig(name=f"rl-toy-{seed}", start=ckpt, reward="toy", steps=16, seed=seed, checkpoint_every=8,
                          rollout=TOY, optimizer=OptimConfig(lr=3e-3))
        result = run_rl(config, lake, scorer=scorer)
        cut = len(result.rewards) // 5
        first, last = statistics.mean(result.rewards[:cut]), statistics.mean(result.rewards[-cut:])
        print(f"seed {seed}: first 20% {first:.3f}, last 20% {last:.3f}: {[round(r, 2) for r in result.rewards]}")
        assert last - first >= MIN_GAIN, (seed, result.rewards)
        gains.append(last - first)
    assert statistics.mean(gains) >= MIN_MEAN_GAIN, gains

    # what the first run left behind: every sample with its policy version, verdict and scoring row
    rows = rollouts(lake, "rl-toy-0")
    assert [(r["step"], r["policy_version"], r["lag"], r["used"]) for r in rows] == \
        [(s, s - 1, 0, True) for s in range(1, 17) for _ in range(32)]
    assert {(r["group"], r["sample"]) for r in rows if r["step"] == 1} == {(g, s) for g in range(8) for s in range(4)}
    assert all(r["reward"] == (1.0 if r["outcome"] == "passed" else 0.0) and r["reason"] for r in rows)
    attempts = {r["attempt_key"]: r for r in lake.table("tasks.attempts").scan().to_arrow().to_pylist()}
    assert all(attempts[r["attempt_key"]]["reward"] == r["reward"] for r in rows)
    # RL checkpoints are checkpoints: the eval sensor, `factory export` and lineage take them as they are
    assert [c["step"] for c in checkpoints(lake, "rl-toy-0")] == [8, 16]
    [first_ckpt] = lake.lineage.records(version_id="ckpt/rl-toy-0@8")
    [second_ckpt] = lake.lineage.records(version_id="ckpt/rl-toy-0@16")
    assert first_ckpt.upstream[0] == "ckpt/rlstart-1@60" and second_ckpt.upstream[0] == "ckpt/rl-toy-0@8"
    trained = find_checkpoint(lake, "ckpt/rl-toy-0@16")
    assert trained.plan.experiment.eval_suite == "quick" and trained.plan.experiment.eval_every == 10
    assert export_checkpoint(lake, trained).step == 16  # what the eval asset exports for the sensor's eval run


def test_async_run_never_uses_a_sample_older_than_the_bound(start, scorer):
    lake, ckpt = start
    config = RLConfig(name="rl-async", start=ckpt, reward="toy", steps=3, mode="async", max_staleness=1,
                      checkpoint_every=3, rollout=SMALL)
    result = run_rl(config, lake, scorer=scorer)
    rows = rollouts(lake, "rl-async")
    used = [r for r in rows if r["used"]]
    assert sorted({r["step"] for r in used}) == [1, 2, 3] and len(used) == 3 * 16
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


def test_bad_lake_references_fail_before_anything_starts(start):
    lake, ckpt = start
    bad = RLConfig(name="rl-bad", start="ckpt/nonesuch@1", reward="toy", steps=1)
    run = subprocess.run([sys.executable, "-m", "factory.posttrain.rl", "--config-json", bad.model_dump_json(),
                          "--home", str(lake.home)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 2 and "start: checkpoint ckpt/nonesuch@1: not in train.checkpoints" in run.stderr
    tasks = RLConfig(name="rl-bad", start=ckpt, reward="repo_tasks", task_table="tasks.nonesuch", steps=1)
    run = subprocess.run([sys.executable, "-m", "factory.posttrain.rl", "--config-json", tasks.model_dump_json(),
                          "--home", str(lake.home)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 2 and "task_table: tasks.nonesuch does not exist" in run.stderr
    assert not rollouts(lake, "rl-bad")
