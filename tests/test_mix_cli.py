"""`factory mix list | show | register | peek` on a small lake in tmp_path, and its user errors.

The lake holds refined.python_stdlib, refined.site_packages and refined.package_docs made from
real standard-library text by the shared `corpus` fixture (code of a few packages; module
docstrings as the prose source) and a 512-token BPE trained on them with
`factory.tokenize.train_tokenizer` under the name `default`, so the real specs in configs/mixes/
register against it. Commands run in-process through `factory.cli.main([...])` (exit code +
captured output). Every error a user can cause exits 1 with one line on stderr naming the problem
and prints nothing on stdout.

Runs on CPU with the embedded sqlite catalog and a `file://` warehouse, no network; ~15 s.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from configs.mixes import mix_spec
from factory import cli
from factory.lake import Lake
from factory.mix import MIX_VERSIONS_TABLE, mix_versions, register_mix_version
from factory.tokenize import TokenizerConfig, train_tokenizer

CODE = {"refined.python_stdlib": ["json", "email"], "refined.site_packages": ["asyncio", "concurrent"]}
DOCS = "refined.package_docs"
DEFAULT_WEIGHTS = {"refined.python_stdlib": 0.35, "refined.site_packages": 0.55, DOCS: 0.10}


# -- a small refined lake of real text ------------------------------------------------------------
def documents(corpus) -> dict[str, list[dict]]:
    """Table -> rows: stdlib packages' modules as code, top-level modules' docstrings as prose."""
    return {**{table: corpus.code(table, packages) for table, packages in CODE.items()}, DOCS: corpus.docstrings(DOCS)}


def refined_lake(home: Path, corpus, *, with_tokenizer: bool = True) -> Lake:
    lake = Lake.open(home=home)
    for table, rows in documents(corpus).items():
        corpus.write(lake, table, rows)
    if with_tokenizer:
        train_tokenizer(lake, TokenizerConfig(name="default", vocab_size=512, sources=[*CODE, DOCS],
                                              sample_bytes_per_source=100_000, measure_bytes_per_source=50_000))
    return lake


@pytest.fixture(scope="module")
def registered_home(tmp_path_factory, corpus) -> str:
    """The lake with mix `default` registered once (v1); read-only for the tests that use it."""
    home = tmp_path_factory.mktemp("mixhome")
    lake = refined_lake(home, corpus)
    register_mix_version(lake, mix_spec("default"))
    return str(home)


@pytest.fixture(autouse=True)
def embedded_catalog(monkeypatch):
    monkeypatch.delenv("FACTORY_DEPLOY", raising=False)
    monkeypatch.delenv("FACTORY_DEPLOY_JSON", raising=False)


def run(capsys, home: str, *args: str) -> tuple[int, str, str]:
    code = cli.main(["--home", home, "mix", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def assert_user_error(code: int, out: str, err: str, *fragments: str) -> None:
    assert code == 1 and out == ""
    assert err.startswith("factory mix: error: ") and err.count("\n") == 1, err
    for fragment in fragments:
        assert fragment in err, err


# -- list, show, peek on a registered mix ---------------------------------------------------------
def test_list_shows_every_spec_and_its_newest_version(registered_home, capsys):
    code, out, _ = run(capsys, registered_home, "list")
    assert code == 0
    [default] = [line for line in out.splitlines() if "│ default " in line]
    [curriculum] = [line for line in out.splitlines() if "│ code_curriculum " in line]
    assert "mix/default@v1" in default and "refined.package_docs (0.1)" in default and "256" in default
    assert "refined.python_stdlib (0.4)" in curriculum and "@v" not in curriculum  # not registered: "-"


def test_show_prints_pins_and_weights(registered_home, capsys):
    [version] = mix_versions(Lake.open(home=registered_home), "default")
    code, out, _ = run(capsys, registered_home, "show", "default")
    assert code == 0
    assert "mix/default@v1" in out and version.tokenizer_version in out and "seq_len 256" in out
    for table, weight in DEFAULT_WEIGHTS.items():
        [line] = [line for line in out.splitlines() if f"│ {table} " in line]
        assert str(version.pins[table].snapshot_id) in line and f"{weight:.3f}" in line
        assert f"{version.pins[table].train_rows:,}" in line
    [docs] = [line for line in out.splitlines() if f"│ {DOCS} " in line]
    assert "│ 20 " in docs  # its max_epochs


def test_show_json_is_the_version_list(registered_home, capsys):
    code, out, _ = run(capsys, registered_home, "show", "default", "--json")
    assert code == 0
    [version] = json.loads(out)
    assert version["mix"] == "default" and version["version"] == 1
    assert {s["table"]: s["weight"] for s in version["spec"]["sources"]} == DEFAULT_WEIGHTS
    assert set(version["pins"]) == set(DEFAULT_WEIGHTS)
    assert all(p["train_rows"] > 0 and p["token_estimate"] > 0 for p in version["pins"].values())
    assert version["tokenizer_version"].startswith("tokenizer/default@")


def test_peek_decodes_one_row_of_real_text(registered_home, capsys, corpus):
    code, out, _ = run(capsys, registered_home, "peek", "default", "--rows", "1")
    assert code == 0
    lines = out.splitlines()
    assert lines[-1] == "mix/default@v1, stage 0, 257 tokens per row"  # seq_len + 1
    [rule] = [line for line in lines if "row 0: " in line]
    source = rule.split("row 0: ")[1].split()[0]
    assert source in DEFAULT_WEIGHTS
    rows = documents(corpus)[source]
    doc_ids = {r["doc_id"] for r in rows}
    shown = rule.split("documents ")[1].strip(" ─").split(", ")
    assert shown and set(shown) <= doc_ids
    # the decoded row is text of the documents it names (the tokenizer round-trips bytes)
    body = [line for line in lines[lines.index(rule) + 1:-1] if len(line.strip()) >= 12]
    texts = "\n".join(r["text"] for r in rows if r["doc_id"] in shown)
    assert body and sum(line.strip() in texts for line in body) >= len(body) - 1  # first/last may be cut


# -- register -------------------------------------------------------------------------------------
def test_register_then_unchanged(tmp_path, capsys, corpus):
    lake = refined_lake(tmp_path, corpus)
    code, out, _ = run(capsys, str(tmp_path), "register", "default")
    assert code == 0
    assert out.splitlines()[-1] == "mix/default@v1: registered"
    for table in DEFAULT_WEIGHTS:  # one progress line per pinned source
        assert f"{table}@{lake.current_snapshot_id(table)}: " in out
    snapshot = lake.table(MIX_VERSIONS_TABLE).current_snapshot().snapshot_id

    code, out, _ = run(capsys, str(tmp_path), "register", "default")
    assert code == 0
    assert out.splitlines()[-1] == "mix/default@v1: unchanged (the newest version already pins this)"
    assert lake.table(MIX_VERSIONS_TABLE).current_snapshot().snapshot_id == snapshot
    assert [v.version for v in mix_versions(lake, "default")] == [1]


# -- user errors ----------------------------------------------------------------------------------
def test_show_unregistered_mix_is_a_user_error(registered_home, capsys):
    assert_user_error(*run(capsys, registered_home, "show", "nope"), "mix 'nope' has no registered version")


def test_register_unknown_spec_names_it_and_the_known_ones(registered_home, capsys):
    assert_user_error(*run(capsys, registered_home, "register", "nope"),
                      "no mix spec 'nope'", "code_curriculum, code_with_junk, default")


def test_register_before_any_tokenizer_names_the_tokenizer(tmp_path, capsys, corpus):
    lake = refined_lake(tmp_path, corpus, with_tokenizer=False)
    assert_user_error(*run(capsys, str(tmp_path), "register", "default"),
                      "mix default", "no tokenizer named 'default'")
    assert not lake.has_table(MIX_VERSIONS_TABLE)
