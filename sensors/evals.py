"""`checkpoint_eval_sensor`: every N-th checkpoint gets exported and evaluated, by itself.

Reads new `train.checkpoints` rows with a cursor (`factory.evals.watch`), adds a `checkpoints`
partition for each checkpoint due (step a multiple of its experiment's `eval_every`) and requests
an `eval_job` run with `run_key` = the checkpoint id, so a re-delivered tick never evaluates a
checkpoint twice. Eval runs carry a higher `dagster/priority` than training, so the queue starts
them first while a long run holds its slot.
"""


from dagster import DefaultSensorStatus, RunRequest, SensorEvaluationContext, SensorResult, SkipReason, sensor

from assets.evals import checkpoint_key, checkpoint_partitions
from factory.evals.watch import due_checkpoints
from jobs import EVAL_PRIORITY, eval_job
from resources.lake import LakeResource


@sensor(job=eval_job, minimum_interval_seconds=10, default_status=DefaultSensorStatus.RUNNING,
        description="Evaluate every checkpoint whose step is a multiple of its experiment's eval_every.")
def checkpoint_eval_sensor(context: SensorEvaluationContext, lake: LakeResource):
    due, cursor = due_checkpoints(lake.lake(), context.cursor)
    if not due:
        if cursor != context.cursor:
            context.update_cursor(cursor)
        return SkipReason("no new checkpoints due for evaluation")
    keys = [checkpoint_key(r["checkpoint_id"]) for r in due]
    context.log.info(f"requesting evals of {', '.join(keys)}")
    return SensorResult(
        run_requests=[RunRequest(run_key=r["checkpoint_id"], partition_key=key,
                                 tags={"dagster/priority": EVAL_PRIORITY, "factory/checkpoint": r["checkpoint_id"]})
                      for r, key in zip(due, keys)],
        dynamic_partitions_requests=[checkpoint_partitions.build_add_request(keys)],
        cursor=cursor,
    )
