"""The builder's heuristics as data: one `Rule` per way of reading a repository.

Each rule says which part of a build plan it decides (`part`), what in a repository it looks at
(`detects`) and what it yields (`yields`). `detect.py` holds one small function per rule id and
tries a part's rules in table order; the first that matches decides the part (requirement rules
accumulate instead: a repository's test dependencies may come from its extras *and* its tox.ini).
Every plan records, per part, the id of the rule that decided it, and every failure class names the
rule behind it, so a table of failures by rule says which heuristic to improve, and a new heuristic
is one row here plus one function there.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class Rule(BaseModel):
    """One heuristic of the builder."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str = Field(description="Stable id, '<part>.<name>' (recorded on builds and failures).")
    part: str = Field(description="Plan part it decides: backend, python, deps, testdeps, runner, install.")
    detects: str = Field(description="What in the repository it reads.")
    yields: str = Field(description="What it contributes to the plan.")


def _r(id: str, detects: str, yields: str) -> Rule:
    return Rule(id=id, part=id.split(".", 1)[0], detects=detects, yields=yields)


RULES: tuple[Rule, ...] = (
    # before and outside the heuristics
    _r("source.fetch", "the repository's path, git URL at its revision, or sdist on the index",
       "its tree; else failure resolution_failed"),
    _r("builder.internal", "an exception inside the builder itself", "failure build_error (a builder bug to fix)"),
    # build backend: first match wins
    _r("backend.pyproject", "pyproject.toml [build-system] build-backend", "that backend and its `requires`"),
    _r("backend.pyproject-requires", "pyproject.toml [build-system] requires, no build-backend",
       "setuptools' legacy backend (PEP 517 default) and those requires"),
    _r("backend.setup-py", "setup.py (no [build-system])", "setuptools' legacy backend; requires setuptools, wheel"),
    _r("backend.setup-cfg", "setup.cfg [metadata] only (no setup.py, no pyproject)",
       "setuptools; installed by a .pth (pip cannot build it)"),
    _r("backend.none", "none of the above", "failure no_build_system"),
    # python version
    _r("python.pyproject", "pyproject.toml [project] requires-python", "python_requires"),
    _r("python.poetry", "pyproject.toml [tool.poetry.dependencies] python", "python_requires"),
    _r("python.setup-py", "setup.py setup(python_requires=<literal>) (AST)", "python_requires"),
    _r("python.setup-cfg", "setup.cfg [options] python_requires", "python_requires"),
    # runtime dependencies: first match wins
    _r("deps.pyproject", "pyproject.toml [project] dependencies", "requirements"),
    _r("deps.poetry", "pyproject.toml [tool.poetry.dependencies] (^ and ~ translated)", "requirements"),
    _r("deps.setup-py", "setup.py setup(install_requires=<literal or module-level literal>) (AST, never run)",
       "requirements"),
    _r("deps.setup-cfg", "setup.cfg [options] install_requires", "requirements"),
    _r("deps.requirements-txt", "requirements.txt / requirements/base|main|prod.txt", "requirements"),
    # test dependencies: every match adds
    _r("testdeps.extras", "test extras of pyproject / setup.py / setup.cfg: [test], [tests], [testing]; [dev] "
       "only without them",
       "their requirements (self-references expanded)"),
    _r("testdeps.groups", "[dependency-groups], [tool.pdm.dev-dependencies], poetry groups test/tests/dev",
       "their requirements"),
    _r("testdeps.tests-require", "setup.py tests_require / setup.cfg tests_require", "requirements"),
    _r("testdeps.requirements-test", "requirements-test*.txt, test-requirements.txt, requirements/test*.txt, "
       "requirements-dev.txt, dev-requirements.txt", "requirements"),
    _r("testdeps.tox", "tox.ini [testenv] deps", "requirements (factor prefixes stripped)"),
    _r("testdeps.nox", "noxfile.py session.install('<literal>') calls (AST)", "requirements"),
    _r("testdeps.addopts-plugins", "pytest addopts naming a plugin's flag (--cov, -n, --timeout, ...)",
       "that plugin"),
    _r("testdeps.skip-linters", "lint/type/format pytest plugins among them (pytest-black, -mypy, -ruff, ...)",
       "those dropped, with their addopts flags (-o addopts=...)"),
    _r("testdeps.runner", "the chosen test runner", "pytest (always: the report plugin runs under it)"),
    # fallbacks after a failed resolution (builder.py), tried in this order, one attempt each
    _r("testdeps.drop-missing", "resolution failed on test dependencies the index lacks (or has only as sdists)",
       "the test dependencies without them"),
    _r("testdeps.unpinned", "resolution failed on conflicting test pins (files compiled for other Pythons)",
       "the test dependencies without their == pins"),
    _r("testdeps.minimal", "resolution still failed with the declared test dependencies",
       "only pytest and the plugins addopts names"),
    # pins from a lockfile: constraints on the resolver
    _r("lock.poetry", "poetry.lock [[package]] name, version", "== constraints"),
    _r("lock.uv", "uv.lock [[package]] name, version", "== constraints"),
    _r("lock.pip-tools", "requirements*.txt autogenerated by pip-compile", "== constraints"),
    # test runner and its arguments: first match wins
    _r("runner.unittest-only", "test files that subclass unittest.TestCase and never import pytest, no pytest config",
       "unittest discovery in the tests directory"),
    _r("runner.pyproject-pytest", "pyproject.toml [tool.pytest.ini_options]", "pytest with its config"),
    _r("runner.pytest-ini", "pytest.ini [pytest]", "pytest with its config"),
    _r("runner.setup-cfg-pytest", "setup.cfg [tool:pytest]", "pytest with its config"),
    _r("runner.tox-ini-pytest", "tox.ini [pytest] section, or [testenv] commands running pytest",
       "pytest (paths from the commands)"),
    _r("runner.tests-dir", "a tests/ or test/ directory (top level, under src/, or inside a package)",
       "pytest on that directory"),
    _r("runner.test-files", "test_*.py / *_test.py / tests.py files in the top directory, test_*.py in src/",
       "pytest on those files"),
    _r("runner.none", "no tests anywhere", "failure test_collection_error"),
    # how the project itself is installed into the venv
    _r("install.editable", "a backend that builds editables (PEP 660)", "pip install -e /repo, no deps, no index"),
    _r("install.pth", "editable install failed or impossible", "a .pth naming /repo/src (src layout) or /repo"),
)

BY_ID = {rule.id: rule for rule in RULES}


def rule(rule_id: str) -> Rule:
    """The rule `rule_id`, or KeyError naming the known ids of its part."""
    try:
        return BY_ID[rule_id]
    except KeyError:
        part = rule_id.split(".", 1)[0]
        known = [r.id for r in RULES if r.part == part]
        raise KeyError(f"no builder rule {rule_id!r}; rules of part {part!r}: {known}") from None


def rules_of(part: str) -> list[Rule]:
    return [r for r in RULES if r.part == part]
