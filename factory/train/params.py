"""Parameter and FLOP counts by arithmetic, without torch: planning an experiment (its card, a
sweep's budget) must not pay torch's multi-second import. `factory.train.model` re-exports these;
a test checks `count_parameters` against the built model's `numel`.

A new block kind registers its count in `BLOCK_PARAMS` next to its builder in `model.BLOCKS`.
"""

from __future__ import annotations

from typing import Callable

from factory.train.config import ModelConfig


def _attention_block_params(config: ModelConfig) -> int:
    d, hd = config.d_model, config.head_dim
    attn = 2 * d * config.n_heads * hd + 2 * d * config.kv_heads * hd
    return attn + 3 * d * config.ffn_dim + 2 * d


BLOCK_PARAMS: dict[str, Callable[[ModelConfig], int]] = {"attention": _attention_block_params}


def _vocab(config: ModelConfig) -> int:
    if config.vocab_size is None:
        raise ValueError("ModelConfig.vocab_size is None: set it from the tokenizer before building the model")
    return config.vocab_size


def count_parameters(config: ModelConfig) -> int:
    """Trainable parameters, by arithmetic (a tied embedding counts once)."""
    vocab, d = _vocab(config), config.d_model
    pattern = config.layer_pattern
    blocks = sum(BLOCK_PARAMS[pattern[i % len(pattern)]](config) for i in range(config.n_layers))
    return vocab * d * (1 if config.tie_embeddings else 2) + blocks + d


def flops_per_token(config: ModelConfig, seq_len: int) -> float:
    """Training FLOPs per token: 6 * (non-embedding params + LM head) + 12 * n_layers * d_model * seq_len.

    6N is forward (2 per multiply-add) plus backward (twice the forward) for every weight a token
    meets; the embedding lookup is not a matmul, the head is (tied or not). The second term is
    QK^T and AV at 2 * 2 * d_model * seq_len per layer forward, times 3; it counts the full
    T x T matrix, not the causal half, like nanoGPT and PaLM (appendix B), so MFU compares with
    published numbers."""
    vocab, d = _vocab(config), config.d_model
    non_embedding = count_parameters(config) - vocab * d * (1 if config.tie_embeddings else 2)
    return 6.0 * (non_embedding + vocab * d) + 12.0 * config.n_layers * d * seq_len
