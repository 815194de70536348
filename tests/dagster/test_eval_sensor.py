"""`checkpoint_eval_sensor` with a built context over a real lake: first tick, nothing new, several
checkpoints landing between two ticks (some not due), the run keys, partitions and cursor it
returns; due checkpoints already done are skipped: scored in `evals.results` by anyone (a first
tick after `make demo` meets the demo's scores) or with an eval run queued or running (launched
from the CLI or UI, so not deduplicated by the sensor's run key). CPU, no servers. Checkpoint
rows are appended directly (a narrow test of the sensor's reading; training writes the same schema)."""

import datetime as dt
import json

import pyarrow as pa
from dagster import AssetKey, DagsterInstance, DagsterRunStatus, SensorResult, SkipReason, build_sensor_context
from dagster._core.test_utils import create_run_for_test

from factory.evals.watch import due_checkpoints, scored
from factory.lake import CommitStamp, Lake
from factory.lake.schemas import TRAIN_CHECKPOINTS
from factory.train.checkpoint import CHECKPOINTS_TABLE
from jobs import EVAL_PRIORITY
from resources.lake import LakeResource
from sensors.evals import checkpoint_eval_sensor


def land(lake: Lake, run: str, *steps: int, eval_every: int = 20) -> None:
    """One commit per checkpoint, as a training run makes them."""
    for step in steps:
        row = {"checkpoint_id": f"ckpt/{run}@{step}", "run": run, "experiment": run, "step": step, "tokens": step * 10,
               "uri": f"file:///nowhere/{step}.pt", "sha256": "0" * 64, "bytes": 1, "loss": 1.0,
               "mix_version": "mix/default@v1", "config_hash": "h", "eval_every": eval_every, "code_version": "c",
               "created_at": dt.datetime.now(dt.timezone.utc)}
        lake.commit(CHECKPOINTS_TABLE, pa.Table.from_pylist([row], schema=TRAIN_CHECKPOINTS.as_arrow()),
                    CommitStamp(asset_key="test", config_hash=""), schema=TRAIN_CHECKPOINTS)


def tick(home, instance, cursor):
    context = build_sensor_context(instance=instance, cursor=cursor, resources={"lake": LakeResource(home=str(home))})
    return checkpoint_eval_sensor(context), context


def test_first_tick_nothing_new_then_several_checkpoints_in_one_tick(tmp_path):
    instance = DagsterInstance.ephemeral()
    lake = Lake.open(home=tmp_path)

    result, _ = tick(tmp_path, instance, None)  # no table yet
    assert isinstance(result, SkipReason)

    land(lake, "smoke", 20)
    result, _ = tick(tmp_path, instance, None)  # first tick with data: everything so far is new
    assert isinstance(result, SensorResult) and [r.run_key for r in result.run_requests] == ["ckpt/smoke@20"]
    cursor = result.cursor

    result, context = tick(tmp_path, instance, cursor)  # nothing new
    assert isinstance(result, SkipReason) and context.cursor == cursor

    # three due checkpoints from two runs and one that is not due land between two ticks
    land(lake, "smoke", 30, 40, 60)
    land(lake, "other", 20)
    result, _ = tick(tmp_path, instance, cursor)
    assert [r.run_key for r in result.run_requests] == ["ckpt/other@20", "ckpt/smoke@40", "ckpt/smoke@60"]
    assert [r.partition_key for r in result.run_requests] == ["other@20", "smoke@40", "smoke@60"]
    assert all(r.tags == {"dagster/priority": EVAL_PRIORITY} for r in result.run_requests)  # the partition names it
    (added,) = result.dynamic_partitions_requests
    assert added.partitions_def_name == "checkpoints" and list(added.partition_keys) == ["other@20", "smoke@40", "smoke@60"]
    assert json.loads(result.cursor)["snapshot_id"] == lake.current_snapshot_id(CHECKPOINTS_TABLE)

    again, _ = tick(tmp_path, instance, result.cursor)
    assert isinstance(again, SkipReason)


def test_an_expired_cursor_snapshot_rereads_everything(tmp_path):
    lake = Lake.open(home=tmp_path)
    land(lake, "smoke", 20, 40)
    due, cursor = due_checkpoints(lake, json.dumps({"snapshot_id": 12345}))
    assert [r["checkpoint_id"] for r in due] == ["ckpt/smoke@20", "ckpt/smoke@40"]
    assert json.loads(cursor)["snapshot_id"] == lake.current_snapshot_id(CHECKPOINTS_TABLE)


def test_due_checkpoints_already_scored_or_being_evaluated_are_not_requested(tmp_path, run_rows, capfd):
    """The state `make demo` leaves: checkpoints 4, 8, 12 of a run, 12 scored by a CLI
    materialization; 8 is being evaluated (a run launched from the UI). A first tick (no cursor) requests 4 only."""
    instance = DagsterInstance.ephemeral()
    lake = Lake.open(home=tmp_path)
    for step in (4, 8, 12):
        run_rows.checkpoint(lake, "smoke-1234abcd", step, loss=2.0)  # eval_every=4: all due
    run_rows.evaluate(lake, "smoke-1234abcd", 12, {"all": 1.5})
    create_run_for_test(instance, job_name="__ASSET_JOB", status=DagsterRunStatus.STARTED,
                        tags={"dagster/partition": "smoke-1234abcd@8"},
                        asset_selection=frozenset({AssetKey("checkpoint_export"), AssetKey("eval_scores")}))
    # a finished eval run of 4 without scores (it failed) does not count as done
    create_run_for_test(instance, job_name="eval_job", status=DagsterRunStatus.FAILURE,
                        tags={"dagster/partition": "smoke-1234abcd@4"})

    result, context = tick(tmp_path, instance, None)
    assert [r.run_key for r in result.run_requests] == ["ckpt/smoke-1234abcd@4"]
    assert list(result.dynamic_partitions_requests[0].partition_keys) == ["smoke-1234abcd@4"]
    assert "skipped 2 already done: smoke-1234abcd@8 (eval run " in (logged := capfd.readouterr().err)
    assert "STARTED); smoke-1234abcd@12 (scored: rows in evals.results)" in logged
    assert "requesting 1 evals: smoke-1234abcd@4" in logged
    assert scored(lake, ["ckpt/smoke-1234abcd@4", "ckpt/smoke-1234abcd@12"]) == {"ckpt/smoke-1234abcd@12"}

    # everything due already done: a skip that names them, and the cursor still moves on
    run_rows.evaluate(lake, "smoke-1234abcd", 4, {"all": 1.7})
    skip, context = tick(tmp_path, instance, None)
    assert isinstance(skip, SkipReason)
    assert skip.skip_message == ("every checkpoint due is already evaluated or being evaluated: "
                                 "smoke-1234abcd@4, smoke-1234abcd@8, smoke-1234abcd@12")
    assert json.loads(context.cursor)["snapshot_id"] == lake.current_snapshot_id(CHECKPOINTS_TABLE)


def test_a_tick_with_nothing_new_does_not_read_the_results_table(tmp_path, run_rows, monkeypatch):
    """The fast path stays cheap: the 'already scored' question is asked about due rows only."""
    lake = Lake.open(home=tmp_path)
    run_rows.checkpoint(lake, "r", 4, loss=1.0)
    _, cursor = due_checkpoints(lake, None)
    asked = []
    monkeypatch.setattr("sensors.evals.scored", lambda lake, ids: asked.append(ids) or set())
    result, _ = tick(tmp_path, DagsterInstance.ephemeral(), cursor)
    assert isinstance(result, SkipReason) and asked == []
