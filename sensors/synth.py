"""`synthetic_mix_sensor`: a new synthetic snapshot → a new version of every mix that includes it.

Dagster's graph stays acyclic: synthetic data from round r feeds mix version r+1
through this sensor, not through an edge. It requests `mix_job` for each due mix (partition =
the mix, `run_key` = mix + table snapshot); a training run following that mix switches to the
new version at its next poll. A mix whose newest version already pins the table's current
snapshot is skipped as done (`factory.synth.loop`), however that version was registered.
"""


from dagster import DefaultSensorStatus, RunRequest, SensorEvaluationContext, SensorResult, SkipReason, sensor

from configs.mixes import mix_names, mix_spec
from factory.synth.loop import mixes_to_refresh
from jobs import mix_job
from resources.lake import LakeResource


def _names(pairs) -> str:
    return ", ".join(f"{mix} <- {table}@{snapshot}" for mix, table, snapshot in pairs)


@sensor(job=mix_job, minimum_interval_seconds=30, default_status=DefaultSensorStatus.RUNNING,
        description="Register a new version of every mix that includes a synthetic table with a new snapshot, "
                    "unless the mix's newest version already pins that snapshot.")
def synthetic_mix_sensor(context: SensorEvaluationContext, lake: LakeResource):
    refresh = mixes_to_refresh(lake.lake(), context.cursor, {name: mix_spec(name) for name in mix_names()})
    if refresh.current:
        context.log.info(f"skipped {len(refresh.current)} already done (the newest version pins the snapshot): "
                         + _names(refresh.current))
    if not refresh.due:
        context.update_cursor(refresh.cursor)
        return SkipReason("no new synthetic snapshots in any mix"
                          + (f"; already current: {_names(refresh.current)}" if refresh.current else ""))
    context.log.info(f"requesting {len(refresh.due)} mix versions: {_names(refresh.due)}")
    return SensorResult(
        run_requests=[RunRequest(run_key=f"{mix}:{table}@{snapshot}", partition_key=mix,
                                 tags={"factory/synthetic": f"{table}@{snapshot}"})
                      for mix, table, snapshot in refresh.due],
        cursor=refresh.cursor,
    )
