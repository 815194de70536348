"""An LLM pipeline end to end through vLLM on the session's trained smoke export: the rephrasing
pipeline's three stages (extract → explain with the model → assemble), validators rejecting with
reasons, and complete provenance (export id, agent chain, template hash, tokens). CPU."""

import json

from configs.synth import pipeline
from factory.infer import EngineConfig, export_checkpoint, find_export, open_engine
from factory.synth import PipelineConfig, run_pipeline
import pytest

pytestmark = pytest.mark.slow


def test_rephrasing_runs_on_the_smoke_export(trained_checkpoints):
    lake = trained_checkpoints.lake
    export = export_checkpoint(lake, trained_checkpoints.checkpoint_ids[-1])
    # other tests of the session export other runs' checkpoints (SFT, RL) into this lake: "latest" is
    # pinned to this one here, and the rows below must name it

    def engine_for(ref):
        return open_engine(export if ref == "latest" else find_export(lake, ref), EngineConfig())

    config = pipeline("rephrase")
    config = PipelineConfig.model_validate({**config.model_dump(), "seeds": {**config.seeds.model_dump(), "limit": 12}})
    result = run_pipeline(lake, config, engine_for=engine_for, log=lambda m: None)
    assert result.seeds == 12 and result.accepted + sum(result.rejected.values()) == 12
    assert result.tokens > 0 and set(result.rejected) <= {"extract", "length", "python_syntax", "dedup", "decontaminate"}
    # measured on this corpus: files without a 3-40 line top-level function are rejected by `extract`
    assert result.accepted >= 1 and result.rejected["extract"] >= 1
    rejected = lake.table("synthetic.rephrase_rejected").scan().to_arrow().to_pylist()
    assert all(r["reason"] for r in rejected)
    assert {r["reason"] for r in rejected if r["stage"] == "extract"} == \
           {"generation failed: ValueError: no top-level function of 3-40 lines"}
    row = lake.table("synthetic.rephrase").scan().to_arrow().to_pylist()[0]
    assert row["agent_chain"] == ["extract", "explain", "assemble"] and row["export_id"] == export.export_id
    fields = json.loads(row["fields"])
    assert row["text"].startswith("#") and fields["function"] in row["text"] and len(fields["explanation"]) >= 24
    [record] = [r for r in lake.lineage.records() if r.kind == "synthetic_batch" and r.name == "synthetic.rephrase"]
    assert export.export_id in record.upstream and any(u.startswith("refined.python_stdlib@") for u in record.upstream)


def test_an_engine_evolver_and_a_judge_loop_within_the_token_budget(trained_checkpoints):
    lake = trained_checkpoints.lake
    export = export_checkpoint(lake, trained_checkpoints.checkpoint_ids[-1])

    def engine_for(ref):
        return open_engine(export if ref == "latest" else find_export(lake, ref), EngineConfig())

    evolver = {"kind": "engine", "max_tokens": 16, "temperature": 0.8, "stop": ("\n",),
               "template": "{function}\n# {instructions}\n# Explanation:"}
    config = PipelineConfig(
        name="evolved", text="# {explanation}\n{function}",
        seeds={"table": "refined.site_packages", "columns": ("doc_id", "text"), "id_field": "doc_id", "limit": 6},
        stages=[
            {"name": "extract", "output": "function",
             "generator": {"kind": "function", "function": "factory.synth.shapes:first_function"}},
            {"name": "improve", "output": "explanation", "loop": {
                "agents": [{"name": "evolver", "generator": evolver, "output": "explanation",
                            "instructions": "Explain the function.", "feedback_from": "critique"},
                           {"name": "judge", "generator": {"kind": "function",
                                                           "function": "factory.synth.shapes:heuristic_judge"},
                            "output": "critique", "score": True}],
                "rounds": 3, "stop_when": {"field": "score", "op": ">=", "value": 8}, "result": "explanation"}},
        ],
        budget={"max_tokens": 40, "max_attempts": 1},
    )
    result = run_pipeline(lake, config, engine_for=engine_for, log=lambda m: None)
    assert result.accepted >= 1
    # the supervisor stops new rounds once 40 tokens are spent: at most one round of overshoot
    assert 40 < result.tokens <= 40 + 16 * 6
    rows = lake.table("synthetic.evolved").scan().to_arrow().to_pylist()
    for row in rows:
        fields = json.loads(row["fields"])
        chain = row["agent_chain"]
        assert chain[0] == "extract" and chain[1:3] == ["evolver", "judge"] and len(chain) <= 7
        assert row["export_id"] == export.export_id
        assert fields.get("stopped_by", "").startswith("token budget spent") or fields["score"] >= 8 \
            or chain.count("evolver") == 3
    assert any("stopped_by" in json.loads(r["fields"]) for r in rows)
