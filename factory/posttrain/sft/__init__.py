"""Supervised fine-tuning on chat-formatted examples from the lake.

    from factory.posttrain.sft import SFTConfig, run_sft
    run_sft(SFTConfig(name="sft", start="ckpt/smoke@120", data="porting", steps=60), lake)

Modules: config (SFTConfig), data (sft.examples, packing, the loader), run (the trainer on them).
Importing this package loads only the config (no torch): experiment files import it.
"""

from factory.posttrain.sft.config import SFTConfig, SFTConfigError, check_sft_config

__all__ = ["SFTConfig", "SFTConfigError", "build_examples", "check_sft_config", "run_sft"]


def run_sft(*args, **kwargs):
    from factory.posttrain.sft.run import run_sft as run

    return run(*args, **kwargs)


def build_examples(*args, **kwargs):
    from factory.posttrain.sft.data import build_examples as build

    return build(*args, **kwargs)
