"""The refinement steps as pure Spark functions.

Each step takes a documents DataFrame (plus its config) and returns it labelled: every row gets
`drop_reason` (null when kept) and `drop_detail`; `split` gives (kept, dropped). Per-document work
is a plain Python function over one document's values (in `text`, `quality`, `redact` and
`decontam`, or a few lines here), lifted into Spark by `per_document` (one Arrow-batched pandas
UDF) — a filter is only its predicate, `filter_documents` turns it into the drop labels. So the
Spark plumbing is written once and each rule is testable without Spark. Everything that relates
documents to each other (exact and near dedup) is joins and aggregations, so nothing is collected
to the driver and the work scales with partitions. Outputs depend only on the data and the config,
never on partitioning or executor order.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable

import pandas as pd
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.pandas.functions import pandas_udf

from factory.data.refine import text as T
from factory.data.refine.config import (
    DecontamConfig,
    ExactDedupConfig,
    NearDedupConfig,
    NormalizeConfig,
    QualityConfig,
    RedactConfig,
)

DOC_COLUMNS = ["doc_id", "source", "path", "text", "language", "kind", "bytes", "license",
               "content_sha256", "ingested_at", "redactions"]
LABEL = "drop_reason string, drop_detail string"


def split(labelled: DataFrame) -> tuple[DataFrame, DataFrame]:
    """(kept documents, dropped documents with reason and detail)."""
    kept = labelled.where(F.col("drop_reason").isNull()).select(*DOC_COLUMNS)
    dropped = labelled.where(F.col("drop_reason").isNotNull())
    return kept, dropped


def per_document(fn: Callable[..., tuple], schema: str) -> Callable[..., Column]:
    """A Spark column function applying `fn` to each document: `fn(*values) -> tuple` over the
    row's values of the columns it is called with, the tuple's items the fields of `schema`
    (a struct DDL such as "text string, redactions string"). The one place the per-document
    steps meet Spark: an Arrow-batched pandas UDF looping over the batch's rows."""
    names = [field.split()[0] for field in schema.split(",")]

    @pandas_udf(schema)
    def udf(*columns: pd.Series) -> pd.DataFrame:
        return pd.DataFrame([fn(*values) for values in zip(*columns)], columns=names)

    return udf


def filter_documents(df: DataFrame, reason: Callable[..., tuple[str, str] | None], *columns: str) -> DataFrame:
    """`df` labelled by a filter: `reason(*values of columns)` is (drop reason, detail) for a
    document to drop, None to keep it (datatrove's filter: the step is only its predicate)."""
    label = per_document(lambda *values: reason(*values) or (None, None), LABEL)
    return df.withColumn("_label", label(*columns)).select(*DOC_COLUMNS, "_label.drop_reason", "_label.drop_detail")


def normalize(df: DataFrame, config: NormalizeConfig, others: DataFrame | None = None) -> DataFrame:
    """NFC, line endings, BOM; drop null, empty, binary and oversized documents; tag the kind."""
    normalized = per_document(functools.partial(_normalized, config=config), f"text string, {LABEL}")
    n = df.withColumn("_n", normalized("text"))
    kind = F.when(F.col("language").isin(*sorted(T.CODE_LANGUAGES)), "code").otherwise("prose")
    return n.select(
        "doc_id", "source", "path",
        F.coalesce(F.col("_n.text"), F.col("text")).alias("text"),
        "language", kind.alias("kind"),
        F.octet_length(F.coalesce(F.col("_n.text"), F.col("text"))).cast("long").alias("bytes"),
        "license",
        F.sha2(F.coalesce(F.col("_n.text"), F.lit("")), 256).alias("content_sha256"),
        "ingested_at", F.lit("{}").alias("redactions"),
        "_n.drop_reason", "_n.drop_detail",
    )


def _normalized(text: str | None, config: NormalizeConfig) -> tuple[str | None, str | None, str | None]:
    """(normalized text, None, None), or (None, reason, detail) for a document normalize drops."""
    if text is None:
        return None, "null_text", "text is null"
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > config.max_bytes:
        return None, "too_large", f"{size} bytes > {config.max_bytes}"
    out = T.normalize_text(text)
    binary = T.control_fraction(out)
    if binary > config.max_control_fraction:
        return None, "binary", f"control/replacement characters {binary:.3f}"
    if not out.strip():
        return None, "empty", "no non-whitespace text"
    return out, None, None


def exact_dedup(df: DataFrame, config: ExactDedupConfig, others: DataFrame | None = None) -> DataFrame:
    """Keep one document per content hash: the smallest (source, doc_id), here or in `others`."""
    pool = df.select("content_sha256", "source", "doc_id")
    if others is not None:
        pool = pool.unionByName(others.select("content_sha256", "source", "doc_id"))
    keeper = pool.groupBy("content_sha256").agg(F.min(F.struct("source", "doc_id")).alias("_keep"))
    out = df.join(keeper, "content_sha256", "left")
    is_keeper = (F.col("_keep.source") == F.col("source")) & (F.col("_keep.doc_id") == F.col("doc_id"))
    return out.select(
        *DOC_COLUMNS,
        F.when(is_keeper, None).otherwise(F.lit("exact_duplicate")).alias("drop_reason"),
        F.when(is_keeper, None).otherwise(F.concat(F.lit("duplicate of "), F.col("_keep.source"), F.lit(":"),
                                                   F.col("_keep.doc_id"))).alias("drop_detail"),
    )


def signatures(df: DataFrame, config: NearDedupConfig) -> DataFrame:
    """(doc_id, sig: array<long>, bands: array<long>) — null for documents without words."""
    a, b = T.permutations(config.permutations, config.seed)

    def signature(text: str | None) -> tuple[list[int] | None, list[int] | None]:
        sig = T.minhash(text or "", config.shingle_size, a, b)
        return (None, None) if sig is None else (sig.astype("int64").tolist(),
                                                 T.band_hashes(sig, config.bands, config.rows))

    udf = per_document(signature, "sig array<long>, bands array<long>")
    return df.select("doc_id", udf("text").alias("_m")).select("doc_id", "_m.sig", "_m.bands")


def candidate_pairs(sigs: DataFrame, config: NearDedupConfig) -> DataFrame:
    """(a, b) with a < b that share an LSH bucket; big buckets link members to their first."""
    buckets = (
        sigs.where(F.col("bands").isNotNull())
        .select("doc_id", F.posexplode("bands").alias("band", "bucket"))
        .groupBy("band", "bucket")
        .agg(F.sort_array(F.collect_list("doc_id")).alias("members"))
        .where(F.size("members") > 1)
    )
    # One pass over the buckets (a union of two branches would aggregate them twice): a small
    # bucket pairs each member with every later one, a large one only its first with the rest.
    firsts = F.when(F.size("members") <= config.max_bucket, F.col("members")).otherwise(F.slice("members", 1, 1))
    return (
        buckets.select("members", F.posexplode(firsts).alias("i", "a"))
        .select("i", "a", F.posexplode("members").alias("j", "b"))
        .where(F.col("j") > F.col("i"))
        .select("a", "b")
        .distinct()
    )


def connected_components(edges: DataFrame, max_iterations: int = 100) -> DataFrame:
    """(doc_id, component): each vertex of `edges` (a, b) labelled with its component's min id.

    Min-label propagation with a checkpoint per round (lineage stays short); rounds grow with
    the component diameter, which near-duplicate clusters keep small. A vertex starts from the
    smallest of itself and its neighbours, and each round's aggregation also keeps the previous
    label, so the convergence test is a scan of the checkpoint rather than another join.
    """
    both = edges.select(F.col("a").alias("src"), F.col("b").alias("dst")).unionByName(
        edges.select(F.col("b").alias("src"), F.col("a").alias("dst"))
    ).localCheckpoint()
    labels = both.groupBy(F.col("src").alias("v")).agg(F.least(F.min("dst"), F.col("v")).alias("label"))
    labels = labels.localCheckpoint()
    for _ in range(max_iterations):
        offered = both.join(labels, both.dst == labels.v).select(both.src.alias("v"), labels.label)
        new = (
            labels.withColumn("own", F.lit(True))
            .unionByName(offered.withColumn("own", F.lit(False)))
            .groupBy("v")
            .agg(F.min("label").alias("label"), F.min(F.when(F.col("own"), F.col("label"))).alias("old"))
            .localCheckpoint()
        )
        changed = new.where(F.col("label") != F.col("old")).count()
        labels = new.select("v", "label")
        if changed == 0:
            return labels.select(F.col("v").alias("doc_id"), F.col("label").alias("component"))
    raise RuntimeError(f"connected components did not converge in {max_iterations} rounds")


def near_dedup(df: DataFrame, config: NearDedupConfig, others: DataFrame | None = None) -> DataFrame:
    """Drop every document of a near-duplicate component except its smallest doc_id."""
    sigs = signatures(df, config).localCheckpoint()
    pairs = candidate_pairs(sigs, config)
    x, y = sigs.alias("x"), sigs.alias("y")
    same = F.aggregate(F.zip_with("x.sig", "y.sig", lambda p, q: F.when(p == q, 1).otherwise(0)), F.lit(0),
                       lambda acc, v: acc + v)
    verified = (
        pairs.join(x, F.col("a") == F.col("x.doc_id")).join(y, F.col("b") == F.col("y.doc_id"))
        .select("a", "b", (same / F.lit(config.permutations)).alias("jaccard"))
        .where(F.col("jaccard") >= config.threshold)
        .select("a", "b")
    )
    components = connected_components(verified)
    out = df.join(components, "doc_id", "left")
    dup = F.col("component").isNotNull() & (F.col("component") != F.col("doc_id"))
    return out.select(
        *DOC_COLUMNS,
        F.when(dup, F.lit("near_duplicate")).alias("drop_reason"),
        F.when(dup, F.concat(F.lit("near duplicate of "), F.col("component"))).alias("drop_detail"),
    )


def quality(df: DataFrame, config: QualityConfig, others: DataFrame | None = None) -> DataFrame:
    """Heuristic filters for code and prose; the first broken rule is the reason."""
    from factory.data.refine.quality import quality_reason

    return filter_documents(df, functools.partial(quality_reason, config=config), "text", "kind")


def redact(df: DataFrame, config: RedactConfig, others: DataFrame | None = None) -> DataFrame:
    """Replace secrets and PII by typed placeholders; keeps every document, counts per kind."""
    from factory.data.refine.redact import redact as redact_text

    def redacted(text: str) -> tuple[str, str]:
        out, counts = redact_text(text, config)
        return out, json.dumps(counts, sort_keys=True)

    r = df.withColumn("_r", per_document(redacted, "text string, redactions string")("text"))
    return r.select(
        "doc_id", "source", "path", F.col("_r.text").alias("text"), "language", "kind",
        F.octet_length("_r.text").cast("long").alias("bytes"), "license",
        F.sha2("_r.text", 256).alias("content_sha256"), "ingested_at", F.col("_r.redactions").alias("redactions"),
        F.lit(None).cast("string").alias("drop_reason"), F.lit(None).cast("string").alias("drop_detail"),
    )


def decontaminate(df: DataFrame, config: DecontamConfig, others: DataFrame | None = None) -> DataFrame:
    """Drop documents sharing an n-gram with an evaluation set; record the benchmark task."""
    from factory.data.refine.decontam import build_index

    index = build_index(config.benchmarks, config.ngram)  # small: shipped to executors in the UDF

    def contaminated(text: str) -> tuple[str, str] | None:
        hit = index.match(text)
        return None if hit is None else ("contaminated", f"{hit[0]} ({hit[1]} shared {config.ngram}-grams)")

    return filter_documents(df, contaminated, "text")


STEPS = {
    "normalize": normalize,
    "exact_dedup": exact_dedup,
    "near_dedup": near_dedup,
    "quality": quality,
    "redact": redact,
    "decontaminate": decontaminate,
}

__all__ = ["DOC_COLUMNS", "STEPS", "connected_components", "filter_documents", "per_document", "split"]
