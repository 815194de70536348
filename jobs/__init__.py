"""Asset-selection jobs: what the UI's launch buttons, CI and schedules run."""

from dagster import AssetKey, AssetSelection, define_asset_job

from assets.envs import repo_set_partitions
from assets.evals import checkpoint_partitions
from assets.refine import dedup_asset_keys
from assets.sweeps import sweep_partitions
from factory.experiments.queue import PRIORITY, RETRIES

# Run-queue priorities (`dagster/priority`, higher starts first): evals jump ahead of training,
# sweep cells wait behind it (factory.experiments.queue).
EVAL_PRIORITY = str(PRIORITY["eval"])

ingest_job = define_asset_job(
    "ingest_job",
    selection=AssetSelection.groups("raw"),
    description="Ingest every embedded source into its raw.* Iceberg table.",
)

dedup_job = define_asset_job(
    "dedup_job",
    selection=AssetSelection.assets(*dedup_asset_keys()),
    description="Exact and near dedup for every source (their normalized inputs must exist).",
)

tokenize_job = define_asset_job(
    "tokenize_job",
    selection=AssetSelection.assets(AssetKey("tokenizer")),
    description="Train the tokenizer on a sample of the refined tables.",
)

mix_job = define_asset_job(
    "mix_job",
    selection=AssetSelection.assets(AssetKey("mix")),
    description="Register a new version of one mix (pick the mix as the partition).",
)

train_job = define_asset_job(
    "train_job",
    selection=AssetSelection.assets(AssetKey("training_run")),
    description="Train one run (partition <experiment>-<hash8>, added when it is queued); resumes from its latest "
                "valid checkpoint.",
    # retried (configs/dagster.yaml enables run retries): a preempted run resumes from its checkpoint
    tags={"factory/kind": "training", "dagster/priority": str(PRIORITY["training"]),
          "dagster/max_retries": str(RETRIES)},
)

eval_job = define_asset_job(
    "eval_job",
    selection=AssetSelection.assets(AssetKey("checkpoint_export"), AssetKey("eval_scores"))
    - AssetSelection.groups("synthetic"),
    partitions_def=checkpoint_partitions,
    description="Export one checkpoint (pick it as the partition), check it against the training model, evaluate it.",
    tags={"factory/kind": "eval", "dagster/priority": EVAL_PRIORITY},
)

synth_job = define_asset_job(
    "synth_job",
    selection=AssetSelection.groups("synthetic"),
    description="Run every synthetic-data pipeline once (configs/synth); new snapshots refresh the mixes that use them.",
    tags={"factory/kind": "synth"},
)

sweep_job = define_asset_job(
    "sweep_job",
    selection=AssetSelection.assets(AssetKey(["sweeps", "results"])),
    partitions_def=sweep_partitions,
    description="Rank one sweep's cells (pick the sweep as the partition) into sweeps.results, with a plot.",
)

automix_job = define_asset_job(
    "automix_job",
    selection=AssetSelection.assets(AssetKey("automix")),
    description="Fit the auto-mixer on its proxy sweep's results and register the proposed mix.",
)

# Everything unpartitioned, in dependency order; the mix partitions run after it (`make demo`).
demo_job = define_asset_job(
    "demo_job",
    selection=AssetSelection.all() - AssetSelection.assets(AssetKey("mix"), AssetKey("training_run"),
                                                           AssetKey("checkpoint_export"), AssetKey("eval_scores"))
    - AssetSelection.groups("synthetic") - AssetSelection.groups("sweeps") - AssetSelection.groups("envs", "tasks")
    - AssetSelection.groups("posttrain"),
    description="Ingest, refine and train the tokenizer on the embedded defaults (what `make demo` runs "
                "before registering the default mix).",
)

envs_build_job = define_asset_job(
    "envs_build_job",
    selection=AssetSelection.groups("envs", "tasks"),
    partitions_def=repo_set_partitions,
    description="Build one repository set's environments (pick the set as the partition), then derive its "
                "function-completion and bug-fixing tasks. CPU pool.",
    tags={"factory/kind": "build"},
)

sft_job = define_asset_job(
    "sft_job",
    selection=AssetSelection.assets(AssetKey("sft_run")),
    description="One SFT run (partition: its config's name, an -> SFTConfig function in configs/experiments); "
                "resumes from its newest checkpoint.",
    tags={"factory/kind": "training", "dagster/priority": str(PRIORITY["training"]),
          "dagster/max_retries": str(RETRIES)},
)

rl_job = define_asset_job(
    "rl_job",
    selection=AssetSelection.assets(AssetKey("rl_run")),
    description="One RL run (partition: its config's name, an -> RLConfig function in configs/experiments); resumes "
                "from its newest checkpoint.",
    tags={"factory/kind": "training", "dagster/priority": str(PRIORITY["training"]),
          "dagster/max_retries": str(RETRIES)},
)

podium_job = define_asset_job(
    "podium_job",
    selection=AssetSelection.assets(AssetKey(["podium", "leaderboard"])),
    description="The Podium leaderboard and podium.preferences from the current podium.votes snapshot.",
)

jobs = [ingest_job, dedup_job, tokenize_job, mix_job, train_job, eval_job, synth_job, sweep_job, automix_job, demo_job, envs_build_job, sft_job, rl_job,
        podium_job]

__all__ = ["EVAL_PRIORITY", "automix_job", "dedup_job", "demo_job", "envs_build_job", "eval_job", "ingest_job", "jobs", "mix_job", "rl_job", "sft_job", "sweep_job", "synth_job", "tokenize_job", "train_job"]
