"""Podium over the session's trained lake: two real exports (evalsmoke@4 and @8), served in-process."""

import json

import pytest

from factory.infer import export_checkpoint
from factory.podium.config import PodiumConfig

USERS = {"tok-alice": "alice", "tok-bob": "bob", "tok-carol": "carol"}


@pytest.fixture(scope="session")
def podium_lake(trained_checkpoints):
    lake = trained_checkpoints.lake
    for checkpoint in trained_checkpoints.checkpoint_ids:
        export_checkpoint(lake, checkpoint)
    return lake


@pytest.fixture
def podium_config(tmp_path):
    """A config of this test's own token list and secret (users alice, bob and carol)."""
    tokens = tmp_path / "tokens.json"
    tokens.write_text(json.dumps(USERS))

    def make(**fields) -> PodiumConfig:
        return PodiumConfig(tokens_file=tokens, secret_file=tmp_path / "secret", backend="local", **fields)

    return make
