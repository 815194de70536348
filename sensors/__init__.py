"""Sensors and schedules: checkpoint→eval, synthetic→mix, the nightly raw refresh."""

from dagster import DefaultScheduleStatus, ScheduleDefinition

from jobs import ingest_job
from sensors.evals import checkpoint_eval_sensor
from sensors.synth import synthetic_mix_sensor

raw_refresh_schedule = ScheduleDefinition(
    name="raw_refresh_schedule",
    job=ingest_job,
    cron_schedule="0 3 * * *",
    default_status=DefaultScheduleStatus.STOPPED,
    description="Nightly re-ingest; an unchanged source commits nothing, so this is cheap.",
)

schedules = [raw_refresh_schedule]
sensors = [checkpoint_eval_sensor, synthetic_mix_sensor]

__all__ = ["checkpoint_eval_sensor", "synthetic_mix_sensor", "raw_refresh_schedule", "schedules", "sensors"]
