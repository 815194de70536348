"""The typed config of a supervised fine-tuning run: the start checkpoint, the examples, the numbers.

Checked when built (field ranges, batch shapes, a known dataset and eval suite) and against the lake by
`check_sft_config` (the start checkpoint, the dataset's source table) before any process starts; errors
name the field.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from factory.train.config import CheckpointConfig, OptimizerConfig, ScheduleConfig


class SFTConfigError(ValueError):
    """An SFT config that cannot run against this lake; names the field."""


class SFTConfig(BaseModel):
    """One SFT run."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9_\-]*$", description="Run name; checkpoints live under it.")
    description: str = Field("", description="The goal, in a sentence or two.")
    start: str = Field(description="Checkpoint to fine-tune: ckpt/<run>@<step>, or ckpt/<experiment>@<step> for that "
                                   "experiment's newest run with that step.")
    data: str = Field("porting", description="Dataset of sft.examples (factory.posttrain.sft.data.DATASETS), built from "
                                             "its source table's current snapshot.")
    steps: int = Field(gt=0, description="Optimizer steps.")
    global_batch: int = Field(16, gt=0, description="Packed rows per optimizer step.")
    micro_batch: int = Field(8, gt=0, description="Packed rows per forward/backward.")
    seq_len: int | None = Field(None, gt=0, le=32_768, description="Tokens per packed row; None = the start's seq_len. "
                                "Longer than the start model's max_seq_len extends it (RoPE positions).")
    optimizer: OptimizerConfig = OptimizerConfig(lr=1e-3, weight_decay=0.0)
    schedule: ScheduleConfig = ScheduleConfig(kind="cosine", warmup_steps=5)
    checkpoint: CheckpointConfig = CheckpointConfig(every=20, keep_last=3)
    eval_every: int = Field(20, ge=1, description="Steps between checkpoints the eval sensor evaluates.")
    eval_suite: str = Field("quick", description="Eval suite of configs/evals.py for those checkpoints.")
    heldout_fraction: float = Field(0.1, gt=0, lt=1, description="Share of examples held out (by hash) to measure "
                                                                 "the loss of the task format on.")
    seed: int = Field(0, description="Seeds the packing order and the trainer.")

    @field_validator("start")
    @classmethod
    def _start(cls, value: str) -> str:
        from factory.posttrain.start import check_start_field

        return check_start_field(value)

    @field_validator("data")
    @classmethod
    def _data(cls, name: str) -> str:
        from factory.posttrain.sft.data import DATASETS

        if name not in DATASETS:
            raise ValueError(f"unknown dataset {name!r}; factory.posttrain.sft.data.DATASETS has {sorted(DATASETS)}")
        return name

    @field_validator("eval_suite")
    @classmethod
    def _suite(cls, name: str) -> str:
        from factory.experiments.spec import check_eval_suite

        return check_eval_suite(name)

    @model_validator(mode="after")
    def _batches(self) -> "SFTConfig":
        if self.global_batch % self.micro_batch:
            raise ValueError(f"global_batch={self.global_batch} must be a multiple of micro_batch={self.micro_batch}")
        return self


def check_sft_config(config: SFTConfig, lake):
    """What the lake must hold before anything starts: the start checkpoint (returned, verified on disk)
    and the dataset's source table with rows."""
    from factory.infer.export import ExportError
    from factory.posttrain.sft.data import DATASETS
    from factory.posttrain.start import resolve_start

    try:
        start = resolve_start(lake, config.start)
    except ExportError as e:
        raise SFTConfigError(f"{config.name}: start: {e}") from None
    source = DATASETS[config.data].source
    if not lake.has_table(source) or lake.table(source).current_snapshot() is None:
        raise SFTConfigError(f"{config.name}: data: dataset {config.data!r} is built from {source}, which does not exist "
                             "in the lake or is empty (materialize its synthetic pipeline first)")
    return start
