"""The eval suite: tasks registered with configs, run on the inference engine, scored into Iceberg.

Tasks: `bpb` (bits per byte on each source's held-out split), `humaneval` (pass@1 / pass@k with
checks in the sandbox), `line_completion` (next-line exact match on held-out stdlib functions),
`repo_tasks` (pass@1 on stored function-completion tasks of real repositories, scored through the
task engine on Ray).

Reading scores (`factory evals`, `sweeps.results`) needs only `results`, so that is all the package
imports; the suite and the tasks bring the inference engine and torch, and are imported when first
used (PEP 562 `__getattr__`). The tasks register themselves when a suite first looks one up
(`factory.evals.tasks.builtin_tasks`), and `TASKS` read from here is the filled registry.
"""

from factory.evals.results import RESULTS_TABLE, SAMPLES_TABLE, eval_id_of, results, score_table
from factory.evals.tasks import Metric, TaskConfig, TaskContext, TaskResult, register

__all__ = [
    "RESULTS_TABLE", "SAMPLES_TABLE", "TASKS", "EvalReport", "Metric", "SuiteConfig", "TaskConfig", "TaskContext",
    "TaskResult", "eval_id_of", "evaluate", "register", "results", "score_table",
]


def __getattr__(name: str):
    if name in ("EvalReport", "SuiteConfig", "evaluate"):
        from factory.evals import suite

        return getattr(suite, name)
    if name == "TASKS":
        from factory.evals.tasks import builtin_tasks

        return builtin_tasks()
    raise AttributeError(f"module 'factory.evals' has no attribute {name!r}")
