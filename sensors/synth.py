"""`synthetic_mix_sensor`: a new synthetic snapshot → a new version of every mix that includes it.

Dagster's graph stays acyclic: synthetic data from round r feeds mix version r+1
through this sensor, not through an edge. It requests `mix_job` for each due mix (partition =
the mix, `run_key` = mix + table snapshot); a training run following that mix switches to the
new version at its next poll.
"""


from dagster import DefaultSensorStatus, RunRequest, SensorEvaluationContext, SensorResult, SkipReason, sensor

from configs.mixes import mix_names, mix_spec
from factory.synth.loop import mixes_to_refresh
from jobs import mix_job
from resources.lake import LakeResource


@sensor(job=mix_job, minimum_interval_seconds=30, default_status=DefaultSensorStatus.RUNNING,
        description="Register a new version of every mix that includes a synthetic table with a new snapshot.")
def synthetic_mix_sensor(context: SensorEvaluationContext, lake: LakeResource):
    due, cursor = mixes_to_refresh(lake.lake(), context.cursor, {name: mix_spec(name) for name in mix_names()})
    if not due:
        context.update_cursor(cursor)
        return SkipReason("no new synthetic snapshots in any mix")
    return SensorResult(
        run_requests=[RunRequest(run_key=f"{mix}:{table}@{snapshot}", partition_key=mix,
                                 tags={"factory/synthetic": f"{table}@{snapshot}"}) for mix, table, snapshot in due],
        cursor=cursor,
    )
