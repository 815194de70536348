"""The training loop: stream the mix, step, guard, verify replicas, checkpoint, report.

`train(plan, lake)` is the whole run for one process (torchrun starts one per rank). It resumes
from the run's latest valid checkpoint — model, optimizer, RNG, guard windows and loader state —
so a killed run loses at most `checkpoint.every` steps and continues bit-identically on CPU; a
SIGTERM (preemption) costs at most the step in progress (`factory.train.preempt`).
Every decision that must agree across ranks (skip a step, switch a mix version, which
checkpoint to resume) is taken on all-reduced values or by rank 0 and broadcast.

The loop reads as the recipe; each component owns its cadence and its state: the tracker when
to log (`log_every`), the `Checkpointer` when to save and what to keep, the `ReplicaChecker`
when to compare replicas, the `Guards` what to do with a bad step. Faults for tests come in as
a `Faults` object (`factory.faults`), inert by default; `python -m factory.train` hands down the
one `FACTORY_FAULTS` asks for. Nothing here reads the environment.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import time
from dataclasses import dataclass
from typing import Callable

import torch
from pydantic import BaseModel

from factory.experiments.card import render_card, write_card
from factory.experiments.spec import Plan
from factory.faults import NO_FAULTS, Faults
from factory.health.train import TrainMetrics
from factory.lake import Lake
from factory.mix import LoaderConfig, MixLoader, agreed_resolver
from factory.train.checkpointer import Checkpointer
from factory.train.distributed import Dist, init_distributed
from factory.train.guards import Guards, NumericsError, Verdict
from factory.train.incidents import record_incident
from factory.train.model import Transformer, flops_per_token, param_groups
from factory.train.perf import measure_matmul_peak, mfu
from factory.train.plot import loss_curve_markdown
from factory.train.preempt import Preemption
from factory.train.replicas import ReplicaChecker
from factory.train.report import Reporter
from factory.train.schedule import lr_at
from factory.train.trackers import MultiTracker, build_tracker

PROGRESS_EVERY = 10  # steps between progress lines in the run log (the tracker keeps its own log_every)

__all__ = ["FineTune", "NumericsError", "TrainResult", "train"]


@dataclass(frozen=True)
class FineTune:
    """What turns a run into a fine-tune of another one's checkpoint (factory.posttrain.sft), the
    rest of the run (guards, checkpoints, resume, replicas, trackers, preemption) unchanged:

    - `init(model)` loads the start weights into the freshly built model, before a resume (which
      then overrides them with the run's own newest checkpoint);
    - `loader(plan, lake, d, run, state)` makes this rank's loader in place of the mix's: the same
      protocol (`next_batch`, `state_dict`, `merge_states`, `version.version_id`, `close`), its
      batches may carry a loss mask and packed segments;
    - `upstream`: lineage parents of the run's first checkpoint besides the data and tokenizer (the
      start checkpoint)."""

    init: Callable[[torch.nn.Module], None]
    loader: Callable[..., object]
    upstream: tuple[str, ...] = ()


class TrainResult(BaseModel):
    run: str
    steps: int
    tokens: int
    final_loss: float | None
    checkpoints: list[str]
    skipped_steps: int
    incidents: int
    resumed_from: int | None
    seconds: float


def train(plan: Plan, lake: Lake, *, run: str | None = None, run_id: str = "", reporter: Reporter | None = None,
          faults: Faults = NO_FAULTS, preemption_grace_s: float = 60.0, finetune: FineTune | None = None) -> TrainResult:
    exp, run, rep = plan.experiment, run or plan.experiment.name, reporter or Reporter()
    d = init_distributed(exp.parallel)
    started = time.monotonic()

    model, optimizer = _build(plan, d, finetune)
    saver = Checkpointer(plan, lake, d, model, optimizer, run=run, run_id=run_id, reporter=rep, faults=faults,
                         upstream=finetune.upstream if finetune else ())
    resumed = saver.resume()  # weights, optimizer and RNG now; the loader and guards take their state below
    step = resumed.step if resumed else 0
    guards = Guards(exp.guards, resumed and resumed.guards)
    make_loader = finetune.loader if finetune else _loader
    loader = make_loader(plan, lake, d, run, resumed and resumed.loader)
    net = _wrap(model, exp, d)
    autocast = torch.autocast(d.device.type, dtype=torch.bfloat16, enabled=exp.precision == "bf16")
    record = functools.partial(record_incident, lake, run)
    replicas = ReplicaChecker(exp.replicas, d, model, net, micro_batch=exp.micro_batch, autocast=autocast,
                              record=record, warn=rep.warn)
    tracker, meter = _open_tracker(plan, lake, d, run, run_id), _Meter(plan, d)
    health = TrainMetrics.open(run, d, replicas)  # Prometheus series when FACTORY_METRICS=1 (factory.health)
    rep.log(f"{run}: {plan.parameters / 1e6:.2f} M parameters, {plan.steps} steps of {plan.tokens_per_step:,} tokens"
            + (f", resuming after step {step}" if step else ""))

    # a SIGTERM (preemption) stops the run after the step in progress, checkpointed (factory.train.preempt)
    preempt = Preemption(d, preemption_grace_s, record, rep.warn, run_id=run_id)
    losses: list[tuple[int, float]] = []
    try:
        while step < plan.steps:
            t0 = time.perf_counter()
            batch = loader.next_batch()
            waited = time.perf_counter() - t0  # time blocked on data: the loader's share of the step
            tokens = batch.tokens.to(d.device)
            replicas.before_step(step, tokens)
            loss = _forward_backward(net, tokens, exp.micro_batch, d, autocast, faults.loss_scale(step + 1),
                                     batch.loss_mask, batch.segments)
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), exp.optimizer.grad_clip or math.inf).item()
            # judged on the all-reduced loss and the global norm, so every rank reaches the same verdict
            verdict = guards.judge(loss, grad_norm)
            lr = lr_at(step, plan.steps, exp.optimizer.lr, exp.schedule)
            if verdict.apply_update:
                _set_lr(optimizer, lr)
                optimizer.step()
            optimizer.zero_grad(set_to_none=True)  # a skipped step's gradients must not leak into the next
            step += 1
            if verdict.action != "ok":
                _act_on(verdict, step, d, rep, record, saver)
            faults.corrupt_replica(step, model, d.rank)
            metrics = meter.metrics(loss, grad_norm, lr, verdict, waited, time.perf_counter() - t0)
            health.step(step, metrics, time.perf_counter() - t0)
            if math.isfinite(loss):  # the summary's curve; the tracker keeps the NaN as well
                losses.append((step, loss))
            if tracker.due(step):
                tracker.log_metrics(step, metrics)
            _progress(rep, step, plan.steps, metrics)
            # after the update, before saving: a drifted replica must never be checkpointed as good
            replicas.after_step(step)
            stop = preempt.agreed() and step < plan.steps  # one all-reduce: every rank stops at the same step
            if saver.due(step) or stop:
                saved = saver.save(step, loss, guards.state_dict(), loader)
                tracker.flush()  # metrics are durable up to the checkpoint a relaunch resumes from
            if stop:
                raise preempt.stopped(step, saved)
            faults.kill_after(step)
    except BaseException:
        tracker.flush()  # a failed run keeps its curve up to the failure
        tracker.finish("FAILED")
        raise
    finally:
        health.close()
        loader.close()
        preempt.close()
    result = TrainResult(run=run, steps=step, tokens=step * plan.tokens_per_step, checkpoints=saver.saved,
                         final_loss=losses[-1][1] if losses else None, skipped_steps=guards.skipped,
                         incidents=guards.flagged, resumed_from=resumed and resumed.step,
                         seconds=round(time.monotonic() - started, 2))
    tracker.finish("FINISHED")
    if d.main:
        rep.done(_summary(result, losses, plan))
    return result


def _build(plan: Plan, d: Dist, finetune: FineTune | None) -> tuple[Transformer, torch.optim.Optimizer]:
    exp = plan.experiment
    # seeded before the model is built: every rank starts from the same weights without a broadcast
    torch.manual_seed(exp.seed)
    model = Transformer(plan.model, fused_loss=exp.fused_loss)
    if finetune is not None:
        finetune.init(model)
    model = model.to(d.device)
    optimizer = torch.optim.AdamW(param_groups(model, exp.optimizer), lr=exp.optimizer.lr,
                                  betas=exp.optimizer.betas, eps=exp.optimizer.eps)
    return model, optimizer


def _loader(plan: Plan, lake: Lake, d: Dist, run: str, state: dict | None) -> MixLoader:
    exp = plan.experiment
    return MixLoader(
        lake, plan.mix_version,  # a resumed loader continues on the version in its state
        LoaderConfig(global_batch=exp.global_batch, num_shards=exp.loader_shards, seed=exp.seed,
                     num_workers=exp.loader_workers, follow=exp.follow_mix and "@" not in exp.mix,
                     poll_every=exp.checkpoint.every, weights=exp.mix_weights),
        rank=d.rank, world_size=d.world_size, state=state,
        resolve=agreed_resolver(lake, plan.mix_version.removeprefix("mix/").split("@")[0]) if d.active else None,
        run_id=run if d.main else "",
    )


def _open_tracker(plan: Plan, lake: Lake, d: Dist, run: str, run_id: str) -> MultiTracker:
    """Rank 0's trackers, started, with the card beside the checkpoints and in the tracker; the
    other ranks get an empty (inert) one, so the loop never asks which rank it is on."""
    if not d.main:
        return MultiTracker()
    card = render_card(plan)
    write_card(lake.home, run, card)
    tracker = build_tracker(plan.experiment.tracker, lake, lake.home, run)
    tracker.start(run, params=json.loads(plan.model_dump_json()), tags={"run_id": run_id, "mix": plan.mix_version})
    tracker.log_text("card.md", card)
    return tracker


def _set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr * group.get("lr_scale", 1.0)  # muP scales some groups' rates


def _act_on(verdict: Verdict, step: int, d: Dist, rep: Reporter, record, saver: Checkpointer) -> None:
    """Record a guard's verdict (rank 0, before acting: a stopped run keeps its reason), then act."""
    rep.warn(f"step {step}: {verdict.kind} ({verdict.detail}) -> {verdict.action}")
    if d.main:
        record(step, verdict.kind, {"detail": verdict.detail, "action": verdict.action})
    if verdict.action == "error":
        raise NumericsError(f"step {step}: {verdict.detail}")
    if verdict.action == "rollback":
        saver.rollback(step)


class _Meter:
    """A step's metrics: tokens/s, MFU against the matmul peak rank 0 measured on this device at
    the start (0 elsewhere), and the share of the step spent waiting on the loader."""

    def __init__(self, plan: Plan, d: Dist):
        self.tokens_per_step = plan.tokens_per_step
        with torch.random.fork_rng(devices=[]):  # the peak measurement's random matrices must not move the run's RNG
            self.flops, self.peak = flops_per_token(plan.model, plan.seq_len), measure_matmul_peak() if d.main else 0.0

    def metrics(self, loss: float, grad_norm: float, lr: float, verdict: Verdict, waited: float,
                elapsed: float) -> dict[str, float]:
        tps = self.tokens_per_step / elapsed
        return {"loss": loss, "grad_norm": grad_norm, "lr": lr, "tokens_per_s": tps,
                "mfu": mfu(tps, self.flops, self.peak) if self.peak else 0.0, "loader_stall": waited / elapsed,
                "skipped": float(not verdict.apply_update)}


def _progress(rep: Reporter, step: int, steps: int, m: dict[str, float]) -> None:
    if step % PROGRESS_EVERY == 0 or step == steps:
        rep.log(f"step {step}/{steps} loss {m['loss']:.4f} grad_norm {m['grad_norm']:.3f} lr {m['lr']:.2e} "
                f"{m['tokens_per_s']:,.0f} tok/s stall {100 * m['loader_stall']:.1f}%")


def _wrap(model: torch.nn.Module, exp, d: Dist) -> torch.nn.Module:
    net = model
    if exp.parallel.fsdp:
        if d.device.type != "cuda":
            raise RuntimeError("parallel.fsdp needs CUDA; use DDP (fsdp: false) on CPU")
        from torch.distributed.fsdp import fully_shard

        for layer in model.layers:
            fully_shard(layer)
        net = fully_shard(model)
    elif d.active:
        net = torch.nn.parallel.DistributedDataParallel(model, device_ids=[d.local_rank] if d.device.type == "cuda" else None)
    return torch.compile(net) if exp.compile else net


def _forward_backward(net, tokens: torch.Tensor, micro: int, d: Dist, autocast, scale: float = 1.0,
                      loss_mask: torch.Tensor | None = None, segments: torch.Tensor | None = None) -> float:
    """Accumulate gradients over micro-batches; the all-reduced mean loss. With a `loss_mask`, the
    mean is over the counted targets of the rank's whole batch (each micro-batch adds its masked sum
    over that count), so a micro-batch with few answer tokens weighs no more than its share."""
    chunks = tokens.split(micro)
    masks = loss_mask.to(tokens.device).split(micro) if loss_mask is not None else [None] * len(chunks)
    segs = segments.to(tokens.device).split(micro) if segments is not None else [None] * len(chunks)
    counted = loss_mask.sum().clamp(min=1).to(tokens.device) if loss_mask is not None else None
    total = torch.zeros((), device=tokens.device)
    for i, chunk in enumerate(chunks):
        sync = i == len(chunks) - 1 or not hasattr(net, "no_sync")
        with (contextlib.nullcontext() if sync else net.no_sync()), autocast:
            # the model returns per-token losses: a compiled net compiles its loss with it
            targets = chunk[:, 1:]
            per_token = net(chunk[:, :-1], targets=targets) if segs[i] is None else \
                net(chunk[:, :-1], segs[i], targets=targets)
            if masks[i] is None:
                loss = per_token.mean() / len(chunks)
            else:
                loss = (per_token * masks[i].reshape(-1)).sum() / counted
            if scale != 1.0:  # fault injection only
                loss = loss * scale
        loss.backward()
        total += loss.detach()
    return d.mean(total).item()


def _summary(result: TrainResult, losses: list[tuple[int, float]], plan: Plan) -> dict:
    meta = {"run": result.run, "steps": result.steps, "tokens": result.tokens, "final_loss": result.final_loss,
            "checkpoints": result.checkpoints[-5:], "skipped_steps": result.skipped_steps,
            "incidents": result.incidents, "resumed_from": result.resumed_from, "seconds": result.seconds,
            "mix_version": plan.mix_version,
            "parameters": plan.parameters}
    if losses:
        meta["loss_curve"] = loss_curve_markdown(losses, f"{result.run}: training loss")  # inline in the UI
    return meta
