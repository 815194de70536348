"""`mix`: one partition per mix spec (configs/mixes/<name>.yaml); each materialization registers
a version that pins every source to its current snapshot (Iceberg `mixes.versions`).

An unchanged spec over unchanged snapshots returns the existing version and commits nothing. The
checks read the version back from Iceberg: weights sum to 1 in every stage, every pinned
snapshot exists, no source is empty. Training streams the version (`factory.mix.MixLoader`).
"""


from dagster import (
    AssetCheckResult,
    AssetCheckSpec,
    AssetKey,
    MaterializeResult,
    MetadataValue,
    StaticPartitionsDefinition,
    asset,
)

from assets._metadata import display
from configs.mixes import mix_names, mix_spec
from factory.deploy.kube.placement import op_tags
from factory.mix import MixVersion, register_mix_version, version_problems
from resources.lake import LakeResource

CHECKS = {
    "weights_sum_to_one": "Every stage's weights are >= 0 and sum to 1.",
    "pinned_snapshots_exist": "Every pinned table snapshot still exists.",
    "no_empty_source": "Every source has training rows at its pinned snapshot.",
}

mix_partitions = StaticPartitionsDefinition(mix_names())


def _deps() -> list[AssetKey]:
    """The tokenizer and every source table the specs name, but `junk.*`: the auto-mixer's designed
    cases (bench/automix_bench.py) build those with `factory.data.junk`, outside the asset graph,
    and a dependency on an asset nobody defines would be an unmaterializable stub in it."""
    tables = {s.table for name in mix_names() for s in mix_spec(name).sources if not s.table.startswith("junk.")}
    return [AssetKey("tokenizer"), *sorted(AssetKey(t.split(".")) for t in tables)]


@asset(
    key="mix",
    deps=_deps(),
    partitions_def=mix_partitions,
    group_name="mix",
    op_tags=op_tags("mix"),
    kinds={"iceberg", "python"},
    check_specs=[AssetCheckSpec(name, asset="mix", description=d, blocking=True) for name, d in CHECKS.items()],
    description="A mix version: weights over pinned table snapshots, tokenizer pinned, token estimates. "
                "Partition = mix name; specs in configs/mixes/.",
)
def mix(context, lake: LakeResource) -> MaterializeResult:
    version, created = register_mix_version(lake.lake(), mix_spec(context.partition_key), run_id=context.run_id,
                                             log=context.log.info)
    problems = version_problems(lake.lake(), version)
    return MaterializeResult(
        metadata=_metadata(version, created),
        check_results=[AssetCheckResult(check_name=name, passed=not problems[name],
                                        metadata={"problems": MetadataValue.json(problems[name])})
                       for name in CHECKS],
    )


def _metadata(v: MixVersion, created: bool) -> dict:
    stages = [(s.until_tokens, s.weights) for s in v.spec.stages] + [(None, v.spec.weights)]
    header = " | ".join(f"stage {i} (< {u:,} tokens)" if u else f"stage {i}" for i, (u, _) in enumerate(stages))
    rows = "\n".join(
        f"| {t} | {p.snapshot_id} | {p.train_rows:,} | {p.bytes:,} | {p.token_estimate:,} | "
        + " | ".join(f"{w.get(t, 0.0):.3f}" for _, w in stages) + " |"
        for t, p in v.pins.items()
    )
    table = (f"| source | snapshot | training rows | bytes | ~tokens | {header} |\n"
             f"|---|---|---|---|---|{'---|' * len(stages)}\n{rows}")
    return display({
        "version_id": v.version_id,
        "status": "new version" if created else "unchanged: the newest version already pins this",
        "sources": MetadataValue.md(table),
        "token_estimate": sum(p.token_estimate for p in v.pins.values()),
        "seq_len": v.spec.seq_len,
        "tokenizer": v.tokenizer_version,
        "plan_hash": v.plan_hash,
        "query": MetadataValue.md(f"`factory sql \"select * from mixes.versions where version_id='{v.version_id}'\"`"),
        "lineage": MetadataValue.md(f"`factory lineage {v.version_id}`"),
    })
