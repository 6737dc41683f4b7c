"""The ``traffic`` job's transforms: messages, bytes and rates per topic, topic prefix, node
and publisher, per time window; top talkers. Pure ``DataFrame -> DataFrame``, and, for the
batch job's tables, pure pyarrow on the driver (``split_rollups``).

Input: the publish log (pipeline/schema.py), or the finest rollup of it, ``traffic_base``
(per window, node, publisher and topic), from which every other table rolls up without
reading the messages again; each function below takes either. Rates are per second of the
window (``messages / window length``); the totals' rates per second of the job's span.
"""

from __future__ import annotations

import datetime as dt

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from .common import topic_prefix, unwrap_window, window_of

__all__ = [
    "traffic_base",
    "traffic_by",
    "traffic_totals",
    "top_talkers",
    "traffic_summary",
    "with_prefix",
    "ROLLUPS",
    "traffic_rollups",
    "rollup_span",
    "rollup_summary",
    "split_rollups",
]


def _rolled_up(df: DataFrame) -> bool:
    return "messages" in df.columns


def _measures(df: DataFrame) -> tuple[Column, Column, Column, Column]:
    """messages, bytes, first, last: counted from messages, or summed from a rollup."""
    if _rolled_up(df):
        return (
            F.sum("messages").alias("messages"),
            F.sum("bytes").alias("bytes"),
            F.min("first").alias("first"),
            F.max("last").alias("last"),
        )
    return (
        F.count(F.lit(1)).alias("messages"),
        F.sum("payload_size").cast("long").alias("bytes"),
        F.min("timestamp").alias("first"),
        F.max("timestamp").alias("last"),
    )


def traffic_base(df: DataFrame, window_seconds: int) -> DataFrame:
    """Per window, origin, publisher and topic: messages, bytes, first, last. Tables with
    windows that are multiples of this one roll up from it exactly."""
    messages, nbytes, first, last = _measures(df)
    return unwrap_window(
        df.groupBy(window_of(window_seconds), "origin", "publisher", "topic").agg(messages, nbytes, first, last)
    )


def with_prefix(df: DataFrame, level: int) -> DataFrame:
    return df.withColumn("prefix", topic_prefix(F.col("topic"), level))


def traffic_by(df: DataFrame, keys: list[str], window_seconds: int) -> DataFrame:
    """Per window and ``keys``: messages, bytes, msgs_per_s, bytes_per_s (unordered, so that
    a streaming query can use it too)."""
    messages, nbytes, _, _ = _measures(df)
    counts = df.groupBy(window_of(window_seconds, "window_start" if _rolled_up(df) else "timestamp"), *keys).agg(
        messages, nbytes
    )
    return (
        unwrap_window(counts)
        .withColumn("msgs_per_s", F.col("messages") / F.lit(float(window_seconds)))
        .withColumn("bytes_per_s", F.col("bytes") / F.lit(float(window_seconds)))
    )


def traffic_totals(df: DataFrame, keys: list[str], span_seconds: float) -> DataFrame:
    """Per ``keys`` over the whole input: messages, bytes, first, last, msgs_per_s over the span,
    share of all messages; most messages first."""
    span = max(float(span_seconds), 1e-9)
    return (
        df.groupBy(*keys)
        .agg(*_measures(df))
        .withColumn("msgs_per_s", F.col("messages") / F.lit(span))
        .withColumn("share", F.col("messages") / F.sum("messages").over(Window.partitionBy()))
        .orderBy(F.desc("messages"), *keys)
    )


def top_talkers(df: DataFrame, n: int) -> DataFrame:
    """The ``n`` publishers (ClientId at its node) with the most messages: rank, origin,
    publisher, messages, bytes, share of all messages. Ties rank by bytes, then name."""
    messages, nbytes, _, _ = _measures(df)
    totals = df.groupBy("origin", "publisher").agg(messages, nbytes)
    order = Window.orderBy(F.desc("messages"), F.desc("bytes"), "publisher", "origin")
    return (
        totals.withColumn("share", F.col("messages") / F.sum("messages").over(Window.partitionBy()))
        .withColumn("rank", F.row_number().over(order))
        .where(F.col("rank") <= int(n))
        .select("rank", "origin", "publisher", "messages", "bytes", "share")
        .orderBy("rank")
    )


def traffic_summary(df: DataFrame) -> DataFrame:
    """One row: messages, bytes, publishers, topics, nodes, first, last."""
    messages, nbytes, first, last = _measures(df)
    return df.agg(
        messages,
        nbytes,
        F.countDistinct("origin", "publisher").alias("publishers"),
        F.countDistinct("topic").alias("topics"),
        F.countDistinct("origin").alias("nodes"),
        first,
        last,
    ).select(
        F.coalesce("messages", F.lit(0)).cast("long").alias("messages"),
        F.coalesce("bytes", F.lit(0)).cast("long").alias("bytes"),
        "publishers",
        "topics",
        "nodes",
        "first",
        "last",
    )


# -- the batch job: every table from one Spark query ---------------------------------------------
#
# The batch job asks Spark once: the messages rolled up into ``traffic_base`` and that rolled up
# again along every table's keys at once (grouping sets), brought to the driver as one Arrow
# table; ``split_rollups`` cuts it into the tables (pyarrow, vectorised: rates, shares, ranks,
# order). The functions above give the same tables one query each (the stream job's).

ROLLUPS = {
    "per_node": ("window_start", "window_end", "origin"),
    "per_prefix": ("window_start", "window_end", "prefix"),
    "per_topic": ("window_start", "window_end", "topic"),
    "per_publisher": ("window_start", "window_end", "origin", "publisher"),
    "talkers": ("origin", "publisher"),
    "topics": ("topic",),
    "nodes": ("origin",),
}
_KEYS = ("window_start", "window_end", "origin", "publisher", "topic", "prefix")


def _gid(keys: tuple[str, ...]) -> int:
    """Spark's grouping_id() of a grouping set of ``_KEYS``: a bit per key left out, the first
    key the highest bit."""
    return sum(1 << (len(_KEYS) - 1 - i) for i, k in enumerate(_KEYS) if k not in keys)


def traffic_rollups(base: DataFrame, level: int) -> DataFrame:
    """``traffic_base``'s rows summed along each of ``ROLLUPS``' key sets in one aggregation:
    the keys, messages, bytes, first, last and ``gid`` (which set)."""
    return (
        with_prefix(base, level)
        .groupingSets([list(keys) for keys in ROLLUPS.values()], *_KEYS)
        .agg(
            F.sum("messages").alias("messages"),
            F.sum("bytes").alias("bytes"),
            F.min("first").alias("first"),
            F.max("last").alias("last"),
            F.grouping_id().alias("gid"),
        )
    )


def rollup_span(data) -> tuple[dt.datetime | None, dt.datetime | None]:
    """The first and last message times (UTC datetimes, or None) of ``traffic_rollups``' rows."""
    import pyarrow.compute as pc

    nodes = data.filter(pc.equal(data["gid"], _gid(ROLLUPS["nodes"])))
    if not nodes.num_rows:
        return None, None
    return pc.min(nodes["first"]).as_py(), pc.max(nodes["last"]).as_py()


def split_rollups(data, window_seconds: int, span: float, start, end, top: int) -> dict:
    """The job's tables (pyarrow) from ``traffic_rollups``' rows (pyarrow): per-window rates
    and ``complete`` (the window within [start, end], datetimes), the whole range's rates per
    second of ``span`` and shares, the ``top`` talkers ranked; each in the order the report
    shows (windows, then keys; or most messages first)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    def of(name: str):
        return data.filter(pc.equal(data["gid"], _gid(ROLLUPS[name])))

    def per_second(values, seconds: float):
        return pc.divide(pc.cast(values, pa.float64()), float(seconds))

    out = {}
    ts = data.schema.field("window_start").type
    lo = pa.scalar(start, ts) if start is not None else None
    hi = pa.scalar(end, ts) if end is not None else None
    for name, keys in (
        ("per_node", ["origin"]),
        ("per_prefix", ["prefix"]),
        ("per_topic", ["topic"]),
        ("per_publisher", ["origin", "publisher"]),
    ):
        t = of(name)
        if lo is None or hi is None:
            complete = pa.array([False] * t.num_rows)
        else:
            complete = pc.and_(pc.greater_equal(t["window_start"], lo), pc.less_equal(t["window_end"], hi))
        t = pa.table(
            {
                "window_start": t["window_start"],
                "window_end": t["window_end"],
                **{k: t[k] for k in keys},
                "messages": t["messages"],
                "bytes": t["bytes"],
                "msgs_per_s": per_second(t["messages"], window_seconds),
                "bytes_per_s": per_second(t["bytes"], window_seconds),
                "complete": complete,
            }
        )
        out[name] = t.sort_by([("window_start", "ascending")] + [(k, "ascending") for k in keys])
    total = pc.sum(of("nodes")["messages"]).as_py() or 0
    span_s = max(float(span), 1e-9)
    for name, key in (("topics", "topic"), ("nodes", "origin")):
        t = of(name)
        t = pa.table(
            {
                key: t[key],
                "messages": t["messages"],
                "bytes": t["bytes"],
                "first": t["first"],
                "last": t["last"],
                "msgs_per_s": per_second(t["messages"], span_s),
                "share": pc.divide(pc.cast(t["messages"], pa.float64()), float(total) if total else 1.0),
            }
        )
        out[name] = t.sort_by([("messages", "descending"), (key, "ascending")])
    t = of("talkers").sort_by(
        [("messages", "descending"), ("bytes", "descending"), ("publisher", "ascending"), ("origin", "ascending")]
    )
    t = t.slice(0, max(int(top), 0))
    out["top_talkers"] = pa.table(
        {
            "rank": pa.array(range(1, t.num_rows + 1), pa.int32()),
            "origin": t["origin"],
            "publisher": t["publisher"],
            "messages": t["messages"],
            "bytes": t["bytes"],
            "share": pc.divide(pc.cast(t["messages"], pa.float64()), float(total) if total else 1.0),
        }
    )
    return out


def rollup_summary(data) -> dict:
    """messages, bytes, publishers, topics, nodes of ``traffic_rollups``' rows (pyarrow)."""
    import pyarrow.compute as pc

    nodes = data.filter(pc.equal(data["gid"], _gid(ROLLUPS["nodes"])))

    def count(name: str) -> int:
        return data.filter(pc.equal(data["gid"], _gid(ROLLUPS[name]))).num_rows

    return {
        "messages": int(pc.sum(nodes["messages"]).as_py() or 0),
        "bytes": int(pc.sum(nodes["bytes"]).as_py() or 0),
        "publishers": count("talkers"),
        "topics": count("topics"),
        "nodes": nodes.num_rows,
    }
