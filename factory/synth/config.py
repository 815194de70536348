"""Synthetic-data pipeline configs: seeds → generator stages → validators → `synthetic.<name>`.

A pipeline is one frozen config (`PipelineConfig`), written as a Python function in
`configs/synth/` like an experiment. It names its seeds (rows of a lake table, or a list made by
a function), one or more generation stages (a prompt template over the inference engine, an
OpenAI-compatible endpoint, or a programmatic function), the validators every candidate must
pass, and its budget. A bad config fails here, with the field path, before any generation runs.
"""

from __future__ import annotations

import string
from collections.abc import Mapping
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


def _check_template(name: str, template: str) -> None:
    """A template every candidate could fill: well-formed, and naming its fields (`{x}`, not `{}`),
    so that filling it fails only for a candidate that lacks a field (a rejected row), never for all."""
    try:
        fields = [f for _, f, _, _ in string.Formatter().parse(template) if f is not None]
    except ValueError as exc:
        raise ValueError(f"{name} {template[:60]!r}: {exc}") from None
    positional = [f for f in fields if f == "" or f.split(".")[0].split("[")[0].isdigit()]
    if positional:
        raise ValueError(f"{name} {template[:60]!r}: name the candidate's fields ({{text}}), not positions ({{}} / {{0}})")


class SeedsConfig(_Frozen):
    """Where seeds come from: a lake table's rows, or a function returning a list of dicts."""

    table: str | None = Field(None, description="namespace.table whose rows are seeds (current snapshot).")
    columns: tuple[str, ...] = Field(("doc_id", "text"), description="Columns of `table` a seed carries.")
    function: str | None = Field(None, description="module:function returning a list of seed dicts (each with an `id`).")
    id_field: str = Field("id", description="Field that identifies a seed (provenance key); `doc_id` for tables.")
    limit: int | None = Field(None, ge=1, description="Use at most this many seeds (in a seeded, stable order).")

    @model_validator(mode="after")
    def _one_source(self) -> "SeedsConfig":
        if (self.table is None) == (self.function is None):
            raise ValueError("give exactly one of seeds.table or seeds.function")
        return self


class EndpointConfig(_Frozen):
    """An OpenAI-compatible completions endpoint (e.g. `factory serve`, or a hosted model)."""

    base_url: str = Field(description="e.g. http://127.0.0.1:8000/v1")
    model: str = Field(description="Model name the endpoint serves.")
    api_key_env: str | None = Field(None, description="Environment variable holding the API key (read at run time).")
    timeout_s: float = Field(60.0, gt=0, description="Per-request timeout, seconds.")


class GeneratorConfig(_Frozen):
    """How one stage turns a candidate's fields into a new field."""

    kind: Literal["engine", "endpoint", "function"] = Field(description="engine = in-process vLLM on an export; "
                                                            "endpoint = OpenAI-compatible HTTP; function = Python.")
    template: str | None = Field(None, description="Prompt template (str.format over the candidate's fields).")
    function: str | None = Field(None, description="module:function(candidate_fields: dict) -> str, for kind=function.")
    export: str = Field("latest", description="Export to generate with (kind=engine): an export id, or latest.")
    endpoint: EndpointConfig | None = None
    max_tokens: int = Field(256, ge=1, description="New tokens per generation.")
    temperature: float = Field(0.7, ge=0)
    top_p: float = Field(0.95, gt=0, le=1)
    stop: tuple[str, ...] = Field((), description="Cut generations at the first of these.")

    @model_validator(mode="after")
    def _complete(self) -> "GeneratorConfig":
        if self.template:
            _check_template("template", self.template)
        if self.kind == "function" and not self.function:
            raise ValueError("kind=function needs `function` (module:function)")
        if self.kind in ("engine", "endpoint") and not self.template:
            raise ValueError(f"kind={self.kind} needs a prompt `template`")
        if self.kind == "endpoint" and self.endpoint is None:
            raise ValueError("kind=endpoint needs `endpoint` (base_url, model)")
        return self


class Condition(_Frozen):
    """A test on one field of a candidate (a number or a string)."""

    field: str
    op: Literal["<", "<=", ">", ">=", "==", "!="]
    value: float | str

    def holds(self, fields: Mapping) -> bool:
        if self.field not in fields:
            return False
        have, want = fields[self.field], self.value
        if isinstance(want, (int, float)):
            try:
                have = float(have)
            except (TypeError, ValueError):
                return False
        ops = {"<": have < want, "<=": have <= want, ">": have > want, ">=": have >= want,
               "==": have == want, "!=": have != want} if isinstance(want, (int, float)) else \
            {"==": have == want, "!=": have != want}
        if self.op not in ops:
            raise ValueError(f"condition on {self.field}: {self.op} needs a number")
        return ops[self.op]


class AgentConfig(_Frozen):
    """An agent in a loop: a generator plus the rules for when it is in the queue."""

    name: str = Field(pattern=r"^[a-z][a-z0-9_]*$")
    generator: GeneratorConfig
    output: str = Field(description="Field the agent writes.")
    mode: Literal["set", "append"] = Field("set", description="append: add `name: text` lines (a conversation).")
    instructions: str = Field("", description="Default instructions; templates see them as {instructions}.")
    feedback_from: str | None = Field(None, description="The orchestrator appends this field's latest value to the "
                                                        "instructions before each run (e.g. a judge's critique).")
    enter_when: Condition | None = Field(None, description="The agent runs only when this holds.")
    every: int = Field(1, ge=1, description="Runs on every `every`-th round (1 = each round).")
    max_runs: int | None = Field(None, ge=1, description="Leaves the queue after this many runs.")
    score: bool = Field(False, description="Parse the first number of the output into field `score` (a judge).")


class LoopConfig(_Frozen):
    """Multi-turn work on each candidate: agents take turns for up to `rounds` rounds."""

    agents: tuple[AgentConfig, ...] = Field(min_length=1)
    rounds: int = Field(3, ge=1, description="Rounds at most (each agent in the queue gets one turn per round).")
    stop_when: Condition | None = Field(None, description="End the loop early, e.g. score >= 8.")
    result: str = Field(description="Field whose final value is the stage's output.")


class StageConfig(_Frozen):
    """One generation step: its output becomes field `output` of the candidate. Either one
    generator, or a loop of agents (judge/evolver, two agents in conversation)."""

    name: str = Field(pattern=r"^[a-z][a-z0-9_]*$", description="Stage (agent) name, recorded in the provenance chain.")
    generator: GeneratorConfig | None = None
    loop: LoopConfig | None = None
    output: str = Field(description="Field the generation is stored in.")

    @model_validator(mode="after")
    def _one(self) -> "StageConfig":
        if (self.generator is None) == (self.loop is None):
            raise ValueError(f"stage {self.name}: give exactly one of generator or loop")
        return self


class ValidatorConfig(_Frozen):
    """One check every candidate must pass; a failure rejects it with `kind` and a reason."""

    kind: Literal["sandbox", "python_syntax", "length", "dedup", "decontaminate", "regex", "threshold"]
    field: str = Field("text", description="Candidate field the validator reads.")
    min_chars: int | None = Field(None, ge=0, description="length: shortest allowed.")
    max_chars: int | None = Field(None, ge=1, description="length: longest allowed.")
    pattern: str | None = Field(None, description="regex: must match (re.search).")
    against: tuple[str, ...] = Field((), description="dedup: tables whose `text` must not equal the candidate's.")
    benchmarks: tuple[str, ...] = Field(("humaneval",), description="decontaminate: eval sets to check against.")
    ngram: int = Field(13, ge=4, description="decontaminate: n-gram length in words.")
    timeout_s: float = Field(10.0, gt=0, description="sandbox: wall clock per program, seconds.")
    condition: "Condition | None" = Field(None, description="threshold: must hold, e.g. score >= 7 (a judge's).")

    @model_validator(mode="after")
    def _threshold(self) -> "ValidatorConfig":
        if self.kind == "threshold" and self.condition is None:
            raise ValueError("kind=threshold needs a `condition` (field, op, value)")
        return self


class InputConfig(_Frozen):
    """A secondary input: `k` texts sampled from another table for each candidate (e.g. few-shot
    examples), joined into field `name`. Sampling is seeded by the pipeline seed and the seed id."""

    name: str = Field(pattern=r"^[a-z][a-z0-9_]*$", description="Field the sampled texts go to.")
    table: str = Field(description="namespace.table to sample from (current snapshot).")
    column: str = Field("text", description="Column whose values are sampled.")
    k: int = Field(1, ge=1, description="Values per candidate.")
    separator: str = Field("\n\n", description="Joins the k values.")
    max_chars: int = Field(2000, ge=1, description="Each value is cut to this many characters.")


class BudgetConfig(_Frozen):
    """What a run may spend before the supervisor stops it (rows committed so far are kept)."""

    max_seconds: float = Field(3600.0, gt=0, description="Wall-clock time for the whole run.")
    max_tokens: int = Field(10_000_000, ge=1, description="Generated tokens, all stages together.")
    max_attempts: int = Field(3, ge=1, description="Tries per endpoint request (HTTP 408/429/5xx, timeouts, refused "
                                                  "connections) before the run fails; engine and function stages "
                                                  "are not retried.")
    max_rounds: int = Field(50, ge=1, description="Loop rounds per candidate, all loop stages together.")


class PipelineConfig(_Frozen):
    """A synthetic-data pipeline."""

    name: str = Field(pattern=r"^[a-z][a-z0-9_]*$", description="Output table synthetic.<name>.")
    description: str = ""
    seeds: SeedsConfig
    inputs: tuple[InputConfig, ...] = Field((), description="Secondary inputs added to every candidate.")
    stages: tuple[StageConfig, ...] = Field(min_length=1)
    validators: tuple[ValidatorConfig, ...] = ()
    text: str = Field(description="Template over the candidate's fields for the training text of an accepted row.")
    kind: Literal["code", "prose"] = Field("code", description="Content kind of the training text.")
    budget: BudgetConfig = BudgetConfig()
    seed: int = Field(0, description="Seeds the seed order and sampling.")

    @model_validator(mode="after")
    def _fields(self) -> "PipelineConfig":
        _check_template("text", self.text)
        names = [s.name for s in self.stages]
        if len(set(names)) != len(names):
            raise ValueError(f"stage names repeat: {names}")
        return self

    @property
    def table(self) -> str:
        return f"synthetic.{self.name}"

    @property
    def rejected_table(self) -> str:
        return f"synthetic.{self.name}_rejected"


ValidatorConfig.model_rebuild()
