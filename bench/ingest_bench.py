"""Ingestion throughput: `ingest_source` against a hand-written baseline, side by side.

Both read the same standard-library `.py` files and commit them to an Iceberg table in a fresh
sqlite catalog. The baseline is the least a script could do (walk, read, decode, one pyiceberg
append); ours adds glob matching, deterministic sampling, doc ids and fingerprints, a stamped
overwrite commit and a lineage row. The ratio is ours / baseline in documents per second
(1.0 = no overhead). Not part of the test suite.

    .venv/bin/python bench/ingest_bench.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import sysconfig
import tempfile
import time

import pyarrow as pa

from configs.sources import python_stdlib
from factory.data.ingest import ingest_source
from factory.data.sources import document
from factory.lake import Lake
from factory.lake.schemas import RAW_DOCUMENTS


def baseline(lake: Lake) -> int:
    root = sysconfig.get_paths()["stdlib"]
    rows, now = [], dt.datetime.now(dt.timezone.utc)
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in ("site-packages", "__pycache__"))
        for f in sorted(filenames):
            if f.endswith(".py"):
                path = os.path.join(dirpath, f)
                try:
                    text = open(path, encoding="utf-8").read()
                except UnicodeDecodeError:
                    continue
                rows.append({**document("baseline", os.path.relpath(path, root), text, "python", None), "ingested_at": now})
    table = lake.ensure_table("raw.baseline", RAW_DOCUMENTS)
    table.append(pa.Table.from_pylist(rows, schema=RAW_DOCUMENTS.as_arrow()))
    return len(rows)


def ours(lake: Lake) -> int:
    return ingest_source(lake, python_stdlib()).documents


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    best = {}
    for _ in range(args.repeat):
        for name, fn in (("baseline", baseline), ("factory", ours)):
            with tempfile.TemporaryDirectory() as home:
                lake = Lake.open(home=home)
                started = time.perf_counter()
                docs = fn(lake)
                seconds = time.perf_counter() - started
            if name not in best or seconds < best[name][1]:
                best[name] = (docs, seconds)
    for name, (docs, seconds) in best.items():
        print(f"{name:9s} {docs:6d} docs in {seconds:6.2f} s = {docs / seconds:8.0f} docs/s (best of {args.repeat})")
    ratio = (best["factory"][0] / best["factory"][1]) / (best["baseline"][0] / best["baseline"][1])
    print(f"ratio factory/baseline (docs/s): {ratio:.2f}")


if __name__ == "__main__":
    main()
