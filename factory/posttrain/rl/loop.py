"""The RL loop: sample groups from vLLM, score them in the sandbox through the task engine, update the
policy with GRPO, push the new weights into vLLM and prove they arrived, checkpoint, repeat.

`run_rl(config, lake)` is the whole run in one process (`python -m factory.posttrain.rl`, which the
`rl_run` asset launches through Dagster Pipes). Policy version v is the weights after v updates
(0 = the start checkpoint); every rollout row records the version that sampled it.

- **sync** mode: generate with version v, score, update to v + 1, sync. On-policy, reproducible.
- **async** mode: a producer thread generates and scores the next batches while the trainer updates;
  the queue holds at most `max_staleness` batches, and a batch sampled by version b is used at
  update v + 1 only if v - b <= max_staleness (else it is recorded as dropped, `used = false`). The
  importance weight of factory.posttrain.rl.grpo corrects for the lag. Scoring runs in the task
  engine's worker processes, so it overlaps with the trainer's work; generation and weight pushes
  take one lock (the engine is never updated mid-generation).

Resuming: checkpoints hold the model, optimizer, RNG and version (`step-<v>.pt`, the trainer's
checkpoint format, with the start's plan, so `factory export` and the eval sensor take them like any
checkpoint). A relaunched run loads the newest valid one, pushes it into vLLM (verified like every
sync), drops `rl.rollouts` rows of later steps and continues with the same version numbers.
"""

from __future__ import annotations

import contextlib
import json
import queue
import random
import threading
import time
from dataclasses import dataclass, field

import torch

from factory.faults import NO_FAULTS, Faults
from factory.infer.engine import EngineConfig
from factory.infer.export import export_checkpoint, training_model
from factory.lake import Lake
from factory.posttrain.rl import grpo, store
from factory.posttrain.rl.components import Reward
from factory.posttrain.rl.config import RLConfig, check_rl_config
from factory.posttrain.rl.registry import ACTORS, ALGORITHMS, REWARDS
from factory.posttrain.rl.rollout import Rollout
from factory.posttrain.rl.sync import SyncError, WeightSync
from factory.train import checkpoint as ckpt
from factory.train.incidents import record_incident
from factory.train.report import Reporter
from factory.train.trackers.iceberg import commit_stamp
from factory.version import code_version, config_hash

PROBE_TEXT = "\n    for item in items:\n        total += item\n    return total\n"


@dataclass
class Batch:
    index: int  # the producer's count (1-based): seeds its tasks and sampling
    rollouts: list[Rollout]
    results: list  # AttemptResult per rollout
    generate_s: float
    score_s: float


@dataclass
class RLResult:
    run: str
    steps: int
    resumed_from: int | None
    rewards: list[float] = field(default_factory=list)  # mean reward of each update's batch, from resumed_from on
    dropped_batches: int = 0
    sync_share: float = 0.0  # sync time / step time over the run
    checkpoints: list[str] = field(default_factory=list)
    seconds: float = 0.0


def run_rl(config: RLConfig, lake: Lake, *, run_id: str = "", reporter: Reporter | None = None,
           faults: Faults = NO_FAULTS, scorer=None) -> RLResult:
    """The run of `config` (module docstring). `scorer` is an open TaskEngine serving this reward's work
    (several runs in one process can share one Ray instance); by default the run opens its own."""
    rep, started = reporter or Reporter(), time.monotonic()
    start = check_rl_config(config, lake)  # the start checkpoint, read once
    torch.manual_seed(config.seed)
    model = training_model(start).train()
    algorithm = ALGORITHMS.get(config.algorithm).build(config)
    reference = training_model(start) if algorithm.needs_reference else None
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.optimizer.lr, weight_decay=config.optimizer.weight_decay)
    directory = ckpt.checkpoint_dir(lake.home, config.name)
    version, previous = _resume(directory, model, optimizer, rep)
    stamp = commit_stamp(store.ROLLOUTS_TABLE, lake, [previous or start.ref.checkpoint_id], run_id=run_id)
    if version:
        dropped = store.forget_after(lake, config.name, version, stamp)
        rep.log(f"{config.name}: resuming at policy version {version}" + (f", {dropped} later rollouts dropped" if dropped else ""))
    reward = REWARDS.get(config.reward).build(config, lake)
    export = export_checkpoint(lake, start, run_id=run_id, asset_key="rl_run")
    actor = ACTORS.get(config.rollout.actor).build(export, EngineConfig(kind="vllm", dtype="float32", seed=config.seed))
    result = RLResult(run=config.name, steps=version, resumed_from=version or None)
    try:
        probe = [actor.prompt_ids(t, 64) + actor.engine.encode(PROBE_TEXT) for t in reward.tasks[:config.sync_check.probe_prompts]]
        tied = start.plan.model.tie_embeddings and start.plan.model.width_multiplier == 1.0
        sync = WeightSync(actor.engine, probe, config.sync_check, tied=tied, corrupt=faults.corrupt_sync)
        _push(sync, model, version, lake, config.name)
        actor.version = version
        loop = _Loop(config, lake, model, optimizer, algorithm, reference, reward, actor, sync, rep, faults, run_id,
                     start, previous)
        loop.run(version, result, scorer)
    finally:
        actor.close()
    result.seconds = round(time.monotonic() - started, 2)
    return result


class _Loop:
    def __init__(self, config, lake, model, optimizer, algorithm, reference, reward: Reward, actor, sync, rep, faults,
                 run_id, start, previous):
        self.config, self.lake, self.model, self.optimizer, self.reference = config, lake, model, optimizer, reference
        self.algorithm = algorithm
        self.reward, self.actor, self.sync, self.rep, self.faults, self.run_id = reward, actor, sync, rep, faults, run_id
        self.start, self.previous = start, previous
        self.lock = threading.Lock()  # generation and weight pushes never overlap
        self._stop, self._producer = False, None

    def run(self, version: int, result: RLResult, scorer=None) -> None:
        with contextlib.nullcontext(scorer) if scorer is not None else open_scorer(self.config, self.reward,
                                                                                   self.lake) as self.scorer:
            batches = self._batches(version)
            try:
                self._steps(version, batches, result)
            finally:
                self._stop = True  # the producer finishes the batch it is on and leaves
                if self._producer is not None:
                    self._producer.join(timeout=120)
        result.sync_share = self._sync_s / self._step_s if self._step_s else 0.0

    def _steps(self, version: int, batches, result: RLResult) -> None:
        config = self.config
        self._step_s = self._sync_s = 0.0
        while version < config.steps:
            batch = next(batches)
            lag = version - batch.rollouts[0].policy_version
            if lag > config.max_staleness:  # only async mode can get here
                self._record(version + 1, batch, [0.0] * len(batch.rollouts), used=False)
                result.dropped_batches += 1
                continue
            t0 = time.perf_counter()
            rewards, stats = self._update(batch)
            version += 1
            t1 = time.perf_counter()
            with self.lock:
                report = _push(self.sync, self.model, version, self.lake, config.name)
                self.actor.version = version
            self._step_s += time.perf_counter() - t0 + (batch.generate_s + batch.score_s if config.mode == "sync" else 0)
            self._sync_s += report.seconds
            self._record(version, batch, stats["advantages"], used=True)
            mean = sum(rewards) / len(rewards)
            result.rewards.append(mean)
            self.rep.log(f"step {version}/{config.steps} reward {mean:.3f} loss {stats['loss']:.4f} "
                         f"lag {lag} gen {batch.generate_s:.2f}s score {batch.score_s:.2f}s "
                         f"update {t1 - t0:.2f}s sync {report.seconds:.2f}s (logprob gap {report.max_logprob_diff:.1e})")
            if version % config.checkpoint_every == 0 or version == config.steps:
                result.checkpoints.append(self._save(version, stats["loss"]))
            result.steps = version
            self.faults.kill_after(version)

    # -- rollouts ---------------------------------------------------------------------------------
    def _batches(self, version: int):
        """Batches in order: made on demand (sync) or by a producer thread up to max_staleness ahead (async)."""
        if self.config.mode == "sync":
            index = version
            while True:
                index += 1
                yield self._make(index)
        ahead: queue.Queue = queue.Queue(maxsize=max(1, self.config.max_staleness))

        def produce():
            index = version
            while not self._stop:
                index += 1
                try:
                    made = self._make(index)
                except BaseException as exc:  # noqa: BLE001 - handed to the trainer, which raises it
                    made = exc
                while not self._stop:
                    try:
                        ahead.put(made, timeout=0.5)
                        break
                    except queue.Full:
                        continue
                if isinstance(made, BaseException):
                    return

        self._producer = threading.Thread(target=produce, daemon=True, name="rl-producer")
        self._producer.start()
        while True:
            item = ahead.get()
            if isinstance(item, BaseException):
                raise item
            yield item

    def _make(self, index: int) -> Batch:
        from factory.tasks.engine import AttemptRequest

        config, rng = self.config, random.Random(f"{self.config.seed}/{index}")
        tasks = list(self.reward.tasks)
        chosen = rng.sample(tasks, config.rollout.prompts_per_step) if len(tasks) >= config.rollout.prompts_per_step \
            else rng.choices(tasks, k=config.rollout.prompts_per_step)
        t0 = time.perf_counter()
        with self.lock:
            rollouts = self.actor.generate(chosen, config.rollout, seed=config.seed * 1_000_003 + index * 1000)
        t1 = time.perf_counter()
        requests = [AttemptRequest(task_id=r.task.task_id, candidate=r.text, consumer=f"rl/{config.name}")
                    for r in rollouts]
        results = self.scorer.run(requests)
        return Batch(index, rollouts, results, t1 - t0, time.perf_counter() - t1)

    # -- the update ---------------------------------------------------------------------------------
    def _update(self, batch: Batch) -> tuple[list[float], dict]:
        config = self.config
        rewards = [r.reward for r in batch.results]
        advantages = self.algorithm.advantages(torch.tensor(rewards))
        seqs = [list(r.prompt_ids) + list(r.completion_ids) for r in batch.rollouts]
        starts = [len(r.prompt_ids) for r in batch.rollouts]
        logp, mask = grpo.completion_logprobs(self.model, seqs, starts)
        behaviour = torch.zeros_like(logp)
        for i, r in enumerate(batch.rollouts):
            behaviour[i, starts[i] - 1:starts[i] - 1 + len(r.completion_ids)] = torch.tensor(r.behaviour_logprobs)
        ref = None
        if self.reference is not None:
            with torch.no_grad():
                ref, _ = grpo.completion_logprobs(self.reference, seqs, starts)
        loss, stats = self.algorithm.loss(logp, behaviour, advantages, mask, ref)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), config.optimizer.grad_clip)
        self.optimizer.step()
        return rewards, {"loss": stats.loss, "kl": stats.kl, "is_weight": stats.is_weight,
                         "advantages": advantages.tolist()}

    def _record(self, step: int, batch: Batch, advantages: list[float], *, used: bool) -> None:
        rows = [{"policy_version": r.policy_version, "lag": step - 1 - r.policy_version, "task_id": r.task.task_id,
                 "env_digest": r.task.env_digest, "group": r.group, "sample": r.sample, "completion": r.text,
                 "completion_tokens": len(r.completion_ids), "finish_reason": r.finish_reason, "reward": res.reward,
                 "advantage": float(a), "outcome": res.outcome, "reason": _reason(res),
                 "attempt_key": res.attempt_key, "used": used}
                for r, res, a in zip(batch.rollouts, batch.results, advantages)]
        stamp = commit_stamp(store.ROLLOUTS_TABLE, self.lake, [self.previous or self.start.ref.checkpoint_id],
                             run_id=self.run_id)
        store.write_rollouts(self.lake, self.config.name, step, rows, stamp)

    def _save(self, version: int, loss: float) -> str:
        config, start = self.config, self.start.plan
        # the start's plan (model, tokenizer, mix: what export and the evals need), with this run's eval cadence
        # and suite, which the eval sensor and the eval asset read from a checkpoint
        plan = start.model_copy(update={"experiment": start.experiment.model_copy(
            update={"eval_every": config.eval_every, "eval_suite": config.eval_suite})})
        payload = {"step": version, "model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                   "rng": torch.get_rng_state(), "plan": plan.model_dump_json(), "rl_config": config.model_dump_json(),
                   "code_version": code_version()}
        ref = ckpt.save_checkpoint(ckpt.checkpoint_dir(self.lake.home, config.name), version, payload, run=config.name,
                                   tokens=0, loss=loss)
        ckpt.record_checkpoint(self.lake, ref, experiment=config.name, mix_version=plan.mix_version,
                               config_hash=config_hash(config), eval_every=config.eval_every,
                               upstream=[self.previous or self.start.ref.checkpoint_id, plan.tokenizer], run_id=self.run_id,
                               asset_key="rl_run")
        self.previous = ref.checkpoint_id
        return ref.checkpoint_id


def open_scorer(config: RLConfig, reward: Reward, lake: Lake):
    """The task engine that scores `reward`'s completions, committing once per batch: a commit (and the
    read-check-write scan behind it) costs about as much for one row as for a batch, so the writer waits
    until a whole batch is in (or `flush_s` passed) instead of committing results one by one."""
    from factory.tasks.engine import EngineConfig as ScoringConfig, TaskEngine

    batch = config.rollout.prompts_per_step * config.rollout.group_size
    scoring = ScoringConfig(workers=config.scoring_workers, lease_s=120, flush_s=30.0, batch_rows=batch)
    return TaskEngine(scoring, reward.work, lake=lake, asset_key="rl_run")


def _push(sync: WeightSync, model, version: int, lake: Lake, run: str):
    try:
        return sync.push(model, version)
    except SyncError as e:
        record_incident(lake, run, version, "weight_sync_mismatch", e.detail)
        raise


def _resume(directory, model, optimizer, rep: Reporter) -> tuple[int, str | None]:
    ref = ckpt.latest_valid(directory, rep.warn) if directory.exists() else None
    if ref is None:
        return 0, None
    payload = ckpt.load_checkpoint(ref)
    model.load_state_dict(payload["model"])
    optimizer.load_state_dict(payload["optimizer"])
    torch.set_rng_state(payload["rng"])
    return int(payload["step"]), ref.checkpoint_id


def _reason(result) -> str:
    if result.error:
        return result.error[:500]
    return str(json.loads(result.detail or "{}").get("reason", ""))[:500]
