"""An experiment: model, mix, optimizer, schedule, batch, length, checkpoints, evals, seed,
parallelism — one frozen config, written as a Python function in `configs/experiments/`.

Identity (what changes the result: model, mix, optimizer, schedule, batch, length, seed) is kept
apart from execution (processes, loader threads, compile) in `config_hash`, as Marin does: two
runs of the same identity on different hardware are the same experiment.

`plan_experiment` resolves what the config leaves to the data — sequence length from the mix,
vocabulary from its tokenizer — and derives the rest: steps from tokens, tokens per step,
gradient accumulation, parameter count. A plan that cannot run (batch not divisible, a model
shorter than the mix's sequences, a missing mix) fails here, before any process starts.

What a config can check on its own it checks when it is built, so a typo fails at the door and
not after training: every float is finite (`lr=inf` is refused with its field path, see
`factory.train.config`), and `eval_suite` must name a suite of `configs/evals.py`. A stored
plan (a checkpoint's) is read with `Plan.load`, which skips the suite check: a suite renamed
since must not make old checkpoints unreadable (`factory evals` checks the suite it runs).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from factory.train.config import (
    CheckpointConfig,
    GuardConfig,
    ModelConfig,
    OptimizerConfig,
    ParallelConfig,
    ReplicaCheckConfig,
    ScheduleConfig,
    TrackerConfig,
)
from factory.overrides import override, validation_message  # noqa: F401 - validation_message: re-exported
from factory.version import config_hash


class ExperimentError(ValueError):
    """An experiment cannot run as configured; the message names the field."""


class OverrideError(ExperimentError):
    """A launch override (`steps`, `checkpoint_every`, ...) is invalid; `override` names it."""

    def __init__(self, message: str, override: str | None = None):
        super().__init__(message)
        self.override = override


# a launch's overrides (ExperimentConfig.with_run_overrides) -> the field each one sets
RUN_OVERRIDES = {"steps": "steps", "checkpoint_every": "checkpoint.every", "eval_every": "eval_every",
                 "eval_suite": "eval_suite"}


def _errors(e: ValidationError) -> list[tuple[str, str]]:
    """(field path, message) of each of pydantic's errors, as `validation_message` words them."""
    return [(".".join(map(str, err["loc"])), err["msg"].removeprefix("Value error, ")) for err in e.errors()]


STORED = {"stored": True}  # validation context of a stored plan (see `Plan.load`)


def eval_suites() -> list[str]:
    """The suites `configs/evals.py` defines, imported when first asked."""
    from configs.evals import SUITES

    return sorted(SUITES)


def check_eval_suite(name: str) -> str:
    """A config field's check: `name` is a suite of configs/evals.py."""
    known = eval_suites()
    if name not in known:
        raise ValueError(f"unknown eval suite {name!r}; configs/evals.py defines {known}")
    return name


class ExperimentConfig(BaseModel):
    """One training experiment."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9_\-]*$", description="Run name; checkpoints live under it.")
    description: str = Field("", description="The goal, in a sentence or two (shown on the card).")
    model: ModelConfig
    mix: str = Field(description="Mix name (newest version, followed live) or mix/<name>@v<N> (pinned).")
    follow_mix: bool = Field(True, description="Switch to newer versions of the mix at step boundaries.")
    mix_weights: dict[str, float] | None = Field(
        None, description="Reweight the mix's sources (table -> share of sequences, summing to 1; tables left out get "
                          "0): what sweeps over mixes and the auto-mixer's proxies vary. None = the mix's own weights.")
    global_batch: int = Field(gt=0, description="Sequences per optimizer step, all ranks together.")
    micro_batch: int = Field(gt=0, description="Sequences per forward/backward on one rank.")
    tokens: int | None = Field(None, gt=0, description="Training length in tokens (steps derived); or give steps.")
    steps: int | None = Field(None, gt=0, description="Training length in optimizer steps; or give tokens.")
    optimizer: OptimizerConfig
    schedule: ScheduleConfig = ScheduleConfig()
    precision: str = Field("fp32", pattern="^(fp32|bf16)$", description="bf16 = autocast where supported; logits and loss stay fp32.")
    compile: bool = Field(False, description="torch.compile the model and its loss into one graph (execution choice).")
    fused_loss: bool = Field(False, description="LM head and cross-entropy in one pass over vocabulary chunks "
                                                "(kernels.linear_cross_entropy: fp32 accumulation, the [tokens, vocab] "
                                                "logits never held; Triton on CUDA). Execution choice: the same loss "
                                                "within float rounding.")
    checkpoint: CheckpointConfig = CheckpointConfig()
    eval_every: int = Field(100, ge=1, description="Steps between evaluations (the eval sensor reads this).")
    eval_suite: str = Field("default", description="Eval suite of configs/evals.py run on those checkpoints.")
    seed: int = 0
    parallel: ParallelConfig = ParallelConfig()
    guards: GuardConfig = GuardConfig()
    replicas: ReplicaCheckConfig = ReplicaCheckConfig()
    tracker: TrackerConfig = TrackerConfig()
    loader_shards: int = Field(8, ge=1, description="Logical data shards (world sizes must divide it).")
    loader_workers: int = Field(1, ge=0, description="Loader threads per rank (execution choice).")

    @field_validator("eval_suite")
    @classmethod
    def _known_suite(cls, name: str, info: ValidationInfo) -> str:
        if (info.context or {}).get("stored"):
            return name
        return check_eval_suite(name)

    @model_validator(mode="after")
    def _length(self) -> "ExperimentConfig":
        if (self.tokens is None) == (self.steps is None):
            raise ValueError("give exactly one of tokens or steps")
        if self.mix_weights is not None:
            bad = {t: w for t, w in self.mix_weights.items() if not w >= 0}
            if bad or abs(sum(self.mix_weights.values()) - 1) > 1e-6:
                raise ValueError(f"mix_weights must be >= 0 and sum to 1, got {self.mix_weights}")
        world = self.parallel.world_size
        if self.global_batch % (self.micro_batch * world):
            raise ValueError(f"global_batch={self.global_batch} must be a multiple of micro_batch={self.micro_batch} "
                             f"x world size {world}")
        if self.global_batch % self.loader_shards or self.loader_shards % world:
            raise ValueError(f"loader_shards={self.loader_shards} must divide global_batch={self.global_batch} "
                             f"and be divisible by the world size {world}")
        return self

    def derive(self, **changes) -> "ExperimentConfig":
        """A validated variant: `changes` replace whole fields (see `factory.overrides.override`)."""
        return override(self, changes)

    def with_run_overrides(self, *, steps: int | None = None, checkpoint_every: int | None = None,
                           eval_every: int | None = None, eval_suite: str | None = None) -> "ExperimentConfig":
        """This experiment with a launch's overrides (None = keep): what `python -m factory.train
        --steps ...` and the `training_run` asset's run config both accept. `steps` replaces the
        length (a `tokens` length is dropped); `checkpoint_every` changes only `checkpoint.every`.
        Raises `ExperimentError` naming the override (`steps: Input should be greater than 0`)."""
        given = {"steps": steps, "checkpoint_every": checkpoint_every, "eval_every": eval_every,
                 "eval_suite": eval_suite}
        changes = {RUN_OVERRIDES[name]: value for name, value in given.items() if value is not None}
        if steps is not None:
            changes["tokens"] = None
        if not changes:
            return self
        try:
            return override(self, changes)
        except ValidationError as e:
            by_path = {path: name for name, path in RUN_OVERRIDES.items()}
            errors = [(path, msg, by_path.get(path)) for path, msg in _errors(e)]
            problems = [f"{name}={given[name]!r}: {msg}" if name else f"{path}: {msg}" if path else msg
                        for path, msg, name in errors]
            named = next((name for _, _, name in errors if name), None)
            raise OverrideError(f"experiment {self.name}: " + "; ".join(problems), named) from None

    def identity_hash(self) -> str:
        """Hash of what changes the result (execution choices excluded)."""
        return config_hash(self.model_dump(mode="json", exclude={"compile", "fused_loss", "loader_workers", "parallel",
                                                                  "tracker", "description", "eval_suite"}))


class Plan(BaseModel):
    """An experiment with everything derived: what the trainer actually runs."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    experiment: ExperimentConfig
    model: ModelConfig  # vocab_size filled in
    mix_version: str
    tokenizer: str
    seq_len: int
    steps: int
    tokens_per_step: int
    grad_accum: int
    parameters: int
    config_hash: str

    @property
    def tokens(self) -> int:
        return self.steps * self.tokens_per_step

    @classmethod
    def load(cls, payload: str) -> "Plan":
        """A plan stored with a checkpoint (JSON), read without the checks that depend on today's
        configs (its eval suite may have been renamed since)."""
        return cls.model_validate_json(payload, context=STORED)


def plan_experiment(lake, experiment: ExperimentConfig) -> Plan:
    """Resolve the mix and tokenizer and derive the run's numbers; errors name the field."""
    from factory.mix import MixError, get_version
    from factory.tokenize import load_tokenizer
    from factory.train.params import count_parameters

    try:
        version = get_version(lake, experiment.mix)
    except MixError as e:
        raise ExperimentError(f"experiment {experiment.name}: mix: {e}") from None
    seq_len = version.spec.seq_len
    unknown = sorted(set(experiment.mix_weights or {}) - set(version.spec.weights))
    if unknown:
        raise ExperimentError(f"experiment {experiment.name}: mix_weights names tables not in {version.version_id}: "
                              f"{unknown} (it has {sorted(version.spec.weights)})")
    model = experiment.model
    if model.max_seq_len < seq_len:
        raise ExperimentError(f"experiment {experiment.name}: model.max_seq_len={model.max_seq_len} is shorter than "
                              f"the mix's seq_len={seq_len}")
    vocab = load_tokenizer(version.tokenizer_path).get_vocab_size()
    if model.vocab_size is None:
        model = override(model, {"vocab_size": vocab})
    elif model.vocab_size < vocab:
        raise ExperimentError(f"experiment {experiment.name}: model.vocab_size={model.vocab_size} < the tokenizer's {vocab}")
    tokens_per_step = experiment.global_batch * seq_len
    steps = experiment.steps or max(1, experiment.tokens // tokens_per_step)
    return Plan(
        experiment=experiment, model=model, mix_version=version.version_id, tokenizer=version.tokenizer_version,
        seq_len=seq_len, steps=steps, tokens_per_step=tokens_per_step,
        grad_accum=experiment.global_batch // (experiment.micro_batch * experiment.parallel.world_size),
        parameters=count_parameters(model), config_hash=experiment.identity_hash(),
    )
