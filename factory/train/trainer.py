"""The training loop: stream the mix, step, guard, verify replicas, checkpoint, report.

`train(plan, lake)` is the whole run for one process (torchrun starts one per rank). It resumes
from the run's latest valid checkpoint — model, optimizer, RNG, guard windows and loader state —
so a killed run loses at most `checkpoint.every` steps and continues bit-identically on CPU.
Every decision that must agree across ranks (skip a step, switch a mix version, which
checkpoint to resume) is taken on all-reduced values or by rank 0 and broadcast.

Test seam: `FACTORY_FAULTS` (JSON) injects faults at run time — `kill_at_step` (SIGKILL itself
after that step), `nan_at_steps` (a NaN loss), `spike_at_steps` (loss x 1000), `corrupt`
({"step", "rank", "param"}: perturb one replica's parameter). Nothing else reads the environment.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from pydantic import BaseModel

from factory.experiments.card import render_card, write_card
from factory.experiments.spec import Plan
from factory.lake import Lake
from factory.mix import LoaderConfig, MixLoader, agreed_resolver
from factory.train import checkpoint as ckpt
from factory.train import replicas
from factory.train.distributed import Dist, init_distributed
from factory.train.guards import Guards, Verdict
from factory.train.model import Transformer, flops_per_token, param_groups
from factory.train.perf import measure_matmul_peak, mfu
from factory.train.plot import loss_curve_png, png_markdown
from factory.train.report import Reporter
from factory.train.schedule import lr_at
from factory.train.tracking import build_tracker, record_incident
from factory import settings


class NumericsError(RuntimeError):
    """A non-finite step under `guards.nonfinite = error`."""


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


def train(plan: Plan, lake: Lake, *, run: str | None = None, run_id: str = "", reporter: Reporter | None = None) -> TrainResult:
    exp = plan.experiment
    d = init_distributed(exp.parallel)
    run = run or exp.name
    rep = reporter or Reporter()
    faults = settings.faults()
    started = time.monotonic()

    torch.manual_seed(exp.seed)
    model = Transformer(plan.model).to(d.device)
    optimizer = torch.optim.AdamW(param_groups(model, exp.optimizer), lr=exp.optimizer.lr,
                                  betas=exp.optimizer.betas, eps=exp.optimizer.eps)
    directory = ckpt.checkpoint_dir(lake.home, run)
    resume = _resume(d, directory, model, optimizer, rep)
    step, loader_state, guard_state, previous = resume or (0, None, None, None)
    guards = Guards(exp.guards, guard_state)
    card = render_card(plan)
    if d.main:
        directory.mkdir(parents=True, exist_ok=True)
        write_card(lake.home, run, card)

    loader = MixLoader(
        lake, plan.mix_version,  # a resumed loader continues on the version in its state
        LoaderConfig(global_batch=exp.global_batch, num_shards=exp.loader_shards, seed=exp.seed,
                     num_workers=exp.loader_workers, follow=exp.follow_mix and "@" not in exp.mix,
                     poll_every=exp.checkpoint.every, weights=exp.mix_weights),
        rank=d.rank, world_size=d.world_size, state=loader_state,
        resolve=agreed_resolver(lake, plan.mix_version.removeprefix("mix/").split("@")[0]) if d.active else None,
        run_id=run if d.main else "",
    )
    net = _wrap(model, exp, d)
    tracker = build_tracker(exp.tracker, lake, lake.home, run) if d.main else None
    if tracker:
        tracker.start(run, params=json.loads(plan.model_dump_json()), tags={"run_id": run_id, "mix": plan.mix_version})
        tracker.log_text("card.md", card)
    with torch.random.fork_rng(devices=[]):  # the peak measurement's random matrices must not move the run's RNG
        flops, peak = flops_per_token(plan.model, plan.seq_len), measure_matmul_peak() if d.main else 0.0
    rep.log(f"{run}: {plan.parameters / 1e6:.2f} M parameters, {plan.steps} steps of {plan.tokens_per_step:,} tokens"
            + (f", resuming after step {step}" if step else ""))

    losses: list[tuple[int, float]] = []
    saved: list[str] = []
    skipped = incidents = 0
    autocast = torch.autocast(d.device.type, dtype=torch.bfloat16, enabled=exp.precision == "bf16")
    try:
        while step < plan.steps:
            t0 = time.perf_counter()
            batch = loader.next_batch()
            waited = time.perf_counter() - t0
            tokens = batch.tokens.to(d.device)
            if exp.replicas.redundant_dry_run and d.active and step % exp.replicas.hash_every == 0:
                # clone: the broadcast writes into the tensor, and this rank's own batch must stay intact
                _dry_run(net, model, tokens[: exp.micro_batch].clone(), d, lake, rep, run, step, autocast)
            scale = math.nan if step + 1 in faults.get("nan_at_steps", []) else \
                1e3 if step + 1 in faults.get("spike_at_steps", []) else 1.0
            loss = _forward_backward(net, tokens, exp.micro_batch, d, autocast, scale)
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), exp.optimizer.grad_clip or math.inf).item()
            verdict = guards.judge(loss, grad_norm)
            lr = lr_at(step, plan.steps, exp.optimizer.lr, exp.schedule)
            if verdict.apply_update:
                for group in optimizer.param_groups:
                    group["lr"] = lr * group.get("lr_scale", 1.0)
                optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            if verdict.action != "ok":
                incidents += 1
                skipped += not verdict.apply_update
                _incident(lake, d, rep, run, step, verdict)
                if verdict.action == "error":
                    raise NumericsError(f"step {step}: {verdict.detail}")
                if verdict.action == "rollback":
                    _rollback(d, directory, model, optimizer, rep, step)
            _corrupt(faults, model, d, step)
            elapsed = time.perf_counter() - t0
            tps = plan.tokens_per_step / elapsed
            metrics = {"loss": loss, "grad_norm": grad_norm, "lr": lr, "tokens_per_s": tps,
                       "mfu": mfu(tps, flops, peak) if peak else 0.0, "loader_stall": waited / elapsed,
                       "skipped": float(not verdict.apply_update)}
            if math.isfinite(loss):
                losses.append((step, loss))
            if tracker and step % exp.tracker.log_every == 0:
                tracker.log_metrics(step, metrics)
            if step % 10 == 0 or step == plan.steps:
                rep.log(f"step {step}/{plan.steps} loss {loss:.4f} grad_norm {grad_norm:.3f} lr {lr:.2e} "
                        f"{tps:,.0f} tok/s stall {100 * waited / elapsed:.1f}%")
            if d.active and step % exp.replicas.hash_every == 0:
                _verify(model, d, lake, rep, run, step)
            if step % exp.checkpoint.every == 0 or step == plan.steps:
                previous = _checkpoint(plan, lake, d, directory, model, optimizer, guards, loader, run, run_id,
                                       step, loss, previous)
                saved.append(previous)
                if tracker:
                    tracker.flush()
            if faults.get("kill_at_step") == step:
                os.kill(os.getpid(), signal.SIGKILL)
    except BaseException:
        if tracker:
            tracker.flush()
            tracker.finish("FAILED")
        raise
    finally:
        loader.close()
    result = TrainResult(run=run, steps=step, tokens=step * plan.tokens_per_step,
                         final_loss=losses[-1][1] if losses else None, checkpoints=saved, skipped_steps=skipped,
                         incidents=incidents, resumed_from=resume[0] if resume else None,
                         seconds=round(time.monotonic() - started, 2))
    if tracker:
        tracker.finish("FINISHED")
        rep.done(_summary(result, losses, plan))
    return result


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


def _forward_backward(net, tokens: torch.Tensor, micro: int, d: Dist, autocast, scale: float = 1.0) -> float:
    """Accumulate gradients over micro-batches; the all-reduced mean loss."""
    chunks = tokens.split(micro)
    total = torch.zeros((), device=tokens.device)
    for i, chunk in enumerate(chunks):
        sync = i == len(chunks) - 1 or not hasattr(net, "no_sync")
        with (contextlib.nullcontext() if sync else net.no_sync()), autocast:
            logits = net(chunk[:, :-1])
            loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), chunk[:, 1:].reshape(-1)) / len(chunks)
            if scale != 1.0:  # fault injection only
                loss = loss * scale
        loss.backward()
        total += loss.detach()
    return d.mean(total).item()


def _dry_run(net, model, micro: torch.Tensor, d: Dist, lake: Lake, rep: Reporter, run: str, step: int, autocast) -> None:
    """Every rank runs rank 0's micro-batch without gradient sync; gradient hashes must agree."""
    import torch.distributed as dist

    dist.broadcast(micro, src=0)
    with (net.no_sync() if hasattr(net, "no_sync") else contextlib.nullcontext()), autocast:
        logits = net(micro[:, :-1])
        F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), micro[:, 1:].reshape(-1)).backward()
    try:
        _compare(replicas.gradients_of(model), "gradients", "gradient_mismatch", d, lake, rep, run, step)
    finally:
        model.zero_grad(set_to_none=True)


def _verify(model, d: Dist, lake: Lake, rep: Reporter, run: str, step: int) -> None:
    _compare(replicas.parameters_of(model), "parameters", "replica_mismatch", d, lake, rep, run, step)


def _compare(named, what: str, kind: str, d: Dist, lake: Lake, rep: Reporter, run: str, step: int) -> None:
    """Compare hashes across ranks; on a mismatch rank 0 records the incident while the others
    wait at a barrier (a rank exiting first would make torchrun kill rank 0 mid-commit)."""
    try:
        replicas.compare(named, what, step)
    except replicas.ReplicaMismatch as e:
        try:
            if d.main:
                record_incident(lake, run, step, kind, {"ranks": e.ranks, "parameters": e.parameters})
        finally:
            d.barrier()
        rep.warn(str(e))
        raise


def _incident(lake: Lake, d: Dist, rep: Reporter, run: str, step: int, verdict: Verdict) -> None:
    rep.warn(f"step {step}: {verdict.kind} ({verdict.detail}) -> {verdict.action}")
    if d.main:
        record_incident(lake, run, step, verdict.kind, {"detail": verdict.detail, "action": verdict.action})


def _corrupt(faults: dict, model, d: Dist, step: int) -> None:
    spec = faults.get("corrupt")
    if spec and spec["step"] == step and spec["rank"] == d.rank:
        with torch.no_grad():
            dict(model.named_parameters())[spec["param"]].add_(1e-3)


def _resume(d: Dist, directory: Path, model, optimizer, rep: Reporter):
    """(step, loader state, guard state, checkpoint id) of the latest valid checkpoint, or None."""
    ref = ckpt.latest_valid(directory, rep.warn) if d.main and directory.exists() else None
    ref = d.broadcast_object(ref)
    if ref is None:
        return None
    payload = ckpt.load_checkpoint(ref)
    model.load_state_dict(payload["model"])
    optimizer.load_state_dict(payload["optimizer"])
    torch.set_rng_state(payload["rng"])
    rep.log(f"resumed from {ref.path} (step {ref.step})")
    return payload["step"], payload["loader"], payload["guards"], ref.checkpoint_id


def _rollback(d: Dist, directory: Path, model, optimizer, rep: Reporter, step: int) -> None:
    """Back to the last good checkpoint's weights and optimizer; the data since is not replayed."""
    ref = d.broadcast_object(ckpt.latest_valid(directory, rep.warn) if d.main else None)
    if ref is None:
        rep.warn(f"step {step}: rollback requested but no checkpoint exists yet; continuing")
        return
    payload = ckpt.load_checkpoint(ref)
    model.load_state_dict(payload["model"])
    optimizer.load_state_dict(payload["optimizer"])
    rep.warn(f"step {step}: rolled back to {ref.checkpoint_id}; skipping the batches since")


def _checkpoint(plan: Plan, lake: Lake, d: Dist, directory: Path, model, optimizer, guards: Guards, loader,
                run: str, run_id: str, step: int, loss: float, previous: str | None) -> str:
    from factory.mix import merge_states

    states = d.all_gather_objects(loader.state_dict())
    ref_id = f"ckpt/{run}@{step}"
    if d.main:
        from factory.version import code_version

        payload = {"step": step, "model": model.state_dict(), "optimizer": optimizer.state_dict(),
                   "rng": torch.get_rng_state(), "loader": merge_states(states), "guards": guards.state_dict(),
                   "plan": plan.model_dump_json(), "code_version": code_version()}
        ref = ckpt.save_checkpoint(directory, step, payload, run=run, tokens=step * plan.tokens_per_step,
                                   loss=loss if math.isfinite(loss) else None)
        upstream = [loader.version.version_id, plan.tokenizer] + ([previous] if previous else [])
        ckpt.record_checkpoint(lake, ref, experiment=plan.experiment.name, mix_version=loader.version.version_id,
                               config_hash=plan.config_hash, eval_every=plan.experiment.eval_every,
                               upstream=upstream, run_id=run_id)
        ckpt.prune(directory, plan.experiment.checkpoint.keep_last)
        ref_id = ref.checkpoint_id
    d.barrier()
    return ref_id


def _summary(result: TrainResult, losses: list[tuple[int, float]], plan: Plan) -> dict:
    meta = {"run": result.run, "steps": result.steps, "tokens": result.tokens, "final_loss": result.final_loss,
            "checkpoints": result.checkpoints[-5:], "skipped_steps": result.skipped_steps,
            "incidents": result.incidents, "resumed_from": result.resumed_from, "seconds": result.seconds,
            "mix_version": plan.mix_version,
            "parameters": plan.parameters}
    if losses:
        meta["loss_curve"] = png_markdown(loss_curve_png(losses, f"{result.run}: training loss"))
    return meta
