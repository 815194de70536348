"""Byte-level BPE tokenizers trained on a deterministic sample of the lake (see `bpe`)."""

from factory.tokenize.bpe import (
    SPECIAL_TOKENS,
    TokenizerArtifact,
    TokenizerConfig,
    TokenizerError,
    bytes_per_token,
    latest_tokenizer,
    load_tokenizer,
    train_tokenizer,
)

__all__ = [
    "SPECIAL_TOKENS",
    "TokenizerArtifact",
    "TokenizerConfig",
    "TokenizerError",
    "bytes_per_token",
    "latest_tokenizer",
    "load_tokenizer",
    "train_tokenizer",
]
