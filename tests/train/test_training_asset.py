"""The `training_run` asset through Dagster, and the configs it refuses.

Through `materialize([training_run], partition_key=SMOKE)` (the smoke experiment's run name,
`smoke-<hash8>`, added as a dynamic partition first) with the real resources
(`LakeResource` on a tmp lake, `TrackerResource` = MLflow on sqlite + Iceberg, and
`PipesSubprocessClient`, which starts `python -m factory.train` as a child process):

- kill -9 and relaunch: with `FACTORY_FAULTS={"kill_at_step": 5}` in the environment (Pipes hands
  the parent's environment to the child) the trainer SIGKILLs itself after step 5 and the
  materialization fails with step 3 as the last checkpoint; the relaunch without the fault
  resumes from step 3, saves steps 6 and 8, reports its summary (final loss, checkpoints, loss
  curve, card) as metadata, and ends with parameters bit-identical to an uninterrupted
  materialization in a second home;
- which failures a run's retry gets: a trainer that raised (exit 1 or 2) tags its run
  `dagster/retry_on_asset_or_op_failure=false` (it would fail the same way again); a kill
  (code -9) and a preemption do not;
- a lake without the mix, and `checkpoint_every=0`, fail in the asset body: nothing is launched
  (no `runs/` directory, no MLflow store).

On the Iceberg REST catalog (`[rest]`, the session's SeaweedFS; the asset's `LakeResource`
follows the profile the `catalog` fixture hands down in FACTORY_DEPLOY_JSON, and the asset hands
it to the trainer the same way):

- the bad configs above fail the same way, with no `train.checkpoints` row in the REST lake;
- a killed run of 4 steps (SIGKILL after step 3) and its relaunch, the profile given to the
  `LakeResource` as a file and named nowhere in the environment (so the trainer learns it only
  from the asset, through FACTORY_DEPLOY_JSON): both trainer subprocesses write to the REST lake
  — `train.checkpoints` holds steps 2 and 4, `train.metrics` one loss row per step (step 3's row
  died unflushed with the first process), lineage chains ckpt@4 to ckpt@2, every table lives in
  the profile's warehouse bucket — and no sqlite catalog appears under FACTORY_HOME (the trainer
  once opened the embedded catalog there, so its checkpoints and metrics landed in the wrong lake).

Without Dagster: `python -m factory.train --experiment-json` with an unknown field exits 2 naming
the field's path; a negative learning rate and heads that do not divide the width fail
`ExperimentConfig` validation naming `optimizer.lr` and `n_heads`.

Runs on CPU, one intra-op thread per process; no network beyond loopback. The Dagster and
subprocess tests are `slow` (~2 min on 2 cores for sqlite: three training processes of 8, 5 and 5
steps, each importing torch and MLflow; the REST tests add ~1 min: two processes of 3 and 2
steps, and a training lake built on S3 for each); the validation tests take milliseconds.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from dagster import AssetKey, DagsterInstance, PipesSubprocessClient, materialize
from pydantic import ValidationError

from assets.train import NO_RETRY, _on_failure, training_run
from configs.experiments import smoke
from factory.experiments.sweep import run_name
from factory.home import CHECKOUT, artifacts_dir
from factory.train.checkpoint import checkpoint_dir, checkpoints, latest_valid, load_checkpoint
from resources import LakeResource, TrackerResource

RUN_CONFIG = {"ops": {"training_run": {"config": {"steps": 8, "checkpoint_every": 3}}}}
SMOKE = run_name(smoke())


def materialize_smoke(home, run_config=RUN_CONFIG, instance: DagsterInstance | None = None, deploy: str | None = None):
    instance = instance or DagsterInstance.ephemeral()
    instance.add_dynamic_partitions("training_runs", [SMOKE])
    return materialize(
        [training_run], partition_key=SMOKE,
        resources={"lake": LakeResource(home=str(home), deploy=deploy), "tracker": TrackerResource(),
                   "pipes_subprocess_client": PipesSubprocessClient(cwd=str(CHECKOUT))},
        run_config=run_config, instance=instance, raise_on_error=False,
    )


def failure(result) -> str:
    """The error of the failed `training_run` step, with its causes."""
    [event] = result.get_step_failure_events()
    return event.step_failure_data.error.to_string()


def metadata(result) -> dict:
    [event] = [e for e in result.get_asset_materialization_events() if e.asset_key == AssetKey("training_run")]
    return {k: v.value for k, v in event.materialization.metadata.items()}


def run_log(instance: DagsterInstance, result) -> list[str]:
    """The messages of a Dagster run's log (the child's Pipes log lines among them)."""
    return [entry.user_message for entry in instance.all_logs(result.run_id)]


def final_model(lake) -> tuple[int, dict]:
    ref = latest_valid(checkpoint_dir(lake.home, SMOKE), log=pytest.fail)
    assert ref is not None
    return ref.step, load_checkpoint(ref)["model"]


@pytest.mark.slow
def test_killed_run_relaunches_from_its_last_checkpoint_and_matches_an_uninterrupted_one(make_lake, training_env):
    killed, straight = make_lake("killed"), make_lake("straight")

    training_env.setenv("FACTORY_FAULTS", json.dumps({"kill_at_step": 5}))
    first_instance = DagsterInstance.ephemeral()
    first = materialize_smoke(killed.home, instance=first_instance)
    assert not first.success
    assert "process failed with code -9" in failure(first), failure(first)  # -9: killed by SIGKILL
    # a kill is worth a retry (it resumes from the last checkpoint): the run is not tagged against one
    assert NO_RETRY.keys().isdisjoint(first_instance.get_run_by_id(first.run_id).tags)
    assert [r["step"] for r in checkpoints(killed, SMOKE)] == [3], "killed after step 5: step 3 is the last save"

    training_env.delenv("FACTORY_FAULTS")
    instance = DagsterInstance.ephemeral()
    second = materialize_smoke(killed.home, instance=instance)
    assert second.success, failure(second)
    resumed = [m for m in run_log(instance, second) if "resum" in m]
    assert any("resuming after step 3" in m for m in resumed), resumed
    meta = metadata(second)
    assert meta["checkpoints"] == [f"ckpt/{SMOKE}@6", f"ckpt/{SMOKE}@8"], "the relaunch saved only what it trained"
    assert [r["step"] for r in checkpoints(killed, SMOKE)] == [3, 6, 8]
    details = meta["details"]  # the page shows skipped steps and incidents only when there are some
    assert (details["steps"], details["skipped_steps"], details["incidents"]) == (8, 0, 0)
    assert isinstance(meta["final_loss"], float) and 3.0 < meta["final_loss"] < 6.5, meta["final_loss"]
    assert list(meta)[:2] == ["loss_curve", "card"]  # the page leads with them, both shown inline
    assert meta["loss_curve"].startswith("![") and "data:image/svg+xml;base64," in meta["loss_curve"]
    card = {r.data["field"]: r.data["value"] for r in meta["card"].records}
    assert card["experiment"].startswith("smoke: ") and card["length"].startswith("8 steps")
    assert details["mix_version"] == "mix/default@v1"
    assert details["deploy"] == "embedded: sql catalog under FACTORY_HOME, local launcher"

    third = materialize_smoke(straight.home)
    assert third.success, failure(third)
    assert metadata(third)["checkpoints"] == [f"ckpt/{SMOKE}@3", f"ckpt/{SMOKE}@6", f"ckpt/{SMOKE}@8"]

    (step_a, a), (step_b, b) = final_model(killed), final_model(straight)
    assert step_a == step_b == 8
    assert a.keys() == b.keys()
    differ = [k for k in a if not torch.equal(a[k], b[k])]
    assert differ == [], f"parameters differ between the relaunched and the uninterrupted run: {differ}"


def test_a_trainer_that_raised_is_not_retried_but_a_killed_one_is(make_lake):
    lake = make_lake("retry", tokenizer=False, mix=False)  # no train.incidents: no preemption to find

    class Context:  # the three things _on_failure reads: run id, log, instance
        run_id, tagged = "run-1", []
        log = type("Log", (), {"info": staticmethod(lambda message: None)})()
        instance = type("Instance", (), {"add_run_tags": lambda self, run_id, tags: Context.tagged.append(tags)})()

    for code, retried in (("1", False), ("2", False), ("-9", True), ("137", True)):
        Context.tagged = []
        _on_failure(Context, lake, SMOKE, RuntimeError(f"External execution process failed with code {code}"))
        assert Context.tagged == ([] if retried else [NO_RETRY]), code


@pytest.mark.slow
@pytest.mark.usefixtures("catalog")
def test_bad_configs_fail_in_the_asset_before_any_process_starts(make_lake, training_env):
    lake = make_lake("nomix", mix=False)  # refined tables and the tokenizer, no mix registered
    launched = [artifacts_dir(lake.home) / "runs", lake.home / "mlflow"]

    no_mix = materialize_smoke(lake.home)
    assert not no_mix.success
    message = failure(no_mix)
    assert "ExperimentError" in message and "mix: mix 'default' has no registered version" in message, message

    zero = materialize_smoke(lake.home, {"ops": {"training_run": {"config": {"steps": 8, "checkpoint_every": 0}}}})
    assert not zero.success
    assert "OverrideError" in failure(zero) and "checkpoint_every=0" in failure(zero), failure(zero)

    assert [p for p in launched if p.exists()] == [], "a training process was started"
    assert checkpoints(lake, SMOKE) == []


@pytest.mark.slow
@pytest.mark.parametrize("catalog", ["rest"], indirect=True)
def test_trainer_subprocesses_write_to_the_rest_lake_and_create_no_sqlite_catalog(catalog, make_lake, training_env):
    lake = make_lake("rest")
    home, short = lake.home, {"ops": {"training_run": {"config": {"steps": 4, "checkpoint_every": 2}}}}
    ids = [f"ckpt/{SMOKE}@2", f"ckpt/{SMOKE}@4"]
    # the resource gets the profile as a file and this process's environment names none, so the
    # trainer can only learn it from the asset (profile_env in the Pipes launch)
    deploy = home.parent / "rest-profile.json"
    deploy.write_text(catalog.profile.model_dump_json())
    training_env.delenv("FACTORY_DEPLOY_JSON")
    training_env.delenv("FACTORY_DEPLOY")

    training_env.setenv("FACTORY_FAULTS", json.dumps({"kill_at_step": 3}))
    first = materialize_smoke(home, short, deploy=str(deploy))
    assert not first.success and "process failed with code -9" in failure(first), failure(first)
    training_env.delenv("FACTORY_FAULTS")
    second = materialize_smoke(home, short, deploy=str(deploy))
    assert second.success, failure(second)
    assert metadata(second)["checkpoints"] == ids[1:], "the relaunch resumed after step 2"
    assert metadata(second)["details"]["deploy"] == f"{catalog.profile.name}: rest catalog {catalog.profile.catalog.uri}, local launcher"

    fresh = catalog.lake(home)  # a new client: what the two trainer processes committed
    assert [r["checkpoint_id"] for r in checkpoints(fresh, SMOKE)] == ids
    losses = [r for r in fresh.table("train.metrics").scan().to_arrow().to_pylist()
              if r["run"] == SMOKE and r["name"] == "loss"]
    assert sorted(r["step"] for r in losses) == [1, 2, 3, 4]
    lineage = {r.version_id: r for r in fresh.lineage.records() if r.kind == "checkpoint"}
    assert sorted(lineage) == ids and lineage[ids[1]].upstream[-1] == ids[0]
    warehouse = catalog.profile.catalog.warehouse + "/"
    for name in ("train.checkpoints", "train.metrics", "factory.lineage"):
        assert fresh.table(name).location().startswith(warehouse), name
    assert list(home.rglob("catalog.db")) == [] and not (home / "lake").exists(), "an embedded catalog was opened"


@pytest.mark.slow
def test_cli_rejects_an_unknown_field_with_its_path_and_exit_code_2(tmp_path, training_env):
    config = smoke().model_dump(mode="json")
    config["model"]["n_embd"] = 128  # nanoGPT's name for d_model
    done = subprocess.run([sys.executable, "-m", "factory.train", "--experiment-json", json.dumps(config),
                           "--home", str(tmp_path)], cwd=CHECKOUT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert "factory.train: error:" in done.stderr and "model.n_embd" in done.stderr, done.stderr
    assert "Extra inputs are not permitted" in done.stderr
    assert list(tmp_path.iterdir()) == [], "nothing is created for a config that does not parse"


def test_negative_learning_rate_names_optimizer_lr():
    base = smoke()
    with pytest.raises(ValidationError) as e:
        base.derive(optimizer={**base.optimizer.model_dump(), "lr": -3e-3})
    [error] = e.value.errors()
    assert error["loc"] == ("optimizer", "lr") and error["type"] == "greater_than"
    assert "optimizer.lr" in str(e.value)


def test_heads_not_dividing_the_width_name_n_heads():
    base = smoke()
    with pytest.raises(ValidationError) as e:
        base.derive(model={**base.model.model_dump(), "n_heads": 3})  # d_model 128
    [error] = e.value.errors()
    assert error["loc"] == ("model",)
    assert "n_heads=3 must divide d_model=128" in str(e.value)
