"""Tokenizer configs (configs as code): the `tokenizer` asset trains one of these by name."""

from __future__ import annotations

from factory.tokenize import TokenizerConfig


def default() -> TokenizerConfig:
    """8k byte-level BPE over every refined embedded source: ~4 MB sampled per source trains in
    about 5 s on 2 cores and compresses code 3.3-3.5 bytes/token."""
    from configs.refine import pipelines

    return TokenizerConfig(name="default", vocab_size=8192,
                           sources=[f"refined.{source}" for source in pipelines()])


def tokenizers() -> dict[str, TokenizerConfig]:
    return {"default": default()}
