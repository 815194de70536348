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

from factory.synth.config import AgentConfig, BudgetConfig, StageConfig
from factory.synth.generators import Generator

_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


class Supervisor:
    """Budgets across the run: time and tokens globally, rounds per candidate."""

    def __init__(self, budget: BudgetConfig, started: float, tokens: Callable[[], int]):
        self.budget, self.started, self.tokens = budget, started, tokens

    def exhausted(self) -> str | None:
        spent = time.monotonic() - self.started
        if spent > self.budget.max_seconds:
            return f"time budget spent ({spent:.0f}s of {self.budget.max_seconds:.0f}s)"
        if self.tokens() > self.budget.max_tokens:
            return f"token budget spent ({self.tokens()} of {self.budget.max_tokens})"
        return None

    def rounds_left(self, candidate: dict) -> bool:
        return candidate.get("rounds", 0) < self.budget.max_rounds


class Orchestrator:
    """Who runs next, and with which instructions."""

    def admits(self, agent: AgentConfig, candidate: dict, round_: int) -> bool:
        runs = candidate.setdefault("runs", {}).get(agent.name, 0)
        if agent.max_runs is not None and runs >= agent.max_runs:
            return False
        if (round_ - 1) % agent.every:
            return False
        return agent.enter_when is None or agent.enter_when.holds(candidate["fields"])

    def brief(self, agent: AgentConfig, candidate: dict) -> str:
        feedback = candidate["fields"].get(agent.feedback_from) if agent.feedback_from else None
        return agent.instructions + (f"\nFeedback: {feedback}" if feedback else "")


def run_loop(stage: StageConfig, live: list[dict], make_generator: Callable[[AgentConfig, int], Generator],
             supervisor: Supervisor, on_tokens: Callable[[int], None]) -> list[tuple[dict, str | None]]:
    """Run `stage.loop` over `live`; (candidate, rejection reason or None) for each, in order."""
    loop = stage.loop
    generators = {a.name: make_generator(a, i) for i, a in enumerate(loop.agents)}
    orchestrator = Orchestrator()
    failed: dict[int, str] = {}
    active = list(live)
    for round_ in range(1, loop.rounds + 1):
        if not active:
            break
        stop = supervisor.exhausted()
        if stop:
            for c in active:
                c["fields"]["stopped_by"] = stop
            break
        for agent in loop.agents:
            turn = [c for c in active if id(c) not in failed and orchestrator.admits(agent, c, round_)]
            if not turn:
                continue
            for c in turn:
                c["fields"]["instructions"] = orchestrator.brief(agent, c)
            for c, out in zip(turn, generators[agent.name].generate([c["fields"] for c in turn])):
                c["attempts"] += out.attempts
                on_tokens(out.tokens)
                if out.error is not None:
                    failed[id(c)] = f"agent {agent.name} failed in round {round_}: {out.error}"
                    continue
                _write(agent, c, out.text)
                c["runs"][agent.name] = c["runs"].get(agent.name, 0) + 1
                c["chain"].append(agent.name)
        for c in active:
            c["rounds"] = c.get("rounds", 0) + 1
        active = [c for c in active if id(c) not in failed and supervisor.rounds_left(c)
                  and not (loop.stop_when and loop.stop_when.holds(c["fields"]))]
    results = []
    for c in live:
        c["fields"].pop("instructions", None)
        reason = failed.get(id(c))
        if reason is None and loop.result not in c["fields"]:
            reason = f"loop ended without a {loop.result!r} (no agent wrote it)"
        if reason is None:
            c["fields"][stage.output] = c["fields"][loop.result]
        results.append((c, reason))
    return results


def _write(agent: AgentConfig, candidate: dict, text: str) -> None:
    fields = candidate["fields"]
    if agent.mode == "append":
        fields[agent.output] = (fields.get(agent.output, "") + f"\n{agent.name}: {text.strip()}").lstrip("\n")
    else:
        fields[agent.output] = text
    if agent.score:
        found = _NUMBER.search(text or "")
        fields["score"] = float(found.group()) if found else 0.0
