"""What a generator rejects and what fails the run (factory/synth/generators.py), through
`run_pipeline` on a real lake in `tmp_path`: a function stage is called once per candidate and
never slept on; a ValueError from it rejects the candidate, any other exception (a bug) fails the
run naming the stage; an engine whose `generate` raises and an endpoint that refuses connections
fail the run, and nothing is committed; an endpoint's 400 rejects one row without a retry, a
garbled answer is retried, a candidate missing a template field is rejected without a request.

The endpoint is a stand-in (http.server on loopback); the dead engine is a stand-in raising from
`generate` as vLLM does once its engine core has died (the real engine runs in
test_llm_pipeline.py). CPU, ~3 s (one 0.5 s retry pause per endpoint test)."""

import importlib
import json
import socket
import sys
import textwrap
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest
from pydantic import ValidationError

from factory.lake import Lake
from factory.synth import PipelineConfig, run_pipeline
from factory.synth.config import GeneratorConfig
from factory.synth.generators import Generator, GeneratorError

FUNCTIONS = '''
CALLS = {}

def seeds():
    return [{"id": f"s{i}", "n": i, "word": f"w{i}"} for i in range(6)]

def odd_rejected(fields):
    CALLS[fields["n"]] = CALLS.get(fields["n"], 0) + 1
    if fields["n"] % 2:
        raise ValueError("odd seed")
    return f"value = {fields['n']}"

def buggy(fields):
    if fields["n"] == 2:
        return fields["missing"]
    return "ok"

def forgets_return(fields):
    str(fields)
'''


@pytest.fixture
def functions(tmp_path, monkeypatch):
    (tmp_path / "synth_gen_fixture.py").write_text(textwrap.dedent(FUNCTIONS))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "synth_gen_fixture", raising=False)  # a fresh CALLS for each test
    return importlib.import_module("synth_gen_fixture")


def pipeline(generator: dict, name: str = "gen", attempts: int = 3) -> PipelineConfig:
    return PipelineConfig(name=name, seeds={"function": "synth_gen_fixture:seeds"}, text="{out}",
                          stages=[{"name": "make", "output": "out", "generator": generator}],
                          budget={"max_attempts": attempts})


def nothing_committed(lake: Lake) -> bool:
    return not [t for t in lake.tables() if t.startswith("synthetic.")]


def test_a_function_stage_is_called_once_per_candidate_and_never_retried(tmp_path, functions, monkeypatch):
    config = GeneratorConfig(kind="function", function="synth_gen_fixture:odd_rejected")
    pauses = []
    with monkeypatch.context() as m:
        m.setattr(time, "sleep", pauses.append)
        out = Generator(config, max_attempts=3, seed=0).generate(functions.seeds())
    assert functions.CALLS == {n: 1 for n in range(6)}  # before: 3 calls for each rejected seed
    assert pauses == []  # before: 0.5 s + 1.0 s of pauses for each of the 3 rejected seeds
    assert [g.error for g in out] == [None, "ValueError: odd seed"] * 3 and [g.attempts for g in out] == [1] * 6

    lake = Lake.open(home=tmp_path / "home")
    result = run_pipeline(lake, pipeline({"kind": "function", "function": "synth_gen_fixture:odd_rejected"}),
                          log=lambda m: None)
    assert result.accepted == 3 and result.rejected == {"make": 3}
    rejected = lake.table("synthetic.gen_rejected").scan().to_arrow().to_pylist()
    assert {(r["reason"], r["attempts"]) for r in rejected} == {("generation failed: ValueError: odd seed", 1)}


@pytest.mark.parametrize("function, message", [
    ("buggy", "stage make: function synth_gen_fixture:buggy raised KeyError: 'missing' "
              "(a function rejects a candidate by raising ValueError)"),
    ("forgets_return", "stage make: function synth_gen_fixture:forgets_return returned NoneType, not str "
                       "(raise ValueError to reject a candidate)"),
])
def test_a_bug_in_a_function_stage_fails_the_run_naming_the_stage(tmp_path, functions, function, message):
    lake = Lake.open(home=tmp_path / "home")
    with pytest.raises(GeneratorError) as e:
        run_pipeline(lake, pipeline({"kind": "function", "function": f"synth_gen_fixture:{function}"}),
                     log=lambda m: None)
    assert str(e.value) == message
    assert nothing_committed(lake)  # before: the bug was a rejected row and the run succeeded


class DeadEngine:
    """The parts of `factory.infer.Engine` a generator uses; `generate` raises as vLLM's does
    after its engine core process died."""

    class export:
        export_id = "export/smoke@120"

    def __init__(self):
        self.calls = 0

    def document_ids(self, text: str) -> list[int]:
        return [0, *map(ord, text)]

    def fit(self, ids: list[int], room: int) -> list[int]:
        return ids[-(256 - room):]

    def generate(self, prompts, sampling):
        self.calls += 1
        raise RuntimeError("EngineCore encountered an issue. See stack trace (above) for the root cause.")


def test_an_engine_that_dies_fails_the_run_with_its_error(tmp_path, functions):
    lake, engine = Lake.open(home=tmp_path / "home"), DeadEngine()
    with pytest.raises(GeneratorError) as e:
        run_pipeline(lake, pipeline({"kind": "engine", "template": "explain {word}", "max_tokens": 16}),
                     engine_for=lambda ref: engine, log=lambda m: None)
    assert str(e.value) == ("stage make: engine on export/smoke@120 failed: RuntimeError: EngineCore encountered an "
                            "issue. See stack trace (above) for the root cause.")
    assert engine.calls == 1  # a crashed engine is not retried in-process
    assert nothing_committed(lake)  # before: 6 rejected rows, 0 accepted, and the asset succeeded


@pytest.mark.loopback
def test_an_endpoint_that_refuses_connections_fails_the_run_after_its_retries(tmp_path, functions):
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    lake = Lake.open(home=tmp_path / "home")
    endpoint = {"base_url": f"http://127.0.0.1:{port}/v1", "model": "m", "timeout_s": 5}
    with pytest.raises(GeneratorError) as e:
        run_pipeline(lake, pipeline({"kind": "endpoint", "template": "say {word}", "endpoint": endpoint}, attempts=2),
                     log=lambda m: None)
    assert str(e.value).startswith(f"stage make: endpoint http://127.0.0.1:{port}/v1/completions failed 2 times; "
                                   "last: URLError: <urlopen error [Errno 111] Connection refused>")
    assert nothing_committed(lake)


@pytest.fixture
def server():
    """Completions that upper-case the prompt, except: `say w1` -> 400 (a prompt the server
    refuses), `say w3` -> a body that is not JSON the first time, `say w5` -> 401."""
    seen = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - http.server's naming
            prompt = json.loads(self.rfile.read(int(self.headers["Content-Length"])))["prompt"]
            seen.append(prompt)
            status, payload = 200, json.dumps({"choices": [{"text": prompt.upper()}],
                                               "usage": {"completion_tokens": 2}}).encode()
            if prompt == "say w1":
                status, payload = 400, b'{"error": "prompt too long"}'
            elif prompt == "say w3" and seen.count(prompt) == 1:
                payload = b"<html>502 bad gateway</html>"
            elif prompt == "say w5":
                status, payload = 401, b'{"error": "bad key"}'
            self.send_response(status)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args):
            pass

    httpd = HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_port}/v1", seen
    httpd.shutdown()


@pytest.mark.loopback
def test_endpoint_rejections_retries_and_missing_fields(server, functions):
    base_url, seen = server
    config = GeneratorConfig(kind="endpoint", template="say {word}", endpoint={"base_url": base_url, "model": "m"})
    batch = functions.seeds()[:5]
    batch[2] = {"id": "s2", "n": 2}  # no `word`: rejected before any request
    out = Generator(config, max_attempts=3, seed=0).generate(batch)
    assert [g.text for g in out] == ["SAY W0", None, None, "SAY W3", "SAY W4"]
    assert [g.attempts for g in out] == [1, 1, 0, 2, 1]  # the 400 is not retried; the garbled answer is
    assert out[1].error == f'HTTP 400 from {base_url}/completions: {{"error": "prompt too long"}}'
    assert out[2].error == "ValueError: template needs field 'word'; the candidate has ['id', 'n']"
    assert seen == ["say w0", "say w1", "say w3", "say w3", "say w4"]

    with pytest.raises(GeneratorError) as e:  # a refused key fails the run at once, without retries
        Generator(config, max_attempts=3, seed=0, name="stage ask").generate([{"word": "w5"}])
    assert str(e.value) == f'stage ask: endpoint {base_url}/completions answered HTTP 401: {{"error": "bad key"}}'
    assert seen.count("say w5") == 1


@pytest.mark.parametrize("template, message", [
    ("say {}", "name the candidate's fields ({text}), not positions ({} / {0})"),
    ("say {0}", "name the candidate's fields ({text}), not positions ({} / {0})"),
    ("say {word", "expected '}' before end of string"),
])
def test_templates_every_candidate_could_fill_are_checked_when_the_config_is_built(template, message):
    with pytest.raises(ValidationError) as e:
        GeneratorConfig(kind="engine", template=template)
    assert message in str(e.value)
