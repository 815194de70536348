"""The synthetic candidate: one seed on its way through the stages, and the rows it becomes.

A `Candidate` is frozen: a stage does not change it, it returns the next one (`generated`,
`with_fields`, `judged`, ...), so what a stage was given is still what it was given when the
next stage looks (a loop's agents see the same fields whichever order their answers come back),
and a reader of the pipeline sees every change a stage makes in one call. Its `fields` (the seed's
columns, the secondary inputs, each stage's output) are a read-only mapping; the rest is
provenance: the agent chain, the attempts, and a loop's per-candidate counts (rounds across all
loop stages, which the supervisor caps, and runs per agent, which the orchestrator caps).

A candidate ends as one row: `accepted_row` for `synthetic.<name>` (SYNTHETIC_DOCUMENTS) or
`rejected_row` for `synthetic.<name>_rejected` (SYNTHETIC_REJECTED), the schemas' columns exactly.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType

@dataclass(frozen=True, eq=False)
class Candidate:
    """A seed's fields and provenance between two stages (see the module docstring)."""

    seed_id: str
    fields: Mapping[str, object]
    attempts: int = 0
    chain: tuple[str, ...] = ()
    rounds: int = 0  # loop rounds, all loop stages together
    runs: Mapping[str, int] = field(default_factory=dict)  # loop turns per agent
    text: str | None = None  # the rendered training text, once the stages are done
    verdicts: Mapping[str, bool] = field(default_factory=dict)  # validator kind -> passed

    def __post_init__(self) -> None:
        # read-only views over private copies: no caller's dict aliases a candidate's state
        for name in ("fields", "runs", "verdicts"):
            object.__setattr__(self, name, MappingProxyType(dict(getattr(self, name))))

    def with_fields(self, **updates: object) -> Candidate:
        return replace(self, fields={**self.fields, **updates})

    def without(self, name: str) -> Candidate:
        return replace(self, fields={k: v for k, v in self.fields.items() if k != name})

    def tried(self, attempts: int) -> Candidate:
        return replace(self, attempts=self.attempts + attempts)

    def generated(self, by: str, output: str, text: str) -> Candidate:
        """`by` (a stage or an agent) wrote `text` into field `output`."""
        return replace(self, fields={**self.fields, output: text}, chain=(*self.chain, by))

    def took_turn(self, agent: str) -> Candidate:
        return replace(self, runs={**self.runs, agent: self.runs.get(agent, 0) + 1}, chain=(*self.chain, agent))

    def next_round(self) -> Candidate:
        return replace(self, rounds=self.rounds + 1)

    def rendered(self, text: str) -> Candidate:
        return replace(self, text=text, verdicts={})

    def judged(self, validator: str, passed: bool) -> Candidate:
        return replace(self, verdicts={**self.verdicts, validator: passed})

    def fields_json(self) -> str:
        return json.dumps(dict(self.fields), default=str)

    def rejected_row(self, stage: str, reason: str, batch_id: str, now: dt.datetime) -> dict:
        """The `synthetic.<name>_rejected` row: rejected by `stage` (a stage or validator) for `reason`."""
        return {"seed_id": self.seed_id, "stage": stage, "reason": reason[:2000], "text": self.text,
                "fields": self.fields_json(), "attempts": self.attempts, "batch_id": batch_id, "created_at": now}

    def accepted_row(self, *, pipeline: str, kind: str, exports: list[str], templates: str, batch_id: str,
                     now: dt.datetime) -> dict:
        """The `synthetic.<name>` row: the training text (the columns the mix loader streams) and its
        provenance. The doc id hashes pipeline, seed and text, so a rerun's identical row has the same id."""
        text = self.text
        digest = hashlib.sha256(f"{pipeline}/{self.seed_id}/{text}".encode()).hexdigest()
        return {"doc_id": digest[:24], "source": pipeline, "path": self.seed_id, "text": text,
                "language": "python" if kind == "code" else "text", "kind": kind,
                "bytes": len(text.encode()), "content_sha256": hashlib.sha256(text.encode()).hexdigest(),
                "seed_id": self.seed_id, "agent_chain": list(self.chain), "export_id": ",".join(exports) or None,
                "template_hash": templates, "verdicts": json.dumps(dict(self.verdicts), sort_keys=True),
                "attempts": self.attempts, "batch_id": batch_id, "fields": self.fields_json(), "created_at": now}
