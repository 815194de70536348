"""Checkpoint export and the equivalence check, on a real trained smoke checkpoint (the session's
`trained_checkpoints`): HF Llama files at a content-addressed path with lineage, ours /
transformers / vLLM agreeing in fp32, and a corrupted export caught. CPU; vLLM in-process.

The tests that go through the lake — the export's lineage row and `find_export`, unknown
checkpoints and exports named — run on both catalogs (`trained_on_catalog`: `[sql]`, and `[rest]`
on the session's SeaweedFS, its run trained once on S3 tables); the engine comparisons read only
files under FACTORY_HOME and stay on sqlite."""

import json

import pytest
from safetensors.torch import load_file

from factory.deploy import open_lake
from factory.infer import EngineConfig, ExportError, export_checkpoint, find_export
from factory.infer.equivalence import verify_export
from factory.infer.export import FILES


def test_export_writes_hf_llama_files_content_addressed_with_lineage(trained_on_catalog):
    lake, checkpoint = trained_on_catalog.lake, trained_on_catalog.checkpoint_ids[-1]
    export = export_checkpoint(lake, checkpoint)
    assert sorted(p.name for p in export.path.iterdir()) == sorted([*FILES, "factory.json"])
    assert export.path.name == f"evalsmoke@8-{export.sha256[:12]}"
    config = json.loads((export.path / "config.json").read_text())
    assert config["model_type"] == "llama" and config["architectures"] == ["LlamaForCausalLM"]
    assert (config["bos_token_id"], config["eos_token_id"], config["pad_token_id"]) == (0, 1, 2)
    weights = load_file(str(export.path / "model.safetensors"))
    assert "model.embed_tokens.weight" in weights and all(w.dtype.is_floating_point for w in weights.values())

    records = [r for r in lake.lineage.records() if r.version_id == export.export_id]
    assert len(records) == 1 and records[0].kind == "export"
    assert records[0].upstream == [checkpoint, export.tokenizer] and records[0].content_hash == export.sha256

    again = export_checkpoint(lake, checkpoint.removeprefix("ckpt/"))  # same bytes: same directory, no new row
    assert again.path == export.path and again.sha256 == export.sha256
    assert len([r for r in lake.lineage.records() if r.version_id == export.export_id]) == 1
    assert find_export(lake, export.export_id).path == export.path
    assert find_export(lake, str(export.path)).export_id == export.export_id
    reader = open_lake(trained_on_catalog.profile, lake.home)  # a new client of the same catalog
    assert find_export(reader, export.export_id).sha256 == export.sha256


def test_ours_transformers_and_vllm_agree_on_a_trained_checkpoint(trained_checkpoints):
    lake = trained_checkpoints.lake
    export = export_checkpoint(lake, trained_checkpoints.checkpoint_ids[-1])
    report = verify_export(lake, export, EngineConfig(kind="vllm"))
    assert report.passed, report.problems
    assert report.engine == "vllm" and report.prompts == 8 and report.positions > 100
    assert report.max_logit_diff_transformers < 1e-4 and report.max_logprob_diff_engine < 1e-4
    assert report.top1_mismatches == 0 and report.greedy_mismatches == []


def test_a_corrupted_export_fails_the_check_naming_the_difference(trained_checkpoints, monkeypatch):
    lake = trained_checkpoints.lake
    monkeypatch.setenv("FACTORY_FAULTS", json.dumps({"corrupt_export": True}))
    export = export_checkpoint(lake, trained_checkpoints.checkpoint_ids[0])
    monkeypatch.delenv("FACTORY_FAULTS")
    report = verify_export(lake, export, EngineConfig(kind="transformers"))
    assert not report.passed
    assert report.max_logit_diff_transformers > 1e-3
    assert any("transformers logits differ from ours" in p for p in report.problems)
    clean = export_checkpoint(lake, trained_checkpoints.checkpoint_ids[0])  # re-export heals the lineage
    assert clean.sha256 != export.sha256 and find_export(lake, clean.export_id).sha256 == clean.sha256


def test_unknown_checkpoints_and_exports_are_named(trained_on_catalog, tmp_path):
    lake = trained_on_catalog.lake
    with pytest.raises(ExportError, match=r"ckpt/evalsmoke@7: not in train.checkpoints"):
        export_checkpoint(lake, "evalsmoke@7")
    with pytest.raises(ExportError, match=r"export/nothing@1: not found in lineage"):
        find_export(lake, "export/nothing@1")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ExportError, match="not a factory export"):
        find_export(lake, str(tmp_path / "empty"))
