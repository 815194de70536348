"""`envs/builds`: one materialization builds every repository of a repository set (the partition,
from configs/envs) into content-addressed environments: resolve (wheels only), build and test in
the sandbox. Each build and each test outcome lands in `envs.builds` / `envs.tests` with a lineage
row per build; a repository that fails is a recorded failure with its class, not a failed run.
"""

from typing import Optional

from dagster import Config, MaterializeResult, MetadataValue, StaticPartitionsDefinition, asset

from assets._metadata import display, table
from configs.envs import REPO_SETS, repo_set
from factory import settings
from factory.deploy.kube.placement import op_tags
from factory.envs.build import build_repos
from factory.envs.registry import RegistryConfig
from factory.envs.sources import RepoSet
from resources.lake import LakeResource

repo_set_partitions = StaticPartitionsDefinition(sorted(REPO_SETS))


class EnvBuildConfig(Config):
    registry: Optional[str] = None
    """Package index to resolve against (a URL or file://…/simple); default FACTORY_REGISTRY, else pip's own."""
    limit: Optional[int] = None
    """Build only the first N repositories of the set."""
    parallel: int = 1
    """Repositories built at once (the same environments and records, in the set's order)."""


@asset(
    key=["envs", "builds"],
    partitions_def=repo_set_partitions,
    group_name="envs",
    kinds={"iceberg", "python"},
    op_tags=op_tags("build"),
    description="Repository environments of one repository set (configs/envs): resolve wheels into the "
                "wheelhouse and a lock, build a venv and run the test suite in the sandbox. Outcomes in "
                "envs.builds (failure class, rule, phase times, digest), tests in envs.tests.",
)
def env_builds(context, config: EnvBuildConfig, lake: LakeResource) -> MaterializeResult:
    repos = repo_set(context.partition_key)
    if config.limit is not None:
        repos = RepoSet(name=repos.name, repos=repos.repos[: config.limit])
    registry = RegistryConfig(index_url=config.registry or settings.registry())

    def progress(done: int, total: int, record) -> None:
        context.log.info(f"[{done}/{total}] {record.repo}@{record.revision}: {record.failure_class.value} "
                         f"(resolve {record.resolve_s:.1f}s, build {record.build_s:.1f}s, test {record.test_s:.1f}s)"
                         + (f" - {record.failure_detail[:200]}" if record.failure_detail else ""))

    records = build_repos(repos, lake=lake.lake(), home=lake.lake().home, registry=registry, progress=progress,
                          run_id=context.run_id, parallel=config.parallel)
    return MaterializeResult(metadata=_metadata(records))


def _metadata(records) -> dict:
    seconds = sum(r.resolve_s + r.build_s + r.test_s for r in records)
    passed = [r for r in records if r.failure_class.value == "passed"]
    classes: dict[str, int] = {}
    for r in records:
        classes[r.failure_class.value] = classes.get(r.failure_class.value, 0) + 1
    by_class = "\n".join(f"| {c} | {n} |" for c, n in sorted(classes.items(), key=lambda kv: -kv[1]))
    return display({
        "builds": len(records), "passed": len(passed),
        "success_rate": len(passed) / len(records) if records else 0.0,
        "builds_per_hour": 3600 * len(records) / seconds if seconds else 0.0,
        "by_failure_class": MetadataValue.md(f"| failure class | builds |\n|---|---:|\n{by_class}"),
        "repositories": table([{
            "repo": r.repo, "revision": r.revision, "outcome": r.failure_class.value, "rule": r.rule,
            "tests passed": r.tests_passed, "tests failed": r.tests_failed, "flaky": len(r.flaky),
            "seconds": r.resolve_s + r.build_s + r.test_s, "digest": r.env_digest[:12]} for r in records],
            ["repo", "revision", "outcome", "rule", "tests passed", "tests failed", "flaky", "seconds", "digest"]),
        "lineage": MetadataValue.md("\n".join(f"`factory lineage {r.version_id}`" for r in passed[:5]) or "no environment"),
    })
