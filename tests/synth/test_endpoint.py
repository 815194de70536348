"""The `endpoint` generator against an OpenAI-compatible completions server on loopback: request
shape (model, prompt, sampling, seed per prompt), the API key from the environment variable named
in config, retries on server errors recorded as attempts, and a missing key failing the run with
its name. The server is a stand-in (http.server in a thread) — this is a narrow test of the HTTP
client (tests/synth/test_generators.py covers what rejects a row and what fails the run); the
real server (`factory serve`) is covered in tests/posttrain/test_sft_serve.py. CPU."""

import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from factory.synth.config import GeneratorConfig
from factory.synth.generators import Generator, GeneratorError


@pytest.fixture
def server():
    seen, failures = [], {"left": 1}

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - http.server's naming
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen.append({"path": self.path, "auth": self.headers.get("Authorization"), "body": body})
            if failures["left"]:
                failures["left"] -= 1
                self.send_response(500)
                self.end_headers()
                return
            answer = {"choices": [{"text": body["prompt"].upper()}], "usage": {"completion_tokens": 7}}
            payload = json.dumps(answer).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args):
            pass

    httpd = HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_port}/v1", seen
    httpd.shutdown()


def config(base_url: str, key_env: str | None = "SYNTH_TEST_KEY") -> GeneratorConfig:
    return GeneratorConfig(kind="endpoint", template="say {word}", max_tokens=12, temperature=0.5,
                           endpoint={"base_url": base_url, "model": "export/smoke@120", "api_key_env": key_env})


@pytest.mark.loopback
def test_requests_carry_the_model_sampling_and_key_and_errors_are_retried(server, monkeypatch):
    base_url, seen = server
    monkeypatch.setenv("SYNTH_TEST_KEY", "sekrit")
    out = Generator(config(base_url), max_attempts=3, seed=5).generate([{"word": "hi"}, {"word": "yo"}])
    assert [g.text for g in out] == ["SAY HI", "SAY YO"] and [g.tokens for g in out] == [7, 7]
    assert [g.attempts for g in out] == [2, 1]  # the first request got a 500 and was retried
    assert all(s["path"] == "/v1/completions" and s["auth"] == "Bearer sekrit" for s in seen)
    bodies = [s["body"] for s in seen]
    assert bodies[-1] == {"model": "export/smoke@120", "prompt": "say yo", "max_tokens": 12, "temperature": 0.5,
                          "top_p": 0.95, "seed": 6, "stop": None}


@pytest.mark.loopback
def test_a_missing_key_fails_naming_the_variable(server, monkeypatch):
    base_url, seen = server
    monkeypatch.delenv("SYNTH_TEST_KEY", raising=False)
    with pytest.raises(GeneratorError) as e:  # every row would fail: the run does, before any request
        Generator(config(base_url), max_attempts=2, seed=0, name="stage ask").generate([{"word": "hi"}])
    assert str(e.value) == "stage ask: environment variable SYNTH_TEST_KEY (the endpoint's API key) is not set"
    assert seen == []
