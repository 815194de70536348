"""`factory experiment train NAME`: the trainer of one experiment on this node, with the profile's
launcher. Only prints commands (`--print`); multi-node command lines and processes are tested in
tests/train/test_multinode.py. CPU, a small real lake."""

import shlex

import pytest

from factory import cli

pytestmark = pytest.mark.slow


@pytest.fixture
def ddp_home(tmp_path, build_training_lake, monkeypatch):
    for name in ("FACTORY_DEPLOY", "FACTORY_DEPLOY_JSON", "NODE_RANK", "JOB_COMPLETION_INDEX", "SLURM_NODEID"):
        monkeypatch.delenv(name, raising=False)
    build_training_lake(tmp_path / "home")
    return str(tmp_path / "home")


def _command(capsys, home, *args) -> list[str]:
    assert cli.main(["--home", home, "experiment", "train", *args, "--print"]) == 0
    return shlex.split(capsys.readouterr().out.strip().splitlines()[-1])


def test_single_node_profile_runs_torchrun_standalone(capsys, ddp_home):
    command = _command(capsys, ddp_home, "smoke_ddp")
    assert "--standalone" in command and "--nproc-per-node=2" in command and "--rdzv-endpoint" not in " ".join(command)


def test_a_multinode_profile_does_not_change_an_experiments_shape(capsys, ddp_home, tmp_path, monkeypatch):
    """The node count is the experiment's (part of its identity); the profile only says where the
    rendezvous is. smoke_ddp is one node of two processes, whatever the profile."""
    profile = tmp_path / "two_nodes.yaml"
    profile.write_text("training: {launcher: multinode, rdzv_endpoint: 'trainer-0.factory:29400'}\n")
    monkeypatch.setenv("JOB_COMPLETION_INDEX", "1")
    command = " ".join(_command(capsys, ddp_home, "smoke_ddp", "--deploy", str(profile)))
    assert "--standalone" in command and "trainer-0.factory" not in command


def test_multinode_without_a_rendezvous_fails_naming_the_field(capsys, ddp_home, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("training: {launcher: multinode}\n")
    assert cli.main(["--home", ddp_home, "experiment", "train", "smoke", "--deploy", str(bad), "--print"]) == 1
    assert "training: " in capsys.readouterr().err
