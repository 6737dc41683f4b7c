"""Transforms every job uses: time windows and topic levels. Pure ``DataFrame -> DataFrame``."""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from .options import filter_regex

__all__ = ["window_of", "unwrap_window", "topic_prefix", "with_pattern", "OTHER"]

OTHER = "(other)"


def window_of(seconds: int, column: str = "timestamp") -> Column:
    """The tumbling window of ``seconds`` (UTC-aligned) holding ``column``, as ``window``: group
    by this (not by its start) so that a streaming query can close windows by watermark."""
    return F.window(column, f"{int(seconds)} seconds").alias("window")


def unwrap_window(df: DataFrame) -> DataFrame:
    """``window`` (a struct) -> ``window_start``, ``window_end``, in first place."""
    rest = [c for c in df.columns if c != "window"]
    return df.select(F.col("window.start").alias("window_start"), F.col("window.end").alias("window_end"), *rest)


def topic_prefix(topic: Column, level: int) -> Column:
    """The first ``level`` levels of a topic (the whole topic when it has fewer)."""
    return F.array_join(F.slice(F.split(topic, "/"), 1, int(level)), "/")


def with_pattern(df: DataFrame, patterns: list[str] | None = None, level: int = 2) -> DataFrame:
    """Adds ``pattern``: the first of ``patterns`` (MQTT topic filters) the topic matches, or
    OTHER; without patterns, the topic's first ``level`` levels, followed by ``/#`` when the
    topic has more."""
    if patterns:
        expr = F.lit(OTHER)
        for f in reversed(patterns):
            expr = F.when(F.col("topic").rlike(filter_regex(f)), F.lit(f)).otherwise(expr)
        return df.withColumn("pattern", expr)
    deeper = F.size(F.split(F.col("topic"), "/")) > int(level)
    prefix = topic_prefix(F.col("topic"), level)
    return df.withColumn("pattern", F.when(deeper, F.concat(prefix, F.lit("/#"))).otherwise(prefix))
