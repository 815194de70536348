"""Weight sync from the trainer to the rollout engine, verified every time.

RL frameworks report weight syncs that "succeed" while rollouts come from corrupted or stale weights
(SkyRL #1680, verl #7978): a tensor left out of the transfer, a wrong shard, a prefix cache that still
holds keys and values of the old weights. So a sync here is not done when the transfer returns:

1. **Push.** The trainer's weights under Llama names (`llama_state_dict`, exactly what an export
   writes) go to vLLM's in-place `reload_weights`, which stacks q/k/v and gate/up into its fused layout. On
   CPU (and a single-process GPU engine) that is an in-process copy through `LLM.collective_rpc`; vLLM's
   NCCL/IPC weight-transfer engines (`init_weight_transfer_engine` / `update_weights`) are the GPU
   path for a separate inference server. The prefix cache is reset: cached KV of the old policy must
   not serve the new one.
2. **Digests.** Every weight vLLM now computes with is hashed where it lives (sha256 of its fp32 bytes,
   in the engine's process) and compared with the trainer's tensors put into the same layout. A
   perturbed, skipped or misplaced tensor is named. On CPU, vLLM packs linear weights into oneDNN
   kernels and frees the parameters, so those are read back through the kernel (identity x W^T): the
   digest is of what the kernel multiplies by, not of a copy it no longer uses.
3. **Log-prob parity.** A fixed probe (the first tasks' prompts with a fixed continuation) is scored
   by the trainer's model and by vLLM; the largest difference must be under `logprob_tolerance`
   (fp32: ~1e-6 when the weights agree). This catches what digests cannot: weights that are right but
   used wrongly (a stale cache, a config mismatch).

A failure raises `SyncError` after the loop records an incident row (`train.incidents`, kind
`weight_sync_mismatch`), and the run stops: rollouts from unknown weights are worse than none.
The time of each phase is kept, so the sync's share of a step is measured, not guessed.
"""

from __future__ import annotations

import functools
import hashlib
import time
from dataclasses import dataclass

import torch

from factory.posttrain.rl.config import SyncCheckConfig
from factory.train.model import llama_state_dict

PACKED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}


class SyncError(RuntimeError):
    """The engine does not hold the trainer's weights after a sync; the message says which and how."""

    def __init__(self, message: str, detail: dict):
        super().__init__(message)
        self.detail = detail


@dataclass(frozen=True)
class SyncReport:
    version: int
    push_s: float
    verify_s: float
    tensors: int
    max_logprob_diff: float

    @property
    def seconds(self) -> float:
        return self.push_s + self.verify_s


def tensor_digest(tensor: torch.Tensor) -> str:
    """sha256 of the tensor's values as contiguous fp32 bytes: bit-exact, order-aware."""
    data = tensor.detach().to(device="cpu", dtype=torch.float32).contiguous()
    return hashlib.sha256(data.numpy().tobytes()).hexdigest()


def engine_layout(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Llama-named weights in the layout vLLM's Llama holds: q/k/v and gate/up stacked along dim 0."""
    out: dict[str, torch.Tensor] = {}
    for name, tensor in weights.items():
        for fused, parts in PACKED.items():
            if f".{parts[0]}." in name:
                out[name.replace(parts[0], fused)] = torch.cat([weights[name.replace(parts[0], p)] for p in parts])
                break
        else:
            if not any(f".{p}." in name for parts in PACKED.values() for p in parts):
                out[name] = tensor
    return out


def _held(model: torch.nn.Module):
    """(name, tensor) of every weight the engine computes with. vLLM's CPU backend packs each linear
    layer's weight into a oneDNN (or sgl) kernel and drops the parameter (`numel() == 0`); the weight
    such a kernel really uses is read back through the kernel itself: the identity times W^T is W^T,
    exactly, in fp32."""
    for module_name, module in model.named_modules():
        for param_name, param in module.named_parameters(recurse=False):
            name = f"{module_name}.{param_name}" if module_name else param_name
            if param_name == "weight" and param.numel() == 0 and hasattr(module, "cpu_linear"):
                eye = torch.eye(module.input_size_per_partition, dtype=torch.float32)
                with torch.no_grad():
                    yield name, module.cpu_linear(eye, param, None).t()
            else:
                yield name, param


def _digests_as(model: torch.nn.Module, shapes: dict[str, tuple[int, ...]]) -> dict[str, str]:
    """The engine's digests, each weight cut to the trainer's shape first (vLLM pads the vocabulary
    of its embedding and head to a multiple of 64; the padding rows are not the model's)."""
    out = {}
    for name, p in _held(model):
        want = shapes.get(name)
        if want is not None and tuple(p.shape) != want and len(want) == p.ndim:
            p = p[tuple(slice(0, n) for n in want)]
        out[name] = tensor_digest(p)
    return out


class WeightSync:
    """Pushes a `Transformer`'s weights into a `VLLMEngine` and proves it holds them (module docstring)."""

    def __init__(self, engine, probe: list[list[int]], config: SyncCheckConfig, *, tied: bool, corrupt=None):
        self.engine, self.probe, self.config, self.tied = engine, probe, config, tied
        self.corrupt = corrupt  # factory.faults.SyncCorruption or None: a test's sabotage of one push

    def push(self, model: torch.nn.Module, version: int) -> SyncReport:
        started = time.perf_counter()
        weights = llama_state_dict(model)
        items = self._sabotaged(list(weights.items()), version)
        # vLLM's in-place reload: its layer-wise loader takes checkpoint-format (Llama) names, then redoes
        # what loading does after the weights arrive (a bare `load_weights` fails once that has run)
        self.engine.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": items, "is_checkpoint_format": True})
        self.engine.llm.reset_prefix_cache()
        pushed = time.perf_counter()
        diff = self.verify(model, version, weights)
        return SyncReport(version=version, push_s=pushed - started, verify_s=time.perf_counter() - pushed,
                          tensors=len(items), max_logprob_diff=diff)

    def verify(self, model: torch.nn.Module, version: int, weights: dict[str, torch.Tensor] | None = None) -> float:
        """Raise SyncError unless the engine's tensors and log-probs match `model`; the largest log-prob gap."""
        expected_tensors = engine_layout(weights or llama_state_dict(model))
        shapes = {name: tuple(t.shape) for name, t in expected_tensors.items()}
        [held] = self.engine.llm.apply_model(functools.partial(_digests_as, shapes=shapes))
        expected = {name: tensor_digest(t) for name, t in expected_tensors.items()}
        if self.tied and "lm_head.weight" not in held:
            expected.pop("lm_head.weight", None)  # the head is the embedding, checked under that name
        wrong = sorted(n for n in expected if n in held and held[n] != expected[n])
        missing = sorted(set(expected) - set(held))
        extra = sorted(set(held) - set(expected))
        if wrong or missing or extra:
            detail = {"version": version, "wrong": wrong, "missing": missing, "unexpected": extra}
            raise SyncError(f"weight sync to policy version {version}: the engine's weights differ from the "
                            f"trainer's: {len(wrong)} tensors differ {wrong[:5]}, {len(missing)} missing {missing[:5]}, "
                            f"{len(extra)} unexpected {extra[:5]}", detail)
        diff = self._parity(model)
        if not diff <= self.config.logprob_tolerance:
            raise SyncError(f"weight sync to policy version {version}: the engine's log-probs on the probe differ "
                            f"from the trainer's by {diff:.3g} nats (tolerance {self.config.logprob_tolerance:g}) "
                            "although every tensor matches", {"version": version, "max_logprob_diff": diff})
        return diff

    @torch.no_grad()
    def _parity(self, model: torch.nn.Module) -> float:
        engine = self.engine.logprobs(self.probe)
        worst = 0.0
        for seq, got in zip(self.probe, engine):
            logits = model(torch.tensor([seq[:-1]])).float()[0]
            want = torch.log_softmax(logits, -1).gather(1, torch.tensor(seq[1:])[:, None])[:, 0]
            worst = max(worst, (want - torch.tensor(got, dtype=want.dtype)).abs().max().item())
        return worst

    def _sabotaged(self, items: list[tuple[str, torch.Tensor]], version: int) -> list[tuple[str, torch.Tensor]]:
        c = self.corrupt
        if c is None or c.version != version:
            return items
        if c.tensor not in dict(items):
            raise ValueError(f"corrupt_sync.tensor {c.tensor!r} is not a weight; e.g. {items[1][0]!r}")
        if c.mode == "skip":
            return [(n, t) for n, t in items if n != c.tensor]
        return [(n, t + 1e-3 if n == c.tensor else t) for n, t in items]
