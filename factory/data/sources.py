"""Source configs: a directory glob, JSONL, Parquet, and installed packages' docs.

A source is a validated, frozen config (a discriminated union on `kind`); `factory.data.readers`
turns one into documents — plain dicts in the `raw.*` schema minus the ingest time — plus a
`ReadReport` of what was seen and skipped. Paths may be local or fsspec URLs. This module also
holds what every reader shares: the document row (with its stable `doc_id`), the error type and
the root placeholders resolved at read time.

The error contract: every bad input becomes a `SourceError` naming it (file, and line or row) and
the problem, or — `on_invalid="skip"` — a skip counted by reason in the `ReadReport`; a read with
no documents is an error unless `allow_empty`, and an ingest that would drop more than
`max_shrink` of the table's rows is one too (`factory.data.ingest`).
"""

from __future__ import annotations

import hashlib
import sysconfig
from collections import Counter
from dataclasses import dataclass, field
from typing import Annotated, Any, Callable, Literal, Union

from pydantic import BaseModel, ConfigDict, Field

Progress = Callable[[int, int], None]

LANGUAGES = {
    ".py": "python", ".pyi": "python", ".md": "markdown", ".rst": "rst", ".txt": "text",
    ".c": "c", ".h": "c", ".cc": "cpp", ".cpp": "cpp", ".hpp": "cpp", ".js": "javascript",
    ".ts": "typescript", ".json": "json", ".toml": "toml", ".yaml": "yaml", ".yml": "yaml",
    ".sh": "shell", ".html": "html", ".css": "css", ".sql": "sql", ".rs": "rust", ".go": "go",
}
ROOT_PLACEHOLDERS = {
    "{stdlib}": lambda: sysconfig.get_paths()["stdlib"],
    "{purelib}": lambda: sysconfig.get_paths()["purelib"],
}


class SourceError(ValueError):
    """A source input is missing, unreadable or malformed; the message names it."""


class _Source(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(pattern=r"^[a-z][a-z0-9_]*$", description="Table name under `raw.`.")
    license: str | None = Field(None, description="License of every document, when known.")
    max_documents: int | None = Field(
        None, gt=0, description="Deterministic cap on documents (None: all)."
    )
    sample_seed: int = Field(0, description="Salt of the deterministic sample.")
    on_invalid: Literal["error", "skip"] = Field(
        "error", description="A bad input (file, line or row: invalid UTF-8, malformed record, corrupt or "
                             "non-regular file, ...): fail naming it, or skip it and count it by reason."
    )
    allow_empty: bool = Field(False, description="A read with no documents is fine (default: an error).")
    max_shrink: float = Field(
        0.5, ge=0, le=1, description="Largest share of the table's current rows a new ingest may drop; "
                                     "more is an error, nothing committed (1: any)."
    )


class DirectorySource(_Source):
    """Files under a root matching glob patterns; language from the extension."""

    kind: Literal["directory"] = "directory"
    root: str = Field(description="Local path or fsspec URL; `{stdlib}` and `{purelib}` resolve at read time.")
    include: list[str] = Field(default_factory=lambda: ["**/*.py"], description="Globs relative to root.")
    exclude: list[str] = Field(default_factory=list, description="Globs relative to root.")
    max_file_bytes: int | None = Field(
        None, gt=0, description="Larger files are skipped (bytes), whatever the listing says: reads stop at the cap."
    )
    license_from_dist_info: bool = Field(
        False, description="Take each file's license from the installed distribution that owns it."
    )
    follow_external_symlinks: bool = Field(
        False, description="Read symlinks whose target is outside the root (default: refused, like a bad input)."
    )


class JsonlSource(_Source):
    """JSON Lines files (optionally compressed); one document per line."""

    kind: Literal["jsonl"] = "jsonl"
    paths: list[str] = Field(min_length=1, description="Files or globs, local or fsspec URLs.")
    text_field: str = "text"
    path_field: str | None = Field(None, description="Field used as the document path (default file:line).")
    language: str = "text"


class ParquetSource(_Source):
    """Parquet files with a string text column."""

    kind: Literal["parquet"] = "parquet"
    paths: list[str] = Field(min_length=1, description="Files or globs, local or fsspec URLs.")
    text_field: str = "text"
    path_field: str | None = None
    language: str = "text"


class PackageDocsSource(_Source):
    """Long descriptions from installed distributions' METADATA files."""

    kind: Literal["package_docs"] = "package_docs"
    root: str = Field("{purelib}", description="A site-packages directory.")
    min_chars: int = Field(200, ge=0, description="Shorter descriptions are skipped (characters).")


SourceConfig = Annotated[
    Union[DirectorySource, JsonlSource, ParquetSource, PackageDocsSource], Field(discriminator="kind")
]


@dataclass
class ReadReport:
    """What a read saw: candidates, documents produced, and skips by reason (with examples)."""

    candidates: int = 0
    skipped: Counter = field(default_factory=Counter)
    examples: dict[str, list[str]] = field(default_factory=dict)

    def skip(self, reason: str, where: str) -> None:
        self.skipped[reason] += 1
        self.examples.setdefault(reason, [])
        if len(self.examples[reason]) < 3:
            self.examples[reason].append(where)


def resolve_root(root: str) -> str:
    return ROOT_PLACEHOLDERS[root]() if root in ROOT_PLACEHOLDERS else root


def document(source: str, path: str, text: str, language: str, license: str | None) -> dict[str, Any]:
    """A document row; `doc_id` is stable: the same source, path and content give the same id."""
    data = text.encode("utf-8")
    content = hashlib.sha256(data).hexdigest()
    doc_id = hashlib.sha256(f"{source}\0{path}\0{content}".encode()).hexdigest()[:24]
    return {
        "doc_id": doc_id, "source": source, "path": path, "text": text, "language": language,
        "bytes": len(data), "license": license, "content_sha256": content,
    }
