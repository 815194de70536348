"""`synthetic/<pipeline>`: one asset per pipeline in configs/synth; each materialization runs the
pipeline once (seeds → stages → validators) and commits `synthetic.<pipeline>` (accepted rows with
provenance) and `synthetic.<pipeline>_rejected` (with reasons). The `synthetic_mix_sensor` turns
a new snapshot into new versions of the mixes that include it.
"""


from typing import Optional

from dagster import AssetsDefinition, Config, MaterializeResult, MetadataValue, asset

from assets._metadata import display
from configs.synth import PIPELINES, pipeline
from factory.deploy.kube.placement import op_tags
from factory.infer.export import find_export, latest_export
from factory.overrides import override
from factory.sandbox import Sandbox
from factory.synth import SynthResult, run_pipeline
from resources.inference import InferenceResource, SandboxResource
from resources.lake import LakeResource


class SynthConfig(Config):
    limit: Optional[int] = None
    """Use at most this many seeds (default: the pipeline's own limit)."""


def synth_assets() -> list[AssetsDefinition]:
    return [_synth_asset(name) for name in sorted(PIPELINES)]


def _synth_asset(name: str) -> AssetsDefinition:
    config = pipeline(name)

    @asset(
        name=name,
        key_prefix=["synthetic"],
        group_name="synthetic",
        kinds={"iceberg", "python"},
        op_tags=op_tags("synth"),
        description=f"Iceberg table `synthetic.{name}`: {config.description} Config: configs/synth/{name}.py.",
    )
    def _asset(context, config: SynthConfig, lake: LakeResource, inference: InferenceResource,
               sandbox: SandboxResource) -> MaterializeResult:
        home = lake.lake()
        spec = pipeline(name)
        if config.limit is not None:
            spec = override(spec, {"seeds.limit": config.limit})

        def engine_for(ref: str):
            return inference.engine(latest_export(home) if ref == "latest" else find_export(home, ref))

        boxes: dict[float, Sandbox] = {}

        def sandbox_for(timeout_s: float) -> Sandbox:
            base = sandbox.config()
            return boxes.setdefault(timeout_s, Sandbox(override(base, {"timeout_s": timeout_s})))

        result = run_pipeline(home, spec, engine_for=engine_for, sandbox=sandbox_for, log=context.log.info,
                              run_id=context.run_id)
        return MaterializeResult(metadata=_metadata(result))

    return _asset


def _metadata(r: SynthResult) -> dict:
    reasons = "\n".join(f"| {stage} | {n} |" for stage, n in r.rejected.most_common()) or "| - | 0 |"
    return display({
        "seeds": r.seeds, "accepted": r.accepted, "rejected": sum(r.rejected.values()),
        "rejected_by": MetadataValue.md(f"| stage / validator | rejected |\n|---|---:|\n{reasons}"),
        "tokens_generated": r.tokens, "seconds": r.seconds, "batch_id": r.batch_id,
        "snapshot_id": r.snapshot_id if r.snapshot_id is not None else "none (nothing accepted)",
        "stopped_by_budget": r.stopped or "no",
        "lineage": MetadataValue.md(f"`factory lineage {r.version_id}`" if r.version_id else "no new snapshot"),
    })
