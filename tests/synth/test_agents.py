"""The agent queue on a real lake: a judge/evolver loop ending when the score is good enough, the
orchestrator's feedback reaching the evolver, queue rules (enter_when, max_runs, every), the
supervisor's round budget, two agents in conversation, and a failing agent rejecting its
candidate with the round. Agents are Python functions here (fast, deterministic); the engine-backed
loop runs in test_llm_pipeline.py. CPU."""

import json
import textwrap

import pytest

from factory.lake import Lake
from factory.synth import PipelineConfig, run_pipeline

AGENTS = '''
def seeds():
    return [{"id": f"s{i}", "topic": f"topic {i}"} for i in range(3)]

def draft(fields):
    return fields["topic"]

def evolve(fields):
    note = " [saw feedback]" if "Feedback:" in fields["instructions"] else ""
    return fields["text_so_far"] + " more" + note if "text_so_far" in fields else fields["draft"] + " more"

def judge(fields):
    words = len(fields["text_so_far"].split())
    return f"{words} points: make it longer"

def polish(fields):
    return fields["text_so_far"] + " (polished)"

def speak_a(fields):
    return "question?"

def speak_b(fields):
    return "answer."

def fail_on_s1(fields):
    if fields["id"] == "s1":
        raise ValueError("agent refused")  # a rejection; any other exception is a bug that fails the run
    return fields["draft"] + "!"
'''


@pytest.fixture
def agents_module(tmp_path, monkeypatch):
    (tmp_path / "agents_fixture.py").write_text(textwrap.dedent(AGENTS))
    monkeypatch.syspath_prepend(str(tmp_path))
    return "agents_fixture"


def fn(name: str) -> dict:
    return {"kind": "function", "function": f"agents_fixture:{name}"}


def config(name: str, loop: dict, budget: dict | None = None) -> PipelineConfig:
    return PipelineConfig(
        name=name, seeds={"function": "agents_fixture:seeds"}, text="{final}",
        stages=[{"name": "draft", "output": "draft", "generator": fn("draft")},
                {"name": "refine", "output": "final", "loop": loop}],
        budget={"max_attempts": 1, **(budget or {})},
    )


def rows(lake: Lake, table: str) -> dict[str, dict]:
    return {r["seed_id"]: r for r in lake.table(table).scan().to_arrow().to_pylist()}


JUDGE_EVOLVER = {
    "agents": [
        {"name": "evolver", "generator": fn("evolve"), "output": "text_so_far", "instructions": "Improve it.",
         "feedback_from": "critique"},
        {"name": "judge", "generator": fn("judge"), "output": "critique", "score": True},
        {"name": "polisher", "generator": fn("polish"), "output": "text_so_far", "max_runs": 1,
         "enter_when": {"field": "score", "op": ">=", "value": 4}},
    ],
    "rounds": 6, "stop_when": {"field": "score", "op": ">=", "value": 5}, "result": "text_so_far",
}


def test_judge_and_evolver_loop_until_the_score_is_good_enough(tmp_path, agents_module):
    lake = Lake.open(home=tmp_path / "home")
    result = run_pipeline(lake, config("judged", JUDGE_EVOLVER), log=lambda m: None)
    assert result.accepted == 3 and not result.rejected
    row = rows(lake, "synthetic.judged")["s0"]
    # round 1: "topic 0 more" scores 3; round 2: the evolver sees the judge's critique, 6 words score
    # 6, the polisher enters (score >= 4) for its one run, and score >= 5 ends the loop
    assert row["agent_chain"] == ["draft", "evolver", "judge", "evolver", "judge", "polisher"]
    assert row["text"] == "topic 0 more more [saw feedback] (polished)"
    fields = json.loads(row["fields"])
    assert fields["score"] == 6.0 and fields["critique"] == "6 points: make it longer" and "instructions" not in fields


def test_the_supervisor_caps_rounds_and_keeps_the_latest_result(tmp_path, agents_module):
    lake = Lake.open(home=tmp_path / "home")
    result = run_pipeline(lake, config("capped", JUDGE_EVOLVER, {"max_rounds": 1}), log=lambda m: None)
    assert result.accepted == 3
    row = rows(lake, "synthetic.capped")["s2"]
    assert row["agent_chain"] == ["draft", "evolver", "judge"] and row["text"] == "topic 2 more"


def test_two_agents_in_conversation_append_turns(tmp_path, agents_module):
    lake = Lake.open(home=tmp_path / "home")
    talk = {"agents": [{"name": "asker", "generator": fn("speak_a"), "output": "transcript", "mode": "append"},
                       {"name": "answerer", "generator": fn("speak_b"), "output": "transcript", "mode": "append",
                        "every": 2}],
            "rounds": 3, "result": "transcript"}
    run_pipeline(lake, config("talk", talk), log=lambda m: None)
    row = rows(lake, "synthetic.talk")["s0"]
    # the answerer runs every 2nd round: rounds 1 and 3
    assert row["text"].splitlines() == ["asker: question?", "answerer: answer.", "asker: question?",
                                        "asker: question?", "answerer: answer."]
    assert row["agent_chain"] == ["draft", "asker", "answerer", "asker", "asker", "answerer"]


def test_a_failing_agent_rejects_its_candidate_naming_the_round(tmp_path, agents_module):
    lake = Lake.open(home=tmp_path / "home")
    loop = {"agents": [{"name": "shouter", "generator": fn("fail_on_s1"), "output": "loud"}], "rounds": 2,
            "result": "loud"}
    result = run_pipeline(lake, config("shout", loop), log=lambda m: None)
    assert result.accepted == 2 and result.rejected == {"refine": 1}
    [rejected] = lake.table("synthetic.shout_rejected").scan().to_arrow().to_pylist()
    assert rejected["seed_id"] == "s1"
    assert rejected["reason"] == "agent shouter failed in round 1: ValueError: agent refused"


def test_loop_configs_are_validated():
    with pytest.raises(ValueError, match="give exactly one of generator or loop"):
        PipelineConfig(name="x", seeds={"function": "m:f"}, text="{a}",
                       stages=[{"name": "s", "output": "a"}])


@pytest.mark.slow
def test_secondary_inputs_and_a_judge_score_threshold(tmp_path, agents_module, corpus):
    lake = Lake.open(home=tmp_path / "home")
    corpus.write(lake, "refined.examples", corpus.docstrings("refined.examples", count=6))
    loop = {"agents": [{"name": "evolver", "generator": fn("evolve"), "output": "text_so_far"},
                       {"name": "judge", "generator": fn("judge"), "output": "critique", "score": True}],
            "rounds": 1, "result": "text_so_far"}
    config = PipelineConfig(
        name="fewshot", seeds={"function": "agents_fixture:seeds"}, text="{final}",
        inputs=[{"name": "examples", "table": "refined.examples", "k": 2, "max_chars": 40, "separator": " | "}],
        stages=[{"name": "draft", "output": "draft", "generator": fn("draft")},
                {"name": "refine", "output": "final", "loop": loop}],
        validators=[{"kind": "threshold", "condition": {"field": "score", "op": ">=", "value": 4}}],
    )
    result = run_pipeline(lake, config, log=lambda m: None)
    # "topic N more" is 3 words: every candidate scores 3 and the threshold rejects it, naming the score
    assert result.accepted == 0 and result.rejected == {"threshold": 3}
    rejected = lake.table("synthetic.fewshot_rejected").scan().to_arrow().to_pylist()
    assert {r["reason"] for r in rejected} == {"score = 3.0 fails score >= 4"}
    examples = [json.loads(r["fields"])["examples"] for r in sorted(rejected, key=lambda r: r["seed_id"])]
    assert all(len(e.split(" | ")) == 2 and all(len(part) <= 40 for part in e.split(" | ")) for e in examples)
    again = run_pipeline(lake, config, log=lambda m: None)  # the same seed draws the same examples
    rejected = lake.table("synthetic.fewshot_rejected").scan().to_arrow().to_pylist()
    by_batch = {}
    for r in rejected:
        by_batch.setdefault(r["batch_id"], {})[r["seed_id"]] = json.loads(r["fields"])["examples"]
    assert by_batch[again.batch_id] == by_batch[result.batch_id]


def test_threshold_validators_need_a_condition():
    with pytest.raises(ValueError, match="kind=threshold needs a `condition`"):
        PipelineConfig(name="x", seeds={"function": "m:f"}, text="{a}", validators=[{"kind": "threshold"}],
                       stages=[{"name": "s", "output": "a", "generator": {"kind": "function", "function": "m:f"}}])
