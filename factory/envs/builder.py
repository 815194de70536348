"""The seam between *deciding* how to build a repository and *doing* it: the `Builder` protocol.

`build.py` runs the three phases (resolve, build, test) the same way for every repository; what it
asks a builder is only the plan: given a fetched source tree, which backend, which requirements,
which test command (`BuildPlan`), and, after a failed attempt, whether it has a better plan.

The heuristic builder answers from the rule table (rules.py, detect.py) and never revises. An LLM
agent implements the same two methods with tools: it may read any file under `source.src_dir`
(read-only on the host: nothing of the repository runs outside the sandbox), and `revise` gets the
failed attempt's `BuildRecord` (failure class, rule, the phase's output tail in failure_detail) and
returns a new plan, or None to give up; `build_repo` calls it at most `max_attempts - 1` times and
records every attempt's `builder` name and rule ids ('agent:<name>' for an agent's own decisions),
so the tables compare heuristics and agents by the same columns.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from factory.envs.detect import BuildPlan, addopts_plugins, detect
from factory.envs.registry import normalize

if TYPE_CHECKING:
    from factory.envs.outcomes import BuildRecord
    from factory.envs.sources import FetchedSource


@runtime_checkable
class Builder(Protocol):
    """Plans builds of fetched repositories (see the module docstring)."""

    name: str

    def plan(self, source: "FetchedSource") -> BuildPlan:
        """The plan for the tree at `source.src_dir`; a plan with backend None means 'no build system'."""
        ...

    def revise(self, source: "FetchedSource", plan: BuildPlan, failed: "BuildRecord") -> BuildPlan | None:
        """A better plan after `failed`, or None to stop trying."""
        ...


class HeuristicBuilder:
    """The rule-table builder: a static reading of the repository, then fallbacks for resolution.

    Declared test dependencies are the usual cause of a failed resolution (a package with only an
    sdist, pins compiled for other Pythons, linters), so after one the builder tries, in order:
    the test dependencies without the missing projects (testdeps.drop-missing), without their
    version pins (testdeps.unpinned), and only pytest plus the plugins addopts names
    (testdeps.minimal). Each attempt is a build of its own; the record keeps the rule that worked.
    """

    name = "heuristic"

    def plan(self, source: "FetchedSource") -> BuildPlan:
        return detect(Path(source.src_dir))

    def revise(self, source: "FetchedSource", plan: BuildPlan, failed: "BuildRecord") -> BuildPlan | None:
        from factory.envs.outcomes import FailureClass

        if failed.failure_class not in (FailureClass.RESOLUTION_FAILED, FailureClass.NO_WHEEL) \
                or failed.rule.startswith(("python.", "source.")):
            return None
        tried = plan.rules.get("testdeps", "")
        tests = plan.test_requirements
        missing = {normalize(m) for m in re.findall(r"(?:No matching distribution found for|no wheel on the index for) "
                                                    r"([A-Za-z0-9._-]+)", failed.failure_detail)}
        for m in re.findall(r"no wheel on the index for ([^(]+) \(", failed.failure_detail):
            missing |= {normalize(n.strip()) for n in m.split(",")}
        if "testdeps.drop-missing" not in tried and "testdeps.unpinned" not in tried and missing:
            kept = tuple(r for r in tests if normalize(_project(r)) not in missing)
            if kept != tests:
                return _with(plan, kept, "testdeps.drop-missing")
        if "testdeps.unpinned" not in tried and "testdeps.minimal" not in tried:
            unpinned = tuple(dict.fromkeys(r if "==" not in r else _project(r) for r in tests))
            if unpinned != tests and not missing:
                return _with(plan, unpinned, "testdeps.unpinned")
        minimal = ("pytest", *addopts_plugins(Path(source.src_dir)))
        if "testdeps.minimal" not in tried and not set(tests) <= set(minimal):
            return _with(plan, minimal, "testdeps.minimal")
        return None


def _project(requirement: str) -> str:
    return re.split(r"[\s<>=!~;\[(@]", requirement.strip(), maxsplit=1)[0]


def _with(plan: BuildPlan, tests: tuple[str, ...], rule: str) -> BuildPlan:
    return plan.model_copy(update={"test_requirements": tests, "rules": {**plan.rules, "testdeps": rule}})
