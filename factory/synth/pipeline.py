"""Run a synthetic-data pipeline: seeds → stages → validators → `synthetic.<name>` with provenance.

Candidates move through the pipeline in batches. Each stage's generator adds one field; a rejected
generation rejects the candidate with the stage and the error, and a generator that cannot work
(a dead engine or endpoint, a bug in a function stage) fails the run (`GeneratorError`, see
generators.py) before anything is committed. The training
text is rendered from the fields, then every validator runs on the candidates still standing.
Accepted rows go to `synthetic.<name>` (the columns the mix loader streams, plus provenance:
seed id, agent chain, export id, template hash, verdicts, attempts); rejected ones, with their
reasons, to `synthetic.<name>_rejected`. The supervisor stops the run when its budget (time,
tokens) is spent; what was accepted so far is still committed, and the stop is reported.

All rows of a run are built first and committed at the end (rejected, then accepted, then the
lineage row of the new snapshot): a crashed run leaves the tables as they were, and a run that
accepts nothing makes no new snapshot of `synthetic.<name>`.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import random
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable

import pyarrow as pa

from factory.lake import CommitStamp, Lake, LineageRecord
from factory.lake.lineage import SNAPSHOT, table_version_id
from factory.lake.schemas import SYNTHETIC_DOCUMENTS, SYNTHETIC_REJECTED
from factory.synth.agents import Supervisor, run_loop
from factory.synth.config import PipelineConfig, SeedsConfig
from factory.synth.generators import Generator, load_function, render, template_hash
from factory.synth.validators import Validators
from factory.version import canonical_json, config_hash, env_lock_hash


@dataclass
class SynthResult:
    pipeline: str
    batch_id: str
    seeds: int
    accepted: int
    rejected: Counter = field(default_factory=Counter)  # by stage / validator
    tokens: int = 0
    seconds: float = 0.0
    stopped: str | None = None  # why the supervisor stopped the run early
    snapshot_id: int | None = None
    version_id: str | None = None


def load_seeds(lake: Lake, config: SeedsConfig, seed: int) -> tuple[list[dict], list[str]]:
    """(seed dicts with an `id`, upstream version ids), in a seeded stable order, at most `limit`."""
    if config.function:
        rows = load_function(config.function)()
        upstream = [f"function:{config.function}"]
    else:
        table = lake.table(config.table)
        snapshot = table.current_snapshot()
        if snapshot is None:
            raise ValueError(f"seeds.table {config.table} has no snapshot yet")
        rows = table.scan(snapshot_id=snapshot.snapshot_id, selected_fields=config.columns).to_arrow().to_pylist()
        upstream = [table_version_id(config.table, snapshot.snapshot_id)]
    missing = [i for i, r in enumerate(rows) if config.id_field not in r]
    if missing:
        raise ValueError(f"seeds: {len(missing)} seeds lack the id field {config.id_field!r} (first: #{missing[0]})")
    rows.sort(key=lambda r: hashlib.sha256(f"{seed}:{r[config.id_field]}".encode()).digest())
    return rows[: config.limit] if config.limit else rows, upstream


class SecondaryInputs:
    """The pipeline's secondary inputs, read once; `sample(seed_id)` draws each input's k values."""

    def __init__(self, lake: Lake, config: PipelineConfig):
        self.config, self.values, self.upstream = config, {}, []
        for spec in config.inputs:
            table = lake.table(spec.table)
            snapshot = table.current_snapshot()
            if snapshot is None:
                raise ValueError(f"inputs.{spec.name}: table {spec.table} has no snapshot yet")
            column = table.scan(snapshot_id=snapshot.snapshot_id, selected_fields=(spec.column,)).to_arrow()
            values = [v for v in column.column(spec.column).to_pylist() if v]
            if len(values) < spec.k:
                raise ValueError(f"inputs.{spec.name}: {spec.table}.{spec.column} has {len(values)} values, k={spec.k}")
            self.values[spec.name] = values
            self.upstream.append(table_version_id(spec.table, snapshot.snapshot_id))

    def sample(self, seed_id: str) -> dict[str, str]:
        out = {}
        for spec in self.config.inputs:
            rng = random.Random(f"{self.config.seed}:{spec.name}:{seed_id}")
            picked = rng.sample(self.values[spec.name], spec.k)
            out[spec.name] = spec.separator.join(str(v)[:spec.max_chars] for v in picked)
        return out


def _existing_texts(lake: Lake, tables: tuple[str, ...]) -> list[str]:
    texts = []
    for name in tables:
        if lake.has_table(name):
            texts += lake.table(name).scan(selected_fields=("text",)).to_arrow().column("text").to_pylist()
    return texts


def run_pipeline(lake: Lake, config: PipelineConfig, *, engine_for: Callable[[str], object] | None = None,
                 sandbox: Callable[[float], object] | None = None, log: Callable[[str], None] = print,
                 run_id: str = "", batch_size: int = 256) -> SynthResult:
    """Generate, validate and commit one batch of `config` (see the module docstring)."""
    started = time.monotonic()
    seeds, upstream = load_seeds(lake, config.seeds, config.seed)
    secondary = SecondaryInputs(lake, config)
    upstream += secondary.upstream
    result = SynthResult(config.name, uuid.uuid4().hex[:12], len(seeds), 0)
    generators = [Generator(s.generator, max_attempts=config.budget.max_attempts, seed=config.seed + i,
                            engine_for=engine_for, name=f"stage {s.name}") if s.generator else None
                  for i, s in enumerate(config.stages)]
    agents: list[Generator] = []

    def make_agent(agent, index: int) -> Generator:
        agents.append(Generator(agent.generator, max_attempts=config.budget.max_attempts,
                                seed=config.seed + 100 + index, engine_for=engine_for, name=f"agent {agent.name}"))
        return agents[-1]

    def add_tokens(n: int) -> None:
        result.tokens += n

    supervisor = Supervisor(config.budget, started, lambda: result.tokens)
    validators = Validators(config.validators, existing_texts=lambda t: _existing_texts(lake, t),
                            sandbox=sandbox or _no_sandbox)
    templates = "+".join(template_hash(s.generator) if s.generator else
                         "loop(" + ",".join(template_hash(a.generator) for a in s.loop.agents) + ")"
                         for s in config.stages)
    accepted, rejected = [], []
    now = dt.datetime.now(dt.timezone.utc)
    for start in range(0, len(seeds), batch_size):
        live = [{"fields": dict(s), "attempts": 0, "seed_id": str(s[config.seeds.id_field]), "chain": []}
                for s in seeds[start:start + batch_size]]
        for c in live:
            c["fields"] |= secondary.sample(c["seed_id"])
        for stage, generator in zip(config.stages, generators):
            if stage.loop is not None:
                kept = []
                for c, reason in run_loop(stage, live, make_agent, supervisor, add_tokens):
                    if reason is None:
                        kept.append(c)
                    else:
                        rejected.append(_reject(c, stage.name, reason, result, now))
                live = kept
                continue
            outputs = generator.generate([c["fields"] for c in live])
            kept = []
            for c, out in zip(live, outputs):
                c["attempts"] += out.attempts
                result.tokens += out.tokens
                if out.error is not None:
                    rejected.append(_reject(c, stage.name, f"generation failed: {out.error}", result, now))
                else:
                    c["fields"][stage.output] = out.text
                    c["chain"].append(stage.name)
                    kept.append(c)
            live = kept
        for c in live:
            c["text"] = render(config.text, c["fields"])
            c["verdicts"] = {}
        for v in config.validators:
            verdicts = validators.check(v, [c["text"] if v.field == "text" else str(c["fields"].get(v.field, ""))
                                            for c in live], [c["fields"] for c in live])
            kept = []
            for c, verdict in zip(live, verdicts):
                c["verdicts"][v.kind] = verdict.passed
                if verdict.passed:
                    kept.append(c)
                else:
                    rejected.append(_reject(c, v.kind, verdict.reason, result, now))
            live = kept
        models = sorted({g.export_id for g in [*generators, *agents] if g and g.export_id})  # exports/endpoint models
        accepted += [_row(config, c, models, templates, result.batch_id, now) for c in live]
        done = min(start + batch_size, len(seeds))
        log(f"synthetic.{config.name}: {done}/{len(seeds)} seeds, {len(accepted)} accepted, "
            f"{sum(result.rejected.values())} rejected")
        spent = time.monotonic() - started
        if spent > config.budget.max_seconds or result.tokens > config.budget.max_tokens:
            result.stopped = (f"budget spent after {done} of {len(seeds)} seeds: {spent:.0f}s "
                              f"(max {config.budget.max_seconds:.0f}), {result.tokens} tokens (max {config.budget.max_tokens})")
            log(result.stopped)
            break
    result.accepted = len(accepted)
    _commit(lake, config, result, accepted, rejected, upstream + exports_of([*generators, *agents]), run_id)
    result.seconds = round(time.monotonic() - started, 2)
    return result


def exports_of(generators: list[Generator | None]) -> list[str]:
    return sorted({g.export_id for g in generators if g and g.export_id and g.export_id.startswith("export/")})


def _no_sandbox(timeout_s: float):
    raise ValueError("a sandbox validator needs a sandbox (none was given to the pipeline)")


def _reject(c: dict, stage: str, reason: str, result: SynthResult, now) -> dict:
    result.rejected[stage] += 1
    return {"seed_id": c["seed_id"], "stage": stage, "reason": reason[:2000], "text": c.get("text"),
            "fields": json.dumps(c["fields"], default=str), "attempts": c["attempts"], "batch_id": result.batch_id,
            "created_at": now}


def _row(config: PipelineConfig, c: dict, exports, templates, batch_id: str, now) -> dict:
    text = c["text"]
    digest = hashlib.sha256(f"{config.name}/{c['seed_id']}/{text}".encode()).hexdigest()
    return {"doc_id": digest[:24], "source": config.name, "path": c["seed_id"], "text": text,
            "language": "python" if config.kind == "code" else "text", "kind": config.kind,
            "bytes": len(text.encode()), "content_sha256": hashlib.sha256(text.encode()).hexdigest(),
            "seed_id": c["seed_id"], "agent_chain": c["chain"], "export_id": ",".join(exports) or None,
            "template_hash": templates, "verdicts": json.dumps(c["verdicts"], sort_keys=True),
            "attempts": c["attempts"], "batch_id": batch_id, "fields": json.dumps(c["fields"], default=str),
            "created_at": now}


def _commit(lake: Lake, config: PipelineConfig, result: SynthResult, accepted: list[dict], rejected: list[dict],
            upstream: list[str], run_id: str) -> None:
    chash = config_hash(config.model_dump(mode="json"))
    stamp = CommitStamp(asset_key=f"synthetic/{config.name}", config_hash=chash, run_id=run_id,
                        upstream=lake.lineage.upstream_snapshots(upstream))
    if rejected:
        lake.commit(config.rejected_table, pa.Table.from_pylist(rejected, schema=SYNTHETIC_REJECTED.as_arrow()),
                    stamp, schema=SYNTHETIC_REJECTED)
    if not accepted:  # no new snapshot: nothing downstream (a mix following this table) should react
        return
    data = pa.Table.from_pylist(accepted, schema=SYNTHETIC_DOCUMENTS.as_arrow())
    lake.ensure_table(config.table, SYNTHETIC_DOCUMENTS)
    row = LineageRecord(
        version_id=table_version_id(config.table, SNAPSHOT), kind="synthetic_batch", name=config.table,
        uri=lake.table(config.table).location(), upstream=upstream, config_json=canonical_json(config.model_dump(mode="json")),
        config_hash=chash, code_version=stamp.code_version, env_lock=env_lock_hash(), asset_key=stamp.asset_key,
        run_id=run_id,
        metadata_json=canonical_json({"batch_id": result.batch_id, "seeds": result.seeds, "accepted": len(accepted),
                                      "rejected": dict(result.rejected), "tokens": result.tokens,
                                      "stopped": result.stopped}),
    )
    commit = lake.commit(config.table, data, stamp, lineage=row)
    result.snapshot_id = commit.snapshot_id
    result.version_id = table_version_id(config.table, commit.snapshot_id)
