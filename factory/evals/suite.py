"""An eval suite: named task configs run against one export, scores committed with lineage.

`evaluate` is what the `eval_scores` asset, `factory eval` and the eval sensor's runs call
(`evaluate_checkpoint` puts the export and the equivalence check in front of it): it
runs each task of the suite on the engine (one engine, started once, for all tasks), writes
`evals.samples` + `evals.results` + a lineage row whose upstream is the export and everything
the tasks read (held-out snapshots, the HumanEval file), and returns the score table with the
change since the previous evaluated checkpoint of the same run.
"""

from __future__ import annotations

import time
from typing import Callable

from pydantic import BaseModel, ConfigDict, Field, field_validator

from factory.evals.results import eval_id_of, previous_results, result_rows, score_table, write_results
from factory.evals.tasks import TaskConfig, TaskContext, parse_task, run_task
from factory.infer.engine import Engine
from factory.infer.export import ExportRef
from factory.lake import Lake
from factory.sandbox import Sandbox, SandboxConfig
from factory.version import config_hash


class SuiteConfig(BaseModel):
    """Tasks to run on every evaluated checkpoint. (The sandbox that code tasks execute in is an
    execution choice: `evaluate` takes its config, the Dagster layer a `SandboxResource`.)"""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9_\-]*$", description="Suite name: part of the eval id.")
    tasks: tuple[TaskConfig, ...] = Field(min_length=1, description="Task configs (registered in factory.evals).")

    @field_validator("tasks", mode="before")
    @classmethod
    def _parse(cls, value):
        tasks = tuple(parse_task(t) for t in value)
        labels = [t.label for t in tasks]
        if len(set(labels)) != len(labels):
            raise ValueError(f"task labels repeat: {labels} (give one of them a name)")
        return tasks

    def identity(self) -> dict:
        # tasks serialize as their subclasses (a base-typed field would drop their fields)
        return {"name": self.name, "tasks": [t.model_dump(mode="json") for t in self.tasks]}

    def config_hash(self) -> str:
        return config_hash(self.identity())


class EvalReport(BaseModel):
    model_config = ConfigDict(frozen=True)

    eval_id: str
    rows: list[dict]
    table: str
    previous_step: int | None
    snapshot_id: int | None
    seconds: dict[str, float]
    metadata: dict[str, dict]


def evaluate(lake: Lake, export: ExportRef, engine: Engine, suite: SuiteConfig, *, tokens: int,
             sandbox_config: SandboxConfig = SandboxConfig(), log: Callable[[str], None] = print,
             run_id: str = "", partition: str = "") -> EvalReport:
    """Run `suite` on `export` through `engine` and commit the scores (see the module docstring)."""
    eval_id = eval_id_of(export.checkpoint_id, suite.name)
    pool: list[Sandbox] = []

    def sandbox() -> Sandbox:
        if not pool:
            pool.append(Sandbox(sandbox_config))
        return pool[0]

    ctx = TaskContext(lake=lake, export=export, engine=engine, sandbox=sandbox, log=log)
    rows, samples, upstream, seconds, metadata = [], [], [export.export_id], {}, {}
    suite_hash = suite.config_hash()
    for task in suite.tasks:
        log(f"{eval_id}: running {task.label}")
        start = time.perf_counter()
        result = run_task(task, ctx)
        seconds[task.label] = round(time.perf_counter() - start, 2)
        rows += result_rows(eval_id=eval_id, export=export, suite=suite.name, task=task.label,
                            metrics=result.metrics, tokens=tokens, engine=engine.name, config_hash=suite_hash)
        samples += [{"task": task.label, **s} for s in result.samples]
        upstream += [u for u in result.upstream if u not in upstream]
        metadata[task.label] = result.metadata
    previous = previous_results(lake, export.run, export.step, suite.name)
    snapshot = write_results(lake, eval_id=eval_id, rows=rows, samples=samples, upstream=upstream,
                             config=suite.identity() | {"engine": engine.name}, config_hash=suite_hash,
                             run_id=run_id, partition=partition)
    return EvalReport(eval_id=eval_id, rows=rows, table=score_table(rows, previous),
                      previous_step=previous[0]["step"] if previous else None, snapshot_id=snapshot,
                      seconds=seconds, metadata=metadata)


def evaluate_checkpoint(lake: Lake, checkpoint, suite: SuiteConfig, engine_config=None, *, asset_key: str = "cli",
                        log: Callable[[str], None] = print) -> EvalReport:
    """Export a checkpoint (`find_checkpoint`'s), check it against the training model, evaluate it:
    `factory eval` and `factory sweep run` in one process (Dagster runs the same steps as two assets
    with a blocking check between). A failed check raises `ExportError` and nothing is scored."""
    from factory.infer import EngineConfig, ExportError, export_checkpoint, open_engine
    from factory.infer.equivalence import verify_export

    config = engine_config or EngineConfig()
    export = export_checkpoint(lake, checkpoint, asset_key=asset_key)
    report = verify_export(lake, export, config, checkpoint=checkpoint)
    log(report.summary())
    if not report.passed:
        raise ExportError(f"{export.export_id} failed the equivalence check: {'; '.join(report.problems)}")
    return evaluate(lake, export, open_engine(export, config), suite, tokens=checkpoint.ref.tokens, log=log)
