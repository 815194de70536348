"""Closest names, for errors about an id or a table that does not exist.

A list of all 31 tables (or every checkpoint id) hides the one the user meant; the closest few by
`difflib`'s ratio show it. A name may have other forms that count as it: a run `smoke-1a2b3c4d`
is as close to `smok` as its experiment `smoke` is.
"""

from __future__ import annotations

import difflib
from typing import Callable, Iterable


def closest(text: str, known: list[str], *, n: int = 3, cutoff: float = 0.6,
            forms: Callable[[str], Iterable[str]] | None = None) -> list[str]:
    """Up to `n` names of `known` closest to `text` (ties: the later in `known` first)."""

    def score(name: str) -> float:
        return max(difflib.SequenceMatcher(None, text, form).ratio() for form in {name, *(forms(name) if forms else ())})

    scored = sorted(((score(name), i, name) for i, name in enumerate(known)), reverse=True)
    return [name for s, _, name in scored if s >= cutoff][:n]


def hint(text: str, known: list[str], **kw) -> str:
    """`closest: a, b; ` for an error message, or every name when there are only a few (`known: ...; `),
    or "" when none is close."""
    if 0 < len(known) <= 5:
        return f"known: {', '.join(known)}; "
    near = closest(text, known, **kw)
    return f"closest: {', '.join(near)}; " if near else ""
