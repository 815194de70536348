"""Scale by simulation, and the cost of the cluster engines, on this machine's 2 cores.

Three sections, each selectable (all run when none is named):

--simulate  One embedded (sqlite) lake, filled in bulk Arrow appends with rows shaped exactly like
            the real ones (factory.lake.schemas): R runs x 100 checkpoints in `train.checkpoints`,
            and per checkpoint its lineage rows — the checkpoint (upstream: mix version, tokenizer,
            previous checkpoint), its export and one eval per suite (8 by default), ~10 rows — plus
            500 small refined tables with their snapshot rows, a tokenizer and 10 mix versions.
            The lake grows in place through the sizes (10k, 100k, optionally 1M checkpoint rows)
            and at each size we time, with the factory's own functions:
              - commit: `record_checkpoint` of a few new checkpoints (each a checkpoints commit and
                a lineage commit), which is also what the next tick finds;
              - tick: `due_checkpoints` with the cursor from before those commits (the eval
                sensor's whole body without Dagster);
              - lineage: `describe` (what `factory lineage` prints) of the newest eval — up through
                every checkpoint of its run to the sources — and of a run's first checkpoint —
                down through the run;
              - mix: `register_mix_version` of a new mix over the 500 refined tables.
            The table prints seconds per operation and the growth per 10x rows (1.0 = constant,
            10 = linear).
--spark     The refinement chain on a small corpus, Spark local[2] against the two-worker
            standalone cluster (`factory.deploy.spark_cluster`) on the same cores; the ratio is
            the cluster's overhead.
--catalog   Commit latency and `factory sql` latency on the embedded sqlite catalog against the
            Iceberg REST catalog on S3 (`factory.deploy.seaweed`, SeaweedFS on loopback).

Ratios are against the baseline measured in the same run; nothing here asserts. Not part of the tests.

    .venv/bin/python bench/scale_bench.py --simulate [--sizes 10000,100000[,1000000]]
    .venv/bin/python bench/scale_bench.py --spark --catalog
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import math
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pyarrow as pa  # noqa: E402

from factory.lake import CommitStamp, Lake  # noqa: E402
from factory.lake.catalog import CatalogConfig  # noqa: E402
from factory.lake.lineage import LINEAGE_TABLE  # noqa: E402
from factory.lake.schemas import LINEAGE, REFINED_DOCUMENTS, TRAIN_CHECKPOINTS  # noqa: E402

PER_RUN = 100  # checkpoints per run
EVERY = 10  # steps between checkpoints (every checkpoint is evaluated: eval_every = EVERY)
T0 = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
CHUNK = 200_000  # lineage rows per bulk append
MIXES = 10
MIX_TABLES = 50  # refined tables behind each simulated run's mix


def _hex(*parts) -> str:
    return hashlib.sha256("/".join(map(str, parts)).encode()).hexdigest()


def _timed(fn, repeat: int = 1) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeat):
        started = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times), out


def _rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


# -- the fill -------------------------------------------------------------------------------------
class Simulation:
    """A lake that grows run by run; `grow_to(n)` appends runs until it holds n checkpoint rows."""

    def __init__(self, home: Path, tables: int, suites: int):
        self.lake = Lake.open(CatalogConfig(), home)
        self.suites = [f"suite{i}" for i in range(suites)]
        self.runs = 0
        self.tokenizer = "tokenizer/default@" + _hex("tok")[:12]
        self.tables = self._refined_tables(tables)
        self.mixes = [f"mix/sim{j}@v1" for j in range(MIXES)]
        self._sources_lineage()

    def _refined_tables(self, n: int) -> dict[str, int]:
        """`n` small refined tables (20 documents each), committed the ordinary way."""
        snaps = {}
        for i in range(n):
            name = f"refined.t{i:03d}"
            rows = [{"doc_id": _hex(name, d)[:24], "source": name, "path": f"{d}.py", "text": "x = 1\n" * (d + 1),
                     "language": "python", "kind": "code", "bytes": 6 * (d + 1), "license": None,
                     "content_sha256": _hex(name, d, "c"), "ingested_at": T0, "redactions": "{}"} for d in range(20)]
            data = pa.Table.from_pylist(rows, schema=REFINED_DOCUMENTS.as_arrow())
            commit = self.lake.commit(name, data, CommitStamp(asset_key=f"refined/t{i:03d}", config_hash="sim"),
                                      schema=REFINED_DOCUMENTS)
            snaps[name] = commit.snapshot_id
        return snaps

    def _row(self, version_id, kind, name, upstream, created, *, uri=None, content=None, meta="{}", snap=None):
        return {"version_id": version_id, "kind": kind, "name": name, "uri": uri, "content_hash": content,
                "upstream": upstream, "config_json": '{"sim":true}', "config_hash": _hex(kind)[:16],
                "code_version": "0123abcd", "env_lock": "e" * 16, "asset_key": kind, "partition": "",
                "run_id": _hex(name)[:36], "snapshot_id": snap, "metadata_json": meta, "created_at": created}

    def _sources_lineage(self) -> None:
        raws = [f"raw.s{i}@{1000 + i}" for i in range(10)]
        rows = [self._row(r, "table_snapshot", r.split("@")[0], [], T0) for r in raws]
        rows += [self._row(f"{t}@{s}", "table_snapshot", t, [raws[i % 10]], T0, snap=s)
                 for i, (t, s) in enumerate(self.tables.items())]
        meta = {"content_hash": _hex("tok"), "vocab_size": 1024, "special_ids": {"bos": 0, "eos": 1, "pad": 2},
                "sampled": {}, "sample_docs": {}, "sample_bytes": {},
                "bytes_per_token": {t: 3.5 for t in self.tables}, "seconds": 1.0, "new": True}
        rows.append(self._row(self.tokenizer, "tokenizer", "tokenizer/default", raws, T0,
                              uri=(self.lake.home / "tok").as_uri(), content=_hex("tok"), meta=json.dumps(meta)))
        names = list(self.tables)
        for j, m in enumerate(self.mixes):
            picked = [f"{t}@{self.tables[t]}" for t in names[j * MIX_TABLES % len(names):][:MIX_TABLES]]
            rows.append(self._row(m, "mix_version", m.split("@")[0], picked + [self.tokenizer], T0))
        self._append_lineage(rows)

    def _append_lineage(self, rows: list[dict]) -> None:
        for i in range(0, len(rows), CHUNK):
            data = pa.Table.from_pylist(rows[i:i + CHUNK], schema=LINEAGE.as_arrow())
            self.lake.commit(LINEAGE_TABLE, data, CommitStamp(asset_key="factory/lineage", config_hash=""),
                             schema=LINEAGE)

    def grow_to(self, checkpoint_rows: int) -> None:
        target = math.ceil(checkpoint_rows / PER_RUN)
        while self.runs < target:
            batch = range(self.runs, min(target, self.runs + CHUNK // (PER_RUN * (2 + len(self.suites)))))
            self._append_runs(batch)
            self.runs = batch[-1] + 1

    def _append_runs(self, runs: range) -> None:
        ckpts, lineage = [], []
        for r in runs:
            run, mix = f"sim{r:05d}-{_hex(r)[:8]}", self.mixes[r % MIXES]
            previous = None
            for k in range(1, PER_RUN + 1):
                step, created = k * EVERY, T0 + dt.timedelta(hours=r, seconds=k)
                cid, sha = f"ckpt/{run}@{step}", _hex(run, step)
                uri = f"file:///sim/runs/{run}/checkpoints/step-{step:08d}.pt"
                ckpts.append({"checkpoint_id": cid, "run": run, "experiment": f"exp{r % 50}", "step": step,
                              "tokens": step * 8192, "uri": uri, "sha256": sha, "bytes": 12_000_000,
                              "loss": 4.0 / k, "mix_version": mix, "config_hash": _hex(run)[:16],
                              "eval_every": EVERY, "code_version": "0123abcd", "created_at": created})
                meta = json.dumps({"step": step, "tokens": step * 8192, "loss": 4.0 / k, "bytes": 12_000_000})
                lineage.append(self._row(cid, "checkpoint", f"run/{run}", [mix, self.tokenizer] + ([previous] if previous else []),
                                         created, uri=uri, content=sha, meta=meta))
                export = f"export/{run}@{step}"
                lineage.append(self._row(export, "export", f"export/{run}", [cid, self.tokenizer], created,
                                         uri=f"file:///sim/exports/{run}/{step}", content=_hex(export)))
                for s in self.suites:
                    held = next(iter(self.tables))
                    lineage.append(self._row(f"eval/{run}@{step}/{s}", "eval", f"eval/{run}@{step}",
                                             [export, f"{held}@{self.tables[held]}"], created,
                                             uri="iceberg://evals.results", meta='{"bpb/t000":1.23}'))
                previous = cid
        data = pa.Table.from_pylist(ckpts, schema=TRAIN_CHECKPOINTS.as_arrow())
        self.lake.commit("train.checkpoints", data, CommitStamp(asset_key="training_run", config_hash="sim"),
                         schema=TRAIN_CHECKPOINTS)
        self._append_lineage(lineage)

    def last_run(self) -> str:
        r = self.runs - 1
        return f"sim{r:05d}-{_hex(r)[:8]}"


# -- the timed operations -------------------------------------------------------------------------
def measure(sim: Simulation, size: int, new: int, repeat: int) -> dict[str, float]:
    """Seconds per operation on a lake holding `size` checkpoint rows."""
    from factory.evals.watch import due_checkpoints
    from factory.lake.commands import describe
    from factory.mix.spec import MixSource, MixSpec
    from factory.mix.versions import register_mix_version
    from factory.train.checkpoint import CheckpointRef, record_checkpoint

    lake = sim.lake
    cursor = json.dumps({"snapshot_id": lake.current_snapshot_id("train.checkpoints")})
    run, out, previous, commits = f"tick{size}", {}, None, []
    started = time.perf_counter()
    for k in range(1, new + 1):  # a run landing `new` checkpoints between two ticks
        ref = CheckpointRef(run=run, step=k * EVERY, path=Path(f"/sim/{run}/step-{k * EVERY:08d}.pt"), sha256=_hex(run, k),
                            bytes=1, tokens=k, loss=1.0, created_at=dt.datetime.now(dt.timezone.utc))
        record_checkpoint(lake, ref, experiment="tick", mix_version=sim.mixes[0], config_hash="tick", eval_every=EVERY,
                          upstream=[sim.mixes[0], sim.tokenizer] + ([previous] if previous else []))
        previous = ref.checkpoint_id
        commits.append(time.perf_counter() - started)
        started = time.perf_counter()
    out["commit"] = statistics.median(commits)
    out["tick"], (due, _) = _timed(lambda: due_checkpoints(lake, cursor), repeat)
    if len(due) != new:
        print(f"  !! tick found {len(due)} due checkpoints, expected {new}")
    last = sim.last_run()

    def cold():  # a fresh Lake, as in a `factory lineage` process: nothing read before
        return Lake.open(CatalogConfig(), lake.home)

    out["lineage_eval"], reports = _timed(lambda: describe(cold(), f"eval/{last}@{PER_RUN * EVERY}/{sim.suites[0]}"), repeat)
    depth = _depth(reports[0]["upstream"])
    out["lineage_ckpt"], reports = _timed(lambda: describe(cold(), f"ckpt/{last}@{EVERY}"), repeat)
    down = len(reports[0]["downstream"])
    spec = MixSpec(name=f"scale{size}", tokenizer="default",
                   sources=[MixSource(table=t, weight=1 / len(sim.tables)) for t in sim.tables])
    out["mix"], (version, created) = _timed(lambda: register_mix_version(lake, spec))
    print(f"  {size:,} checkpoints: tick found {len(due)} due; eval walk depth {depth}; "
          f"first checkpoint has {down} downstream; {version.version_id} created={created} "
          f"over {len(version.pins)} tables; peak RSS {_rss_gib():.1f} GiB")
    return out


def _depth(nodes: list[dict]) -> int:
    depth, frontier = 0, nodes
    while frontier:
        depth, frontier = depth + 1, [c for n in frontier for c in n["upstream"]][:1000]
    return depth


OPS = ("commit", "tick", "lineage_eval", "lineage_ckpt", "mix")


def print_table(results: dict[int, dict[str, float]]) -> None:
    sizes = sorted(results)
    print(f"\n{'checkpoint rows':>16} {'lineage rows':>13} " + " ".join(f"{op:>13}" for op in OPS))
    for size in sizes:
        lineage = results[size]["lineage_rows"]
        print(f"{size:>16,} {lineage:>13,} " + " ".join(f"{results[size][op]:>12.3f}s" for op in OPS))
    for a, b in zip(sizes, sizes[1:]):
        per10 = math.log(10) / math.log(b / a)  # growth normalised to a 10x step in rows
        ratios = [(results[b][op] / max(results[a][op], 1e-9)) ** per10 for op in OPS]
        print(f"{'growth per 10x':>16} {f'{a:,}->{b:,}':>13} " + " ".join(f"{r:>12.1f}x" for r in ratios))
    print("(growth per 10x rows: 1x = flat, 10x = linear, 100x = quadratic)")


def history(home: Path, commits: int) -> None:
    """One commit per checkpoint, as the trainer writes them: what the snapshot history costs.

    Each commit adds a snapshot and a manifest and rewrites the table's metadata file (which
    lists every snapshot), so commit time and scan planning grow with the number of commits,
    not with rows. Timed at doubling snapshot counts: one 1-row commit, one sensor tick (cursor
    one commit behind) and one full scan plan."""
    from factory.evals.watch import due_checkpoints

    lake = Lake.open(CatalogConfig(), home)
    stamp = CommitStamp(asset_key="training_run", config_hash="h")
    marks = sorted({min(commits, 2**k) for k in range(6, 30) if 2**k <= commits * 2})
    print(f"\n{'snapshots':>10} {'metadata KiB':>13} {'commit s':>9} {'tick s':>7} {'plan s':>7}")
    done, rows = 0, []
    for mark in marks:
        while done < mark:
            step = (done + 1) * EVERY
            row = {"checkpoint_id": f"ckpt/h@{step}", "run": "h", "experiment": "h", "step": step, "tokens": step,
                   "uri": "file:///h", "sha256": "0" * 64, "bytes": 1, "loss": 1.0, "mix_version": "mix/m@v1",
                   "config_hash": "h", "eval_every": EVERY, "code_version": "c", "created_at": T0}
            data = pa.Table.from_pylist([row], schema=TRAIN_CHECKPOINTS.as_arrow())
            cursor = json.dumps({"snapshot_id": lake.current_snapshot_id("train.checkpoints")}) if done else None
            took, _ = _timed(lambda: lake.commit("train.checkpoints", data, stamp, schema=TRAIN_CHECKPOINTS))
            done += 1
        table = lake.table("train.checkpoints")
        size = Path(table.metadata_location.removeprefix("file://")).stat().st_size / 1024
        tick, (due, _) = _timed(lambda: due_checkpoints(lake, cursor))
        plan, _ = _timed(lambda: list(lake.table("train.checkpoints").scan().plan_files()))
        print(f"{done:>10,} {size:>13,.0f} {took:>9.3f} {tick:>7.3f} {plan:>7.3f}   (tick found {len(due)})")


def simulate(args) -> None:
    sizes = [int(s) for s in args.sizes.split(",")]
    with tempfile.TemporaryDirectory(prefix="scale-bench-") as home:
        started = time.perf_counter()
        sim = Simulation(Path(home), args.tables, args.suites)
        print(f"simulation in {home}: {args.tables} refined tables in {time.perf_counter() - started:.1f}s")
        results = {}
        for size in sizes:
            started = time.perf_counter()
            sim.grow_to(size)
            lineage_rows = int(sim.lake.table(LINEAGE_TABLE).current_snapshot().summary["total-records"])
            print(f"filled {size:,} checkpoints / {lineage_rows:,} lineage rows "
                  f"in {time.perf_counter() - started:.1f}s (peak RSS {_rss_gib():.1f} GiB)")
            results[size] = measure(sim, size, args.new, args.repeat) | {"lineage_rows": lineage_rows}
        print_table(results)
    if args.history:
        with tempfile.TemporaryDirectory(prefix="scale-history-") as home:
            history(Path(home), args.history)



# -- Spark: local[2] against the standalone cluster -----------------------------------------------
def _corpus(root: Path, docs: int) -> int:
    """`docs` real Python files (the interpreter's own library, by path order) plus every 20th
    again under a new name (exact duplicates for the dedup steps to find)."""
    import os

    files = sorted(p for p in Path(os.__file__).parent.rglob("*.py") if "site-packages" not in p.parts)[:docs]
    for i, path in enumerate(files):
        text = path.read_text(errors="replace")
        (root / f"{i:05d}.py").write_text(text)
        if i % 20 == 0:
            (root / f"{i:05d}_copy.py").write_text(text)
    return len(list(root.iterdir()))


def _chain(master: str, home: Path, source_dir: Path) -> tuple[float, float, int]:
    """(session start s, chain s, refined rows) of the whole refinement chain on `master`."""
    from pyspark.sql import SparkSession

    from configs.refine import default_pipeline
    from factory.data.ingest import ingest_source
    from factory.data.refine.pipeline import run_step
    from factory.data.sources import DirectorySource
    from factory.data.spark import spark_session

    if (active := SparkSession.getActiveSession()) is not None:
        active.stop()  # one session per process: the previous master's goes first
    started = time.perf_counter()
    spark = spark_session(master, app_name="scale-bench")
    spark.range(1).count()  # executors up, not only the driver
    session_s = time.perf_counter() - started
    lake = Lake.open(CatalogConfig(), home)
    ingest_source(lake, DirectorySource(name="bench", root=str(source_dir), include=["*.py"]))
    pipeline = default_pipeline("bench")
    started = time.perf_counter()
    for i in range(len(pipeline.steps)):
        run_step(spark, lake, pipeline, i, run_id="scale-bench")
    chain_s = time.perf_counter() - started
    rows = int(lake.table(pipeline.table(len(pipeline.steps) - 1)).current_snapshot().summary["total-records"])
    return session_s, chain_s, rows


def spark_section(args) -> None:
    from factory.deploy.spark_cluster import start_spark_cluster

    with tempfile.TemporaryDirectory(prefix="scale-spark-") as work:
        work = Path(work)
        (work / "src").mkdir()
        docs = _corpus(work / "src", args.docs)
        print(f"\nrefinement chain (6 steps) over {docs} documents")
        local = _chain("local[2]", work / "local", work / "src")
        started = time.perf_counter()
        cluster = start_spark_cluster(work / "cluster", workers=2, cores=1, memory="1g")
        up = time.perf_counter() - started
        try:
            remote = _chain(cluster.url, work / "remote", work / "src")
        finally:
            from pyspark.sql import SparkSession

            if (active := SparkSession.getActiveSession()) is not None:
                active.stop()
            cluster.stop()
        print(f"{'master':>26} {'session s':>10} {'chain s':>9} {'docs/s':>8} {'refined rows':>13}")
        for name, (session_s, chain_s, rows) in (("local[2]", local), (cluster.url, remote)):
            print(f"{name:>26} {session_s:>10.1f} {chain_s:>9.1f} {docs / chain_s:>8.0f} {rows:>13,}")
        print(f"cluster start {up:.1f}s; throughput local[2] / standalone = {remote[1] / local[1]:.2f}x "
              f"(the cluster's overhead on the same 2 cores)")


# -- catalogs: sqlite against REST + S3 -----------------------------------------------------------
def _catalog_latency(lake: Lake, commits: int) -> tuple[float, float, float]:
    """(first commit s, median commit s, median `factory sql` s) on `lake`."""
    from factory.lake.sql import query

    schema = TRAIN_CHECKPOINTS
    rows = [{"checkpoint_id": f"ckpt/bench@{i}", "run": "bench", "experiment": "bench", "step": i, "tokens": i,
             "uri": "file:///x", "sha256": "0" * 64, "bytes": 1, "loss": 1.0, "mix_version": "mix/m@v1",
             "config_hash": "h", "eval_every": 10, "code_version": "c", "created_at": T0} for i in range(10)]
    data = pa.Table.from_pylist(rows, schema=schema.as_arrow())
    stamp = CommitStamp(asset_key="bench", config_hash="bench")
    first, _ = _timed(lambda: lake.commit("bench.checkpoints", data, stamp, schema=schema))
    times = [_timed(lambda: lake.commit("bench.checkpoints", data, stamp))[0] for _ in range(commits)]
    sql = "select run, count(*) as n, max(step) as last from bench.checkpoints group by run"
    query_s, result = _timed(lambda: query(lake, sql), 5)
    assert result.num_rows == 1  # a wrong answer is not a latency
    return first, statistics.median(times), query_s


def catalog_section(args) -> None:
    from factory.deploy.profiles import open_lake
    from factory.deploy.seaweed import rest_profile, start_seaweedfs
    from factory.deploy.servers import free_port

    with tempfile.TemporaryDirectory(prefix="scale-catalog-") as work:
        work = Path(work)
        sqlite = _catalog_latency(Lake.open(CatalogConfig(), work / "sqlite"), args.commits)
        profile = rest_profile(free_port(), free_port())
        started = time.perf_counter()
        server = start_seaweedfs(work / "weed", profile, work / "weed.log")
        up = time.perf_counter() - started
        try:
            rest = _catalog_latency(open_lake(profile, work / "rest"), args.commits)
        finally:
            server.stop()
        print(f"\ncatalog latency ({args.commits} commits of 10 rows, `factory sql` group-by, median of 5); "
              f"SeaweedFS up in {up:.1f}s")
        print(f"{'catalog':>16} {'create+commit s':>16} {'commit s':>9} {'sql s':>7}")
        for name, (first, commit_s, sql_s) in (("sqlite (file://)", sqlite), ("REST + S3", rest)):
            print(f"{name:>16} {first:>16.3f} {commit_s:>9.3f} {sql_s:>7.3f}")
        print(f"REST+S3 / sqlite: commit {rest[1] / sqlite[1]:.2f}x, sql {rest[2] / sqlite[2]:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--simulate", action="store_true", help="catalog-scale simulation (item 6)")
    parser.add_argument("--spark", action="store_true", help="local[2] against the two-worker standalone cluster")
    parser.add_argument("--catalog", action="store_true", help="sqlite against REST+S3: commit and `factory sql`")
    parser.add_argument("--sizes", default="10000,100000", help="checkpoint rows, comma-separated, growing")
    parser.add_argument("--tables", type=int, default=500, help="refined tables the mix registers over")
    parser.add_argument("--suites", type=int, default=8, help="evals per checkpoint (lineage rows = 2 + suites)")
    parser.add_argument("--new", type=int, default=5, help="checkpoints landing before the timed tick")
    parser.add_argument("--repeat", type=int, default=3, help="repetitions of the tick and the walks (median)")
    parser.add_argument("--history", type=int, default=1024, help="--simulate: 1-row commits in the history test (0: skip)")
    parser.add_argument("--docs", type=int, default=4000, help="--spark: documents in the corpus")
    parser.add_argument("--commits", type=int, default=20, help="--catalog: timed commits per catalog")
    args = parser.parse_args()
    everything = not (args.simulate or args.spark or args.catalog)
    if args.simulate or everything:
        simulate(args)
    if args.spark or everything:
        spark_section(args)
    if args.catalog or everything:
        catalog_section(args)


if __name__ == "__main__":
    main()
