"""`repo_tasks`: pass@1 of a model on function-completion tasks of real repositories, scored by the
task engine.

The tasks are the stored `tasks.function_completion` rows (factory.tasks.store): a covered function
of a built environment with its body removed, and the tests that fail without it. The eval takes the
first `max_tasks` by task id (ids are content hashes, so that is a stable, spread-out sample; a
repository set or repository names narrow it first). Each prompt is the broken file up to the end of
the target's signature and docstring, without its final newline (as HumanEval: the tokenizer merges
a newline with the indentation after it, so the model's first token is the body's `\\n` + indent).
`task.prompt` is an instruction around the fenced file, written for an instruction-following model;
the factory's models are base models trained on raw files, which continue code and do not answer
instructions. The prompt is fitted to the context by keeping its end (`engine.fit`).

A completion becomes a candidate body: its lines up to the first line that is not indented past the
`def` (the end of the function, also for methods, where the top-level stop strings do not fire),
blank lines at the edges dropped. All candidates are scored through the task engine on Ray
(factory.tasks.engine, consumer `eval/repo_tasks`): each is spliced into the broken file and the
task's FAIL_TO_PASS + PASS_TO_PASS tests run in the sandbox; reward 1.0 only when they all pass.
Attempts are keyed by (task, candidate), so a candidate that another checkpoint or consumer already
had scored is answered from `tasks.attempts` without running again (counted as `cached`).

A failed eval is not a score of 0: no stored tasks, a filter that leaves none, an attempt whose
scorer raised (a missing environment, a digest mismatch) or whose worker died on every try raise
instead of counting as wrong answers. The model's own failures (a wrong body, one that does not
parse, one that loops until the sandbox's limit) score 0 and are counted by outcome. The upstream
of the result is the task-set version ids (`task_set/<kind>/<repo>@<revision>/<digest12>`) of the
tasks used, read from the rows' `task_set` column.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from factory.evals.tasks import Metric, TaskConfig, TaskContext, TaskResult, mean_stderr, register
from factory.infer.engine import SamplingConfig
from factory.lake import Lake
from factory.tasks.model import Task
from factory.tasks.source import find_function
from factory.tasks.store import load_tasks, table_name

# Top-level statements that end a function body: they only save tokens, `candidate_body` cuts exactly.
STOP = ("\ndef ", "\nclass ", "\n@", "\nif __name__", "\n#")
CONSUMER = "eval/repo_tasks"
ENGINE_FAILURES = ("crashed",)  # the engine's own outcome when a worker died on every try


class RepoTasksConfig(TaskConfig):
    task: str = "repo_tasks"
    kind: Literal["function_completion"] = Field("function_completion",
                                                 description="Stored task kind scored (tasks.<kind>).")
    max_tasks: int = Field(50, ge=1, description="Tasks scored at most: the first by task id (tasks).")
    repo_set: str | None = Field(None, description="Only tasks of environments built for this repository set "
                                 "(envs.builds.repo_set); None = every set.")
    repos: tuple[str, ...] = Field((), description="Only tasks of these repository names; () = every repository.")
    max_tokens: int = Field(128, ge=1, description="Tokens generated per completion at most (tokens); a body cut "
                            "short fails. 128 leaves half of a 256-token smoke model's context for the prompt.")
    temperature: float = Field(0.0, ge=0, description="Sampling temperature; 0 = greedy (pass@1 of the greedy body).")
    top_p: float = Field(0.95, gt=0, le=1, description="Nucleus mass when temperature > 0 (fraction).")
    seed: int = Field(0, description="Sampling seed (prompt i uses seed + i).")
    workers: int = Field(2, gt=0, description="Attempts the task engine runs at once (count; a local Ray "
                         "instance gets this many CPUs).")
    timeout_s: float = Field(120.0, gt=0, description="Wall-clock (and CPU) limit of one sandboxed test run (seconds).")
    lease_s: float = Field(300.0, gt=0, description="Time one engine try may run before it is cancelled and served "
                           "again (seconds); above timeout_s, so a looping body hits the sandbox limit first.")
    max_retries: int = Field(1, ge=0, le=10, description="Times an attempt is served again after a killed worker or "
                             "an expired lease (count).")
    memory_mb: int = Field(4096, ge=256, description="Memory limit of one sandboxed test run (MiB).")
    address: str | None = Field(None, description="Ray cluster for the task engine ('ray://host:10001', 'auto'); "
                                "None = a local instance on 127.0.0.1 for the eval's duration.")

    @model_validator(mode="after")
    def _check(self) -> "RepoTasksConfig":
        if self.lease_s <= self.timeout_s:
            raise ValueError(f"lease_s={self.lease_s} must exceed timeout_s={self.timeout_s}: otherwise a body that "
                             "loops is cancelled by the lease and retried instead of timing out in the sandbox")
        return self


def select_tasks(lake: Lake, config: RepoTasksConfig) -> list[Task]:
    """The tasks to score: stored, filtered, the first `max_tasks` by id. Raises when there are none."""
    stored = load_tasks(lake, config.kind)
    if not stored:
        raise LookupError(f"repo_tasks: {table_name(config.kind)} holds no tasks in this lake; materialize the "
                          f"asset tasks/{config.kind} (factory.tasks.store.write_task_set) first")
    chosen = stored
    if config.repo_set is not None:
        from factory.envs.store import builds

        digests = {row["env_digest"] for row in builds(lake, config.repo_set) if row["env_digest"]}
        chosen = [t for t in chosen if t.env_digest in digests]
    if config.repos:
        chosen = [t for t in chosen if t.repo in config.repos]
    if not chosen:
        raise LookupError(f"repo_tasks: none of the {len(stored)} stored {config.kind} tasks is from repo_set="
                          f"{config.repo_set!r}, repos={list(config.repos)} (repositories with tasks: "
                          f"{sorted({t.repo for t in stored})})")
    return sorted(chosen, key=lambda t: t.task_id)[: config.max_tasks]


def task_set_versions(lake: Lake, kind: str, task_ids: list[str]) -> dict[str, str]:
    """{task id: version id of the derivation that stored it} (the rows' `task_set` column)."""
    wanted = set(task_ids)
    rows = lake.table(table_name(kind)).scan(selected_fields=("task_id", "task_set")).to_arrow().to_pylist()
    return {r["task_id"]: r["task_set"] for r in rows if r["task_id"] in wanted}


def code_prompt(task: Task) -> tuple[str, str]:
    """(the broken file up to the end of the target's signature and docstring without its final
    newline, the indentation of the target's `def`)."""
    broken = task.broken_overlay[task.file]
    site = find_function(broken, task.target)
    prefix = "".join(broken.splitlines(keepends=True)[: site.keep_end])
    return prefix.removesuffix("\n"), site.def_indent


def candidate_body(completion: str, def_indent: str) -> str:
    """The function body a completion of `code_prompt` gives: its lines until the first non-blank
    line not indented past the `def`, without blank edges ('' when there is none)."""
    head, _, rest = completion.partition("\n")
    lines = [head.strip()] if head.strip() else []  # text on the prompt's last line: a one-line body
    for line in rest.split("\n") if rest else []:
        if line.strip() and len(line) - len(line.lstrip()) <= len(def_indent):
            break
        lines.append(line)
    while lines and not lines[-1].strip():
        lines.pop()
    while lines and not lines[0].strip():
        lines.pop(0)
    return "\n".join(lines)


def complete(engine, tasks: list[Task], config: RepoTasksConfig) -> tuple[list[str], list[str], int, int]:
    """(prompts, candidate bodies, prompts cut to fit the context, completions that ran out of
    tokens) for `tasks`."""
    built = [code_prompt(t) for t in tasks]
    encoded = [engine.document_ids(prompt) for prompt, _ in built]
    fitted = [engine.fit(ids, config.max_tokens) for ids in encoded]
    cut = sum(len(a) != len(b) for a, b in zip(encoded, fitted))
    sampling = SamplingConfig(max_tokens=config.max_tokens, temperature=config.temperature, top_p=config.top_p,
                              n=1, seed=config.seed, stop=STOP)
    outputs = [out[0] for out in engine.generate(fitted, sampling)]
    bodies = [candidate_body(out.text, indent) for out, (_, indent) in zip(outputs, built)]
    return [p for p, _ in built], bodies, cut, sum(out.finish_reason == "length" for out in outputs)


def score(lake: Lake, tasks: list[Task], bodies: list[str], config: RepoTasksConfig, log=print) -> list:
    """One AttemptResult per (task, body), through the task engine; raises when the scorer itself failed."""
    from factory.envs.testrun import test_sandbox_config
    from factory.tasks.engine import AttemptRequest, EngineConfig, ScoreWork, TaskEngine

    requests = [AttemptRequest(task_id=t.task_id, candidate=b, consumer=CONSUMER) for t, b in zip(tasks, bodies)]
    engine_config = EngineConfig(address=config.address, workers=config.workers, lease_s=config.lease_s,
                                 max_retries=config.max_retries)
    work = ScoreWork(tasks, test_sandbox_config(config.timeout_s, memory_mb=config.memory_mb))
    step = max(1, len(requests) // 10)

    def progress(done: int, total: int) -> None:
        if done % step == 0 or done == total:
            log(f"{config.label}: {done}/{total} attempts scored")

    with TaskEngine(engine_config, work, lake=lake) as engine:
        results = engine.run(requests, progress=progress)
    broken = [(t, r) for t, r in zip(tasks, results)
              if r.outcome in ENGINE_FAILURES or (r.outcome == "error" and r.error)]
    if broken:
        task, result = broken[0]
        raise RuntimeError(f"repo_tasks: the task engine could not score {len(broken)} of {len(results)} attempts "
                           f"(a scorer failure, not the model's answer); first: task {task.task_id} "
                           f"({task.repo} {task.file}::{task.target}) {result.outcome}: {result.error[:500]}")
    return results


@register(RepoTasksConfig)
def repo_tasks(config: RepoTasksConfig, ctx: TaskContext) -> TaskResult:
    tasks = select_tasks(ctx.lake, config)
    versions = task_set_versions(ctx.lake, config.kind, [t.task_id for t in tasks])
    prompts, bodies, cut, long = complete(ctx.engine, tasks, config)
    results = score(ctx.lake, tasks, bodies, config, ctx.log)
    value, stderr = mean_stderr([r.reward for r in results])
    outcomes: dict[str, int] = {}
    by_repo: dict[str, list[int]] = {}
    samples = []
    for task, prompt, body, result in zip(tasks, prompts, bodies, results):
        outcomes[result.outcome] = outcomes.get(result.outcome, 0) + 1
        tally = by_repo.setdefault(f"{task.repo}@{task.revision}", [0, 0])
        tally[0], tally[1] = tally[0] + (result.reward == 1.0), tally[1] + 1
        samples.append({"item": task.task_id, "prompt": prompt, "reference": task.reference, "completion": body,
                        "outcome": result.outcome, "score": result.reward})
    cached = sum(r.cached for r in results)
    ctx.log(f"{config.label}: pass@1 {value:.3f} over {len(tasks)} tasks of {len(by_repo)} repositories; "
            f"outcomes {outcomes}; {cached} scored before; {cut} prompts cut")
    metadata = {"outcomes": outcomes, "prompts_cut": cut, "cached": cached, "empty_bodies": sum(not b for b in bodies),
                "out_of_tokens": long,
                "by_repo": {k: {"passed": p, "tasks": n} for k, (p, n) in sorted(by_repo.items())}}
    upstream = sorted({versions[t.task_id] for t in tasks if t.task_id in versions})
    return TaskResult([Metric("pass@1", value, len(tasks), stderr)], samples, upstream, metadata)
