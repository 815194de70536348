"""The `rl_run` asset through Dagster: `materialize([rl_run])` on the session's smoke run with the real
resources (LakeResource on its lake, PipesSubprocessClient starting `python -m factory.posttrain.rl`).
Killed with SIGKILL after step 3 (FACTORY_FAULTS, which Pipes hands to the child) the run fails; the
relaunch resumes from its step-2 checkpoint with the same policy versions, drops and regenerates the
rollouts of step 3 (identically: the same weights and seeds), and reports its summary (reward curve
plot, pass rates, checkpoints) as metadata; its checkpoints become partitions of the eval assets. A
config naming a missing checkpoint fails in the asset body before any process starts. CPU; Ray and
vLLM in the child. Slow tier: two RL processes, ~1.5 min."""

import pytest
from dagster import DagsterInstance, PipesSubprocessClient, materialize

from assets.posttrain import rl_run
from factory.experiments.registry import discover_experiments, get_rl_experiment
from factory.home import CHECKOUT
from factory.posttrain.rl import RLConfig
from factory.posttrain.rl.config import RolloutConfig
from factory.posttrain.rl.store import rollouts
from factory.train.checkpoint import checkpoints
from resources import LakeResource


def _materialize(lake, config: RLConfig, instance: DagsterInstance):
    instance.add_dynamic_partitions("rl_runs", [config.name])
    return materialize([rl_run], partition_key=config.name, instance=instance, raise_on_error=False,
                       resources={"lake": LakeResource(home=str(lake.home)),
                                  "pipes_subprocess_client": PipesSubprocessClient(cwd=str(CHECKOUT))},
                       run_config={"ops": {"rl_run": {"config": {"config_json": config.model_dump_json()}}}})


@pytest.mark.slow
def test_a_killed_rl_run_resumes_through_dagster_and_counts_no_rollout_twice(trained_checkpoints, monkeypatch):
    lake = trained_checkpoints.lake
    config = RLConfig(name="rl-dagster", start=trained_checkpoints.checkpoint_ids[-1], reward="toy", steps=4,
                      checkpoint_every=2, eval_every=4, rollout=RolloutConfig(prompts_per_step=4, group_size=2))
    monkeypatch.setenv("FACTORY_FAULTS", '{"kill_at_step": 3}')
    killed = _materialize(lake, config, DagsterInstance.ephemeral())
    assert not killed.success
    before = rollouts(lake, "rl-dagster")
    assert sorted({r["step"] for r in before}) == [1, 2, 3]  # step 3 was recorded, its checkpoint never made
    monkeypatch.delenv("FACTORY_FAULTS")
    instance = DagsterInstance.ephemeral()
    result = _materialize(lake, config, instance)
    assert result.success
    logs = [e.user_message for e in instance.all_logs(result.run_id)]
    assert any("resuming at policy version 2, 8 later rollouts dropped" in m for m in logs)
    rows = rollouts(lake, "rl-dagster")
    keys = [(r["step"], r["group"], r["sample"]) for r in rows]
    assert len(keys) == len(set(keys)) == 4 * 8
    assert [(r["step"], r["policy_version"]) for r in rows] == [(s, s - 1) for s in (1, 2, 3, 4) for _ in range(8)]
    assert [r["completion"] for r in rows if r["step"] == 3] == [r["completion"] for r in before if r["step"] == 3]
    assert [c["step"] for c in checkpoints(lake, "rl-dagster")] == [2, 4]

    [event] = result.get_asset_materialization_events()
    meta = event.materialization.metadata
    assert meta["reward_curve"].value.startswith("![rl-dagster: mean reward per step](data:image/svg+xml;base64,")
    assert meta["steps"].value == 4 and meta["rollouts"].value == 4 * 8 and meta["resumed_from"].value == 2
    assert {row["family"] for row in meta["pass_rates"].value} <= {"toy/type/int", "toy/type/str", "toy/type/list",
                                                                 "toy/type/bool", "toy/digit"}
    assert instance.get_dynamic_partitions("checkpoints") == ["rl-dagster@4"]  # eval_every=4, and the last one


def test_a_missing_start_fails_in_the_asset_before_any_process(trained_checkpoints):
    lake = trained_checkpoints.lake
    config = RLConfig(name="rl-dagster-bad", start="ckpt/nonesuch@3", reward="toy", steps=1)
    result = _materialize(lake, config, DagsterInstance.ephemeral())
    assert not result.success
    [failure] = result.get_step_failure_events()
    assert "start: checkpoint ckpt/nonesuch@3: not in train.checkpoints" in failure.step_failure_data.error.to_string()
    assert not rollouts(lake, "rl-dagster-bad")


def test_rl_experiments_are_code_and_stay_out_of_the_training_queue():
    assert get_rl_experiment("rl_toy").reward == "toy" and get_rl_experiment("rl_toy_async").mode == "async"
    assert "rl_toy" not in discover_experiments().found  # an RLConfig is not queued as a training run
