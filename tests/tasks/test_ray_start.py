"""Starting a local Ray instance for the task engine: a start that fails (the raylet aborts when its
dashboard agent takes over 15 s to come up, as on a loaded machine) is cleaned up and tried again;
one that keeps failing ends in an error naming the tries and the last cause. Unit tier: ray.init
and ray.shutdown are stand-ins here (the real start is tests/tasks/test_task_engine.py's)."""

import pytest

from factory.tasks import engine_ray
from factory.tasks.engine_model import EngineConfig

TIMED_OUT = "The current node timed out during startup."


@pytest.fixture
def fake_ray(monkeypatch):
    calls = {"init": [], "shutdown": 0, "fail": 0}

    def init(**kwargs):
        calls["init"].append(kwargs)
        if len(calls["init"]) <= calls["fail"]:
            raise Exception(TIMED_OUT)

    def shutdown():
        calls["shutdown"] += 1

    monkeypatch.setattr(engine_ray.ray, "init", init)
    monkeypatch.setattr(engine_ray.ray, "shutdown", shutdown)
    monkeypatch.setattr(engine_ray.ray, "is_initialized", lambda: False)
    monkeypatch.setattr(engine_ray.time, "sleep", lambda s: None)
    return calls


def test_a_failed_local_start_is_cleaned_up_and_started_again(fake_ray):
    fake_ray["fail"] = 2
    assert engine_ray.start_ray(EngineConfig(workers=1)) is True
    assert len(fake_ray["init"]) == 3 and fake_ray["shutdown"] == 2
    assert all(c["address"] == "local" and c["_node_ip_address"] == "127.0.0.1" for c in fake_ray["init"])


def test_a_local_start_that_keeps_failing_names_its_tries_and_the_cause(fake_ray):
    fake_ray["fail"] = 99
    with pytest.raises(RuntimeError, match=f"failed to start 3 times; last: Exception: {TIMED_OUT}"):
        engine_ray.start_ray(EngineConfig(workers=1))
    assert len(fake_ray["init"]) == 3 and fake_ray["shutdown"] == 3


def test_joining_a_cluster_is_not_retried(fake_ray):
    fake_ray["fail"] = 1
    with pytest.raises(Exception, match=TIMED_OUT):
        engine_ray.start_ray(EngineConfig(address="10.0.0.5:6379"))
    assert len(fake_ray["init"]) == 1 and fake_ray["shutdown"] == 0
