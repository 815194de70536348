"""`factory serve`: vLLM's OpenAI-compatible server on loopback for a trained export; a completion
request over HTTP returns what the transformers reference generates for the same ids (greedy).

Marked `slow` (~60-90 s: the server imports vLLM and starts an engine on CPU)."""

import json
import os
import sys
import urllib.request
from pathlib import Path

import pytest

from factory.infer import EngineConfig, SamplingConfig, export_checkpoint
from factory.infer.engine import TransformersEngine

pytestmark = pytest.mark.slow
FACTORY = Path(sys.executable).parent / "factory"


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.loads(response.read())


def _post(url: str, body: dict) -> dict:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read())


def test_served_export_answers_like_the_reference(trained_checkpoints, tmp_path, server, free_port, wait_up):
    lake = trained_checkpoints.lake
    export = export_checkpoint(lake, trained_checkpoints.checkpoint_ids[-1])
    port = free_port
    env = {**os.environ, "FACTORY_HOME": str(lake.home), "OMP_NUM_THREADS": "1"}
    proc = server("serve", [str(FACTORY), "serve", export.export_id, "--home", str(lake.home), "--port", str(port)],
                  env, whole_group=True)
    base = f"http://127.0.0.1:{port}/v1"
    models = wait_up(lambda: _get(f"{base}/models"), proc, tmp_path / "serve.log", 240, "factory serve", errors=OSError)
    assert [m["id"] for m in models["data"]] == [export.export_id]
    assert "serving export/evalsmoke@8" in (tmp_path / "serve.log").read_text()

    reference = TransformersEngine(export, EngineConfig(kind="transformers"))
    ids = reference.encode("def parse(text):\n    ")
    want = reference.generate([ids], SamplingConfig(max_tokens=12))[0][0]
    got = _post(f"{base}/completions", {"model": export.export_id, "prompt": ids, "max_tokens": 12, "temperature": 0})
    assert got["choices"][0]["text"] == reference.decode(want.token_ids)
    assert got["usage"]["prompt_tokens"] == len(ids)
