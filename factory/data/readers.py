"""Readers: turn a source config into documents plus a `ReadReport`.

One reader per source kind. Every failure of an input — a file, a line, a row — is a `Rejected`
naming it (file, and line or row) and the problem; `on_invalid` decides what becomes of it: a
`SourceError` with that message, or a skip counted by reason in the report, so nothing
disappears silently and nothing escapes as a raw exception. A file that fails part-way (a
truncated `.jsonl.gz`, a Parquet file that stops decoding) is skipped whole: its other lines are
not trusted either. A location that cannot be opened at all (a missing root, a glob that
matches nothing, a URL scheme no installed file system serves) is an error in both modes —
skipping it would be a source that silently shrinks. So is a read with no documents, unless the
source says `allow_empty`.

Sampling is deterministic: a source capped at N documents keeps the N whose `sha256(seed:path)`
rank lowest, independent of listing order. Directories are walked by `factory.data.files`, which
opens regular files only, keeps symlinks inside the root and bounds every read.
"""

from __future__ import annotations

import email.parser
import gzip
import hashlib
import json
import lzma
import zlib
from importlib import metadata as importlib_metadata
from pathlib import PurePosixPath
from typing import Any, Callable, Iterator

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq

from factory.data.files import Rejected, glob_regex, list_files, printable, read_file
from factory.data.sources import (
    LANGUAGES,
    DirectorySource,
    JsonlSource,
    PackageDocsSource,
    ParquetSource,
    Progress,
    ReadReport,
    SourceConfig,
    SourceError,
    _Source,
    document,
    resolve_root,
)

# What a damaged compressed stream raises while it is read (gzip.BadGzipFile is an OSError).
DECOMPRESS_ERRORS = (EOFError, zlib.error, lzma.LZMAError, gzip.BadGzipFile)


def read_source(source: SourceConfig, progress: Progress | None = None) -> tuple[list[dict], ReadReport]:
    """All documents of `source` (sorted by path) and the report of the read."""
    report = ReadReport()
    reader = {
        "directory": _read_directory, "jsonl": _read_jsonl,
        "parquet": _read_parquet, "package_docs": _read_package_docs,
    }[source.kind]
    docs = list(reader(source, report, progress or (lambda done, total: None)))
    if source.kind != "directory" and source.max_documents is not None:
        docs = _sample(docs, source, key=lambda d: d["path"])
    if not docs and not source.allow_empty:
        raise SourceError(_empty_message(source, report))
    return sorted(docs, key=lambda d: d["path"]), report


def reject(source: _Source, report: ReadReport, bad: Rejected) -> None:
    """Skip-and-count `bad` (on_invalid="skip") or raise it as the source's `SourceError`."""
    if source.on_invalid == "skip":
        report.skip(bad.reason, bad.where)
        return
    raise SourceError(f"source {source.name}: {bad.message}") from None


def filesystem(source: _Source, url: str) -> tuple[Any, str]:
    """fsspec's file system and path for `url`; an unknown scheme, or one whose implementation is
    not installed (`s3://` without s3fs), is a `SourceError` naming the URL."""
    protocol = fsspec.utils.get_protocol(url)
    try:
        return fsspec.core.url_to_fs(url)
    except ImportError as exc:  # fsspec's registry knows the scheme; its package is missing
        raise SourceError(f"source {source.name}: {url}: no file system for {protocol}:// is installed ({exc})") from None
    except ValueError as exc:
        if protocol not in fsspec.available_protocols():
            raise SourceError(f"source {source.name}: {url}: unknown URL scheme {protocol}:// (no fsspec file system "
                              "serves it)") from None
        raise SourceError(f"source {source.name}: {url}: cannot open: {exc}") from None


def _empty_message(source: SourceConfig, report: ReadReport) -> str:
    if isinstance(source, DirectorySource):
        where = f"{resolve_root(source.root)} (include {source.include}, exclude {source.exclude})"
    elif hasattr(source, "paths"):
        where = ", ".join(source.paths)
    else:
        where = resolve_root(source.root)
    if report.skipped:
        why = "every candidate was skipped: " + "; ".join(
            f"{reason} {n} (e.g. {report.examples[reason][0]})" for reason, n in report.skipped.items())
    else:
        why = "no file matches" if isinstance(source, DirectorySource) else "no records"
    return (f"source {source.name}: no documents from {where}: {why}. A source that reads nothing is an error "
            "(a typo'd glob would replace the table with an empty snapshot); set allow_empty: true if empty is fine")


def _sample(items: list, source: _Source, key: Callable[[Any], str]) -> list:
    if source.max_documents is None or len(items) <= source.max_documents:
        return items
    rank = lambda item: hashlib.sha256(f"{source.sample_seed}:{key(item)}".encode()).digest()  # noqa: E731
    return sorted(items, key=rank)[: source.max_documents]


def _decode(data: bytes, where: str, source: _Source, report: ReadReport) -> str | None:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        reject(source, report, Rejected("invalid_utf8", where, f"{where}: invalid UTF-8 at byte {exc.start} ({exc.reason})"))
        return None


def _read_directory(source: DirectorySource, report: ReadReport, progress: Progress) -> Iterator[dict]:
    root = resolve_root(source.root)
    fs, base = filesystem(source, root)
    if not fs.isdir(base):
        raise SourceError(f"source {source.name}: root {root} does not exist or is not a directory")
    include = [glob_regex(p) for p in source.include]
    exclude = [glob_regex(p) for p in source.exclude]
    base = base.rstrip("/")
    pruned = [glob_regex(p[:-3]) for p in source.exclude if p.endswith("/**")]
    candidates = []
    for entry in list_files(fs, base, pruned, source.follow_external_symlinks, on_bad=lambda bad: reject(source, report, bad)):
        if not any(r.match(entry.rel) for r in include) or any(r.match(entry.rel) for r in exclude):
            continue
        if entry.rejected is not None:
            reject(source, report, entry.rejected)
        elif source.max_file_bytes is not None and entry.size > source.max_file_bytes:
            report.skip("too_large", entry.full)  # a filter, in either mode
        else:
            candidates.append(entry)
    report.candidates = len(candidates)
    chosen = sorted(_sample(candidates, source, key=lambda e: e.rel), key=lambda e: e.rel)
    licenses = _dist_licenses(base, source, report) if source.license_from_dist_info else {}
    for n, entry in enumerate(chosen, 1):
        try:
            data = read_file(fs, entry, source.max_file_bytes, source.follow_external_symlinks)
        except Rejected as bad:
            if bad.reason == "too_large":
                report.skip(bad.reason, bad.where)
            else:
                reject(source, report, bad)
            data = None
        text = _decode(data, entry.full, source, report) if data is not None else None
        if text is not None:
            language = LANGUAGES.get(PurePosixPath(entry.rel).suffix.lower(), "text")
            yield document(source.name, entry.rel, text, language, licenses.get(entry.rel, source.license))
        if n % 500 == 0 or n == len(chosen):
            progress(n, len(chosen))


def _expand(source: JsonlSource | ParquetSource, report: ReadReport) -> list[tuple[Any, str]]:
    files = []
    for pattern in source.paths:
        fs, path = filesystem(source, pattern)
        matches = sorted(fs.glob(path)) if any(c in path for c in "*?[") else [path]
        matches = [m for m in matches if fs.isfile(m)]
        if not matches:
            raise SourceError(f"source {source.name}: {pattern}: no such file (or no file matches)")
        for m in matches:
            if printable(m) != m:  # not UTF-8: no document path (nor Iceberg string) can hold it
                reject(source, report, Rejected("invalid_file_name", printable(m),
                                                f"{printable(m)}: file name is not valid UTF-8"))
            else:
                files.append((fs, m))
    return files


def _read_jsonl(source: JsonlSource, report: ReadReport, progress: Progress) -> Iterator[dict]:
    files = _expand(source, report)
    for n, (fs, path) in enumerate(files, 1):
        yield from _jsonl_file(source, fs, path, report)
        progress(n, len(files))


def _jsonl_file(source: JsonlSource, fs, path: str, report: ReadReport) -> list[dict]:
    """The documents of one file, streamed line by line; a file that cannot be read to its end
    gives none (see the module docstring)."""
    docs, lineno = [], 0
    try:
        with fs.open(path, "rb", compression="infer") as fh:
            for lineno, raw in enumerate(fh, 1):
                if not raw.strip():
                    continue
                where = f"{path}:{lineno}"
                line = _decode(raw, where, source, report)
                if line is None:
                    continue
                record, problem = _parse_record(line, source)
                if problem:
                    reject(source, report, Rejected("malformed_record", where, f"{where}: {problem}"))
                    continue
                report.candidates += 1
                doc_path = str(record[source.path_field]) if source.path_field else f"{PurePosixPath(path).name}:{lineno}"
                docs.append(document(source.name, doc_path, record[source.text_field], source.language, source.license))
    except DECOMPRESS_ERRORS as exc:
        # decompression runs a buffer ahead of the lines, so the damage is past line N, not at N + 1
        reject(source, report, Rejected("unreadable", path, f"{path}: corrupt or truncated compressed data ({lineno} "
                                                            f"lines read before it; {type(exc).__name__}: {exc})"))
        return []
    except OSError as exc:
        reject(source, report, Rejected("unreadable", path, f"cannot read {path}: {exc}"))
        return []
    return docs


def _parse_record(line: str, source: JsonlSource) -> tuple[dict, str | None]:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as exc:
        return {}, f"malformed JSON ({exc.msg} at column {exc.colno})"
    if not isinstance(record, dict):
        return {}, f"expected a JSON object, got {type(record).__name__}"
    if not isinstance(record.get(source.text_field), str):
        return {}, f"field {source.text_field!r} is missing or not a string"
    if source.path_field and source.path_field not in record:
        return {}, f"field {source.path_field!r} is missing"
    # JSON's \ud800 escapes decode to lone surrogates: valid JSON, but no UTF-8 (nor Iceberg string) holds them
    for name, value in [(source.text_field, record[source.text_field])] + (
            [(source.path_field, str(record[source.path_field]))] if source.path_field else []):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            return {}, f"field {name!r} is not valid Unicode (lone surrogate {ascii(value[exc.start])} at character {exc.start})"
    return record, None


def _read_parquet(source: ParquetSource, report: ReadReport, progress: Progress) -> Iterator[dict]:
    files = _expand(source, report)
    for n, (fs, path) in enumerate(files, 1):
        yield from _parquet_file(source, fs, path, report)
        progress(n, len(files))


def _parquet_file(source: ParquetSource, fs, path: str, report: ReadReport) -> list[dict]:
    """The documents of one Parquet file; string columns are read as bytes and decoded here, so
    invalid UTF-8 is a row naming itself, not a `UnicodeDecodeError` from Arrow."""
    docs, row = [], 0
    wanted = [source.text_field] + ([source.path_field] if source.path_field else [])
    try:
        with fs.open(path, "rb") as fh:
            pf = pq.ParquetFile(fh)
            schema = pf.schema_arrow
            for col in wanted:
                if col not in schema.names or (col == source.text_field and not _is_string(schema.field(col).type)):
                    found = ", ".join(f"{f.name}: {f.type}" for f in schema)
                    reject(source, report, Rejected(
                        "wrong_schema", path, f"{path}: wrong schema: needs string column {col!r}, found {found}"))
                    return []
            for batch in pf.iter_batches(columns=wanted):
                texts = _column_values(batch.column(0))
                keys = _column_values(batch.column(1)) if source.path_field else None
                for i, raw in enumerate(texts):
                    where = f"{path}#row{row + i}"
                    if raw is None:
                        reject(source, report, Rejected("null_text", where, f"{where}: {source.text_field} is null"))
                        continue
                    text = _decode(raw, where, source, report)
                    if text is None:
                        continue
                    key = f"{PurePosixPath(path).name}#{row + i}" if keys is None else keys[i]
                    if isinstance(key, bytes) and (key := _decode(key, f"{where} ({source.path_field})", source,
                                                                  report)) is None:
                        continue
                    report.candidates += 1
                    docs.append(document(source.name, str(key), text, source.language, source.license))
                row += batch.num_rows
    except (OSError, pa.ArrowException) as exc:
        reject(source, report, Rejected("unreadable", path, f"cannot read {path} as Parquet: {exc}"))
        return []
    return docs


def _is_string(t: pa.DataType) -> bool:
    return pa.types.is_string(t) or pa.types.is_large_string(t)


def _column_values(column: pa.Array) -> list:
    """Python values of a column, string columns as undecoded bytes (the cast copies nothing)."""
    if _is_string(column.type):
        column = column.cast(pa.large_binary() if pa.types.is_large_string(column.type) else pa.binary())
    return column.to_pylist()


def _metadata_text(dist: importlib_metadata.Distribution, base: str, source: _Source, report: ReadReport) -> str | None:
    """A distribution's METADATA, or None when it is not UTF-8 (rejected, naming the file)."""
    try:
        return dist.read_text("METADATA") or ""
    except UnicodeDecodeError as exc:
        where = f"{getattr(dist, '_path', base)}/METADATA"  # PathDistribution's directory: the file's real name
        reject(source, report, Rejected("invalid_utf8", where, f"{where}: invalid UTF-8 at byte {exc.start} ({exc.reason})"))
        return None


def _read_package_docs(source: PackageDocsSource, report: ReadReport, progress: Progress) -> Iterator[dict]:
    root = resolve_root(source.root)
    fs, base = filesystem(source, root)
    if not fs.isdir(base):
        raise SourceError(f"source {source.name}: root {root} does not exist or is not a directory")
    messages = []
    for dist in importlib_metadata.distributions(path=[base]):
        if (text := _metadata_text(dist, base, source, report)) is not None:
            messages.append(email.parser.Parser().parsestr(text))
    messages.sort(key=lambda m: (m["Name"] or "").lower())
    for n, message in enumerate(messages, 1):
        where = f"{message['Name'] or 'unknown'}-{message['Version']}/METADATA"
        body = (message.get_payload() or message.get("Description") or "").strip()
        report.candidates += 1
        if len(body) < source.min_chars:
            report.skip("too_short", where)
            continue
        kind = (message.get("Description-Content-Type") or "").lower()
        language = "markdown" if "markdown" in kind else "rst" if "rst" in kind else "text"
        yield document(source.name, where, body + "\n", language, _license_of(message) or source.license)
        if n % 100 == 0 or n == len(messages):
            progress(n, len(messages))


def _license_of(message: Any) -> str | None:
    """SPDX expression, else a short License field, else the first OSI classifier."""
    if expr := message.get("License-Expression"):
        return expr.strip()
    lic = (message.get("License") or "").strip()
    if lic and "\n" not in lic and len(lic) <= 64 and lic.upper() != "UNKNOWN":
        return lic
    for classifier in message.get_all("Classifier") or []:
        if classifier.startswith("License ::"):
            return classifier.split("::")[-1].strip()
    return None


def _dist_licenses(base: str, source: _Source, report: ReadReport) -> dict[str, str]:
    """Map each file (relative to `base`) to the license of the distribution that installed it."""
    owners: dict[str, str] = {}
    for dist in importlib_metadata.distributions(path=[base]):
        text = _metadata_text(dist, base, source, report)
        lic = _license_of(email.parser.Parser().parsestr(text)) if text else None
        if lic:
            for f in dist.files or []:
                owners[str(f)] = lic
    return owners
