"""What a build came to: `FailureClass`, `BuildRecord`, and the classification of a test phase.

What "success" means: a build is `passed` when its environment was built and its test suite ran
to its end (the report plugin's nonce-stamped end record arrived), whatever the individual tests
did: failing tests are recorded per test (envs.tests), they do not fail the build. Two kinds of
failing tests do change the class, because they say the environment, not the code, is at fault:
failures with a network error in their message (`tests_need_network`: socket.gaierror, connection
refused, network unreachable; the sandbox has no network; also a run cut by its clock after such
failures: network tests tend to wait out their own timeouts) and failures that hit the sandbox's
walls (`sandbox_limit`: a write to the read-only /env, EPERM, a file-size or process limit). Such
a build still has its environment (env_digest set): the other tests are usable for tasks.

Every other class means no usable test run: `no_build_system`, `resolution_failed`, `no_wheel`
(a dependency exists on the index only as an sdist, asked of the index), `build_error`,
`test_collection_error` (collection errors and no test passed, no tests at all, or the runner
stopped before its end), `timeout` (wall clock or CPU limit of the test run), `sandbox_limit` (the
run was killed: out of memory, a signal such as seccomp's SIGSYS).
"""

from __future__ import annotations

import datetime as dt
import re
from enum import Enum

from pydantic import BaseModel, ConfigDict, Field

from factory.envs.environment import CaseOutcome, TestCase, TestReport


class FailureClass(str, Enum):
    PASSED = "passed"
    NO_BUILD_SYSTEM = "no_build_system"
    RESOLUTION_FAILED = "resolution_failed"
    NO_WHEEL = "no_wheel"
    BUILD_ERROR = "build_error"
    TEST_COLLECTION_ERROR = "test_collection_error"
    TESTS_NEED_NETWORK = "tests_need_network"
    TIMEOUT = "timeout"
    SANDBOX_LIMIT = "sandbox_limit"


NETWORK = re.compile(r"gaierror|Temporary failure in name resolution|Name or service not known|ConnectionRefused"
                     r"|Connection refused|Network is unreachable|ENETUNREACH|No route to host|NewConnectionError"
                     r"|urlopen error|Failed to establish a new connection|nodename nor servname"
                     r"|\[Errno (?:101|111|113|-2|-3|-5)\]", re.I)  # ENETUNREACH ECONNREFUSED EHOSTUNREACH EAI_*
SANDBOX = re.compile(r"Read-only file system|EROFS|PermissionError|Permission denied|Operation not permitted|EPERM"
                     r"|File too large|Bad system call|Resource temporarily unavailable|can't start new thread"
                     r"|\[Errno (?:1|13|27|30)\]", re.I)  # EPERM EACCES EFBIG EROFS (pytest's summary line cuts the words)

SUMMARY = re.compile(r"^(?:FAILED|ERROR) (\S+) - (.*)$", re.M)


class BuildRecord(BaseModel):
    """One repository's build: its phases, outcome and tests (a row of envs.builds + its envs.tests)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    build_id: str = Field(description="Unique id of this build attempt (hex).")
    repo: str
    revision: str = Field(description="Sdist version, git sha or 'local-<digest>'; '' when the fetch failed.")
    repo_set: str
    origin: str = Field(description="Lineage id of the source version.")
    builder: str = Field(description="Builder name ('heuristic', or an agent's).")
    attempt: int = Field(1, description="Which attempt this record is (a builder may revise its plan after a failure).")
    failure_class: FailureClass
    failure_detail: str = Field("", description="What went wrong, in words (the tail of the failing step).")
    rule: str = Field("", description="Id of the rule that decided the failing part (or the backend rule on success).")
    rules_json: str = Field("{}", description="Every plan part's deciding rule, as JSON.")
    resolve_outcome: str = Field("skipped", description="ok, failed or skipped.")
    resolve_s: float = 0.0
    build_outcome: str = "skipped"
    build_s: float = 0.0
    test_outcome: str = "skipped"
    test_s: float = 0.0
    lock_hash: str = ""
    env_digest: str = ""
    env_uri: str = ""
    tests: tuple[TestCase, ...] = ()
    flaky: tuple[str, ...] = Field((), description="Ids of tests that failed, then passed on a rerun.")
    collection_errors: int = 0
    built_at: dt.datetime = Field(default_factory=lambda: dt.datetime.now(dt.timezone.utc))

    @property
    def tests_passed(self) -> int:
        return sum(c.outcome is CaseOutcome.PASSED for c in self.tests)

    @property
    def tests_failed(self) -> int:
        return sum(c.outcome in (CaseOutcome.FAILED, CaseOutcome.ERROR) for c in self.tests)

    @property
    def version_id(self) -> str:
        """Lineage id of this build: env_build/<repo>@<revision>/<digest[:12]> ('failed-<build id>' without env)."""
        tail = self.env_digest[:12] if self.env_digest else f"failed-{self.build_id[:12]}"
        return f"env_build/{self.repo}@{self.revision or 'unfetched'}/{tail}"


def classify_run(report: TestReport, cases: tuple[TestCase, ...], runner_rule: str) -> tuple[FailureClass, str]:
    """The class and detail of a test phase whose final per-test results are `cases`."""
    reason = f"{report.exec_outcome} ({report.exec_reason})"
    if not report.completed:
        if report.exec_outcome == "timeout":
            # network tests often wait out their own timeouts until the run's clock cuts it: the cause
            summary = dict(SUMMARY.findall(report.output_tail))
            network = [c.test_id for c in cases if c.outcome in (CaseOutcome.FAILED, CaseOutcome.ERROR)
                       and NETWORK.search(f"{c.message}\n{summary.get(c.test_id, '')}")]
            if network:
                return FailureClass.TESTS_NEED_NETWORK, (f"test run cut ({reason}) after {len(network)} tests failed "
                                                         f"on the network: " + ", ".join(network[:10]))
            return FailureClass.TIMEOUT, f"test run cut: {reason}"
        if report.exec_outcome in ("oom", "crashed") or "file-size" in report.exec_reason:
            return FailureClass.SANDBOX_LIMIT, f"test run killed: {reason}; {report.output_tail[-300:]}"
        errors = "; ".join(report.collection_errors)[:800]
        return FailureClass.TEST_COLLECTION_ERROR, (f"the runner stopped before its end: {reason}; "
                                                    f"{errors or report.output_tail[-800:]}")
    failed = [c for c in cases if c.outcome in (CaseOutcome.FAILED, CaseOutcome.ERROR)]
    passed = [c for c in cases if c.outcome is CaseOutcome.PASSED]
    if report.collection_errors and not passed:
        return FailureClass.TEST_COLLECTION_ERROR, "; ".join(report.collection_errors)[:1000]
    if not cases:
        return FailureClass.TEST_COLLECTION_ERROR, f"no tests collected (rule {runner_rule}); {report.output_tail[-500:]}"
    # The summary lines ("FAILED id - OSError: ...") carry the exception line a truncated message may lack.
    summary = dict(SUMMARY.findall(report.output_tail))
    failed = [c.model_copy(update={"message": f"{c.message}\n{summary.get(c.test_id, '')}"}) for c in failed]
    network = [c for c in failed if NETWORK.search(c.message)]
    if network:
        return FailureClass.TESTS_NEED_NETWORK, f"{len(network)} tests fail on the network: " + ", ".join(
            c.test_id for c in network[:10])
    walls = [c for c in failed if SANDBOX.search(c.message)]
    if walls:
        return FailureClass.SANDBOX_LIMIT, f"{len(walls)} tests hit the sandbox: " + ", ".join(
            f"{c.test_id} ({c.message[:80]})" for c in walls[:5])
    detail = f"{len(passed)} passed, {len(failed)} failed"
    if report.collection_errors:
        detail += f", {len(report.collection_errors)} collection errors"
    return FailureClass.PASSED, detail
