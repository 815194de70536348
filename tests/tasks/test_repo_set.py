"""`derive_repo_set` over a whole repository set (factory.tasks.pipeline): environments derived in
parallel give what one at a time gives, committed in the set's order; a failing environment stops
the set with the ones before it stored and none after it; builds that did not pass are skipped
with their reason.

Unit tier, no sandbox and no lake: the builds table, the environments and the per-environment
derivation are stand-ins (the real derivation is tests/tasks/test_derive.py's); under a second.
"""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest

from factory.tasks import pipeline
from factory.tasks.model import DeriveConfig

REPOS = ("alpha", "beta", "delta", "gamma")  # sorted: the set's order


@pytest.fixture
def derivation(monkeypatch, tmp_path):
    """Builds of REPOS (and `broken`, which did not pass) whose environments are directories here;
    `derivation.each(env)` runs inside each environment's derivation; `derivation.committed` lists
    the stored task sets' repositories in commit order."""
    rows = {}
    for repo in (*REPOS, "broken"):
        (tmp_path / repo).mkdir()
        (tmp_path / repo / "env.json").write_text("{}")
        rows[repo] = {"failure_class": "build_error" if repo == "broken" else "passed", "build_id": f"{repo:0<12}",
                      "env_uri": (tmp_path / repo).as_uri(), "env_digest": "0" * 64}
    state = SimpleNamespace(committed=[], each=lambda env: None)

    def derive_task_set(env, kind, config, sandbox, flaky=()):
        state.each(env)
        return SimpleNamespace(repo=env.repo, tasks=(kind,) * len(env.repo), candidates=len(env.repo) + 1,
                               rejected={"no test fails on the broken file": 1})

    monkeypatch.setattr(pipeline, "latest_builds", lambda lake, repo_set: rows)
    monkeypatch.setattr(pipeline.Environment, "load",
                        lambda root: SimpleNamespace(repo=root.name, revision="1.0", digest="0" * 64))
    monkeypatch.setattr(pipeline, "_flaky", lambda lake, build_id: ())
    monkeypatch.setattr(pipeline, "derive_sandbox", lambda config: None)
    monkeypatch.setattr(pipeline, "derive_task_set", derive_task_set)
    monkeypatch.setattr(pipeline, "write_task_set", lambda lake, task_set, **kw: state.committed.append(task_set.repo))
    monkeypatch.setattr(pipeline, "task_set_version", lambda task_set: f"tasks/{task_set.repo}")
    return state


def _derive(parallel: int):
    return pipeline.derive_repo_set(None, "demo", "bug_fixing", DeriveConfig(), log=lambda line: None,
                                    parallel=parallel)


def test_parallel_environments_give_the_same_tasks_committed_in_the_sets_order(derivation):
    alone = _derive(1)
    committed_alone, derivation.committed = derivation.committed, []
    together = threading.Barrier(2, timeout=60)  # breaks unless two environments derive at the same time
    derivation.each = lambda env: together.wait() if env.repo in ("alpha", "beta") else None
    both = _derive(2)
    assert committed_alone == derivation.committed == list(REPOS)
    assert [(s.repo, s.tasks, s.candidates) for s in alone.task_sets] == \
        [(s.repo, s.tasks, s.candidates) for s in both.task_sets]
    assert alone.version_ids == both.version_ids == [f"tasks/{r}" for r in REPOS]
    assert alone.skipped == both.skipped == {"broken": "latest build broken000000 is build_error"}
    assert both.tasks == sum(len(r) for r in REPOS)


@pytest.mark.parametrize("parallel", [1, 2])
def test_a_failing_environment_keeps_those_before_it_and_stores_none_after_it(derivation, parallel):
    def each(env):
        if env.repo == "beta":
            raise RuntimeError("the sandbox is gone")

    derivation.each = each
    with pytest.raises(RuntimeError, match="the sandbox is gone"):
        _derive(parallel)
    assert derivation.committed == ["alpha"]
