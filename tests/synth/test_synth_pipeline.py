"""Synthetic pipelines on a real lake with the real sandbox: the porting pipeline's ≥ 1,000
sandbox-verified rows with complete provenance; validators and generator rejections recorded with
reasons (a function stage is called once per candidate, never retried); a rerun adding nothing; the budget stopping a run; config errors. CPU;
needs bubblewrap (~1-2 min, mostly the sandbox running 1,100 programs)."""

import json
import textwrap

import pytest
from pydantic import ValidationError

from configs.synth import pipeline
from factory.lake import Lake
from factory.sandbox import Sandbox, SandboxConfig
from factory.synth import PipelineConfig, run_pipeline


@pytest.fixture(scope="module")
def sandbox():
    boxes = {}
    return lambda timeout: boxes.setdefault(timeout, Sandbox(SandboxConfig(workers=2, timeout_s=timeout, cpu_s=5)))


@pytest.mark.slow
def test_porting_produces_over_a_thousand_verified_rows_with_provenance(tmp_path, sandbox):
    lake = Lake.open(home=tmp_path)
    config = pipeline("porting")
    config = PipelineConfig.model_validate({**config.model_dump(), "seeds": {**config.seeds.model_dump(), "limit": 1100}})
    result = run_pipeline(lake, config, sandbox=sandbox, log=lambda m: None)
    assert result.seeds == 1100 and result.accepted >= 1000 and result.stopped is None
    rows = lake.table("synthetic.porting").scan().to_arrow().to_pylist()
    assert len(rows) == result.accepted and len({r["doc_id"] for r in rows}) == len(rows)
    row = rows[0]
    assert row["agent_chain"] == ["port"] and row["seed_id"].startswith("wp-0-") and row["path"] == row["seed_id"]
    assert row["export_id"] is None and len(row["template_hash"]) == 16 and row["batch_id"] == result.batch_id
    assert json.loads(row["verdicts"]) == {"python_syntax": True, "length": True, "dedup": True,
                                           "decontaminate": True, "sandbox": True}
    fields = json.loads(row["fields"])
    assert fields["program"] == row["text"] and f"assert solve(QUESTION) == {fields['answer']}" in row["text"]
    [record] = [r for r in lake.lineage.records() if r.kind == "synthetic_batch"]
    assert record.version_id == result.version_id and record.upstream == ["function:factory.synth.porting:word_problems"]

    again = run_pipeline(lake, config, sandbox=sandbox, log=lambda m: None)
    assert again.accepted == 0 and again.rejected == {"dedup": 1100}
    assert lake.table("synthetic.porting").current_snapshot().snapshot_id == result.snapshot_id  # no new snapshot
    assert len(lake.table("synthetic.porting_rejected").scan().to_arrow()) == 1100


MODULE = '''
CALLS = {}

def seeds():
    return [{"id": f"s{i}", "n": i} for i in range(8)]

def port(fields):
    n = fields["n"]
    CALLS[n] = CALLS.get(n, 0) + 1
    if n == 0:
        raise ValueError("no program for this seed")  # a function's rejection: recorded, not retried
    if n == 2:
        return "def broken(:\\n    pass\\n"         # not Python
    if n == 3:
        return "assert 1 + 1 == 3, 'wrong answer'\\n"  # runs, fails its check
    if n == 4:
        return "while True:\\n    pass\\n"           # times out
    return f"value = {n} * 2\\nassert value == {2 * n}\\nprint(value)\\n"
'''


def test_failures_are_recorded_and_rejected_with_reasons(tmp_path, sandbox, monkeypatch):
    (tmp_path / "synth_fixture.py").write_text(textwrap.dedent(MODULE))
    monkeypatch.syspath_prepend(str(tmp_path))
    lake = Lake.open(home=tmp_path / "home")
    config = PipelineConfig(
        name="toy", seeds={"function": "synth_fixture:seeds"}, text="{program}",
        stages=[{"name": "port", "output": "program", "generator": {"kind": "function", "function": "synth_fixture:port"}}],
        validators=[{"kind": "python_syntax"}, {"kind": "sandbox", "timeout_s": 2}],
        budget={"max_attempts": 3},
    )
    result = run_pipeline(lake, config, sandbox=sandbox, log=lambda m: None)
    assert result.accepted == 4  # seeds 1, 5, 6, 7
    assert result.rejected == {"port": 1, "python_syntax": 1, "sandbox": 2}
    rejected = {r["seed_id"]: r for r in lake.table("synthetic.toy_rejected").scan().to_arrow().to_pylist()}
    assert rejected["s0"]["reason"] == "generation failed: ValueError: no program for this seed"
    assert rejected["s0"]["attempts"] == 1  # budget.max_attempts=3 is for endpoint requests
    assert rejected["s2"]["stage"] == "python_syntax" and "not Python" in rejected["s2"]["reason"]
    assert rejected["s3"]["stage"] == "sandbox" and "failed" in rejected["s3"]["reason"]
    assert rejected["s4"]["stage"] == "sandbox" and "timeout" in rejected["s4"]["reason"]
    accepted = {r["seed_id"]: r for r in lake.table("synthetic.toy").scan().to_arrow().to_pylist()}
    assert sorted(accepted) == ["s1", "s5", "s6", "s7"] and accepted["s1"]["attempts"] == 1


def test_the_budget_stops_a_run_and_keeps_what_was_accepted(tmp_path, sandbox):
    lake = Lake.open(home=tmp_path)
    config = pipeline("porting")
    config = PipelineConfig.model_validate({**config.model_dump(), "seeds": {**config.seeds.model_dump(), "limit": 600},
                                            "budget": {"max_seconds": 0.001},
                                            "validators": [{"kind": "python_syntax"}]})
    result = run_pipeline(lake, config, sandbox=sandbox, log=lambda m: None, batch_size=100)
    # the supervisor's own check (agents.Supervisor.exhausted), naming the budget that ran out
    assert result.stopped.startswith("stopped after 100 of 600 seeds: time budget spent ("), result.stopped
    assert result.accepted == 100 and len(lake.table("synthetic.porting").scan().to_arrow()) == 100


def test_bad_configs_name_the_field():
    stage = {"name": "port", "output": "program", "generator": {"kind": "function", "function": "m:f"}}
    with pytest.raises(ValidationError, match="exactly one of seeds.table or seeds.function"):
        PipelineConfig(name="x", seeds={"table": "raw.t", "function": "m:f"}, stages=[stage], text="{program}")
    with pytest.raises(ValidationError, match="kind=engine needs a prompt `template`"):
        PipelineConfig(name="x", seeds={"function": "m:f"}, text="{a}",
                       stages=[{"name": "gen", "output": "a", "generator": {"kind": "engine"}}])
    with pytest.raises(ValidationError, match="stage names repeat"):
        PipelineConfig(name="x", seeds={"function": "m:f"}, stages=[stage, stage], text="{program}")
    with pytest.raises(ValueError, match="unknown synthetic pipeline 'nope'"):
        pipeline("nope")
