"""A learnable toy curriculum: tasks whose reward comes only from sandboxed execution, easy enough for
a model of a few hundred thousand parameters to learn on a CPU within minutes.

Each task is a function whose body the policy completes after `return `; the trusted check calls it
and looks at what came back:

    def value():
        # returns an int
        return <completion>

- level 0, `type`: the value is of the asked type (int, str, list, bool): any literal of that type;
- level 1, `digit`: the value is the asked small int (`# returns 3`): the model must read the comment.

Nothing is matched against text: `return 1+1` earns the int task's reward and `return "3"` does not
earn the digit task's. A completion that does not parse, raises, or leaves before the check finishes
(`exit()` inside the function) earns 0 like any other failed check.

Why it is learnable by a 1-2 M parameter model: with one-token completions (`max_tokens=1`) each task
is a choice among the vocabulary's tokens, and a smoke model trained on code already puts a few per
cent of its mass on literals after `return ` (measured: 1-6 % on the int tasks, 0 on the rest). GRPO
moves that mass onto literals, then onto the right kind per comment; the digit level (copy the
number from the comment) is the harder half. Measured runs are in bench/rl_bench.py.
The task ids are stable (`toy/<level>/<name>`) so attempts of one completion are scored once.
"""

from __future__ import annotations

from dataclasses import dataclass

TYPES = {"int": "an int", "str": "a str", "list": "a list", "bool": "a bool"}
NAMES = ("value", "result", "answer")


@dataclass(frozen=True)
class ToyTask:
    task_id: str
    prompt: str
    test: str
    entry_point: str


def curriculum(levels: tuple[str, ...] = ("type", "digit")) -> list[ToyTask]:
    """The tasks of the asked levels, in a fixed order."""
    tasks = []
    if "type" in levels:
        for kind, phrase in TYPES.items():
            for name in NAMES:
                tasks.append(ToyTask(f"toy/type/{kind}/{name}", _prompt(name, f"returns {phrase}"),
                                     f"def check(candidate):\n    assert type(candidate()) is {kind}\n", name))
    if "digit" in levels:
        for digit in range(10):
            tasks.append(ToyTask(f"toy/digit/{digit}", _prompt("value", f"returns {digit}"),
                                 f"def check(candidate):\n    got = candidate()\n"
                                 f"    assert type(got) is int and got == {digit}\n", "value"))
    return tasks


def _prompt(name: str, comment: str) -> str:
    return f"def {name}():\n    # {comment}\n    return "
