"""The eval suite end to end on a real trained checkpoint: bits per byte per held-out source,
next-line completion, HumanEval in the sandbox — through vLLM — into `evals.results` /
`evals.samples` with lineage back to the source snapshots; re-evaluating replaces rows; the score
table shows the change from the previous checkpoint. Plus the tasks' building blocks. CPU.

What goes through the lake also runs on the Iceberg REST catalog (`trained_on_catalog`: `[sql]`,
and `[rest]` on the session's SeaweedFS with its run trained once on S3 tables): results, samples
and the lineage walk of a small suite scored with transformers (no vLLM), replaced by a re-run,
read back through a new client; and the held-out documents of the mix split. The vLLM suite
tests stay on sqlite."""

import pytest
from pyiceberg.expressions import EqualTo

from configs.evals import suite as named_suite
from factory.deploy import open_lake
from factory.evals import SuiteConfig, evaluate, results
from factory.evals.bpb import _windows
from factory.evals.completion import LineCompletionConfig, examples
from factory.evals.heldout import heldout_docs
from factory.infer import EngineConfig, export_checkpoint, open_engine
from factory.lake.lineage import LineageStore

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def evaluated(trained_checkpoints):
    """Both checkpoints evaluated with the quick suite (oldest first)."""
    lake, reports = trained_checkpoints.lake, []
    for checkpoint in trained_checkpoints.checkpoint_ids:
        export = export_checkpoint(lake, checkpoint)
        engine = open_engine(export, EngineConfig(kind="vllm"))
        step = int(checkpoint.rsplit("@", 1)[1])
        reports.append(evaluate(lake, export, engine, named_suite("quick"), tokens=step * 4096, log=lambda m: None))
    return lake, reports


def test_scores_land_in_iceberg_with_samples(evaluated):
    lake, (first, second) = evaluated
    assert first.eval_id == "eval/evalsmoke@4/quick" and second.eval_id == "eval/evalsmoke@8/quick"
    rows = [r for r in results(lake, "evalsmoke", "quick") if r["eval_id"] == second.eval_id]
    metrics = {(r["task"], r["metric"]): r for r in rows}
    for source in ("refined.package_docs", "refined.python_stdlib", "refined.site_packages", "all"):
        assert 0.5 < metrics[("bpb", source)]["value"] < 12
    assert metrics[("bpb", "refined.python_stdlib")]["n"] == 4
    assert metrics[("line_completion", "exact_match")]["n"] == 16
    assert 0.0 <= metrics[("humaneval", "pass@1")]["value"] <= 1.0 and metrics[("humaneval", "pass@1")]["n"] == 8
    assert {r["engine"] for r in rows} == {"vllm"} and {r["step"] for r in rows} == {8}
    samples = lake.table("evals.samples").scan().to_arrow().to_pylist()
    mine = [s for s in samples if s["eval_id"] == second.eval_id]
    assert sum(s["task"] == "humaneval" for s in mine) == 8
    assert {s["outcome"] for s in mine if s["task"] == "humaneval"} <= {"passed", "failed", "timeout", "oom", "crashed"}
    assert all(s["reference"] for s in mine if s["task"] == "line_completion")


def test_score_table_shows_the_change_from_the_previous_checkpoint(evaluated):
    _, (first, second) = evaluated
    assert first.previous_step is None and "| — |" in first.table
    assert second.previous_step == 4 and "(vs step 4)" in second.table
    assert "| bpb | all |" in second.table


def test_lineage_walks_from_a_score_to_the_source_snapshots(evaluated):
    lake, (_, second) = evaluated
    record = [r for r in lake.lineage.records() if r.version_id == second.eval_id][-1]
    assert record.kind == "eval" and record.upstream[0] == "export/evalsmoke@8"
    assert any(u.startswith("refined.python_stdlib@") for u in record.upstream)
    assert any(u.startswith("humaneval@") for u in record.upstream)

    seen = set()

    def walk(node):
        seen.add(node["version_id"])
        for child in node["upstream"]:
            walk(child)

    walk(LineageStore(lake).upstream_of(second.eval_id))
    assert {"export/evalsmoke@8", "ckpt/evalsmoke@8", "mix/default@v1"} <= seen
    assert any(v.startswith("refined.site_packages@") for v in seen)


def test_reevaluating_replaces_the_rows(evaluated):
    lake, (_, second) = evaluated
    before = len(results(lake, "evalsmoke", "quick"))
    export = export_checkpoint(lake, "ckpt/evalsmoke@8")
    suite = SuiteConfig(name="quick", tasks=[{"task": "bpb", "max_docs": 2, "max_bytes_per_doc": 256}])
    again = evaluate(lake, export, open_engine(export, EngineConfig(kind="vllm")), suite, tokens=1, log=lambda m: None)
    rows = [r for r in results(lake, "evalsmoke", "quick") if r["eval_id"] == again.eval_id]
    assert {r["task"] for r in rows} == {"bpb"}  # the old line_completion/humaneval rows are gone
    assert len(rows) == 4  # 3 sources + all
    assert len(results(lake, "evalsmoke", "quick")) == before - 7 + 4  # 4 bpb + 2 completion + 1 humaneval replaced


def test_scores_samples_and_lineage_land_in_the_catalog_of_the_run(trained_on_catalog):
    """Two tasks through transformers on step 8, then the same suite name with bpb only: the
    overwrite leaves only the new rows and samples (an Iceberg delete + append on either catalog)."""
    lake, profile = trained_on_catalog.lake, trained_on_catalog.profile
    eval_id = "eval/evalsmoke@8/lakecheck"
    export = export_checkpoint(lake, "ckpt/evalsmoke@8")
    engine = open_engine(export, EngineConfig(kind="transformers"))
    bpb = {"task": "bpb", "max_docs": 2, "max_bytes_per_doc": 256}
    suite = SuiteConfig(name="lakecheck", tasks=[bpb, {"task": "line_completion", "max_examples": 4}])

    def stored() -> tuple[list[dict], list[dict]]:
        reader = open_lake(profile, lake.home)  # a new client of the same catalog
        samples = reader.table("evals.samples").scan(row_filter=EqualTo("eval_id", eval_id)).to_arrow().to_pylist()
        return results(reader, "evalsmoke", "lakecheck"), samples

    report = evaluate(lake, export, engine, suite, tokens=8 * 4096, log=lambda m: None)
    rows, samples = stored()
    assert report.eval_id == eval_id and {r["eval_id"] for r in rows} == {eval_id}
    metrics = {(r["task"], r["metric"]): r for r in rows}
    assert 0.5 < metrics[("bpb", "all")]["value"] < 12 and metrics[("line_completion", "exact_match")]["n"] == 4
    assert {r["engine"] for r in rows} == {"transformers"}
    assert sum(s["task"] == "line_completion" for s in samples) == 4
    seen = set()

    def walk(node):
        seen.add(node["version_id"])
        for child in node["upstream"]:
            walk(child)

    walk(LineageStore(open_lake(profile, lake.home)).upstream_of(eval_id))
    assert {eval_id, "export/evalsmoke@8", "ckpt/evalsmoke@8", "mix/default@v1"} <= seen
    assert any(v.startswith("refined.python_stdlib@") for v in seen)

    evaluate(lake, export, engine, SuiteConfig(name="lakecheck", tasks=[bpb]), tokens=8 * 4096, log=lambda m: None)
    rows, samples = stored()
    assert {r["task"] for r in rows} == {"bpb"} and len(rows) == 4  # 3 sources + all
    assert not [s for s in samples if s["task"] == "line_completion"]


def test_windows_predict_every_token_exactly_once():
    ids = list(range(1000))
    windows = _windows(ids, 255)
    predicted = [t for w in windows for t in w[1:]]
    assert predicted == ids[1:] and all(len(w) <= 255 for w in windows)
    assert _windows([5, 6], 255) == [[5, 6]]


def test_line_completion_examples_are_deterministic_lines_of_the_file():
    source = "import os\n\n\ndef f(x):\n    y = x + 1\n    z = y * 2\n    return z + y\n"
    config = LineCompletionConfig(min_chars=5)
    cases = examples([("m.py", source)], config)
    assert cases == examples([("m.py", source)], config) and len(cases) == 1
    item, prompt, target = cases[0]
    assert target in ("    z = y * 2", "    return z + y") and not prompt.endswith("\n")
    assert source.startswith(prompt + "\n" + target)


def test_heldout_documents_follow_the_mix_split(trained_on_catalog):
    lake = trained_on_catalog.lake
    held = heldout_docs(lake, "mix/default@v1", "refined.python_stdlib")
    from factory.data.split import is_heldout

    assert held.docs and all(is_heldout(d.doc_id, 0.25) for d in held.docs)
    assert [d.doc_id for d in heldout_docs(lake, "mix/default@v1", "refined.python_stdlib", limit=2).docs] == \
           [d.doc_id for d in held.docs[:2]]


def test_suite_configs_reject_unknown_tasks_and_repeated_labels():
    with pytest.raises(ValueError, match="unknown eval task 'mmlu'"):
        SuiteConfig(name="x", tasks=[{"task": "mmlu"}])
    with pytest.raises(ValueError, match="task labels repeat"):
        SuiteConfig(name="x", tasks=[{"task": "bpb"}, {"task": "bpb"}])
    with pytest.raises(ValueError, match="unknown eval suite 'nope'"):
        named_suite("nope")
