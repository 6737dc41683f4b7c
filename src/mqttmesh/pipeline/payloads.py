"""The ``payloads`` job's transforms: JSON payloads parsed, numeric fields aggregated per topic
pattern and window (count, min, max, mean, p50, p95). Pure ``DataFrame -> DataFrame``, except
``infer_schema``, which looks at a sample of the data.

A payload that is not a JSON object (not UTF-8 JSON, or JSON but an array or a number) is
counted in ``payload_quality`` and otherwise left out; it never stops the job.
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from .common import unwrap_window, window_of
from .payload_schema import measurements, numeric_fields, sample_payloads, schema_of

__all__ = [
    "with_text",
    "with_json_flag",
    "infer_schema",
    "sample_payloads",
    "schema_of",
    "measurements",
    "numeric_fields",
    "parse_payloads",
    "melt_numeric",
    "payload_stats",
    "payload_totals",
    "payload_quality",
    "PERCENTILE_ACCURACY",
    "KLL_K",
    "pruned",
    "payload_pass",
    "spark_pass",
    "stats_of",
    "totals_of",
    "quality_of",
    "tables_of",
    "split_tables",
    "table_span",
    "warm_workers",
]

PERCENTILE_ACCURACY = 10_000  # percentile_approx: relative error 1/accuracy of the rank


def with_text(df: DataFrame) -> DataFrame:
    """Adds ``text``: the payload as a string."""
    return df.withColumn("text", F.col("payload").cast("string"))


def with_json_flag(df: DataFrame) -> DataFrame:
    """Adds ``text`` and ``is_json`` (the payload is a JSON object), without parsing it into
    columns (``parse_payloads`` does both in one pass)."""
    return with_text(df).withColumn("is_json", F.coalesce(F.expr("json_object_keys(text)").isNotNull(), F.lit(False)))


def infer_schema(spark, df: DataFrame, sample: int = 10_000) -> T.StructType:
    """The schema of the JSON objects among the first ``sample`` JSON payloads of ``df``
    (a DataFrame from ``with_json_flag``); an empty struct when there are none."""
    return schema_of([r.text for r in df.where("is_json").select("text").limit(int(sample)).collect()])


def parse_payloads(df: DataFrame, schema: T.StructType) -> DataFrame:
    """Adds ``json``: the payload parsed with ``schema`` (null when it is not a JSON object; a
    field whose value does not fit its type is null, the others are kept). Needs ``is_json``.

    Spark's corrupt-record field would classify and parse in one pass, but it also marks an
    object with one ill-typed field as not JSON and drops its other fields: classifying first
    (``with_json_flag``) costs one more pass over the text and keeps them."""
    parsed = F.from_json(F.col("text"), schema, {"mode": "PERMISSIVE"})
    return df.withColumn("json", F.when(F.col("is_json"), parsed))


def melt_numeric(df: DataFrame, fields: list[tuple[str, ...]]) -> DataFrame:
    """One row per message and numeric field present in it: ``field`` (dotted path), ``value``
    (double). The other columns of ``df`` but ``payload``, ``text`` and ``json`` are kept."""
    keep = [c for c in df.columns if c not in ("payload", "text", "json")]
    if not fields:
        return (
            df.select(*keep)
            .withColumn("field", F.lit(None).cast("string"))
            .withColumn("value", F.lit(None).cast("double"))
            .where(F.lit(False))
        )
    cells = []
    for path in fields:
        col = F.col("json")
        for name in path:
            col = col.getField(name)
        cells.append(F.struct(F.lit(".".join(path)).alias("field"), col.cast("double").alias("value")))
    return (
        df.select(*keep, F.explode(F.array(*cells)).alias("_cell"))
        .select(*keep, F.col("_cell.field").alias("field"), F.col("_cell.value").alias("value"))
        .where(F.col("value").isNotNull() & ~F.isnan("value"))
    )


def payload_stats(melted: DataFrame, window_seconds: int) -> DataFrame:
    """Per window, ``pattern`` and ``field``: count, min, max, mean, p50, p95 of ``value``
    (unordered, so that a streaming query can use it too)."""
    pct = F.percentile_approx("value", [0.5, 0.95], PERCENTILE_ACCURACY)
    stats = melted.groupBy(window_of(window_seconds), "pattern", "field").agg(
        F.count("value").alias("count"),
        F.min("value").alias("min"),
        F.max("value").alias("max"),
        F.avg("value").alias("mean"),
        pct.alias("_pct"),
    )
    return unwrap_window(stats).withColumn("p50", F.col("_pct")[0]).withColumn("p95", F.col("_pct")[1]).drop("_pct")


def payload_totals(melted: DataFrame) -> DataFrame:
    """Per ``pattern`` and ``field`` over the whole input: count, min, max, mean, p50, p95."""
    pct = F.percentile_approx("value", [0.5, 0.95], PERCENTILE_ACCURACY)
    return (
        melted.groupBy("pattern", "field")
        .agg(
            F.count("value").alias("count"),
            F.min("value").alias("min"),
            F.max("value").alias("max"),
            F.avg("value").alias("mean"),
            pct.alias("_pct"),
        )
        .withColumn("p50", F.col("_pct")[0])
        .withColumn("p95", F.col("_pct")[1])
        .drop("_pct")
        .orderBy("pattern", "field")
    )


# -- the batch job's single pass ---------------------------------------------------------------------
#
# ``payload_pass`` reads each payload once: parsed with a schema of the chosen fields only,
# classified from that parse (a second look at the text only when no chosen field came out),
# and aggregated per window and pattern with one KLL sketch per field; every table is then
# made from that small result (``stats_of``, ``totals_of``, ``quality_of``): a pattern's
# totals merge its windows' sketches instead of reading the messages again.

# k of the KLL sketches: a quantile's rank is within about 0.3 % of the true one (99 %
# confidence), and exact while a group has at most KLL_K values
KLL_K = 1000
QUANTILES = (0.5, 0.95)


def pruned(schema: T.StructType, fields: list[tuple[str, ...]]) -> T.StructType:
    """``schema`` with only the leaves ``fields`` and the structs that hold them."""
    out = []
    for f in schema.fields:
        under = [p[1:] for p in fields if p[0] == f.name]
        if not under:
            continue
        if isinstance(f.dataType, T.StructType) and all(under):
            out.append(T.StructField(f.name, pruned(f.dataType, under)))
        else:
            out.append(f)
    return T.StructType(out)


def _warm(x):
    """An Arrow UDF that loads what ``payload_pass``'s does (pyarrow's JSON reader, numpy)."""
    from . import payload_batches  # noqa: F401

    return x


def warm_workers(spark):
    """Starts the Python workers the payload pass will run in, one per core, with its modules
    loaded: a Spark job of one row per core, on a thread, while the driver reads the sample and
    plans the pass (on a JVM not yet warm, a second or two the cores would otherwise idle; the
    workers stay for the pass: spark.python.worker.reuse). Returns the thread; whatever happens
    on it is only a missed head start."""
    import threading

    from pyspark.sql.functions import arrow_udf

    def run() -> None:
        try:
            cores = spark.sparkContext.defaultParallelism
            udf = arrow_udf(_warm, "long")  # type: ignore[call-overload]
            spark.range(cores, numPartitions=cores).select(udf("id")).collect()
        except Exception:
            pass

    thread = threading.Thread(target=run, name="warm-python-workers", daemon=True)
    thread.start()
    return thread


def payload_pass(df: DataFrame, schema: T.StructType, fields: list[tuple[str, ...]], window_seconds: int) -> DataFrame:
    """Per window and ``pattern`` of ``df`` (timestamp, pattern, payload): ``messages``,
    ``json`` (JSON objects), ``first``, ``last``, and for field i of ``fields``: ``c{i}``
    (values), ``lo{i}``, ``hi{i}``, ``sum{i}`` and ``q{i}`` (a KLL sketch of its values).
    A value that is null, not a number or NaN is not one.

    Each Arrow batch of payloads is read and aggregated in the Python worker
    (``payload_batches.batch_pass``: Arrow's JSON reader, numpy); the payloads it cannot read
    exactly as Spark would (not an object, not UTF-8, a value of another type, NaN...) come
    back marked and are read here by Spark's parser, as ``spark_pass`` reads them all; Spark
    then merges the batches' partial rows and those per window and pattern. A schema with a
    type Arrow reads otherwise (FLOAT, DECIMAL) takes ``spark_pass``."""
    from pyspark.sql.functions import arrow_udf

    from . import payload_batches as B

    chosen = pruned(schema, fields)
    arrow = B.arrow_schema(chosen)
    if arrow is None:
        return spark_pass(df, schema, fields, window_seconds)
    window_us = int(window_seconds) * 1_000_000

    def batch(timestamp, pattern, payload):
        return B.batch_pass(timestamp, pattern, payload, arrow, fields, window_us, KLL_K)

    # (a row's result depends on its batch: nondeterministic, so that Spark evaluates it once,
    # on the rows as read, and never again on fewer rows for another operator)
    udf = arrow_udf(batch, B.result_type(len(fields))).asNondeterministic()  # type: ignore[call-overload]
    listed = df.select("timestamp", "pattern", "payload", udf("timestamp", "pattern", "payload").alias("_bs"))
    # (explode leaves out a null list: the payloads the batches counted)
    marked = listed.selectExpr("timestamp", "pattern", "payload", "explode(_bs) AS _b")
    slow = F.col("_b.slow")
    values, is_json = _read_text(F.when(slow, F.col("payload").cast("string")), chosen, fields)

    def either(per_payload, partial: str):
        return F.when(slow, per_payload).otherwise(F.col(f"_b.{partial}"))

    aggs = [
        F.sum(either(F.lit(1).cast("long"), "messages")).alias("messages"),
        F.sum(either(is_json.cast("long"), "json")).alias("json"),
        F.min(either(F.col("timestamp"), "first")).alias("first"),
        F.max(either(F.col("timestamp"), "last")).alias("last"),
    ]
    for i, v in enumerate(values):
        aggs += [
            F.sum(either(v.isNotNull().cast("long"), f"c{i}")).alias(f"c{i}"),
            F.min(either(v, f"lo{i}")).alias(f"lo{i}"),
            F.max(either(v, f"hi{i}")).alias(f"hi{i}"),
            F.sum(either(v, f"sum{i}")).alias(f"sum{i}"),
            F.kll_merge_agg_double(F.col(f"_b.q{i}"), KLL_K).alias(f"_qb{i}"),
            F.kll_sketch_agg_double(F.when(slow, v), KLL_K).alias(f"_qs{i}"),
        ]
    # a partial row stands at its window's start, so Spark's window of it is its window
    at = F.window(either(F.col("timestamp"), "window_start"), f"{int(window_seconds)} seconds").alias("window")
    grouped = marked.groupBy(at, either(F.col("pattern"), "pattern").alias("pattern")).agg(*aggs)
    columns = ["window.start AS window_start", "window.end AS window_end", "pattern", "messages", "json", "first"]
    columns += ["last"]
    for i in range(len(fields)):
        columns += [f"c{i}", f"lo{i}", f"hi{i}", f"sum{i}"]
        columns += [f"coalesce(kll_sketch_merge_double(_qb{i}, _qs{i}), _qb{i}, _qs{i}) AS q{i}"]
    # (SQL text: one call to Spark for the whole select)
    return grouped.selectExpr(*columns)


def _read_text(text, chosen: T.StructType, fields: list[tuple[str, ...]]):
    """Spark's reading of a payload's ``text``: each field's value (a double, null when
    absent, not a number or NaN) and whether the text is a JSON object."""
    from functools import reduce

    # (NaN and Infinity are not JSON: json_object_keys refuses them, so the parse does too)
    strict = {"mode": "PERMISSIVE", "allowNonNumericNumbers": "false"}
    parsed = F.from_json(text, chosen, strict)
    values = []
    for path in fields:
        col = parsed
        for name in path:
            col = col.getField(name)
        v = col.cast("double")
        values.append(F.when(~F.isnan(v), v))
    # an object is known from the parse when a chosen field came out of it; otherwise (no field,
    # or none of them there) its keys are read to tell an object from anything else
    keys = F.json_object_keys(text).isNotNull()
    found = reduce(lambda a, b: a | b, [v.isNotNull() for v in values]) if values else F.lit(False)
    is_json = F.coalesce(F.when(found, F.lit(True)).otherwise(keys), F.lit(False))
    return values, is_json


def spark_pass(df: DataFrame, schema: T.StructType, fields: list[tuple[str, ...]], window_seconds: int) -> DataFrame:
    """``payload_pass``'s rows with Spark's parser reading every payload (the pass of a schema
    Arrow reads otherwise; in the tests, what the Arrow batches must agree with)."""
    values, is_json = _read_text(F.col("payload").cast("string"), pruned(schema, fields), fields)
    aggs = [
        F.count(F.lit(1)).alias("messages"),
        F.sum(is_json.cast("long")).alias("json"),
        F.min("timestamp").alias("first"),
        F.max("timestamp").alias("last"),
    ]
    for i, v in enumerate(values):
        aggs += [
            F.count(v).alias(f"c{i}"),
            F.min(v).alias(f"lo{i}"),
            F.max(v).alias(f"hi{i}"),
            F.sum(v).alias(f"sum{i}"),
            F.kll_sketch_agg_double(v, KLL_K).alias(f"q{i}"),
        ]
    return unwrap_window(df.groupBy(window_of(window_seconds), "pattern").agg(*aggs))


def _quantiles(sketch, count):
    ranks = F.array(*[F.lit(q) for q in QUANTILES])
    return F.when(count > 0, F.kll_sketch_get_quantile_double(sketch, ranks))


def _per_field(df: DataFrame, keys: list[str], fields: list[tuple[str, ...]], cols) -> DataFrame:
    """One row per row of ``df`` and field with values: ``keys``, field, count, min, max,
    mean, p50, p95; ``cols(i)`` gives field i's (count, min, max, sum, sketch) columns."""
    cells = []
    for i, path in enumerate(fields):
        count, lo, hi, total, sketch = cols(i)
        cells.append(
            F.struct(
                F.lit(".".join(path)).alias("field"),
                count.alias("count"),
                lo.alias("min"),
                hi.alias("max"),
                (total / count).alias("mean"),
                _quantiles(sketch, count).alias("q"),
            )
        )
    if not cells:
        none = [("field", "string"), ("count", "long")] + [(c, "double") for c in ("min", "max", "mean", "p50", "p95")]
        return df.select(*keys, *[F.lit(None).cast(t).alias(c) for c, t in none]).where(F.lit(False))
    return (
        df.select(*keys, F.explode(F.array(*cells)).alias("_f"))
        .where(F.col("_f.count") > 0)
        .select(
            *keys,
            *[F.col(f"_f.{c}").alias(c) for c in ("field", "count", "min", "max", "mean")],
            F.col("_f.q")[0].alias("p50"),
            F.col("_f.q")[1].alias("p95"),
        )
    )


def stats_of(passed: DataFrame, fields: list[tuple[str, ...]]) -> DataFrame:
    """``payload_stats``'s rows from ``payload_pass``'s."""
    return _per_field(
        passed,
        ["window_start", "window_end", "pattern"],
        fields,
        lambda i: (F.col(f"c{i}"), F.col(f"lo{i}"), F.col(f"hi{i}"), F.col(f"sum{i}"), F.col(f"q{i}")),
    )


def totals_of(passed: DataFrame, fields: list[tuple[str, ...]]) -> DataFrame:
    """``payload_totals``'s rows from ``payload_pass``'s: each pattern's windows summed, their
    sketches merged (the sketch of all the pattern's values)."""
    return _totals(passed, fields).orderBy("pattern", "field")


def _totals(passed: DataFrame, fields: list[tuple[str, ...]]) -> DataFrame:
    if not fields:
        return _per_field(passed.select("pattern").distinct(), ["pattern"], [], lambda i: ())
    merged = passed.groupBy("pattern").agg(
        *[
            agg
            for i in range(len(fields))
            for agg in (
                F.sum(f"c{i}").alias(f"c{i}"),
                F.min(f"lo{i}").alias(f"lo{i}"),
                F.max(f"hi{i}").alias(f"hi{i}"),
                F.sum(f"sum{i}").alias(f"sum{i}"),
                F.kll_merge_agg_double(f"q{i}").alias(f"q{i}"),
            )
        ]
    )
    return _per_field(
        merged,
        ["pattern"],
        fields,
        lambda i: (F.col(f"c{i}"), F.col(f"lo{i}"), F.col(f"hi{i}"), F.col(f"sum{i}"), F.col(f"q{i}")),
    )


def quality_of(passed: DataFrame) -> DataFrame:
    """``payload_quality``'s rows from ``payload_pass``'s."""
    return (
        passed.groupBy("pattern")
        .agg(F.sum("messages").alias("messages"), F.sum("json").alias("json"))
        .withColumn("non_json", F.col("messages") - F.col("json"))
        .withColumn("non_json_share", F.col("non_json") / F.col("messages"))
        .orderBy(F.desc("messages"), "pattern")
    )


def payload_quality(df: DataFrame) -> DataFrame:
    """Per ``pattern``: messages, json (JSON objects), non_json, and the share that is not JSON."""
    return (
        df.groupBy("pattern")
        .agg(
            F.count(F.lit(1)).alias("messages"),
            F.sum(F.col("is_json").cast("long")).alias("json"),
            F.sum((~F.col("is_json")).cast("long")).alias("non_json"),
        )
        .withColumn("non_json_share", F.col("non_json") / F.col("messages"))
        .orderBy(F.desc("messages"), "pattern")
    )


# the columns of ``tables_of``'s rows: each table's, and the pass's span
_TABLE_COLUMNS = (
    ("window_start", "timestamp"),
    ("window_end", "timestamp"),
    ("pattern", "string"),
    ("field", "string"),
    ("count", "bigint"),
    ("min", "double"),
    ("max", "double"),
    ("mean", "double"),
    ("p50", "double"),
    ("p95", "double"),
    ("messages", "bigint"),
    ("json", "bigint"),
    ("first", "timestamp"),
    ("last", "timestamp"),
)


def tables_of(passed: DataFrame, fields: list[tuple[str, ...]]) -> DataFrame:
    """``quality_of``'s, ``stats_of``'s and ``totals_of``'s rows and the pass's span (its first
    and last message) as one DataFrame, ``_table`` naming each row's (quality, stats, totals,
    span): the driver takes them in one Spark query (``split_tables`` cuts them apart), not in
    one query per table, each a few Spark jobs on a JVM not yet warm.

    Two parts over the pass: its rows, one per field (stats), and one aggregation of them by
    pattern and over everything (``rollup``: a pattern's quality and totals, the span), each
    a single select in SQL text: the driver asks a JVM still interpreting to analyse four
    plans, not twenty, and Spark runs one aggregation, not three."""
    n = len(fields)
    per_field = [(i, _sql_string(".".join(p))) for i, p in enumerate(fields)]

    def row(**cells: str) -> str:
        return (
            "named_struct("
            + ", ".join(
                f"'{c}', CAST({cells.get(c, 'NULL')} AS {t})" for c, t in (("_table", "string"), *_TABLE_COLUMNS)
            )
            + ")"
        )

    def field_row(table: str, keys: dict[str, str], i: int, name: str) -> str:
        count = f"c{i}"
        quantile = f"kll_sketch_get_quantile_double(q{i}, {{}})"
        return row(
            _table=f"'{table}'",
            **keys,
            field=name,
            count=count,
            min=f"lo{i}",
            max=f"hi{i}",
            mean=f"sum{i} / {count}",
            p50=f"CASE WHEN {count} > 0 THEN {quantile.format(QUANTILES[0])} END",
            p95=f"CASE WHEN {count} > 0 THEN {quantile.format(QUANTILES[1])} END",
        )

    # (a field's row is kept where it has values; the quality and span rows always)
    kept = "x -> x._table IN ('quality', 'span') OR x.`count` > 0"
    window = {"window_start": "window_start", "window_end": "window_end", "pattern": "pattern"}
    stats = [field_row("stats", window, i, name) for i, name in per_field]
    rolled = passed.rollup("pattern").agg(
        F.expr("grouping_id() AS _grouping"),
        F.expr("sum(messages) AS messages"),
        F.expr("sum(json) AS json"),
        F.expr("min(first) AS first"),
        F.expr("max(last) AS last"),
        *[
            F.expr(e)
            for i in range(n)
            for e in (
                f"sum(c{i}) AS c{i}",
                f"min(lo{i}) AS lo{i}",
                f"max(hi{i}) AS hi{i}",
                f"sum(sum{i}) AS sum{i}",
                f"kll_merge_agg_double(q{i}) AS q{i}",
            )
        ],
    )
    quality = row(_table="'quality'", pattern="pattern", messages="messages", json="json")
    totals = [field_row("totals", {"pattern": "pattern"}, i, name) for i, name in per_field]
    span = row(_table="'span'", first="first", last="last")
    out = rolled.selectExpr(
        f"inline(filter(CASE WHEN _grouping = 1 THEN array({span}) ELSE array({', '.join([quality, *totals])}) END,"
        f" {kept}))"
    )
    if stats:
        out = passed.selectExpr(f"inline(filter(array({', '.join(stats)}), {kept}))").union(out)
    return out


def _sql_string(text: str) -> str:
    """``text`` as a SQL string literal (Spark's: a backslash escapes)."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def split_tables(data, start, end) -> dict:
    """``payload_quality``, ``payload_stats`` and ``payload_totals`` (pyarrow tables, in the
    order the report shows them: as ``quality_of``, ``stats_of`` by window, pattern and field
    with ``complete`` (the window within [start, end], datetimes; False without them) and
    ``totals_of`` ordered) and the span (first, last: datetimes or None), from ``tables_of``'s
    rows (pyarrow)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    def of(name: str, columns: list[str]):
        return data.filter(pc.equal(data["_table"], name)).select(columns)

    q = of("quality", ["pattern", "messages", "json"])
    non_json = pc.subtract(q["messages"], q["json"])
    quality = pa.table(
        {
            "pattern": q["pattern"],
            "messages": q["messages"],
            "json": q["json"],
            "non_json": non_json,
            "non_json_share": pc.divide(pc.cast(non_json, pa.float64()), pc.cast(q["messages"], pa.float64())),
        }
    ).sort_by([("messages", "descending"), ("pattern", "ascending")])
    stat_cols = ["field", "count", "min", "max", "mean", "p50", "p95"]
    stats = of("stats", ["window_start", "window_end", "pattern", *stat_cols])
    ts = data.schema.field("window_start").type
    if start is None or end is None:
        complete = pa.array([False] * stats.num_rows)
    else:
        lo, hi = pa.scalar(start, ts), pa.scalar(end, ts)
        complete = pc.and_(pc.greater_equal(stats["window_start"], lo), pc.less_equal(stats["window_end"], hi))
    stats = stats.append_column("complete", complete).sort_by(
        [("window_start", "ascending"), ("pattern", "ascending"), ("field", "ascending")]
    )
    totals = of("totals", ["pattern", *stat_cols]).sort_by([("pattern", "ascending"), ("field", "ascending")])
    return {"payload_quality": quality, "payload_stats": stats, "payload_totals": totals, "span": table_span(data)}


def table_span(data) -> tuple:
    """The first and last message's times (datetimes, or None) of ``tables_of``'s rows."""
    import pyarrow.compute as pc

    span = data.filter(pc.equal(data["_table"], "span")).select(["first", "last"]).to_pylist()
    return (span[0]["first"], span[0]["last"]) if span else (None, None)
