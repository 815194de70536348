"""Sensors and schedules: experiment files→training, checkpoint→eval, synthetic→mix,
votes→leaderboard, one schedule per sweep in configs/sweeps (read when the definitions load: reload
the code location in the UI after adding a sweep file), the nightly raw refresh."""

from dagster import DefaultScheduleStatus, ScheduleDefinition

from factory.experiments.registry import discover_sweeps
from jobs import ingest_job
from sensors.evals import checkpoint_eval_sensor
from sensors.experiments import experiment_sensor, sweep_schedule
from sensors.podium import podium_votes_sensor
from sensors.synth import synthetic_mix_sensor

raw_refresh_schedule = ScheduleDefinition(
    name="raw_refresh_schedule",
    job=ingest_job,
    cron_schedule="0 3 * * *",
    default_status=DefaultScheduleStatus.STOPPED,
    description="Nightly re-ingest; an unchanged source commits nothing, so this is cheap.",
)

schedules = [raw_refresh_schedule, *(sweep_schedule(f.config) for _, f in sorted(discover_sweeps().found.items()))]
sensors = [experiment_sensor, checkpoint_eval_sensor, synthetic_mix_sensor, podium_votes_sensor]

__all__ = ["checkpoint_eval_sensor", "experiment_sensor", "podium_votes_sensor", "raw_refresh_schedule", "schedules", "sensors",
           "sweep_schedule", "synthetic_mix_sensor"]
