"""`factory envs ...` from the command line: `build` builds the demo set's real sdists from the package
mirror (what `make demo` does) and commits them, `mirror` copies a repository set's sdists and wheel
closures from an index (here the local test mirror: no network) and is idempotent, `builds` lists the
lake's builds, an unknown set is one line on stderr. CPU with bubblewrap, about 30 seconds."""

from __future__ import annotations

import json

import pytest
from envs_fixtures import mirror_index

from factory.cli import main


@pytest.mark.slow
def test_mirror_copies_the_demo_set_and_is_idempotent(tmp_path, capsys):
    from configs.envs import repo_set

    dest = tmp_path / "mirror"
    assert main(["--home", str(tmp_path / "home"), "envs", "mirror", "--repos", "demo", "--dest", str(dest),
                 "--registry", mirror_index()]) == 0
    first = capsys.readouterr().out
    names = {p.name for p in (dest / "files").iterdir()}
    for source in repo_set("demo").repos:
        name, version = source.sdist.split("==")
        assert any(n.startswith(f"{name}-{version}") and not n.endswith(".whl") for n in names), (source.sdist, names)
    assert any(n.startswith("pytest-") for n in names) and (dest / "simple" / "pytest" / "index.html").exists()
    assert main(["--home", str(tmp_path / "home"), "envs", "mirror", "--repos", "demo", "--dest", str(dest),
                 "--registry", mirror_index()]) == 0
    assert capsys.readouterr().out == first and {p.name for p in (dest / "files").iterdir()} == names


def test_builds_of_an_empty_lake_and_an_unknown_set(tmp_path, capsys):
    assert main(["--home", str(tmp_path), "envs", "builds", "--json"]) == 0
    assert capsys.readouterr().out.strip() == "[]"
    assert main(["--home", str(tmp_path), "envs", "build", "--repos", "no-such-set"]) == 1
    assert "unknown repository set 'no-such-set'" in capsys.readouterr().err


@pytest.mark.slow
def test_build_the_demo_set_from_the_mirror(tmp_path, capsys):
    from configs.envs import repo_set

    home = str(tmp_path / "home")
    assert main(["--home", home, "envs", "build", "--repos", "demo", "--registry", mirror_index(), "--json"]) == 0
    done = capsys.readouterr()
    records = json.loads(done.out)
    assert done.err.count("passed (") == len(records)  # progress lines go to stderr with --json
    assert [r["repo"] for r in records] == [s.name for s in repo_set("demo").repos]
    for r in records:
        assert r["failure_class"] == "passed", (r["repo"], r["failure_detail"])
        assert r["origin"] == f"source/sdist/{r['repo']}=={r['revision']}" and len(r["env_digest"]) == 64
    assert main(["--home", home, "envs", "builds", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert sorted(row["repo"] for row in rows) == sorted(r["repo"] for r in records)
    assert all(row["tests_passed"] >= 20 and row["tests_failed"] == 0 for row in rows)
