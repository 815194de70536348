"""Checkpoint export and the equivalence check, on a real trained smoke checkpoint (the session's
`trained_checkpoints`): HF Llama files at a content-addressed path with lineage, ours /
transformers / vLLM agreeing in fp32, and a corrupted export caught. CPU; vLLM in-process.

The tests that go through the lake — the export's lineage row and `find_export`, unknown
checkpoints and exports named — run on both catalogs (`trained_on_catalog`: `[sql]`, and `[rest]`
on the session's SeaweedFS, its run trained once on S3 tables); the engine comparisons read only
files under FACTORY_HOME and stay on sqlite.

Transformers 4.x: `make setup` installs 4.57 (with its tokenizers and huggingface-hub) under
`.venv/compat/transformers4`; a subprocess with that directory first on PYTHONPATH loads an export
as a 4.x user would (AutoTokenizer + AutoModelForCausalLM) and must match 5.x's tokens and logits."""

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

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


@pytest.mark.slow
def test_ours_transformers_and_vllm_agree_on_a_trained_checkpoint(trained_checkpoints):
    lake = trained_checkpoints.lake
    export = export_checkpoint(lake, trained_checkpoints.checkpoint_ids[-1])
    report = verify_export(lake, export, EngineConfig(kind="vllm"))
    assert report.passed, report.problems
    assert report.engine == "vllm" and report.prompts == 8 and report.positions > 100
    assert report.max_logit_diff_transformers < 1e-4 and report.max_logprob_diff_engine < 1e-4
    assert report.top1_mismatches == 0 and report.greedy_mismatches == []


@pytest.mark.slow
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


TRANSFORMERS4 = Path(sys.prefix) / "compat" / "transformers4"
PROBE = "def add(a, b):\n    return a + b  # héllo <|fim_middle|>"
_LOAD = """
import json, sys, torch, transformers
from transformers import AutoModelForCausalLM, AutoTokenizer
tokenizer = AutoTokenizer.from_pretrained(sys.argv[1])
model = AutoModelForCausalLM.from_pretrained(sys.argv[1]).eval()
ids = tokenizer(sys.argv[2])["input_ids"]
with torch.no_grad():
    logits = model(torch.tensor([ids])).logits[0]
print(json.dumps({"version": transformers.__version__, "class": type(tokenizer).__name__, "ids": ids,
                  "decoded": tokenizer.decode(ids), "pad": tokenizer.pad_token_id, "eos": tokenizer.eos_token_id,
                  "special": tokenizer.all_special_tokens, "logits": logits.tolist()}))
"""


def _load_with(export_path: Path, pythonpath: str | None) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    done = subprocess.run([sys.executable, "-c", _LOAD, str(export_path), PROBE], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


@pytest.mark.slow
def test_an_export_loads_in_transformers_4_and_5_with_its_tokenizer(trained_checkpoints):
    assert (TRANSFORMERS4 / "transformers").is_dir(), f"{TRANSFORMERS4} missing: run `make setup`"
    export = export_checkpoint(trained_checkpoints.lake, trained_checkpoints.checkpoint_ids[-1])
    v5, v4 = _load_with(export.path, None), _load_with(export.path, str(TRANSFORMERS4))
    assert v5["version"].startswith("5.") and v4["version"].startswith("4.")
    assert v4["class"] == "PreTrainedTokenizerFast"
    # the same tokens, specials and decoding: the FIM token is one id, the text round-trips
    assert v4["ids"] == v5["ids"] and v4["decoded"] == v5["decoded"] == PROBE
    assert (v4["pad"], v4["eos"]) == (v5["pad"], v5["eos"]) == (2, 1)
    assert sorted(v4["special"]) == sorted(v5["special"]) and "<|fim_middle|>" in v4["special"]
    diff = max(abs(a - b) for r4, r5 in zip(v4["logits"], v5["logits"]) for a, b in zip(r4, r5))
    assert len(v4["logits"]) == len(v4["ids"]) and diff < 1e-4


def test_an_export_is_readable_by_other_accounts_whatever_the_umask(trained_checkpoints):
    previous = os.umask(0o077)  # a private umask: mkdtemp is 0700 and safetensors 0600 regardless
    try:
        export = export_checkpoint(trained_checkpoints.lake, trained_checkpoints.checkpoint_ids[0])
    finally:
        os.umask(previous)
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in export.path.iterdir()}
    assert stat.S_IMODE(export.path.stat().st_mode) == 0o755
    assert modes == {name: 0o644 for name in [*FILES, "factory.json"]}
