"""Mix specs: weights per source table, repetition caps, sequence length, optional stages.

A spec is what a researcher writes (`configs/mixes/<name>.yaml`, or built in code by the
auto-mixer and the synthetic loop). It names tables, not snapshots; registering it
(`factory.mix.versions.register_mix_version`) pins every table to its current snapshot and
writes an immutable mix version that training streams.

Stages are a curriculum by tokens: stage i's weights apply until the run has consumed
`until_tokens` tokens in total; the spec's own weights apply after the last stage.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from factory.data.split import DEFAULT_HELDOUT_FRACTION

WEIGHT_TOLERANCE = 1e-6


class MixError(ValueError):
    """A mix is invalid or cannot be streamed; the message names the mix and the input."""


class MixSource(BaseModel):
    """One table in a mix."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    table: str = Field(description="namespace.table, e.g. refined.python_stdlib or synthetic.porting.")
    weight: float = Field(description="Share of training sequences, in [0, 1]; the weights sum to 1.")
    max_epochs: float | None = Field(None, gt=0, description="Passes over the table's training split before `on_cap` applies; none = unlimited.")
    max_doc_tokens: int | None = Field(None, gt=0, description="Tokens taken from the start of each document (the rest is "
                                       "skipped); none = whole documents. Short runs see many more documents.")

    @field_validator("table")
    @classmethod
    def _table(cls, v: str) -> str:
        if "." not in v:
            raise ValueError(f"table {v!r} needs a namespace, e.g. refined.{v}")
        return v

    @field_validator("weight")
    @classmethod
    def _weight(cls, v: float) -> float:
        if not math.isfinite(v) or v < 0:
            raise ValueError(f"weight must be a finite number >= 0, got {v}")
        return v


class MixStage(BaseModel):
    """Weights that apply until the run has consumed `until_tokens` tokens."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    until_tokens: int = Field(gt=0, description="Total tokens consumed (all ranks) at which this stage ends.")
    weights: dict[str, float] = Field(description="Table -> weight for this stage; tables must be in the mix.")


class MixSpec(BaseModel):
    """A named mix over lake tables."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9_\-]*$", description="Mix name; versions are mix/<name>@v<N>.")
    description: str = ""
    sources: list[MixSource]
    seq_len: int = Field(256, ge=8, le=1 << 20, description="Model context in tokens; the loader yields seq_len + 1 tokens per row.")
    tokenizer: str = Field("default", description="Tokenizer artifact name (its newest version is pinned).")
    stages: list[MixStage] = Field(default_factory=list)
    on_cap: Literal["error", "stop"] = Field("error", description="At a source's max_epochs: raise, or end the stream cleanly.")
    heldout_fraction: float = Field(DEFAULT_HELDOUT_FRACTION, ge=0, lt=1, description="Documents held out for evaluation.")

    @model_validator(mode="after")
    def _check(self) -> "MixSpec":
        tables = [s.table for s in self.sources]
        if not tables:
            raise ValueError(f"mix {self.name}: sources is empty")
        if len(set(tables)) != len(tables):
            raise ValueError(f"mix {self.name}: a table is listed twice in sources")
        _check_weights(f"mix {self.name}: sources", {s.table: s.weight for s in self.sources})
        last = 0
        for i, stage in enumerate(self.stages):
            unknown = set(stage.weights) - set(tables)
            if unknown:
                raise ValueError(f"mix {self.name}: stages[{i}] names tables not in sources: {sorted(unknown)}")
            if stage.until_tokens <= last:
                raise ValueError(f"mix {self.name}: stages[{i}].until_tokens must increase")
            last = stage.until_tokens
            _check_weights(f"mix {self.name} stages[{i}]", stage.weights)
        return self

    @property
    def weights(self) -> dict[str, float]:
        return {s.table: s.weight for s in self.sources}


def _check_weights(where: str, weights: dict[str, float]) -> None:
    negative = {t: w for t, w in weights.items() if w < 0 or not math.isfinite(w)}
    if negative:
        raise ValueError(f"{where}: weights must be finite and >= 0: {negative}")
    total = sum(weights.values())
    if abs(total - 1.0) > WEIGHT_TOLERANCE:
        raise ValueError(f"{where}: weights sum to {total:.6g}, not 1 ({weights})")


def load_spec(path: str | Path) -> MixSpec:
    """A spec from a YAML file; the mix name defaults to the file's stem."""
    path = Path(path)
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as e:
        raise MixError(f"mix spec {path}: cannot read it: {e}") from None
    if not isinstance(raw, dict):
        raise MixError(f"mix spec {path}: expected a mapping at the top level")
    raw.setdefault("name", path.stem)
    try:
        return MixSpec.model_validate(raw)
    except ValidationError as e:
        raise MixError(f"mix spec {path}: {_errors(e)}") from None


def _errors(e: ValidationError) -> str:
    return "; ".join(f"{'.'.join(map(str, err['loc'])) or '(spec)'}: {err['msg']}" for err in e.errors())
