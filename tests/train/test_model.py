"""The model of the training engine (`factory.train.model`): output shapes, fp32 logits and loss
under bf16 autocast, causality, logits equal to `transformers`' LlamaForCausalLM after the
rename export (tied, untied, GQA, muP), the arithmetic parameter count and FLOPs, AdamW groups
(every parameter once, muP lr scaling), seeded init (muP and GPT-2 scaled std), the block
registry, and config errors.

Runs on CPU in a few seconds with tiny configs (d_model 64, 2 layers, vocab 300); no network
(HF_HUB_OFFLINE=1, the Llama model is built from a config, never downloaded).
"""

from __future__ import annotations

import math
import typing

import pytest
import torch
from pydantic import ValidationError

from factory.train.config import BlockKind, ModelConfig, OptimizerConfig
from factory.train.model import (
    BLOCK_PARAMS,
    BLOCKS,
    AttentionBlock,
    Transformer,
    count_parameters,
    flops_per_token,
    llama_config_dict,
    llama_state_dict,
    param_groups,
)

VOCAB = 300


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def cfg(**overrides) -> ModelConfig:
    base = dict(vocab_size=VOCAB, d_model=64, n_layers=2, n_heads=4, max_seq_len=32)
    return ModelConfig(**(base | overrides))


def build(config: ModelConfig, seed: int = 0) -> Transformer:
    torch.manual_seed(seed)
    return Transformer(config)


def tokens(batch: int = 2, length: int = 16, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


CONFIGS = {
    "tied": cfg(),
    "untied": cfg(tie_embeddings=False),
    "gqa": cfg(n_kv_heads=2, tie_embeddings=False, rope_theta=500.0),
    "mqa_ffn": cfg(n_kv_heads=1, ffn_hidden=96, n_layers=3),
    "mup_untied": cfg(mup_base_width=32, tie_embeddings=False),
    "mup_tied": cfg(mup_base_width=16, n_kv_heads=2),
}


def test_forward_shapes_and_fp32_logits():
    model = build(CONFIGS["tied"])
    logits = model(tokens(3, 10))
    assert logits.shape == (3, 10, VOCAB) and logits.dtype == torch.float32
    with pytest.raises(ValueError, match="max_seq_len=32"):
        model(tokens(1, 33))


def test_vocab_size_must_be_set():
    with pytest.raises(ValueError, match="vocab_size"):
        Transformer(cfg(vocab_size=None))
    with pytest.raises(ValueError, match="vocab_size"):
        count_parameters(cfg(vocab_size=None))


@pytest.mark.parametrize("name", CONFIGS)
def test_count_parameters_is_exact(name):
    config = CONFIGS[name]
    model = build(config)
    assert count_parameters(config) == sum(p.numel() for p in model.parameters())


def test_tied_embedding_counted_once():
    assert count_parameters(cfg(tie_embeddings=False)) - count_parameters(cfg()) == VOCAB * 64


def test_logits_and_loss_are_fp32_under_bf16_autocast():
    model = build(CONFIGS["gqa"])
    idx = tokens()
    seen = []
    model.layers[0].self_attn.q_proj.register_forward_hook(lambda m, i, o: seen.append(o.dtype))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(idx)
        loss = model.loss(idx, tokens(seed=2))
    # The body really ran in bf16, and the head still gave fp32.
    assert seen == [torch.bfloat16, torch.bfloat16]
    assert logits.dtype == torch.float32 and loss.dtype == torch.float32 and loss.ndim == 0
    assert torch.allclose(logits, model(idx), atol=0.05)


def test_loss_is_cross_entropy_and_starts_near_uniform():
    model = build(CONFIGS["tied"])
    idx, targets = tokens(), tokens(seed=2)
    targets[:, :4] = -100
    logits = model(idx)
    expected = torch.nn.functional.cross_entropy(logits[:, 4:].reshape(-1, VOCAB), targets[:, 4:].reshape(-1))
    loss = model.loss(idx, targets)
    assert torch.allclose(loss, expected)
    assert abs(loss.item() - math.log(VOCAB)) < 0.1  # small init -> near-uniform predictions


@pytest.mark.parametrize("name", ["tied", "gqa"])
def test_causal(name):
    model = build(CONFIGS[name]).eval()
    idx = tokens(1, 16)
    changed = idx.clone()
    changed[0, 9] = (idx[0, 9] + 1) % VOCAB
    a, b = model(idx), model(changed)
    assert torch.equal(a[:, :9], b[:, :9])
    assert not torch.allclose(a[:, 9:], b[:, 9:])


@pytest.mark.parametrize("name", CONFIGS)
def test_logits_match_transformers_llama(name):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = CONFIGS[name].model_copy(update={"init_std": 0.1})  # logits of order 1, so 1e-4 is tight
    model = build(config).eval()
    with torch.no_grad():  # norms start at 1; make them distinct so a swapped norm would show
        for p in model.parameters():
            if p.ndim == 1:
                p.uniform_(0.5, 1.5)
    hf = LlamaForCausalLM(LlamaConfig(**llama_config_dict(config))).float().eval()
    result = hf.load_state_dict(llama_state_dict(model), strict=True)
    assert not result.missing_keys and not result.unexpected_keys
    idx = tokens(2, 24)
    with torch.no_grad():
        ours, theirs = model(idx), hf(input_ids=idx).logits
    assert ours.abs().max().item() > 0.5
    assert (ours - theirs).abs().max().item() < 1e-4


def test_export_names_are_a_rename():
    model = build(CONFIGS["untied"])
    exported = llama_state_dict(model)
    assert set(exported) == {f"model.{k}" for k in model.state_dict() if k != "lm_head.weight"} | {"lm_head.weight"}
    assert "model.layers.1.self_attn.k_proj.weight" in exported and "model.layers.0.mlp.down_proj.weight" in exported
    tied = llama_state_dict(build(CONFIGS["tied"]))
    assert tied["lm_head.weight"].data_ptr() == tied["model.embed_tokens.weight"].data_ptr()
    # muP folds the 1/m logit multiplier into the head, so the export unties it.
    assert llama_config_dict(CONFIGS["tied"])["tie_word_embeddings"] is True
    assert llama_config_dict(CONFIGS["mup_tied"])["tie_word_embeddings"] is False


def test_flops_per_token_by_hand():
    config = cfg(n_kv_heads=2)  # d 64, hd 16, ffn 192, vocab 300, tied
    per_layer = 64 * 64 * 2 + 64 * 32 * 2 + 3 * 64 * 192 + 2 * 64
    non_embedding = 2 * per_layer + 64
    expected = 6 * (non_embedding + VOCAB * 64) + 12 * 2 * 64 * 32
    assert flops_per_token(config, 32) == expected
    assert flops_per_token(cfg(n_kv_heads=2, tie_embeddings=False), 32) == expected  # the head is a matmul either way


@pytest.mark.parametrize("name", ["tied", "untied", "mup_untied", "mup_tied"])
def test_param_groups_cover_every_parameter_once(name):
    config = CONFIGS[name]
    model = build(config)
    groups = param_groups(model, OptimizerConfig(lr=1e-3, weight_decay=0.1))
    ids = [id(p) for g in groups for p in g["params"]]
    assert len(ids) == len(set(ids)) and set(ids) == {id(p) for p in model.parameters()}
    by_name = {g["name"]: g for g in groups}
    m = config.width_multiplier
    assert by_name["matrices"]["weight_decay"] == 0.1 and by_name["matrices"]["lr_scale"] == pytest.approx(1 / m)
    assert by_name["matrices"]["lr"] == pytest.approx(1e-3 / m)
    assert all(p.ndim == 2 for p in by_name["matrices"]["params"])
    assert len(by_name["matrices"]["params"]) == 7 * config.n_layers
    assert len(by_name["embeddings"]["params"]) == (1 if config.tie_embeddings else 2)
    assert len(by_name["norms"]["params"]) == 2 * config.n_layers + 1
    for g in ("embeddings", "norms"):
        assert by_name[g]["weight_decay"] == 0.0 and by_name[g]["lr_scale"] == 1.0
    # AdamW takes them as they are and steps.
    opt = torch.optim.AdamW(groups, lr=1e-3)
    model.loss(tokens(), tokens(seed=2)).backward()
    before = model.embed_tokens.weight.detach().clone()
    opt.step()
    assert not torch.equal(before, model.embed_tokens.weight)


def test_same_seed_same_model_and_mup_init_std():
    a, b = build(CONFIGS["gqa"], seed=7), build(CONFIGS["gqa"], seed=7)
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True))
    c = build(CONFIGS["gqa"], seed=8)
    assert not torch.equal(a.embed_tokens.weight, c.embed_tokens.weight)

    wide = build(cfg(d_model=256, n_heads=4, mup_base_width=64, n_layers=2))  # m = 4
    attn = wide.layers[0].self_attn
    assert wide.embed_tokens.weight.std().item() == pytest.approx(0.02, rel=0.05)
    assert attn.q_proj.weight.std().item() == pytest.approx(0.02 / 2, rel=0.05)
    assert attn.o_proj.weight.std().item() == pytest.approx(0.02 / 2 / 2, rel=0.05)  # / sqrt(2 * n_layers)
    assert torch.equal(wide.norm.weight, torch.ones(256))


def test_block_registry_covers_every_kind():
    kinds = set(typing.get_args(BlockKind))
    assert kinds == set(BLOCKS) == set(BLOCK_PARAMS)
    model = build(cfg(layer_pattern=["attention"], n_layers=3))
    assert all(isinstance(layer, AttentionBlock) for layer in model.layers)
    with pytest.raises(ValidationError, match="layer_pattern"):
        cfg(layer_pattern=["mamba"])


def test_config_shape_errors_name_the_field():
    with pytest.raises(ValidationError, match="n_heads=5"):
        cfg(n_heads=5)
    with pytest.raises(ValidationError, match="n_kv_heads=3"):
        cfg(n_kv_heads=3)
