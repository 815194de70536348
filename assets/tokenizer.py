"""`tokenizer`: a byte-level BPE trained on a deterministic sample of the refined tables.

The artifact is a Hugging Face `tokenizer.json` at a content-addressed path under
`$FACTORY_HOME/artifacts/tokenizers/`; retraining on the same snapshots gives the same bytes and
records nothing new. Config: a name from configs/tokenizer.py plus optional overrides.
"""


from typing import Optional

from dagster import AssetKey, Config, MaterializeResult, MetadataValue, asset

from assets._metadata import display
from configs.tokenizer import tokenizers
from factory.deploy.kube.placement import op_tags
from factory.overrides import override
from factory.tokenize import TokenizerArtifact, train_tokenizer
from resources.lake import LakeResource


class TokenizerAssetConfig(Config):
    name: str = "default"
    """A tokenizer config in configs/tokenizer.py."""
    vocab_size: Optional[int] = None
    """Override the config's vocabulary size."""
    sample_bytes_per_source: Optional[int] = None
    """Override the expected sample bytes per source table."""


def _deps() -> list[AssetKey]:
    return sorted({AssetKey(t.split(".")) for c in tokenizers().values() for t in c.sources})


@asset(
    key="tokenizer",
    deps=_deps(),
    group_name="tokenize",
    op_tags=op_tags("tokenize"),
    kinds={"python"},
    description="Byte-level BPE (bos/eos/pad/FIM specials) trained on a deterministic sample of the "
                "refined tables; held-out documents excluded. Config: configs/tokenizer.py.",
)
def tokenizer(context, config: TokenizerAssetConfig, lake: LakeResource) -> MaterializeResult:
    overrides = {k: v for k, v in config.model_dump().items() if k != "name" and v is not None}
    # validated before the lake opens: a vocab_size=5 must fail here, naming the field
    tokenizer_config = override(tokenizers()[config.name], overrides)
    artifact = train_tokenizer(lake.lake(), tokenizer_config, run_id=context.run_id, log=context.log.info)
    return MaterializeResult(metadata=display(_metadata(artifact)))


def _metadata(a: TokenizerArtifact) -> dict:
    rows = "\n".join(f"| {t} | {a.sampled[t]} | {a.sample_docs[t]:,} | {a.sample_bytes[t]:,} | {a.bytes_per_token[t]:.3f} |"
                     for t in a.sampled)
    table = "| table | snapshot | sampled docs | sampled bytes | bytes/token (held-out) |\n|---|---|---|---|---|\n" + rows
    return {
        "version_id": a.version_id,
        "status": "new" if a.new else "unchanged: already in the lake",
        "vocab_size": a.vocab_size,
        "special_ids": MetadataValue.json(a.special_ids),
        "bytes_per_token": MetadataValue.json(a.bytes_per_token),
        "sources": MetadataValue.md(table),
        "path": MetadataValue.path(a.file),
        "content_hash": a.content_hash,
        "seconds": a.seconds,
        "lineage": MetadataValue.md(f"`factory lineage {a.version_id}`"),
    }
