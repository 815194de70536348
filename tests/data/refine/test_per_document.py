"""The one per-document UDF helper of the refinement steps (`factory.data.refine.steps`):
`filter_documents` turns a plain predicate into drop labels (reason, detail; null when kept) and
`per_document` lifts any row function into one Arrow-batched pandas UDF; the normalize, quality,
redact and decontaminate steps are built on them, so `steps.py` defines exactly one pandas UDF.

The first test is static (unit tier); the second runs a real local[2] SparkSession (`spark`: needs
a JDK; ~30 s on 2 cores, mostly the session start).
"""

import ast
import datetime as dt
from pathlib import Path

import pytest
from pyspark.sql import functions as F

from factory.data.refine import steps
from factory.data.refine.steps import DOC_COLUMNS, filter_documents, per_document, split

RAW_DDL = ("doc_id string, source string, path string, text string, language string, kind string, bytes long, "
           "license string, content_sha256 string, ingested_at timestamp, redactions string")


def test_the_steps_define_the_spark_udf_once():
    tree = ast.parse(Path(steps.__file__).read_text())
    decorated = [node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)
                 and any("pandas_udf" in ast.unparse(d) for d in node.decorator_list)]
    assert decorated == ["udf"]  # inside per_document; every step goes through it
    filters = {node.name: ast.unparse(node) for node in tree.body
               if isinstance(node, ast.FunctionDef) and node.name in ("quality", "decontaminate")}
    assert set(filters) == {"quality", "decontaminate"}
    assert all("filter_documents(" in source for source in filters.values()), filters


@pytest.mark.spark
def test_a_filter_is_its_predicate_and_a_transform_its_row_function():
    from factory.data.spark import spark_session

    spark = spark_session("local[2]")
    now = dt.datetime(2025, 1, 1, tzinfo=dt.UTC)
    texts = {"a": "short", "b": "a long enough text", "c": "x", "d": None}
    df = spark.createDataFrame([(i, "src", f"{i}.py", t, "python", "code", len(t or ""), "MIT", "", now, "{}")
                                for i, t in texts.items()], RAW_DDL).repartition(3)  # several batches

    def too_short(text, kind):
        if text is None:
            return "null_text", "text is null"
        return ("too_short", f"{len(text)} chars < 6 ({kind})") if len(text) < 6 else None

    labelled = filter_documents(df, too_short, "text", "kind")
    assert labelled.columns == [*DOC_COLUMNS, "drop_reason", "drop_detail"]
    kept, dropped = split(labelled)
    assert [r.doc_id for r in kept.collect()] == ["b"]
    assert sorted((r.doc_id, r.drop_reason, r.drop_detail) for r in dropped.collect()) == [
        ("a", "too_short", "5 chars < 6 (code)"), ("c", "too_short", "1 chars < 6 (code)"),
        ("d", "null_text", "text is null")]

    upper = per_document(lambda text: (text.upper(), len(text)) if text else (None, 0), "text string, n long")
    out = df.select("doc_id", upper("text").alias("u")).select("doc_id", "u.text", "u.n").orderBy("doc_id")
    assert [tuple(r) for r in out.collect()] == [("a", "SHORT", 5), ("b", "A LONG ENOUGH TEXT", 18), ("c", "X", 1),
                                                 ("d", None, 0)]
    assert labelled.where(F.col("drop_reason").isNull()).count() == 1
