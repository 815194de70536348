"""Ingestion keeps its error contract under hostile inputs (issue 15): only regular files are
opened and no read blocks or runs unbounded (FIFOs, sockets, `/dev/zero`, `/proc` files that list
as 0 bytes); symlinks leaving a directory source's root are refused unless the config allows
them; six malformed inputs that used to escape as raw exceptions (a non-UTF-8 file name, a JSON
lone surrogate, a truncated `.jsonl.gz`, invalid UTF-8 in a Parquet string column, an unknown
fsspec scheme, `s3://` without s3fs) are each a `SourceError` naming the file (and line or row),
and skip mode skips the bad file or line with its reason counted; a source that reads nothing, or
shrinks a table by more than `max_shrink`, commits nothing; sources declared in a YAML file
ingest through `factory ingest --sources FILE NAME`.

These run on CPU with no servers: real files, FIFOs and sockets in `tmp_path`, a real pyiceberg
`SqlCatalog` on sqlite. Reads that could block or run away (the FIFO and device cases) run in a
child process with a deadline and an address-space cap, so a regression fails the test instead
of hanging the suite or eating the machine's memory (~1 s per child).
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from factory import cli
from factory.data.ingest import ingest_source
from factory.data.readers import read_source
from factory.data.sources import DirectorySource, JsonlSource, ParquetSource, SourceError

# The child reads a source (JSON on stdin) under an address-space cap of what its imports took + 1 GiB.
CHILD = """
import json, resource, sys
from pydantic import TypeAdapter
from factory.data.readers import read_source
from factory.data.sources import SourceConfig, SourceError
pages = int(open("/proc/self/statm").read().split()[0])
cap = pages * resource.getpagesize() + (1 << 30)
resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
source = TypeAdapter(SourceConfig).validate_json(sys.stdin.read())
try:
    docs, report = read_source(source)
    print(json.dumps({"paths": [d["path"] for d in docs], "skipped": dict(report.skipped),
                      "examples": report.examples}))
except SourceError as exc:
    print(json.dumps({"error": str(exc)}))
"""


def read_isolated(source, timeout: float = 30) -> dict:
    """`read_source(source)` in a child: {"paths", "skipped", "examples"} or {"error"}."""
    try:
        done = subprocess.run([sys.executable, "-c", CHILD], input=source.model_dump_json(), capture_output=True,
                              text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"reading source {source.name} did not finish within {timeout} s (it blocked or never ended)")
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


def write(path: Path, content: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    (path.write_bytes if isinstance(content, bytes) else path.write_text)(content)
    return path


def paths(docs: list[dict]) -> list[str]:
    return [d["path"] for d in docs]


# -- only regular files are opened, and no read blocks or runs unbounded ----------------------------


def test_fifo_and_socket_are_skipped_or_refused_and_never_block(tmp_path, monkeypatch):
    root = tmp_path / "src"
    write(root / "a.py", "a = 1\n")
    os.mkfifo(root / "pipe.py")  # nobody ever writes to it: a plain open() blocks forever
    monkeypatch.chdir(root)  # bind by relative name: tmp_path may be longer than a socket path may be
    server = socket.socket(socket.AF_UNIX)
    server.bind("sock.py")
    try:
        skipped = read_isolated(DirectorySource(name="s", root=str(root), on_invalid="skip"))
        assert skipped["paths"] == ["a.py"]
        assert skipped["skipped"] == {"not_a_regular_file": 2}
        assert sorted(skipped["examples"]["not_a_regular_file"]) == [str(root / "pipe.py"), str(root / "sock.py")]

        strict = read_isolated(DirectorySource(name="s", root=str(root), include=["pipe.py", "a.py"]))
        assert strict == {"error": f"source s: {root / 'pipe.py'}: not a regular file (a FIFO); "
                                   "only regular files are read"}
    finally:
        server.close()


def test_devices_are_refused_and_reads_stop_at_the_cap(tmp_path):
    root = tmp_path / "src"
    write(root / "a.py", "a = 1\n")
    (root / "zero.py").symlink_to("/dev/zero")  # endless, and its listing says 0 bytes

    # by default the link leaves the root, so it is refused before anything is opened
    default = read_isolated(DirectorySource(name="z", root=str(root), max_file_bytes=1000, on_invalid="skip"))
    assert default["paths"] == ["a.py"] and default["skipped"] == {"symlink_outside_root": 1}
    # followed on purpose, the target is still no regular file — with no size cap at all
    followed = read_isolated(DirectorySource(name="z", root=str(root), follow_external_symlinks=True))
    assert followed == {"error": f"source z: {root / 'zero.py'}: not a regular file (a character device); "
                                 "only regular files are read"}

    # a regular file that lists as 0 bytes but is longer than the cap: the read stops at the cap
    (root / "zero.py").unlink()
    (root / "status.txt").symlink_to("/proc/self/status")
    assert os.stat(root / "status.txt").st_size == 0
    capped = read_isolated(DirectorySource(name="z", root=str(root), include=["*"], max_file_bytes=100,
                                           follow_external_symlinks=True))
    assert capped["paths"] == ["a.py"]
    assert capped["skipped"] == {"too_large": 1} and capped["examples"] == {"too_large": [str(root / "status.txt")]}


# -- symlinks that leave the root ----------------------------------------------------------------


def test_symlinks_leaving_the_root_are_refused_unless_allowed(tmp_path):
    outside = write(tmp_path / "private" / "secret.py", "KEY = 'hunter2'\n")
    root = tmp_path / "src"
    write(root / "a.py", "a = 1\n")
    (root / "alias.py").symlink_to("a.py")  # inside the root: read as usual
    (root / "leak.py").symlink_to(outside)
    (root / "pkg").mkdir()
    (root / "pkg" / "up.py").symlink_to("../../private/secret.py")  # relative, and still outside

    docs, report = read_source(DirectorySource(name="l", root=str(root), on_invalid="skip"))
    assert paths(docs) == ["a.py", "alias.py"]
    assert report.skipped == {"symlink_outside_root": 2}
    assert sorted(report.examples["symlink_outside_root"]) == [str(root / "leak.py"), str(root / "pkg" / "up.py")]
    assert "hunter2" not in "".join(d["text"] for d in docs)

    with pytest.raises(SourceError) as raised:
        read_source(DirectorySource(name="l", root=str(root)))
    assert str(raised.value) == (f"source l: {root / 'leak.py'}: symlink to {outside}, outside the source root "
                                 f"{root} (follow_external_symlinks: true reads it)")

    allowed, report = read_source(DirectorySource(name="l", root=str(root), follow_external_symlinks=True))
    assert paths(allowed) == ["a.py", "alias.py", "leak.py", "pkg/up.py"] and not report.skipped
    assert {d["path"]: d["text"] for d in allowed}["leak.py"] == "KEY = 'hunter2'\n"


# -- six malformed inputs: a SourceError naming the file (and line or row), skipped in skip mode ----


def invalid_utf8_strings(*values: bytes) -> pa.Array:
    """A string array holding raw bytes as they are (Arrow does not validate UTF-8 here)."""
    offsets, data = [0], b""
    for value in values:
        data += value
        offsets.append(len(data))
    return pa.Array.from_buffers(pa.string(), len(values), [None, pa.array(offsets, pa.int32()).buffers()[1],
                                                             pa.py_buffer(data)])


def _non_utf8_file_name(tmp: Path):
    root = tmp / "src"
    write(root / "a.py", "a = 1\n")
    write(Path(os.fsdecode(os.fsencode(root) + b"/bad\xff.py")), "b = 2\n")
    shown = f"{root}/bad\\xff.py"
    source = DirectorySource(name="bad", root=str(root))
    return source, f"{shown}: file name is not valid UTF-8", ("invalid_file_name", shown), ["a.py"]


def _json_lone_surrogate(tmp: Path):
    path = write(tmp / "d.jsonl", '{"text": "fine"}\n{"text": "a\\ud800b"}\n')
    return (JsonlSource(name="bad", paths=[str(path)]),
            f"{path}:2: field 'text' is not valid Unicode (lone surrogate '\\ud800' at character 1)",
            ("malformed_record", f"{path}:2"), ["d.jsonl:1"])


def _truncated_jsonl_gz(tmp: Path):
    write(tmp / "in" / "a.jsonl", '{"text": "fine"}\n')
    whole = gzip.compress(b"".join(b'{"text": "line %d"}\n' % i for i in range(2000)), mtime=0)
    cut = write(tmp / "in" / "b.jsonl.gz", whole[: len(whole) // 2])
    return (JsonlSource(name="bad", paths=[str(tmp / "in" / "*")]),
            f"{cut}: corrupt or truncated compressed data (", ("unreadable", str(cut)), ["a.jsonl:1"])


def _parquet_invalid_utf8(tmp: Path):
    path = tmp / "d.parquet"
    tmp.mkdir(parents=True)
    pq.write_table(pa.table({"text": invalid_utf8_strings(b"ok", b"\xff\xfe", b"also ok")}), path)
    return (ParquetSource(name="bad", paths=[str(path)]), f"{path}#row1: invalid UTF-8 at byte 0",
            ("invalid_utf8", f"{path}#row1"), ["d.parquet#0", "d.parquet#2"])


MALFORMED = {f.__name__[1:]: f for f in [_non_utf8_file_name, _json_lone_surrogate, _truncated_jsonl_gz,
                                         _parquet_invalid_utf8]}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_malformed_input_is_a_source_error_or_a_counted_skip(case, lake, tmp_path):
    source, message, (reason, where), kept = MALFORMED[case](tmp_path / "inputs")

    with pytest.raises(SourceError) as raised:
        read_source(source)
    assert str(raised.value).startswith(f"source bad: {message}")
    with pytest.raises(SourceError, match="source bad: "):
        ingest_source(lake, source)
    assert not lake.has_table("raw.bad")

    docs, report = read_source(source.model_copy(update={"on_invalid": "skip"}))
    assert paths(docs) == kept
    assert report.skipped == {reason: 1} and report.examples == {reason: [where]}
    result = ingest_source(lake, source.model_copy(update={"on_invalid": "skip"}))
    assert result.committed and result.documents == len(kept) and result.skipped == {reason: 1}


def missing_implementation() -> tuple[str, str]:
    """A scheme fsspec knows whose package is not installed, and fsspec's own hint for it: `s3`
    when s3fs is missing (as on the dev machine), else the first such scheme there is."""
    from fsspec.registry import known_implementations

    def installed(protocol: str) -> bool:
        return importlib.util.find_spec(known_implementations[protocol]["class"].split(".")[0]) is not None

    candidates = ["s3"] + sorted(known_implementations)
    protocol = next((p for p in candidates if not installed(p)), None)
    if protocol is None:
        pytest.skip("every fsspec implementation is installed here")
    return protocol, known_implementations[protocol]["err"]


@pytest.mark.parametrize("on_invalid", ["error", "skip"])
def test_unknown_scheme_and_missing_file_system_name_the_url(on_invalid, lake, tmp_path):
    """A location no file system can open is an error in both modes: skipping it would be a source
    that silently shrinks."""
    good = write(tmp_path / "a.jsonl", '{"text": "fine"}\n')
    protocol, hint = missing_implementation()
    cases = [
        ("nope://bucket/x.jsonl", "unknown URL scheme nope:// (no fsspec file system serves it)"),
        (f"{protocol}://bucket/x.jsonl", f"no file system for {protocol}:// is installed ({hint})"),
    ]
    for url, problem in cases:
        source = JsonlSource(name="bad", paths=[str(good), url], on_invalid=on_invalid)
        with pytest.raises(SourceError) as raised:
            read_source(source)
        assert str(raised.value) == f"source bad: {url}: {problem}"
        root = url.rsplit("/", 1)[0]
        with pytest.raises(SourceError) as raised:
            read_source(DirectorySource(name="bad", root=root, on_invalid=on_invalid))
        assert str(raised.value) == f"source bad: {root}: {problem}"
        with pytest.raises(SourceError, match=f"source bad: {url}"):
            ingest_source(lake, source)
    assert not lake.has_table("raw.bad")


# -- a source that reads nothing, or far less, commits nothing -------------------------------------


def test_a_source_that_matches_nothing_is_an_error_and_the_table_keeps_its_snapshot(lake, tmp_path):
    root = tmp_path / "src"
    for name in ("a.py", "b.py", "c.py"):
        write(root / name, f"{name[0]} = 1\n")
    first = ingest_source(lake, DirectorySource(name="t", root=str(root)))
    typo = DirectorySource(name="t", root=str(root), include=["**/*.pyy"])

    with pytest.raises(SourceError) as raised:
        ingest_source(lake, typo)
    assert str(raised.value).startswith(
        f"source t: no documents from {root} (include ['**/*.pyy'], exclude []): no file matches. ")
    assert "allow_empty: true" in str(raised.value)
    assert lake.current_snapshot_id("raw.t") == first.snapshot_id and len(lake.lineage.records()) == 1

    # every file skipped: the message says why, by reason
    write(root / "bin.py", b"\xff\n")
    with pytest.raises(SourceError, match=rf"every candidate was skipped: invalid_utf8 1 \(e\.g\. {root / 'bin.py'}\)"):
        read_source(DirectorySource(name="t", root=str(root), include=["bin.py"], on_invalid="skip"))

    # empty on purpose: allowed by the config; replacing a populated table still needs max_shrink
    empty = typo.model_copy(update={"allow_empty": True})
    assert read_source(empty)[0] == []
    with pytest.raises(SourceError, match="raw.t holds 3 documents; this read has 0"):
        ingest_source(lake, empty)
    assert lake.current_snapshot_id("raw.t") == first.snapshot_id
    emptied = ingest_source(lake, empty.model_copy(update={"max_shrink": 1.0}))
    assert emptied.committed and emptied.documents == 0
    assert lake.table("raw.t").scan().to_arrow().num_rows == 0


def test_a_source_that_shrinks_past_max_shrink_commits_nothing(lake, tmp_path):
    root = tmp_path / "src"
    for i in range(10):
        write(root / f"m{i}.py", f"x = {i}\n")
    source = DirectorySource(name="t", root=str(root))
    first = ingest_source(lake, source)
    for i in range(6):
        (root / f"m{i}.py").unlink()

    with pytest.raises(SourceError) as raised:
        ingest_source(lake, source)
    assert str(raised.value) == (
        "source t: raw.t holds 10 documents; this read has 4 (60% fewer, more than max_shrink 50%); nothing "
        "committed. Check the source, or raise max_shrink (factory ingest --allow-shrink for one ingest)")
    assert lake.current_snapshot_id("raw.t") == first.snapshot_id
    assert len(lake.table("raw.t").snapshots()) == 1 and len(lake.lineage.records()) == 1

    assert ingest_source(lake, source.model_copy(update={"max_shrink": 0.75})).documents == 4  # config allows it
    write(root / "m0.py", "x = 0\n")
    for i in range(6, 10):
        (root / f"m{i}.py").unlink()  # 5 -> 1 document, 80 % fewer
    assert ingest_source(lake, source, allow_shrink=True).documents == 1  # one ingest allows it


# -- sources declared in YAML, ingested from the CLI -----------------------------------------------


@pytest.fixture
def home(tmp_path, monkeypatch) -> str:
    """A factory home on the embedded catalog (no profile from the developer's shell)."""
    monkeypatch.delenv("FACTORY_DEPLOY", raising=False)
    monkeypatch.delenv("FACTORY_DEPLOY_JSON", raising=False)
    return str(tmp_path / "home")


def run(capsys, home: str, *args: str) -> tuple[int, str, str]:
    code = cli.main(["--home", home, *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


SOURCES_YAML = """\
notes:
  kind: directory
  root: notes                  # relative to this file
  include: ["**/*.md"]
  license: CC-BY-4.0
dumps:
  kind: jsonl
  paths: [dumps/*.jsonl]
  on_invalid: skip
"""


def test_yaml_sources_ingest_from_the_cli(home, tmp_path, capsys):
    from factory.deploy import open_lake

    conf = tmp_path / "conf"
    write(conf / "notes" / "a.md", "# a\n")
    write(conf / "notes" / "sub" / "b.md", "# b\n")
    write(conf / "notes" / "skip.txt", "not included\n")
    write(conf / "dumps" / "d.jsonl", '{"text": "one"}\n{oops\n{"text": "two"}\n')
    sources = write(conf / "my_sources.yaml", SOURCES_YAML)

    code, out, err = run(capsys, home, "ingest", "--sources", str(sources), "notes")
    assert (code, err) == (0, "") and "raw.notes" in out and "new snapshot" in out and "raw.dumps" not in out
    lake = open_lake(None, home)
    rows = {r["path"]: r for r in lake.table("raw.notes").scan().to_arrow().to_pylist()}
    assert sorted(rows) == ["a.md", "sub/b.md"] and rows["a.md"]["license"] == "CC-BY-4.0"
    assert not lake.has_table("raw.dumps")
    [record] = lake.lineage.records()
    assert record.config["root"] == str(conf / "notes")  # the stamped config says where the data was

    code, out, _ = run(capsys, home, "ingest", "--sources", str(sources))
    assert code == 0 and "unchanged" in out and "malformed_record=1" in out
    assert lake.table("raw.dumps").scan().to_arrow()["text"].to_pylist() == ["one", "two"]

    code, _, err = run(capsys, home, "ingest", "--sources", str(sources), "python_stdlib")
    assert code == 1 and f"unknown source python_stdlib; sources in {sources}: notes, dumps" in err
    code, _, err = run(capsys, home, "ingest", "--sources", str(sources), "--full")
    assert code == 1 and "--full" in err


def test_cli_shrink_guard_and_allow_shrink(home, tmp_path, capsys):
    root = tmp_path / "src"
    for i in range(4):
        write(root / f"m{i}.py", f"x = {i}\n")
    sources = write(tmp_path / "s.yaml", f"tiny:\n  kind: directory\n  root: {root}\n")
    assert run(capsys, home, "ingest", "--sources", str(sources))[0] == 0
    for i in range(3):
        (root / f"m{i}.py").unlink()
    code, out, err = run(capsys, home, "ingest", "--sources", str(sources))
    assert code == 1 and err.startswith("factory ingest: error: source tiny: raw.tiny holds 4 documents; this read has 1")
    code, out, _ = run(capsys, home, "ingest", "--sources", str(sources), "--allow-shrink")
    assert code == 0 and "new snapshot" in out


BAD_FILES = {
    "field": ("notes:\n  kind: directory\n  root: /x\n  include: [1]\n  bogus: true\n"
              "dumps:\n  kind: csv\nother:\n  root: /y\n",
              ["notes.include.0: Input should be a valid string", "notes.bogus: Extra inputs are not permitted",
               "dumps.kind: unknown kind 'csv' (one of directory, jsonl, parquet, package_docs)",
               "other.kind: Field required (one of directory"]),
    "bounds": ("notes:\n  kind: directory\n  root: /x\n  max_shrink: 2\n",
               ["notes.max_shrink: Input should be less than or equal to 1"]),
    "duplicate": ("notes:\n  kind: directory\n  root: /x\nnotes:\n  kind: directory\n  root: /y\n",
                  ["not valid YAML", "duplicate key 'notes' (first at line 1)", "line 4"]),
    "name": ("notes:\n  name: other\n  kind: directory\n  root: /x\n", ["notes.name: 'other' differs from its key"]),
    "syntax": ("notes: [unclosed\n", ["not valid YAML"]),
    "shape": ("- kind: directory\n  name: notes\n", ["expected a mapping of source name to config (got list)"]),
    "empty": ("", ["expected a mapping of source name to config (got an empty file)"]),
}


@pytest.mark.parametrize("case", list(BAD_FILES))
def test_a_bad_sources_file_names_the_file_and_field_and_ingests_nothing(case, home, tmp_path, capsys):
    from factory.deploy import open_lake

    text, fragments = BAD_FILES[case]
    path = write(tmp_path / "bad.yaml", text)
    code, out, err = run(capsys, home, "ingest", "--sources", str(path))
    assert code == 1 and out == "" and len(err.strip().splitlines()) == 1
    assert err.startswith(f"factory ingest: error: sources file {path}: ")
    for fragment in fragments:
        assert fragment in err
    assert [t for t in open_lake(None, home).tables() if t.startswith("raw.")] == []


def test_a_missing_sources_file_is_one_line(home, tmp_path, capsys):
    code, _, err = run(capsys, home, "ingest", "--sources", str(tmp_path / "nope.yaml"))
    assert code == 1 and err == f"factory ingest: error: sources file {tmp_path / 'nope.yaml'}: cannot read it " \
                                "(No such file or directory)\n"


def test_sources_file_paths_resolve_against_the_file(tmp_path):
    from factory.data.source_files import load_sources

    path = write(tmp_path / "conf" / "s.yaml", "a:\n  kind: jsonl\n  paths: [d/*.jsonl, /abs/x.jsonl, memory://m/y.jsonl]\n"
                                               "b:\n  kind: package_docs\n  root: '{purelib}'\n"
                                               "c:\n  kind: directory\n  root: ~/code\n")
    loaded = load_sources(path)
    assert list(loaded) == ["a", "b", "c"]
    assert loaded["a"].paths == [str(tmp_path / "conf" / "d" / "*.jsonl"), "/abs/x.jsonl", "memory://m/y.jsonl"]
    assert loaded["b"].root == "{purelib}" and loaded["c"].root == os.path.expanduser("~/code")
