"""Inference series for every `Engine`: requests, sequences, tokens and latency per engine and call.

Design: `Engine.__init_subclass__` (factory/infer/engine.py) calls `instrument_engine(cls)` for
each engine class as it is defined, which wraps the `generate`, `logprobs` and `top_logprobs`
that class defines itself. So vLLM, the transformers reference and any engine added later (the
OpenAI-endpoint client) are measured the same way without a line of their own, and a caller that
holds an engine cannot bypass it. Tokens are the new tokens of `generate` and the scored
positions of `logprobs`, so `rate(factory_infer_tokens_total[1m])` is the engine's throughput.

A thread-local depth keeps nested calls (an engine whose `generate` calls its own `logprobs`, or a
subclass calling its parent's) from being counted twice: only the outermost call is recorded.
Off, the wrapper adds one function call and one dictionary lookup per batch.
"""

from __future__ import annotations

import functools
import threading
import time

from factory.health.metrics import inference, series

OPS = ("generate", "logprobs", "top_logprobs")
_DEPTH = threading.local()


def instrument_engine(cls: type) -> None:
    """Wrap the inference methods `cls` itself defines (idempotent; abstract ones are left alone)."""
    for op in OPS:
        fn = cls.__dict__.get(op)
        if fn is None or getattr(fn, "__isabstractmethod__", False) or getattr(fn, "_health_wrapped", False):
            continue
        setattr(cls, op, _measured(fn, op))


def _measured(fn, op: str):
    @functools.wraps(fn)
    def call(self, batch, *args, **kwargs):
        if series() is None or getattr(_DEPTH, "n", 0):
            return fn(self, batch, *args, **kwargs)
        _DEPTH.n = 1
        t0 = time.perf_counter()
        try:
            out = fn(self, batch, *args, **kwargs)
        finally:
            _DEPTH.n = 0
        seconds = time.perf_counter() - t0
        inference(getattr(self, "name", type(self).__name__), op, seconds, len(batch), _tokens(op, batch, out))
        return out

    call._health_wrapped = True
    return call


def _tokens(op: str, batch, out) -> int:
    if op == "generate":  # new tokens of every sample of every prompt
        return sum(len(sample.token_ids) for samples in out for sample in samples)
    return sum(max(len(seq) - 1, 0) for seq in batch)  # positions scored
