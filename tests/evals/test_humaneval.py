"""HumanEval through our harness and the bubblewrap sandbox: canonical solutions score 1.0,
empty and wrong completions 0.0; the pass@k estimator; config errors. CPU; needs bubblewrap."""

import pytest

from factory.evals.humaneval import HumanEvalConfig, pass_at_k, problems, program, score_completions
from factory.sandbox import Sandbox, SandboxConfig


@pytest.fixture(scope="module")
def sandbox():
    return Sandbox(SandboxConfig(workers=2, timeout_s=10))


def test_canonical_solutions_pass_every_problem(sandbox):
    chosen = problems()
    assert len(chosen) == 164
    metrics, samples = score_completions(chosen, [[p["canonical_solution"]] for p in chosen], sandbox, (1,))
    assert metrics[0].metric == "pass@1" and metrics[0].value == 1.0 and metrics[0].n == 164
    assert {s["outcome"] for s in samples} == {"passed"}


def test_empty_and_wrong_completions_score_zero(sandbox):
    chosen = problems()[:20]
    empty, _ = score_completions(chosen, [[""] for _ in chosen], sandbox, (1,))
    wrong, samples = score_completions(chosen, [["    return None\n"] for _ in chosen], sandbox, (1,))
    assert empty[0].value == 0.0 and wrong[0].value == 0.0
    assert {s["outcome"] for s in samples} == {"failed"}


def test_pass_at_k_mixes_samples_per_problem(sandbox):
    first = problems()[0]
    right, wrong = first["canonical_solution"], "    return None\n"
    metrics, samples = score_completions([first], [[right, wrong, wrong, wrong]], sandbox, (1, 2, 4))
    values = {m.metric: m.value for m in metrics}
    assert values["pass@1"] == pytest.approx(0.25)
    assert values["pass@2"] == pytest.approx(0.5)  # 1 - C(3,2)/C(4,2)
    assert values["pass@4"] == 1.0
    assert [s["outcome"] for s in samples] == ["passed", "failed", "failed", "failed"]


def test_an_infinite_loop_is_a_timeout_not_a_pass():
    first = problems()[0]
    quick = Sandbox(SandboxConfig(workers=1, timeout_s=2, cpu_s=2))
    metrics, samples = score_completions([first], [["    while True:\n        pass\n"]], quick, (1,))
    assert metrics[0].value == 0.0 and samples[0]["outcome"] == "timeout"


def test_estimator_and_program_shape():
    assert pass_at_k(5, 0, 1) == 0.0 and pass_at_k(5, 5, 1) == 1.0
    assert pass_at_k(5, 1, 1) == pytest.approx(0.2) and pass_at_k(5, 1, 5) == 1.0
    p = problems()[0]
    text = program(p, "    pass\n")
    assert text.startswith(p["prompt"]) and text.rstrip().endswith(f"check({p['entry_point']})")


def test_bad_configs_name_the_problem():
    with pytest.raises(ValueError, match="greedy samples are identical"):
        HumanEvalConfig(samples=3)
    with pytest.raises(ValueError, match=r"every k must be between 1 and samples=2"):
        HumanEvalConfig(samples=2, temperature=0.8, k=(1, 5))
