"""Sensors and schedules. Later stages add the checkpoint→eval and synthetic→mix sensors here."""

from dagster import DefaultScheduleStatus, ScheduleDefinition

from jobs import ingest_job

raw_refresh_schedule = ScheduleDefinition(
    name="raw_refresh_schedule",
    job=ingest_job,
    cron_schedule="0 3 * * *",
    default_status=DefaultScheduleStatus.STOPPED,
    description="Nightly re-ingest; an unchanged source commits nothing, so this is cheap.",
)

schedules = [raw_refresh_schedule]
sensors: list = []

__all__ = ["raw_refresh_schedule", "schedules", "sensors"]
