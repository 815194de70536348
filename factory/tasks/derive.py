"""Deriving validated tasks from a built environment's test suite: `derive_tasks`, `derive_task_set`.

Pipeline for one environment and one kind:
1. one baseline run of the whole suite (`run_tests` with no ids): the tests that pass unbroken;
2. candidates in seeded order (completion: covered functions; bug fixing: seeded mutants of them);
   each is first checked against the eval sets (factory.tasks.decontam: a contaminated one costs no
   sandbox run), then its file is broken and the baseline-passing tests of the test files that
   mention the function run on it: FAIL_TO_PASS = those that no longer pass, PASS_TO_PASS = those
   that still do. A candidate with no FAIL_TO_PASS, or whose broken run did not reach its end, is
   dropped (counted by reason);
3. validation: the reference is scored like any candidate (factory.tasks.score) and must pass every
   FAIL_TO_PASS and PASS_TO_PASS test. Together with step 2's broken run that is the check the issue
   asks for: FAIL_TO_PASS fail broken, and everything passes with the reference.

Cost: 1 + 2 runs per candidate tried, each restricted to a few test files; `max_candidates` caps it.
Why restrict PASS_TO_PASS to the files that mention the function: a whole-suite run per attempt
would make scoring as slow as the suite; the tests that name the function are the ones it can break.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor

from factory.envs.environment import Environment, Runner
from factory.envs.testrun import run_tests, test_sandbox_config
from factory.sandbox import Sandbox
from factory.tasks.completion import completion_candidates, completion_prompt
from factory.tasks.decontam import Decontaminator
from factory.tasks.model import KINDS, DeriveConfig, Difficulty, Task, TaskSet, Verdict, task_id_of
from factory.tasks.mutation import bug_prompt, mutation_candidates
from factory.tasks.score import score_candidate
from factory.tasks.source import Candidate, test_files

Progress = Callable[[int, int], None]


def derive_sandbox(config: DeriveConfig) -> Sandbox:
    """The sandbox derivation runs test suites in (one run at a time: runs are the heavy part)."""
    return Sandbox(test_sandbox_config(timeout_s=config.timeout_s, workers=1))


def derive_tasks(env: Environment, kind: str, config: DeriveConfig, sandbox: Sandbox,
                 progress: Progress | None = None, *, flaky: Iterable[str] = ()) -> list[Task]:
    """The validated, decontaminated tasks of `kind` from `env` (see the module docstring)."""
    return list(derive_task_set(env, kind, config, sandbox, progress, flaky=flaky).tasks)


def derive_task_set(env: Environment, kind: str, config: DeriveConfig, sandbox: Sandbox,
                    progress: Progress | None = None, *, flaky: Iterable[str] = ()) -> TaskSet:
    """`derive_tasks` with the counts behind it (candidates tried, rejected by reason, contaminated).

    `flaky`: test ids the build marked flaky (BuildRecord.flaky), never used as FAIL_TO_PASS or
    PASS_TO_PASS. Candidates run `sandbox.config.workers` at a time, in batches taken in seed order
    and kept in that order, so the kept set does not depend on which run finished first.
    """
    if kind not in KINDS:
        raise ValueError(f"task kind {kind!r}: expected one of {', '.join(KINDS)}")
    decontam = Decontaminator(config.benchmarks, config.ngram)
    root = env.src_dir
    tests = test_files(root)
    baseline = run_tests(env, sandbox)
    summary = dict(kind=kind, repo=env.repo, revision=env.revision, env_digest=env.digest, decontam=decontam.label)
    if not baseline.completed:
        why = f"baseline run did not complete ({baseline.exec_outcome}: {baseline.exec_reason})"
        return TaskSet(**summary, tasks=(), candidates=0, rejected={why: 1})
    passing = baseline.passed() - set(flaky)
    rejected: Counter[str] = Counter()
    contaminated: dict[str, str] = {}
    kept: list[Task] = []
    per_target: Counter[tuple[str, str]] = Counter()
    stream = iter(_candidates(root, tests, kind, config))
    tried = 0
    with ThreadPoolExecutor(sandbox.config.workers, thread_name_prefix="derive") as pool:
        while tried < config.max_candidates and len(kept) < config.max_tasks:
            size = min(sandbox.config.workers, config.max_candidates - tried)
            batch = _next_batch(stream, size, per_target, config.per_function, decontam, contaminated)
            if not batch:
                break
            outcomes = list(pool.map(lambda c: _try(env, kind, config, sandbox, c, passing), batch))
            for candidate, (task, reason) in zip(batch, outcomes):
                tried += 1
                if task is None:
                    rejected[reason] += 1
                elif len(kept) < config.max_tasks:
                    kept.append(task)
                    per_target[(candidate.file, candidate.target)] += 1
            if progress is not None:
                progress(tried, config.max_candidates)
    return TaskSet(**summary, tasks=tuple(kept), candidates=tried, rejected=dict(rejected), contaminated=contaminated,
                   baseline_passed=len(passing))


def _next_batch(stream: Iterator[Candidate], size: int, per_target: Counter, per_function: int,
                decontam: Decontaminator, contaminated: dict[str, str]) -> list[Candidate]:
    """The next `size` candidates whose function still has room and that are clean of the eval sets."""
    batch: list[Candidate] = []
    pending: Counter[tuple[str, str]] = Counter()
    for candidate in stream:
        key = (candidate.file, candidate.target)
        if per_target[key] + pending[key] >= per_function:
            continue
        hit = decontam.verdict(candidate.function_text)
        if hit is not None:
            contaminated[f"{candidate.file}::{candidate.target}"] = hit
            continue
        batch.append(candidate)
        pending[key] += 1
        if len(batch) == size:
            break
    return batch


def _candidates(root, tests, kind: str, config: DeriveConfig) -> Iterable[Candidate]:
    if kind == "function_completion":
        found = completion_candidates(root, tests, min_lines=config.min_body_lines, max_lines=config.max_body_lines)
        random.Random(config.seed).shuffle(found)
        return found
    return mutation_candidates(root, tests, operators=config.operators, seed=config.seed,
                               tries_per_function=3 * config.per_function)


def _try(env: Environment, kind: str, config: DeriveConfig, sandbox: Sandbox, candidate: Candidate,
         passing: set[str]) -> tuple[Task | None, str]:
    """(the validated task, '') or (None, why the candidate was dropped)."""
    # sorted: the order every later run of these ids uses (score.py), so order-dependent suites agree
    covered = sorted(t for t in passing if _in_files(t, candidate.test_files, env.runner))
    if not covered:
        return None, "no passing test in the files that mention the function"
    broken = run_tests(env, sandbox, test_ids=covered, overlay={candidate.file: candidate.broken})
    if not broken.completed:
        # typically the break raises at import (a conftest or module-level call): pytest stops early
        return None, f"broken run did not complete ({broken.exec_outcome}: {broken.exec_reason})"
    if broken.collection_errors:
        # the break runs at import: no test could even be collected, so every one would "fail to
        # pass" and the task would grade the import, not the function
        return None, "broken file stops test collection (it runs at import)"
    still = broken.passed()
    fail_to_pass = tuple(t for t in covered if t not in still)
    pass_to_pass = tuple(t for t in covered if t in still)
    if not fail_to_pass:
        return None, "no test fails on the broken file"
    if kind == "function_completion":
        prompt = completion_prompt(env.repo, candidate.file, candidate.target, candidate.broken)
    else:
        prompt = bug_prompt(env.repo, candidate.file, fail_to_pass, candidate.broken)
    task = Task(task_id=task_id_of(kind, env.digest, candidate.file, candidate.target, candidate.mutation),
                kind=kind, repo=env.repo, revision=env.revision, env_digest=env.digest, env_root=env.root,
                file=candidate.file, target=candidate.target, mutation=candidate.mutation, prompt=prompt,
                broken_overlay={candidate.file: candidate.broken}, reference=candidate.reference,
                fail_to_pass=fail_to_pass, pass_to_pass=pass_to_pass, seed=config.seed,
                difficulty=Difficulty(lines_removed=candidate.lines_removed, tests_covering=len(fail_to_pass),
                                      test_files=len(candidate.test_files), complexity=candidate.complexity,
                                      operator=candidate.operator))
    check = score_candidate(task, task.reference, sandbox, env)
    if check.outcome is not Verdict.PASSED:
        return None, f"reference does not pass ({check.outcome.value})"
    return task.model_copy(update={"reference_s": round(check.duration_s, 3)}), ""


def _in_files(test_id: str, files: tuple[str, ...], runner: Runner) -> bool:
    """Whether a test id belongs to one of `files` (pytest node ids, or unittest dotted ids)."""
    if runner is Runner.UNITTEST:
        return any(test_id.startswith(f[:-3].replace("/", ".") + ".") for f in files)
    return test_id.split("::", 1)[0] in files

