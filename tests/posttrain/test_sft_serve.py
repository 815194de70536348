"""SFT end to end: the porting pipeline's sandbox-checked rows become chat examples; the `sft_run` asset,
materialized through Dagster Pipes, fine-tunes the session's smoke checkpoint (killed with SIGKILL after
step 12, relaunched, resumed from step 10); the held-out loss of the task format falls; the checkpoints
land in train.checkpoints with lineage to the examples, the chat tokenizer and the start, and the last one
becomes the eval assets' partition (eval_every). `factory serve` (vLLM's OpenAI-compatible server on
loopback, stopped by PID) serves the export under its id; a completion request returns what the
transformers reference generates for the same ids, and /v1/chat/completions renders the export's chat
template into the ids the model was trained on and answers what the reference generates from them
(greedy). Podium's two inference backends (the vLLM endpoint with `stream: true`, and in-process)
stream that same answer piece by piece.

Slow tier (~1.5-2 min on 2 cores: two SFT processes, vLLM's server starting on CPU)."""

import json
import os
import sys
import urllib.request
from pathlib import Path

import pytest
from dagster import DagsterInstance, PipesSubprocessClient, materialize

from assets.posttrain import sft_run
from configs.synth import pipeline
from factory.home import CHECKOUT
from factory.infer import EngineConfig, SamplingConfig, export_checkpoint
from factory.infer.engine import TransformersEngine
from factory.posttrain.sft import SFTConfig
from factory.sandbox import Sandbox, SandboxConfig
from factory.synth import PipelineConfig, run_pipeline
from factory.tokenize import load_tokenizer
from factory.tokenize.chat import encode_chat
from factory.train.checkpoint import checkpoints
from resources import LakeResource, TrackerResource

pytestmark = pytest.mark.slow
FACTORY = Path(sys.executable).parent / "factory"
# measured (2 cores, this config from the session's 8-step smoke model): held-out loss 5.41 -> 2.74
MIN_DROP = 2.0


def _materialize(lake, config: SFTConfig, instance: DagsterInstance):
    instance.add_dynamic_partitions("sft_runs", [config.name])
    return materialize([sft_run], partition_key=config.name, instance=instance, raise_on_error=False,
                       resources={"lake": LakeResource(home=str(lake.home)), "tracker": TrackerResource(),
                                  "pipes_subprocess_client": PipesSubprocessClient(cwd=str(CHECKOUT))},
                       run_config={"ops": {"sft_run": {"config": {"config_json": config.model_dump_json()}}}})


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.loads(response.read())


def _post(url: str, body: dict) -> dict:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read())


def test_sft_lowers_the_heldout_loss_and_the_export_chats(trained_checkpoints, monkeypatch, server, free_port,
                                                          wait_up, tmp_path):
    lake = trained_checkpoints.lake
    porting = pipeline("porting")
    porting = PipelineConfig.model_validate({**porting.model_dump(), "seeds": {**porting.seeds.model_dump(),
                                                                             "limit": 240}})
    run_pipeline(lake, porting, sandbox=lambda timeout: Sandbox(SandboxConfig(workers=2, timeout_s=timeout, cpu_s=5)),
                 log=lambda m: None)

    start = trained_checkpoints.checkpoint_ids[-1]
    # the session tokenizer has 512 tokens: a porting example is ~300-450 of them, so rows of 512 (the model's
    # max_seq_len grows with them)
    config = SFTConfig(name="sft-chat", start=start, steps=30, seq_len=512, global_batch=8, optimizer={"lr": 3e-3, "weight_decay": 0.0},
                       checkpoint={"every": 10}, eval_every=30)
    monkeypatch.setenv("FACTORY_FAULTS", '{"kill_at_step": 12}')
    assert not _materialize(lake, config, DagsterInstance.ephemeral()).success
    assert [c["step"] for c in checkpoints(lake, "sft-chat")] == [10]
    monkeypatch.delenv("FACTORY_FAULTS")
    instance = DagsterInstance.ephemeral()
    result = _materialize(lake, config, instance)
    assert result.success
    assert instance.get_dynamic_partitions("checkpoints") == ["sft-chat@30"]  # eval_every=30: the eval assets' partition
    [event] = result.get_asset_materialization_events()
    meta = {k: v.value for k, v in event.materialization.metadata.items()}
    print({k: meta[k] for k in ("heldout_loss_before", "heldout_loss_after", "train_examples", "dropped_examples")})
    assert meta["resumed_from"] == 10 and meta["steps"] == 30
    assert meta["heldout_loss_after"] < meta["heldout_loss_before"] - MIN_DROP
    assert meta["heldout_examples"] > 10 and meta["train_examples"] > 150 and meta["dropped_examples"] == 0

    rows = checkpoints(lake, "sft-chat")
    assert [r["step"] for r in rows] == [10, 20, 30] and rows[0]["mix_version"] == meta["examples"]
    [first] = lake.lineage.records(version_id="ckpt/sft-chat@10")
    assert first.upstream == [meta["examples"], meta["tokenizer"], start]
    [examples] = lake.lineage.records(version_id=meta["examples"])
    assert examples.upstream[0].startswith("synthetic.porting@")

    export = export_checkpoint(lake, "ckpt/sft-chat@30")
    assert "chat_template" in json.loads((export.path / "tokenizer_config.json").read_text())
    env = {**os.environ, "FACTORY_HOME": str(lake.home), "OMP_NUM_THREADS": "1"}
    proc = server("serve", [str(FACTORY), "serve", export.export_id, "--home", str(lake.home), "--port",
                            str(free_port)], env, whole_group=True)
    base = f"http://127.0.0.1:{free_port}/v1"
    models = wait_up(lambda: _get(f"{base}/models"), proc, tmp_path / "serve.log", 240, "factory serve",
                     errors=OSError)
    assert [m["id"] for m in models["data"]] == [export.export_id]
    assert "serving export/sft-chat@30" in (tmp_path / "serve.log").read_text()
    reference = TransformersEngine(export, EngineConfig(kind="transformers"))

    # plain completions: what the reference generates from the same ids
    ids = reference.encode("def parse(text):\n    ")
    want = reference.generate([ids], SamplingConfig(max_tokens=12))[0][0]
    got = _post(f"{base}/completions", {"model": export.export_id, "prompt": ids, "max_tokens": 12, "temperature": 0})
    assert got["choices"][0]["text"] == reference.decode(want.token_ids)
    assert got["usage"]["prompt_tokens"] == len(ids)

    question = json.loads(lake.table("sft.examples").scan().to_arrow().to_pylist()[0]["messages"])[:1]
    got = _post(f"{base}/chat/completions", {"model": export.export_id, "messages": question, "max_tokens": 24,
                                              "temperature": 0})
    ids = encode_chat(load_tokenizer(str(export.path)), question, add_generation_prompt=True).ids
    want = reference.generate([ids], SamplingConfig(max_tokens=24))[0][0]
    answer = got["choices"][0]["message"]
    assert got["usage"]["prompt_tokens"] == len(ids)
    assert answer["role"] == "assistant" and answer["content"] == reference.decode(want.token_ids)
    assert answer["content"].startswith("import re")  # the programs' first line: it learned the answer format

    # Podium's backends, the vLLM endpoint and in-process, stream that same answer in the chat format
    from factory.podium.inference import Generation, LocalBackend, OpenAIBackend, Sampling

    for backend in (OpenAIBackend(EngineConfig(kind="openai", endpoint=base)), LocalBackend()):
        gen = Generation("", 0)
        pieces = list(backend.stream(export, question, Sampling(temperature=0.0, max_tokens=24), gen))
        assert gen.mode == "chat" and gen.prompt_tokens == len(ids), backend.name
        assert len(pieces) > 1 and "".join(pieces) == gen.text == answer["content"], backend.name
        assert gen.first_token_s is not None and gen.tokens == len(want.token_ids), backend.name
