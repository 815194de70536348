"""The shipped repository corpus: 51 real pure-Python PyPI projects whose sdists carry their tests.

`corpus()` is every project below as a pinned sdist source (`name==version`); `demo()` is four of
the smallest and quickest, one per build backend, which `make demo` builds and the tests build from
a local mirror (`factory envs mirror --repos demo`).

How they were chosen (2026-12-01): each sdist was fetched through the index's PEP 691 JSON page,
its sha256 checked, and its file list read: tests inside, no C/Cython/Rust sources and no
`ext_modules`. They vary in what the builder's rules must detect: the build backend (setup.py
without pyproject, setup.cfg behind a `[build-system]`-only pyproject, pyproject setuptools,
flit_core, flit_scm, hatchling, poetry-core, pdm-backend), where test dependencies are declared
(extras, PEP 735 dependency groups, Poetry groups, requirements/test*.txt, tox deps, setup.py
tests_require, nowhere), the test runner (pytest config, unittest-only, tox commands) and the layout
(src/, a flat package, a single module, tests inside the package). Suites are small: most run in
under 2 s bare, the slowest (more-itertools, asgiref) in about 20 s.

Not all are expected to pass, on purpose: a real corpus has repositories that fail for known
reasons, and each must land in the right failure class. `expect` is what each should come to and
`note` says why; `bench/envs_bench.py` prints expected against actual, so a mismatch points either
at a builder rule or at this table. Bare results ("bare: …") are the suite run with pytest in a
scratch venv holding its declared test dependencies, outside any sandbox.

| name | version | backend | runner | layout |
| --- | --- | --- | --- | --- |
| six | 1.17.0 | setuptools (setup.py) | pytest | module |
| toml | 0.10.2 | setuptools (setup.py) | pytest | flat |
| text-unidecode | 1.3 | setuptools (setup.py) | pytest | src |
| pytz | 2026.6 | setuptools (setup.py) | unittest | flat, tests in package |
| jmespath | 1.1.0 | setuptools (setup.py) | pytest | flat |
| mccabe | 0.7.0 | setuptools (setup.py) | pytest | module |
| pyflakes | 4.1.0 | setuptools (setup.py) | unittest | flat, tests in package |
| pycodestyle | 2.15.0 | setuptools (setup.py) | pytest | module |
| inflection | 0.5.1 | setuptools (setup.py) | pytest | flat |
| first | 2.0.2 | setuptools (setup.py) | pytest (tox) | module |
| asgiref | 3.13.0 | setuptools (setup.py) | pytest | flat |
| num2words | 0.5.14 | setuptools (setup.py) | unittest | flat |
| python-whois | 0.9.6 | setuptools (setup.py) | unittest | flat |
| ply | 3.11 | setuptools (setup.py) | unittest (scripts) | flat |
| configobj | 5.0.9 | setuptools (setup.py) | pytest | src |
| python-dateutil | 2.9.0.post0 | setuptools (setup.py) | pytest | src |
| zipp | 3.17.0 | setuptools (setup.cfg) | pytest | flat |
| path | 16.6.0 | setuptools (setup.cfg) | pytest | flat |
| cachetools | 5.5.2 | setuptools (setup.cfg) | pytest (tox) | src |
| geopy | 2.5.0 | setuptools (setup.cfg) | pytest | flat |
| pluggy | 1.7.0 | setuptools (pyproject) | pytest | src |
| iniconfig | 2.3.1 | setuptools (pyproject) | pytest | src |
| toolz | 1.2.0 | setuptools (pyproject) | pytest | flat, tests in package |
| decorator | 5.3.1 | setuptools (pyproject) | unittest | src |
| tabulate | 0.10.0 | setuptools (pyproject) | pytest (tox) | flat |
| distro | 1.9.0 | setuptools (pyproject) | pytest | src |
| parse | 1.22.4 | setuptools (pyproject) | pytest | flat |
| xmltodict | 1.0.4 | setuptools (pyproject) | pytest | module |
| python-slugify | 9.2.0 | setuptools (pyproject) | pytest | flat |
| jsonpointer | 3.12 | setuptools (pyproject) | unittest | module |
| feedparser | 6.0.14 | setuptools (pyproject) | unittest (script) | flat |
| idna | 3.20 | flit_core | pytest | flat |
| more-itertools | 11.2.1 | flit_core | unittest (tox) | flat |
| click | 8.5.1 | flit_core | pytest | src |
| jinja2 | 3.1.6 | flit_core | pytest | src |
| itsdangerous | 2.2.0 | flit_core | pytest | src |
| blinker | 1.9.0 | flit_core | pytest | src |
| pathspec | 1.1.1 | flit_core | pytest | flat |
| typing-extensions | 4.16.0 | flit_core | unittest (tox) | src, module |
| exceptiongroup | 1.3.2 | flit_scm | pytest | src |
| termcolor | 3.3.0 | hatchling | pytest | src |
| humanize | 4.17.0 | hatchling | pytest | src |
| colorama | 0.4.6 | hatchling | unittest | flat, tests in package |
| platformdirs | 4.14.9 | hatchling | pytest | src |
| sqlparse | 0.6.1 | hatchling | pytest | flat |
| tomlkit | 0.15.2 | poetry-core | pytest | flat |
| pastel | 0.2.1 | poetry-core | pytest | flat |
| cleo | 2.1.0 | poetry-core | pytest | src |
| feedparser-sgmllib | 2.1.0 | poetry-core | pytest | src |
| dep-logic | 0.7.2 | pdm-backend | pytest | src |
| findpython | 0.9.0 | pdm-backend | pytest | src |
"""

from __future__ import annotations

from typing import NamedTuple

from factory.envs.outcomes import FailureClass
from factory.envs.sources import RepoSet, RepoSource


class Entry(NamedTuple):
    """One corpus project: what it is, and what building it should come to."""

    name: str
    version: str
    backend: str
    runner: str
    layout: str
    expect: FailureClass
    note: str


E = Entry
F = FailureClass
PASSED, COLLECT, NETWORK = F.PASSED, F.TEST_COLLECTION_ERROR, F.TESTS_NEED_NETWORK
NO_WHEEL, RESOLUTION = F.NO_WHEEL, F.RESOLUTION_FAILED
SETUP_PY, SETUP_CFG, PYPROJECT = "setuptools (setup.py)", "setuptools (setup.cfg)", "setuptools (pyproject)"

ENTRIES: tuple[Entry, ...] = (
    E("six", "1.17.0", SETUP_PY, "pytest", "module", PASSED,
      "tests_require=['pytest'] only; bare: 198 passed, 2 skipped in 0.3 s"),
    E("toml", "0.10.2", SETUP_PY, "pytest", "flat", PASSED,
      "tests need the toml-test data dir, not in the sdist: bare 19 passed, 2 failed"),
    E("text-unidecode", "1.3", SETUP_PY, "pytest", "src", PASSED,
      "root test_unidecode.py, no test deps declared; bare: 133 passed"),
    E("pytz", "2026.6", SETUP_PY, "unittest", "flat, tests in package", PASSED,
      "unittest TestCases in pytz/tests, no runner config; bare: 237 passed"),
    E("jmespath", "1.1.0", SETUP_PY, "pytest", "flat", COLLECT,
      "sdist lacks tests/__init__.py, so `from tests import unittest` fails in every module"),
    E("mccabe", "0.7.0", SETUP_PY, "pytest", "module", COLLECT,
      "test_mccabe.py needs hypothesis+hypothesmith, declared nowhere (NameError: settings)"),
    E("pyflakes", "4.1.0", SETUP_PY, "unittest", "flat, tests in package", PASSED,
      "no runner config, no test deps; bare: 759 passed, 37 skipped"),
    E("pycodestyle", "2.15.0", SETUP_PY, "pytest", "module", COLLECT,
      "tests import a `testing` package the sdist does not ship"),
    E("inflection", "0.5.1", SETUP_PY, "pytest", "flat", PASSED, "root test_inflection.py; bare: 455 passed"),
    E("first", "2.0.2", SETUP_PY, "pytest (tox)", "module", PASSED,
      "tox: pytest --doctest-glob='*.rst' --doctest-modules; bare: 3 passed"),
    E("asgiref", "3.13.0", SETUP_PY, "pytest", "flat", PASSED,
      "setup.cfg extras `tests` (pytest-asyncio); bare: 122 passed in 13 s"),
    E("num2words", "0.5.14", SETUP_PY, "unittest", "flat", NO_WHEEL,
      "install_requires docopt, which exists only as an sdist"),
    E("python-whois", "0.9.6", SETUP_PY, "unittest", "flat", NETWORK,
      "test_query.py runs real whois lookups (google.com, an IPv4 address)"),
    E("ply", "3.11", SETUP_PY, "unittest (scripts)", "flat", COLLECT,
      "tests are test/testlex.py, testyacc.py: no file matches test_*.py, and they expect cwd=test/"),
    E("configobj", "5.0.9", SETUP_PY, "pytest", "src", PASSED,
      "setup.py computes its version by reading a file (not a literal); bare: 75 passed"),
    E("python-dateutil", "2.9.0.post0", SETUP_PY, "pytest", "src", COLLECT,
      "rot: filterwarnings=error, and today's pytest warns (PytestRemovedIn10Warning) in every parametrize"),
    E("zipp", "3.17.0", SETUP_CFG, "pytest", "flat", PASSED,
      "jaraco skeleton: setup.cfg extras `testing`, pytest-enabler turns on checkdocs/ruff/mypy/black plugins"),
    E("path", "16.6.0", SETUP_CFG, "pytest", "flat", PASSED,
      "jaraco skeleton, root test_path.py; bare: 117 passed, 8 skipped in 4.6 s"),
    E("cachetools", "5.5.2", SETUP_CFG, "pytest (tox)", "src", PASSED,
      "setup.py is a bare setup(); tox: py.test --cov (pytest-cov only in tox); bare: 216 passed"),
    E("geopy", "2.5.0", SETUP_CFG, "pytest", "flat", NETWORK,
      "geocoder tests call live services unless --skip-tests-requiring-internet; test deps in extra `dev-test`"),
    E("pluggy", "1.7.0", PYPROJECT, "pytest", "src", PASSED,
      "tests in testing/, dependency group `testing` (pytest-benchmark)"),
    E("iniconfig", "2.3.1", PYPROJECT, "pytest", "src", PASSED, "testpaths=testing, setuptools-scm; bare: 54 passed"),
    E("toolz", "1.2.0", PYPROJECT, "pytest", "flat, tests in package", PASSED,
      "testpaths=toolz, filterwarnings=error, setuptools-git-versioning; bare: 192 passed"),
    E("decorator", "5.3.1", PYPROJECT, "unittest", "src", PASSED,
      "tests/test.py matches no default pattern (pytest: test_*.py); the builder still runs its 25 tests"),
    E("tabulate", "0.10.0", PYPROJECT, "pytest (tox)", "flat", PASSED,
      "tests in test/ (singular); numpy/pandas tests skip without them; bare: 280 passed"),
    E("distro", "1.9.0", PYPROJECT, "pytest", "src", PASSED,
      "dev-requirements.txt; tests read fixture os-release trees; bare: 234 passed"),
    E("parse", "1.22.4", PYPROJECT, "pytest", "flat", PASSED,
      "addopts has --cov, pytest-cov declared nowhere (the builder adds it: rule testdeps.addopts)"),
    E("xmltodict", "1.0.4", PYPROJECT, "pytest", "module", PASSED, "extra `test`; bare: 119 passed"),
    E("python-slugify", "9.2.0", PYPROJECT, "pytest", "flat", PASSED,
      "depends on text-unidecode; filterwarnings=error; bare: 140 passed"),
    E("jsonpointer", "3.12", PYPROJECT, "unittest", "module", PASSED,
      "single root tests.py (unittest); pytest's default pattern misses it"),
    E("feedparser", "6.0.14", PYPROJECT, "unittest (script)", "flat", COLLECT,
      "suite is tests/runtests.py (custom unittest loader, serves feeds from 127.0.0.1); no test_*.py"),
    E("idna", "3.20", "flit_core", "pytest", "flat", PASSED,
      "2 collection errors: a fuzz test imports hypothesis, only in the extra `all`; 6424 others pass"),
    E("more-itertools", "11.2.1", "flit_core", "unittest (tox)", "flat", PASSED,
      "tox: python -m unittest; bare: 765 passed, 21194 subtests in 19 s"),
    E("click", "8.5.1", "flit_core", "pytest", "src", PASSED,
      "dependency group `tests`; needs its own installed metadata (editable install)"),
    E("jinja2", "3.1.6", "flit_core", "pytest", "src", PASSED,
      "MarkupSafe is a wheel with C code; trio only in requirements/tests.txt"),
    E("itsdangerous", "2.2.0", "flit_core", "pytest", "src", PASSED,
      "freezegun only in requirements/tests.txt (pip-compiled); bare: 297 passed"),
    E("blinker", "1.9.0", "flit_core", "pytest", "src", PASSED,
      "asyncio_mode=auto + filterwarnings=error: needs pytest-asyncio (requirements/tests.txt) or errors"),
    E("pathspec", "1.1.1", "flit_core", "pytest", "flat", PASSED,
      "also ships setup.py/setup.cfg and tox.toml; group `dev`; bare: 197 passed"),
    E("typing-extensions", "4.16.0", "flit_core", "unittest (tox)", "src, module", PASSED,
      "src/test_typing_extensions.py; tox: python -m unittest discover (src/ is no package)"),
    E("exceptiongroup", "1.3.2", "flit_scm", "pytest", "src", PASSED,
      "backend flit_scm (flit_core + setuptools-scm); bare: 128 passed"),
    E("termcolor", "3.3.0", "hatchling", "pytest", "src", PASSED,
      "hatch-vcs; extra `tests` (pytest-cov); bare: 85 passed"),
    E("humanize", "4.17.0", "hatchling", "pytest", "src", PASSED,
      "extra `tests`: freezegun, pytest-benchmark, pytest-codspeed"),
    E("colorama", "0.4.6", "hatchling", "unittest", "flat, tests in package", PASSED,
      "tests fall back to unittest.mock; bare: 38 passed, 14 skipped"),
    E("platformdirs", "4.14.9", "hatchling", "pytest", "src", RESOLUTION,
      "build-system requires python-sbom[hatch], which is not on PyPI (404): the sdist cannot be built"),
    E("sqlparse", "0.6.1", "hatchling", "pytest", "flat", PASSED,
      "group `dev` also pulls sphinx, hatch: a large closure; bare: 537 passed"),
    E("tomlkit", "0.15.2", "poetry-core", "pytest", "flat", PASSED,
      "test deps in dependency group `dev`; bare: 1203 passed"),
    E("pastel", "0.2.1", "poetry-core", "pytest", "flat", PASSED, "no dependencies at all; bare: 30 passed in 0.05 s"),
    E("cleo", "2.1.0", "poetry-core", "pytest", "src", PASSED,
      "Poetry group `dev` (pytest-mock); rapidfuzz is a binary wheel"),
    E("feedparser-sgmllib", "2.1.0", "poetry-core", "pytest", "src", PASSED,
      "requirements/ dir of Poetry sub-projects; bare: 72 passed"),
    E("dep-logic", "0.7.2", "pdm-backend", "pytest", "src", PASSED,
      "testpaths src/ and tests/; bare: 2515 passed in 2 s"),
    E("findpython", "0.9.0", "pdm-backend", "pytest", "src", PASSED,
      "bare as root: 1 failure (test_find_python_exclude_unreadable: root reads anything); passes unprivileged"),
)

DEMO = ("six", "pastel", "termcolor", "pathspec")  # setup.py, poetry-core, hatchling, flit_core: all < 1 s bare


def _sources(names=None) -> tuple[RepoSource, ...]:
    chosen = [e for e in ENTRIES if names is None or e.name in names]
    return tuple(RepoSource(name=e.name, sdist=f"{e.name}=={e.version}") for e in chosen)


def corpus() -> RepoSet:
    """All corpus projects, as pinned PyPI sdists."""
    return RepoSet(name="corpus", repos=_sources())


def demo() -> RepoSet:
    """Four small, quick projects with different build backends (what `make demo` builds)."""
    return RepoSet(name="demo", repos=_sources(DEMO))


def entry(name: str) -> Entry:
    """The corpus table's row for `name` (ValueError naming the known ones otherwise)."""
    for e in ENTRIES:
        if e.name == name:
            return e
    raise ValueError(f"{name!r} is not in the corpus (configs/envs/corpus.py); known: {[e.name for e in ENTRIES]}")
