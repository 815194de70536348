"""Run a synthetic-data pipeline: seeds → stages → validators → `synthetic.<name>` with provenance.

Candidates (`Candidate`, candidate.py: frozen; each stage returns the next one) move through the
pipeline in batches. Each stage's generator adds one field; a rejected
generation rejects the candidate with the stage and the error, and a generator that cannot work
(a dead engine or endpoint, a bug in a function stage) fails the run (`GeneratorError`, see
generators.py) before anything is committed. The training
text is rendered from the fields, then every validator runs on the candidates still standing.
Accepted rows go to `synthetic.<name>` (the columns the mix loader streams, plus provenance:
seed id, agent chain, export id, template hash, verdicts, attempts); rejected ones, with their
reasons, to `synthetic.<name>_rejected`. The supervisor (agents.py: the one budget check, also
asked before each loop round) stops the run after a batch once its budget (time, tokens) is
spent; what was accepted so far is still committed, and the stop is reported.

All rows of a run are built first and committed at the end (rejected, then accepted, then the
lineage row of the new snapshot): a crashed run leaves the tables as they were, and a run that
accepts nothing makes no new snapshot of `synthetic.<name>`.
"""

from __future__ import annotations

import datetime as dt
import hashlib
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
from factory.synth.candidate import Candidate
from factory.synth.config import PipelineConfig, SeedsConfig
from factory.synth.generators import Generation, Generator, load_function, render, template_hash
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

    def reject(c: Candidate, stage: str, reason: str) -> None:
        result.rejected[stage] += 1
        rejected.append(c.rejected_row(stage, reason, result.batch_id, now))

    for start in range(0, len(seeds), batch_size):
        live = [Candidate(str(s[config.seeds.id_field]), dict(s)) for s in seeds[start:start + batch_size]]
        live = [c.with_fields(**secondary.sample(c.seed_id)) for c in live]
        for stage, generator in zip(config.stages, generators):
            if stage.loop is not None:
                outcomes = run_loop(stage, live, make_agent, supervisor, add_tokens)
            else:
                outcomes = [_generated(stage, c, out, add_tokens)
                            for c, out in zip(live, generator.generate([c.fields for c in live]))]
            live = []
            for c, reason in outcomes:
                if reason is None:
                    live.append(c)
                else:
                    reject(c, stage.name, reason)
        live = [c.rendered(render(config.text, c.fields)) for c in live]
        for v in config.validators:
            verdicts = validators.check(v, [c.text if v.field == "text" else str(c.fields.get(v.field, ""))
                                            for c in live], [c.fields for c in live])
            standing = []
            for c, verdict in zip(live, verdicts):
                c = c.judged(v.kind, verdict.passed)
                if verdict.passed:
                    standing.append(c)
                else:
                    reject(c, v.kind, verdict.reason)
            live = standing
        models = sorted({g.export_id for g in [*generators, *agents] if g and g.export_id})  # exports/endpoint models
        accepted += [c.accepted_row(pipeline=config.name, kind=config.kind, exports=models, templates=templates,
                                    batch_id=result.batch_id, now=now) for c in live]
        done = min(start + batch_size, len(seeds))
        log(f"synthetic.{config.name}: {done}/{len(seeds)} seeds, {len(accepted)} accepted, "
            f"{sum(result.rejected.values())} rejected")
        stop = supervisor.exhausted()
        if stop:
            result.stopped = f"stopped after {done} of {len(seeds)} seeds: {stop}"
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


def _generated(stage, c: Candidate, out: Generation, add_tokens: Callable[[int], None]) -> tuple[Candidate, str | None]:
    """(the candidate after one generator stage, rejection reason or None)."""
    add_tokens(out.tokens)
    c = c.tried(out.attempts)
    if out.error is not None:
        return c, f"generation failed: {out.error}"
    return c.generated(stage.name, stage.output, out.text), None


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
