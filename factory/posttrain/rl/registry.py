"""Registered components of RL: algorithms, rollout actors and rewards, each found by name.

A new reward is a function plus a config entry: `@REWARDS.register("name", needs_task_table=...)` on a
factory `build(config, lake) -> Reward` in any module imported by `factory.posttrain.rl.components`
(the built-ins) — the loop, the config validation and the `rl.rollouts` table do not change. Actors
and algorithms work the same way. A name that is not registered fails the config naming it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable


@dataclass(frozen=True)
class Component:
    name: str
    build: Callable
    needs_task_table: bool = False


@dataclass
class Registry:
    kind: str
    entries: dict[str, Component] = field(default_factory=dict)

    def register(self, name: str, **options) -> Callable:
        def add(build: Callable) -> Callable:
            if name in self.entries and self.entries[name].build is not build:
                raise ValueError(f"{self.kind} {name!r} is registered twice")
            self.entries[name] = Component(name, build, **options)
            return build
        return add

    def get(self, name: str) -> Component:
        _load_builtins()
        if name not in self.entries:
            raise KeyError(f"{self.kind} {name!r} is not registered; registered: {sorted(self.entries)}")
        return self.entries[name]

    def check(self, name: str) -> str:
        """`name` if registered, else a ValueError (what pydantic turns into a field error)."""
        try:
            self.get(name)
        except KeyError as e:
            raise ValueError(str(e).strip('"')) from None
        return name


ALGORITHMS = Registry("algorithm")
ACTORS = Registry("rollout actor")
REWARDS = Registry("reward")


def _load_builtins() -> None:
    import factory.posttrain.rl.components  # noqa: F401 (registers the built-in components)
