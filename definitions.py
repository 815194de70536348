"""The one Dagster entry point: `dagster dev -w workspace.yaml` and `dagster ... -m definitions`.

Loads with no environment set: resources resolve FACTORY_HOME and secrets at run time.
"""

from dagster import Definitions

from assets import all_assets
from jobs import jobs
from resources import default_resources
from sensors import schedules, sensors

defs = Definitions(
    assets=all_assets(),
    jobs=jobs,
    schedules=schedules,
    sensors=sensors,
    resources=default_resources(),
)
