"""Near dedup throughput and quality: `steps.near_dedup` against datatrove's MinHash dedup.

Method. The corpus is the full embedded code corpus — `python_stdlib(full=True)` plus
`site_packages(full=True)` (~35,000 files, ~490 MB here) — plus planted pairs: 500 documents of
at least 40 lines, chosen by hash rank, each copied twice under new doc ids, once with ~5% of its
non-blank lines rewritten into random words (a near duplicate: must be found) and once with ~40%
(a different document: must not be). It is written once as two Parquet files (one per task),
then deduplicated on the same 2 cores, one system after the other:

- ours: `steps.near_dedup` on Spark `local[2]`, timed from `spark.read.parquet` to the dropped
  doc ids collected on the driver (session start-up is printed apart, like process start-up);
- datatrove 0.10.1 (in its own environment, `bench/.venv-datatrove`, never the project venv):
  MinhashDedupSignature -> Buckets -> Cluster -> Filter on a `LocalPipelineExecutor` with 2
  workers, timed over the four stages. Both use the same shingle size, bands and rows.

datatrove's default word tokenizer is spaCy's (`spacy.blank("en")`, after `simplify_text`), and
it dominates its cost; so datatrove runs twice: `default`, and `matched`, with our tokenization
passed in — a `WordTokenizer` splitting `\\w+`, after a `simplify_text` that only lower-cases —
so both see the same token sequence. The methods still differ: datatrove hashes each shingle's
text (xxhash64) and drops on any shared bucket; we hash token hashes, verify each candidate
pair's estimated Jaccard (>= `threshold`), and give a document shorter than a shingle one
shingle where datatrove gives it none. Each side's process start-up is left out of its time.

A planted pair counts as found when both documents end in the same cluster (one of them is then
dropped as a duplicate of the other's cluster). Recall is over the 5% pairs, false positives
over the 40% pairs. The ratio is ours / datatrove in documents per second. Not part of the tests.

    python3 -m venv bench/.venv-datatrove
    bench/.venv-datatrove/bin/pip install -r bench/requirements-datatrove.txt
    .venv/bin/python bench/refine_bench.py [--sample 3000] [--skip-datatrove] [--partitions 16]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH_PYTHON = Path(__file__).resolve().parent / ".venv-datatrove" / "bin" / "python"
# The code that runs in an environment of its own, by the requirements file that makes it:
# tests/bench/test_bench_requirements.py installs each file in a scratch venv and runs there this
# module's top-level imports and those of these functions, so a missing requirement fails a test first.
OWN_ENVIRONMENTS = {"requirements-datatrove.txt": ("datatrove_worker",)}
EDITS = {"near": 0.05, "far": 0.40}
SETTINGS = ("default", "matched")
WORDY = re.compile(r"\w")


# -- corpus ------------------------------------------------------------------------------------------
def edit_lines(text: str, fraction: float, rng: random.Random) -> str:
    """Rewrite `fraction` of the non-blank lines into as many random lower-case words."""
    lines = text.split("\n")
    wordy = [i for i, line in enumerate(lines) if WORDY.search(line)]
    for i in rng.sample(wordy, max(1, round(fraction * len(wordy)))):
        indent = lines[i][: len(lines[i]) - len(lines[i].lstrip())]
        words = max(2, len(re.findall(r"\w+", lines[i])))
        lines[i] = indent + " ".join("".join(rng.choices("abcdefghijklmnopqrstuvwxyz", k=rng.randint(3, 9)))
                                     for _ in range(words))
    return "\n".join(lines)


def build_corpus(out: Path, sample: int | None, pairs: int) -> dict:
    """Write the corpus as Parquet under `out`; return its size and the planted pairs."""
    import datetime as dt

    import pyarrow as pa
    import pyarrow.parquet as pq

    from configs.sources import python_stdlib, site_packages
    from factory.data.readers import read_source
    from factory.data.sources import document

    docs = [d for source in (python_stdlib(full=True), site_packages(full=True)) for d in read_source(source)[0]]
    rank = lambda salt, d: hashlib.sha256(f"{salt}:{d['doc_id']}".encode()).digest()  # noqa: E731
    if sample:
        docs = sorted(docs, key=lambda d: rank("sample", d))[:sample]
    bases = sorted((d for d in docs if d["text"].count("\n") >= 40), key=lambda d: rank("plant", d))[:pairs]
    planted: dict[str, list[tuple[str, str]]] = {kind: [] for kind in EDITS}
    for base in bases:
        rng = random.Random(f"plant:{base['doc_id']}")  # str seeds hash with sha512: stable across runs
        for kind, fraction in EDITS.items():
            copy = document(base["source"], f"{base['path']}~{kind}", edit_lines(base["text"], fraction, rng),
                            base["language"], base["license"])
            planted[kind].append((base["doc_id"], copy["doc_id"]))
            docs.append(copy)
    now = dt.datetime.now(dt.timezone.utc)
    rows = sorted(docs, key=lambda d: d["doc_id"])
    for d in rows:
        d.update(kind="code", ingested_at=now, redactions="{}")
    out.mkdir(parents=True)
    for shard in range(2):  # one file per datatrove task; small row groups let Spark split them
        pq.write_table(pa.Table.from_pylist(rows[shard::2]), out / f"{shard:05d}.parquet", row_group_size=64)
    return {"docs": len(rows), "bytes": sum(d["bytes"] for d in rows), "planted": planted}


# -- ours --------------------------------------------------------------------------------------------
def run_ours(corpus: Path, partitions: int) -> dict:
    from pyspark.sql import functions as F

    from factory.data.refine import steps
    from factory.data.refine.config import NearDedupConfig
    from factory.data.spark import spark_session

    on_disk = sum(f.stat().st_size for f in corpus.glob("*.parquet"))  # splits count compressed bytes
    started = time.perf_counter()
    spark = spark_session("local[2]", app_name="refine-bench", conf={
        "spark.sql.files.maxPartitionBytes": str(on_disk // partitions + 1),
        "spark.sql.files.openCostInBytes": "0",
    })
    spark.range(1).count()
    startup = time.perf_counter() - started
    started = time.perf_counter()
    df = spark.read.parquet(str(corpus))
    labelled = steps.near_dedup(df, NearDedupConfig())
    dropped = labelled.where(F.col("drop_reason").isNotNull()).select("doc_id", "drop_detail").collect()
    seconds = time.perf_counter() - started
    partitions = df.rdd.getNumPartitions()
    spark.stop()
    # A dropped document names its component (the smallest doc id), which is the kept one.
    cluster = {r["doc_id"]: r["drop_detail"].rsplit(" ", 1)[-1] for r in dropped}
    linked = lambda a, b: cluster.get(a, a) == cluster.get(b, b)  # noqa: E731
    return {"seconds": seconds, "startup": startup, "partitions": partitions, "dropped": len(dropped), "linked": linked}


# -- datatrove ---------------------------------------------------------------------------------------
def run_datatrove(corpus: Path, work: Path, setting: str) -> dict:
    """Run the datatrove pipeline in the bench environment; read back kept and removed ids."""
    from factory.data.refine.config import NearDedupConfig

    c = NearDedupConfig()
    args = [str(BENCH_PYTHON), __file__, "--datatrove-worker", setting, "--corpus", str(corpus),
            "--work", str(work), "--shingle", str(c.shingle_size), "--bands", str(c.bands), "--rows", str(c.rows),
            "--seed", str(c.seed)]
    log = work.parent / f"{setting}.log"
    with log.open("w") as err:
        if subprocess.run(args, stdout=subprocess.DEVNULL, stderr=err).returncode:
            sys.exit(f"datatrove {setting} failed:\n" + "\n".join(log.read_text().splitlines()[-30:]))
    result = json.loads((work / "result.json").read_text())
    cluster, dropped = {}, 0
    for name in ("kept", "removed"):
        for path in sorted((work / name).glob("*.jsonl")):
            for line in path.read_text().splitlines():
                row = json.loads(line)
                cluster[row["id"]] = row["cluster"]
                dropped += name == "removed"
    linked = lambda a, b: cluster.get(a, -1) != -1 and cluster.get(a) == cluster.get(b)  # noqa: E731
    return {"seconds": result["seconds"], "stages": result["stages"], "dropped": dropped, "linked": linked}


def datatrove_worker(args: argparse.Namespace) -> None:
    """Runs under bench/.venv-datatrove: the four MinHash stages, 2 workers, timed."""
    from datatrove.executor import LocalPipelineExecutor
    from datatrove.pipeline.dedup.minhash import (
        MinhashConfig,
        MinhashDedupBuckets,
        MinhashDedupCluster,
        MinhashDedupFilter,
        MinhashDedupSignature,
    )
    from datatrove.pipeline.readers import ParquetReader
    from datatrove.pipeline.writers import JsonlWriter
    from datatrove.utils.text import TextNormConfig
    from datatrove.utils.typeshelper import Languages
    from datatrove.utils.word_tokenizers import WordTokenizer

    class WordRegexTokenizer(WordTokenizer):
        """Our tokenization: `\\w+` over the (lower-cased) text."""

        def word_tokenize(self, text: str) -> list[str]:
            return re.findall(r"\w+", text)

        def sent_tokenize(self, text: str) -> list[str]:
            return [text]

        def span_tokenize(self, text: str) -> list[tuple[int, int]]:
            return [(0, len(text))]

    matched = args.datatrove_worker == "matched"
    norm = TextNormConfig(lowercase=True, norm_whitespace=False, remove_punctuation=False,
                          norm_unicode_diacritics=False, norm_numbers=False) if matched else TextNormConfig()
    config = MinhashConfig(n_grams=args.shingle, num_buckets=args.bands, hashes_per_bucket=args.rows,
                           seed=args.seed, norm_config=norm)
    language = WordRegexTokenizer() if matched else Languages.english
    work = Path(args.work)
    reader = lambda: ParquetReader(args.corpus, id_key="doc_id", read_metadata=False)  # noqa: E731
    ids = lambda self, doc: {"id": doc.id, "cluster": doc.metadata.get("minhash_cluster_id", -1)}  # noqa: E731
    stages = {
        "signatures": ([reader(), MinhashDedupSignature(str(work / "sigs"), config=config, language=language)], 2),
        "buckets": ([MinhashDedupBuckets(str(work / "sigs"), str(work / "buckets"), config=config)], args.bands),
        "cluster": ([MinhashDedupCluster(str(work / "buckets"), str(work / "remove"), config=config,
                                         save_cluster_id=True)], 1),
        "filter": ([reader(), MinhashDedupFilter(str(work / "remove"), load_cluster_ids=True,
                                                 exclusion_writer=JsonlWriter(str(work / "removed"),
                                                                              compression=None, adapter=ids)),
                    JsonlWriter(str(work / "kept"), compression=None, adapter=ids)], 2),
    }
    seconds = {}
    for name, (pipeline, tasks) in stages.items():
        started = time.perf_counter()
        LocalPipelineExecutor(pipeline, tasks=tasks, workers=2, logging_dir=str(work / "logs" / name)).run()
        seconds[name] = time.perf_counter() - started
    (work / "result.json").write_text(json.dumps({"seconds": sum(seconds.values()), "stages": seconds}))


# -- report ------------------------------------------------------------------------------------------
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sample", type=int, help="use only N corpus documents (by hash rank), for a quick run")
    parser.add_argument("--pairs", type=int, default=500, help="planted base documents (each gives 2 pairs)")
    parser.add_argument("--skip-datatrove", action="store_true")
    parser.add_argument("--partitions", type=int, default=16, help="Spark input partitions for ours")
    parser.add_argument("--datatrove-worker", choices=SETTINGS, help=argparse.SUPPRESS)
    for name in ("corpus", "work", "shingle", "bands", "rows", "seed"):
        parser.add_argument(f"--{name}", help=argparse.SUPPRESS, type=str if name in ("corpus", "work") else int)
    args = parser.parse_args()
    if args.datatrove_worker:
        return datatrove_worker(args)
    if not args.skip_datatrove and not BENCH_PYTHON.exists():
        sys.exit(f"{BENCH_PYTHON} is missing: create it (see this file's docstring) or pass --skip-datatrove")

    with tempfile.TemporaryDirectory(prefix="refine-bench-") as tmp:
        started = time.perf_counter()
        corpus = build_corpus(Path(tmp) / "corpus", args.sample, args.pairs)
        docs, mb = corpus["docs"], corpus["bytes"] / 1e6
        print(f"corpus: {docs} docs, {mb:.1f} MB, {len(corpus['planted']['near'])} planted pairs per edit rate "
              f"(built in {time.perf_counter() - started:.0f} s)", flush=True)
        runs = [("ours", "\\w+ lowercase", run_ours(Path(tmp) / "corpus", args.partitions))]
        print(f"ours: {runs[0][2]['partitions']} input partitions, spark start-up {runs[0][2]['startup']:.1f} s "
              f"(not counted); load average {os.getloadavg()[0]:.1f}", flush=True)
        if not args.skip_datatrove:
            for setting in SETTINGS:
                result = run_datatrove(Path(tmp) / "corpus", Path(tmp) / setting, setting)
                stages = ", ".join(f"{k} {v:.1f} s" for k, v in result["stages"].items())
                print(f"datatrove {setting}: {stages}; load average {os.getloadavg()[0]:.1f}", flush=True)
                runs.append(("datatrove", setting, result))

    print(f"\n{'system':10s} {'setting':15s} {'docs':>6s} {'MB':>6s} {'seconds':>8s} {'docs/s':>7s} {'MB/s':>6s} "
          f"{'recall':>7s} {'FP':>6s} {'dropped':>7s}")
    for system, setting, r in runs:
        found = {kind: sum(r["linked"](a, b) for a, b in pairs) / max(len(pairs), 1)
                 for kind, pairs in corpus["planted"].items()}
        print(f"{system:10s} {setting:15s} {docs:6d} {mb:6.0f} {r['seconds']:8.1f} {docs / r['seconds']:7.1f} "
              f"{mb / r['seconds']:6.2f} {found['near']:7.1%} {found['far']:6.1%} {r['dropped']:7d}")
    for system, setting, r in runs[1:]:
        print(f"ratio ours/datatrove[{setting}] (docs/s): {r['seconds'] / runs[0][2]['seconds']:.2f}")


if __name__ == "__main__":
    main()
