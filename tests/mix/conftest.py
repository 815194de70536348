"""Fixtures for the mix tests: three small tables of real standard-library text in a tmp lake, a
byte-level BPE trained on them, and a registered mix. Runs on CPU in a few seconds."""

from __future__ import annotations

import hashlib
import sysconfig
from pathlib import Path

import pyarrow as pa
import pytest

from factory.lake import CommitStamp, Lake
from factory.lake.schemas import REFINED_DOCUMENTS
from factory.mix import MixSpec, register_mix_version
from factory.tokenize import TokenizerConfig, train_tokenizer

STDLIB = Path(sysconfig.get_paths()["stdlib"])
# three sources that differ in kind: two code packages and the prose of module docstrings
PACKAGES = {"refined.alpha": ["json", "email", "xml"], "refined.beta": ["asyncio", "concurrent"],
            "refined.gamma": ["http", "urllib", "logging", "importlib"]}


def documents(table: str) -> list[dict]:
    rows = []
    for package in PACKAGES[table]:
        for path in sorted((STDLIB / package).rglob("*.py")):
            text = path.read_text(encoding="utf-8")
            if not text.strip():
                continue
            rel = str(path.relative_to(STDLIB))
            rows.append({"doc_id": hashlib.sha256(f"{table}/{rel}".encode()).hexdigest()[:24], "source": table,
                         "path": rel, "text": text, "language": "python", "kind": "code",
                         "bytes": len(text.encode()), "content_sha256": hashlib.sha256(text.encode()).hexdigest()})
    return rows


def write_table(lake: Lake, table: str, rows: list[dict], chunks: int = 3) -> int:
    """Commit `rows` as `chunks` appends (several data files), return the snapshot id."""
    commit = None
    step = max(1, -(-len(rows) // chunks))
    for i in range(0, max(len(rows), 1), step):
        data = pa.Table.from_pylist(rows[i:i + step], schema=REFINED_DOCUMENTS.as_arrow())
        commit = lake.commit(table, data, CommitStamp(asset_key="test", config_hash=""), schema=REFINED_DOCUMENTS)
    return commit.snapshot_id


def spec(name: str = "trio", **overrides) -> MixSpec:
    fields = {"name": name, "seq_len": 32, "sources": [
        {"table": "refined.alpha", "weight": 0.5}, {"table": "refined.beta", "weight": 0.3},
        {"table": "refined.gamma", "weight": 0.2}]}
    return MixSpec.model_validate({**fields, **overrides})


@pytest.fixture(scope="session")
def mix_lake(tmp_path_factory) -> Lake:
    """A lake with refined.alpha/beta/gamma, tokenizer `tiny` and mix `trio` v1 (read-only: tests
    that register versions use their own mix names)."""
    lake = Lake.open(home=tmp_path_factory.mktemp("mixlake"))
    for table in PACKAGES:
        write_table(lake, table, documents(table))
    train_tokenizer(lake, TokenizerConfig(name="default", vocab_size=512, sources=list(PACKAGES),
                                          sample_bytes_per_source=300_000, measure_bytes_per_source=50_000))
    register_mix_version(lake, spec())
    return lake
