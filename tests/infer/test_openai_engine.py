"""`OpenAIEngine`: the engine over a vLLM OpenAI-compatible server (`inference.kind: openai`).

Against a real vLLM server on loopback (`server_command`, what `factory serve` runs; started once
for the module, ~45-65 s to answer on CPU, stopped by PID) over the session's trained export:
greedy generations, seeded samples and log-probs equal the in-process vLLM engine's (fp32, 1e-4);
an export the server does not serve is refused, naming the endpoint, the export and what it
serves; the export's equivalence check passes over the server; and the eval suite's bits per byte and next-line completion through the profile
(`InferenceResource` on a profile with kind openai) score what the in-process engine scores.
Those are marked `slow`. Unmarked, on CPU with no vLLM: config validation; an endpoint nobody
listens on (and `factory eval --engine openai --endpoint` on it: one line); a stand-in `/v1/models` (a stdlib HTTP server thread on loopback) that names the
export but serves another directory or context; the API key sent as a bearer token."""

import json
import threading
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from pydantic import ValidationError

from factory.cli import main
from factory.deploy import load_profile, profile_env
from factory.deploy.config import InferenceProfile, Secret
from factory.deploy.servers import Server, free_port
from factory.evals import SuiteConfig, evaluate
from factory.infer import EngineConfig, SamplingConfig, export_checkpoint, open_engine
from factory.infer.openai_engine import EndpointError, OpenAIEngine

SUITE = SuiteConfig(name="served", tasks=[{"task": "bpb", "max_docs": 2, "max_bytes_per_doc": 512},
                                          {"task": "line_completion", "max_examples": 8}])


@pytest.fixture(scope="module")
def exports(trained_checkpoints):
    """Both checkpoints' exports (oldest first); the server serves the newest."""
    return [export_checkpoint(trained_checkpoints.lake, c) for c in trained_checkpoints.checkpoint_ids]


@pytest.fixture(scope="module")
def served(exports, trained_checkpoints, tmp_path_factory):
    """The server's base URL, serving the newest export as `factory serve` does."""
    from factory.infer.vllm_engine import server_command, server_environment

    port, export = free_port(), exports[-1]
    env = server_environment(EngineConfig()) | {"FACTORY_HOME": str(trained_checkpoints.lake.home),
                                                "OMP_NUM_THREADS": "1", "VLLM_LOGGING_LEVEL": "INFO"}
    server = Server("vllm", server_command(export, port=port), tmp_path_factory.mktemp("vllm") / "vllm.log", env=env)
    base = f"http://127.0.0.1:{port}/v1"
    server.start()
    try:
        server.wait_ready(lambda: urllib.request.urlopen(f"{base}/models", timeout=2).status == 200, 300, base)
        yield base
    finally:
        server.stop()


def _stand_in(models: dict, seen: list):
    """A `/v1/models` on loopback answering `models`; records each request's Authorization header."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            seen.append(self.headers.get("Authorization"))
            body = json.dumps(models).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd, f"http://127.0.0.1:{httpd.server_address[1]}/v1"


def test_openai_needs_an_http_endpoint_and_the_others_take_none():
    with pytest.raises(ValidationError, match="kind 'openai' needs `endpoint`"):
        EngineConfig(kind="openai")
    with pytest.raises(ValidationError, match="'ftp://vllm:8000/v1' must be an http:// or https:// URL"):
        InferenceProfile(kind="openai", endpoint="ftp://vllm:8000/v1")
    with pytest.raises(ValidationError, match="must be an http:// or https:// URL with a host"):
        EngineConfig(kind="openai", endpoint="http:///v1")
    with pytest.raises(ValidationError, match="settings of kind 'openai'.*kind is 'vllm'"):
        EngineConfig(kind="vllm", endpoint="http://127.0.0.1:8000/v1")
    assert load_profile("kubernetes").inference.kind == "vllm"  # each eval pod checks its own checkpoint
    profile = load_profile("kubernetes_served")  # evals and synthetic data through the vLLM Service
    assert profile.inference.kind == "openai"
    assert profile.inference.endpoint == f"http://vllm.{profile.kubernetes.namespace}.svc:" \
                                         f"{profile.kubernetes.serving.port}/v1"


@pytest.mark.loopback
def test_an_endpoint_nobody_listens_on_fails_naming_it(exports, trained_checkpoints, capsys):
    base = f"http://127.0.0.1:{free_port()}/v1"
    with pytest.raises(EndpointError, match=rf"inference endpoint {base}/models does not answer \(3 tries; "
                                            r"last: URLError.*Connection refused"):
        open_engine(exports[-1], EngineConfig(kind="openai", endpoint=base))
    home, checkpoint = str(trained_checkpoints.lake.home), trained_checkpoints.checkpoint_ids[-1]
    assert main(["eval", checkpoint, "--home", home, "--engine", "openai", "--endpoint", base]) == 1
    assert f"factory eval: error: inference endpoint {base}/models does not answer" in capsys.readouterr().err
    assert main(["eval", checkpoint, "--home", home, "--engine", "openai"]) == 1
    assert "error: --engine openai: kind 'openai' needs `endpoint`" in capsys.readouterr().err


@pytest.mark.loopback
def test_a_name_without_the_exports_directory_or_context_is_refused(exports, monkeypatch):
    export, seen = exports[-1], []
    models = {"object": "list", "data": [{"id": export.export_id, "root": "/models/current", "max_model_len": 64}]}
    httpd, base = _stand_in(models, seen)
    monkeypatch.setenv("TEST_VLLM_KEY", "s3cret")
    config = EngineConfig(kind="openai", endpoint=base, api_key=Secret(env="TEST_VLLM_KEY"))
    try:
        with pytest.raises(EndpointError, match=rf"serves '{export.export_id}' from /models/current, not from the "
                                                rf"export's content-addressed directory {export.path.name}"):
            OpenAIEngine(export, config)
        models["data"][0]["root"] = f"/exports/{export.path.name}"
        with pytest.raises(EndpointError, match=r"with a context of 64 tokens; the export's is \d+"):
            OpenAIEngine(export, config)
        models["data"][0]["max_model_len"] = None  # a server that does not say: the name and directory decide
        assert OpenAIEngine(export, config).card["root"].endswith(export.path.name)
    finally:
        httpd.shutdown()
    assert seen == ["Bearer s3cret"] * 3


@pytest.mark.slow
def test_generations_and_scores_equal_the_in_process_engine(served, exports):
    export = exports[-1]
    remote, local = OpenAIEngine(export, EngineConfig(kind="openai", endpoint=served)), \
        open_engine(export, EngineConfig(kind="vllm"))
    assert remote.card["root"] == str(export.path)
    seqs = [local.encode("import json\n\ndef load(path):\n    with open(path) as f:\n        return json.load(f)\n"),
            local.encode("The quick brown fox")]
    got, want = remote.logprobs(seqs), local.logprobs(seqs)
    assert [len(g) for g in got] == [len(s) - 1 for s in seqs]
    assert max(abs(a - b) for g, w in zip(got, want) for a, b in zip(g, w)) < 1e-4
    top_got, top_want = remote.top_logprobs(seqs, 5), local.top_logprobs(seqs, 5)
    assert [[sorted(r) for r in s] for s in top_got] == [[sorted(r) for r in s] for s in top_want]
    assert max(abs(r[t] - w[t]) for g, ws in zip(top_got, top_want) for r, w in zip(g, ws) for t in r) < 1e-4

    prompts = [local.encode("def add(a, b):\n"), local.encode("class Config:\n")]
    for sampling in (SamplingConfig(max_tokens=16), SamplingConfig(max_tokens=16, temperature=1.0, n=3, seed=7),
                     SamplingConfig(max_tokens=24, stop=("\n",))):
        mine, theirs = remote.generate(prompts, sampling), local.generate(prompts, sampling)
        assert [[(s.token_ids, s.text, s.finish_reason) for s in p] for p in mine] == \
               [[(s.token_ids, s.text, s.finish_reason) for s in p] for p in theirs]
        assert all(len(p) == sampling.n for p in mine)
    remote.close()


@pytest.mark.slow
def test_an_export_the_server_does_not_serve_is_refused(served, exports):
    older, newer = exports
    with pytest.raises(EndpointError, match=rf"inference endpoint {served} does not serve {older.export_id} "
                                            rf"\(directory {older.path.name}, sha256 {older.sha256[:12]}\): it serves "
                                            rf"'{newer.export_id}' from {newer.path}"):
        open_engine(older, EngineConfig(kind="openai", endpoint=served))


@pytest.mark.slow
def test_the_equivalence_check_runs_over_the_server(served, exports, trained_checkpoints):
    """The check that blocks an eval compares the served weights with the checkpoint's own model."""
    from factory.infer.equivalence import verify_export

    report = verify_export(trained_checkpoints.lake, exports[-1], EngineConfig(kind="openai", endpoint=served))
    assert report.passed, report.problems
    assert report.engine == "openai" and report.positions > 0 and report.max_logprob_diff_engine < 1e-4


@pytest.mark.slow
def test_an_eval_through_the_profile_scores_what_the_in_process_engine_scores(served, exports, trained_checkpoints,
                                                                            monkeypatch):
    from resources.inference import InferenceResource

    lake, export = trained_checkpoints.lake, exports[-1]
    local = evaluate(lake, export, open_engine(export, EngineConfig(kind="vllm")), SUITE, tokens=1, log=lambda _: None)
    profile = load_profile("embedded").derive(inference=InferenceProfile(kind="openai", endpoint=served))
    for name, value in profile_env(profile).items():
        monkeypatch.setenv(name, value)
    engine = InferenceResource().engine(export)
    assert engine.name == "openai" and engine.base == served
    remote = evaluate(lake, export, engine, SUITE, tokens=1, log=lambda _: None)
    scores = {(r["task"], r["metric"]): (r["value"], r["n"]) for r in local.rows}
    assert {(r["task"], r["metric"]): r["n"] for r in remote.rows} == {k: n for k, (_, n) in scores.items()}
    assert max(abs(r["value"] - scores[(r["task"], r["metric"])][0]) for r in remote.rows) < 1e-4
    assert {r["engine"] for r in remote.rows} == {"openai"}
    assert ("bpb", "all") in scores and ("line_completion", "exact_match") in scores
