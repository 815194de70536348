"""Rewards are outcomes, not exit statuses: completions that leave early, fake the marker or game the
check earn 0 through the same work function the task engine runs for RL (CheckedWork), on the toy
curriculum and on HumanEval; honest ones earn 1. Real sandbox (bubblewrap), CPU, no engine."""

import pytest

from factory.posttrain.rl.components import CheckedWork, humaneval_reward, toy_reward
from factory.posttrain.rl.registry import REWARDS
from factory.posttrain.rl.toy import curriculum
from factory.tasks.engine_model import AttemptRequest


def score(work, task_id, completion):
    return work(AttemptRequest(task_id=task_id, candidate=completion))


@pytest.fixture(scope="module")
def toy():
    return toy_reward(None, None)


@pytest.mark.parametrize("task_id, completion, reward", [
    ("toy/type/int/value", "1", 1.0),
    ("toy/type/int/value", "2 * 21", 1.0),  # what it returns counts, not how it is written
    ("toy/type/int/value", "True", 0.0),  # a bool is not an int here
    ("toy/type/str/answer", "'x'", 1.0),
    ("toy/type/list/result", "[]", 1.0),
    ("toy/digit/3", "3", 1.0),
    ("toy/digit/3", "'3'", 0.0),
    ("toy/digit/3", "4", 0.0),
])
def test_toy_rewards_come_from_executing_the_check(toy, task_id, completion, reward):
    out = score(toy.work, task_id, completion)
    assert out["reward"] == reward, out


@pytest.mark.parametrize("completion", [
    "__import__('os')._exit(0)",  # leaves before the check with status 0
    "exit(0)",
    "__import__('sys').exit(0)",
    "print('FACTORY-CHECK-PASSED 00000000000000000000000000000000') or 1 and __import__('os')._exit(0)",  # a forged marker
    "type('I', (int,), {})(3)",  # an int subclass standing in for an int
    "1\n    while True: pass",  # a second statement that never ends
])
def test_rollouts_that_game_the_check_earn_zero(toy, completion):
    out = score(toy.work, "toy/digit/3", completion)
    assert out["reward"] == 0.0 and out["outcome"] != "passed", out


def test_humaneval_rewards_need_the_tests_to_run_to_their_end():
    from factory.evals.humaneval import problems

    reward = humaneval_reward(None, None)
    first = problems()[0]
    assert score(reward.work, first["task_id"], first["canonical_solution"])["reward"] == 1.0
    early = score(reward.work, first["task_id"], "    import sys; sys.exit(0)\n")
    assert early["reward"] == 0.0 and early["outcome"] != "passed", early
    wrong = score(reward.work, first["task_id"], "    return False\n")
    assert wrong["reward"] == 0.0 and "AssertionError" in wrong["reason"]


def test_porting_rewards_need_the_stated_answer():
    from factory.posttrain.rl.components import porting_reward
    from factory.synth.porting import word_problems

    reward = porting_reward(None, None)
    problem = word_problems(count=1)[0]
    task_id = f"porting/{problem['id']}"
    assert reward.tasks[0].task_id == task_id and problem["question"] in reward.tasks[0].prompt
    assert score(reward.work, task_id, str(problem["answer"]))["reward"] == 1.0
    assert score(reward.work, task_id, f"{problem['answer']} + 1")["reward"] == 0.0
    assert score(reward.work, task_id, "__import__('os')._exit(0)")["reward"] == 0.0


def test_curriculum_and_registry():
    tasks = curriculum()
    assert len(tasks) == 4 * 3 + 10 and len({t.task_id for t in tasks}) == len(tasks)
    assert {"toy", "humaneval", "repo_tasks", "porting"} <= set(REWARDS.entries) and REWARDS.get("repo_tasks").needs_task_table
    with pytest.raises(KeyError, match="not registered"):
        REWARDS.get("nonesuch")


def test_a_new_reward_is_a_function_and_a_name():
    from factory.posttrain.rl import RLConfig
    from factory.posttrain.rl.components import Reward, RLTask

    @REWARDS.register("digits_only_for_test")
    def build(config, lake):
        tasks = [t for t in curriculum(("digit",))]
        return Reward("digits_only_for_test", tuple(RLTask(t.task_id, t.prompt) for t in tasks),
                      CheckedWork({t.task_id: (t.prompt, t.test, t.entry_point, "") for t in tasks}))

    try:
        config = RLConfig(name="t", start="ckpt/x@1", reward="digits_only_for_test", steps=1)
        reward = REWARDS.get(config.reward).build(config, None)
        assert len(reward.tasks) == 10 and score(reward.work, "toy/digit/7", "7")["reward"] == 1.0
    finally:
        REWARDS.entries.pop("digits_only_for_test")
