"""A moved or copied FACTORY_HOME (factory/lake/moved.py): Iceberg stores absolute paths, so the
embedded lake refuses to open a home whose catalog points elsewhere, `factory doctor` fails its
FACTORY_HOME check, and both say the exact command; the symlink fix they suggest really works.

A small embedded lake (one refined-like table of stdlib docstrings) in tmp_path, moved with
`os.rename` / copied with `shutil.copytree`; CPU, no servers, ~3 s."""

from __future__ import annotations

import os
import shutil

import pytest

from factory import cli, doctor
from factory.lake import HomeMoved, Lake

TABLE = "refined.tiny"


@pytest.fixture
def built(tmp_path, corpus, monkeypatch):
    monkeypatch.delenv("FACTORY_DEPLOY", raising=False)
    monkeypatch.delenv("FACTORY_DEPLOY_JSON", raising=False)
    home = tmp_path / "home"
    rows = corpus.docstrings(TABLE, count=5)
    corpus.write(Lake.open(home=home), TABLE, rows)
    return home, len(rows)


@pytest.mark.slow
def test_a_moved_home_is_refused_with_the_commands_that_fix_it(built, tmp_path, capsys):
    home, rows = built
    moved = tmp_path / "elsewhere"
    os.rename(home, moved)
    with pytest.raises(HomeMoved) as refused:
        Lake.open(home=moved)
    message = str(refused.value)
    assert f"FACTORY_HOME {moved} was moved from {home}" in message and TABLE in message
    assert f"mv {moved} {home}" in message and f"ln -s {moved} {home}" in message

    check = doctor.check_home(moved)
    assert check.status == "fail" and f"ln -s {moved} {home}" in check.fix
    lake_checks = doctor.check_lake(moved)
    assert [(c.name, c.status, c.fix) for c in lake_checks] == [("lake catalog", "fail", "see the FACTORY_HOME check")]

    code = cli.main(["--home", str(moved), "tables"])  # one line on stderr, no traceback
    err = capsys.readouterr().err
    assert code == 1 and err.startswith("factory tables: error: FACTORY_HOME") and len(err.splitlines()) == 1

    os.symlink(moved, home)  # the suggested fix: the stored paths resolve to the new place
    assert doctor.check_home(moved).status == "ok"
    assert Lake.open(home=moved).table(TABLE).scan().to_arrow().num_rows == rows


def test_a_copied_home_is_refused_because_it_would_write_the_original(built, tmp_path):
    home, _ = built
    copy = tmp_path / "copy"
    shutil.copytree(home, copy)
    with pytest.raises(HomeMoved, match=rf"FACTORY_HOME {copy} is a copy of {home}.*--home {home}"):
        Lake.open(home=copy)
    assert doctor.check_home(copy).status == "fail" and "make demo" in doctor.check_home(copy).fix
    assert doctor.check_home(home).status == "ok" and Lake.open(home=home).tables() == [TABLE]  # the original is fine
