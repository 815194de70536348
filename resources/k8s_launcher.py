"""`FactoryK8sRunLauncher`: dagster-k8s's `K8sRunLauncher`, placing each run's Job by its asset kind.

Configured in the instance's dagster.yaml (the Helm values' `runLauncher.type: CustomRunLauncher`):

    run_launcher:
      module: resources.k8s_launcher
      class: FactoryK8sRunLauncher
      config: {<every K8sRunLauncher key>, deploy_profile: kubernetes}

At launch (never at import: definitions load with no environment set, and the profile is the
run's, chosen at run time) it finds the run's kind (`factory.deploy.kube.placement.run_kind`: the
run's `factory/kind` tag, else the kinds in its ops' tags, read from the run's job snapshot, since
the daemon does not load user code) and merges that kind's `dagster-k8s/config` (node pool,
requests, tolerations, PriorityClass, grace period, Kueue label, the profile as
FACTORY_DEPLOY_JSON) *under* the run's own: a `dagster-k8s/config` tag on a run or job still
wins, as in plain dagster-k8s. A run with no kind (an asset check job, say) is launched as
K8sRunLauncher would.

Steps as pods: `factory_k8s_job_executor` is dagster-k8s's `k8s_job_executor` whose step Jobs are
placed the same way, by the `factory/kind` tag of the step's op (the stock executor reads only
`dagster-k8s/config` op tags, which cannot name a profile chosen at run time).

The profile is `deploy_profile` from the launcher config, else the process's own
(FACTORY_DEPLOY_JSON / FACTORY_DEPLOY), loaded on first use. A training run's GPUs come from the
experiment in its run config (`parallel.nproc_per_node`) when it trains in its own pod.
"""

from __future__ import annotations

import json
from functools import cached_property

from dagster import Executor, Field, InitExecutorContext, StringSource, executor, multiple_process_executor_requirements
from dagster._core.executor.step_delegating import StepHandlerContext
from dagster._core.storage.dagster_run import DagsterRun
from dagster_k8s import K8sRunLauncher, k8s_job_executor
from dagster_k8s.container_context import K8sContainerContext
from dagster_k8s.executor import _K8S_EXECUTOR_CONFIG_SCHEMA, K8sStepHandler
from dagster_k8s.job import DagsterK8sJobConfig, UserDefinedDagsterK8sConfig

from factory.deploy import DeployConfig, load_profile
from factory.deploy.kube.placement import KIND_TAG_KEY, Placement, kind_of_tag, run_kind, run_placement


class FactoryK8sRunLauncher(K8sRunLauncher):
    """K8sRunLauncher + the profile's kind table (see the module docstring)."""

    def __init__(self, deploy_profile: str | None = None, **kwargs):
        self.deploy_profile = deploy_profile
        super().__init__(**kwargs)

    @classmethod
    def config_type(cls):
        return {**DagsterK8sJobConfig.config_type_run_launcher(),
                "deploy_profile": Field(StringSource, is_required=False,
                                        description="Deploy profile (configs/deploy name or a .yaml/.json file) whose "
                                                    "kind table places the runs; default: FACTORY_DEPLOY_JSON / "
                                                    "FACTORY_DEPLOY of the daemon's environment.")}

    @cached_property
    def profile(self) -> DeployConfig:
        return load_profile(self.deploy_profile)

    def op_tag_sets(self, run: DagsterRun) -> list[dict]:
        """The tags of the ops in `run`'s job snapshot (what the run executes)."""
        if not run.job_snapshot_id or self._instance is None:
            return []
        snap = self._instance.get_job_snapshot(run.job_snapshot_id)
        return [dict(op.tags or {}) for op in snap.node_defs_snapshot.op_def_snaps]

    def placement_for_run(self, run: DagsterRun) -> Placement | None:
        kind = run_kind(run.tags, self.op_tag_sets(run))
        return None if kind is None else run_placement(self.profile, kind, nproc_per_node=_nproc_per_node(run))

    def get_container_context_for_run(self, dagster_run: DagsterRun) -> K8sContainerContext:
        context = super().get_container_context_for_run(dagster_run)
        where = self.placement_for_run(dagster_run)
        if where is None:
            return context
        kind_config = UserDefinedDagsterK8sConfig.from_dict(where.k8s_config())
        return K8sContainerContext(run_k8s_config=kind_config).merge(context)  # the run's own config wins


class FactoryK8sStepHandler(K8sStepHandler):
    """k8s_job_executor's step handler, placing each step's Job by its op's `factory/kind` tag
    (the stock one only reads `dagster-k8s/config` op tags), under the step's own config."""

    def _get_container_context(self, step_handler_context: StepHandlerContext) -> K8sContainerContext:
        context = super()._get_container_context(step_handler_context)
        tags = step_handler_context.step_tags[self._get_step_key(step_handler_context)]
        if KIND_TAG_KEY not in tags:
            return context
        launcher = step_handler_context.instance.run_launcher
        profile = launcher.profile if isinstance(launcher, FactoryK8sRunLauncher) else load_profile()
        where = run_placement(profile, kind_of_tag(tags[KIND_TAG_KEY]),
                              nproc_per_node=_nproc_per_node(step_handler_context.dagster_run))
        return K8sContainerContext(run_k8s_config=UserDefinedDagsterK8sConfig.from_dict(where.k8s_config())).merge(context)


@executor(name="factory_k8s", config_schema=_K8S_EXECUTOR_CONFIG_SCHEMA,
          requirements=multiple_process_executor_requirements())
def factory_k8s_job_executor(init_context: InitExecutorContext) -> Executor:
    """`k8s_job_executor` (same config) with `FactoryK8sStepHandler`: one pod per step, each placed
    by its kind. The factory's definitions run steps in the run's pod (in_process_executor: the
    Spark steps of a run share one session); this is for a job that wants a pod per step."""
    executor = k8s_job_executor.executor_creation_fn(init_context)
    # the stock handler, already built from the config (and its cluster config loaded): only its
    # container context differs, and FactoryK8sStepHandler adds no state, so its class is swapped
    # instead of copying k8s_job_executor's 60 lines of config plumbing
    executor._step_handler.__class__ = FactoryK8sStepHandler
    return executor


def _nproc_per_node(run: DagsterRun) -> int | None:
    """The queued experiment's processes per node, if the run config carries one."""
    config = ((run.run_config or {}).get("ops", {}).get("training_run") or {}).get("config") or {}
    if not config.get("experiment_json"):
        return None
    return json.loads(config["experiment_json"]).get("parallel", {}).get("nproc_per_node")
