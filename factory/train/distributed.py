"""Process-group setup for one training process, from torchrun's environment (read through
`factory.settings.distributed()`, like every variable the factory honours).

Without torchrun (or with WORLD_SIZE=1) the run is a single process and every collective here
is a no-op, so the trainer has one code path. Backend `auto` is NCCL with CUDA, gloo otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from factory import settings
from factory.train.config import ParallelConfig


@dataclass(frozen=True)
class Dist:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device

    @property
    def main(self) -> bool:
        return self.rank == 0

    @property
    def active(self) -> bool:
        return self.world_size > 1

    def all_gather_objects(self, obj) -> list:
        if not self.active:
            return [obj]
        out = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    def broadcast_object(self, obj):
        if not self.active:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def mean(self, value: torch.Tensor) -> torch.Tensor:
        if self.active:
            value = value.clone()
            dist.all_reduce(value, op=dist.ReduceOp.SUM)
            value /= self.world_size
        return value

    def barrier(self) -> None:
        if self.active:
            dist.barrier()


def init_distributed(config: ParallelConfig) -> Dist:
    """Join the process group torchrun set up (if any) and pick this rank's device."""
    rank, world, local = settings.distributed()
    if world != config.world_size:
        raise RuntimeError(f"the experiment asks for {config.world_size} processes, the launcher started {world}")
    cuda = torch.cuda.is_available()
    device = torch.device(f"cuda:{local}") if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    if world > 1 and not dist.is_initialized():
        backend = config.backend if config.backend != "auto" else ("nccl" if cuda else "gloo")
        dist.init_process_group(backend, rank=rank, world_size=world)
    return Dist(rank, world, local, device)


def shutdown() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
