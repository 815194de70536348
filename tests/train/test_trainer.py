"""The training loop in process: `train(plan, lake)` at world size 1 on the `smoke` experiment,
shortened to a few steps (`smoke().derive(steps=..., checkpoint=...)`).

- a 12-step run: the loss falls (read back from Iceberg `train.metrics`), checkpoints land in
  `train.checkpoints` (`ckpt/<run>@<step>`, tokens = step x tokens per step) and on disk (pruned
  to `keep_last`), the card sits beside them, each checkpoint's lineage row names the mix version,
  the tokenizer and the previous checkpoint, and MLflow holds the run with its loss history;
- a NaN injected at step 4 (a `Faults` handed to `train`): the step is skipped (no optimizer update, an
  incident row, `skipped` = 1 in the metrics), the run finishes with finite parameters;
- a truncated newest checkpoint: the next launch says why it skips it, resumes from the one
  before and completes;
- 3 steps + a resumed launch to 6 equals 6 uninterrupted steps, bit for bit (separate homes);
- the fused LM head + loss (`fused_loss=True`) trains the same loss curve as the unfused head,
  within 1e-5 relative at every step (float rounding only: both sum in fp32).

Runs on CPU with one intra-op thread (the smoke model, 0.85 M parameters at vocab 512: 0.3-0.9 s
a step), real lakes (sqlite catalog in tmp_path, ~3 s each: one shared by the module's tests,
which keep apart by run name, and a second home for the resumed run) and a real MLflow sqlite
store; no network. ~45 s on 2 idle cores.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
from mlflow import MlflowClient
from pyiceberg.expressions import EqualTo

from configs.experiments import smoke
from factory.experiments import plan_experiment
from factory.experiments.card import render_card
from factory.faults import Faults
from factory.train.checkpoint import checkpoint_dir, checkpoints, latest_valid, load_checkpoint, validate
from factory.train.config import CheckpointConfig, TrackerConfig
from factory.train.schedule import lr_at
from factory.train.trainer import train


def experiment(steps: int, every: int, keep_last: int = 3, mlflow: bool = False):
    """The smoke experiment, `steps` long, at 16 sequences per step (what the loss and spike bounds
    here were measured with); Iceberg metrics only unless `mlflow` (its store costs ~4 s)."""
    return smoke().derive(steps=steps, checkpoint=CheckpointConfig(every=every, keep_last=keep_last),
                          global_batch=16, micro_batch=8,
                          tracker=TrackerConfig(backends=["mlflow", "iceberg"] if mlflow else ["iceberg"]))


def metric(lake, run: str, name: str) -> list[tuple[int, float]]:
    """(step, value) rows of one metric of `run` in train.metrics, by step."""
    rows = lake.table("train.metrics").scan(row_filter=EqualTo("run", run)).to_arrow().to_pylist()
    return sorted((r["step"], r["value"]) for r in rows if r["name"] == name)


def final_payload(lake, run: str) -> dict:
    ref = latest_valid(checkpoint_dir(lake.home, run), log=pytest.fail)
    assert ref is not None, f"no valid checkpoint of {run}"
    return {"step": ref.step, **load_checkpoint(ref)}


@pytest.mark.slow
def test_smoke_run_falls_checkpoints_records_lineage_and_mlflow(shared_lake, reporter, training_env):
    lake = shared_lake
    plan = plan_experiment(lake, experiment(steps=12, every=4, keep_last=2, mlflow=True))

    result = train(plan, lake, reporter=reporter)

    run = "smoke"
    ids = [f"ckpt/{run}@{s}" for s in (4, 8, 12)]
    assert (result.run, result.steps, result.tokens) == (run, 12, 12 * plan.tokens_per_step)
    assert result.checkpoints == ids
    assert (result.skipped_steps, result.incidents, result.resumed_from) == (0, 0, None)
    assert reporter.warnings == [], reporter.warnings

    # the loss falls: from ~ln(512) = 6.2 at init
    logged = metric(lake, run, "loss")
    assert [s for s, _ in logged] == list(range(1, 13)), f"one loss row per step, got {logged}"
    loss = dict(logged)
    first, last = [loss[s] for s in (1, 2, 3)], [loss[s] for s in (10, 11, 12)]
    assert abs(first[0] - math.log(512)) < 0.5, f"initial loss {first[0]:.3f} is not ~ln(vocab)"
    assert sum(last) / 3 < sum(first) / 3 - 0.3, f"loss did not fall: first {first}, last {last}"
    assert result.final_loss == loss[12]

    # train.checkpoints: one row per save, tokens = step x tokens per step
    rows = checkpoints(lake, run)
    assert [r["checkpoint_id"] for r in rows] == ids
    assert [r["tokens"] for r in rows] == [s * plan.tokens_per_step for s in (4, 8, 12)]
    assert {(r["experiment"], r["mix_version"], r["config_hash"]) for r in rows} == {
        ("smoke", plan.mix_version, plan.config_hash)}
    assert rows[-1]["loss"] == pytest.approx(loss[12])

    # on disk: keep_last=2 pruned step 4; the card beside the checkpoints
    directory = checkpoint_dir(lake.home, run)
    assert sorted(p.name for p in directory.iterdir()) == [
        "step-00000008.json", "step-00000008.pt", "step-00000012.json", "step-00000012.pt"]
    assert all(validate(directory / f"step-{s:08d}.pt") is None for s in (8, 12))
    assert (directory.parent / "card.md").read_text() == render_card(plan)

    # lineage: mix version + tokenizer + the previous checkpoint
    lineage = {r.version_id: r for r in lake.lineage.records() if r.kind == "checkpoint" and r.name == f"run/{run}"}
    assert sorted(lineage) == sorted(ids)
    assert lineage[ids[0]].upstream == [plan.mix_version, plan.tokenizer]
    assert lineage[ids[1]].upstream == [plan.mix_version, plan.tokenizer, ids[0]]
    assert lineage[ids[2]].upstream == [plan.mix_version, plan.tokenizer, ids[1]]

    # MLflow: one finished run with the whole loss history
    client = MlflowClient(tracking_uri=f"sqlite:///{lake.home / 'mlflow' / 'mlflow.db'}")
    [mlrun] = client.search_runs([client.get_experiment_by_name("factory").experiment_id],
                                 f"tags.`factory.run` = '{run}'")
    assert mlrun.info.status == "FINISHED"
    history = {m.step: m.value for m in client.get_metric_history(mlrun.info.run_id, "loss")}
    assert history == loss
    assert mlrun.data.params["model.vocab_size"] == "512"

    # the summary handed to Dagster (through Pipes when launched by the asset)
    assert reporter.summary["final_loss"] == result.final_loss
    assert reporter.summary["checkpoints"] == ids
    assert reporter.summary["loss_curve"].startswith("![")


@pytest.mark.slow
def test_nan_step_is_skipped_recorded_and_the_run_finishes(shared_lake, reporter, training_env):
    lake, run = shared_lake, "nan"
    plan = plan_experiment(lake, experiment(steps=6, every=3))

    result = train(plan, lake, run=run, reporter=reporter, faults=Faults(nan_at_steps=[4]))

    assert (result.steps, result.skipped_steps, result.incidents) == (6, 1, 1)
    assert result.final_loss is not None and math.isfinite(result.final_loss)

    [incident] = lake.table("train.incidents").scan(row_filter=EqualTo("run", run)).to_arrow().to_pylist()
    assert (incident["step"], incident["kind"]) == (4, "nonfinite")
    assert json.loads(incident["detail"])["action"] == "skip"
    assert [w for w in reporter.warnings if w.startswith("step 4: nonfinite")], reporter.warnings

    assert metric(lake, run, "skipped") == [(1, 0.0), (2, 0.0), (3, 0.0), (4, 1.0), (5, 0.0), (6, 0.0)]
    loss = dict(metric(lake, run, "loss"))
    assert math.isnan(loss[4]) and all(math.isfinite(v) for s, v in loss.items() if s != 4)  # Iceberg keeps the NaN

    payload = final_payload(lake, run)
    assert payload["step"] == 6
    bad = [name for name, t in payload["model"].items() if not torch.isfinite(t).all()]
    assert bad == [], f"non-finite parameters after the skipped step: {bad}"
    # AdamW counts its updates per parameter: 6 steps, one skipped
    updates = {float(s["step"]) for s in payload["optimizer"]["state"].values()}
    assert updates == {5.0}, f"optimizer steps per parameter: {updates}"


@pytest.mark.slow
def test_spike_rolls_back_to_the_last_checkpoint(shared_lake, reporter, training_env):
    """A loss x1000 at step 9 (window 5, action rollback; 50 sigma, far above the early-training
    grad-norm swings a 5-step window sees): the step is not applied and the weights and optimizer
    go back to checkpoint 8, so the step-9 checkpoint equals step 8's."""
    lake, run = shared_lake, "spike"
    exp = experiment(steps=9, every=4, keep_last=5).derive(
        guards={"spike_window": 5, "spike_sigma": 50, "spike_action": "rollback"})
    result = train(plan_experiment(lake, exp), lake, run=run, reporter=reporter, faults=Faults(spike_at_steps=[9]))

    rows = lake.table("train.incidents").scan(row_filter=EqualTo("run", run)).to_arrow().to_pylist()
    assert (result.steps, result.skipped_steps, result.incidents) == (9, 1, 1)
    [incident] = rows
    assert (incident["step"], incident["kind"], json.loads(incident["detail"])["action"]) == (9, "spike", "rollback")
    assert any("rolled back to ckpt/spike@8" in w for w in reporter.warnings), reporter.warnings
    rows = {r["step"]: r for r in checkpoints(lake, run)}
    assert sorted(rows) == [4, 8, 9]
    at8 = torch.load(rows[8]["uri"].removeprefix("file://"), weights_only=True)
    at9 = torch.load(rows[9]["uri"].removeprefix("file://"), weights_only=True)
    assert all(torch.equal(at8["model"][k], at9["model"][k]) for k in at8["model"])


@pytest.mark.slow
def test_truncated_latest_checkpoint_is_skipped_with_a_warning(shared_lake, reporter, training_env):
    lake, run = shared_lake, "truncated"
    first = train(plan_experiment(lake, experiment(steps=6, every=3)), lake, run=run, reporter=reporter)
    assert first.checkpoints == [f"ckpt/{run}@3", f"ckpt/{run}@6"]
    newest = checkpoint_dir(lake.home, run) / "step-00000006.pt"
    size = newest.stat().st_size
    with open(newest, "r+b") as f:
        f.truncate(size // 2)

    again = type(reporter)()
    result = train(plan_experiment(lake, experiment(steps=9, every=3)), lake, run=run, reporter=again)

    assert result.resumed_from == 3
    warned = [w for w in again.warnings if "step-00000006.pt" in w]
    assert len(warned) == 1 and "size mismatch" in warned[0], again.warnings
    assert any("resumed from" in line and "(step 3)" in line for line in again.logs), again.logs
    assert (result.steps, result.checkpoints) == (9, [f"ckpt/{run}@6", f"ckpt/{run}@9"])
    assert validate(newest) is None, "step 6 was saved again, whole"
    # steps 4-6 twice: trained (and logged) by the first launch, lost with its checkpoint, trained again
    assert [s for s, _ in metric(lake, run, "loss")] == [1, 2, 3, 4, 4, 5, 5, 6, 6, 7, 8, 9]


@pytest.mark.slow
def test_resumed_run_equals_uninterrupted_run_bit_for_bit(shared_lake, make_lake, training_env):
    short, full = experiment(steps=3, every=3), experiment(steps=6, every=3)
    # the 3-step launch stands in for a 6-step run killed after step 3: that holds only while
    # both schedules agree on steps 1-3 (smoke warms up over 10 steps, so they do)
    s = full.schedule
    assert [lr_at(i, 3, 1.0, s) for i in range(3)] == [lr_at(i, 6, 1.0, s) for i in range(3)]

    straight_lake, resumed_lake, run = shared_lake, make_lake("resumed"), "equal"
    straight = train(plan_experiment(straight_lake, full), straight_lake, run=run)
    part = train(plan_experiment(resumed_lake, short), resumed_lake, run=run)
    resumed = train(plan_experiment(resumed_lake, full), resumed_lake, run=run)

    assert (straight.resumed_from, part.steps, resumed.resumed_from) == (None, 3, 3)
    assert straight.steps == resumed.steps == 6
    a, b = final_payload(straight_lake, run), final_payload(resumed_lake, run)
    assert a["step"] == b["step"] == 6
    assert a["model"].keys() == b["model"].keys()
    differ = [k for k in a["model"] if not torch.equal(a["model"][k], b["model"][k])]
    assert differ == [], f"parameters differ after resuming: {differ}"
    moments = [(i, k) for i, st in a["optimizer"]["state"].items() for k in ("exp_avg", "exp_avg_sq")
               if not torch.equal(st[k], b["optimizer"]["state"][i][k])]
    assert moments == [], f"optimizer moments differ after resuming: {moments}"
    assert straight.final_loss == resumed.final_loss


@pytest.mark.slow
def test_fused_loss_trains_the_same_loss_curve(shared_lake, training_env):
    lake, curves = shared_lake, {}
    for fused in (False, True):
        run = f"fused-{str(fused).lower()}"
        train(plan_experiment(lake, experiment(steps=6, every=6).derive(fused_loss=fused)), lake, run=run)
        curves[fused] = [value for _, value in metric(lake, run, "loss")]
    plain, fused = curves[False], curves[True]
    assert len(plain) == len(fused) == 6
    worst = max(abs(a - b) / a for a, b in zip(plain, fused))
    assert worst < 1e-5, f"fused and unfused loss curves differ by {worst:.2e} relative: {plain} vs {fused}"
    assert plain[-1] < plain[0] - 0.1, f"the loss did not fall: {plain}"
