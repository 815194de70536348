"""The agent queue: multi-turn loops (a judge and an evolver for K rounds, two agents in
conversation) with an orchestrator between agents and a supervisor over the whole run.

- **Agents** (`AgentConfig`): a generator (prompt template, model, parameters) with its inputs
  (the candidate's fields, `{instructions}` included) and output field, plus queue rules: enter
  only when a condition holds, run every k-th round, leave after `max_runs`.
- **Orchestrator**: before each turn it picks who runs — the next agent in queue order whose rules
  admit this candidate this round (others are skipped) — and rewrites that agent's instructions:
  its own, plus the latest value of `feedback_from` (the judge's critique reaches the evolver).
- **Supervisor**: the global view. It stops runaway work — the run's token and time budget, and
  each candidate's rounds across loop stages — and ends a loop early when `stop_when` holds (a
  score good enough). A candidate stopped by budget keeps its latest result, marked in its fields.

Every turn is appended to the candidate's agent chain (provenance: who wrote what, in order).
"""

from __future__ import annotations

import re
import time
from typing import Callable

from factory.synth.candidate import Candidate
from factory.synth.config import AgentConfig, BudgetConfig, StageConfig
from factory.synth.generators import Generator

_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


class Supervisor:
    """Budgets across the run: time and tokens globally, rounds per candidate. The one budget
    check: the loop asks it before each round, the pipeline after each batch."""

    def __init__(self, budget: BudgetConfig, started: float, tokens: Callable[[], int]):
        self.budget, self.started, self.tokens = budget, started, tokens

    def exhausted(self) -> str | None:
        """Which budget is spent (time first), or None while both last."""
        spent = time.monotonic() - self.started
        if spent > self.budget.max_seconds:
            return f"time budget spent ({spent:.0f}s of {self.budget.max_seconds:g}s)"
        if self.tokens() > self.budget.max_tokens:
            return f"token budget spent ({self.tokens()} of {self.budget.max_tokens})"
        return None

    def rounds_left(self, candidate: Candidate) -> bool:
        return candidate.rounds < self.budget.max_rounds


class Orchestrator:
    """Who runs next, and with which instructions."""

    def admits(self, agent: AgentConfig, candidate: Candidate, round_: int) -> bool:
        runs = candidate.runs.get(agent.name, 0)
        if agent.max_runs is not None and runs >= agent.max_runs:
            return False
        if (round_ - 1) % agent.every:
            return False
        return agent.enter_when is None or agent.enter_when.holds(candidate.fields)

    def brief(self, agent: AgentConfig, candidate: Candidate) -> str:
        feedback = candidate.fields.get(agent.feedback_from) if agent.feedback_from else None
        return agent.instructions + (f"\nFeedback: {feedback}" if feedback else "")


def run_loop(stage: StageConfig, live: list[Candidate], make_generator: Callable[[AgentConfig, int], Generator],
             supervisor: Supervisor, on_tokens: Callable[[int], None]) -> list[tuple[Candidate, str | None]]:
    """Run `stage.loop` over `live`; (the candidate after the loop, rejection reason or None) for
    each, in order. `now[i]` is candidate i's latest state; the loop works on positions."""
    loop = stage.loop
    generators = {a.name: make_generator(a, i) for i, a in enumerate(loop.agents)}
    orchestrator = Orchestrator()
    now = list(live)
    failed: dict[int, str] = {}
    active = list(range(len(now)))
    for round_ in range(1, loop.rounds + 1):
        if not active:
            break
        stop = supervisor.exhausted()
        if stop:  # the candidate keeps its latest result, marked
            for i in active:
                now[i] = now[i].with_fields(stopped_by=stop)
            break
        for agent in loop.agents:
            turn = [i for i in active if i not in failed and orchestrator.admits(agent, now[i], round_)]
            if not turn:
                continue
            for i in turn:
                now[i] = now[i].with_fields(instructions=orchestrator.brief(agent, now[i]))
            for i, out in zip(turn, generators[agent.name].generate([now[i].fields for i in turn])):
                now[i] = now[i].tried(out.attempts)
                on_tokens(out.tokens)
                if out.error is not None:
                    failed[i] = f"agent {agent.name} failed in round {round_}: {out.error}"
                    continue
                now[i] = _write(agent, now[i], out.text).took_turn(agent.name)
        for i in active:
            now[i] = now[i].next_round()
        active = [i for i in active if i not in failed and supervisor.rounds_left(now[i])
                  and not (loop.stop_when and loop.stop_when.holds(now[i].fields))]
    results = []
    for i, c in enumerate(now):
        c = c.without("instructions")
        reason = failed.get(i)
        if reason is None and loop.result not in c.fields:
            reason = f"loop ended without a {loop.result!r} (no agent wrote it)"
        if reason is None:
            c = c.with_fields(**{stage.output: c.fields[loop.result]})
        results.append((c, reason))
    return results


def _write(agent: AgentConfig, candidate: Candidate, text: str) -> Candidate:
    """The candidate with the agent's answer in its output field (and its score, for a judge)."""
    fields = candidate.fields
    if agent.mode == "append":
        value = (fields.get(agent.output, "") + f"\n{agent.name}: {text.strip()}").lstrip("\n")
    else:
        value = text
    updates = {agent.output: value}
    if agent.score:
        found = _NUMBER.search(text or "")
        updates["score"] = float(found.group()) if found else 0.0
    return candidate.with_fields(**updates)
