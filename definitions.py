"""The one Dagster entry point: `dagster dev -w workspace.yaml` and `dagster ... -m definitions`.

Loads with no environment set: resources resolve FACTORY_HOME and secrets at run time.
"""

from dagster import Definitions, in_process_executor

from assets import all_assets, all_checks
from jobs import jobs
from resources import default_resources
from sensors import schedules, sensors

defs = Definitions(
    assets=all_assets(),
    asset_checks=all_checks(),
    jobs=jobs,
    schedules=schedules,
    sensors=sensors,
    resources=default_resources(),
    # One process per run: the Spark steps of a run share one SparkSession (a JVM start is
    # 10-15 s). On Kubernetes that process is the run's pod, placed by its asset kind
    # (resources.k8s_launcher; its factory_k8s_job_executor is the pod-per-step alternative).
    executor=in_process_executor,
)
