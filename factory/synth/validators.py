"""Validators: each candidate passes every one, or is rejected with the validator and a reason.

Like datatrove's filters, a validator implements only its predicate over a batch (`check`), and
the pipeline counts kept and rejected per validator and keeps the rejects (with their reasons) in
`synthetic.<name>_rejected` — every drop is auditable. Validators run in config order on the
candidates still standing, so an expensive one (the sandbox) only sees what cheap ones passed.

- `python_syntax`: the field parses as Python;
- `length`: characters within bounds;
- `regex`: the field matches a pattern;
- `dedup`: not identical (after whitespace normalization) to another candidate or to any text of
  the tables named in `against` (the pipeline's own output included, so reruns add nothing twice);
- `decontaminate`: shares no long n-gram with the eval sets (the refinement chain's index);
- `sandbox`: the field, run as a Python program (`__main__`) in the bubblewrap sandbox, reaches its
  last statement in time without raising (factory.sandbox.checked: an early `sys.exit(0)` or
  `os._exit(0)` before a failing assert is a reject, not a pass);
- `threshold`: a condition on the candidate's fields holds (a judge's score high enough).
"""

from __future__ import annotations

import ast
import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Callable

from factory.sandbox.checked import checked_program
from factory.synth.config import ValidatorConfig


@dataclass(frozen=True)
class Verdict:
    passed: bool
    reason: str = ""


def _num(value) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def _norm_hash(text: str) -> str:
    return hashlib.sha256(" ".join(text.split()).encode()).hexdigest()


class Validators:
    """The pipeline's validators, with the state some need (seen hashes, the eval index, a sandbox)."""

    def __init__(self, configs: tuple[ValidatorConfig, ...], *, existing_texts: Callable[[tuple[str, ...]], list[str]],
                 sandbox: Callable[[float], object]):
        self.configs = configs
        self._sandbox_for = sandbox
        self._seen: set[str] = set()
        for c in configs:
            if c.kind == "dedup":
                self._seen |= {_norm_hash(t) for t in existing_texts(c.against)}
        self._index = None

    def check(self, config: ValidatorConfig, values: list[str], fields: list[Mapping]) -> list[Verdict]:
        if config.kind == "threshold":
            c = config.condition
            return [Verdict(True) if c.holds(f) else
                    Verdict(False, f"{c.field} = {f.get(c.field, 'missing')} fails {c.field} {c.op} {_num(c.value)}")
                    for f in fields]
        return getattr(self, f"_{config.kind}")(config, values)

    def _python_syntax(self, c: ValidatorConfig, values: list[str]) -> list[Verdict]:
        out = []
        for v in values:
            try:
                ast.parse(v)
                out.append(Verdict(True))
            except (SyntaxError, ValueError) as exc:
                out.append(Verdict(False, f"not Python: {exc.__class__.__name__} line {getattr(exc, 'lineno', '?')}"))
        return out

    def _length(self, c: ValidatorConfig, values: list[str]) -> list[Verdict]:
        lo, hi = c.min_chars or 0, c.max_chars or float("inf")
        return [Verdict(lo <= len(v) <= hi, "" if lo <= len(v) <= hi else f"{len(v)} chars outside [{lo}, {hi}]")
                for v in values]

    def _regex(self, c: ValidatorConfig, values: list[str]) -> list[Verdict]:
        pattern = re.compile(c.pattern or "")
        return [Verdict(bool(pattern.search(v)), "" if pattern.search(v) else f"does not match {c.pattern!r}")
                for v in values]

    def _dedup(self, c: ValidatorConfig, values: list[str]) -> list[Verdict]:
        out = []
        for v in values:
            h = _norm_hash(v)
            out.append(Verdict(h not in self._seen, "" if h not in self._seen else "duplicate of existing text"))
            self._seen.add(h)
        return out

    def _decontaminate(self, c: ValidatorConfig, values: list[str]) -> list[Verdict]:
        from factory.data.refine.decontam import build_index

        index = build_index(list(c.benchmarks), c.ngram)
        out = []
        for v in values:
            hit = index.match(v)
            out.append(Verdict(hit is None, "" if hit is None else f"overlaps {hit[0]} ({hit[1]} {c.ngram}-grams)"))
        return out

    def _sandbox(self, c: ValidatorConfig, values: list[str]) -> list[Verdict]:
        checked = self._sandbox_for(c.timeout_s).map_checked([checked_program(v) for v in values])
        return [Verdict(v.passed, "" if v.passed else f"sandbox {v.outcome.value}: {v.reason}") for v in checked]
