"""The demo_home fixture's wait for `make test`'s demo lane: the home once the demo exited 0, and a
failure naming the lane and carrying its log's tail when it exited otherwise or died without an
exit status (never a hang)."""

import subprocess
import sys

import pytest

from demo_run import wait_for_demo_lane


def lane(tmp_path, log="phase 1\nboom: the refine step failed\n"):
    (tmp_path / "demo.log").write_text(log)
    return tmp_path


def test_a_demo_that_exited_0_gives_its_home(tmp_path):
    run = lane(tmp_path)
    (run / "pid").write_text("1")
    (run / "exit").write_text("0\n")
    assert wait_for_demo_lane(run) == run / "factory"


def test_a_failed_demo_fails_with_its_log(tmp_path):
    run = lane(tmp_path)
    (run / "exit").write_text("2\n")
    with pytest.raises(AssertionError, match=r"make demo \(the demo lane\) exited 2(.|\n)*boom: the refine step failed"):
        wait_for_demo_lane(run)


def test_a_lane_that_died_without_an_exit_status_fails_at_once(tmp_path):
    run = lane(tmp_path)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (run / "pid").write_text(str(dead.pid))
    with pytest.raises(AssertionError, match=rf"PID {dead.pid}\) ended without an exit status(.|\n)*boom"):
        wait_for_demo_lane(run)


def test_the_wait_ends_when_the_lane_writes_its_status(tmp_path):
    run = lane(tmp_path)
    writer = subprocess.Popen(["sh", "-c", f"sleep 1; echo 0 > {run}/exit.tmp && mv {run}/exit.tmp {run}/exit"])
    (run / "pid").write_text(str(writer.pid))
    assert wait_for_demo_lane(run) == run / "factory"
    writer.wait()
