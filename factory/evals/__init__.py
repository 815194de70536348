"""The eval suite: tasks registered with configs, run on the inference engine, scored into Iceberg.

Tasks: `bpb` (bits per byte on each source's held-out split), `humaneval` (pass@1 / pass@k with
checks in the sandbox), `line_completion` (next-line exact match on held-out stdlib functions).
Importing this package registers them.
"""

from factory.evals import bpb, completion, humaneval  # noqa: F401  (register the tasks)
from factory.evals.results import RESULTS_TABLE, SAMPLES_TABLE, eval_id_of, results, score_table
from factory.evals.suite import EvalReport, SuiteConfig, evaluate
from factory.evals.tasks import TASKS, Metric, TaskConfig, TaskContext, TaskResult, register

__all__ = [
    "RESULTS_TABLE", "SAMPLES_TABLE", "TASKS", "EvalReport", "Metric", "SuiteConfig", "TaskConfig", "TaskContext",
    "TaskResult", "eval_id_of", "evaluate", "register", "results", "score_table",
]
