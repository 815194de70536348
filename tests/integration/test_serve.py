"""`factory serve`: vLLM's OpenAI-compatible server on loopback for a trained export; a completion
request over HTTP returns what the transformers reference generates for the same ids (greedy).

Marked `slow` (~60-90 s: the server imports vLLM and starts an engine on CPU)."""

import json
import os
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from factory.infer import EngineConfig, SamplingConfig, export_checkpoint
from factory.infer.engine import TransformersEngine

pytestmark = pytest.mark.slow
FACTORY = Path(sys.executable).parent / "factory"


def _post(url: str, body: dict) -> dict:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read())


def test_served_export_answers_like_the_reference(trained_checkpoints, tmp_path, server, free_port):
    lake = trained_checkpoints.lake
    export = export_checkpoint(lake, trained_checkpoints.checkpoint_ids[-1])
    port = free_port
    env = {**os.environ, "FACTORY_HOME": str(lake.home), "OMP_NUM_THREADS": "1"}
    proc = server("serve", [str(FACTORY), "serve", export.export_id, "--home", str(lake.home), "--port", str(port)],
                  env, whole_group=True)
    base = f"http://127.0.0.1:{port}/v1"
    deadline = time.monotonic() + 240
    while True:
        try:
            with urllib.request.urlopen(f"{base}/models", timeout=5) as r:
                models = json.loads(r.read())
            break
        except OSError:
            assert proc.poll() is None, (tmp_path / "serve.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "server did not come up"
            time.sleep(2)
    assert [m["id"] for m in models["data"]] == [export.export_id]
    assert "serving export/evalsmoke@8" in (tmp_path / "serve.log").read_text()

    reference = TransformersEngine(export, EngineConfig(kind="transformers"))
    ids = reference.encode("def parse(text):\n    ")
    want = reference.generate([ids], SamplingConfig(max_tokens=12))[0][0]
    got = _post(f"{base}/completions", {"model": export.export_id, "prompt": ids, "max_tokens": 12, "temperature": 0})
    assert got["choices"][0]["text"] == reference.decode(want.token_ids)
    assert got["usage"]["prompt_tokens"] == len(ids)
