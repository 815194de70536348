"""The decoder-only transformer the engine trains, and the arithmetic around it.

Purpose: build a Llama-shaped model from a `ModelConfig` (RMSNorm, RoPE, SwiGLU, grouped-query
attention), give the trainer its optimizer groups, parameter count and FLOPs per token, and
hand the exporter a `LlamaForCausalLM` state dict and config.

Design:
- Parameter names are Llama's minus the `model.` prefix, so export is a rename
  (`llama_state_dict`), and `tests/train/test_model.py` checks logits against `transformers`.
- Blocks are looked up in `BLOCKS` by `layer_pattern` entry (layer i takes pattern[i % len]): a
  variant (say, linear attention) registers a builder there and its count in `BLOCK_PARAMS`.
  A block is `forward(x, cos, sin, mask=None) -> x` over the residual stream (mask: packed
  documents' block-diagonal causal mask, `Transformer.forward`'s doc_ids).
- The LM head runs in fp32 with autocast off: bf16 accumulation over d_model in the head kept a
  real run from converging. Given targets, `forward` returns the per-token loss, so a compiled
  model compiles its loss too; `fused_loss=True` (the experiment's `fused_loss`) computes head and
  loss in one pass over vocabulary chunks (`kernels.linear_cross_entropy`, fp32 accumulation as
  well), never holding the [tokens, vocab] logits.
- muP (when `mup_base_width` is set, m = d_model / base): hidden matrices start at
  init_std / sqrt(m) and train at lr / m (`param_groups`), logits are multiplied by 1/m;
  embeddings, norms and the untied head keep base init and lr (their fan-in does not grow).
  Attention keeps 1/sqrt(head_dim): widths here grow by adding heads at a fixed head size, where
  muP's 1/head_dim changes nothing, and keeping it leaves the Llama export exact. The 1/m logit
  multiplier is folded into the exported `lm_head.weight` (which unties it) for the same reason.

Why not reuse `transformers`' Llama for training: its forward carries caches, masks and kernel
hooks we do not need; this file is the whole model in one screen, and the equivalence test keeps
the two from drifting.
"""

from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from factory.train.config import ModelConfig, OptimizerConfig
from kernels import linear_cross_entropy
from factory.train.params import BLOCK_PARAMS, _vocab, count_parameters, flops_per_token  # noqa: F401 (re-exported)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalize in fp32 and cast back before the gain, exactly as LlamaRMSNorm does.
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rope_tables(config: ModelConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin of shape [max_seq_len, head_dim] in fp32, Llama's layout (frequencies repeated
    over the two halves, matching `rotate_half`)."""
    hd = config.head_dim
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
    freqs = torch.outer(torch.arange(config.max_seq_len, dtype=torch.float32), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [B, H, T, hd]; cos, sin: [T, hd]."""
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    return x * cos + _rotate_half(x) * sin


class Attention(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        d, hd = config.d_model, config.head_dim
        self.n_heads, self.kv_heads, self.head_dim = config.n_heads, config.kv_heads, hd
        self.q_proj = nn.Linear(d, config.n_heads * hd, bias=False)
        self.k_proj = nn.Linear(d, config.kv_heads * hd, bias=False)
        self.v_proj = nn.Linear(d, config.kv_heads * hd, bias=False)
        self.o_proj = nn.Linear(config.n_heads * hd, d, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                mask: torch.Tensor | None = None) -> torch.Tensor:
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(B, T, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if self.kv_heads != self.n_heads:
            # Expanding K/V (instead of enable_gqa) keeps every SDPA backend eligible, flash and
            # memory-efficient included; the copy is small next to the activations.
            k = k.repeat_interleave(self.n_heads // self.kv_heads, dim=1)
            v = v.repeat_interleave(self.n_heads // self.kv_heads, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True) if mask is None else \
            F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.o_proj(y.transpose(1, 2).reshape(B, T, self.n_heads * self.head_dim))


class MLP(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.gate_proj = nn.Linear(config.d_model, config.ffn_dim, bias=False)
        self.up_proj = nn.Linear(config.d_model, config.ffn_dim, bias=False)
        self.down_proj = nn.Linear(config.ffn_dim, config.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class AttentionBlock(nn.Module):
    """Pre-norm attention + SwiGLU, Llama's decoder layer."""

    def __init__(self, config: ModelConfig, layer: int):
        super().__init__()
        self.input_layernorm = RMSNorm(config.d_model, config.norm_eps)
        self.self_attn = Attention(config)
        self.post_attention_layernorm = RMSNorm(config.d_model, config.norm_eps)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                mask: torch.Tensor | None = None) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


BLOCKS: dict[str, Callable[[ModelConfig, int], nn.Module]] = {"attention": AttentionBlock}


class Transformer(nn.Module):
    def __init__(self, config: ModelConfig, *, fused_loss: bool = False):
        super().__init__()
        self.config, self.fused_loss = config, fused_loss
        vocab = _vocab(config)
        self.embed_tokens = nn.Embedding(vocab, config.d_model)
        pattern = config.layer_pattern
        self.layers = nn.ModuleList(BLOCKS[pattern[i % len(pattern)]](config, i) for i in range(config.n_layers))
        self.norm = RMSNorm(config.d_model, config.norm_eps)
        self.lm_head = None if config.tie_embeddings else nn.Linear(config.d_model, vocab, bias=False)
        # Non-persistent: derived from the config, so checkpoints and the Llama export skip them.
        cos, sin = rope_tables(config)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """Normal init from torch's global generator (the trainer seeds it), in registration order."""
        cfg = self.config
        hidden_std = cfg.init_std / math.sqrt(cfg.width_multiplier)
        for name, p in self.named_parameters():
            if p.ndim == 1:
                nn.init.ones_(p)
            elif name.startswith(("embed_tokens.", "lm_head.")):
                nn.init.normal_(p, std=cfg.init_std)
            elif name.endswith(("o_proj.weight", "down_proj.weight")):
                # GPT-2: each layer adds two residual writes, so shrink them by 1/sqrt(2 * n_layers)
                # to keep the residual stream's variance flat in depth at init.
                nn.init.normal_(p, std=hidden_std / math.sqrt(2 * cfg.n_layers))
            else:
                nn.init.normal_(p, std=hidden_std)

    def head_weight(self) -> torch.Tensor:
        return self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight

    def forward(self, idx: torch.Tensor, doc_ids: torch.Tensor | None = None,
                targets: torch.Tensor | None = None) -> torch.Tensor:
        """idx: LongTensor [B, T] (T <= max_seq_len) -> fp32 logits [B, T, vocab]; with `targets`
        [B, T], the per-token cross-entropy [B * T] instead (fp32; targets equal to -100 give 0),
        computed inside the same module so `torch.compile` makes forward and loss one graph.

        doc_ids [B, T] (packed sequences): a token attends only to earlier tokens of its own document,
        so each packed document is computed as if it were alone (RoPE is relative: its offset in the
        row changes nothing)."""
        T = idx.shape[1]
        if T > self.config.max_seq_len:
            raise ValueError(f"sequence of {T} tokens is longer than max_seq_len={self.config.max_seq_len}")
        cos, sin = self.rope_cos[:T], self.rope_sin[:T]
        mask = None
        if doc_ids is not None:
            causal = torch.ones(T, T, dtype=torch.bool, device=idx.device).tril()
            mask = ((doc_ids[:, :, None] == doc_ids[:, None, :]) & causal)[:, None]  # [B, 1, T, T]
        x = self.embed_tokens(idx)
        for layer in self.layers:
            x = layer(x, cos, sin) if mask is None else layer(x, cos, sin, mask)
        h = self.norm(x)
        scale = 1.0 / self.config.width_multiplier
        # fp32 head with autocast off: see the module docstring.
        with torch.autocast(device_type=h.device.type, enabled=False):
            if targets is not None and self.fused_loss:
                return linear_cross_entropy.launch(h.flatten(0, 1), self.head_weight(), targets.flatten(), scale=scale)
            logits = F.linear(h.float(), self.head_weight().float())
            if scale != 1.0:
                logits = logits * scale
            if targets is None:
                return logits
            return F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="none")

    def loss(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean next-token cross-entropy (fp32 scalar) over the targets that are not -100."""
        counted = (targets != linear_cross_entropy.IGNORE_INDEX).sum().clamp(min=1)
        return self(idx, targets=targets).sum() / counted


def param_groups(model: Transformer, optimizer: OptimizerConfig) -> list[dict]:
    """AdamW groups: hidden matrices (decay; lr_scale 1/m under muP), embeddings and the LM head
    (no decay, base lr), and everything else, norms included (no decay, base lr). Each group's
    `lr` is already optimizer.lr * lr_scale; the trainer sets lr = scheduled lr * lr_scale."""
    m = model.config.width_multiplier
    buckets: dict[str, list[nn.Parameter]] = {"matrices": [], "embeddings": [], "norms": []}
    for name, p in model.named_parameters():  # a tied head is the embedding and is listed once
        if name.startswith(("embed_tokens.", "lm_head.")):
            buckets["embeddings"].append(p)
        elif p.ndim >= 2:
            buckets["matrices"].append(p)
        else:
            buckets["norms"].append(p)
    settings = {"matrices": (optimizer.weight_decay, 1.0 / m), "embeddings": (0.0, 1.0), "norms": (0.0, 1.0)}
    return [
        {"name": name, "params": params, "weight_decay": settings[name][0], "lr_scale": settings[name][1],
         "lr": optimizer.lr * settings[name][1]}
        for name, params in buckets.items() if params
    ]


def llama_config_dict(config: ModelConfig) -> dict:
    """kwargs for `transformers.LlamaConfig` (5.x takes RoPE as `rope_parameters`). Under muP the
    export unties the head, which carries the folded 1/m logit multiplier (see llama_state_dict)."""
    return {
        "vocab_size": _vocab(config), "hidden_size": config.d_model, "intermediate_size": config.ffn_dim,
        "num_hidden_layers": config.n_layers, "num_attention_heads": config.n_heads,
        "num_key_value_heads": config.kv_heads, "head_dim": config.head_dim,
        "max_position_embeddings": config.max_seq_len, "rms_norm_eps": config.norm_eps,
        "rope_parameters": {"rope_type": "default", "rope_theta": config.rope_theta},
        "tie_word_embeddings": config.tie_embeddings and config.width_multiplier == 1.0,
        "attention_bias": False, "mlp_bias": False, "hidden_act": "silu", "initializer_range": config.init_std,
    }


def llama_state_dict(model: Transformer) -> dict[str, torch.Tensor]:
    """The model's weights under `LlamaForCausalLM` names. `lm_head.weight` is always present
    (transformers lists it even when tied); under muP it is the head times 1/m, a new tensor."""
    out = {f"model.{k}": v for k, v in model.state_dict().items() if not k.startswith("lm_head.")}
    head, m = model.head_weight().detach(), model.config.width_multiplier
    out["lm_head.weight"] = head if m == 1.0 else head * (1.0 / m)
    return out
