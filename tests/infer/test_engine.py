"""The engine interface on a real export: vLLM (in-process, CPU wheel) against the transformers
reference — scoring, greedy and seeded sampling, stop strings, context fitting. CPU."""

import pytest

from factory.infer import EngineConfig, SamplingConfig, export_checkpoint, open_engine
from factory.infer.engine import TransformersEngine, cut_at_stop

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def engines(trained_checkpoints):
    export = export_checkpoint(trained_checkpoints.lake, trained_checkpoints.checkpoint_ids[-1])
    return open_engine(export, EngineConfig(kind="vllm")), TransformersEngine(export, EngineConfig(kind="transformers"))


def test_scoring_matches_the_reference(engines):
    vllm, reference = engines
    seqs = [vllm.encode("import json\n\ndef load(path):\n    with open(path) as f:\n        return json.load(f)\n"),
            vllm.encode("The quick brown fox")]
    got, want = vllm.logprobs(seqs), reference.logprobs(seqs)
    assert [len(g) for g in got] == [len(s) - 1 for s in seqs]
    assert max(abs(a - b) for g, w in zip(got, want) for a, b in zip(g, w)) < 1e-4
    assert all(lp <= 0 for g in got for lp in g)


def test_greedy_generation_matches_and_sampling_is_seeded(engines):
    vllm, reference = engines
    prompts = [vllm.encode("def add(a, b):\n"), vllm.encode("class Config:\n")]
    greedy = SamplingConfig(max_tokens=16)
    assert [s[0].token_ids for s in vllm.generate(prompts, greedy)] == \
           [s[0].token_ids for s in reference.generate(prompts, greedy)]
    sampled = SamplingConfig(max_tokens=16, temperature=1.0, n=3, seed=7)
    first, second = vllm.generate(prompts, sampled), vllm.generate(prompts, sampled)
    assert [[s.token_ids for s in p] for p in first] == [[s.token_ids for s in p] for p in second]
    assert all(len(p) == 3 for p in first)
    other = vllm.generate(prompts, sampled.model_copy(update={"seed": 8}))
    assert [[s.token_ids for s in p] for p in other] != [[s.token_ids for s in p] for p in first]


def test_stop_strings_cut_the_text_in_both_engines(engines):
    vllm, reference = engines
    prompt = [vllm.encode("x = 1\ny = 2\n")]
    stop = SamplingConfig(max_tokens=24, stop=("\n",))
    for engine in engines:
        sample = engine.generate(prompt, stop)[0][0]
        assert "\n" not in sample.text
    assert cut_at_stop("a\ndef b", ("\ndef ",)) == ("a", True)
    assert cut_at_stop("abc", ("\n",)) == ("abc", False)


def test_fit_keeps_the_end_of_a_long_prompt_and_refuses_no_room(engines):
    vllm, _ = engines
    ids = list(range(10, 10 + vllm.max_len + 50))
    kept = vllm.fit(ids, 16)
    assert len(kept) == vllm.max_len - 16 and kept[-1] == ids[-1]
    with pytest.raises(ValueError, match="no room for a prompt"):
        vllm.fit(ids, vllm.max_len)
