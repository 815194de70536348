"""Cross-replica verification: parameter hashes every H steps, gradient hashes in dry-run mode.

Silent data corruption on one accelerator, or a racy kernel, makes data-parallel replicas drift
apart while every loss still looks fine. Every `hash_every` steps each replica hashes every
parameter *on its device* with `kernels.tensor_hash` — the tensor's raw bits as integers, weighted
by position and summed in int64 (wrapping), so one ulp, ±0, a NaN payload or a swap of two
elements all change it; one Triton launch for all parameters on CUDA, a cache-sized PyTorch loop
on CPU, instead of a SHA-1 per parameter on the CPU — and the hashes are all-gathered; a
parameter whose hash differs between ranks stops the run with an error naming the ranks and
parameters, and an incident row.

The redundant dry run catches what a weight hash cannot see: every rank runs the same
micro-batch (rank 0's) without synchronizing gradients and the gradient hashes are compared
before any all-reduce could average a bad gradient away.

`ReplicaChecker` is what the trainer holds: it owns the cadence (`hash_every`), runs the dry run
before a step and the parameter check after it, and on a mismatch has rank 0 record the incident
while the other ranks wait. On a single process it does nothing.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Callable

import torch
import torch.distributed as dist

from factory.train.config import ReplicaCheckConfig
from factory.train.distributed import Dist
from kernels.tensor_hash import launch as tensor_hash  # noqa: F401  (one tensor's hash, for callers and tests)
from kernels.tensor_hash import launch_many


class ReplicaMismatch(RuntimeError):
    """Replicas disagree; `ranks` and `parameters` say where."""

    def __init__(self, what: str, step: int, ranks: list[int], parameters: list[str]):
        shown = ", ".join(parameters[:8]) + (f" and {len(parameters) - 8} more" if len(parameters) > 8 else "")
        super().__init__(f"{what} differ across replicas at step {step}: rank(s) {ranks} diverge from the majority "
                         f"(rank 0 on a tie) in {shown}")
        self.what, self.step, self.ranks, self.parameters = what, step, ranks, parameters


def hashes(named: list[tuple[str, torch.Tensor]]) -> torch.Tensor:
    """The int64 hashes of `named` tensors, [len(named)], on their device."""
    return launch_many([t for _, t in named])


def compare(named: list[tuple[str, torch.Tensor]], what: str, step: int) -> None:
    """All-gather the hashes of `named` tensors and raise `ReplicaMismatch` if ranks differ."""
    local = hashes(named)
    gathered = [torch.empty_like(local) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, local)
    bad_params, bad_ranks = divergent(torch.stack(gathered).cpu())
    if bad_params:
        raise ReplicaMismatch(what, step, bad_ranks, [named[p][0] for p in bad_params])


def divergent(table: torch.Tensor) -> tuple[list[int], list[int]]:
    """(parameter indices, ranks) that disagree in a [world, params] table of hashes.

    A rank diverges on a parameter when its hash differs from the majority's. On a tie (always,
    with two ranks) the reference is the tied value held by the lowest rank — rank 0 when it is
    among them, the rank whose weights DDP broadcast at the start and whose state checkpoints
    save. So two ranks can only say *that* they diverged; the report names rank 1.
    """
    bad_params = (table != table[0]).any(dim=0).nonzero().flatten().tolist()
    bad_ranks: set[int] = set()
    for p in bad_params:  # most_common orders equal counts by first appearance, i.e. by rank
        reference, _ = Counter(table[:, p].tolist()).most_common(1)[0]
        bad_ranks |= {r for r in range(table.shape[0]) if table[r, p].item() != reference}
    return bad_params, sorted(bad_ranks)


def parameters_of(model: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
    return [(_clean(n), p) for n, p in model.named_parameters()]


def gradients_of(model: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
    return [(_clean(n), p.grad if p.grad is not None else torch.zeros_like(p)) for n, p in model.named_parameters()]


def _clean(name: str) -> str:
    """Parameter names without the DDP / torch.compile wrappers' prefixes."""
    for prefix in ("module.", "_orig_mod."):
        name = name.replace(prefix, "")
    return name


class ReplicaChecker:
    """Cross-replica checks at the configured cadence; `record(step, kind, detail)` writes the
    incident (called on rank 0 only), `warn` says it in the run log. Inert unless distributed."""

    def __init__(self, config: ReplicaCheckConfig, d: Dist, model: torch.nn.Module, net: torch.nn.Module,
                 *, micro_batch: int, autocast, record: Callable[[int, str, dict], None], warn: Callable[[str], None]):
        self.config, self.d, self.model, self.net = config, d, model, net
        self.micro_batch, self.autocast, self.record, self.warn = micro_batch, autocast, record, warn

    def _due(self, step: int) -> bool:
        return self.d.active and step % self.config.hash_every == 0

    def before_step(self, step: int, tokens: torch.Tensor) -> None:
        """The redundant dry run, when due: every rank runs rank 0's first micro-batch without
        gradient sync, and the gradient hashes must agree before the real step all-reduces."""
        if not (self.config.redundant_dry_run and self._due(step)):
            return
        micro = tokens[: self.micro_batch].clone()  # the broadcast writes into it: this rank's batch stays intact
        dist.broadcast(micro, src=0)
        with (self.net.no_sync() if hasattr(self.net, "no_sync") else contextlib.nullcontext()), self.autocast:
            self.net(micro[:, :-1], targets=micro[:, 1:]).mean().backward()  # the step's own loss path
        try:
            self._compare(gradients_of(self.model), "gradients", "gradient_mismatch", step)
        finally:
            self.model.zero_grad(set_to_none=True)

    def after_step(self, step: int) -> None:
        """The parameter-hash comparison, when due."""
        if self._due(step):
            self._compare(parameters_of(self.model), "parameters", "replica_mismatch", step)

    def _compare(self, named, what: str, kind: str, step: int) -> None:
        """On a mismatch rank 0 records the incident while the others wait at a barrier (a rank
        exiting first would make torchrun kill rank 0 mid-commit); then every rank raises."""
        try:
            compare(named, what, step)
        except ReplicaMismatch as e:
            try:
                if self.d.main:
                    self.record(step, kind, {"ranks": e.ranks, "parameters": e.parameters})
            finally:
                self.d.barrier()
            self.warn(str(e))
            raise
