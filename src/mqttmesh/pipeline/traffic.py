"""The ``traffic`` job's transforms: messages, bytes and rates per topic, topic prefix, node
and publisher, per time window; top talkers. Pure ``DataFrame -> DataFrame``.

Input: the publish log (pipeline/schema.py), or the finest rollup of it, ``traffic_base``
(per window, node, publisher and topic), from which every other table rolls up without
reading the messages again; each function below takes either. Rates are per second of the
window (``messages / window length``); the totals' rates per second of the job's span.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from .common import topic_prefix, unwrap_window, window_of

__all__ = ["traffic_base", "traffic_by", "traffic_totals", "top_talkers", "traffic_summary", "with_prefix"]


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
