"""The typed config of a reinforcement-learning run: where the policy starts, how rollouts are made,
how they are rewarded, and how the policy is updated.

Identity (what is trained: the start checkpoint, the reward, the algorithm and its numbers, the
seed) is kept apart from execution choices (`mode`, the engine's workers): a sync and an async run
of one config learn the same thing at different speeds. Every field says its unit; everything that
can be checked without starting a process is checked when the config is built (group size, the
staleness bound, a registered reward or actor), and what needs the lake (the start checkpoint,
a task table) by `check_rl_config` before any process starts. Errors name the field.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)


class RolloutConfig(_Frozen):
    """How the actor samples: `prompts_per_step` tasks, `group_size` completions each.

    Sampling is the policy's own distribution (temperature 1, no top-p): the importance ratio and the
    KL term are defined against it, and vLLM's sample log-probs are then the behaviour policy's."""

    prompts_per_step: int = Field(8, ge=1, description="Tasks sampled per step (count).")
    group_size: int = Field(8, description="Completions per task, the group GRPO normalises over (count, >= 2).")
    max_tokens: int = Field(8, ge=1, description="New tokens per completion at most.")
    stop: tuple[str, ...] = Field(("\n",), description="The completion ends before the first of these.")
    actor: str = Field("vllm", description="Registered rollout actor (factory.posttrain.rl.registry.ACTORS).")

    @field_validator("group_size")
    @classmethod
    def _group(cls, value: int) -> int:
        if value < 2:
            raise ValueError(f"group_size={value}: GRPO's advantage is a reward minus its group's mean, so a group "
                             "of one always has advantage 0 and learns nothing; use 2 or more")
        return value

    @field_validator("actor")
    @classmethod
    def _actor(cls, name: str) -> str:
        from factory.posttrain.rl.registry import ACTORS

        return ACTORS.check(name)


class GRPOConfig(_Frozen):
    """Group Relative Policy Optimization (see factory.posttrain.rl.grpo for the formulas and sources)."""

    clip_eps: float = Field(0.2, gt=0, lt=1, description="PPO ratio clip: ratios outside [1-eps, 1+eps] give no gradient.")
    kl_coef: float = Field(0.0, ge=0, description="Weight of the k3 KL estimate to the reference policy (0 = none).")
    aggregation: Literal["token", "sequence"] = Field(
        "token", description="token = mean over all completion tokens of the batch (DAPO); sequence = mean per "
                             "completion, then over completions (the GRPO paper).")
    scale_rewards: bool = Field(True, description="Divide advantages by the group's std (GRPO); False = Dr. GRPO.")
    max_is_ratio: float = Field(2.0, ge=1, description="Async: cap on the truncated importance weight pi_old/pi_behaviour.")


class OptimConfig(_Frozen):
    lr: float = Field(3e-4, gt=0, description="AdamW learning rate (constant).")
    weight_decay: float = Field(0.0, ge=0)
    grad_clip: float = Field(1.0, gt=0, description="Max global gradient norm.")


class SyncCheckConfig(_Frozen):
    """The check after every weight sync: digests of the engine's weights, and a log-prob probe."""

    probe_prompts: int = Field(4, ge=1, description="Fixed sequences scored by the trainer and the engine (count).")
    logprob_tolerance: float = Field(1e-4, gt=0, description="Max |trainer - engine| log-prob on the probe (nats, fp32).")


class RLConfig(_Frozen):
    """One RL run."""

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9_\-]*$", description="Run name; checkpoints and rollouts live under it.")
    description: str = Field("", description="The goal, in a sentence or two.")
    start: str = Field(description="Checkpoint the policy starts from (the reference policy too): ckpt/<run>@<step>, "
                                   "or ckpt/<experiment>@<step> for that experiment's newest run with that step.")
    reward: str = Field(description="Registered reward (factory.posttrain.rl.registry.REWARDS): toy, humaneval, porting, repo_tasks.")
    task_table: str | None = Field(None, description="repo_tasks: the task table (tasks.function_completion | tasks.bug_fixing).")
    algorithm: str = Field("grpo", description="Registered algorithm (ALGORITHMS).")
    steps: int = Field(gt=0, description="Policy updates (each one a new policy version).")
    mode: Literal["sync", "async"] = Field("sync", description="sync = generate, score, update in turn; async = the "
                                                             "actor generates ahead while the trainer updates.")
    max_staleness: int = Field(1, description="Async: a sample made by policy version v is used at version <= v + this "
                                              "(steps), else dropped; 0 = on-policy only.")
    rollout: RolloutConfig = RolloutConfig()
    grpo: GRPOConfig = GRPOConfig()
    optimizer: OptimConfig = OptimConfig()
    sync_check: SyncCheckConfig = SyncCheckConfig()
    checkpoint_every: int = Field(10, ge=1, description="Steps between checkpoints (the last step always saves).")
    eval_every: int = Field(10, ge=1, description="Steps between checkpoints the eval sensor evaluates.")
    eval_suite: str = Field("quick", description="Eval suite of configs/evals.py for those checkpoints.")
    seed: int = Field(0, description="Seeds task order, sampling and the trainer.")
    scoring_workers: int = Field(2, ge=1, description="Task-engine workers scoring completions at once (execution choice).")

    @field_validator("max_staleness")
    @classmethod
    def _staleness(cls, value: int) -> int:
        if value < 0:
            raise ValueError(f"max_staleness={value}: a bound on how many policy versions a sample may lag must be >= 0")
        return value

    @field_validator("eval_suite")
    @classmethod
    def _suite(cls, name: str) -> str:
        from factory.experiments.spec import check_eval_suite

        return check_eval_suite(name)

    @field_validator("reward")
    @classmethod
    def _reward(cls, name: str) -> str:
        from factory.posttrain.rl.registry import REWARDS

        return REWARDS.check(name)

    @field_validator("algorithm")
    @classmethod
    def _algorithm(cls, name: str) -> str:
        from factory.posttrain.rl.registry import ALGORITHMS

        return ALGORITHMS.check(name)

    @field_validator("start")
    @classmethod
    def _start(cls, value: str) -> str:
        from factory.posttrain.start import check_start_field

        return check_start_field(value)

    @model_validator(mode="after")
    def _tasks(self) -> "RLConfig":
        from factory.posttrain.rl.registry import REWARDS

        if REWARDS.get(self.reward).needs_task_table and not self.task_table:
            raise ValueError(f"task_table: reward {self.reward!r} scores tasks from a table; name it "
                             "(tasks.function_completion or tasks.bug_fixing)")
        return self

    def identity_hash(self) -> str:
        """Hash of what changes what is learned: not the name (a sweep cell's name is `<sweep>-<this
        hash8>`), nor the execution and presentation choices in `EXECUTION_FIELDS`."""
        from factory.version import config_hash

        return config_hash(self.model_dump(mode="json", exclude=EXECUTION_FIELDS))


# the run's name, its words, how it is executed (sync/async, scoring workers) and checked (the weight-sync
# probe), and which suite evaluates its checkpoints: none of them changes the policy it learns
EXECUTION_FIELDS = {"name", "description", "mode", "scoring_workers", "sync_check", "eval_suite"}


class RLConfigError(ValueError):
    """An RL config that cannot run against this lake (start checkpoint, task table); names the field."""


def start_checkpoint(config: RLConfig, lake):
    """The start checkpoint, verified on disk (`TrainedCheckpoint`; factory.posttrain.start)."""
    from factory.infer.export import ExportError
    from factory.posttrain.start import resolve_start

    try:
        return resolve_start(lake, config.start)
    except ExportError as e:
        raise RLConfigError(f"{config.name}: start: {e}") from None


def check_rl_config(config: RLConfig, lake):
    """What the lake must hold before anything starts: the start checkpoint and the task table.
    Returns the start checkpoint (`TrainedCheckpoint`), verified on disk."""
    start = start_checkpoint(config, lake)
    if config.task_table is not None:
        if not lake.has_table(config.task_table):
            raise RLConfigError(f"{config.name}: task_table: {config.task_table} does not exist in the lake "
                                "(derive tasks first: the tasks/function_completion or tasks/bug_fixing asset)")
        if lake.table(config.task_table).scan().to_arrow().num_rows == 0:
            raise RLConfigError(f"{config.name}: task_table: {config.task_table} holds no tasks")
    return start
