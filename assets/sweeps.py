"""`sweeps/results` and `automix`: what a sweep found, and the auto-mixer's proposed mix.

`sweeps/results` (one partition per sweep in configs/sweeps) joins every cell's config with its
final eval metrics into Iceberg `sweeps.results`, ranks the cells by the sweep's metric and puts
the ranking table and a plot (PNG) in its metadata. `automix` fits the auto-mixer's regression
on a Dirichlet sweep's evaluated proxies and registers the proposal as a new mix version whose
lineage reaches every proxy run (`factory.experiments.automix`).

Both read `evals.results` for every checkpoint of a sweep, so both depend on all of
`eval_scores` (`AllPartitionMapping`: a sweep name maps to no one checkpoint key, and the
inferred Identity mapping would pair `smoke_lr` with a checkpoint `smoke_lr`).
"""

from dagster import (
    AllPartitionMapping,
    AssetDep,
    Config,
    MaterializeResult,
    MetadataValue,
    StaticPartitionsDefinition,
    asset,
)

from assets._metadata import display, table
from factory.deploy.kube.placement import op_tags
from factory.experiments.automix import propose_from_sweep
from factory.experiments.registry import discover_sweeps, get_sweep
from factory.experiments.results import display_rows, plot, write_sweep_results
from factory.home import artifacts_dir
from factory.train.plot import png_markdown
from resources.experiments import ExperimentsResource
from resources.lake import LakeResource

sweep_partitions = StaticPartitionsDefinition(sorted(discover_sweeps().found))


@asset(
    key=["sweeps", "results"],
    partitions_def=sweep_partitions,
    deps=[AssetDep("eval_scores", partition_mapping=AllPartitionMapping())],
    group_name="sweeps",
    op_tags=op_tags("sweep"),
    kinds={"iceberg"},
    description="Iceberg `sweeps.results`: each cell of a sweep (the partition) with its config and final eval "
                "metrics; metadata ranks the cells and plots them.",
)
def sweep_results(context, lake: LakeResource, experiments: ExperimentsResource) -> MaterializeResult:
    sweep = get_sweep(context.partition_key, experiments.sweeps_path())
    report = write_sweep_results(lake.lake(), sweep, run_id=context.run_id, partition=sweep.name)
    png = plot(report, sweep, artifacts_dir(lake.lake().home) / "sweeps" / sweep.name / "summary.png")
    best = report.best or {}
    return MaterializeResult(metadata=display({
        "ranking": _ranking_table(report.ranking, sweep.metric),
        "plot": MetadataValue.md(png_markdown(png.read_bytes(), alt=sweep.name)),
        "plot_path": MetadataValue.path(str(png)),
        "metric": sweep.metric, "cells": len(report.ranking), **{f"cells_{k}": v for k, v in report.counts.items()},
        "best_run": best.get("run") or "-", "best_value": float(best["value"]) if best.get("value") is not None else None,
        "snapshot_id": str(report.snapshot_id),
    }))


def _ranking_table(ranking: list[dict], metric: str):
    """The ranking as a table, which the UI always shows inline (its Markdown, one row per cell,
    passes the UI's 1,000-character limit for inline Markdown at about ten cells)."""
    columns = ["rank", "run", "params", metric, "train loss", "status"]
    return table([dict(zip(columns, row)) for row in display_rows(ranking)], columns)


class AutomixConfig(Config):
    sweep: str = "automix"
    """A sweep over mix_weights (Dirichlet) whose proxies are evaluated."""
    name: str = "automix"
    """Mix name the proposal is registered under (mix/<name>@vN)."""


@asset(
    key="automix",
    deps=[AssetDep(["sweeps", "results"]), AssetDep("eval_scores", partition_mapping=AllPartitionMapping())],
    group_name="sweeps",
    op_tags=op_tags("mix"),  # it registers a mix version, on the CPU pool
    kinds={"iceberg"},
    description="RegMix: regress the proxies' held-out loss on their mix weights and register the proposed mix "
                "(mixes.versions, lineage to every proxy run).",
)
def automix(context, config: AutomixConfig, lake: LakeResource, experiments: ExperimentsResource) -> MaterializeResult:
    proposal, version = propose_from_sweep(lake.lake(), get_sweep(config.sweep, experiments.sweeps_path()),
                                           name=config.name, run_id=context.run_id, log=context.log.info)
    return MaterializeResult(metadata=display({
        "mix_version": version.version_id, "proposal": MetadataValue.md(proposal.summary()),
        "weights": proposal.weights, "proxies": proposal.n_proxies,
        "predicted_loss": proposal.predicted_loss, "uniform_predicted_loss": proposal.uniform_loss,
        "loo_spearman": proposal.fit.loo_spearman, "loo_rmse": proposal.fit.loo_rmse,
        "fit_features": proposal.fit.features, "fit_ridge": proposal.fit.ridge,
    }))
