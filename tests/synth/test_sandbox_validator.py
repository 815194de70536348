"""The synthetic pipelines' `sandbox` validator on the real sandbox: a program is accepted only when
it ran to its last statement without raising; an early exit before a failing assert (sys.exit,
os._exit, raise SystemExit, quit/exit, killing the parent) is rejected with a reason that says so,
as are failed asserts and timeouts. CPU; needs bubblewrap (~2 s on two cores)."""

import shutil

import pytest

from factory.sandbox import Sandbox, SandboxConfig
from factory.synth.config import ValidatorConfig
from factory.synth.validators import Validators

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap (apt-get install bubblewrap)")

WRONG = "assert 2 + 2 == 5, 'wrong answer'\n"  # what each early exit below skips
PROGRAMS = {
    "honest": ("answer = 2 + 2\nassert answer == 4\nprint(answer)\n", ""),
    "wrong": (WRONG, "sandbox failed: the program raised AssertionError: wrong answer (<program> line 1)"),
    "sys.exit(0)": ("import sys\nsys.exit(0)\n" + WRONG,
                    "sandbox failed: the program exited early (SystemExit(0)) before its checks finished"),
    "os._exit(0)": ("import os\nos._exit(0)\n" + WRONG,
                    "sandbox failed: the program exited (status 0) before its checks finished"),
    "raise SystemExit": ("raise SystemExit\n" + WRONG,
                         "sandbox failed: the program exited early (SystemExit()) before its checks finished"),
    "quit()": ("quit()\n" + WRONG, "sandbox failed: the program exited early (SystemExit()) before its checks finished"),
    "exit(0) in __main__": ("if __name__ == '__main__':\n    exit(0)\n" + WRONG,
                            "sandbox failed: the program exited early (SystemExit(0)) before its checks finished"),
    "kill the parent, then exit 0": ("import os\ntry:\n    os.kill(os.getppid(), 9)\nexcept OSError:\n    pass\n"
                                     "os._exit(0)\n" + WRONG, "sandbox crashed: signal SIGKILL"),
    "spins": ("while True:\n    pass\n", "sandbox timeout: wall-clock timeout"),
}


@pytest.fixture(scope="module")
def verdicts():
    """Every program through the validator in one batch, as the pipeline sends them."""
    box = Sandbox(SandboxConfig(workers=2, timeout_s=2, cpu_s=5))
    validators = Validators((), existing_texts=lambda tables: [], sandbox=lambda timeout: box)
    config = ValidatorConfig(kind="sandbox", field="program", timeout_s=2)
    codes = [code for code, _ in PROGRAMS.values()]
    return dict(zip(PROGRAMS, validators.check(config, codes, [{"program": c} for c in codes])))


@pytest.mark.parametrize("name", list(PROGRAMS))
@pytest.mark.slow
def test_only_programs_that_reach_their_end_are_accepted(verdicts, name):
    reason = PROGRAMS[name][1]
    assert (verdicts[name].passed, verdicts[name].reason) == (not reason, reason)
