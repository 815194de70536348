"""Numerics guards: non-finite steps and loss / gradient-norm spikes.

Every decision is taken on values that are identical on all ranks (the all-reduced loss and the
global gradient norm after the all-reduce), so replicas always agree on skipping a step. The
rolling statistics are part of the checkpoint, so a resumed run makes the same decisions as an
uninterrupted one.

Spike rule: a value more than `spike_sigma` standard deviations above the mean of the last
`spike_window` accepted values (once the window is full). Skipped steps do not enter the window.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from factory.train.config import GuardConfig


@dataclass(frozen=True)
class Verdict:
    """What to do with one step."""

    action: str  # "ok", "skip", "rollback", "warn", "error"
    kind: str = ""  # "nonfinite" or "spike"
    detail: str = ""

    @property
    def apply_update(self) -> bool:
        return self.action in ("ok", "warn")


class TooManySkips(RuntimeError):
    """More consecutive steps were skipped than the guard allows."""


class NumericsError(RuntimeError):
    """A non-finite step under `guards.nonfinite = error`."""


class Guards:
    """Judges every step. `flagged` and `skipped` count this launch's non-ok and not-applied
    verdicts (the run's result reports them); the rolling windows are `state_dict()`."""

    def __init__(self, config: GuardConfig, state: dict | None = None):
        self.config = config
        state = state or {}
        self.loss = deque(state.get("loss", []), maxlen=config.spike_window)
        self.grad_norm = deque(state.get("grad_norm", []), maxlen=config.spike_window)
        self.consecutive_skips = state.get("consecutive_skips", 0)
        self.flagged = self.skipped = 0

    def state_dict(self) -> dict:
        return {"loss": list(self.loss), "grad_norm": list(self.grad_norm), "consecutive_skips": self.consecutive_skips}

    def judge(self, loss: float, grad_norm: float) -> Verdict:
        """The verdict for a step with this (all-reduced) loss and global gradient norm."""
        if not (math.isfinite(loss) and math.isfinite(grad_norm)):
            verdict = Verdict("skip" if self.config.nonfinite == "skip" else "error", "nonfinite",
                              f"loss={loss} grad_norm={grad_norm}")
        else:
            verdict = self._spike(loss, grad_norm)
        self.flagged += verdict.action != "ok"
        self.skipped += not verdict.apply_update
        if verdict.apply_update:
            self.loss.append(loss)
            self.grad_norm.append(grad_norm)
            self.consecutive_skips = 0
        elif verdict.action in ("skip", "rollback"):
            self.consecutive_skips += 1
            if self.consecutive_skips > self.config.max_consecutive_skips:
                raise TooManySkips(f"{self.consecutive_skips} consecutive steps skipped (last: {verdict.kind}, "
                                   f"{verdict.detail}); max_consecutive_skips={self.config.max_consecutive_skips}")
        return verdict

    def _spike(self, loss: float, grad_norm: float) -> Verdict:
        for name, value, window in (("loss", loss, self.loss), ("grad_norm", grad_norm, self.grad_norm)):
            if len(window) < self.config.spike_window:
                continue
            mean = sum(window) / len(window)
            std = math.sqrt(sum((v - mean) ** 2 for v in window) / len(window))
            threshold = mean + self.config.spike_sigma * max(std, 1e-6 * max(abs(mean), 1e-12))
            if value > threshold:
                return Verdict(self.config.spike_action, "spike",
                               f"{name}={value:.4g} > {threshold:.4g} (mean {mean:.4g} + {self.config.spike_sigma} sigma)")
        return Verdict("ok")
