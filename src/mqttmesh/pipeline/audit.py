"""The ``audit`` job's transforms: the publish log against the delivery log, per subscriber and
per publisher stream: expected, delivered, lost, duplicated, out of order, latency percentiles.
Pure ``DataFrame -> DataFrame``.

What a subscriber should have received comes from expectations (ClientId, topic filters,
optional time range: ``expected_from_filters``), or, without them, from what it did receive
(``expected_from_gaps``: for each publisher and topic it heard from, everything that
publisher published on that topic between the first and the last message it got, so a
gap is a loss; losses before the first or after the last message are not visible that way).

Times: latency is the first delivery's time minus the message's timestamp at its origin,
both taken from the nodes' clocks (docs/pipeline.md says what that means across machines).
"""

from __future__ import annotations

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

from .options import Expectation, filter_regex

__all__ = [
    "expectations_frame",
    "expected_from_filters",
    "expected_from_gaps",
    "first_deliveries",
    "audit_deliveries",
    "audit_streams",
    "audit_subscribers",
    "audit_publishers",
    "lost_messages",
    "unexpected_deliveries",
    "PERCENTILE_ACCURACY",
]

PERCENTILE_ACCURACY = 10_000
_EXPECTED = ["client_id", "msg_id", "origin", "seq", "publisher", "topic", "qos", "published"]


def expectations_frame(spark, expectations: list[Expectation]) -> DataFrame:
    """One row per (client_id, filter): client_id, filter, regex, since, until."""
    schema = T.StructType(
        [
            T.StructField("client_id", T.StringType()),
            T.StructField("filter", T.StringType()),
            T.StructField("regex", T.StringType()),
            T.StructField("since", T.TimestampType()),
            T.StructField("until", T.TimestampType()),
        ]
    )
    rows = [(e.client_id, f, filter_regex(f), e.since, e.until) for e in expectations for f in e.filters]
    return spark.createDataFrame(rows, schema)


def _published(publish: DataFrame) -> DataFrame:
    return publish.select("msg_id", "origin", "seq", "publisher", "topic", "qos", F.col("timestamp").alias("published"))


def expected_from_filters(publish: DataFrame, expectations: DataFrame) -> DataFrame:
    """(client_id, message) pairs: every published message whose topic matches one of the
    client's filters, within the expectation's time range; once per client and message."""
    e = expectations.select("client_id", "regex", F.col("since").alias("_since"), F.col("until").alias("_until"))
    cond = (
        F.expr("topic rlike regex")
        & (F.col("_since").isNull() | (F.col("published") >= F.col("_since")))
        & (F.col("_until").isNull() | (F.col("published") < F.col("_until")))
    )
    return _published(publish).join(F.broadcast(e), cond).select(*_EXPECTED).dropDuplicates(["client_id", "msg_id"])


def expected_from_gaps(publish: DataFrame, delivery: DataFrame) -> DataFrame:
    """(client_id, message) pairs inferred from what each client received: per publisher and
    topic, every message between the first and the last one it received (by sequence); once
    per client and message (a message routed under another node's id may be archived by
    that node and by its origin: docs/pipeline.md)."""
    pub = _published(publish)
    got = (
        delivery.select("client_id", "msg_id")
        .distinct()
        .join(pub.select("msg_id", "origin", "publisher", "topic", "seq"), "msg_id")
    )
    ranges = got.groupBy("client_id", "origin", "publisher", "topic").agg(
        F.min("seq").alias("_lo"), F.max("seq").alias("_hi")
    )
    return (
        pub.join(ranges, ["origin", "publisher", "topic"])
        .where((F.col("seq") >= F.col("_lo")) & (F.col("seq") <= F.col("_hi")))
        .select(*_EXPECTED)
        .dropDuplicates(["client_id", "msg_id"])
    )


def first_deliveries(delivery: DataFrame) -> DataFrame:
    """Per (client_id, msg_id): copies, redelivered (copies with DUP), and the first delivery
    (``first_at``, ``first_node``, ``first_log_seq``: the order the nodes logged them)."""
    first = F.min(F.struct("timestamp", "node", "log_seq"))
    return (
        delivery.groupBy("client_id", "msg_id")
        .agg(
            F.count(F.lit(1)).alias("copies"),
            F.sum(F.col("dup").cast("long")).alias("redelivered"),
            first.alias("_first"),
        )
        .select(
            "client_id",
            "msg_id",
            "copies",
            "redelivered",
            F.col("_first.timestamp").alias("first_at"),
            F.col("_first.node").alias("first_node"),
            F.col("_first.log_seq").alias("first_log_seq"),
        )
    )


def audit_deliveries(expected: DataFrame, deliveries: DataFrame) -> DataFrame:
    """One row per expected (client, message): delivered, copies, redelivered, latency_ms and
    out_of_order (delivered after a later message of the same publisher and topic)."""
    rows = (
        expected.join(deliveries, ["client_id", "msg_id"], "left")
        .withColumn("delivered", F.col("first_at").isNotNull())
        .withColumn("copies", F.coalesce("copies", F.lit(0)))
        .withColumn("redelivered", F.coalesce("redelivered", F.lit(0)))
        .withColumn(
            "latency_ms",
            F.when(F.col("delivered"), (F.unix_micros("first_at") - F.unix_micros("published")) / F.lit(1000.0)),
        )
    )
    order = (
        Window.partitionBy("client_id", "origin", "publisher", "topic", "delivered")
        .orderBy("first_at", "first_node", "first_log_seq", "seq")
        .rowsBetween(Window.unboundedPreceding, -1)
    )
    before = F.max("seq").over(order)
    return rows.withColumn("out_of_order", F.col("delivered") & F.coalesce(F.col("seq") < before, F.lit(False)))


def _totals(rows: DataFrame, keys: list[str]) -> DataFrame:
    pct = F.percentile_approx("latency_ms", [0.5, 0.95, 0.99], PERCENTILE_ACCURACY)
    return (
        rows.groupBy(*keys)
        .agg(
            F.count(F.lit(1)).alias("expected"),
            F.sum(F.col("delivered").cast("long")).alias("delivered"),
            F.sum((~F.col("delivered")).cast("long")).alias("lost"),
            F.sum(F.greatest(F.col("copies") - 1, F.lit(0))).alias("duplicated"),
            F.sum("redelivered").alias("redelivered"),
            F.sum(F.col("out_of_order").cast("long")).alias("out_of_order"),
            pct.alias("_pct"),
            F.max("latency_ms").alias("latency_max_ms"),
        )
        .select(
            *keys,
            "expected",
            "delivered",
            "lost",
            "duplicated",
            "redelivered",
            "out_of_order",
            F.col("_pct")[0].alias("latency_p50_ms"),
            F.col("_pct")[1].alias("latency_p95_ms"),
            F.col("_pct")[2].alias("latency_p99_ms"),
            "latency_max_ms",
        )
        .orderBy(*keys)
    )


def audit_streams(rows: DataFrame) -> DataFrame:
    """Per subscriber and publisher stream (client_id, origin, publisher)."""
    return _totals(rows, ["client_id", "origin", "publisher"])


def unexpected_deliveries(delivery: DataFrame, expected: DataFrame, publish: DataFrame) -> DataFrame:
    """Per audited client: messages it received but was not expected to (``unexpected``), and
    messages it received that the publish log does not have (``unknown``: an origin that does
    not archive, a topic its filters leave out, a file skipped)."""
    audited = expected.select("client_id").distinct()
    got = delivery.select("client_id", "msg_id").distinct().join(audited, "client_id")
    extra = got.join(expected.select("client_id", "msg_id"), ["client_id", "msg_id"], "left_anti")
    known = publish.select("msg_id").distinct().withColumn("_known", F.lit(True))
    return (
        extra.join(known, "msg_id", "left")
        .groupBy("client_id")
        .agg(
            F.sum(F.col("_known").isNotNull().cast("long")).alias("unexpected"),
            F.sum(F.col("_known").isNull().cast("long")).alias("unknown"),
        )
    )


def audit_subscribers(rows: DataFrame, unexpected: DataFrame) -> DataFrame:
    """Per subscriber, over all publishers, with its unexpected and unknown deliveries."""
    return (
        _totals(rows, ["client_id"])
        .join(unexpected, "client_id", "left")
        .withColumn("unexpected", F.coalesce("unexpected", F.lit(0)))
        .withColumn("unknown", F.coalesce("unknown", F.lit(0)))
        .orderBy("client_id")
    )


def audit_publishers(rows: DataFrame) -> DataFrame:
    """Per publisher stream (origin, publisher), over all its subscribers."""
    return _totals(rows, ["origin", "publisher"])


def lost_messages(rows: DataFrame) -> DataFrame:
    """Every expected message that did not reach its subscriber."""
    return (
        rows.where(~F.col("delivered"))
        .select("client_id", "msg_id", "origin", "seq", "publisher", "topic", "qos", "published")
        .orderBy("client_id", "origin", "seq")
    )
