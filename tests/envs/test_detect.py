"""factory.envs detection and sources, without a sandbox: the rule table is complete, each layout
reads into the plan its rules say (backends, dependencies from every declared place, test runner and
arguments, lockfile pins), nothing is executed to read it, sources validate, unsafe sdists are refused,
and the mirror's index is idempotent. CPU only, no network, about a second."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest
from envs_fixtures import MIRROR, mirror_index, pyproject, sdist_only_mirror, write_repo
from pydantic import ValidationError

from factory.envs import detect as detect_module
from factory.envs.detect import detect
from factory.envs.environment import Runner
from factory.envs.mirror import mirror, write_index
from factory.envs.registry import RegistryConfig, has_only_sdists, project_files
from factory.envs.rules import RULES, rule
from factory.envs.sources import RepoSet, RepoSource, SourceError, fetch_source, unpack


def test_every_rule_has_a_detector_and_ids_are_unique():
    ids = [r.id for r in RULES]
    assert len(ids) == len(set(ids))
    implemented = {**detect_module._BACKEND, **detect_module._FIRST, **detect_module._TESTDEPS, **detect_module._RUNNER}
    missing = [r.id for r in RULES if r.part in ("backend", "python", "deps", "lock", "runner")
               and r.id not in implemented]
    missing += [r.id for r in RULES if r.part == "testdeps" and r.id not in detect_module.NOT_READ and r.id not in implemented]
    assert missing == []
    with pytest.raises(KeyError, match="rules of part 'backend'"):
        rule("backend.nonsense")


def test_setup_py_read_statically_never_run(tmp_path):
    marker = tmp_path / "ran"
    repo = write_repo(tmp_path / "r", {
        "setup.py": f"""
            import pathlib
            pathlib.Path({str(marker)!r}).write_text("setup.py ran")
            from setuptools import setup
            REQS = ["six>=1.10"]
            setup(name="demo", install_requires=REQS, tests_require=["mock"], python_requires=">=3.8",
                  extras_require={{"test": ["demo[fast]", "hypothesis"], "fast": ["ujson"]}})
        """,
        "tox.ini": "[testenv]\ndeps =\n    py311: freezegun\n    -rrequirements-test.txt\ncommands = pytest tests -x\n",
        "requirements-test.txt": "# pins\ncoverage==7.0  # comment\n-e .\n",
        "tests/test_x.py": "import pytest\n",
    })
    plan = detect(repo)
    assert not marker.exists()
    assert plan.backend == "setuptools.build_meta:__legacy__" and plan.rules["backend"] == "backend.setup-py"
    assert plan.requirements == ("six>=1.10",) and plan.python_requires == ">=3.8"
    assert set(plan.test_requirements) == {"hypothesis", "ujson", "mock", "coverage==7.0", "freezegun", "pytest"}
    assert plan.runner is Runner.PYTEST and plan.test_args == ("tests",) and plan.rules["runner"] == "runner.tox-ini-pytest"
    assert "testdeps.extras" in plan.rules["testdeps"] and "testdeps.tox" in plan.rules["testdeps"]


def test_poetry_project_with_lock_and_groups(tmp_path):
    repo = write_repo(tmp_path / "p", {
        "pyproject.toml": """
            [build-system]
            requires = ["poetry-core>=1.0"]
            build-backend = "poetry.core.masonry.api"

            [tool.poetry]
            name = "pp"
            version = "1.0"

            [tool.poetry.dependencies]
            python = "^3.9"
            attrs = "^23.1"
            local = { path = "../local" }

            [tool.poetry.group.test.dependencies]
            pytest-mock = "*"

            [tool.pytest.ini_options]
            testpaths = ["tests"]
            addopts = "--cov=pp -ra"
        """,
        "poetry.lock": '[[package]]\nname = "attrs"\nversion = "23.2.0"\n',
        "tests/test_p.py": "def test_p():\n    pass\n",
    })
    plan = detect(repo)
    assert plan.backend == "poetry.core.masonry.api" and plan.build_requires == ("poetry-core>=1.0",)
    assert plan.requirements == ("attrs>=23.1",) and plan.python_requires == ">=3.9"
    assert {"pytest-mock", "pytest-cov", "pytest"} <= set(plan.test_requirements)
    assert plan.constraints == ("attrs==23.2.0",) and plan.rules["lock"] == "lock.poetry"
    assert plan.runner is Runner.PYTEST and plan.test_args == () and plan.rules["runner"] == "runner.pyproject-pytest"


def test_setup_cfg_and_unittest_and_no_build_system(tmp_path):
    cfg = write_repo(tmp_path / "c", {
        "setup.cfg": "[metadata]\nname = cc\n[options]\ninstall_requires =\n    idna\npython_requires = >=3.7\n"
                     "[options.extras_require]\ntesting = pyfakefs\n",
        "tests/__init__.py": "",
        "tests/test_c.py": "import unittest\n\nclass T(unittest.TestCase):\n    def test_c(self):\n        pass\n",
    })
    plan = detect(cfg)
    assert plan.rules["backend"] == "backend.setup-cfg" and plan.install == "pth"
    assert plan.requirements == ("idna",) and "pyfakefs" in plan.test_requirements
    assert plan.runner is Runner.UNITTEST and plan.test_args == ("-s", "tests", "-t", ".")
    bare = detect(write_repo(tmp_path / "b", {"m.py": "", "test_m.py": "def test_m():\n    pass\n"}))
    assert bare.backend is None and bare.rules["backend"] == "backend.none"
    assert bare.runner is Runner.PYTEST and bare.test_args == ("test_m.py",)
    none = detect(write_repo(tmp_path / "n", {"pyproject.toml": pyproject("n")}))
    assert none.runner is None and none.rules["runner"] == "runner.none"


def test_repo_source_validation():
    assert RepoSource(name="six", sdist="six==1.16.0").kind == "sdist"
    with pytest.raises(ValidationError, match="exactly one of path, git, sdist"):
        RepoSource(name="x", path="/a", sdist="x==1")
    with pytest.raises(ValidationError, match="`rev` goes with `git`"):
        RepoSource(name="x", git="https://example.invalid/x.git")
    with pytest.raises(ValidationError, match="not 'name==version'"):
        RepoSource(name="x", sdist="x>=1")
    with pytest.raises(ValidationError, match="names repeat"):
        RepoSet(name="s", repos=(RepoSource(name="a", path="/a"), RepoSource(name="a", path="/b")))


def test_unsafe_sdist_members_are_refused(tmp_path):
    for member in ("../evil.py", "/etc/evil.py"):
        archive = tmp_path / "bad.tar.gz"
        with tarfile.open(archive, "w:gz") as tar:
            info = tarfile.TarInfo(member)
            tar.addfile(info, io.BytesIO(b""))
        with pytest.raises(SourceError, match="outside the unpacked tree"):
            unpack(archive, tmp_path / "out")
    assert not (tmp_path / "out").exists() and not (tmp_path.parent / "evil.py").exists()


def test_sdist_fetch_from_a_mirror_and_sdist_only_detection(tmp_path):
    index = sdist_only_mirror(tmp_path / "m")
    registry = RegistryConfig(index_url=index)
    fetched = fetch_source(RepoSource(name="tinysdist", sdist="tinysdist==0.1"), tmp_path / "src", registry)
    assert fetched.revision == "0.1" and fetched.origin == "source/sdist/tinysdist==0.1"
    assert (Path(fetched.src_dir) / "tinysdist.py").read_text() == "X = 1\n"
    assert has_only_sdists(registry, "tinysdist>=0.1") and not has_only_sdists(registry, "absent")
    with pytest.raises(SourceError, match="no sdist file"):
        fetch_source(RepoSource(name="t", sdist="tinysdist==9.9"), tmp_path / "src2", registry)


def test_local_revision_is_a_tree_digest(tmp_path):
    repo = write_repo(tmp_path / "r", {"a.py": "A = 1\n", "__pycache__/a.cpython-311.pyc": "x"})
    first = fetch_source(RepoSource(name="r", path=str(repo)), tmp_path / "one")
    (repo / "__pycache__" / "a.cpython-311.pyc").write_text("changed")  # caches do not count
    assert fetch_source(RepoSource(name="r", path=str(repo)), tmp_path / "two").revision == first.revision
    (repo / "a.py").write_text("A = 2\n")
    assert fetch_source(RepoSource(name="r", path=str(repo)), tmp_path / "three").revision != first.revision


def test_mirror_from_the_test_mirror_is_idempotent(tmp_path):
    registry = RegistryConfig(index_url=mirror_index())
    report = mirror(None, tmp_path / "m", registry, tools=("pytest",))
    assert report.failures == {} and report.projects >= 4  # pytest, pluggy, iniconfig, packaging, ...
    files = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "m" / "files").iterdir()}
    again = mirror(None, tmp_path / "m", registry, tools=("pytest",))
    assert again.files == report.files
    assert {p.name: p.stat().st_mtime_ns for p in (tmp_path / "m" / "files").iterdir()} == files
    pytest_files = project_files((tmp_path / "m" / "simple").as_uri(), "pytest")
    assert pytest_files and all(f.sha256 and f.filename.endswith(".whl") for f in pytest_files)
    assert write_index(tmp_path / "m") == report.projects
    assert MIRROR.exists()


def test_lint_plugins_are_dropped_with_their_flags(tmp_path):
    repo = write_repo(tmp_path / "l", {
        "pyproject.toml": pyproject("ll", extra='[project.optional-dependencies]\ntest = ["pytest-black", "pytest-mypy", '
                                               '"jaraco.itertools"]\n'),
        "pytest.ini": "[pytest]\naddopts = --doctest-modules --black --mypy\n",
        "tests/test_l.py": "def test_l():\n    pass\n",
    })
    plan = detect(repo)
    assert plan.test_requirements == ("jaraco.itertools", "pytest")
    assert plan.test_options == ("-o", "addopts=--doctest-modules", "-p", "no:enabler")
    assert "testdeps.skip-linters" in plan.rules["testdeps"]


def test_git_source_is_checked_out_at_its_revision(tmp_path):
    import subprocess

    repo = write_repo(tmp_path / "g", {"m.py": "V = 1\n"})

    def git(*args):
        return subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args],
                              capture_output=True, text=True, check=True).stdout.strip()

    git("init", "-q")
    git("add", ".")
    git("commit", "-qm", "one")
    first = git("rev-parse", "HEAD")
    (repo / "m.py").write_text("V = 2\n")
    git("commit", "-qam", "two")
    fetched = fetch_source(RepoSource(name="g", git=repo.as_uri(), rev=first), tmp_path / "src")
    assert fetched.revision == first and fetched.origin == f"{repo.as_uri()}@{first}"
    assert (Path(fetched.src_dir) / "m.py").read_text() == "V = 1\n" and not (Path(fetched.src_dir) / ".git").exists()
    with pytest.raises(SourceError, match="git checkout failed"):
        fetch_source(RepoSource(name="g", git=repo.as_uri(), rev="no-such-rev"), tmp_path / "src2")
