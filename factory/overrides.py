"""Validated overrides: one way to make a variant of a frozen config.

Every config in the factory is a frozen pydantic model, and variants are made everywhere: an
experiment derived from its base (`smoke().derive(...)`), a deployment profile from `embedded()`,
a Dagster run's `steps` / `checkpoint_every` overrides, `python -m factory.train --steps 4`, a
tokenizer asset's `vocab_size`. pydantic's own `model_copy(update=...)` skips validation, so
`checkpoint.every=0` or `vocab_size=5` would pass and fail (or worse, not fail) much later. So
every variant goes through `override`: the model is dumped, the changes are applied, and the
result is validated again as a whole (cross-field rules included).

Keys may be dotted paths (`{"checkpoint.every": 2}`) to change one field of a section and keep
the rest; a plain key replaces its value whole (`checkpoint=CheckpointConfig(every=2)` resets
`keep_last` to its default, as constructing it would). Config objects among the values are dumped
first: pydantic accepts a model instance as it is, so an unvalidated one would slip through.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

M = TypeVar("M", bound=BaseModel)


def override(model: M, changes: Mapping[str, Any]) -> M:
    """`model` with `changes` applied (keys may be dotted paths), validated again; raises
    pydantic's `ValidationError` naming the field path (see `validation_message`)."""
    data = model.model_dump()
    for key, value in changes.items():
        *parents, leaf = key.split(".")
        section = data
        for i, name in enumerate(parents):
            if not isinstance(section.get(name), dict):
                path = ".".join(parents[: i + 1])
                raise ValueError(f"cannot override {key}: {path} is not a section of {type(model).__name__}")
            section = section[name]
        section[leaf] = value.model_dump() if isinstance(value, BaseModel) else value
    return type(model).model_validate(data)


def validation_message(e: ValidationError) -> str:
    """`field.path: message; ...` — pydantic's errors on one line, without its input echo (and
    without the "Value error, " that pydantic puts before our own validators' messages)."""
    parts = []
    for err in e.errors():
        msg = err["msg"].removeprefix("Value error, ")
        parts.append(f"{'.'.join(map(str, err['loc']))}: {msg}" if err["loc"] else msg)
    return "; ".join(parts)
