"""Validated overrides: `factory.overrides.override`, the launch overrides every training entry
point takes (`ExperimentConfig.with_run_overrides`), and their three users that used to skip or
reinvent validation — the `training_run` asset's run config, the `tokenizer` asset's overrides and
`python -m factory.train --steps/--checkpoint-every/--eval-every/--eval-suite`.

- `override` changes one field by dotted path and keeps the rest, replaces a whole section by
  plain key, re-validates a config object built with `model_copy(update=)`, and names the field;
- a bad launch override raises `OverrideError` naming the override and its value, from the
  asset's `TrainingRunConfig.apply` as from the CLI, which exits 2 naming the flag (`--steps`)
  with nothing created under `--home`;
- the tokenizer asset refuses `vocab_size=5` naming the field, before it opens the lake;
- `python -m factory.train --experiment smoke --steps 4 --checkpoint-every 2` trains 4 real
  steps (checkpoints 2 and 4, four loss rows) under the overridden experiment's run name.

Runs on CPU: the validation tests take milliseconds (plus ~2 s for the tokenizer asset's
Dagster run); the 4-step training builds a training lake (~3 s) and trains in process, Iceberg
metrics only (~5 s on 2 idle cores).
"""

from __future__ import annotations

import pytest
from dagster import materialize
from pydantic import ValidationError
from pyiceberg.expressions import EqualTo

from assets.tokenizer import tokenizer
from assets.train import TrainingRunConfig
from configs.experiments import smoke
from factory.experiments.spec import OverrideError
from factory.experiments.sweep import run_name
from factory.overrides import override
from factory.train.__main__ import main
from factory.train.checkpoint import checkpoints
from factory.train.config import CheckpointConfig
from resources import LakeResource


def test_override_by_dotted_path_keeps_the_rest_of_the_section():
    base = smoke()
    changed = override(base, {"checkpoint.every": 7, "optimizer.lr": 1e-3})
    assert (changed.checkpoint.every, changed.checkpoint.keep_last) == (7, base.checkpoint.keep_last)
    assert changed.optimizer.lr == 1e-3 and changed.optimizer.betas == base.optimizer.betas
    assert changed.model == base.model and base.checkpoint.every != 7, "the base is unchanged"


def test_override_revalidates_config_objects_and_names_the_field():
    base = smoke()
    unvalidated = CheckpointConfig().model_copy(update={"every": 0})  # model_copy skips validation
    with pytest.raises(ValidationError) as e:
        override(base, {"checkpoint": unvalidated})
    assert [err["loc"] for err in e.value.errors()] == [("checkpoint", "every")]
    with pytest.raises(ValidationError, match="n_heads=3 must divide d_model=128"):
        override(base, {"model.n_heads": 3})
    with pytest.raises(ValueError, match="cannot override name.first: name is not a section of ExperimentConfig"):
        override(base, {"name.first": "x"})


def test_run_overrides_replace_the_length_and_one_checkpoint_field():
    by_tokens = smoke().derive(steps=None, tokens=10_000_000)
    short = by_tokens.with_run_overrides(steps=4, checkpoint_every=2, eval_every=2, eval_suite="quick")
    assert (short.steps, short.tokens) == (4, None)
    assert (short.checkpoint.every, short.checkpoint.keep_last) == (2, by_tokens.checkpoint.keep_last)
    assert (short.eval_every, short.eval_suite) == (2, "quick")
    assert by_tokens.with_run_overrides() is by_tokens, "no overrides: the experiment itself"


@pytest.mark.parametrize(("given", "named", "says"), [
    ({"steps": 0}, "steps", "steps=0: Input should be greater than 0"),
    ({"checkpoint_every": 0}, "checkpoint_every", "checkpoint_every=0: Input should be greater than or equal to 1"),
    ({"eval_every": -2}, "eval_every", "eval_every=-2: Input should be greater than or equal to 1"),
    ({"eval_suite": "nope"}, "eval_suite", "eval_suite='nope': unknown eval suite 'nope'"),
])
def test_the_asset_run_config_names_a_bad_override(given, named, says):
    with pytest.raises(OverrideError) as e:
        TrainingRunConfig(**given).apply(smoke())
    assert e.value.override == named and says in str(e.value), str(e.value)


def test_tokenizer_asset_validates_its_overrides_before_opening_the_lake(tmp_path):
    home = tmp_path / "home"
    result = materialize([tokenizer], resources={"lake": LakeResource(home=str(home))}, raise_on_error=False,
                         run_config={"ops": {"tokenizer": {"config": {"vocab_size": 5}}}})
    assert not result.success
    [event] = result.get_step_failure_events()
    message = event.step_failure_data.error.to_string()
    assert "vocab_size" in message and "greater than or equal to 262" in message, message
    assert not home.exists(), "the lake was opened for a config that does not validate"


@pytest.mark.parametrize(("argv", "says"), [
    (["--steps", "0"], "argument --steps: experiment smoke: steps=0: Input should be greater than 0"),
    (["--steps", "four"], "argument --steps: invalid int value: 'four'"),
    (["--checkpoint-every", "0"], "argument --checkpoint-every: experiment smoke: checkpoint_every=0"),
    (["--eval-every", "0"], "argument --eval-every: experiment smoke: eval_every=0"),
    (["--eval-suite", "nope"], "argument --eval-suite: experiment smoke: eval_suite='nope': unknown eval suite"),
])
def test_cli_rejects_a_bad_override_naming_the_flag_with_exit_code_2(argv, says, tmp_path, capsys, training_env):
    home = tmp_path / "home"
    with pytest.raises(SystemExit) as e:
        main(["--experiment", "smoke", "--home", str(home), *argv])
    assert e.value.code == 2
    assert says in capsys.readouterr().err
    assert not home.exists(), "something was started for a rejected override"


@pytest.mark.slow
def test_cli_steps_override_trains_that_many_steps(make_lake, training_env):
    lake = make_lake("cli")
    training_env.setenv("FACTORY_TRACKER_BACKENDS", "iceberg")  # MLflow's store would add ~4 s
    run = run_name(smoke().with_run_overrides(steps=4, checkpoint_every=2))
    assert run != run_name(smoke()), "a shortened experiment is its own run"

    assert main(["--experiment", "smoke", "--steps", "4", "--checkpoint-every", "2", "--home", str(lake.home)]) == 0

    assert [(r["step"], r["checkpoint_id"]) for r in checkpoints(lake, run)] == [(2, f"ckpt/{run}@2"), (4, f"ckpt/{run}@4")]
    rows = lake.table("train.metrics").scan(row_filter=EqualTo("run", run)).to_arrow().to_pylist()
    assert sorted(r["step"] for r in rows if r["name"] == "loss") == [1, 2, 3, 4]
