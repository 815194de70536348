"""RL sweeps: a `SweepConfig` whose base is an `RLConfig` (factory/experiments/sweep.py, queue.py,
launcher.py, results.py).

- expansion: cells are RLConfigs named by their run `<sweep>-<hash8>`, stable, blind to execution
  choices; param paths and values are checked against RLConfig (errors name the path, or the cell);
- queueing: `sweep_runs` checks the start checkpoint once and refuses an empty lake naming it; the
  requests target `rl_job`, partition = run name in `rl_runs`, config JSON that round-trips; the
  launcher adds the partitions to `rl_runs` and launches `rl_job` (a recording GraphQL stand-in);
- ranking: rollout rows written with `write_rollouts` into a real lake (`lake` fixture) rank the
  cells by the mean reward of their last 20 % of steps, higher first, also when read back; an eval
  metric ranks in the direction the sweep names.

CPU, no RL training, no servers: a few seconds (the rollout commits).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from configs.experiments.rl_toy import rl_toy
from configs.experiments.smoke import smoke
from factory.experiments import ExperimentError
from factory.experiments.launcher import GraphQL, submit
from factory.experiments.queue import RL_JOB, RL_PARTITIONS, sweep_runs
from factory.experiments.results import preview, ranked, write_sweep_results
from factory.experiments.sweep import REWARD_METRIC, SweepBudget, SweepConfig, expand
from factory.home import run_dir
from factory.lake import CommitStamp
from factory.posttrain.rl import RLConfig
from factory.posttrain.rl.store import ROLLOUTS_TABLE, write_rollouts

GRID = {"optimizer.lr": [1e-3, 3e-3], "rollout.group_size": [2, 4]}


def base(**changes) -> RLConfig:
    return RLConfig.model_validate({**rl_toy().model_dump(), "steps": 10, **changes})


def rl_sweep(name: str = "rlsweep", params: dict | None = None, **kw) -> SweepConfig:
    return SweepConfig(name=name, base=kw.pop("base", base()), params=params or GRID, **kw)


# -- expansion ------------------------------------------------------------------------------------
def test_cells_are_rl_configs_named_by_their_identity():
    sweep = rl_sweep()
    assert (sweep.metric, sweep.better) == (REWARD_METRIC, "higher")
    assert rl_sweep(metric="bpb/all").better == "lower"  # an eval metric: lower unless the sweep says higher
    training = SweepConfig(name="t", base=smoke(), params={"seed": [1]})
    assert (training.metric, training.better) == ("bpb/all", "lower")
    cells = expand(sweep)
    assert [(c.experiment.optimizer.lr, c.experiment.rollout.group_size) for c in cells] == [
        (1e-3, 2), (1e-3, 4), (3e-3, 2), (3e-3, 4)]
    for c in cells:
        assert isinstance(c.experiment, RLConfig) and c.experiment.steps == 10
        assert c.run == c.experiment.name == f"rlsweep-{c.experiment.identity_hash()[:8]}"
        assert re.fullmatch(r"rlsweep-[0-9a-f]{8}", c.run)
        assert RLConfig.model_validate_json(c.experiment.model_dump_json()).identity_hash() == c.experiment.identity_hash()
    runs = [c.run for c in cells]
    assert len(set(runs)) == 4 and [c.run for c in expand(rl_sweep())] == runs
    # execution and presentation choices do not make another run; what is learned does
    same = rl_sweep(base=base(scoring_workers=7, mode="async", description="other words"))
    assert [c.run for c in expand(same)] == runs
    assert not set(c.run for c in expand(rl_sweep(base=base(seed=1)))) & set(runs)
    assert [c.run for c in expand(rl_sweep("other"))] != runs  # the sweep's name prefixes the run


def test_bad_paths_values_and_budgets_are_named(lake):
    with pytest.raises(ValueError, match=r"'rollout\.group_sise' is not a field of RLConfig \('group_sise' unknown\)"):
        rl_sweep(params={"rollout.group_sise": [2]})
    with pytest.raises(ValueError, match="'global_batch' is not a field of RLConfig"):  # a training field
        rl_sweep(params={"global_batch": [8]})
    with pytest.raises(ValueError, match=r"params\.optimizer\.lr\[1\]: Input should be a finite number"):
        rl_sweep(params={"optimizer.lr": [1e-3, float("nan")]})
    with pytest.raises(ValueError, match=r"params\.grpo\.clip_eps\[1\]: Input should be less than 1"):
        rl_sweep(params={"grpo.clip_eps": [0.2, 1.5]})
    with pytest.raises(ExperimentError, match=r"cell 1 \{'rollout\.group_size': 1\}: rollout\.group_size: "
                                              r"group_size=1: .*group of one"):
        expand(rl_sweep(params={"rollout.group_size": [4, 1]}))
    with pytest.raises(ExperimentError, match="cells 0 and 1 are the same experiment"):
        expand(rl_sweep(params={"mode": ["sync", "async"]}))  # an execution choice: one identity
    with pytest.raises(ValueError, match="rollouts/reward ranks RL sweeps"):
        SweepConfig(name="t", base=smoke(), params={"seed": [1]}, metric=REWARD_METRIC)
    # rollout tokens at most: 10 steps x 8 prompts x (2 + 4 + 2 + 4) x 1 token = 960, before the lake is read
    with pytest.raises(ExperimentError, match="may sample up to 960 tokens, over budget.max_tokens=900"):
        sweep_runs(lake, rl_sweep(budget=SweepBudget(max_tokens=900)))


# -- queueing -------------------------------------------------------------------------------------
class RecordingGraphQL(GraphQL):
    """Answers `submit`'s two documents as Dagster would for runs it has never seen; keeps them."""

    def __init__(self):
        super().__init__("http://unused")
        self.calls = []

    def __call__(self, document: str, variables: dict | None = None) -> dict:
        self.calls.append((document, variables))
        if document.startswith("query"):
            return {f"h{i}": {"results": []} for i in range(document.count("runsOrError"))}
        n = document.count("launchRun(")
        return {**{f"p{j}": {"__typename": "AddDynamicPartitionSuccess"} for j in range(n)},
                **{f"r{j}": {"__typename": "LaunchRunSuccess", "run": {"runId": f"id{j}", "status": "QUEUED"}}
                   for j in range(n)}}


def test_cells_queue_as_rl_job_runs_of_their_partition(lake, monkeypatch):
    sweep = rl_sweep()
    with pytest.raises(ExperimentError, match=r"sweep rlsweep: rlsweep-[0-9a-f]{8}: start: .*ckpt/smoke@120"):
        sweep_runs(lake, sweep)  # an empty lake has no start checkpoint: refused before anything is queued
    assert not any(Path(run_dir(lake.home, c.run)).exists() for c in expand(sweep))  # not even a card

    import factory.posttrain.rl.config as rl_config

    checked = []
    monkeypatch.setattr(rl_config, "check_rl_config", lambda config, lake: checked.append(config.start))
    runs = sweep_runs(lake, sweep)
    cells = expand(sweep)
    assert checked == ["ckpt/smoke@120"]  # one start for all four cells: checked once
    assert [r.run for r in runs] == [c.run for c in cells]
    for r, c in zip(runs, cells):
        assert (r.job, r.partitions, r.steps) == (RL_JOB, RL_PARTITIONS, 10) == ("rl_job", "rl_runs", 10)
        assert list(r.run_config) == ["ops"] and list(r.run_config["ops"]) == ["rl_run"]
        config = RLConfig.model_validate_json(r.run_config["ops"]["rl_run"]["config"]["config_json"])
        assert config == c.experiment and config.name == r.run and r.config_hash == config.identity_hash()
        assert r.tags == {"factory/kind": "training", "dagster/priority": "-10", "dagster/max_retries": "3",
                          "factory/sweep": "rlsweep"}
        assert r.tokens == 10 * 8 * c.experiment.rollout.group_size * 1
        card = Path(r.card_path)
        assert card.read_text().startswith(f"# RL run `{r.run}`") and "rl_job" in card.read_text()

    gql = RecordingGraphQL()
    submitted = submit(runs, gql)
    assert [s.run_id for s in submitted] == ["id0", "id1", "id2", "id3"]
    (query, _), (mutation, variables) = gql.calls
    assert query.count("dagster/partition") == 4
    assert mutation.count('partitionsDefName: "rl_runs"') == 4 and "training_runs" not in mutation
    for j, r in enumerate(runs):
        e = variables[f"e{j}"]
        assert variables[f"k{j}"] == r.run and e["selector"]["jobName"] == "rl_job"
        assert e["runConfigData"] == r.run_config
        assert {"key": "dagster/partition", "value": r.run} in e["executionMetadata"]["tags"]


# -- ranking --------------------------------------------------------------------------------------
STAMP = CommitStamp(asset_key="test", config_hash="")


def sample(reward: float, used: bool = True) -> dict:
    return {"policy_version": 0, "lag": 0, "task_id": "toy/add", "env_digest": "", "group": 0, "sample": 0,
            "completion": "1", "completion_tokens": 1, "finish_reason": "stop", "reward": reward, "advantage": 0.0,
            "outcome": "passed" if reward else "failed", "reason": "", "attempt_key": "a" * 64, "used": used}


def write_run(lake, run: str, rewards: dict[int, list[float]], dropped: dict[int, list[float]] | None = None) -> None:
    """One commit per step, as the loop writes them; `dropped`: samples too stale to be used."""
    for step, values in sorted(rewards.items()):
        rows = [sample(v) for v in values] + [sample(v, used=False) for v in (dropped or {}).get(step, [])]
        for i, row in enumerate(rows):
            row["sample"] = i
        write_rollouts(lake, run, step, rows, STAMP)


def test_cells_rank_by_their_final_reward_higher_first(lake, run_rows):
    sweep = rl_sweep("rlrank", params={"optimizer.lr": [1e-3, 2e-3, 3e-3]})
    c0, c1, c2 = (c.run for c in expand(sweep))
    # c0 starts well and ends at 0.5 (steps 9-10 = its last 20 %); a dropped sample's 1.0 does not count
    write_run(lake, c0, {s: [1.0, 1.0] if s <= 8 else [0.0, 1.0] for s in range(1, 11)}, dropped={10: [1.0, 1.0]})
    # c1 is still running (5 of 10 steps): it starts at 0 and its last step (20 % of 5) is 0.75
    write_run(lake, c1, {1: [0.0, 0.0], 2: [0.0, 0.0], 3: [0.0, 0.5], 4: [0.5, 0.5], 5: [0.5, 1.0]})
    run_rows.checkpoint(lake, c0, 10, loss=0.3)  # c2: nothing yet

    report = preview(lake, sweep)
    assert [(e["rank"], e["run"], e["value"], e["status"], e["step"]) for e in report.ranking] == [
        (1, c1, 0.75, "trained", 5), (2, c0, 0.5, "trained", 10), (3, c2, None, "pending", None)]
    assert report.ranking[1]["checkpoint_id"] == f"ckpt/{c0}@10" and report.ranking[1]["train_loss"] == 0.3
    assert report.ranking[1]["stderr"] == pytest.approx((1 / 3) ** 0.5 / 2)  # sample std of [0, 1, 0, 1] / sqrt(4)
    assert report.best["run"] == c1 and report.counts == {"evaluated": 0, "trained": 2, "pending": 1}
    assert report.table.splitlines()[0].startswith("| rank | run | params | rollouts/reward |")

    written = write_sweep_results(lake, sweep)
    rows = lake.table("sweeps.results").scan().to_arrow().to_pylist()
    assert sorted((r["run"], r["task"], r["metric"], r["rank"]) for r in rows) == sorted(
        [(c1, "rollouts", "reward", 1), (c0, "rollouts", "reward", 2), (c2, None, None, 3)])
    assert all(r["ranked_by"] == REWARD_METRIC for r in rows)
    summary = lake.table("sweeps.results").current_snapshot().summary
    assert ROLLOUTS_TABLE in json.loads(summary["factory.upstream-snapshots"])  # the rollouts snapshot it ranked
    back = ranked(lake, "rlrank")  # read back without the sweep config: the stored ranks keep "higher first"
    assert [(e["rank"], e["run"], e["value"]) for e in back] == [
        (e["rank"], e["run"], e["value"]) for e in written.ranking]

    # an eval metric the sweep names ranks the same cells by evals.results, in the direction it names
    run_rows.evaluate(lake, c0, 10, {"all": 1.2})
    run_rows.evaluate(lake, c2, 10, {"all": 1.5})
    lower = preview(lake, rl_sweep("rlrank", params={"optimizer.lr": [1e-3, 2e-3, 3e-3]}, metric="bpb/all"))
    assert [(e["run"], e["value"], e["status"]) for e in lower.ranking] == [
        (c0, 1.2, "evaluated"), (c2, 1.5, "evaluated"), (c1, None, "trained")]
    higher = preview(lake, rl_sweep("rlrank", params={"optimizer.lr": [1e-3, 2e-3, 3e-3]}, metric="bpb/all",
                                    better="higher"))
    assert [e["run"] for e in higher.ranking] == [c2, c0, c1]
