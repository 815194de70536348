"""Shared fixtures. Everything here is real and local: a pyiceberg `SqlCatalog` on sqlite with a
`file://` warehouse under the test's own `tmp_path` — no servers, no network, runs on CPU.

`corpus` builds refined-like tables (the `REFINED_DOCUMENTS` schema) from real standard-library
text — the modules of a few packages as code, top-level modules' docstrings as prose — and commits
them to a lake; the mix, tokenizer, Dagster mix-asset and `factory mix` CLI tests all use it."""

from __future__ import annotations

import ast
import hashlib
import sysconfig
from pathlib import Path

import pyarrow as pa
import pytest

from factory.lake import CommitStamp, Lake
from factory.lake.schemas import REFINED_DOCUMENTS

STDLIB = Path(sysconfig.get_paths()["stdlib"])


class Corpus:
    """Rows of real standard-library text shaped like a refined table, and a way to commit them.

    A row's `doc_id` is `sha256("<table>/<path>")[:24]` (path relative to the stdlib directory, or
    the module's file name for a docstring), so the same table and file always give the same id;
    `source` is the table name without its namespace (`refined.python_stdlib` -> `python_stdlib`)."""

    stamp = CommitStamp(asset_key="test", config_hash="")

    @staticmethod
    def row(table: str, path: str, text: str, kind: str) -> dict:
        return {"doc_id": hashlib.sha256(f"{table}/{path}".encode()).hexdigest()[:24], "source": table.split(".")[1],
                "path": path, "text": text, "language": "python" if kind == "code" else "text", "kind": kind,
                "bytes": len(text.encode()), "content_sha256": hashlib.sha256(text.encode()).hexdigest()}

    def code(self, table: str, packages: list[str]) -> list[dict]:
        """The non-empty `.py` files of the stdlib `packages` (recursively, each in path order) as code."""
        rows = []
        for package in packages:
            for path in sorted((STDLIB / package).rglob("*.py")):
                text = path.read_text(encoding="utf-8")
                if text.strip():
                    rows.append(self.row(table, str(path.relative_to(STDLIB)), text, "code"))
        return rows

    def docstrings(self, table: str, skip: int = 0, count: int = 40) -> list[dict]:
        """Module docstrings (prose) of top-level stdlib modules, in name order, at least 300 chars:
        `count` of them after the first `skip`."""
        rows = []
        for path in sorted(STDLIB.glob("*.py")):
            try:
                doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")))
            except (SyntaxError, UnicodeDecodeError):
                continue
            if doc and len(doc) >= 300:
                rows.append(self.row(table, path.name, doc, "prose"))
        return rows[skip:skip + count]

    def write(self, lake: Lake, table: str, rows: list[dict], chunks: int = 1) -> int:
        """Commit `rows` to `table` as `chunks` appends (several data files; no rows: one empty
        append) and return the last snapshot id."""
        step, snapshot = max(1, -(-len(rows) // chunks)), None
        for i in range(0, max(len(rows), 1), step):
            data = pa.Table.from_pylist(rows[i:i + step], schema=REFINED_DOCUMENTS.as_arrow())
            snapshot = lake.commit(table, data, self.stamp, schema=REFINED_DOCUMENTS).snapshot_id
        return snapshot


@pytest.fixture(scope="session")
def corpus() -> Corpus:
    """Builds and commits refined-like rows of standard-library text (see `Corpus`)."""
    return Corpus()


@pytest.fixture
def lake(tmp_path):
    """An empty embedded lake with `FACTORY_HOME` = `tmp_path` (its state lives in `tmp_path/lake`;
    put test inputs in another subdirectory)."""
    return Lake.open(home=tmp_path)
