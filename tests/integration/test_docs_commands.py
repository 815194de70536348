"""Every command the README and the module docstrings show runs, against the home `make demo` leaves.

Commands are read from the docs as they are now, so a new example is tested without editing this
file: README.md's fenced code blocks (lines that start with `factory`, `.venv/bin/factory`,
`.venv/bin/dagster`, `.venv/bin/python`, `make`, optionally after `VAR=value` or `RUN=$(`,
with `\\` continuations joined) and the indented `factory ...` example lines of every module
docstring under factory/ (the CLI's list, the sweep results' query ...). Each is run by bash from
the checkout, `factory` on PATH, against the `demo_home` fixture (or FACTORY_TEST_DEMO_HOME, see
tests/integration/conftest.py). It must exit 0 without a "Traceback"; for some, the output must
show a real outcome (`factory evals --run smoke` prints a pass@1 column, an experiment's name
resolves to the demo's run ...). Placeholders are filled from the demo home: `smoke-<hash8>` is
the smoke run, `[--option]` is left out, `/tmp/lake`, `/tmp/k8s` and `my_sources.yaml` become
scratch paths.

What a command may do to the shared demo home decides how it runs:
- reads, and writes that change nothing (an unchanged mix, nothing to heal): against the demo home;
- `factory ingest`: against a scratch FACTORY_HOME (it would add a raw snapshot the sensors see);
- `factory serve`: started for real, on a free port, until it answers; stopped by PID;
- `make X` (but `make demo`): `make -n X` shows the target exists and runs what the docs say
  (`make test` pytest, `make ui` dagster dev, ...); `make clean` must not delete the demo home;
- everything that trains, queues runs or needs a cluster: not skipped silently — `ELSEWHERE`
  names the test that exercises it, and a test checks that each named test exists.

Marked `slow`: the fixture's `make demo` (~5 min, or none when reused), then ~6 min of commands
on a loaded 2-core machine (each `factory` process imports its stack; `factory export` alone took
116 s: its equivalence check loads two models; the two `factory serve` ~20 s each).
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent

_START = r"(?:[A-Z_]+=\S+\s+)*(?:RUN=\$\()?(?:\.venv/bin/)?(?:factory|dagster|python|make)\s"
COMMAND = re.compile(_START)
DOCSTRING_EXAMPLE = re.compile(r"^\s{4,}((?:\.venv/bin/)?factory\s.*)$")

# Commands not run here, each with the test that exercises what it does (first match wins).
ELSEWHERE: list[tuple[str, str, str]] = [
    (r"^make demo\b", "tests/integration/conftest.py::demo_home", "the fixture these commands run against"),
    (r"^FACTORY_DEPLOY=loopback ", "tests/deploy/test_spark_cluster.py::"
     "test_the_chain_on_the_cluster_over_rest_and_s3_decides_like_local", "needs the loopback cluster up"),
    (r"factory sweep run\b", "tests/experiments/test_sweep_run.py::test_each_cell_trains_into_the_rest_lake",
     "trains every cell (minutes)"),
    (r"factory sweep launch\b.*--url", "tests/integration/test_sweep_queue.py::"
     "test_sweep_launch_queues_every_cell_through_the_webserver", "needs the webserver of `make ui`"),
    (r"factory sweep launch\b", "tests/integration/test_sweep_queue.py::"
     "test_experiment_submit_without_a_server_queues_into_the_instance_once",
     "queues runs into the demo's instance, which `make ui`'s daemon would start (the same no-server path, jobs/queue_runs.py)"),
    (r"factory automix\b", "tests/experiments/test_automix.py::"
     "test_register_proposal_makes_a_mix_version_whose_lineage_reaches_the_proxies",
     "needs the automix sweep trained first"),
    (r"factory lineage mix/automix@", "tests/experiments/test_automix.py::"
     "test_register_proposal_makes_a_mix_version_whose_lineage_reaches_the_proxies",
     "exists once `factory automix` registered it"),
    (r"dagster asset materialize\b", "tests/integration/test_cli_materialize.py::test_asset_materialize_from_the_shell",
     "materializes (new snapshots the sensors react to); `make demo` runs the same commands"),
    (r"-m torch\.distributed\.run\b",
     "tests/train/test_ddp.py::test_clean_run_checkpoints_every_two_steps_without_incidents",
     "trains smoke_ddp on two processes"),
    (r"-m factory\.train\b", "tests/train/test_training_asset.py::"
     "test_killed_run_relaunches_from_its_last_checkpoint_and_matches_an_uninterrupted_one",
     "the trainer's command line; on the demo home it would train"),
    (r"factory metrics serve\b", "tests/health/test_metrics.py::test_factory_metrics_serve_answers_on_loopback",
     "a server (until stopped); that test serves the demo-like multiprocess files over HTTP"),
    (r"factory envs mirror\b", "tests/envs/test_envs_commands.py::test_mirror_copies_the_demo_set_and_is_idempotent",
     "fetches from the package index (network); the test mirrors from the local mirror"),
    (r"factory envs build\b", "tests/envs/test_envs_commands.py::test_build_the_demo_set_from_the_mirror",
     "builds (new envs.builds rows); `make demo` built the demo set"),
    (r"factory envs image\b", "tests/envs/test_env_image.py::test_environment_image_runs_its_tests_offline",
     "builds images with buildah (the image storage, not the demo home)"),
    (r"-m factory\.posttrain\.rl\b", "tests/dagster/test_rl_asset.py::"
     "test_a_killed_rl_run_resumes_through_dagster_and_counts_no_rollout_twice",
     "trains (an RL run of minutes); the test runs the same entry point through the rl_run asset"),
    (r"-m factory\.posttrain\.sft\b", "tests/posttrain/test_sft_serve.py::"
     "test_sft_lowers_the_heldout_loss_and_the_export_chats",
     "trains (an SFT run); the test runs the same entry point through the sft_run asset"),
    (r"factory podium\b",
     "tests/podium/test_podium_command.py::test_factory_podium_serves_on_loopback_and_signs_in_by_link",
     "a web server (until stopped); that test starts it on loopback and signs in by its printed link"),
    (r"factory eval\s", "tests/evals/test_commands.py::test_eval_prints_the_check_and_the_scores_then_evals_lists_them",
     "evaluates with vLLM (minutes on CPU); `factory evals` here reads what the demo scored"),
]
# `make` targets that start servers or the whole suite: `make -n` must show the program they run,
# and where a test runs the target's servers for real, it is named (checked like ELSEWHERE).
MAKE_DRY_RUN: dict[str, tuple[str, str | None]] = {
    "test": ("-m pytest", None),  # the suite itself
    "check": ("-m check", None),  # its fast hermetic tier
    "ui": ("dagster dev", "tests/integration/test_make_ui.py::"
                          "test_stopping_make_ui_stops_the_webserver_daemon_code_server_and_run_workers"),
    "mlflow": ("mlflow ui", None),
    "podium": ("factory podium", "tests/podium/test_podium_command.py::"
                                 "test_factory_podium_serves_on_loopback_and_signs_in_by_link"),
    "cluster-up": ("factory deploy up", "tests/deploy/test_deploy_up.py::"
                                        "test_up_records_pids_the_probes_pass_and_down_stops_them"),
    "cluster-down": ("factory deploy down", "tests/deploy/test_deploy_up.py::"
                                            "test_up_records_pids_the_probes_pass_and_down_stops_them"),
}
# Scratch FACTORY_HOME instead of the demo's (the command writes what the demo's sensors would see).
SCRATCH = re.compile(r"factory ingest\b")
# Commands that only read the demo home, or write a scratch FACTORY_HOME or directory of their own.
READS = re.compile(r"factory (tables|drops|sql|lineage|evals|mix (show|peek)|sweep (list|show|results)|envs builds|"
                   r"deploy (list|show|check|render)|ingest)\b|-m factory\.health\.dashboards\b")
# ... and what writes, or reads what a write of the docs makes (`sweeps.results`, from `--write`)
WRITES = re.compile(r"--write\b|sweeps\.results")
# Outcomes beyond exit 0: a regex the output must match (`{run}`: the smoke run's id).
OUTCOMES: list[tuple[str, str]] = [
    (r"factory evals --run smoke\b", r"pass@1"),
    (r"factory tables\b", r"raw\.python_stdlib"),
    (r"factory drops\b", r"near_duplicate"),
    (r"factory lineage ckpt/smoke@120\b", r"ckpt/{run}@120"),
    (r"factory lineage raw\.site_packages\b", r"raw\.site_packages@\d+"),
    (r"factory export smoke@120\b", r"export/{run}@120"),
    (r"factory mix show default\b", r"mix/default@v1"),
    (r"factory experiment submit smoke\b", r"queued 0 run.*unchanged"),  # the demo trained it: nothing queued
    (r"factory sweep results smoke_lr\b", r"4 cells: 4 pending"),
    (r"factory ingest python_stdlib\b", r"raw\.python_stdlib"),
    (r"factory deploy render --deploy kubernetes\b", r"values\.yaml"),
    (r"factory envs builds --repos demo\b", r"termcolor.*passed"),
    (r"from tasks\.function_completion", r"\d+ rows"),
    # writes that must find nothing to do on a finished demo (so the shared home stays as it was)
    (r"factory mix register default(_synthetic)?$", r"unchanged"),
    (r"factory lake heal\b", r"\b0 lineage rows written"),
]


# -- extraction -----------------------------------------------------------------------------------
def readme_commands(text: str) -> list[str]:
    """Command lines of the README's fenced blocks, continuations joined, in order."""
    commands, fenced, pending = [], False, None
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced, pending = not fenced, None
            continue
        if not fenced:
            continue
        if pending is not None:
            line = pending + " " + line.strip()
        elif not COMMAND.match(line.strip() + " "):
            continue
        if line.rstrip().endswith("\\"):
            pending = line.rstrip()[:-1].rstrip()
            continue
        pending = None
        commands.append(line.strip())
    return commands


def docstring_commands(package: Path = ROOT / "factory") -> list[tuple[str, str]]:
    """(module, command) of every indented `factory ...` line in a module docstring under `package`."""
    found = []
    for path in sorted(package.rglob("*.py")):
        doc = ast.get_docstring(ast.parse(path.read_text(), str(path)), clean=False) or ""
        found += [(str(path.relative_to(ROOT)), m.group(1).strip()) for line in doc.splitlines()
                  if (m := DOCSTRING_EXAMPLE.match(line))]
    return found


def without_comment(command: str) -> str:
    """`command` up to a shell comment (a `#` after a blank, outside quotes)."""
    quote = None
    for i, c in enumerate(command):
        if quote:
            quote = None if c == quote else quote
        elif c in "'\"":
            quote = c
        elif c == "#" and (i == 0 or command[i - 1].isspace()):
            return command[:i].rstrip()
    return command.rstrip()


def documented() -> list[tuple[str, str]]:
    """(where, command without its comment), README first, each command once (`.venv/bin/factory x`
    and `factory x` are one)."""
    seen, out = set(), []
    for where, command in [("README.md", c) for c in readme_commands((ROOT / "README.md").read_text())] \
            + docstring_commands():
        command = without_comment(command)
        key = re.sub(r"(^|\s|\()\.venv/bin/", r"\1", command)
        if key not in seen:
            seen.add(key)
            out.append((where, command))
    return out


def elsewhere(command: str) -> tuple[str, str] | None:
    return next(((test, why) for pattern, test, why in ELSEWHERE if re.search(pattern, command)), None)


def make_target(command: str) -> str | None:
    """The target of a `make X` line (but `make demo`, the fixture itself): never run for real here
    (`make clean` would delete the demo home, `make ui` would not return)."""
    match = re.match(r"^make\s+([\w-]+)", command)
    return match.group(1) if match and match.group(1) != "demo" else None


def is_serve(command: str) -> bool:
    return re.search(r"factory serve\s", command) is not None


def reads(command: str) -> bool:
    """A command that writes nothing to the demo home and reads nothing another one writes (READS, and
    not WRITES): under `make test` these run on a second worker beside the others (the `demo_reads`
    marker, tests/conftest.py); whatever writes, and `factory doctor` (which would see a commit
    half-way), stays on the first, in order."""
    return bool(READS.search(command)) and not WRITES.search(command)


def _runnable(command: str) -> bool:
    return not (elsewhere(command) or make_target(command) or is_serve(command))


DOCUMENTED = documented()


# -- running ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def demo(demo_home) -> dict:
    """The demo's environment, `factory` on PATH, and the smoke run's id (`{run}`)."""
    from factory.lake import Lake

    lake = Lake.open(home=Path(demo_home["FACTORY_HOME"]))
    runs = sorted({r for r in lake.table("train.checkpoints").scan(selected_fields=("run",)).to_arrow()
                   .column("run").to_pylist() if re.fullmatch(r"smoke-[0-9a-f]{8}", r)})
    assert len(runs) == 1, f"the demo home should have one smoke run, has {runs}"
    return {"env": {**demo_home, "PATH": f"{BIN}{os.pathsep}{demo_home.get('PATH', '')}", "COLUMNS": "200"},
            "run": runs[0]}


def fill(command: str, run: str, scratch: Path) -> str:
    """The command as a user would type it on the demo home (see the module docstring)."""
    command = re.sub(r"\s\[-[^\]]*\]", "", command)  # `[--suite quick]`: optional, left out
    command = command.replace("smoke-<hash8>", run).replace("<hash8>", run.split("-")[1])
    command = command.replace("/tmp/lake", str(scratch / "lake")).replace("/tmp/k8s", str(scratch / "k8s"))
    return re.sub(r"\bmy(?:_sources)?\.yaml\b", str(scratch / "my_sources.yaml"), command)


def write_sources_yaml(scratch: Path) -> None:
    """The README's `my_sources.yaml`, its local `notes` source given a file to read."""
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"```\w*\n# my_sources\.yaml\n(.*?)```", readme, re.S)
    text = block.group(1) if block else "notes:\n  kind: directory\n  root: notes\n  include: ['**/*.md']\n"
    (scratch / "my_sources.yaml").write_text(text)
    (scratch / "notes").mkdir(exist_ok=True)
    (scratch / "notes" / "readme.md").write_text("# Notes\n\nA short note the notes source ingests.\n")


def get_json(url: str):
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.loads(response.read())


def run_command(command: str, env: dict, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", command], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)


def check_outcome(command: str, output: str, run: str) -> None:
    for pattern, want in OUTCOMES:
        if re.search(pattern, command):
            assert re.search(want.replace("{run}", run), output), f"{command!r}: no {want!r} in:\n{output[-3000:]}"


# -- tests ------------------------------------------------------------------------------------------
def test_the_docs_yield_their_commands():
    """The extraction still finds what the docs show (a README rewrite must not make this vacuous)."""
    cli = [c for where, c in DOCUMENTED if where == "factory/cli.py"]
    assert len(cli) >= 5 and "factory export smoke@120" in cli, cli
    readme = [c for where, c in DOCUMENTED if where == "README.md"]
    assert len(readme) >= 20, readme
    assert any(c.startswith("make demo") for c in readme)
    assert all("\\" not in c.split("'")[0] for c in readme), "continuations are joined"


def test_the_extraction_joins_continuations_and_leaves_prose_and_data_alone():
    text = ("Run `factory tables` first.\n```bash\n# a comment line\n.venv/bin/factory sql \"select 1 # not a comment\""
            "   # a comment\nRUN=$(.venv/bin/factory experiment register smoke)\n.venv/bin/dagster asset materialize \\\n"
            "  --select mix --partition default\nexport X=1\n```\n```yaml\nnotes:\n  kind: directory\n```\n"
            "```\nFACTORY_DEPLOY=loopback make demo   # on the cluster\n```\n")
    assert [without_comment(c) for c in readme_commands(text)] == [
        '.venv/bin/factory sql "select 1 # not a comment"', "RUN=$(.venv/bin/factory experiment register smoke)",
        ".venv/bin/dagster asset materialize --select mix --partition default", "FACTORY_DEPLOY=loopback make demo"]
    assert fill("factory eval smoke-<hash8>@120 [--suite quick]", "smoke-0123abcd", Path("/s")) == \
        "factory eval smoke-0123abcd@120"


def test_every_command_not_run_here_names_a_test_that_exists():
    named = [(pattern, test, why) for pattern, test, why in ELSEWHERE]
    named += [(f"make {target}", test, "its servers, run for real") for target, (_, test) in MAKE_DRY_RUN.items() if test]
    for pattern, test, why in named:
        path, name = test.split("::")
        source = (ROOT / path).read_text() if (ROOT / path).is_file() else ""
        assert re.search(rf"^def {name}\(", source, re.M), f"{pattern}: {test} does not exist ({why})"
    skipped = {c: elsewhere(c) for _, c in DOCUMENTED if elsewhere(c)}
    print("\n".join(f"not run here: {c}  ->  {t[0]} ({t[1]})" for c, t in skipped.items()))


@pytest.mark.parametrize("where, command", [pytest.param(*d, marks=[pytest.mark.demo_reads] if reads(d[1]) else [])
                                            for d in DOCUMENTED if _runnable(d[1])],
                         ids=[d[1][:80] for d in DOCUMENTED if _runnable(d[1])])
def test_a_documented_command_runs_on_the_demo_home(where, command, demo, tmp_path):
    env = dict(demo["env"])
    if SCRATCH.search(command):
        env |= {"FACTORY_HOME": str(tmp_path / "home"), "DAGSTER_HOME": str(tmp_path / "home" / "dagster")}
        write_sources_yaml(tmp_path)
    filled = fill(command, demo["run"], tmp_path)
    started = time.monotonic()
    done = run_command(filled, env)
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"{where}: `{filled}` exited {done.returncode}:\n{output[-3000:]}"
    assert "Traceback" not in output, f"{where}: `{filled}` printed a traceback:\n{output[-3000:]}"
    check_outcome(command, output, demo["run"])
    print(f"{time.monotonic() - started:5.1f} s  {filled}")


@pytest.mark.parametrize("target", sorted({t for _, c in DOCUMENTED if (t := make_target(c))}))
def test_a_documented_make_target_runs_what_the_docs_say(target):
    done = subprocess.run(["make", "-n", target], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    program = MAKE_DRY_RUN.get(target, ("", None))[0]
    assert program in done.stdout, f"make {target} does not run {program}:\n{done.stdout}"


@pytest.mark.parametrize("command", [c for _, c in DOCUMENTED if is_serve(c)])
def test_factory_serve_answers_and_stops_by_pid(command, demo, server, free_port, tmp_path, wait_up):
    filled = fill(command, demo["run"], tmp_path)
    proc = server("serve", ["bash", "-c", f"exec {filled} --port {free_port}"], {**demo["env"], "OMP_NUM_THREADS": "1"},
                  whole_group=True)
    models = wait_up(lambda: get_json(f"http://127.0.0.1:{free_port}/v1/models"), proc, tmp_path / "serve.log",
                     300, f"`{filled}`", errors=OSError)
    assert [m["id"] for m in models["data"]] == [f"export/{demo['run']}@120"]
    # the fixture's teardown stops the server's process group by PID
