"""`factory export | eval | evals` in process on the session's trained checkpoint: the equivalence
summary, the score table, and errors that name the checkpoint with exit code 1. CPU.

The commands run with `--home` only: the lake comes from the profile in FACTORY_DEPLOY_JSON. `export`
with the transformers engine, `evals` and the errors run on both catalogs (`trained_on_catalog`: `[sql]`, and
`[rest]` on the session's SeaweedFS, its run trained once on S3 tables); the vLLM `quick` suite
(HumanEval in the sandbox) stays on sqlite."""

from factory.cli import main
from factory.deploy import open_lake
from factory.evals import results
import pytest

pytestmark = pytest.mark.slow


def test_eval_prints_the_check_and_the_scores_then_evals_lists_them(trained_checkpoints, capsys):
    home = str(trained_checkpoints.lake.home)
    assert main(["eval", "evalsmoke@8", "--suite", "quick", "--home", home]) == 0
    out = capsys.readouterr().out
    assert "ours / transformers / vllm agree" in out and "eval/evalsmoke@8/quick" in out
    assert "| humaneval | pass@1 |" in out
    assert main(["evals", "--run", "evalsmoke", "--home", home]) == 0
    listed = capsys.readouterr().out
    assert "evalsmoke" in listed and "pass@1" in listed


def test_evals_lists_the_scores_in_the_profiles_lake(trained_on_catalog, run_rows, capsys):
    """Rows written with the project's writer for a run of their own (`listed`), listed by `evals`
    with `--home` only: the command found the catalog through the handed-down profile."""
    lake = trained_on_catalog.lake
    run_rows.evaluate(lake, "listed", 4, {"all": 1.25, "refined.python_stdlib": 1.5})
    assert [r["eval_id"] for r in results(open_lake(trained_on_catalog.profile, lake.home), "listed")] == [
        "eval/listed@4/heldout", "eval/listed@4/heldout"]
    assert main(["evals", "--run", "listed", "--home", str(lake.home)]) == 0
    listed = capsys.readouterr().out
    assert "listed" in listed and "16,384" in listed and "1.2500" in listed and "1.5000" in listed


def test_export_checks_by_default(trained_on_catalog, capsys):
    home = str(trained_on_catalog.lake.home)
    assert main(["export", "evalsmoke@8", "--engine", "transformers", "--home", home]) == 0
    out = capsys.readouterr().out
    assert "export/evalsmoke@8:" in out and "ours / transformers / transformers agree" in out


def test_unknown_checkpoint_exits_1_naming_it(trained_on_catalog, capsys):
    home = str(trained_on_catalog.lake.home)
    assert main(["export", "evalsmoke@3", "--home", home]) == 1
    assert "ckpt/evalsmoke@3: not in train.checkpoints" in capsys.readouterr().err
    assert main(["serve", "export/none@1", "--home", home]) == 1
    assert "export/none@1: not found in lineage" in capsys.readouterr().err


def test_evals_on_an_empty_lake_says_how_scores_appear(tmp_path, capsys):
    assert main(["evals", "--home", str(tmp_path)]) == 0
    assert "no eval results yet" in capsys.readouterr().out
