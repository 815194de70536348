"""Reading a repository into a `BuildPlan`, statically: one function per rule of `rules.RULES`.

Nothing here runs repository code: pyproject/setup.cfg/tox.ini are parsed as TOML/INI, setup.py
and noxfile.py as ASTs (readers.py: only literal values, or names bound to literals at module
level, are read; a computed install_requires yields nothing rather than an exec). Rules are tried in table order per
part; `plan.rules` records the deciding rule of each part.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from pydantic import BaseModel, ConfigDict, Field

from factory.envs.environment import Runner
from factory.envs.readers import ini as _ini
from factory.envs.readers import lines as _lines
from factory.envs.readers import parse_ast as _ast
from factory.envs.readers import requirements_file as _requirements_file
from factory.envs.readers import setup_call as _setup_call
from factory.envs.readers import str_list as _str_list
from factory.envs.readers import toml as _toml
from factory.envs.registry import normalize
from factory.envs.rules import rules_of

TEST_EXTRAS = ("test", "tests", "testing", "dev")
PLUGIN_FLAGS = {"--cov": "pytest-cov", "-n": "pytest-xdist", "--numprocesses": "pytest-xdist", "--timeout": "pytest-timeout",
                "--benchmark": "pytest-benchmark", "--mypy": "pytest-mypy", "--flake8": "pytest-flake8",
                "--doctest-plus": "pytest-doctestplus", "--asyncio-mode": "pytest-asyncio", "--reruns": "pytest-rerunfailures"}
LEGACY_BACKEND = "setuptools.build_meta:__legacy__"
# what a backend's get_requires_for_build_editable adds, which --no-build-isolation does not ask for
EDITABLE_REQUIRES = {"hatchling.build": ["editables"]}
# pytest plugins that lint, type-check or format instead of testing: dropped from test requirements
# (rule testdeps.skip-linters) with their addopts flags, since they break more runs than they check
LINTERS = {"pytest-black": "--black", "pytest-ruff": "--ruff", "pytest-mypy": "--mypy", "pytest-flake8": "--flake8",
           "pytest-isort": "--isort", "pytest-pylint": "--pylint", "pytest-checkdocs": "", "pytest-enabler": "",
           "pytest-pycodestyle": "--pycodestyle", "pytest-pydocstyle": "--pydocstyle", "pytest-mccabe": "--mccabe"}
VALUE_OPTIONS = {"--ignore", "--ignore-glob", "--deselect", "-k", "-m", "-p", "-c", "-o", "-W", "--basetemp", "--rootdir",
                 "--cov", "--cov-report", "--cov-config", "-n", "--numprocesses", "--junitxml", "--tb", "--durations",
                 "--confcutdir", "--maxfail", "--log-level", "--timeout", "--reruns", "--import-mode"}
NOT_READ = ("testdeps.runner", "testdeps.skip-linters", "testdeps.drop-missing", "testdeps.unpinned", "testdeps.minimal")


class BuildPlan(BaseModel):
    """How to build and test one repository (what the heuristic builder, or an agent, decided)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    backend: str | None = Field(description="PEP 517 backend (e.g. 'hatchling.build'); None = no build system.")
    build_requires: tuple[str, ...] = Field((), description="The backend's requirements ([build-system] requires).")
    requirements: tuple[str, ...] = Field((), description="Runtime dependencies (PEP 508).")
    test_requirements: tuple[str, ...] = Field((), description="Test dependencies (PEP 508), pytest included.")
    constraints: tuple[str, ...] = Field((), description="'name==version' pins from a lockfile.")
    python_requires: str | None = Field(None, description="The project's Requires-Python specifier.")
    runner: Runner | None = Field(None, description="Test runner; None = no tests found.")
    test_args: tuple[str, ...] = Field((), description="Runner arguments (pytest paths, or unittest discovery).")
    test_options: tuple[str, ...] = Field((), description="Runner options on every run (e.g. an addopts override).")
    install: str = Field("editable", description="'editable' (pip -e) or 'pth' (a .pth file).")
    rules: dict[str, str] = Field(default_factory=dict, description="Plan part -> id of the rule that decided it.")

    @property
    def rule(self) -> str:
        return self.rules.get("backend", "")


class _Repo:
    """Parsed files of a repository, read once each (a missing or unparsable file reads as empty)."""

    def __init__(self, root: Path):
        self.root = root
        self.pyproject = _toml(root / "pyproject.toml")
        self.project = self.pyproject.get("project", {})
        self.poetry = self.pyproject.get("tool", {}).get("poetry", {})
        self.cfg = _ini(root / "setup.cfg")
        self.tox = _ini(root / "tox.ini")
        self.setup = _setup_call(root / "setup.py")
        self.name = normalize(str(self.project.get("name") or self.poetry.get("name") or self.setup.get("name")
                                  or _cfg(self.cfg, "metadata", "name") or root.name))


def detect(root: Path) -> BuildPlan:
    """The build plan of the repository at `root` (see the module docstring)."""
    repo = _Repo(Path(root))
    rules: dict[str, str] = {}
    backend, build_requires = None, []
    for r in rules_of("backend"):
        found = _BACKEND[r.id](repo)
        if found is not None:
            (backend, build_requires), rules["backend"] = found, r.id
            break
    python = _first(repo, "python", rules)
    requirements = _first(repo, "deps", rules) or []
    tests: list[str] = []
    used = []
    for r in rules_of("testdeps"):
        if r.id in NOT_READ:  # the runner's own, and the fallbacks (builder.py)
            continue
        found = _TESTDEPS[r.id](repo)
        if found:
            tests += found
            used.append(r.id)
    constraints = _first(repo, "lock", rules) or []
    runner, args = None, []
    for r in rules_of("runner"):
        found = _RUNNER[r.id](repo)
        if found is not None:
            (runner, args), rules["runner"] = found, r.id
            break
    kept = [r for r in tests if normalize(re.split(r"[\s<>=!~;\[(@]", r.strip(), maxsplit=1)[0]) not in LINTERS]
    options: list[str] = []
    if len(kept) != len(tests):
        tests = kept
        used.append("testdeps.skip-linters")
        addopts = (_pytest_ini(repo) or {}).get("addopts", [])
        flags = tuple(f for f in LINTERS.values() if f)
        clean = [a for a in addopts if not any(a == f or a.startswith(f + "=") or a.startswith(f + "-") for f in flags)]
        options = ["-o", "addopts=" + " ".join(clean), "-p", "no:enabler"] if clean != addopts or addopts else ["-p", "no:enabler"]
    rules.setdefault("backend", "backend.none")
    rules.setdefault("runner", "runner.none")
    tests.append("pytest")
    rules["testdeps"] = ",".join(used + ["testdeps.runner"])
    install = "pth" if rules.get("backend") == "backend.setup-cfg" else "editable"
    rules["install"] = f"install.{install}"
    return BuildPlan(backend=backend, build_requires=tuple(build_requires),
                     requirements=tuple(_dedupe(_drop_self(repo, requirements))),
                     test_requirements=tuple(_dedupe(_drop_self(repo, tests))), constraints=tuple(constraints),
                     python_requires=python, runner=runner, test_args=tuple(args),
                     test_options=tuple(options) if runner is Runner.PYTEST else (), install=install, rules=rules)


def _first(repo: _Repo, part: str, rules: dict[str, str]):
    for r in rules_of(part):
        found = _FIRST[r.id](repo)
        if found:
            rules[part] = r.id
            return found
    return None


# -- backend ------------------------------------------------------------------------------------------
def _backend_pyproject(repo):
    system = repo.pyproject.get("build-system", {})
    backend = system.get("build-backend")
    return (backend, list(system.get("requires", [])) + EDITABLE_REQUIRES.get(backend, [])) if backend else None


def _backend_requires(repo):
    system = repo.pyproject.get("build-system", {})
    return (LEGACY_BACKEND, list(system["requires"])) if system.get("requires") else None


def _backend_setup_py(repo):
    return (LEGACY_BACKEND, ["setuptools", "wheel"]) if (repo.root / "setup.py").is_file() else None


def _backend_setup_cfg(repo):
    return ("setuptools.build_meta", ["setuptools", "wheel"]) if repo.cfg.has_section("metadata") else None


_BACKEND = {"backend.pyproject": _backend_pyproject, "backend.pyproject-requires": _backend_requires,
            "backend.setup-py": _backend_setup_py, "backend.setup-cfg": _backend_setup_cfg,
            "backend.none": lambda repo: None}


# -- python, deps, lock ---------------------------------------------------------------------------------
def _poetry_deps(repo, table) -> list[str]:
    out = []
    for name, spec in (table or {}).items():
        if name.lower() == "python":
            continue
        if isinstance(spec, list):  # several constraints by python version: let the resolver choose
            out.append(name)
            continue
        if isinstance(spec, dict):
            if spec.get("optional") or "path" in spec or "git" in spec or "url" in spec:
                continue
            spec = spec.get("version", "*")
        out.append(name + _poetry_version(str(spec)))
    return out


def _poetry_version(spec: str) -> str:
    spec = spec.strip()
    if spec in ("*", ""):
        return ""
    if spec[0] in "^~" and spec[1:2] != "=":
        return f">={spec[1:].strip()}"  # a floor: the resolver picks the newest the index has
    if spec[0].isdigit():
        return f"=={spec}"
    return spec


def _lock_toml(name):
    def read(repo):
        pins = []
        for p in _toml(repo.root / name).get("package", []):
            source = p.get("source")
            from_index = source is None or (isinstance(source, dict) and "registry" in source)
            if "name" in p and "version" in p and from_index and normalize(p["name"]) != repo.name:
                pins.append(f"{normalize(p['name'])}=={p['version']}")
        return pins or None
    return read


def _lock_pip_tools(repo):
    for path in sorted(repo.root.glob("requirements*.txt")):
        text = path.read_text(errors="replace")
        if "pip-compile" in text[:2000]:
            return [r for r in _requirements_file(path, repo.root) if "==" in r] or None
    return None


_FIRST = {
    "python.pyproject": lambda repo: repo.project.get("requires-python"),
    "python.poetry": lambda repo: _poetry_python(repo.poetry.get("dependencies", {}).get("python")),
    "python.setup-py": lambda repo: repo.setup.get("python_requires"),
    "python.setup-cfg": lambda repo: _cfg(repo.cfg, "options", "python_requires"),
    "deps.pyproject": lambda repo: list(repo.project.get("dependencies", [])) or None,
    "deps.poetry": lambda repo: _poetry_deps(repo, repo.poetry.get("dependencies")) or None,
    "deps.setup-py": lambda repo: _str_list(repo.setup.get("install_requires")) or None,
    "deps.setup-cfg": lambda repo: _cfg_list(repo, "options", "install_requires") or None,
    "deps.requirements-txt": lambda repo: _req_files(repo, ["requirements.txt", "requirements/base.txt",
                                                             "requirements/main.txt", "requirements/prod.txt"]) or None,
    "lock.poetry": _lock_toml("poetry.lock"),
    "lock.uv": _lock_toml("uv.lock"),
    "lock.pip-tools": _lock_pip_tools,
}


def _poetry_python(spec):
    if not spec or not isinstance(spec, str):
        return None
    return _poetry_version(spec) or None


# -- test dependencies ------------------------------------------------------------------------------
def _extras(repo) -> dict[str, list[str]]:
    extras = {k: list(v) for k, v in repo.project.get("optional-dependencies", {}).items()}
    raw = repo.setup.get("extras_require")
    if isinstance(raw, dict):
        extras.update({str(k): _str_list(v) for k, v in raw.items()})
    if repo.cfg.has_section("options.extras_require"):
        raw_cfg = dict(repo.cfg["options.extras_require"].items())
        expand = lambda v: re.sub(r"%\(([^)]+)\)s", lambda m: raw_cfg.get(m[1], ""), v)  # setuptools interpolates
        extras.update({k: _lines(expand(expand(v))) for k, v in raw_cfg.items()})
    return {normalize(k.split(":")[0]): v for k, v in extras.items()}


def _test_names(available) -> tuple[str, ...]:
    """test/tests/testing when any is declared; `dev` (often docs and tooling too) only otherwise."""
    specific = tuple(n for n in TEST_EXTRAS[:-1] if n in available)
    return specific or ("dev",)


def _testdeps_extras(repo):
    extras = _extras(repo)
    return [r for name in _test_names(extras) for r in extras.get(name, [])]


def _testdeps_groups(repo):
    groups = dict(repo.pyproject.get("dependency-groups", {}))
    groups.update(repo.pyproject.get("tool", {}).get("pdm", {}).get("dev-dependencies", {}))
    names = _test_names({**groups, **repo.poetry.get("group", {})})
    out = [r for name in names for r in groups.get(name, []) if isinstance(r, str)]
    for name in names:
        group = repo.poetry.get("group", {}).get(name, {}).get("dependencies")
        out += _poetry_deps(repo, group)
    out += _poetry_deps(repo, repo.poetry.get("dev-dependencies"))
    return out


def _testdeps_tox(repo):
    if not repo.tox.has_section("testenv"):
        return []
    out = []
    for line in _lines(repo.tox["testenv"].get("deps", "")):
        line = re.sub(r"^[\w,{}.-]+:\s*", "", line)  # "py311: foo" -> "foo"
        if line.startswith("-r"):
            out += _requirements_file(repo.root / line[2:].strip().replace("{toxinidir}/", ""), repo.root)
        elif not line.startswith(("{", "-", ".")):
            out.append(line)
    return out


def _testdeps_nox(repo):
    tree = _ast(repo.root / "noxfile.py")
    out = []
    for node in ast.walk(tree) if tree else ():
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "install":
            args = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
            for i, a in enumerate(args):
                if a == "-r" and i + 1 < len(args):
                    out += _requirements_file(repo.root / args[i + 1], repo.root)
                elif not a.startswith(("-", ".")) and (i == 0 or args[i - 1] != "-r"):
                    out.append(a)
    return out


def _testdeps_addopts(repo):
    text = " ".join(str(v) for v in (_pytest_ini(repo) or {}).get("addopts", []))
    return sorted({plugin for flag, plugin in PLUGIN_FLAGS.items() if re.search(rf"(^|\s){re.escape(flag)}(=|\s|$)", text)})


def _first_file(repo, names) -> list[str]:
    """The one file to read of several variants (tests.txt over tests-py37.txt: shortest name first), as a list:
    variants are usually compiled for different Pythons, and their pins conflict."""
    present = sorted((n for n in dict.fromkeys(names) if (repo.root / n).is_file()), key=lambda n: (len(n), n))
    return present[:1]


def addopts_plugins(root: Path) -> list[str]:
    """The pytest plugins the repository's addopts need (rule testdeps.addopts-plugins)."""
    return _testdeps_addopts(_Repo(Path(root)))


_TESTDEPS = {
    "testdeps.extras": _testdeps_extras, "testdeps.groups": _testdeps_groups,
    "testdeps.tests-require": lambda repo: _str_list(repo.setup.get("tests_require")) + _cfg_list(repo, "options", "tests_require"),
    "testdeps.requirements-test": lambda repo: _req_files(repo, _first_file(repo, [
        *(p.name for p in repo.root.glob("requirements-test*.txt")), "test-requirements.txt", "requirements_test.txt",
        *("requirements/" + p.name for p in repo.root.glob("requirements/test*.txt"))]) or _first_file(
        repo, ["requirements-dev.txt", "dev-requirements.txt", "requirements/dev.txt"])),  # dev: only without test files
    "testdeps.tox": _testdeps_tox, "testdeps.nox": _testdeps_nox, "testdeps.addopts-plugins": _testdeps_addopts,
}


# -- runner ---------------------------------------------------------------------------------------------
def _pytest_ini(repo) -> dict | None:
    """The pytest configuration (values as lists of strings), from whichever file pytest would read."""
    ini = _ini(repo.root / "pytest.ini")
    if ini.has_section("pytest"):
        return {k: v.split() for k, v in ini["pytest"].items()}
    if "ini_options" in repo.pyproject.get("tool", {}).get("pytest", {}):
        opts = repo.pyproject["tool"]["pytest"]["ini_options"]
        return {k: (v if isinstance(v, list) else str(v).split()) for k, v in opts.items()}
    for cfg, section in ((repo.tox, "pytest"), (repo.cfg, "tool:pytest")):
        if cfg.has_section(section):
            return {k: v.split() for k, v in cfg[section].items()}
    return None


def _runner_pytest_config(source: str, section: str):
    def read(repo):
        holder = {"pyproject": lambda: "ini_options" in repo.pyproject.get("tool", {}).get("pytest", {}),
                  "pytest.ini": lambda: _ini(repo.root / "pytest.ini").has_section("pytest"),
                  "setup.cfg": lambda: repo.cfg.has_section(section), "tox.ini": lambda: repo.tox.has_section(section)}
        if not holder[source]():
            return None
        return Runner.PYTEST, [] if (_pytest_ini(repo) or {}).get("testpaths") else _test_dirs(repo)[:1]
    return read


def _runner_tox_commands(repo):
    commands = repo.tox["testenv"].get("commands", "") if repo.tox.has_section("testenv") else ""
    for line in _lines(commands):
        words = re.sub(r"^[\w,{}.-]+:\s*", "", line).split()
        if words[:1] in (["pytest"], ["py.test"]) or words[:3] == ["python", "-m", "pytest"]:
            paths, skip = [], False
            for w in words[1:]:
                if skip or w.startswith("{"):
                    skip = False
                elif w.startswith("-"):
                    skip = w in VALUE_OPTIONS  # "--ignore benchmark": benchmark is the option's, not a path
                elif (repo.root / w.split("::")[0]).exists():
                    paths.append(w)
            return Runner.PYTEST, paths or _test_dirs(repo)[:1]
    return None


def _runner_unittest(repo):
    if _pytest_ini(repo) is not None:
        return None
    dirs = _test_dirs(repo)
    files = [f for d in dirs for f in (repo.root / d).rglob("test*.py")] or [repo.root / f for f in _test_files(repo)]
    texts = [f.read_text(errors="replace") for f in files]
    if not texts or any(re.search(r"^\s*(import pytest|from pytest|@pytest)", t, re.M) for t in texts):
        return None
    if not all("unittest" in t or "TestCase" in t for t in texts):
        return None
    start = dirs[0] if dirs else str(files[0].parent.relative_to(repo.root))
    # a tests package is imported from the top (-t .); a plain directory of test files from itself
    return Runner.UNITTEST, ["-s", start, "-t", "."] if (repo.root / start / "__init__.py").exists() else ["-s", start]


def _test_files(repo) -> list[str]:
    """Test modules outside any test directory: test_*.py / *_test.py at the top or in src/."""
    return sorted(str(p.relative_to(repo.root)) for pattern in ("test_*.py", "*_test.py", "tests.py", "test.py",
                                                                "src/test_*.py") for p in repo.root.glob(pattern))


def _test_dirs(repo) -> list[str]:
    """Test directories: top-level ones first, then ones inside a package (pkg/tests, src/pkg/tests)."""
    top = [d for d in ("tests", "test", "testing", "src/tests", "src/test") if (repo.root / d).is_dir()]
    nested = sorted(str(p.relative_to(repo.root)) for pattern in ("*/tests", "*/test", "src/*/tests", "src/*/test")
                    for p in repo.root.glob(pattern) if p.is_dir() and (p.parent / "__init__.py").exists())
    return top + nested


_RUNNER = {
    "runner.unittest-only": _runner_unittest,
    "runner.pyproject-pytest": _runner_pytest_config("pyproject", ""),
    "runner.pytest-ini": _runner_pytest_config("pytest.ini", "pytest"),
    "runner.setup-cfg-pytest": _runner_pytest_config("setup.cfg", "tool:pytest"),
    "runner.tox-ini-pytest": lambda repo: _runner_pytest_config("tox.ini", "pytest")(repo) or _runner_tox_commands(repo),
    "runner.tests-dir": lambda repo: (Runner.PYTEST, _test_dirs(repo)[:1]) if _test_dirs(repo) else None,
    "runner.test-files": lambda repo: (Runner.PYTEST, _test_files(repo)) if _test_files(repo) else None,
    "runner.none": lambda repo: None,
}


# -- small helpers -------------------------------------------------------------------------------------
def _cfg(cfg, section, key):
    return cfg[section].get(key) if cfg.has_section(section) else None


def _cfg_list(repo, section, key) -> list[str]:
    value = _cfg(repo.cfg, section, key) or ""
    if value.strip().startswith("file:"):
        return [r for f in value.split(":", 1)[1].split(",") for r in _requirements_file(repo.root / f.strip(), repo.root)]
    return _lines(value)


def _req_files(repo, names) -> list[str]:
    return [r for name in dict.fromkeys(names) for r in _requirements_file(repo.root / name, repo.root)]


def _drop_self(repo, reqs: list[str]) -> list[str]:
    """Requirements without the project itself; `name[extra]` self-references become those extras' lists."""
    extras = _extras(repo)
    out, seen = [], set()
    queue = list(reqs)
    while queue:
        req = queue.pop(0)
        match = re.match(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(\[([^\]]*)\])?", req)
        if match and normalize(match[1]) == repo.name:
            for extra in (match[3] or "").split(","):
                if extra.strip() and normalize(extra.strip()) not in seen:
                    seen.add(normalize(extra.strip()))
                    queue += extras.get(normalize(extra.strip()), [])
            continue
        out.append(req)
    return out


def _dedupe(reqs: list[str]) -> list[str]:
    """Valid PEP 508 requirements, each once; direct URLs (git+, file) are dropped: only an index has wheels."""
    out = []
    for req in dict.fromkeys(r.strip() for r in reqs if r.strip()):
        try:
            parsed = Requirement(req)
        except InvalidRequirement:
            continue
        if parsed.url is None:
            out.append(req)
    return out
