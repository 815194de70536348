"""Learning-rate schedules as pure functions of the step: nothing to save, nothing to drift on
resume. Warmup is linear from lr/warmup to lr. Cosine decays to `min_lr_ratio * lr` at the last
step; WSD (warmup-stable-decay) holds the peak and decays linearly over the last
`decay_fraction` of the steps, so a run can be extended from a stable-phase checkpoint."""

from __future__ import annotations

import math

from factory.train.config import ScheduleConfig


def lr_at(step: int, total_steps: int, peak: float, config: ScheduleConfig) -> float:
    """The learning rate for optimizer step `step` (0-based) of `total_steps`."""
    if config.warmup_steps and step < config.warmup_steps:
        return peak * (step + 1) / config.warmup_steps
    floor = peak * config.min_lr_ratio
    if config.kind == "constant":
        return peak
    if config.kind == "cosine":
        span = max(total_steps - config.warmup_steps - 1, 1)
        progress = min(max(step - config.warmup_steps, 0) / span, 1.0)
        return floor + (peak - floor) * 0.5 * (1 + math.cos(math.pi * progress))
    decay_steps = max(int(round(total_steps * config.decay_fraction)), 1)
    decay_start = total_steps - decay_steps
    if step < decay_start:
        return peak
    return peak + (floor - peak) * min((step - decay_start + 1) / decay_steps, 1.0)
