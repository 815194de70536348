"""Data mixes: specs over lake tables, versions pinned to snapshots, and the streaming loader."""

from factory.mix.loader import (
    Batch,
    LoaderConfig,
    MixExhausted,
    MixLoader,
    accounting,
    agreed_resolver,
    merge_states,
)
from factory.mix.spec import MixError, MixSource, MixSpec, MixStage, load_spec
from factory.mix.stream import RepetitionCapReached
from factory.mix.versions import (
    MIX_VERSIONS_TABLE,
    MixVersion,
    get_version,
    latest_version,
    mix_versions,
    register_mix_version,
    version_problems,
)

__all__ = [
    "MIX_VERSIONS_TABLE", "Batch", "LoaderConfig", "MixError", "MixExhausted", "MixLoader", "MixSource",
    "MixSpec", "MixStage", "MixVersion", "RepetitionCapReached", "accounting", "agreed_resolver", "get_version",
    "latest_version", "load_spec", "merge_states", "mix_versions", "register_mix_version", "version_problems",
]
