"""Bits per byte on each source's held-out split: the tokenizer-independent language-model loss.

bits/byte = Σ -log₂ p(token) / Σ UTF-8 bytes, over the first `max_bytes_per_doc` bytes of each
held-out document (cut at a character, then tokenized). Dividing by bytes, not tokens, makes
runs with different tokenizers comparable. A document is scored in windows of the engine's
context: each window starts with the last token of the previous one, so every token is predicted
exactly once and no prediction sees more than one context of history (the same as in training).
The first window starts with eos, the separator training put before every document.

stderr is the standard error of the per-document bits/byte (documents are the sampling unit).
"""

from __future__ import annotations

import math

from pydantic import Field

from factory.evals.heldout import heldout_docs, mix_sources
from factory.evals.tasks import Metric, TaskConfig, TaskContext, TaskResult, mean_stderr, register


class BitsPerByteConfig(TaskConfig):
    task: str = "bpb"
    sources: tuple[str, ...] | None = Field(None, description="Tables to score; None = every source of the mix.")
    max_docs: int = Field(32, ge=1, description="Held-out documents per source (hash order: a uniform sample).")
    max_bytes_per_doc: int = Field(4096, ge=16, description="Bytes scored per document (its beginning).")


def _windows(ids: list[int], length: int) -> list[list[int]]:
    step = length - 1
    return [ids[i:i + length] for i in range(0, max(1, len(ids) - 1), step)]


@register(BitsPerByteConfig)
def bits_per_byte(config: BitsPerByteConfig, ctx: TaskContext) -> TaskResult:
    metrics, samples, upstream = [], [], []
    total_bits = total_bytes = 0.0
    for table in config.sources or mix_sources(ctx.lake, ctx.mix_version):
        held = heldout_docs(ctx.lake, ctx.mix_version, table, limit=config.max_docs)
        if not held.docs:
            raise ValueError(f"bpb: {table} has no held-out documents in {ctx.mix_version}")
        upstream.append(held.version_id)
        texts = [d.text[:config.max_bytes_per_doc].encode()[:config.max_bytes_per_doc].decode(errors="ignore")
                 for d in held.docs]
        windows, owner = [], []
        for i, text in enumerate(texts):
            for w in _windows(ctx.engine.document_ids(text), ctx.engine.max_score_len):
                windows.append(w)
                owner.append(i)
        nats = [0.0] * len(texts)
        for i, lps in zip(owner, ctx.engine.logprobs(windows)):
            nats[i] -= sum(lps)
        per_doc = [n / math.log(2) / max(1, len(t.encode())) for n, t in zip(nats, texts)]
        bits, size = sum(nats) / math.log(2), sum(len(t.encode()) for t in texts)
        _, stderr = mean_stderr(per_doc)
        metrics.append(Metric(table, bits / size, len(texts), stderr))
        total_bits, total_bytes = total_bits + bits, total_bytes + size
        samples += [{"item": f"{table}:{d.path}", "reference": None, "completion": None, "outcome": "scored", "score": s}
                    for d, s in zip(held.docs, per_doc)]
        ctx.log(f"bpb {table}: {bits / size:.4f} bits/byte over {len(texts)} documents ({size:,} bytes)")
    metrics.append(Metric("all", total_bits / total_bytes, sum(m.n for m in metrics), None))
    return TaskResult(metrics, samples, upstream, {"bytes": int(total_bytes)})
