"""`envs.builds` and `envs.tests`: every build and every test outcome, with lineage.

One batch of builds (one `build_repos` call) is three commits: `envs.tests` first, `envs.builds`
second, then one `factory.lineage` commit holding a row per build (kind `env_build`, version id
`env_build/<repo>@<revision>/<digest[:12]>`, upstream the source version, e.g.
`source/sdist/six==1.16.0` or `<git url>@<sha>`, content_hash the environment digest). Each commit
only refers to what is already there: a crash between them leaves tests without their build row,
never a build row whose tests are missing. Appends only: a rebuild is a new row (a new build_id),
so the history of a repository's builds (and its flakiness over time) stays queryable.
"""

from __future__ import annotations

import datetime as dt

import pyarrow as pa

from factory.envs.outcomes import BuildRecord
from factory.lake import CommitStamp, Lake, LineageRecord
from factory.lake.schemas import ENV_BUILDS, ENV_TESTS
from factory.version import canonical_json, config_hash, env_lock_hash

BUILDS_TABLE = "envs.builds"
TESTS_TABLE = "envs.tests"


def build_row(record: BuildRecord) -> dict:
    data = record.model_dump(exclude={"tests", "flaky"})
    data["failure_class"] = record.failure_class.value
    data.update(tests_passed=record.tests_passed, tests_failed=record.tests_failed, tests_flaky=len(record.flaky),
                version_id=record.version_id)
    return data


def test_rows(record: BuildRecord) -> list[dict]:
    flaky = set(record.flaky)
    return [{"build_id": record.build_id, "repo": record.repo, "env_digest": record.env_digest, "test_id": c.test_id,
             "outcome": c.outcome.value, "duration_s": float(c.duration_s), "flaky": c.test_id in flaky,
             "message": c.message[:500]} for c in record.tests]


test_rows.__test__ = False  # a row builder, not a pytest test


def lineage_row(record: BuildRecord, *, asset_key: str, partition: str, run_id: str, code: str) -> LineageRecord:
    config = {"repo": record.repo, "revision": record.revision, "builder": record.builder, "rules": record.rules_json}
    return LineageRecord(
        version_id=record.version_id, kind="env_build", name=f"env_build/{record.repo}", uri=record.env_uri or None,
        content_hash=record.env_digest or None, upstream=[record.origin], config_json=canonical_json(config),
        config_hash=config_hash(config), code_version=code, env_lock=env_lock_hash(), asset_key=asset_key,
        partition=partition, run_id=run_id,
        metadata_json=canonical_json({"failure_class": record.failure_class.value, "lock_hash": record.lock_hash,
                                      "tests_passed": record.tests_passed, "tests_failed": record.tests_failed,
                                      "tests_flaky": len(record.flaky), "build_id": record.build_id}))


def write_builds(lake: Lake, records: list[BuildRecord], *, repo_set: str, asset_key: str = "envs/builds",
                 run_id: str = "") -> int | None:
    """Commit a batch of builds (see the module docstring); returns the envs.builds snapshot id."""
    if not records:
        return None
    stamp = CommitStamp(asset_key=asset_key, config_hash=config_hash({"repo_set": repo_set}), run_id=run_id,
                        partition=repo_set)
    tests = [row for r in records for row in test_rows(r)]
    if tests:  # a batch where no build reached its tests has no test rows (and no empty snapshot)
        lake.commit(TESTS_TABLE, pa.Table.from_pylist(tests, schema=ENV_TESTS.as_arrow()), stamp, schema=ENV_TESTS)
    builds = pa.Table.from_pylist([build_row(r) for r in records], schema=ENV_BUILDS.as_arrow())
    commit = lake.commit(BUILDS_TABLE, builds, stamp, schema=ENV_BUILDS)
    lake.lineage.record(*[lineage_row(r, asset_key=asset_key, partition=repo_set, run_id=run_id,
                                      code=stamp.code_version) for r in records])
    return commit.snapshot_id


def builds(lake: Lake, repo_set: str | None = None) -> list[dict]:
    """Rows of envs.builds (of one set), oldest first."""
    if not lake.has_table(BUILDS_TABLE):
        return []
    rows = lake.table(BUILDS_TABLE).scan().to_arrow().to_pylist()
    epoch = dt.datetime.min.replace(tzinfo=dt.timezone.utc)
    return sorted((r for r in rows if repo_set is None or r["repo_set"] == repo_set),
                  key=lambda r: r["built_at"] or epoch)
