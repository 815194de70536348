"""Cross-domain porting seeds and generator: math word problems → Python programs.

The seeds are grade-school word problems built from templates over seeded random numbers, each
with its structured plan (the quantities and the operations) and its answer. The programmatic
generator ports a problem to a Python program that reads the quantities out of the question's
text, computes the answer in named steps, and asserts it equals the stated answer. The sandbox runs every program, so only programs that compute the right answer
become training rows — the shape the issue asks for (an LLM generator can replace the function
stage through config; the validators stay the same).

Why programmatic on CPU: a smoke-scale model cannot write these programs, and the pipeline's
mechanics (seeds, provenance, validation, the loop into the mixes) need real, verified rows.
"""

from __future__ import annotations

import random

NAMES = ("Ava", "Ben", "Chloe", "Dev", "Elena", "Farid", "Grace", "Hiro", "Ines", "Jon", "Kira", "Luca")
ITEMS = ("apples", "marbles", "stickers", "books", "pencils", "cookies", "stamps", "shells")

# Each template: (kind, text with {placeholders}, operands with ranges, steps as (result, expression)).
TEMPLATES = (
    ("add_groups", "{name} has {a} {item}. {pronoun} buys {b} bags with {c} {item} in each. "
                   "How many {item} does {name} have now?", {"a": (3, 60), "b": (2, 9), "c": (2, 12)},
     [("bought", "b * c"), ("total", "a + bought")]),
    ("share", "{name} has {a} {item} and shares them equally among {b} friends, keeping the rest. "
              "How many {item} does {name} keep?", {"a": (20, 200), "b": (3, 9)},
     [("each", "a // b"), ("kept", "a - each * b")]),
    ("percent", "A shop sells a jacket for {a} dollars and gives a {b} percent discount. "
                "What is the price after the discount, in cents?", {"a": (20, 300), "b": (5, 50)},
     [("cents", "a * 100"), ("discount", "cents * b // 100"), ("price", "cents - discount")]),
    ("speed", "A train travels at {a} kilometres per hour for {b} hours and then at {c} kilometres per hour "
              "for {d} hours. How far does it travel in total?", {"a": (40, 120), "b": (1, 6), "c": (30, 100),
                                                                  "d": (1, 5)},
     [("first", "a * b"), ("second", "c * d"), ("distance", "first + second")]),
    ("area", "A garden is {a} metres long and {b} metres wide. A path {c} metre wide runs along its inside edge. "
             "What area is left for plants, in square metres?", {"a": (10, 40), "b": (8, 30), "c": (1, 3)},
     [("inner_long", "a - 2 * c"), ("inner_wide", "b - 2 * c"), ("area", "inner_long * inner_wide")]),
    ("ages", "{name} is {a} years old. {pronoun} sister is {b} years older. In {c} years, how old will "
             "they be together?", {"a": (5, 40), "b": (1, 12), "c": (1, 20)},
     [("sister", "a + b"), ("together", "(a + c) + (sister + c)")]),
    ("change", "{name} buys {a} notebooks at {b} dollars each and pays with a {c}-dollar note. "
               "How much change does {name} get?", {"a": (1, 6), "b": (1, 9), "c": (50, 100)},
     [("cost", "a * b"), ("change", "c - cost")]),
    ("average", "{name} scored {a}, {b} and {c} points in three games. What was the average score, "
                "rounded down?", {"a": (0, 40), "b": (0, 40), "c": (0, 40)},
     [("total", "a + b + c"), ("average", "total // 3")]),
    ("minutes", "A film starts at {a}:{b:02d} and lasts {c} minutes. How many minutes after midnight "
                "does it end?", {"a": (8, 20), "b": (0, 59), "c": (60, 180)},
     [("start", "a * 60 + b"), ("end", "start + c")]),
    ("boxes", "A factory packs {a} {item} into boxes of {b}. How many boxes are needed for all of them?",
     {"a": (50, 900), "b": (6, 24)}, [("full", "a // b"), ("boxes", "full + (1 if a % b else 0)")]),
)


def word_problems(count: int = 1500, seed: int = 0) -> list[dict]:
    """`count` distinct word problems (id, kind, question, quantities, steps, answer), deterministic."""
    rng = random.Random(seed)
    out, seen = [], set()
    while len(out) < count:
        kind, text, ranges, steps = TEMPLATES[len(out) % len(TEMPLATES)]
        values = {k: rng.randint(lo, hi) for k, (lo, hi) in ranges.items()}
        env = dict(values)
        for name, expr in steps:
            env[name] = eval(expr, {}, dict(env))  # our own template expressions, not input
        answer = env[steps[-1][0]]
        if answer < 0:
            continue
        name = rng.choice(NAMES)
        question = text.format(name=name, pronoun="She" if name in ("Ava", "Chloe", "Elena", "Grace", "Ines", "Kira")
                               else "He", item=rng.choice(ITEMS), **values)
        if question in seen:
            continue
        seen.add(question)
        out.append({"id": f"wp-{seed}-{len(out):05d}", "kind": kind, "question": question,
                    "quantities": values, "steps": steps, "answer": answer})
    return out


def port_to_python(fields: dict) -> str:
    """A program that reads the quantities out of the problem's text, computes the answer step by
    step, and asserts it equals the stated answer. Reading the numbers from the text (rather than
    copying the plan's values) is what makes the sandbox check mean something: a port whose
    variables do not line up with the text computes a different number and is rejected."""
    names = list(fields["quantities"])
    lines = ["import re", "", f"QUESTION = {fields['question']!r}", "", "", "def solve(question: str) -> int:",
             f'    """{fields["kind"].replace("_", " ").capitalize()}: the quantities in the order they appear."""',
             f"    {', '.join(names)}{',' if len(names) == 1 else ''} = map(int, re.findall(r\"\\d+\", question))"]
    lines += [f"    {name} = {expr}" for name, expr in fields["steps"]]
    lines += [f"    return {fields['steps'][-1][0]}", "", "", f"assert solve(QUESTION) == {fields['answer']}", ""]
    return "\n".join(lines)
