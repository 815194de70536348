"""How the assets' metadata reads in the Dagster UI (`assets/_metadata.py`, `factory/train/plot.py`,
the training run's `_metadata`), without running a materialization.

- the UI renders Markdown inline only below 1,000 characters: the installed dagster-webui bundle
  still says so (the constant our loss curve is shrunk to), and the loss curve's Markdown stays
  under it for a short run, a 100,000-step run and a run with NaN losses;
- floats show 4 significant digits and the exact value is kept in one `raw_values` entry, inside
  JSON too; Markdown, paths and ints pass through; `first` orders the page;
- the training run's page (from a trainer summary as Pipes hands it, and the smoke plan on a tiny
  lake) leads with the loss curve and the card, a table whose rows are the card's, and has at
  most 8 rows: what was the 15 (every identity now in one `details` entry).

CPU, no servers; about 5 s (the tiny lake the plan needs).
"""

from __future__ import annotations

import base64
import math
import re
from pathlib import Path

import pytest
import dagster_webserver
from dagster import FloatMetadataValue, JsonMetadataValue, MarkdownMetadataValue, MetadataValue, TableMetadataValue

from assets._metadata import RAW, display, rounded, table
from assets.train import _metadata as training_run_metadata
from configs.experiments import smoke
from factory.experiments import plan_experiment
from factory.experiments.card import card_rows
from factory.train.plot import INLINE_MARKDOWN, loss_curve_markdown, loss_curve_svg


def test_the_installed_webui_shows_markdown_inline_below_our_limit():
    bundle = Path(dagster_webserver.__file__).parent / "webapp" / "build" / "_next" / "static" / "chunks"
    limits = {m for js in bundle.glob("*.js") for m in re.findall(r"mdStr\.length<([0-9e.]+)", js.read_text())}
    assert limits and {float(x) for x in limits} == {float(INLINE_MARKDOWN)}, limits


def test_the_loss_curve_fits_inline_for_short_long_and_broken_runs():
    short = [(s, 7.0 * math.exp(-s / 40) + 0.01 * (s % 7)) for s in range(1, 121)]
    long = [(s, 5.0 - s / 1e5) for s in range(1, 100_001)]
    broken = [(s, math.nan if 50 <= s < 80 or s % 10 == 0 else 6.0 - s / 100) for s in range(1, 200)]
    for rows in (short, long, broken, []):
        markdown = loss_curve_markdown(rows, "smoke-1a2b3c4d: training loss")
        assert len(markdown) < INLINE_MARKDOWN, (len(rows), len(markdown))
        prefix = "![smoke-1a2b3c4d: training loss](data:image/svg+xml;base64,"
        assert markdown.startswith(prefix) and markdown.endswith(")")
        svg = base64.b64decode(markdown[len(prefix):-1]).decode()
        assert svg.startswith("<svg ") and svg.endswith("</svg>")
    svg = loss_curve_svg(short).decode()
    values = [v for _, v in short]
    for label in (f"{max(values):.3g}", f"{min(values):.3g}", "step 120"):  # the value range, the last step
        assert f">{label}</text>" in svg, label
    # a bucket with some NaN is the mean of the rest; 30 NaN steps in a row break the line in two
    assert loss_curve_svg(broken).decode().count("M") == 3  # the axes, and two segments


def test_floats_show_four_significant_digits_and_keep_the_exact_value():
    assert [rounded(x) for x in (6.320006847381592, 1234.5678, 0.000123456, -2.718281, 0.0, 2.5)] == \
        [6.32, 1235.0, 0.0001235, -2.718, 0.0, 2.5]
    assert math.isnan(rounded(math.nan)) and rounded(math.inf) == math.inf

    shown = display({"loss": 6.320006847381592, "steps": 120, "md": MetadataValue.md("**x**"), "ok": 2.5,
                     "seconds": {"bpb": 12.345678, "he": [0.5, 1.23456]}, "pipes": FloatMetadataValue(0.123456789)},
                    first=["md"])
    assert list(shown) == ["md", "loss", "steps", "ok", "seconds", "pipes", RAW]
    assert shown["loss"] == FloatMetadataValue(6.32) and shown["ok"] == FloatMetadataValue(2.5)
    assert shown["steps"] == 120 and isinstance(shown["md"], MarkdownMetadataValue)
    assert shown["seconds"] == JsonMetadataValue({"bpb": 12.35, "he": [0.5, 1.235]})
    assert shown[RAW].data == {"loss": 6.320006847381592, "seconds": {"bpb": 12.345678, "he": [0.5, 1.23456]},
                               "pipes": 0.123456789}  # "ok" lost nothing: not repeated
    assert RAW not in display({"steps": 3, "loss": 2.5})


def test_a_table_rounds_its_floats_and_types_its_columns():
    t = table([{"task": "bpb", "value": 2.123456, "n": 3}, {"task": "humaneval", "value": 0.5, "n": None}],
              ["task", "value", "n"])
    assert isinstance(t, TableMetadataValue)
    assert [(c.name, c.type) for c in t.schema.columns] == [("task", "string"), ("value", "float"), ("n", "int")]
    assert [r.data for r in t.records] == [{"task": "bpb", "value": 2.123, "n": 3},
                                           {"task": "humaneval", "value": 0.5, "n": None}]


@pytest.mark.slow
def test_the_training_run_page_leads_with_the_loss_curve_and_the_card(build_training_lake, tmp_path):
    plan = plan_experiment(build_training_lake(tmp_path / "home"), smoke())
    curve = loss_curve_markdown([(s, 7.0 - s / 40) for s in range(1, 121)], "training loss")
    reported = {  # the trainer's summary as Pipes hands it to the asset: MetadataValues
        "run": "smoke-1a2b3c4d", "steps": 120, "tokens": 122880, "final_loss": FloatMetadataValue(6.320006847381592),
        "checkpoints": JsonMetadataValue(["ckpt/smoke-1a2b3c4d@120"]), "skipped_steps": 0, "incidents": 0,
        "resumed_from": MetadataValue.null(), "seconds": FloatMetadataValue(61.2345678),
        "mix_version": "mix/default@v1", "parameters": plan.parameters, "loss_curve": MetadataValue.md(curve),
    }
    meta = training_run_metadata(reported, plan, "embedded: sql catalog under FACTORY_HOME, local launcher")

    assert list(meta)[:2] == ["loss_curve", "card"]
    assert len(meta) <= 8, list(meta)
    assert meta["loss_curve"].value == curve and len(curve) < INLINE_MARKDOWN
    card = meta["card"]
    assert isinstance(card, TableMetadataValue)
    fields = [r.data["field"] for r in card.records]
    assert fields == ["experiment", *[k for k, _ in card_rows(plan)], "run it"]
    assert not any("`" in r.data["value"] for r in card.records)  # plain text in table cells
    assert meta["final_loss"] == FloatMetadataValue(6.32) and meta["seconds"] == FloatMetadataValue(61.23)
    assert meta[RAW].data == {"final_loss": 6.320006847381592, "seconds": 61.2345678}
    assert not {"incidents", "skipped_steps", "resumed_from"} & set(meta)  # nothing went wrong: not shown
    details = meta["details"].data
    assert details["config_hash"] == plan.config_hash and details["mix_version"] == "mix/default@v1"
    assert details["deploy"].startswith("embedded: ") and details["run"] == "smoke-1a2b3c4d"

    troubled = training_run_metadata({**reported, "incidents": 2, "resumed_from": "ckpt/smoke-1a2b3c4d@80"}, plan, "")
    assert troubled["incidents"] == 2 and troubled["resumed_from"] == "ckpt/smoke-1a2b3c4d@80"
