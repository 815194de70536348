"""Source readers (`factory.data.sources`) and the embedded source configs (`configs.sources`):
every source type on tiny files written into `tmp_path`, every bad input raising a `SourceError`
that names the file (and line) and the problem — with nothing committed when it runs through
`ingest_source` — skip counting by reason, glob semantics, deterministic sampling, size caps and
licenses from `*.dist-info`.

These run on CPU with no servers: real files and a real pyiceberg `SqlCatalog` on sqlite in
`tmp_path`.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pydantic
import pytest

from configs import sources as embedded
from factory.data.ingest import ingest_source
from factory.data.readers import read_source
from factory.data.sources import (
    DirectorySource,
    JsonlSource,
    PackageDocsSource,
    ParquetSource,
    SourceConfig,
    SourceError,
)

LONG_README = "# foo\n\n" + "Foo does one thing well and explains it at length. " * 6


def write(path: Path, content: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    (path.write_bytes if isinstance(content, bytes) else path.write_text)(content)
    return path


def jsonl(path: Path, *lines: str | bytes) -> Path:
    raw = b"\n".join(line if isinstance(line, bytes) else line.encode() for line in lines) + b"\n"
    return write(path, gzip.compress(raw, mtime=0) if path.suffix == ".gz" else raw)


def parquet(path: Path, **columns: list) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(columns), path)
    return path


def dist_info(site: Path, name: str, version: str, body: str, headers: str = "", record: list[str] = ()) -> Path:
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n{headers}\n{body}"
    info = site / f"{name}-{version}.dist-info"
    write(info / "METADATA", meta)
    write(info / "RECORD", "".join(f"{r},,\n" for r in record))
    return info


def paths(docs: list[dict]) -> list[str]:
    return [d["path"] for d in docs]


# -- each source type, good inputs ----------------------------------------------------------------


def test_directory_source_reads_files_with_language_and_stable_ids(tmp_path):
    root = tmp_path / "src"
    write(root / "a.py", "print('a')\n")
    write(root / "pkg" / "b.py", "b = 'ü'\n")
    write(root / "README.md", "# hi\n")
    source = DirectorySource(name="toy", root=str(root), include=["**/*.py", "*.md"], license="MIT")
    seen = []

    docs, report = read_source(source, progress=lambda done, total: seen.append((done, total)))

    assert paths(docs) == ["README.md", "a.py", "pkg/b.py"]
    assert [d["language"] for d in docs] == ["markdown", "python", "python"]
    assert docs[2]["text"] == "b = 'ü'\n" and docs[2]["bytes"] == 9  # UTF-8 bytes, not characters
    assert {d["license"] for d in docs} == {"MIT"} and {d["source"] for d in docs} == {"toy"}
    assert report.candidates == 3 and not report.skipped
    assert seen[-1] == (3, 3)
    again, _ = read_source(source)
    assert [d["doc_id"] for d in again] == [d["doc_id"] for d in docs]
    assert len({d["doc_id"] for d in docs}) == 3 and all(len(d["doc_id"]) == 24 for d in docs)


def test_directory_glob_include_exclude(tmp_path):
    root = tmp_path / "src"
    for rel in ["a.py", "b.txt", "pkg/c.py", "pkg/deep/d.py", "sub/e.py", "sub/x/f.py", "subway/g.py"]:
        write(root / rel, "x\n")

    def listed(**globs) -> list[str]:
        return paths(read_source(DirectorySource(name="g", root=str(root), **globs))[0])

    # `**/` spans zero or more directories; `*` stays within one segment
    assert listed(include=["**/*.py"]) == ["a.py", "pkg/c.py", "pkg/deep/d.py", "sub/e.py", "sub/x/f.py", "subway/g.py"]
    assert listed(include=["**/*.py"], exclude=["sub/**"]) == ["a.py", "pkg/c.py", "pkg/deep/d.py", "subway/g.py"]
    assert listed(include=["*.py"]) == ["a.py"]
    assert listed(include=["pkg/*.py"]) == ["pkg/c.py"]
    assert listed(include=["pkg/**"]) == ["pkg/c.py", "pkg/deep/d.py"]
    assert listed(include=["?.txt", "sub/*/*.py"]) == ["b.txt", "sub/x/f.py"]
    assert listed(include=["**/*.py"], exclude=["**/deep/**", "*.py"]) == [
        "pkg/c.py", "sub/e.py", "sub/x/f.py", "subway/g.py"
    ]


def test_directory_sampling_is_deterministic_and_seeded(tmp_path):
    root = tmp_path / "src"
    for i in range(20):
        write(root / f"m{i:02d}.py", f"x = {i}\n")

    def sample(seed: int) -> list[str]:
        docs, report = read_source(DirectorySource(name="s", root=str(root), max_documents=5, sample_seed=seed))
        assert report.candidates == 20
        return paths(docs)

    first = sample(0)
    assert len(first) == 5 and first == sorted(first)
    assert sample(0) == first  # same seed, same documents
    assert sample(1) != first  # another seed, another sample
    assert len(paths(read_source(DirectorySource(name="s", root=str(root), max_documents=50))[0])) == 20


def test_directory_max_file_bytes_skips_and_counts(tmp_path):
    root = tmp_path / "src"
    write(root / "small.py", "s = 1\n")
    big = write(root / "big.py", "b = 1\n" * 100)
    docs, report = read_source(DirectorySource(name="s", root=str(root), max_file_bytes=100))
    assert paths(docs) == ["small.py"]
    assert report.skipped == {"too_large": 1} and report.examples == {"too_large": [str(big)]}
    assert report.candidates == 1


def test_directory_license_from_dist_info(tmp_path):
    site = tmp_path / "site"
    write(site / "foo" / "__init__.py", "from foo.core import x\n")
    write(site / "foo" / "core.py", "x = 1\n")
    write(site / "loose.py", "y = 2\n")  # owned by no distribution
    dist_info(site, "foo", "1.0", "", headers="License-Expression: Apache-2.0",
              record=["foo/__init__.py", "foo/core.py"])
    write(site / "bar" / "__init__.py", "z = 3\n")
    dist_info(site, "bar", "2.0", "", headers="Classifier: License :: OSI Approved :: MIT License",
              record=["bar/__init__.py"])

    source = DirectorySource(name="site", root=str(site), license_from_dist_info=True, license="fallback")
    licenses = {d["path"]: d["license"] for d in read_source(source)[0]}
    assert licenses == {
        "bar/__init__.py": "MIT License",
        "foo/__init__.py": "Apache-2.0",
        "foo/core.py": "Apache-2.0",
        "loose.py": "fallback",
    }


def test_jsonl_source_plain_and_gzip(tmp_path):
    jsonl(tmp_path / "in" / "a.jsonl", '{"text": "one"}', "", '{"text": "two", "id": 7}')
    jsonl(tmp_path / "in" / "b.jsonl.gz", '{"text": "three"}')
    docs, report = read_source(JsonlSource(name="j", paths=[str(tmp_path / "in" / "*")], language="prose"))
    assert [(d["path"], d["text"]) for d in docs] == [
        ("a.jsonl:1", "one"), ("a.jsonl:3", "two"), ("b.jsonl.gz:1", "three")
    ]
    assert {d["language"] for d in docs} == {"prose"} and report.candidates == 3
    # the same lines give the same documents whether or not the file is compressed
    jsonl(tmp_path / "gz" / "a.jsonl.gz", '{"text": "one"}', "", '{"text": "two", "id": 7}')
    zipped, _ = read_source(JsonlSource(name="j", paths=[str(tmp_path / "gz" / "a.jsonl.gz")], language="prose"))
    assert [(d["text"], d["doc_id"] != p["doc_id"]) for d, p in zip(zipped, docs)] == [("one", True), ("two", True)]
    assert [d["content_sha256"] for d in zipped] == [d["content_sha256"] for d in docs[:2]]


def test_jsonl_path_field_and_sampling(tmp_path):
    lines = [json.dumps({"body": f"doc {i}", "id": f"k{i:02d}"}) for i in range(12)]
    path = jsonl(tmp_path / "d.jsonl", *lines)
    source = JsonlSource(name="j", paths=[str(path)], text_field="body", path_field="id", max_documents=4)
    docs, report = read_source(source)
    assert len(docs) == 4 and all(d["text"] == f"doc {int(d['path'][1:])}" for d in docs)
    assert report.candidates == 12
    assert paths(read_source(source)[0]) == paths(docs)
    assert paths(read_source(source.model_copy(update={"sample_seed": 3}))[0]) != paths(docs)


def test_parquet_source(tmp_path):
    parquet(tmp_path / "p" / "part-0.parquet", text=["alpha", "beta"], key=["a", "b"])
    parquet(tmp_path / "p" / "part-1.parquet", text=["gamma"], key=["c"])
    docs, report = read_source(ParquetSource(name="pq", paths=[str(tmp_path / "p" / "*.parquet")]))
    assert [(d["path"], d["text"]) for d in docs] == [
        ("part-0.parquet#0", "alpha"), ("part-0.parquet#1", "beta"), ("part-1.parquet#0", "gamma")
    ]
    assert report.candidates == 3
    keyed, _ = read_source(ParquetSource(name="pq", paths=[str(tmp_path / "p" / "*.parquet")], path_field="key"))
    assert [(d["path"], d["text"]) for d in keyed] == [("a", "alpha"), ("b", "beta"), ("c", "gamma")]


def test_package_docs_source(tmp_path):
    site = tmp_path / "site"
    dist_info(site, "foo", "1.0", LONG_README,
              headers="License: BSD-3-Clause\nDescription-Content-Type: text/markdown")
    dist_info(site, "tiny", "0.1", "too short")
    docs, report = read_source(PackageDocsSource(name="docs", root=str(site)))
    [doc] = docs
    assert doc["path"] == "foo-1.0/METADATA"
    assert doc["text"] == LONG_README.strip() + "\n"
    assert doc["language"] == "markdown" and doc["license"] == "BSD-3-Clause"
    assert report.candidates == 2
    assert report.skipped == {"too_short": 1} and report.examples == {"too_short": ["tiny-0.1/METADATA"]}


# -- bad inputs: a SourceError naming the file and problem, and nothing committed ------------------


def _dir_dangling_symlink(tmp: Path):
    root = tmp / "src"
    write(root / "a.py", "a = 1\n")
    (root / "x.py").symlink_to("missing")  # as root chmod cannot make a file unreadable; this can
    return DirectorySource(name="bad", root=str(root)), [f"cannot read {root / 'x.py'}", "No such file"]


def _dir_invalid_utf8(tmp: Path):
    root = tmp / "src"
    write(root / "a.py", "a = 1\n")
    write(root / "bad.py", b"s = '\xff'\n")
    return DirectorySource(name="bad", root=str(root)), [f"{root / 'bad.py'}: invalid UTF-8 at byte 5"]


def _dir_missing_root(tmp: Path):
    return DirectorySource(name="bad", root=str(tmp / "nope")), [f"root {tmp / 'nope'} does not exist"]


def _jsonl_malformed_line(tmp: Path):
    path = jsonl(tmp / "d.jsonl", '{"text": "ok"}', '{"text": "ok"}', '{"text": "cut')
    return JsonlSource(name="bad", paths=[str(path)]), [f"{path}:3: malformed JSON"]


def _jsonl_gz_malformed_line(tmp: Path):
    path = jsonl(tmp / "d.jsonl.gz", '{"text": "ok"}', "not json")
    return JsonlSource(name="bad", paths=[str(path)]), [f"{path}:2: malformed JSON"]


def _jsonl_missing_text_field(tmp: Path):
    path = jsonl(tmp / "d.jsonl", '{"text": "ok"}', '{"body": "no text here"}')
    return JsonlSource(name="bad", paths=[str(path)]), [f"{path}:2: field 'text' is missing or not a string"]


def _jsonl_text_not_a_string(tmp: Path):
    path = jsonl(tmp / "d.jsonl", '{"text": 42}')
    return JsonlSource(name="bad", paths=[str(path)]), [f"{path}:1: field 'text' is missing or not a string"]


def _jsonl_not_an_object(tmp: Path):
    path = jsonl(tmp / "d.jsonl", '["text"]')
    return JsonlSource(name="bad", paths=[str(path)]), [f"{path}:1: expected a JSON object, got list"]


def _jsonl_missing_path_field(tmp: Path):
    path = jsonl(tmp / "d.jsonl", '{"text": "ok", "id": 1}', '{"text": "ok"}')
    return JsonlSource(name="bad", paths=[str(path)], path_field="id"), [f"{path}:2: field 'id' is missing"]


def _jsonl_invalid_utf8(tmp: Path):
    path = jsonl(tmp / "d.jsonl", '{"text": "ok"}', b'{"text": "\xc3("}')
    return JsonlSource(name="bad", paths=[str(path)]), [f"{path}:2: invalid UTF-8"]


def _jsonl_missing_file(tmp: Path):
    return JsonlSource(name="bad", paths=[str(tmp / "nope.jsonl")]), [f"{tmp / 'nope.jsonl'}: no such file"]


def _jsonl_glob_matches_nothing(tmp: Path):
    (tmp / "empty").mkdir()
    pattern = str(tmp / "empty" / "*.jsonl")
    return JsonlSource(name="bad", paths=[pattern]), [f"{pattern}: no such file (or no file matches)"]


def _parquet_int_text(tmp: Path):
    path = parquet(tmp / "d.parquet", text=[1, 2])
    source = ParquetSource(name="bad", paths=[str(path)])
    return source, [f"{path}: wrong schema: needs string column 'text'", "found text: int64"]


def _parquet_missing_column(tmp: Path):
    path = parquet(tmp / "d.parquet", body=["a"])
    source = ParquetSource(name="bad", paths=[str(path)])
    return source, [f"{path}: wrong schema: needs string column 'text'", "found body: string"]


def _parquet_missing_path_column(tmp: Path):
    path = parquet(tmp / "d.parquet", text=["a"])
    source = ParquetSource(name="bad", paths=[str(path)], path_field="key")
    return source, [f"{path}: wrong schema: needs string column 'key'"]


def _parquet_null_text(tmp: Path):
    path = parquet(tmp / "d.parquet", text=["a", None])
    return ParquetSource(name="bad", paths=[str(path)]), [f"{path}#row1: text is null"]


def _parquet_not_parquet(tmp: Path):
    path = write(tmp / "d.parquet", b"this is not parquet at all")
    return ParquetSource(name="bad", paths=[str(path)]), [f"cannot read {path} as Parquet"]


def _parquet_glob_matches_nothing(tmp: Path):
    pattern = str(tmp / "*.parquet")
    return ParquetSource(name="bad", paths=[pattern]), [f"{pattern}: no such file (or no file matches)"]


def _package_docs_missing_root(tmp: Path):
    return PackageDocsSource(name="bad", root=str(tmp / "nope")), [f"root {tmp / 'nope'} does not exist"]


BAD_INPUTS = {f.__name__[1:]: f for f in [
    _dir_dangling_symlink, _dir_invalid_utf8, _dir_missing_root,
    _jsonl_malformed_line, _jsonl_gz_malformed_line, _jsonl_missing_text_field, _jsonl_text_not_a_string,
    _jsonl_not_an_object, _jsonl_missing_path_field, _jsonl_invalid_utf8, _jsonl_missing_file,
    _jsonl_glob_matches_nothing,
    _parquet_int_text, _parquet_missing_column, _parquet_missing_path_column, _parquet_null_text,
    _parquet_not_parquet, _parquet_glob_matches_nothing,
    _package_docs_missing_root,
]}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_input_names_file_and_problem_and_commits_nothing(case, lake, tmp_path):
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    source, fragments = BAD_INPUTS[case](inputs)

    with pytest.raises(SourceError) as raised:
        read_source(source)
    message = str(raised.value)
    assert message.startswith("source bad: ")
    for fragment in fragments:
        assert fragment in message

    # through ingest: the table is never created ...
    with pytest.raises(SourceError, match="source bad: "):
        ingest_source(lake, source)
    assert not lake.has_table("raw.bad") and lake.lineage.records() == []

    # ... and an existing table keeps its snapshot, rows and lineage
    good = tmp_path / "good"
    write(good / "ok.py", "ok = True\n")
    first = ingest_source(lake, DirectorySource(name="bad", root=str(good)))
    with pytest.raises(SourceError, match="source bad: "):
        ingest_source(lake, source)
    assert lake.current_snapshot_id("raw.bad") == first.snapshot_id
    assert len(lake.table("raw.bad").snapshots()) == 1
    assert lake.table("raw.bad").scan().to_arrow()["path"].to_pylist() == ["ok.py"]
    assert len(lake.lineage.records()) == 1


# -- on_invalid="skip": skipped and counted by reason ---------------------------------------------


def test_directory_skip_counts_by_reason(tmp_path):
    root = tmp_path / "src"
    write(root / "a.py", "a = 1\n")
    write(root / "bad.py", b"\xff\xfe\n")
    (root / "x.py").symlink_to("missing")
    docs, report = read_source(DirectorySource(name="s", root=str(root), on_invalid="skip"))
    assert paths(docs) == ["a.py"]
    assert report.candidates == 3
    assert report.skipped == {"invalid_utf8": 1, "unreadable": 1}
    assert report.examples == {"invalid_utf8": [str(root / "bad.py")], "unreadable": [str(root / "x.py")]}


def test_jsonl_skip_counts_by_reason(tmp_path):
    path = jsonl(tmp_path / "d.jsonl", '{"text": "first"}', "{oops", '{"body": 1}', b'{"text": "\xff"}', "", "[]",
                 '{"text": "last"}')
    docs, report = read_source(JsonlSource(name="s", paths=[str(path)], on_invalid="skip"))
    assert [(d["path"], d["text"]) for d in docs] == [("d.jsonl:1", "first"), ("d.jsonl:7", "last")]
    assert report.candidates == 2
    assert report.skipped == {"malformed_record": 3, "invalid_utf8": 1}
    assert report.examples["malformed_record"] == [f"{path}:2", f"{path}:3", f"{path}:6"]
    assert report.examples["invalid_utf8"] == [f"{path}:4"]


def test_parquet_skip_counts_null_text(tmp_path):
    path = parquet(tmp_path / "d.parquet", text=["a", None, "c", None])
    docs, report = read_source(ParquetSource(name="s", paths=[str(path)], on_invalid="skip"))
    assert [d["text"] for d in docs] == ["a", "c"]
    assert report.skipped == {"null_text": 2} and report.examples["null_text"] == [f"{path}#row1", f"{path}#row3"]


def test_skips_reach_the_ingest_result_and_lineage(lake, tmp_path):
    root = tmp_path / "src"
    write(root / "a.py", "a = 1\n")
    write(root / "b.py", b"\xff\n")
    result = ingest_source(lake, DirectorySource(name="s", root=str(root), on_invalid="skip"))
    assert result.committed and result.documents == 1 and result.candidates == 2
    assert result.skipped == {"invalid_utf8": 1}
    assert result.skipped_examples == {"invalid_utf8": [str(root / "b.py")]}
    [row] = lake.lineage.records()
    assert row.metadata == {"documents": 1, "bytes": 6, "skipped": {"invalid_utf8": 1}, "read_from": [str(root)]}


# -- configs -------------------------------------------------------------------------------------


def test_source_configs_are_validated_frozen_and_discriminated():
    with pytest.raises(pydantic.ValidationError, match="name"):
        DirectorySource(name="Bad-Name", root="/x")
    with pytest.raises(pydantic.ValidationError, match="max_documents"):
        JsonlSource(name="j", paths=["/x.jsonl"], max_documents=0)
    with pytest.raises(pydantic.ValidationError, match="paths"):
        ParquetSource(name="p", paths=[])
    with pytest.raises(pydantic.ValidationError, match="bogus"):
        DirectorySource(name="d", root="/x", bogus=1)
    source = DirectorySource(name="d", root="/x")
    with pytest.raises(pydantic.ValidationError):
        source.root = "/y"
    adapter = pydantic.TypeAdapter(SourceConfig)
    assert isinstance(adapter.validate_python({"kind": "jsonl", "name": "j", "paths": ["/a"]}), JsonlSource)
    with pytest.raises(pydantic.ValidationError, match="kind"):
        adapter.validate_python({"kind": "csv", "name": "c"})


@pytest.mark.parametrize("name", list(embedded.EMBEDDED))
def test_embedded_source_configs_validate(name):
    adapter = pydantic.TypeAdapter(SourceConfig)
    for full in (False, True):
        config = embedded.embedded_source(name, full=full)
        assert config.name == name
        assert adapter.validate_python(config.model_dump()) == config  # round-trips through validation
        assert config.on_invalid == "skip"
    demo, full = embedded.embedded_source(name), embedded.embedded_source(name, full=True)
    if isinstance(demo, DirectorySource):
        assert full.max_file_bytes is None and full.max_documents is None  # full lifts the caps
        assert demo.max_file_bytes is not None


def test_unknown_embedded_source_lists_the_known_ones():
    known = "python_stdlib, site_packages, package_docs"
    with pytest.raises(KeyError, match=f"unknown source 'nope'; embedded sources: {known}"):
        embedded.embedded_source("nope")


def test_fsspec_urls_read_like_local_paths(tmp_path):
    """Roots and paths may be fsspec URLs: `file://` takes the local walker, `memory://` the
    generic `find`/`glob` path that object stores use too."""
    import fsspec

    root = tmp_path / "repo"
    write(root / "a.py", "A = 1\n")
    write(root / "sub" / "b.py", "B = 2\n")
    local = read_source(DirectorySource(name="u", root=str(root)))[0]
    via_url = read_source(DirectorySource(name="u", root=root.as_uri()))[0]
    assert [d["doc_id"] for d in via_url] == [d["doc_id"] for d in local]
    assert [d["path"] for d in via_url] == ["a.py", "sub/b.py"]

    mem = fsspec.filesystem("memory")
    mem.pipe("/factory-test/src/x.py", b"X = 1\n")
    mem.pipe("/factory-test/src/pkg/y.py", b"Y = 2\n")
    mem.pipe("/factory-test/data/part-0.jsonl", b'{"text": "one"}\n{"text": "two"}\n')
    try:
        docs, _ = read_source(DirectorySource(name="m", root="memory://factory-test/src"))
        assert [(d["path"], d["text"]) for d in docs] == [("pkg/y.py", "Y = 2\n"), ("x.py", "X = 1\n")]
        docs, _ = read_source(JsonlSource(name="m", paths=["memory://factory-test/data/*.jsonl"]))
        assert [d["text"] for d in docs] == ["one", "two"]
        with pytest.raises(SourceError, match="memory://factory-test/nothing/\\*.jsonl: no such file"):
            read_source(JsonlSource(name="m", paths=["memory://factory-test/nothing/*.jsonl"]))
    finally:
        mem.rm("/factory-test", recursive=True)
