"""`checkpoint_eval_sensor` with a built context over a real lake: first tick, nothing new, several
checkpoints landing between two ticks (some not due), the run keys, partitions and cursor it
returns. CPU, no servers. Checkpoint rows are appended directly (a narrow test of the sensor's
reading; training writes the same schema)."""

import datetime as dt
import json

import pyarrow as pa
from dagster import DagsterInstance, SensorResult, SkipReason, build_sensor_context

from factory.evals.watch import due_checkpoints
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
    assert all(r.tags["dagster/priority"] == EVAL_PRIORITY for r in result.run_requests)
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
