"""Declared schemas of the factory's own tables.

Tables are created from these, not inferred from a writer's data, so a bad writer fails loudly
(`commit` names the table and the mismatching columns) instead of silently evolving a schema.
Field ids are fixed here forever: Iceberg tracks columns by id, not by name.
"""

from __future__ import annotations

from pyiceberg.schema import Schema
from pyiceberg.types import (
    BooleanType,
    DoubleType,
    IntegerType,
    ListType,
    LongType,
    NestedField,
    StringType,
    TimestamptzType,
)

RAW_DOCUMENTS = Schema(
    NestedField(1, "doc_id", StringType(), required=True, doc="sha256 of source, path and content (24 hex)"),
    NestedField(2, "source", StringType(), required=True, doc="source name, e.g. python_stdlib"),
    NestedField(3, "path", StringType(), required=True, doc="path relative to the source root, or record locator"),
    NestedField(4, "text", StringType(), required=True, doc="document text, decoded as UTF-8"),
    NestedField(5, "language", StringType(), required=True, doc="from the file extension or the source config"),
    NestedField(6, "bytes", LongType(), required=True, doc="UTF-8 size of text"),
    NestedField(7, "license", StringType(), required=False, doc="license where known"),
    NestedField(8, "content_sha256", StringType(), required=True, doc="sha256 of text"),
    NestedField(9, "ingested_at", TimestamptzType(), required=True, doc="when this ingest read the source"),
)

LINEAGE = Schema(
    NestedField(1, "version_id", StringType(), required=True, doc="e.g. raw.python_stdlib@<snapshot id>"),
    NestedField(2, "kind", StringType(), required=True, doc="table_snapshot, tokenizer, mix_version, ..."),
    NestedField(3, "name", StringType(), required=True, doc="table or artifact name"),
    NestedField(4, "uri", StringType(), required=False, doc="table location or artifact URI"),
    NestedField(5, "content_hash", StringType(), required=False),
    NestedField(
        6, "upstream", ListType(100, StringType(), element_required=True), required=True,
        doc="version_ids this version was produced from",
    ),
    NestedField(7, "config_json", StringType(), required=True),
    NestedField(8, "config_hash", StringType(), required=True),
    NestedField(9, "code_version", StringType(), required=True),
    NestedField(10, "env_lock", StringType(), required=True),
    NestedField(11, "asset_key", StringType(), required=True),
    NestedField(12, "partition", StringType(), required=True),
    NestedField(13, "run_id", StringType(), required=True),
    NestedField(14, "snapshot_id", LongType(), required=False),
    NestedField(15, "metadata_json", StringType(), required=True, doc="rows, bytes, ... as JSON"),
    NestedField(16, "created_at", TimestamptzType(), required=True),
)

# Staged and refined documents: raw columns plus the content kind and redaction counts. Fields are
# optional because Spark executors write these files (registered with add_files), and Spark
# writes every Parquet column as optional.
REFINED_DOCUMENTS = Schema(
    NestedField(1, "doc_id", StringType(), required=False),
    NestedField(2, "source", StringType(), required=False),
    NestedField(3, "path", StringType(), required=False),
    NestedField(4, "text", StringType(), required=False, doc="normalized (and, after redaction, redacted) text"),
    NestedField(5, "language", StringType(), required=False),
    NestedField(6, "kind", StringType(), required=False, doc="code or prose"),
    NestedField(7, "bytes", LongType(), required=False),
    NestedField(8, "license", StringType(), required=False),
    NestedField(9, "content_sha256", StringType(), required=False, doc="sha256 of text"),
    NestedField(10, "ingested_at", TimestamptzType(), required=False),
    NestedField(11, "redactions", StringType(), required=False, doc='JSON counts per kind, e.g. {"email": 2}'),
)

# Every document a refinement step dropped, with the step and the reason: auditable and queryable.
EXCLUSIONS = Schema(
    NestedField(1, "source", StringType(), required=False),
    NestedField(2, "step", StringType(), required=False, doc="normalize, exact_dedup, near_dedup, ..."),
    NestedField(3, "reason", StringType(), required=False, doc="one reason per rule"),
    NestedField(4, "detail", StringType(), required=False, doc="measured value, duplicate of, matched task"),
    NestedField(5, "doc_id", StringType(), required=False),
    NestedField(6, "path", StringType(), required=False),
    NestedField(7, "bytes", LongType(), required=False),
    NestedField(8, "text", StringType(), required=False),
)

# One row per (mix version, stage, source): what a training run streams. `plan_json` repeats the
# whole version (the authoritative form the loader reads); the other columns are for SQL.
MIX_VERSIONS = Schema(
    NestedField(1, "mix", StringType(), required=True, doc="mix name"),
    NestedField(2, "version", IntegerType(), required=True, doc="1, 2, ... per mix"),
    NestedField(3, "version_id", StringType(), required=True, doc="mix/<name>@v<N>"),
    NestedField(4, "stage", IntegerType(), required=True, doc="curriculum stage; the last is the spec's weights"),
    NestedField(5, "until_tokens", LongType(), required=False, doc="stage end in tokens; null for the last"),
    NestedField(6, "source", StringType(), required=True, doc="namespace.table"),
    NestedField(7, "weight", DoubleType(), required=True),
    NestedField(8, "snapshot_id", LongType(), required=True, doc="pinned snapshot of source"),
    NestedField(9, "rows", LongType(), required=True, doc="rows at the pinned snapshot"),
    NestedField(10, "train_rows", LongType(), required=True, doc="rows outside the held-out split"),
    NestedField(11, "bytes", LongType(), required=True, doc="UTF-8 bytes of the training split"),
    NestedField(12, "token_estimate", LongType(), required=True, doc="training-split tokens (bytes / measured bytes per token)"),
    NestedField(13, "max_epochs", DoubleType(), required=False),
    NestedField(14, "seq_len", IntegerType(), required=True),
    NestedField(15, "tokenizer", StringType(), required=True, doc="tokenizer version id"),
    NestedField(16, "plan_hash", StringType(), required=True, doc="hash of the spec plus the pins"),
    NestedField(17, "plan_json", StringType(), required=True),
    NestedField(18, "created_at", TimestamptzType(), required=True),
)

# One row per checkpoint a training run wrote (the eval sensor reads new rows with a cursor).
TRAIN_CHECKPOINTS = Schema(
    NestedField(1, "checkpoint_id", StringType(), required=True, doc="ckpt/<run>@<step>"),
    NestedField(2, "run", StringType(), required=True, doc="run name (experiment name unless overridden)"),
    NestedField(3, "experiment", StringType(), required=True),
    NestedField(4, "step", LongType(), required=True),
    NestedField(5, "tokens", LongType(), required=True, doc="tokens trained on up to this step"),
    NestedField(6, "uri", StringType(), required=True, doc="checkpoint file URI"),
    NestedField(7, "sha256", StringType(), required=True),
    NestedField(8, "bytes", LongType(), required=True),
    NestedField(9, "loss", DoubleType(), required=False, doc="training loss at the step"),
    NestedField(10, "mix_version", StringType(), required=True),
    NestedField(11, "config_hash", StringType(), required=True, doc="experiment identity hash"),
    NestedField(12, "eval_every", LongType(), required=True),
    NestedField(13, "code_version", StringType(), required=True),
    NestedField(14, "created_at", TimestamptzType(), required=True),
)

# Per-step training metrics, so loss curves join with lineage in SQL.
TRAIN_METRICS = Schema(
    NestedField(1, "run", StringType(), required=True),
    NestedField(2, "step", LongType(), required=True),
    NestedField(3, "name", StringType(), required=True, doc="loss, grad_norm, lr, tokens_per_s, mfu, loader_stall, ..."),
    NestedField(4, "value", DoubleType(), required=True),
    NestedField(5, "created_at", TimestamptzType(), required=True),
)

# Incidents a run detected: replica divergence, non-finite steps, spikes, rollbacks.
TRAIN_INCIDENTS = Schema(
    NestedField(1, "run", StringType(), required=True),
    NestedField(2, "step", LongType(), required=True),
    NestedField(3, "kind", StringType(), required=True, doc="replica_mismatch, gradient_mismatch, nonfinite, spike, rollback"),
    NestedField(4, "detail", StringType(), required=True, doc="JSON: ranks, parameters, values, action"),
    NestedField(5, "created_at", TimestamptzType(), required=True),
)

# One row per (eval, task, metric): the scores of one checkpoint's export under one suite.
EVAL_RESULTS = Schema(
    NestedField(1, "eval_id", StringType(), required=True, doc="eval/<run>@<step>/<suite>"),
    NestedField(2, "checkpoint_id", StringType(), required=True),
    NestedField(3, "export_id", StringType(), required=True),
    NestedField(4, "run", StringType(), required=True),
    NestedField(5, "step", LongType(), required=True),
    NestedField(6, "tokens", LongType(), required=True, doc="tokens the checkpoint trained on"),
    NestedField(7, "suite", StringType(), required=True),
    NestedField(8, "task", StringType(), required=True, doc="task label, e.g. bpb, humaneval, line_completion"),
    NestedField(9, "metric", StringType(), required=True, doc="e.g. pass@1, exact_match, or a source table for bpb"),
    NestedField(10, "value", DoubleType(), required=True),
    NestedField(11, "n", LongType(), required=True, doc="items the value averages over"),
    NestedField(12, "stderr", DoubleType(), required=False, doc="standard error of the value"),
    NestedField(13, "engine", StringType(), required=True, doc="inference engine (vllm, transformers)"),
    NestedField(14, "config_hash", StringType(), required=True, doc="hash of the suite config"),
    NestedField(15, "created_at", TimestamptzType(), required=True),
)

# Per-item outcomes behind the scores: which problem passed, what the model wrote, why it failed.
EVAL_SAMPLES = Schema(
    NestedField(1, "eval_id", StringType(), required=True),
    NestedField(2, "task", StringType(), required=True),
    NestedField(3, "item", StringType(), required=True, doc="problem id, file:line, source:path"),
    NestedField(4, "reference", StringType(), required=False, doc="expected output where there is one"),
    NestedField(5, "completion", StringType(), required=False, doc="what the model produced (truncated)"),
    NestedField(6, "outcome", StringType(), required=True, doc="passed, failed, timeout, oom, crashed, match, miss, scored"),
    NestedField(7, "score", DoubleType(), required=True),
)

# Accepted rows of a synthetic pipeline: the refined-document columns the loader streams (doc_id,
# text, bytes, ...) plus per-row provenance.
SYNTHETIC_DOCUMENTS = Schema(
    NestedField(1, "doc_id", StringType(), required=True, doc="sha256 of pipeline, seed id and text (24 hex)"),
    NestedField(2, "source", StringType(), required=True, doc="pipeline name"),
    NestedField(3, "path", StringType(), required=True, doc="seed id"),
    NestedField(4, "text", StringType(), required=True, doc="the training text"),
    NestedField(5, "language", StringType(), required=True),
    NestedField(6, "kind", StringType(), required=True, doc="code or prose"),
    NestedField(7, "bytes", LongType(), required=True),
    NestedField(8, "content_sha256", StringType(), required=True),
    NestedField(9, "seed_id", StringType(), required=True),
    NestedField(10, "agent_chain", ListType(101, StringType(), element_required=True), required=True,
                doc="stages (agents) that produced the row, in order"),
    NestedField(11, "export_id", StringType(), required=False, doc="model that generated (none for functions)"),
    NestedField(12, "template_hash", StringType(), required=True, doc="hash of the stages' templates and sampling"),
    NestedField(13, "verdicts", StringType(), required=True, doc="JSON: validator -> passed"),
    NestedField(14, "attempts", IntegerType(), required=True, doc="generation attempts, all stages"),
    NestedField(15, "batch_id", StringType(), required=True, doc="the pipeline run that produced the row"),
    NestedField(16, "fields", StringType(), required=True, doc="JSON: the candidate's fields (seed and stage outputs)"),
    NestedField(17, "created_at", TimestamptzType(), required=True),
)

# Rejected candidates of a synthetic pipeline, with the stage or validator that rejected them.
SYNTHETIC_REJECTED = Schema(
    NestedField(1, "seed_id", StringType(), required=True),
    NestedField(2, "stage", StringType(), required=True, doc="generator stage or validator kind that rejected"),
    NestedField(3, "reason", StringType(), required=True),
    NestedField(4, "text", StringType(), required=False, doc="the candidate text, when there was one"),
    NestedField(5, "fields", StringType(), required=True, doc="JSON: the candidate's fields so far"),
    NestedField(6, "attempts", IntegerType(), required=True),
    NestedField(7, "batch_id", StringType(), required=True),
    NestedField(8, "created_at", TimestamptzType(), required=True),
)

# One row per (sweep cell, task, metric) of the cell's final evaluated step; a cell not evaluated
# yet has one row with empty scores. Replaced per sweep by `factory.experiments.results`.
SWEEP_RESULTS = Schema(
    NestedField(1, "sweep", StringType(), required=True, doc="sweep name"),
    NestedField(2, "cell", IntegerType(), required=True, doc="cell index in the sweep's expansion"),
    NestedField(3, "run", StringType(), required=True, doc="<sweep>-<hash8>"),
    NestedField(4, "config_hash", StringType(), required=True, doc="experiment identity hash"),
    NestedField(5, "params_json", StringType(), required=True, doc="canonical JSON: field path -> the cell's value"),
    NestedField(6, "experiment_json", StringType(), required=True, doc="canonical JSON of the cell's experiment"),
    NestedField(7, "status", StringType(), required=True, doc="evaluated, trained (checkpoints, no eval) or pending"),
    NestedField(8, "rank", IntegerType(), required=True, doc="the cell's rank by ranked_by (1 = best, unscored last)"),
    NestedField(9, "ranked_by", StringType(), required=True, doc="the sweep's task/metric, lower is better"),
    NestedField(10, "step", LongType(), required=False, doc="evaluated step, or the last checkpoint's when trained"),
    NestedField(11, "tokens", LongType(), required=False, doc="tokens trained on up to step"),
    NestedField(12, "train_loss", DoubleType(), required=False, doc="training loss of the checkpoint at step"),
    NestedField(13, "task", StringType(), required=False),
    NestedField(14, "metric", StringType(), required=False),
    NestedField(15, "value", DoubleType(), required=False),
    NestedField(16, "stderr", DoubleType(), required=False),
    NestedField(17, "eval_id", StringType(), required=False),
    NestedField(18, "checkpoint_id", StringType(), required=False),
    NestedField(19, "created_at", TimestamptzType(), required=True, doc="when this row was written"),
)

# One row per attempt key (sha256 of task id and candidate) of the task engine
# (`factory.tasks.engine`): written once, however many consumers asked or tries it took.
TASK_ATTEMPTS = Schema(
    NestedField(1, "attempt_key", StringType(), required=True, doc="sha256 of task_id, NUL, candidate (64 hex)"),
    NestedField(2, "task_id", StringType(), required=True),
    NestedField(3, "candidate_hash", StringType(), required=True, doc="sha256 of the candidate text (64 hex)"),
    NestedField(4, "consumers", ListType(101, StringType(), element_required=True), required=True,
                doc="consumers that had asked for the key when the row was written, sorted"),
    NestedField(5, "priority", IntegerType(), required=True, doc="the most urgent priority it was asked at"),
    NestedField(6, "outcome", StringType(), required=True, doc="the work's outcome, or timeout / crashed / error"),
    NestedField(7, "reward", DoubleType(), required=True),
    NestedField(8, "tries", IntegerType(), required=True, doc="starts of the attempt in workers, retries included"),
    NestedField(9, "duration_s", DoubleType(), required=True, doc="wall time of the last try in its worker (s)"),
    NestedField(10, "worker", StringType(), required=True, doc="<node id prefix>/<pid> of the last try"),
    NestedField(11, "pid", LongType(), required=False, doc="worker process id of the last try"),
    NestedField(12, "error", StringType(), required=True, doc="why it failed, empty when the work returned"),
    NestedField(13, "detail", StringType(), required=True, doc="JSON: the work's fields besides outcome, reward"),
    NestedField(14, "engine_run", StringType(), required=True, doc="the engine instance that wrote the row"),
    NestedField(15, "created_at", TimestamptzType(), required=True),
)

# One row per validated task of `tasks.function_completion` / `tasks.bug_fixing` (`factory.tasks.store`):
# both tables share this schema; a derivation replaces its environment's rows in one commit.
TASKS = Schema(
    NestedField(1, "task_id", StringType(), required=True, doc="content hash of kind, env digest, file, target, mutation (24 hex)"),
    NestedField(2, "kind", StringType(), required=True, doc="function_completion or bug_fixing"),
    NestedField(3, "repo", StringType(), required=True),
    NestedField(4, "revision", StringType(), required=True),
    NestedField(5, "env_digest", StringType(), required=True, doc="digest of the environment the task runs in"),
    NestedField(6, "env_root", StringType(), required=True, doc="host directory of the environment at derivation"),
    NestedField(7, "file", StringType(), required=True, doc="the broken file, relative to the repository root"),
    NestedField(8, "target", StringType(), required=True, doc="qualified name of the function"),
    NestedField(9, "mutation", StringType(), required=True, doc="'' for completion, else the mutation's description"),
    NestedField(10, "prompt", StringType(), required=True),
    NestedField(11, "broken_overlay", StringType(), required=True, doc="JSON {file: text of the broken file}"),
    NestedField(12, "reference", StringType(), required=True, doc="the original body, or the inverse unified diff"),
    NestedField(13, "fail_to_pass", ListType(111, StringType(), element_required=True), required=True),
    NestedField(14, "pass_to_pass", ListType(112, StringType(), element_required=True), required=True),
    NestedField(15, "lines_removed", IntegerType(), required=True),
    NestedField(16, "tests_covering", IntegerType(), required=True, doc="FAIL_TO_PASS count"),
    NestedField(17, "test_files", IntegerType(), required=True, doc="test files that mention the target"),
    NestedField(18, "complexity", IntegerType(), required=True, doc="cyclomatic-ish count of the target"),
    NestedField(19, "operator", StringType(), required=True, doc="remove_body or the mutation operator"),
    NestedField(20, "seed", LongType(), required=True),
    NestedField(21, "decontam", StringType(), required=True, doc="what the task was checked clean against"),
    NestedField(22, "task_set", StringType(), required=True, doc="version id of the derivation (lineage)"),
    NestedField(23, "created_at", TimestamptzType(), required=True),
    NestedField(24, "reference_s", DoubleType(), required=True, doc="wall time of the reference's validation run (s)"),
)

# One row per repository build of `factory.envs.build` (`factory.envs.store`): its phases, its
# outcome class and the rule behind it, the environment it produced. Appended per build batch.
ENV_BUILDS = Schema(
    NestedField(1, "build_id", StringType(), required=True, doc="unique id of the build attempt (32 hex)"),
    NestedField(2, "repo", StringType(), required=True),
    NestedField(3, "revision", StringType(), required=True, doc="sdist version, git sha or local-<digest>"),
    NestedField(4, "repo_set", StringType(), required=True),
    NestedField(5, "origin", StringType(), required=True, doc="lineage id of the source version"),
    NestedField(6, "builder", StringType(), required=True, doc="heuristic, or an agent's name"),
    NestedField(7, "failure_class", StringType(), required=True, doc="passed, no_build_system, ... (FailureClass)"),
    NestedField(8, "failure_detail", StringType(), required=True),
    NestedField(9, "rule", StringType(), required=True, doc="id of the builder rule behind the outcome"),
    NestedField(10, "rules_json", StringType(), required=True, doc="JSON: plan part -> deciding rule id"),
    NestedField(11, "resolve_outcome", StringType(), required=True, doc="ok, failed or skipped"),
    NestedField(12, "resolve_s", DoubleType(), required=True),
    NestedField(13, "build_outcome", StringType(), required=True),
    NestedField(14, "build_s", DoubleType(), required=True),
    NestedField(15, "test_outcome", StringType(), required=True),
    NestedField(16, "test_s", DoubleType(), required=True),
    NestedField(17, "lock_hash", StringType(), required=True, doc="sha256 of lock.json ('' before a lock)"),
    NestedField(18, "env_digest", StringType(), required=True, doc="'' when no environment was built"),
    NestedField(19, "env_uri", StringType(), required=True),
    NestedField(20, "tests_passed", IntegerType(), required=True),
    NestedField(21, "tests_failed", IntegerType(), required=True, doc="failed or errored, flaky ones included"),
    NestedField(22, "tests_flaky", IntegerType(), required=True),
    NestedField(23, "collection_errors", IntegerType(), required=True),
    NestedField(24, "version_id", StringType(), required=True, doc="lineage id env_build/<repo>@<revision>/<digest12>"),
    NestedField(25, "built_at", TimestamptzType(), required=True),
    NestedField(26, "attempt", IntegerType(), required=True, doc="attempts the builder made (plans tried)"),
)

# One row per test per build (the full suite's first run; `flaky`: it failed there, passed on a rerun).
ENV_TESTS = Schema(
    NestedField(1, "build_id", StringType(), required=True),
    NestedField(2, "repo", StringType(), required=True),
    NestedField(3, "env_digest", StringType(), required=True),
    NestedField(4, "test_id", StringType(), required=True, doc="pytest node id or unittest id"),
    NestedField(5, "outcome", StringType(), required=True, doc="passed, failed, error or skipped"),
    NestedField(6, "duration_s", DoubleType(), required=True),
    NestedField(7, "flaky", BooleanType(), required=True),
    NestedField(8, "message", StringType(), required=True, doc="first 500 characters of the failure"),
)

# One row per RL rollout sample (`factory.posttrain.rl.store`): what the policy wrote, what it earned,
# and which policy version, task and environment it came from. Rows of a step are committed with the
# update that used them; a resumed run first drops rows of steps after its checkpoint.
RL_ROLLOUTS = Schema(
    NestedField(1, "run", StringType(), required=True),
    NestedField(2, "step", LongType(), required=True, doc="the update (1-based) whose batch held the sample"),
    NestedField(3, "policy_version", LongType(), required=True, doc="version of the weights that sampled it (0 = start)"),
    NestedField(4, "lag", LongType(), required=True, doc="step - 1 - policy_version: versions it lagged the trainer"),
    NestedField(5, "task_id", StringType(), required=True),
    NestedField(6, "env_digest", StringType(), required=True, doc="environment of the check ('' = the sandbox alone)"),
    NestedField(7, "group", IntegerType(), required=True, doc="position of the task in its step's batch"),
    NestedField(8, "sample", IntegerType(), required=True, doc="position in the task's group"),
    NestedField(9, "completion", StringType(), required=True, doc="the completion as scored"),
    NestedField(10, "completion_tokens", IntegerType(), required=True),
    NestedField(11, "finish_reason", StringType(), required=True, doc="stop or length"),
    NestedField(12, "reward", DoubleType(), required=True),
    NestedField(13, "advantage", DoubleType(), required=True),
    NestedField(14, "outcome", StringType(), required=True, doc="the check's verdict: passed, failed, timeout, ..."),
    NestedField(15, "reason", StringType(), required=True, doc="why: the harness's or the test run's reason"),
    NestedField(16, "attempt_key", StringType(), required=True, doc="the tasks.attempts row that scored it"),
    NestedField(17, "used", BooleanType(), required=True, doc="false when dropped (older than max_staleness)"),
    NestedField(18, "created_at", TimestamptzType(), required=True),
)

# Instruction/response examples for supervised fine-tuning (factory.posttrain.sft.data), each with the
# synthetic row it was built from; one dataset's rows are replaced together when its source moves on.
SFT_EXAMPLES = Schema(
    NestedField(1, "dataset", StringType(), required=True, doc="dataset name (factory.posttrain.sft.data.DATASETS)"),
    NestedField(2, "example_id", StringType(), required=True, doc="sha256 of dataset, prompt and response (24 hex)"),
    NestedField(3, "messages", StringType(), required=True, doc="JSON: the conversation, [{role, content}, ...]"),
    NestedField(4, "prompt", StringType(), required=True, doc="the user turn"),
    NestedField(5, "response", StringType(), required=True, doc="the assistant turn (the checked answer)"),
    NestedField(6, "source_table", StringType(), required=True, doc="the synthetic table the row came from"),
    NestedField(7, "source_snapshot", LongType(), required=True, doc="its snapshot read"),
    NestedField(8, "source_id", StringType(), required=True, doc="doc_id of the synthetic row"),
    NestedField(9, "seed_id", StringType(), required=True),
    NestedField(10, "agent_chain", ListType(101, StringType(), element_required=True), required=True,
                doc="stages (agents) that produced the synthetic row"),
    NestedField(11, "verdicts", StringType(), required=True, doc="JSON: validator -> passed, of the synthetic row"),
    NestedField(12, "created_at", TimestamptzType(), required=True),
)

# Podium (factory.podium): every generation people saw, append-only. A chat turn is one row (its
# conversation so far in `messages`); a battle is two rows, sides A and B, under one battle_id.
PODIUM_CONVERSATIONS = Schema(
    NestedField(1, "conversation_id", StringType(), required=True, doc="chat: one per conversation; battle: its id"),
    NestedField(2, "turn", IntegerType(), required=True, doc="0-based turn of the conversation"),
    NestedField(3, "kind", StringType(), required=True, doc="chat or battle"),
    NestedField(4, "side", StringType(), required=True, doc="battle: A or B; chat: ''"),
    NestedField(5, "user", StringType(), required=True),
    NestedField(6, "export_id", StringType(), required=True, doc="export/<run>@<step> (a lineage version id)"),
    NestedField(7, "export_sha256", StringType(), required=True, doc="content hash of the export's files"),
    NestedField(8, "checkpoint_id", StringType(), required=True),
    NestedField(9, "mode", StringType(), required=True, doc="chat (the export's chat template) or completion"),
    NestedField(10, "messages", StringType(), required=True, doc="JSON: the conversation sent, [{role, content}]"),
    NestedField(11, "prompt", StringType(), required=True, doc="the last user turn"),
    NestedField(12, "response", StringType(), required=True),
    NestedField(13, "finish_reason", StringType(), required=True, doc="stop, length or error"),
    NestedField(14, "sampling", StringType(), required=True, doc="JSON: temperature, top_p, max_tokens, seed"),
    NestedField(15, "backend", StringType(), required=True, doc="inference: local (in-process) or an endpoint URL"),
    NestedField(16, "first_token_ms", DoubleType(), required=False),
    NestedField(17, "tokens", IntegerType(), required=True, doc="tokens generated"),
    NestedField(18, "created_at", TimestamptzType(), required=True),
)

# One row per vote on a battle; a battle gets at most one (Podium refuses a second).
PODIUM_VOTES = Schema(
    NestedField(1, "battle_id", StringType(), required=True),
    NestedField(2, "user", StringType(), required=True),
    NestedField(3, "vote", StringType(), required=True, doc="a, b, tie or bothbad"),
    NestedField(4, "export_a", StringType(), required=True),
    NestedField(5, "export_b", StringType(), required=True),
    NestedField(6, "checkpoint_a", StringType(), required=True),
    NestedField(7, "checkpoint_b", StringType(), required=True),
    NestedField(8, "prompt", StringType(), required=True),
    NestedField(9, "response_a", StringType(), required=True),
    NestedField(10, "response_b", StringType(), required=True),
    NestedField(11, "sampling", StringType(), required=True, doc="JSON: the sampling both sides used"),
    NestedField(12, "created_at", TimestamptzType(), required=True),
)

# Votes with a winner as chosen/rejected pairs (ties and both-bad carry no preference), rebuilt from
# one podium.votes snapshot: what a preference or SFT data config reads.
PODIUM_PREFERENCES = Schema(
    NestedField(1, "battle_id", StringType(), required=True),
    NestedField(2, "user", StringType(), required=True),
    NestedField(3, "prompt", StringType(), required=True),
    NestedField(4, "chosen", StringType(), required=True),
    NestedField(5, "rejected", StringType(), required=True),
    NestedField(6, "chosen_export", StringType(), required=True),
    NestedField(7, "rejected_export", StringType(), required=True),
    NestedField(8, "votes_snapshot", LongType(), required=True, doc="the podium.votes snapshot it was built from"),
    NestedField(9, "created_at", TimestamptzType(), required=True),
)
