"""Tasks derived from repositories' test suites, and scoring candidates on them.

Files: model.py (Task, DeriveConfig, TaskSet, AttemptOutcome), source.py (functions, coverage by
test files, unified diffs), completion.py (body removal and splicing), mutation.py (seeded AST
mutations), decontam.py (eval-set overlap), derive.py (derive_tasks: break, run, validate),
score.py (score_candidate: the reward), store.py (tasks.<kind> tables with lineage); engine.py
(the Ray task engine) serves attempts to consumers.

Nothing here imports the sandbox's users at import time beyond what each module needs, so the
records load cheaply in Ray workers and Dagster.
"""
