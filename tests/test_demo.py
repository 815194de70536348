"""`make demo`'s report (factory/demo): the closing summary states the lake's own numbers, each
phase shows the factory's progress and its time while everything else goes to the log file, and a
failing phase stops the demo with exit 1, naming the phase, its last lines and the log.

Runs on CPU: the summaries read the session's trained smoke run (`trained_checkpoints`, read only)
and a small lake written here; the phases are real child processes (short Python programs, and
`python -m factory.demo` itself with an unknown experiment: two `factory` commands, ~1-2 s idle).
"""

from __future__ import annotations

import datetime as dt
import io
import os
import subprocess
import sys
import textwrap

import pyarrow as pa
import pytest

from factory.demo.runner import Demo
from factory.demo.steps import StepFailed, ours
from factory.demo.summary import collect, render
from factory.home import CHECKOUT
from factory.lake import CommitStamp
from factory.lake.lineage import snapshot_record
from factory.lake.schemas import REFINED_DOCUMENTS, SYNTHETIC_DOCUMENTS, SYNTHETIC_REJECTED

RUN_ID = "c89126f8-219d-4011-8078-0f4cb3837d63"
INFO = f"2026-12-01 14:09:24 +0000 - dagster - INFO - demo_job - {RUN_ID} - raw__package_docs - "
EVENT = f"2026-12-01 14:10:41 +0000 - dagster - DEBUG - __ASSET_JOB - {RUN_ID} - 12861 - mix - STEP_START - "


def _summary_lines(summary, **kw) -> str:
    return "\n".join(render(summary, phases=[("ingest + refine + tokenizer", 72.4), ("train smoke", 95.0)],
                            setup_seconds=4.0, log="/home/demo.log", **kw))


def test_the_summary_states_the_trained_runs_numbers(trained_checkpoints):
    lake, run = trained_checkpoints.lake, trained_checkpoints.run
    summary = collect(lake, run, pipelines=[])

    from factory.train.checkpoint import checkpoints

    last = checkpoints(lake, run)[-1]
    loss = sorted((r["step"], r["value"]) for r in lake.table("train.metrics").scan().to_arrow().to_pylist()
                  if r["run"] == run and r["name"] == "loss")
    assert (summary.steps, summary.tokens) == (trained_checkpoints.steps, last["tokens"]) == (8, 8 * 2048)
    assert summary.loss == (loss[0], loss[-1]) and loss[0][0] == 1 and loss[-1][0] == 8
    rows = {name: lake.table(name).scan().to_arrow().num_rows for name in lake.tables()}
    assert summary.tables == rows

    text = _summary_lines(summary)
    assert f"{run}: 8 steps, {8 * 2048:,} tokens, loss {loss[0][1]:.3f} → {loss[-1][1]:.3f} (step 1 → 8)" in text
    assert f"{len(rows)} tables, {sum(rows.values()):,} rows" in text
    # the phases and setup are timed apart: setup, each phase, and the pipeline's total
    assert "setup (install)" in text and "1m12s" in text and "1m35s" in text
    assert ["pipeline", "2m47s"] in [line.split() for line in text.splitlines()]


def _refined_rows(source: str, n: int) -> pa.Table:
    rows = [{"doc_id": f"{source}{i:020d}", "source": source, "path": f"m{i}.py", "text": "x = 1\n",
             "language": "python", "kind": "code", "bytes": 6, "content_sha256": "0" * 64} for i in range(n)]
    return pa.Table.from_pylist(rows, schema=REFINED_DOCUMENTS.as_arrow())


def _synthetic(lake, name: str, accepted: int, rejected: int) -> None:
    now, stamp = dt.datetime.now(dt.timezone.utc), CommitStamp(asset_key=f"synthetic/{name}", config_hash="t")
    docs = [{"doc_id": f"{i:024d}", "source": name, "path": f"s{i}", "text": "def f(): pass", "language": "python",
             "kind": "code", "bytes": 13, "content_sha256": "0" * 64, "seed_id": f"s{i}", "agent_chain": ["port"],
             "export_id": None, "template_hash": "t", "verdicts": "{}", "attempts": 1, "batch_id": "b",
             "fields": "{}", "created_at": now} for i in range(accepted)]
    lake.commit(f"synthetic.{name}", pa.Table.from_pylist(docs, schema=SYNTHETIC_DOCUMENTS.as_arrow()), stamp,
                schema=SYNTHETIC_DOCUMENTS)
    if rejected:
        bad = [{"seed_id": f"r{i}", "stage": "length", "reason": "too short", "text": None, "fields": "{}",
                "attempts": 1, "batch_id": "b", "created_at": now} for i in range(rejected)]
        lake.commit(f"synthetic.{name}_rejected", pa.Table.from_pylist(bad, schema=SYNTHETIC_REJECTED.as_arrow()),
                    stamp, schema=SYNTHETIC_REJECTED)


def test_the_summary_states_drops_scores_and_synthetic_rows(lake, run_rows):
    from factory.data.refine.config import NormalizeConfig, QualityConfig, RefineConfig

    # a two-step pipeline whose steps' lineage rows hold their counts, as the refine assets write them
    pipeline = RefineConfig(source="notes", steps=[NormalizeConfig(), QualityConfig()])
    counts = [(40, 37, {"empty": 3}), (37, 30, {"too_short": 5, "repetitive_lines": 2})]
    for index, (rows_in, rows_out, dropped) in enumerate(counts):
        table, step = pipeline.table(index), pipeline.steps[index]
        stamp = CommitStamp(asset_key=table.replace(".", "/"), config_hash="t")
        lake.commit(table, _refined_rows("notes", rows_out), stamp, schema=REFINED_DOCUMENTS,
                    lineage=snapshot_record(table, stamp, step, metadata={
                        "rows_in": rows_in, "rows_out": rows_out, "dropped": dropped, "redactions": {}}))
    for step, loss in ((4, 6.5), (8, 5.25)):  # no train.metrics: the loss comes from the checkpoints
        run_rows.checkpoint(lake, "smoke-00000000", step, loss)
    run_rows.evaluate(lake, "smoke-00000000", 4, {"all": 3.5})
    run_rows.evaluate(lake, "smoke-00000000", 8, {"all": 2.75, "refined.notes": 2.5})
    _synthetic(lake, "porting", accepted=12, rejected=0)
    _synthetic(lake, "rephrase", accepted=3, rejected=5)

    summary = collect(lake, "smoke-00000000", [pipeline])
    assert [(d.source, d.rows_in, d.rows_out, d.dropped) for d in summary.drops] == [
        ("notes", 40, 30, {"too_short": 5, "empty": 3, "repetitive_lines": 2})]
    assert (summary.steps, summary.tokens, summary.loss) == (8, 8 * 4096, ((4, 6.5), (8, 5.25)))
    assert (summary.checkpoint, summary.suite) == ("ckpt/smoke-00000000@8", "heldout")  # the newest scored
    assert summary.scores[("bpb", "all")] == (2.75, 10)
    assert summary.synthetic == {"porting": (12, 0), "rephrase": (3, 5)}

    text = _summary_lines(summary, factory=".venv/bin/factory")
    assert "notes 40 → 30 documents (dropped 10: too_short 5, empty 3, repetitive_lines 2)" in text
    assert "loss 6.500 → 5.250 (step 4 → 8)" in text
    assert "2.750 bits per byte on held-out text (10 documents)" in text
    assert "porting 12 rows (0 rejected)" in text and "rephrase 3 rows (5 rejected)" in text
    assert ".venv/bin/factory lineage eval/smoke-00000000@8/heldout" in text and "make ui" in text
    assert "/home/demo.log" in text


def test_dagster_lines_are_sorted_into_ours_and_the_log():
    assert ours(INFO + "raw.package_docs: read 100/276") == "raw.package_docs: read 100/276"
    assert ours(INFO.replace(" INFO ", " WARNING ") + "spike at step 7") == "warning: spike at step 7"
    assert ours(EVENT + 'Started execution of step "mix".') is None  # Dagster's own event
    assert ours(INFO + "[pipes] external process successfully opened dagster pipes.") is None
    assert ours("(MainProcess pid=1906) WARNING 12-01 11:52:54 [cpu.py:224] Triton is not installed.") is None
    assert ours("/x/click/core.py:911: SupersessionWarning: Use 'dg launch --job <job_name>' instead.") is None


def _program(source: str) -> list[str]:
    return [sys.executable, "-c", textwrap.dedent(source)]


def test_a_phase_shows_our_progress_and_logs_the_rest(tmp_path):
    out = io.StringIO()
    demo = Demo(tmp_path / "home", log_path=tmp_path / "logs" / "demo.log", out=out)
    try:
        result = demo.phase("ingest", _program(f"""
            import sys, warnings
            print({INFO + 'raw.package_docs: new snapshot 1, 258 documents'!r})
            print({EVENT + 'Started execution of step'!r})
            warnings.warn("use dg launch instead", DeprecationWarning, stacklevel=1)
            print("Setting default log level to WARN.", file=sys.stderr)
        """))
    finally:
        demo.close()
    terminal, log = out.getvalue(), (tmp_path / "logs" / "demo.log").read_text()
    assert terminal.splitlines()[:2] == ["== ingest", "   raw.package_docs: new snapshot 1, 258 documents"]
    assert terminal.splitlines()[2].startswith("   done in ") and len(terminal.splitlines()) == 3
    for line in ("Started execution of step", "use dg launch instead", "Setting default log level to WARN."):
        assert line in log and line not in terminal
    assert demo.phases == [("ingest", result.seconds)]


def test_a_failing_phase_names_itself_its_last_lines_and_the_log(tmp_path):
    out = io.StringIO()
    demo = Demo(tmp_path / "home", log_path=tmp_path / "demo.log", out=out)
    try:
        demo.phase("deploy check", _program("print('ok')"))
        with pytest.raises(StepFailed) as failed:
            demo.phase("train smoke", _program("""
                import sys
                print("Traceback (most recent call last):")
                print("RuntimeError: the loader has no training documents", file=sys.stderr)
                sys.exit(3)
            """))
        demo.report_failure(failed.value)
    finally:
        demo.close()
    terminal = out.getvalue()
    assert failed.value.code == 3 and failed.value.step.name == "train smoke"
    assert "demo stopped: train smoke failed (exit 3 after" in terminal
    assert "   | RuntimeError: the loader has no training documents" in terminal
    assert f"everything it printed: {tmp_path / 'demo.log'}" in terminal
    assert [name for name, _ in demo.phases] == ["deploy check"]  # the failed phase has no time to report


def test_an_unknown_experiment_stops_the_demo_with_exit_1(tmp_path):
    home = tmp_path / "home"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FACTORY_", "DAGSTER_"))}
    done = subprocess.run([sys.executable, "-m", "factory.demo", "--home", str(home), "--experiment", "nosuch"],
                          cwd=CHECKOUT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stdout + done.stderr
    logs = list((home / "logs").glob("demo-*.log"))
    assert len(logs) == 1
    assert "== deploy check" in done.stdout and "demo stopped: register nosuch failed (exit 1" in done.stdout
    assert "no experiment 'nosuch' in configs/experiments" in done.stdout  # its last line, on the terminal
    assert f"everything it printed: {logs[0]}" in done.stdout
    assert "no experiment 'nosuch'" in logs[0].read_text()
    assert "ingest" not in done.stdout  # nothing after the failed phase ran


def test_dagster_phases_run_in_one_session_process_and_a_failing_one_stops_the_demo(tmp_path):
    """The `dagster` commands go to one long-lived process (jobs/cli_session.py), each still timed and
    failed on its own; a non-`dagster` phase still gets a process of its own (~3 s: Dagster's import)."""
    out = io.StringIO()
    (tmp_path / "home" / "dagster").mkdir(parents=True)  # an instance of Dagster's defaults
    demo = Demo(tmp_path / "home", log_path=tmp_path / "demo.log", out=out)
    try:
        demo.phase("version", [*demo.dagster, "--version"])
        session = demo.session.child.pid
        demo.phase("other program", _program("print('ok')"))
        demo.phase("version again", [*demo.dagster, "--version"])
        assert demo.session.child.pid == session
        with pytest.raises(StepFailed) as failed:
            demo.phase("materialize", [*demo.dagster, "asset", "materialize", "-m", "no_such_module", "--select", "x"])
        demo.report_failure(failed.value)
    finally:
        demo.close()
    assert demo.session.child is None  # closed
    terminal, log = out.getvalue(), (tmp_path / "demo.log").read_text()
    assert log.count("dagster, version ") == 2 and "dagster, version" not in terminal
    assert failed.value.code == 1 and failed.value.step.name == "materialize"
    assert "No module named 'no_such_module'" in "\n".join(failed.value.tail)
    assert "demo stopped: materialize failed (exit 1 after" in terminal and "asset materialize -m no_such_module" in terminal
    assert [name for name, _ in demo.phases] == ["version", "other program", "version again"]
    assert demo.session.marker not in log
