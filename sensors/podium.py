"""`podium_votes_sensor`: new votes in `podium.votes` → materialize `podium/leaderboard`."""

from dagster import DefaultSensorStatus, RunRequest, SensorEvaluationContext, SkipReason, sensor

from factory.podium.store import VOTES
from jobs import podium_job
from resources.lake import LakeResource


@sensor(job=podium_job, minimum_interval_seconds=30, default_status=DefaultSensorStatus.RUNNING,
        description="Recompute the Podium leaderboard (and podium.preferences) when podium.votes has a new snapshot.")
def podium_votes_sensor(context: SensorEvaluationContext, lake: LakeResource):
    lake = lake.lake()
    snapshot = lake.current_snapshot_id(VOTES) if lake.has_table(VOTES) else None
    if snapshot is None:
        return SkipReason("no votes yet")
    if context.cursor == str(snapshot):
        return SkipReason(f"leaderboard is current with {VOTES}@{snapshot}")
    context.update_cursor(str(snapshot))
    return RunRequest(run_key=f"{VOTES}@{snapshot}", tags={"factory/votes": f"{VOTES}@{snapshot}"})
