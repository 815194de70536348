"""`tasks/function_completion` and `tasks/bug_fixing`: tasks derived from the environments of one
repository set's latest builds (`envs/builds`, same partition), each validated in the sandbox
(FAIL_TO_PASS fail broken and pass with the reference) and decontaminated against the eval sets,
stored in `tasks.<kind>` with a lineage row per environment."""

from typing import Optional

from dagster import AssetsDefinition, Config, MaterializeResult, MetadataValue, asset

from assets._metadata import display, table
from assets.envs import repo_set_partitions
from factory.deploy.kube.placement import op_tags
from factory.tasks.model import DeriveConfig
from factory.tasks.pipeline import RepoSetTasks, derive_repo_set
from resources.lake import LakeResource

KINDS = ("function_completion", "bug_fixing")


class TaskDeriveConfig(Config):
    max_tasks: Optional[int] = None
    """Tasks kept per environment at most (default: DeriveConfig's)."""
    max_candidates: Optional[int] = None
    """Candidates tried per environment at most; each costs two sandboxed test runs."""
    seed: int = 0
    """Seed of the candidate order and the mutations."""
    parallel: int = 1
    """Environments derived at once (each still one test run at a time: the same tasks)."""


def task_assets() -> list[AssetsDefinition]:
    return [_task_asset(kind) for kind in KINDS]


def _task_asset(kind: str) -> AssetsDefinition:
    @asset(
        name=kind,
        key_prefix=["tasks"],
        deps=[["envs", "builds"]],
        partitions_def=repo_set_partitions,
        group_name="tasks",
        kinds={"iceberg", "python"},
        op_tags=op_tags("build"),
        description=f"Iceberg table `tasks.{kind}`: tasks derived from the test suites of the partition's "
                    "passing environments, validated in the sandbox and decontaminated against HumanEval.",
    )
    def _asset(context, config: TaskDeriveConfig, lake: LakeResource) -> MaterializeResult:
        fields = {k: v for k, v in {"max_tasks": config.max_tasks, "max_candidates": config.max_candidates}.items()
                  if v is not None}
        derive = DeriveConfig(seed=config.seed, **fields)
        result = derive_repo_set(lake.lake(), context.partition_key, kind, derive, run_id=context.run_id,
                                 asset_key=f"tasks/{kind}", log=context.log.info, parallel=config.parallel)
        return MaterializeResult(metadata=_metadata(result))

    return _asset


def _metadata(r: RepoSetTasks) -> dict:
    rejected: dict[str, int] = {}
    for s in r.task_sets:
        for reason, n in s.rejected.items():
            rejected[reason] = rejected.get(reason, 0) + n
    reasons = "\n".join(f"| {k} | {n} |" for k, n in sorted(rejected.items(), key=lambda kv: -kv[1])) or "| - | 0 |"
    return display({
        "tasks": r.tasks, "environments": len(r.task_sets), "seconds": r.seconds,
        "per_repository": table([{"repo": s.repo, "revision": s.revision, "tasks": len(s.tasks),
                                  "candidates": s.candidates, "contaminated": len(s.contaminated),
                                  "digest": s.env_digest[:12]} for s in r.task_sets],
                                ["repo", "revision", "tasks", "candidates", "contaminated", "digest"]),
        "rejected_by": MetadataValue.md(f"| reason | candidates |\n|---|---:|\n{reasons}"),
        "skipped": MetadataValue.json(r.skipped),
        "lineage": MetadataValue.md("\n".join(f"`factory lineage {v}`" for v in r.version_ids[:5]) or "no tasks"),
    })
