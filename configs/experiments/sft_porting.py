"""Supervised fine-tuning in the chat format on the porting examples: word problems (the user turn) and
the programs the synthetic pipeline checked in the sandbox (the assistant turn), from the demo's smoke
checkpoint. The export answers through `factory serve`'s /v1/chat/completions.

Run it with `python -m factory.posttrain.sft --experiment sft_porting` (after `make demo` trained smoke
and built synthetic.porting), or materialize the `sft_run` asset's `sft_porting` partition (`sft_job`).
"""

from __future__ import annotations

from factory.posttrain.sft import SFTConfig
from factory.train.config import CheckpointConfig, OptimizerConfig


def sft_porting() -> SFTConfig:
    """Goal: the held-out loss of the porting answers falls well below the pre-trained model's."""
    return SFTConfig(
        name="sft_porting",
        description="Chat-format SFT of smoke on word problem -> checked program pairs.",
        start="ckpt/smoke@120",
        data="porting",
        steps=60,
        optimizer=OptimizerConfig(lr=3e-3, weight_decay=0.0),
        checkpoint=CheckpointConfig(every=20, keep_last=3),
        eval_every=60,
    )
