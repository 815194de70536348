"""An SFT run: the pre-training trainer (`factory.train.trainer.train`) on packed chat examples, started
from a checkpoint whose vocabulary grows by the chat tokens.

`run_sft(config, lake)`:
1. checks the config against the lake and builds (or finds) the examples version it trains on;
2. makes the chat tokenizer (the start's tokenizer plus the role tokens, factory.tokenize.chat) and the
   run's plan: the start's model with the vocabulary resized, its mix version (so the eval suite's
   bits-per-byte still measures the pre-training data: what fine-tuning forgot), the chat tokenizer;
3. hands the trainer a `FineTune`: the start's weights with new embedding rows (and head rows, when the
   head is untied) set to the mean of the old ones, as transformers' `resize_token_embeddings` does,
   and the packed loader with its loss mask. Checkpoints, metrics (Iceberg, MLflow), the card, guards,
   resume after a kill and lineage are the trainer's, exactly as for `training_run`; the checkpoints'
   lineage leads to the examples version, the chat tokenizer and the start checkpoint;
4. measures the loss of the task format on the held-out examples (masked, packed) at the start and
   after the last step; both go into the run's summary beside the trainer's (loss curve, checkpoints).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from factory.experiments.spec import ExperimentConfig, Plan
from factory.lake import Lake
from factory.posttrain.sft.config import SFTConfig, check_sft_config
from factory.posttrain.sft.data import ExamplesVersion, SFTLoader, build_examples, encode_examples, pack, read_examples
from factory.tokenize import load_tokenizer
from factory.tokenize.chat import ROLES, chat_tokenizer
from factory.train import checkpoint as ckpt
from factory.train.config import ParallelConfig
from factory.train.params import count_parameters
from factory.train.report import Reporter
from factory.version import config_hash


@dataclass
class SFTResult:
    run: str
    steps: int
    examples: str  # the examples version trained on
    train_examples: int
    heldout_examples: int
    dropped_examples: int  # longer than a row
    heldout_loss_before: float
    heldout_loss_after: float
    final_loss: float | None
    checkpoints: list[str]
    resumed_from: int | None
    seconds: float


def plan_sft(config: SFTConfig, lake: Lake, start, *, run_id: str = "") -> tuple[Plan, ExamplesVersion, object]:
    """(the trainer's plan, the examples version, the chat tokenizer artifact) of `config`."""
    examples = build_examples(lake, config.data, run_id=run_id)
    chat = chat_tokenizer(lake, start.plan.tokenizer, run_id=run_id)
    base = start.plan
    seq_len = config.seq_len or base.seq_len
    # a longer row than the start saw extends RoPE's tables (derived from the config, never stored)
    model = base.model.model_copy(update={"vocab_size": max(base.model.vocab_size, chat.vocab_size),
                                          "max_seq_len": max(base.model.max_seq_len, seq_len)})
    experiment = ExperimentConfig.model_validate({
        **base.experiment.model_dump(), "name": config.name, "model": model.model_dump(),
        "description": config.description or f"SFT of {start.checkpoint_id} on {examples.version_id}",
        "mix": base.mix_version, "follow_mix": False, "mix_weights": None, "global_batch": config.global_batch,
        "micro_batch": config.micro_batch, "tokens": None, "steps": config.steps,
        "optimizer": config.optimizer.model_dump(), "schedule": config.schedule.model_dump(),
        "checkpoint": config.checkpoint.model_dump(), "eval_every": config.eval_every, "eval_suite": config.eval_suite,
        "seed": config.seed, "parallel": ParallelConfig().model_dump(), "loader_shards": 1, "compile": False})
    plan = Plan(experiment=experiment, model=model, mix_version=base.mix_version, tokenizer=chat.version_id,
                seq_len=seq_len, steps=config.steps, tokens_per_step=config.global_batch * seq_len,
                grad_accum=config.global_batch // config.micro_batch, parameters=count_parameters(model),
                config_hash=config_hash(config.model_dump(mode="json", exclude={"description"})))
    return plan, examples, chat


def start_weights(start, vocab: int, new_ids: list[int]) -> dict[str, torch.Tensor]:
    """The start checkpoint's weights with `vocab` embedding (and untied head) rows: old rows kept,
    rows of `new_ids` and any added row set to the mean of the rows the tokenizer used before."""
    state = dict(ckpt.load_checkpoint(start.ref)["model"])
    old_vocab = start.plan.model.vocab_size
    used = min(old_vocab, min(new_ids))  # the base tokenizer's ids: 0 .. used - 1
    for key in ("embed_tokens.weight", "lm_head.weight"):
        if key not in state:
            continue
        old = state[key]
        grown = torch.empty(vocab, old.shape[1], dtype=old.dtype)
        grown[:old_vocab] = old
        mean = old[:used].mean(0)
        grown[old_vocab:] = mean
        grown[new_ids] = mean
        state[key] = grown
    return state


def heldout_loss(model, tokenizer, examples: list[dict], seq_len: int, pad_id: int, batch: int = 16) -> float:
    """Mean next-token loss over the held-out examples' answer tokens (packed, masked)."""
    packed = pack(encode_examples(tokenizer, examples), [e["example_id"] for e in examples], seq_len, pad_id)
    total, count = 0.0, 0
    model.eval()
    with torch.no_grad():
        for i in range(0, len(packed.tokens), batch):
            tokens = torch.from_numpy(packed.tokens[i:i + batch])
            mask = torch.from_numpy(packed.loss_mask[i:i + batch])
            logits = model(tokens[:, :-1], torch.from_numpy(packed.segments[i:i + batch]))
            losses = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1), reduction="none")
            total += float((losses * mask.reshape(-1)).sum())
            count += int(mask.sum())
    model.train()
    return total / count if count else math.nan


def run_sft(config: SFTConfig, lake: Lake, *, run_id: str = "", reporter: Reporter | None = None, faults=None,
            preemption_grace_s: float = 60.0) -> SFTResult:
    from factory.faults import NO_FAULTS
    from factory.tokenize.bpe import SPECIAL_TOKENS
    from factory.train.model import Transformer
    from factory.train.trainer import FineTune, train

    rep = _Deferred(reporter or Reporter())
    start = check_sft_config(config, lake)
    plan, examples, chat = plan_sft(config, lake, start, run_id=run_id)
    tokenizer = load_tokenizer(chat.path)
    pad = tokenizer.token_to_id(SPECIAL_TOKENS["pad"])
    new_ids = [tokenizer.token_to_id(t) for t in ROLES.values()]
    weights = start_weights(start, plan.model.vocab_size, new_ids)
    heldout = read_examples(lake, examples.version_id, config.data, heldout_fraction=config.heldout_fraction,
                            heldout=True)
    model = Transformer(plan.model)
    model.load_state_dict(weights)
    before = heldout_loss(model, tokenizer, heldout, plan.seq_len, pad)
    loaders: list[SFTLoader] = []

    def loader(plan, lake, d, run, state):
        made = SFTLoader(lake, examples, tokenizer, dataset=config.data, seq_len=plan.seq_len,
                         global_batch=config.global_batch, seed=config.seed, heldout_fraction=config.heldout_fraction,
                         rank=d.rank, world_size=d.world_size, state=state)
        loaders.append(made)
        return made

    finetune = FineTune(init=lambda m: m.load_state_dict(weights), loader=loader,
                        upstream=(start.checkpoint_id,))
    rep.log(f"{config.name}: fine-tuning {start.checkpoint_id} on {examples.version_id} ({len(heldout)} held out), "
            f"vocabulary {start.plan.model.vocab_size} -> {plan.model.vocab_size} ({chat.version_id})")
    result = train(plan, lake, run=config.name, run_id=run_id, reporter=rep, faults=faults or NO_FAULTS,
                   preemption_grace_s=preemption_grace_s, finetune=finetune)
    final = Transformer(plan.model)
    final.load_state_dict(ckpt.load_checkpoint(ckpt.latest_valid(ckpt.checkpoint_dir(lake.home, config.name), rep.warn))["model"])
    after = heldout_loss(final, tokenizer, heldout, plan.seq_len, pad)
    rep.log(f"{config.name}: held-out loss of the task format {before:.4f} -> {after:.4f}")
    out = SFTResult(run=config.name, steps=result.steps, examples=examples.version_id,
                    train_examples=len(loaders[0].ids) if loaders else 0, heldout_examples=len(heldout),
                    dropped_examples=loaders[0].dropped if loaders else 0, heldout_loss_before=before,
                    heldout_loss_after=after, final_loss=result.final_loss, checkpoints=result.checkpoints,
                    resumed_from=result.resumed_from, seconds=result.seconds)
    rep.inner.done({**rep.summary, "start": start.checkpoint_id, "examples": examples.version_id,
                    "tokenizer": chat.version_id, "train_examples": out.train_examples,
                    "heldout_examples": out.heldout_examples, "dropped_examples": out.dropped_examples,
                    "heldout_loss_before": round(before, 4), "heldout_loss_after": round(after, 4)})
    return out


class _Deferred(Reporter):
    """Passes lines through and keeps the trainer's summary, which the run completes before reporting it."""

    def __init__(self, inner: Reporter):
        self.inner, self.summary = inner, {}

    def log(self, message: str) -> None:
        self.inner.log(message)

    def warn(self, message: str) -> None:
        self.inner.warn(message)

    def done(self, metadata: dict) -> None:
        self.summary = metadata
