"""The shipped repository corpus config (configs/envs/corpus.py) and the repository-set registry
(configs/envs/__init__.py): sizes, pins, variety, the demo subset, the docstring table. Pure config:
no network, no builds (the corpus itself is built by bench/envs_bench.py); runs anywhere in < 1 s."""

from __future__ import annotations

import re

import pytest

from configs.envs import REPO_SETS, corpus as corpus_module, repo_set
from factory.envs.outcomes import FailureClass


def test_corpus_is_forty_plus_pinned_sdists():
    rs = corpus_module.corpus()
    assert rs.name == "corpus" and len(rs.repos) == len(corpus_module.ENTRIES) >= 40
    for source, e in zip(rs.repos, corpus_module.ENTRIES):
        assert source.kind == "sdist" and source.sdist == f"{e.name}=={e.version}"
        assert re.fullmatch(r"[0-9]+(\.[0-9]+)*(\.post[0-9]+)?", e.version), e  # an exact release, not a range
    assert len({e.name.lower() for e in corpus_module.ENTRIES}) == len(corpus_module.ENTRIES)


def test_corpus_varies_backend_runner_layout_and_outcome():
    entries = corpus_module.ENTRIES
    backends = {e.backend for e in entries}
    assert {"flit_core", "hatchling", "poetry-core", "pdm-backend", "setuptools (setup.py)",
            "setuptools (setup.cfg)", "setuptools (pyproject)"} <= backends
    assert {e.runner.split()[0] for e in entries} == {"pytest", "unittest"}
    assert {e.layout.split(",")[0] for e in entries} >= {"src", "flat", "module"}
    expected = {e.expect for e in entries}
    assert FailureClass.PASSED in expected and len(expected) >= 4  # known failures on purpose
    assert all(e.note for e in entries if e.expect is not FailureClass.PASSED)


def test_demo_is_a_small_subset_with_distinct_backends():
    demo = corpus_module.demo()
    names = [r.name for r in demo.repos]
    assert demo.name == "demo" and 3 <= len(names) <= 4
    assert set(names) <= {r.name for r in corpus_module.corpus().repos}
    entries = [corpus_module.entry(n) for n in names]
    assert len({e.backend for e in entries}) == len(entries)
    assert all(e.expect is FailureClass.PASSED for e in entries)


def test_docstring_table_matches_the_entries():
    rows = re.findall(r"^\| (\S+) \| (\S+) \| (.+?) \| (.+?) \| (.+?) \|$", corpus_module.__doc__, re.M)
    table = [r for r in rows if r[0] not in ("name", "---")]
    assert table == [(e.name, e.version, e.backend, e.runner, e.layout) for e in corpus_module.ENTRIES]


def test_repo_sets_registry_names_its_sets():
    assert {"demo", "corpus"} <= set(REPO_SETS)
    assert repo_set("demo") == corpus_module.demo()
    with pytest.raises(ValueError, match=r"unknown repository set 'nope'.*'corpus'"):
        repo_set("nope")
    with pytest.raises(ValueError, match="not in the corpus"):
        corpus_module.entry("nope")
