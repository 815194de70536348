"""`factory envs ...`: mirror a repository set's packages, build its environments, list builds.

`mirror --repos NAME --dest DIR` fills a local PEP 503 index (mirror.py) so builds, tests and the
demo run with no network; `build --repos NAME [--registry URL]` builds every repository of the set
(build.py), commits envs.builds / envs.tests with lineage, and prints one row per repository and a
table of outcomes by failure class; `builds` lists what the lake holds; `image --repos NAME` makes an
OCI image of each environment of the set's latest passing builds (image.py).
"""

from __future__ import annotations

import collections
import json
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table as RichTable


def _repo_set(name: str):
    from configs.envs import repo_set
    from factory.envs.sources import SourceError

    try:
        return repo_set(name)
    except ValueError as exc:  # an unknown set name: the user's to fix, one line on stderr
        raise SourceError(str(exc)) from None


def _registry(url: str | None):
    """--registry, else $FACTORY_REGISTRY, else pip's configured index; a mirror directory becomes its index URL."""
    from factory import settings
    from factory.envs.registry import RegistryConfig

    url = url or settings.registry()
    if url and not url.startswith(("file://", "http://", "https://")):
        url = (Path(url).resolve() / "simple").as_uri() if (Path(url) / "simple").is_dir() else Path(url).resolve().as_uri()
    return RegistryConfig(index_url=url)


def cmd_mirror(args, out: Console) -> int:
    from factory.envs.mirror import mirror
    from factory.envs.registry import RegistryConfig

    repo_set = _repo_set(args.repos)
    report = mirror(repo_set, Path(args.dest), RegistryConfig(index_url=args.registry) if args.registry else None)
    out.print(f"mirror {report.dest}: {report.files} files, {report.projects} projects; "
              f"index {(Path(report.dest) / 'simple').resolve().as_uri()}")
    for name, why in report.failures.items():
        out.print(f"  not mirrored: {name}: {why}")
    return 1 if report.failures else 0


def cmd_build(args, out: Console) -> int:
    from factory.cli import open_lake
    from factory.envs.build import build_repos
    from factory.home import factory_home

    repo_set = _repo_set(args.repos)
    lake = open_lake(args)

    def progress(done, total, record):  # on stderr with --json, so stdout stays one JSON document
        line = (f"[{done}/{total}] {record.repo} {record.revision}: {record.failure_class.value} "
                f"({record.tests_passed} passed, {record.tests_failed} failed, {len(record.flaky)} flaky)")
        if args.json:
            print(line, file=sys.stderr, flush=True)
        else:
            out.print(line)

    records = build_repos(repo_set, lake=lake, home=factory_home(getattr(args, "home", None)),
                          registry=_registry(args.registry), progress=progress, parallel=max(args.parallel, 1))
    if args.json:
        print(json.dumps([json.loads(r.model_dump_json(exclude={"tests"})) for r in records]))
        return 0
    table = RichTable("repo", "revision", "class", "rule", "tests p/f/flaky", "resolve s", "build s", "test s",
                      title=f"envs build {repo_set.name}")
    for r in records:
        table.add_row(r.repo, r.revision[:16], r.failure_class.value, r.rule,
                      f"{r.tests_passed}/{r.tests_failed}/{len(r.flaky)}", f"{r.resolve_s:.1f}", f"{r.build_s:.1f}",
                      f"{r.test_s:.1f}")
    out.print(table)
    out.print(outcome_table(records))
    return 0


def outcome_table(records) -> RichTable:
    """Builds by failure class: count and share, with the rules behind them."""
    by_class = collections.defaultdict(list)
    for r in records:
        by_class[r.failure_class.value].append(r)
    table = RichTable("failure class", "builds", "share", "rules", title="outcomes by failure class")
    for name, group in sorted(by_class.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        rules = collections.Counter(r.rule for r in group)
        table.add_row(name, str(len(group)), f"{len(group) / len(records):.0%}",
                      ", ".join(f"{rule} ({n})" for rule, n in rules.most_common()))
    return table


def cmd_builds(args, out: Console) -> int:
    from factory.cli import open_lake
    from factory.envs.store import builds

    rows = builds(open_lake(args), args.repos)
    if args.json:
        print(json.dumps(rows, default=str))
        return 0
    table = RichTable("built at", "set", "repo", "revision", "class", "rule", "passed", "failed", "flaky", "digest")
    for r in rows:
        table.add_row(f"{r['built_at']:%Y-%m-%d %H:%M}", r["repo_set"], r["repo"], r["revision"][:16], r["failure_class"],
                      r["rule"], str(r["tests_passed"]), str(r["tests_failed"]), str(r["tests_flaky"]), r["env_digest"][:12])
    out.print(table)
    return 0


def cmd_image(args, out: Console) -> int:
    from factory.cli import open_lake
    from factory.envs.environment import Environment
    from factory.envs.image import build_env_image
    from factory.tasks.pipeline import latest_builds

    latest = latest_builds(open_lake(args), args.repos)
    if not latest:
        out.print(f"repository set {args.repos!r} has no builds; run `factory envs build --repos {args.repos}` first")
        return 1
    table = RichTable("repo", "revision", "image", "id", "built", title=f"environment images of {args.repos}")
    for repo, row in sorted(latest.items()):
        if row["failure_class"] != "passed":
            table.add_row(repo, row["revision"], f"- (latest build is {row['failure_class']})", "", "")
            continue
        image = build_env_image(Environment.load(row["env_uri"].removeprefix("file://")))
        table.add_row(repo, row["revision"], image.ref, image.image_id[:12], "yes" if image.built else "existing")
    out.print(table)
    return 0
