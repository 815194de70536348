"""Materialization metadata as the Dagster UI shows it well: rounded numbers, inline tables.

The UI prints a float with every digit (`6.320006847381592`), shows Markdown inline only below
1,000 characters (longer goes behind "[Show Markdown]", see factory/train/plot.py), and always
shows a `TableMetadataValue` inline, as a real table. So every asset builds its metadata as a
plain dict and hands it to `display()`:

- a float becomes `MetadataValue.float` rounded to 4 significant digits (never fewer than its
  integer part: 1234.56 -> 1235, 6.320006847381592 -> 6.32), and floats inside JSON values
  are rounded the same way;
- every entry that rounding changed keeps its exact value in one `raw_values` JSON entry, so
  the display loses nothing (the Iceberg tables hold the exact values too);
- `first` names the entries that lead the page (the loss curve and the card of a run);
- `table()` turns rows into a `TableMetadataValue` whose floats are rounded alike.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from dagster import (
    FloatMetadataValue,
    JsonMetadataValue,
    MetadataValue,
    TableColumn,
    TableMetadataValue,
    TableRecord,
    TableSchema,
)

SIGNIFICANT = 4
RAW = "raw_values"


def rounded(x: float, digits: int = SIGNIFICANT) -> float:
    """`x` to `digits` significant digits, keeping every digit of its integer part."""
    if not math.isfinite(x) or x == 0:
        return x
    return round(x, max(0, digits - 1 - math.floor(math.log10(abs(x)))))


def _round_data(value: Any) -> Any:
    if isinstance(value, float):
        return rounded(value)
    if isinstance(value, Mapping):
        return {k: _round_data(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_round_data(v) for v in value]
    return value


def _shown(value: Any) -> tuple[Any, Any]:
    """(the value to show, the exact value when rounding changed it, else None)."""
    if isinstance(value, FloatMetadataValue) and value.value is not None:
        value = value.value
    elif isinstance(value, JsonMetadataValue):
        value = value.data
    elif isinstance(value, MetadataValue):  # Markdown, paths, tables: shown as given
        return value, None
    if isinstance(value, float):
        shown = rounded(value)
        return MetadataValue.float(shown), (value if math.isfinite(value) and shown != value else None)
    if isinstance(value, (Mapping, list, tuple)):
        shown = _round_data(value)
        return MetadataValue.json(shown), (value if shown != _plain(value) else None)
    return value, None


def _plain(value: Any) -> Any:
    """JSON data as `_round_data` returns it (tuples as lists), to compare like with like."""
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def display(metadata: Mapping[str, Any], first: Sequence[str] = ()) -> dict[str, Any]:
    """`metadata` for the UI: the `first` keys lead (those present), floats rounded, the exact
    values of the rounded entries kept in one `raw_values` JSON entry at the end."""
    order = [k for k in first if k in metadata] + [k for k in metadata if k not in first]
    out, raw = {}, {}
    for key in order:
        out[key], exact = _shown(metadata[key])
        if exact is not None:
            raw[key] = exact
    if raw:
        out[RAW] = MetadataValue.json(raw)
    return out


def table(rows: Iterable[Mapping[str, Any]], columns: Sequence[str]) -> TableMetadataValue:
    """Rows as a table the UI shows inline; floats rounded, a missing value left empty."""
    records = [TableRecord({c: _round_data(r.get(c)) for c in columns}) for r in rows]
    kinds = [_kind([r.data[c] for r in records if r.data[c] is not None]) for c in columns]
    return MetadataValue.table(records, schema=TableSchema(columns=[TableColumn(c, k) for c, k in zip(columns, kinds)]))


def _kind(values: list) -> str:
    if values and all(isinstance(v, bool) for v in values):
        return "bool"
    if values and all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        return "int"
    if values and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        return "float"
    return "string"
