"""Eval suites: which tasks run on every evaluated checkpoint (an experiment names its suite).

`default` is sized for a smoke model on two CPU cores (one to two minutes after the engine
starts): bits per byte on 32 held-out documents of every source, 200 next-line completions,
HumanEval greedy pass@1 on all 164 problems plus sampled pass@1/pass@5 on the first 16. `quick` is
the same tasks on a sliver, for tests and the end-to-end sensor check. `repo_tasks` is pass@1 on
50 stored function-completion tasks of real repositories, scored in the sandbox through the task
engine on Ray (it needs `tasks/function_completion` materialized first).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # factory.evals imports torch: experiment discovery checks suite names without it
    from factory.evals import SuiteConfig


def default() -> SuiteConfig:
    from factory.evals import SuiteConfig

    return SuiteConfig(name="default", tasks=[
        {"task": "bpb", "max_docs": 32},
        {"task": "line_completion", "max_examples": 200},
        {"task": "humaneval"},
        {"task": "humaneval", "name": "humaneval_sampled", "samples": 5, "temperature": 0.8, "k": (1, 5),
         "max_problems": 16},
    ])


def quick() -> SuiteConfig:
    from factory.evals import SuiteConfig

    return SuiteConfig(name="quick", tasks=[
        {"task": "bpb", "max_docs": 4, "max_bytes_per_doc": 1024},
        {"task": "line_completion", "max_examples": 16},
        {"task": "humaneval", "max_problems": 8, "max_tokens": 48},
    ])


def heldout() -> SuiteConfig:
    """Held-out bits per byte only: what sweeps and the auto-mixer's proxies are ranked by."""
    from factory.evals import SuiteConfig

    return SuiteConfig(name="heldout", tasks=[{"task": "bpb", "max_docs": 16, "max_bytes_per_doc": 2048}])


def heldout_default() -> SuiteConfig:
    """`heldout` on the default mix's sources only, whatever else the checkpoint trained on: what
    the auto-mixer's designed case (`configs/sweeps/automix_junk.py`) ranks its proxies by, so a
    source of junk is judged by what it does to real text, not by how well it is itself predicted."""
    from configs.mixes import mix_spec
    from factory.evals import SuiteConfig

    return SuiteConfig(name="heldout_default", tasks=[{"task": "bpb", "max_docs": 16, "max_bytes_per_doc": 2048,
                                                      "sources": tuple(mix_spec("default").weights)}])


def heldout_code() -> SuiteConfig:
    """`heldout` on `refined.site_packages` alone: how the one-source designed case
    (`automix_junk_code` over mix `code_with_junk`) ranks its proxies, junk left out of the score.
    48 documents, as many as `heldout_default` scores over its three sources."""
    from factory.evals import SuiteConfig

    return SuiteConfig(name="heldout_code", tasks=[{"task": "bpb", "max_docs": 48, "max_bytes_per_doc": 2048,
                                                   "sources": ("refined.site_packages",)}])


def repo_tasks() -> SuiteConfig:
    """Function completion on repositories' own tests: greedy pass@1 through the task engine."""
    from factory.evals import SuiteConfig

    return SuiteConfig(name="repo_tasks", tasks=[{"task": "repo_tasks", "max_tasks": 50}])


SUITES = {"default": default, "quick": quick, "heldout": heldout, "heldout_default": heldout_default,
          "heldout_code": heldout_code, "repo_tasks": repo_tasks}


def suite(name: str) -> SuiteConfig:
    if name not in SUITES:
        raise ValueError(f"unknown eval suite {name!r}; defined in configs/evals.py: {sorted(SUITES)}")
    return SUITES[name]()
