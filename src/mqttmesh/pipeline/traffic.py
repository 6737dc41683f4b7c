"""The ``traffic`` job's transforms: messages, bytes and rates per topic, topic prefix, node
and publisher, per time window; top talkers. Pure ``DataFrame -> DataFrame``.

Input: the publish log (pipeline/schema.py). Rates are per second of the window
(``messages / window length``); the totals' rates are per second of the job's span.
"""

from __future__ import annotations

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from .common import topic_prefix, with_window

__all__ = ["traffic_by", "traffic_totals", "top_talkers", "traffic_summary", "with_prefix"]


def with_prefix(df: DataFrame, level: int) -> DataFrame:
    return df.withColumn("prefix", topic_prefix(F.col("topic"), level))


def traffic_by(df: DataFrame, keys: list[str], window_seconds: int) -> DataFrame:
    """Per window and ``keys``: messages, bytes, msgs_per_s, bytes_per_s."""
    return (with_window(df, window_seconds)
            .groupBy("window_start", "window_end", *keys)
            .agg(F.count(F.lit(1)).alias("messages"), F.sum("payload_size").alias("bytes"))
            .withColumn("msgs_per_s", F.col("messages") / F.lit(float(window_seconds)))
            .withColumn("bytes_per_s", F.col("bytes") / F.lit(float(window_seconds)))
            .orderBy("window_start", *keys))


def traffic_totals(df: DataFrame, keys: list[str], span_seconds: float) -> DataFrame:
    """Per ``keys`` over the whole input: messages, bytes, first, last, msgs_per_s over the span,
    share of all messages; most messages first."""
    span = max(float(span_seconds), 1e-9)
    return (df.groupBy(*keys)
              .agg(F.count(F.lit(1)).alias("messages"), F.sum("payload_size").alias("bytes"),
                   F.min("timestamp").alias("first"), F.max("timestamp").alias("last"))
              .withColumn("msgs_per_s", F.col("messages") / F.lit(span))
              .withColumn("share", F.col("messages") / F.sum("messages").over(Window.partitionBy()))
              .orderBy(F.desc("messages"), *keys))


def top_talkers(df: DataFrame, n: int) -> DataFrame:
    """The ``n`` publishers (ClientId at its node) with the most messages: rank, origin,
    publisher, messages, bytes, share of all messages. Ties rank by bytes, then name."""
    totals = (df.groupBy("origin", "publisher")
                .agg(F.count(F.lit(1)).alias("messages"), F.sum("payload_size").alias("bytes")))
    order = Window.orderBy(F.desc("messages"), F.desc("bytes"), "publisher", "origin")
    return (totals.withColumn("share", F.col("messages") / F.sum("messages").over(Window.partitionBy()))
                  .withColumn("rank", F.row_number().over(order))
                  .where(F.col("rank") <= int(n))
                  .select("rank", "origin", "publisher", "messages", "bytes", "share")
                  .orderBy("rank"))


def traffic_summary(df: DataFrame) -> DataFrame:
    """One row: messages, bytes, publishers, topics, nodes, first, last."""
    return df.agg(F.count(F.lit(1)).alias("messages"), F.coalesce(F.sum("payload_size"), F.lit(0)).alias("bytes"),
                  F.countDistinct("origin", "publisher").alias("publishers"),
                  F.countDistinct("topic").alias("topics"), F.countDistinct("origin").alias("nodes"),
                  F.min("timestamp").alias("first"), F.max("timestamp").alias("last"))
