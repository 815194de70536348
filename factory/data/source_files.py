"""Sources declared in a YAML file, for `factory ingest --sources FILE [NAME ...]`.

The embedded sources are Python functions (`configs/sources.py`); a researcher's own corpus
should not need Python. A sources file is a mapping from source name (the `raw.<name>` table)
to that source's config — the same pydantic models, validated the same way:

    notes:                      # -> raw.notes
      kind: directory
      root: ~/notes             # relative paths are relative to this file
      include: ["**/*.md"]
      license: CC-BY-4.0
    dumps:
      kind: jsonl
      paths: ["s3://bucket/dumps/*.jsonl.gz"]
      on_invalid: skip

A bad file is one `SourceError` naming the file and every field path that is wrong
(`sources.yaml: notes.include.0: Input should be a valid string`); nothing is ingested from a
file that does not validate whole. Duplicate names are an error (plain YAML keeps the last one
silently). Local paths are resolved against the file's directory (and `~`) when loaded, so the
config stamped on the snapshot says where the data really was.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pydantic
import yaml

from factory.data.sources import SourceConfig, SourceError

_ADAPTER = pydantic.TypeAdapter(SourceConfig)
KINDS = "directory, jsonl, parquet, package_docs"


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses a mapping with the same key twice (two sources of one name)."""

    def construct_mapping(self, node, deep=False):
        seen: dict[Any, Any] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r} (first at line {seen[key].start_mark.line + 1})",
                    key_node.start_mark)
            seen[key] = key_node
        return super().construct_mapping(node, deep=deep)


def load_sources(path: str | Path) -> dict[str, SourceConfig]:
    """The sources of a YAML file, by name, in file order."""
    path = Path(path)
    try:
        raw = yaml.load(path.read_text(), Loader=_UniqueKeyLoader)  # noqa: S506 (a SafeLoader subclass)
    except OSError as exc:
        raise SourceError(f"sources file {path}: cannot read it ({exc.strerror})") from None
    except yaml.YAMLError as exc:
        raise SourceError(f"sources file {path}: not valid YAML: {_yaml_problem(exc)}") from None
    if not isinstance(raw, dict) or not raw:
        raise SourceError(f"sources file {path}: expected a mapping of source name to config "
                          f"(got {type(raw).__name__ if raw is not None else 'an empty file'})")
    sources, problems = {}, []
    for name, body in raw.items():
        if not isinstance(body, dict):
            problems.append(f"{name}: expected a mapping of config fields, got {type(body).__name__}")
            continue
        if "name" in body and body["name"] != name:
            problems.append(f"{name}.name: {body['name']!r} differs from its key (the key is the name; leave it out)")
            continue
        try:
            source = _ADAPTER.validate_python({**body, "name": name})
        except pydantic.ValidationError as exc:
            problems += [f"{_field_path(name, body, e)}: {_message(e)}" for e in exc.errors()]
            continue
        sources[name] = _resolve_paths(source, path.parent)
    if problems:
        raise SourceError(f"sources file {path}: " + "; ".join(problems))
    return sources


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """`line L, column C: problem (while ... from line L0)`, without PyYAML's source excerpt."""
    mark, problem = getattr(exc, "problem_mark", None), getattr(exc, "problem", None)
    if mark is None or problem is None:
        return " ".join(str(exc).split())
    where = f"line {mark.line + 1}, column {mark.column + 1}: {problem}"
    context, context_mark = getattr(exc, "context", None), getattr(exc, "context_mark", None)
    if context and context_mark is not None:
        where += f" ({context} from line {context_mark.line + 1})"
    return where


def _field_path(name: Any, body: dict, error: dict) -> str:
    loc = list(error["loc"])
    if loc and loc[0] == body.get("kind"):  # a discriminated union puts the tag first
        loc = loc[1:]
    if error["type"] in ("union_tag_not_found", "union_tag_invalid"):
        loc = ["kind"]
    return ".".join(str(p) for p in [name, *loc])


def _message(error: dict) -> str:
    if error["type"] == "union_tag_not_found":
        return f"Field required (one of {KINDS})"
    if error["type"] == "union_tag_invalid":
        return f"unknown kind {error['input'].get('kind')!r} (one of {KINDS})"
    return error["msg"]


def _resolve_paths(source: SourceConfig, base: Path) -> SourceConfig:
    if hasattr(source, "paths"):
        return source.model_copy(update={"paths": [_local(p, base) for p in source.paths]})
    return source.model_copy(update={"root": _local(source.root, base)})


def _local(location: str, base: Path) -> str:
    """`location` made absolute against `base` when it is a local path; URLs and the `{stdlib}`
    placeholders are left as they are."""
    if "://" in location or "::" in location or location.startswith("{"):
        return location
    return os.path.normpath(os.path.join(base.resolve(), os.path.expanduser(location)))
