"""`experiment_sensor` with a built context over a real lake and a temporary experiments
directory: adding a file queues its run within one tick; another tick queues nothing; changing
one field queues a new run (new run name, run key = the new hash); a broken file is reported
without hiding the others; an unplannable experiment is not queued; an experiment whose run is
already done or under way however it was launched (a `dagster asset materialize` run, a queued
run, the final step in `train.checkpoints`) is skipped as done, named in the log and the skip
reason, and not looked at again; requests carry only the tags the run queue needs; sweep schedules
request every cell (an RL sweep's: rl_job runs of rl_runs partitions). CPU, no servers."""

import json

import pytest
from dagster import DagsterInstance, SensorResult, SkipReason, build_sensor_context

from factory.experiments.sweep import run_name
from resources.experiments import ExperimentsResource
from resources.lake import LakeResource
from sensors.experiments import experiment_sensor

EXPERIMENT = '''
from configs.experiments.smoke import smoke
from factory.experiments import ExperimentConfig


def probe() -> ExperimentConfig:
    """Goal: a probe. Launch: factory experiment submit probe"""
    return smoke().derive(name="probe", steps=4, optimizer={"lr": LR, "weight_decay": 0.1})
'''


def tick(home, directory, instance, cursor):
    context = build_sensor_context(instance=instance, cursor=cursor, resources={
        "lake": LakeResource(home=str(home)), "experiments": ExperimentsResource(experiments_dir=str(directory))})
    return experiment_sensor(context)


@pytest.mark.slow
def test_new_file_queues_once_and_an_edit_queues_a_new_run(tmp_path, build_training_lake):
    home, directory = tmp_path / "home", tmp_path / "experiments"
    build_training_lake(home)
    directory.mkdir()
    instance = DagsterInstance.ephemeral()

    first = tick(home, directory, instance, None)
    assert isinstance(first, SkipReason) and "no new or changed experiments" in first.skip_message

    (directory / "probe.py").write_text(EXPERIMENT.replace("LR", "1e-3"))
    result = tick(home, directory, instance, None)
    assert isinstance(result, SensorResult)
    (request,) = result.run_requests
    from configs.experiments.smoke import smoke

    expected = smoke().derive(name="probe", steps=4, optimizer={"lr": 1e-3, "weight_decay": 0.1})
    assert request.partition_key == run_name(expected) and request.run_key == expected.identity_hash()
    assert json.loads(request.run_config["ops"]["training_run"]["config"]["experiment_json"])["optimizer"]["lr"] == 1e-3
    assert request.tags == {"factory/kind": "training", "dagster/priority": "0",  # few: the runs list shows each
                            "dagster/max_retries": "3"}
    assert request.run_config["ops"]["training_run"]["config"]["source"] == "configs/experiments/probe.py:probe"
    card = (home / "artifacts" / "runs" / request.partition_key / "card.md").read_text()
    assert "# Experiment `probe`" in card and "4 steps" in card
    (added,) = result.dynamic_partitions_requests
    assert added.partitions_def_name == "training_runs" and list(added.partition_keys) == [request.partition_key]

    again = tick(home, directory, instance, result.cursor)  # unchanged: nothing, not even re-planned
    assert isinstance(again, SkipReason)

    # one field changes (in the same second, same file size: the stale-.pyc trap) -> a new run
    (directory / "probe.py").write_text(EXPERIMENT.replace("LR", "2e-3"))
    changed = tick(home, directory, instance, result.cursor)
    (new,) = changed.run_requests
    assert new.run_key != request.run_key and new.partition_key != request.partition_key
    assert new.partition_key.startswith("probe-")
    assert set(json.loads(changed.cursor)) == {request.run_key, new.run_key}


@pytest.mark.slow
def test_broken_and_unplannable_experiments_are_reported_not_queued(tmp_path, build_training_lake):
    home, directory = tmp_path / "home", tmp_path / "experiments"
    build_training_lake(home)
    directory.mkdir()
    (directory / "good.py").write_text(EXPERIMENT.replace("LR", "1e-3"))
    (directory / "broken.py").write_text("def oops(:\n")
    (directory / "nomix.py").write_text(EXPERIMENT.replace("LR", "1e-3").replace('name="probe"', 'name="nomix", mix="nope"')
                                        .replace("def probe", "def nomix"))
    (directory / "invalid.py").write_text(EXPERIMENT.replace("LR", "-1").replace('name="probe"', 'name="bad"')
                                          .replace("def probe", "def bad"))
    instance = DagsterInstance.ephemeral()
    context = build_sensor_context(instance=instance, resources={
        "lake": LakeResource(home=str(home)), "experiments": ExperimentsResource(experiments_dir=str(directory))})
    from factory.experiments.queue import experiment_runs
    from factory.lake import Lake

    runs, errors = experiment_runs(Lake.open(home=home), directory)
    assert [r.experiment.name for r in runs] == ["probe"]
    joined = " | ".join(errors)
    assert "broken.py: cannot import: SyntaxError" in joined
    assert "invalid.py:bad: invalid experiment: optimizer.lr" in joined
    assert "nomix.py:nomix: experiment nomix: mix: " in joined and "nope" in joined
    result = experiment_sensor(context)
    assert [r.partition_key.split("-")[0] for r in result.run_requests] == ["probe"]


@pytest.mark.slow
def test_sweep_schedule_requests_every_cell_with_sweep_tags(tmp_path, build_training_lake):
    from dagster import build_schedule_context

    from factory.experiments.sweep import SweepConfig, expand
    from sensors.experiments import sweep_schedule

    home = tmp_path / "home"
    build_training_lake(home)
    from configs.experiments.smoke import smoke

    sweep = SweepConfig(name="tiny", base=smoke().derive(steps=2), params={"optimizer.lr": [1e-3, 2e-3]}, cron="*/5 * * * *")
    schedule = sweep_schedule(sweep)
    assert schedule.name == "sweep_tiny" and schedule.cron_schedule == "*/5 * * * *"
    (tmp_path / "dagster").mkdir()
    instance = DagsterInstance.local_temp(str(tmp_path / "dagster"))  # a schedule context needs a persistent one
    import definitions

    context = build_schedule_context(instance=instance, repository_def=definitions.defs.get_repository_def(), resources={
        "lake": LakeResource(home=str(home)), "experiments": ExperimentsResource(sweeps_dir=str(tmp_path))})
    requests = list(schedule.evaluate_tick(context).run_requests)
    runs = [c.run for c in expand(sweep)]
    assert [r.partition_key for r in requests] == runs and [r.run_key for r in requests] == [
        c.experiment.identity_hash() for c in expand(sweep)]
    ours = [{k: v for k, v in r.tags.items() if k == "dagster/priority" or not k.startswith("dagster/")} for r in requests]
    assert ours == [{"factory/kind": "training", "dagster/priority": "-10", "factory/sweep": "tiny"}] * 2
    assert [r.run_config["ops"]["training_run"]["config"]["source"] for r in requests] == [
        'configs/sweeps/tiny cell 0: {"optimizer.lr": 0.001}', 'configs/sweeps/tiny cell 1: {"optimizer.lr": 0.002}']
    assert set(instance.get_dynamic_partitions("training_runs")) == set(runs)

    # a schedule's run keys only dedupe within one tick: the next tick skips cells with a live run
    from dagster import DagsterRunStatus
    from dagster._core.test_utils import create_run_for_test

    first, second = requests
    create_run_for_test(instance, job_name="train_job", tags=first.tags,
                        status=DagsterRunStatus.SUCCESS)
    create_run_for_test(instance, job_name="train_job", tags=second.tags,
                        status=DagsterRunStatus.FAILURE)
    retry = list(schedule.evaluate_tick(context).run_requests)
    assert [r.partition_key for r in retry] == [runs[1]], "only the failed cell is queued again"
    create_run_for_test(instance, job_name="train_job", tags=second.tags,
                        status=DagsterRunStatus.STARTED)
    done = schedule.evaluate_tick(context)
    assert not done.run_requests and "already has a run" in done.skip_message


def _probe(lr: float):
    from configs.experiments.smoke import smoke

    return smoke().derive(name="probe", steps=4, optimizer={"lr": lr, "weight_decay": 0.1})


@pytest.mark.slow
def test_runs_done_or_under_way_however_launched_are_not_queued(tmp_path, build_training_lake, run_rows, capfd):
    """Three experiments in one directory, as after `make demo`: `probe`'s partition was materialized
    by `dagster asset materialize` (a SUCCESS run of Dagster's implicit asset job, no sensor tags),
    `probe2` has a queued run (from `factory experiment submit`), `probe3` was trained without
    Dagster (its final step is in train.checkpoints). Only `probe4`, trained halfway outside
    Dagster, is queued (it resumes); the others are skipped as done and never looked at again."""
    from dagster import AssetKey, DagsterRunStatus
    from dagster._core.test_utils import create_run_for_test

    from factory.lake import Lake

    home, directory = tmp_path / "home", tmp_path / "experiments"
    build_training_lake(home)
    directory.mkdir()
    for name in ("probe", "probe2", "probe3", "probe4"):
        (directory / f"{name}.py").write_text(EXPERIMENT.replace("LR", "1e-3").replace('name="probe"', f'name="{name}"')
                                              .replace("def probe", f"def {name}"))
    runs = {n: run_name(_probe(1e-3).derive(name=n)) for n in ("probe", "probe2", "probe3", "probe4")}
    (tmp_path / "dagster").mkdir()
    instance = DagsterInstance.local_temp(str(tmp_path / "dagster"))  # QUEUED runs need a persistent one
    create_run_for_test(instance, job_name="__ASSET_JOB", status=DagsterRunStatus.SUCCESS,
                        tags={"dagster/partition": runs["probe"]},
                        asset_selection=frozenset({AssetKey("training_run")}))
    create_run_for_test(instance, job_name="train_job", status=DagsterRunStatus.STARTED,
                        tags={"dagster/partition": runs["probe2"]})
    lake = Lake.open(home=home)
    for step in (2, 4):
        run_rows.checkpoint(lake, runs["probe3"], step, loss=1.0)
    run_rows.checkpoint(lake, runs["probe4"], 2, loss=1.0)
    # a run of another asset with the same partition key counts for nothing
    create_run_for_test(instance, job_name="mix_job", status=DagsterRunStatus.SUCCESS,
                        tags={"dagster/partition": runs["probe4"]})

    result = tick(home, directory, instance, None)
    assert [r.partition_key for r in result.run_requests] == [runs["probe4"]]
    assert sorted(json.loads(result.cursor)) == sorted(_probe(1e-3).derive(name=n).identity_hash() for n in runs)
    logged = capfd.readouterr().err
    assert f"skipped 3 already done: {runs['probe']} (in Dagster: run " in logged and " SUCCESS)" in logged
    assert f"{runs['probe2']} (in Dagster: run " in logged and " STARTED)" in logged
    assert f"{runs['probe3']} (trained: train.checkpoints has its final step 4)" in logged
    assert f"queueing 1: {runs['probe4']}" in logged
    for n in ("probe", "probe2", "probe3"):  # a done run's card is not rewritten (its mix version may differ now)
        assert not (home / "artifacts" / "runs" / runs[n] / "card.md").exists()

    again = tick(home, directory, instance, result.cursor)
    assert isinstance(again, SkipReason) and again.skip_message == "no new or changed experiments to train"


def test_rl_sweep_schedule_requests_rl_job_runs_of_rl_runs_partitions(tmp_path, monkeypatch):
    """An RL sweep's schedule targets rl_job: its requests' partitions are the cells' run names, added
    to `rl_runs` (not `training_runs`), their run config is valid for rl_job and reads back as the
    cell's RLConfig in the asset's own config class; a live rl_job run blocks its cell at the next
    tick. The start checkpoint check is stubbed (tests/experiments/test_sweep_rl.py covers it)."""
    from dagster import DagsterRunStatus, build_schedule_context, validate_run_config
    from dagster._core.test_utils import create_run_for_test

    import definitions
    import factory.posttrain.rl.config as rl_config
    from assets.posttrain import RLRunConfig, rl_runs
    from configs.experiments.rl_toy import rl_toy
    from factory.experiments.queue import RL_JOB, RL_PARTITIONS
    from factory.experiments.sweep import SweepConfig, expand
    from factory.posttrain.rl import RLConfig
    from sensors.experiments import sweep_schedule

    monkeypatch.setattr(rl_config, "check_rl_config", lambda config, lake: None)
    base = RLConfig.model_validate({**rl_toy().model_dump(), "steps": 2})
    sweep = SweepConfig(name="rltiny", base=base, params={"optimizer.lr": [1e-3, 2e-3]})
    schedule = sweep_schedule(sweep)
    assert (schedule.job_name, rl_runs.name) == (RL_JOB, RL_PARTITIONS) == ("rl_job", "rl_runs")
    (tmp_path / "dagster").mkdir()
    instance = DagsterInstance.local_temp(str(tmp_path / "dagster"))
    context = build_schedule_context(instance=instance, repository_def=definitions.defs.get_repository_def(), resources={
        "lake": LakeResource(home=str(tmp_path / "home")), "experiments": ExperimentsResource(sweeps_dir=str(tmp_path))})
    requests = list(schedule.evaluate_tick(context).run_requests)
    cells = expand(sweep)
    assert [r.partition_key for r in requests] == [c.run for c in cells]
    assert set(instance.get_dynamic_partitions("rl_runs")) == {c.run for c in cells}
    assert instance.get_dynamic_partitions("training_runs") == []
    job = definitions.defs.resolve_job_def("rl_job")
    for r, c in zip(requests, cells):
        assert validate_run_config(job, r.run_config)
        assert RLRunConfig(**r.run_config["ops"]["rl_run"]["config"]).rl_config(r.partition_key) == c.experiment
        assert r.tags["factory/sweep"] == "rltiny" and r.tags["dagster/priority"] == "-10"

    create_run_for_test(instance, job_name="rl_job", tags=requests[0].tags, status=DagsterRunStatus.STARTED)
    again = list(schedule.evaluate_tick(context).run_requests)
    assert [r.partition_key for r in again] == [cells[1].run], "a cell with a live rl_job run is not queued again"
