"""`checkpoint_eval_sensor`: every N-th checkpoint gets exported and evaluated, by itself — once.

Reads new `train.checkpoints` rows with a cursor (`factory.evals.watch`): a checkpoint is due
when its step is a multiple of its experiment's `eval_every`. Of the due ones (only those: a tick
with nothing new reads nothing else) it skips, as already done:
- a checkpoint with rows in `evals.results`, however it was scored (`make demo`'s `dagster asset
  materialize`, `factory eval`, an earlier run of this sensor);
- a checkpoint whose partition has an eval run queued or in progress (launched from the UI or
  the CLI; the sensor's own are deduplicated by their run key as well).
For each of the rest it adds a `checkpoints` partition and requests an `eval_job` run with
`run_key` = the checkpoint id, so a re-delivered tick never evaluates a checkpoint twice. Eval
runs carry a higher `dagster/priority` than training, so the queue starts them first while a long
run holds its slot, and the instance runs one `factory/kind=eval` run at a time
(configs/dagster.yaml): two vLLM engines on one small machine take longer than one after the other.
"""


from dagster import (
    AssetKey,
    DagsterRunStatus,
    DefaultSensorStatus,
    RunRequest,
    RunsFilter,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    sensor,
)

from assets.evals import checkpoint_key, checkpoint_partitions
from factory.evals.watch import due_checkpoints, scored
from jobs import EVAL_PRIORITY, eval_job
from resources.lake import LakeResource

EVAL_ASSETS = {AssetKey("checkpoint_export"), AssetKey("eval_scores")}
LIVE = [DagsterRunStatus.QUEUED, DagsterRunStatus.NOT_STARTED, DagsterRunStatus.STARTING, DagsterRunStatus.STARTED]


@sensor(job=eval_job, minimum_interval_seconds=10, default_status=DefaultSensorStatus.RUNNING,
        description="Export and evaluate each new checkpoint whose step is a multiple of its experiment's eval_every, "
                    "unless it already has scores in evals.results or an eval run queued or running.")
def checkpoint_eval_sensor(context: SensorEvaluationContext, lake: LakeResource):
    due, cursor = due_checkpoints(lake.lake(), context.cursor)
    if not due:
        if cursor != context.cursor:
            context.update_cursor(cursor)
        return SkipReason("no new checkpoints due for evaluation")
    done = {i: "scored: rows in evals.results" for i in scored(lake.lake(), [r["checkpoint_id"] for r in due])}
    done |= _live(context.instance, [r["checkpoint_id"] for r in due if r["checkpoint_id"] not in done])
    skipped = [r["checkpoint_id"] for r in due if r["checkpoint_id"] in done]  # in due's (run, step) order
    if skipped:
        context.log.info(f"skipped {len(skipped)} already done: "
                         + "; ".join(f"{checkpoint_key(i)} ({done[i]})" for i in skipped))
    todo = [r for r in due if r["checkpoint_id"] not in done]
    if not todo:
        context.update_cursor(cursor)
        return SkipReason("every checkpoint due is already evaluated or being evaluated: "
                          + ", ".join(checkpoint_key(i) for i in skipped))
    keys = [checkpoint_key(r["checkpoint_id"]) for r in todo]
    context.log.info(f"requesting {len(keys)} evals: {', '.join(keys)}")
    return SensorResult(
        run_requests=[RunRequest(run_key=r["checkpoint_id"], partition_key=key,
                                 tags={"dagster/priority": EVAL_PRIORITY}) for r, key in zip(todo, keys)],
        dynamic_partitions_requests=[checkpoint_partitions.build_add_request(keys)],
        cursor=cursor,
    )


def _live(instance, checkpoint_ids: list[str]) -> dict[str, str]:
    """checkpoint id -> why, for those whose partition has an eval run queued or in progress."""
    if not checkpoint_ids:
        return {}
    keys = {checkpoint_key(i): i for i in checkpoint_ids}
    out = {}
    for r in instance.get_runs(RunsFilter(tags={"dagster/partition": list(keys)}, statuses=LIVE)):
        if r.job_name == eval_job.name or EVAL_ASSETS & set(r.asset_selection or ()):
            out.setdefault(keys[r.tags["dagster/partition"]], f"eval run {r.run_id[:8]} {r.status.value}")
    return out
