"""HumanEval through our harness and the bubblewrap sandbox: canonical solutions score 1.0 (all 164,
~10 s on two cores), empty and wrong completions 0.0, and every completion that games the check
scores 0.0 — early exits (sys.exit, os._exit, SystemExit, quit/exit, killing the parent), patching
what the test relies on (builtins, the prompt's helpers, a module, check's frame, an atexit hook),
always-equal return values and a guessed pass marker; the pass@k estimator; config errors.
CPU; needs bubblewrap."""

import textwrap

import pytest

from factory.evals.humaneval import HumanEvalConfig, pass_at_k, problems, program, score_completions
from factory.sandbox import Sandbox, SandboxConfig

ALWAYS_EQUAL = "    class Anything:\n        def __eq__(self, other):\n            return True\n    return Anything()\n"
# name: (problem index, completion). Each scored 1.0 when "passed" meant exit status 0, except the two
# marked "already 0" (as root the parent cannot be killed; the test's own `def check` replaced a planted one).
GAMED = {
    "sys.exit in the body": (0, "    import sys\n    sys.exit(0)\n"),
    "sys.exit after the function": (0, "    return None\nimport sys\nsys.exit(0)\n"),
    "os._exit": (0, "    import os\n    os._exit(0)\n"),
    "raise SystemExit": (0, "    raise SystemExit\n"),
    "quit()": (0, "    quit()\n"),
    "exit()": (0, "    return None\nexit()\n"),
    "kill the parent, then exit 0": (0, "    import os\n    try:\n        os.kill(os.getppid(), 9)\n"
                                        "    except OSError:\n        pass\n    os._exit(0)\n"),
    "kill the parent": (0, "    import os\n    os.kill(os.getppid(), 9)\n"),  # already 0
    "atexit hides the failed assert": (0, "    return None\nimport atexit, os\natexit.register(os._exit, 0)\n"),
    "defines check": (0, "    return None\ndef check(candidate):\n    pass\n"),  # already 0
    "rebinds builtins.abs": (2, "    return 0.5\nimport builtins\nbuiltins.abs = lambda x: 0\n"),
    "rebinds the prompt's encode_cyclic": (38, "    return s\nencode_cyclic = lambda s: s\n"),
    "patches math.fabs": (32, "    return 0.0\nimport math\nmath.fabs = lambda x: 0.0\n"),
    "traces check's frame": (0, textwrap.dedent("""\
        \x20   return None
        import sys
        class _Yes:
            def __eq__(self, other):
                return True
        def _tracer(frame, event, arg):
            if event == "call" and frame.f_code.co_name == "check":
                frame.f_locals["candidate"] = lambda *a, **k: _Yes()
        sys.settrace(_tracer)
    """)),
    "always-equal object": (0, ALWAYS_EQUAL),
    "int subclass equal to anything": (53, "    class I(int):\n        def __eq__(self, o):\n            return True\n"
                                           "        __hash__ = int.__hash__\n    return I()\n"),
    "float subclass equal to anything": (2, "    class F(float):\n        def __eq__(self, o):\n            return True\n"
                                          "        def __sub__(self, o):\n            return 0.0\n    return F()\n"),
    "str subclass equal to anything": (27, "    class S(str):\n        def __eq__(self, o):\n            return True\n"
                                           "        __hash__ = str.__hash__\n    return S()\n"),
    "prints a guessed marker": (0, "    import os\n    print('\\nFACTORY-CHECK-PASSED ' + '0' * 32)\n    os._exit(0)\n"),
}


@pytest.fixture(scope="module")
def sandbox():
    return Sandbox(SandboxConfig(workers=2, timeout_s=10))


@pytest.mark.slow
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


@pytest.mark.parametrize("name", list(GAMED))
def test_completions_that_game_the_check_score_zero(sandbox, name):
    index, completion = GAMED[name]
    metrics, samples = score_completions([problems()[index]], [[completion]], sandbox, (1,))
    assert metrics[0].value == 0.0 and samples[0]["score"] == 0.0
    assert samples[0]["outcome"] in ("failed", "crashed"), samples[0]


def test_gamed_completions_fail_for_the_reason_that_applies(sandbox):
    names = ["sys.exit in the body", "os._exit", "always-equal object", "rebinds the prompt's encode_cyclic",
             "patches math.fabs", "kill the parent"]
    verdicts = sandbox.map_checked([program(problems()[GAMED[n][0]], GAMED[n][1]) for n in names])
    reasons = dict(zip(names, (v.reason for v in verdicts)))
    assert reasons == {
        "sys.exit in the body": "has_close_elements() exited early (SystemExit(0)) before its checks finished",
        "os._exit": "the program exited (status 0) before its checks finished",
        "always-equal object": "has_close_elements() returned a value of type Anything: only exact builtin values "
                               "(int, float, complex, str, bytes, bool, None and lists, tuples, dicts, sets of them) "
                               "are compared",
        "rebinds the prompt's encode_cyclic": "check() raised AssertionError (<test> line 14)",
        "patches math.fabs": "check() raised AssertionError (<test> line 20)",
        "kill the parent": "signal SIGKILL",
    }


def test_estimator_and_program_shape():
    assert pass_at_k(5, 0, 1) == 0.0 and pass_at_k(5, 5, 1) == 1.0
    assert pass_at_k(5, 1, 1) == pytest.approx(0.2) and pass_at_k(5, 1, 5) == 1.0
    p = problems()[0]
    checked = program(p, "    pass\n")
    assert ascii(p["prompt"] + "    pass\n") in checked.text and ascii(p["test"]) in checked.text
    assert checked.stdin == checked.nonce + "\n" and checked.nonce not in checked.text


def test_bad_configs_name_the_problem():
    with pytest.raises(ValueError, match="greedy samples are identical"):
        HumanEvalConfig(samples=3)
    with pytest.raises(ValueError, match=r"every k must be between 1 and samples=2"):
        HumanEvalConfig(samples=2, temperature=0.8, k=(1, 5))
