"""The audit transforms on hand-made logs; every expected row was worked out by hand.

Published (2026-01-31):               Expectations:
    n1:1  pA  t/1  12:00:00               s1 = t/#
    n1:2  pA  t/1  12:00:01               s2 = t/1 from 12:00:01
    n1:3  pA  t/2  12:00:02
    n2:1  pB  t/1  12:00:03           so s1 expects n1:1 n1:2 n1:3 n2:1 n1:4
    n2:2  pB  x/1  12:00:04              s2 expects n1:2 n2:1 n1:4
    n1:4  pA  t/1  12:00:05

Delivered:
    s1  n1:1  12:00:00.010  n3  log 1            latency 10 ms
    s1  n1:2  12:00:01.020  n3  log 2            latency 20 ms
    s1  n1:2  12:00:01.500  n3  log 3  DUP       a duplicate, re-sent
    s1  n2:1  12:00:03.004  n3  log 4            latency 4 ms
    s1  n2:2  12:00:04.001  n3  log 5            not expected (x/1)
    s1  n1:3  12:00:06.000  n3  log 6            latency 4000 ms
    s2  n1:4  12:00:05.002  n1  log 1            latency 2 ms
    s2  n1:2  12:00:05.003  n1  log 2            latency 4003 ms, after n1:4 on t/1: out of order
    s2  n9:7  12:00:07      n1  log 3            not in the publish log: unknown
    s3  n1:1  12:00:00.5    n2  log 1            s3 is not audited
Lost: s1 n1:4, s2 n2:1. Percentiles: the value of rank ceil(p * n), ascending.
"""

from __future__ import annotations

import pytest
from pyspark.testing import assertDataFrameEqual

from mqttmesh.pipeline import audit as A
from mqttmesh.pipeline.options import Expectation
from support.pipeline import ts

pytestmark = pytest.mark.spark

PUB = "msg_id string, origin string, seq long, publisher string, topic string, qos tinyint, timestamp timestamp"
DLV = "client_id string, msg_id string, node string, timestamp timestamp, dup boolean, log_seq long"
TOTALS = (
    "expected long, delivered long, lost long, duplicated long, redelivered long, out_of_order long, "
    "latency_p50_ms double, latency_p95_ms double, latency_p99_ms double, latency_max_ms double"
)


@pytest.fixture(scope="module")
def logs(spark):
    pub = spark.createDataFrame(
        [
            ("n1:1", "n1", 1, "pA", "t/1", 1, ts("12:00:00")),
            ("n1:2", "n1", 2, "pA", "t/1", 1, ts("12:00:01")),
            ("n1:3", "n1", 3, "pA", "t/2", 1, ts("12:00:02")),
            ("n2:1", "n2", 1, "pB", "t/1", 0, ts("12:00:03")),
            ("n2:2", "n2", 2, "pB", "x/1", 0, ts("12:00:04")),
            ("n1:4", "n1", 4, "pA", "t/1", 2, ts("12:00:05")),
        ],
        PUB,
    )
    dlv = spark.createDataFrame(
        [
            ("s1", "n1:1", "n3", ts("12:00:00.010"), False, 1),
            ("s1", "n1:2", "n3", ts("12:00:01.020"), False, 2),
            ("s1", "n1:2", "n3", ts("12:00:01.500"), True, 3),
            ("s1", "n2:1", "n3", ts("12:00:03.004"), False, 4),
            ("s1", "n2:2", "n3", ts("12:00:04.001"), False, 5),
            ("s1", "n1:3", "n3", ts("12:00:06"), False, 6),
            ("s2", "n1:4", "n1", ts("12:00:05.002"), False, 1),
            ("s2", "n1:2", "n1", ts("12:00:05.003"), False, 2),
            ("s2", "n9:7", "n1", ts("12:00:07"), False, 3),
            ("s3", "n1:1", "n2", ts("12:00:00.5"), False, 1),
        ],
        DLV,
    )
    exp = A.expectations_frame(spark, [Expectation("s1", ["t/#"]), Expectation("s2", ["t/1"], ts("12:00:01"))])
    expected = A.expected_from_filters(pub, exp)
    rows = A.audit_deliveries(expected, A.first_deliveries(dlv))
    return pub, dlv, expected, rows


def test_expected_messages_follow_the_filters_and_the_time_range(spark, logs):
    _, _, expected, _ = logs
    got = expected.select("client_id", "msg_id")
    want = spark.createDataFrame(
        [
            ("s1", "n1:1"),
            ("s1", "n1:2"),
            ("s1", "n1:3"),
            ("s1", "n2:1"),
            ("s1", "n1:4"),
            ("s2", "n1:2"),
            ("s2", "n2:1"),
            ("s2", "n1:4"),
        ],
        "client_id string, msg_id string",
    )
    assertDataFrameEqual(got, want)


def test_two_filters_of_one_subscriber_expect_a_message_once(spark, logs):
    pub = logs[0]
    exp = A.expectations_frame(spark, [Expectation("s1", ["t/#", "+/1"])])
    got = A.expected_from_filters(pub, exp).select("msg_id")
    want = spark.createDataFrame([("n1:1",), ("n1:2",), ("n1:3",), ("n2:1",), ("n2:2",), ("n1:4",)], "msg_id string")
    assertDataFrameEqual(got, want)


def test_per_subscriber_and_publisher_stream(spark, logs):
    rows = logs[3]
    expected = spark.createDataFrame(
        [
            ("s1", "n1", "pA", 4, 3, 1, 1, 1, 0, 20.0, 4000.0, 4000.0, 4000.0),
            ("s1", "n2", "pB", 1, 1, 0, 0, 0, 0, 4.0, 4.0, 4.0, 4.0),
            ("s2", "n1", "pA", 2, 2, 0, 0, 0, 1, 2.0, 4003.0, 4003.0, 4003.0),
            ("s2", "n2", "pB", 1, 0, 1, 0, 0, 0, None, None, None, None),
        ],
        f"client_id string, origin string, publisher string, {TOTALS}",
    )
    assertDataFrameEqual(A.audit_streams(rows), expected)


def test_per_subscriber_with_unexpected_and_unknown_deliveries(spark, logs):
    pub, dlv, expected_pairs, rows = logs
    expected = spark.createDataFrame(
        [
            ("s1", 5, 4, 1, 1, 1, 0, 10.0, 4000.0, 4000.0, 4000.0, 1, 0),
            ("s2", 3, 2, 1, 0, 0, 1, 2.0, 4003.0, 4003.0, 4003.0, 0, 1),
        ],
        f"client_id string, {TOTALS}, unexpected long, unknown long",
    )
    got = A.audit_subscribers(rows, A.unexpected_deliveries(dlv, expected_pairs, pub))
    assertDataFrameEqual(got, expected)


def test_per_publisher_stream(spark, logs):
    rows = logs[3]
    expected = spark.createDataFrame(
        [
            ("n1", "pA", 6, 5, 1, 1, 1, 1, 20.0, 4003.0, 4003.0, 4003.0),
            ("n2", "pB", 2, 1, 1, 0, 0, 0, 4.0, 4.0, 4.0, 4.0),
        ],
        f"origin string, publisher string, {TOTALS}",
    )
    assertDataFrameEqual(A.audit_publishers(rows), expected)


def test_lost_messages_are_listed_one_by_one(spark, logs):
    expected = spark.createDataFrame(
        [
            ("s1", "n1:4", "n1", 4, "pA", "t/1", 2, ts("12:00:05")),
            ("s2", "n2:1", "n2", 1, "pB", "t/1", 0, ts("12:00:03")),
        ],
        "client_id string, msg_id string, origin string, seq long, publisher string, topic string, qos tinyint, "
        "published timestamp",
    )
    assertDataFrameEqual(A.lost_messages(logs[3]), expected)


def test_without_expectations_a_gap_in_a_stream_is_a_loss(spark):
    pub = spark.createDataFrame(
        [(f"n1:{i}", "n1", i, "pA", "t/1" if i < 6 else "t/2", 1, ts(f"12:00:0{i}")) for i in range(1, 7)]
        + [("n1:7", "n1", 7, "pA", "t/1", 1, ts("12:00:07"))]
        # n1:2 archived by n1 and again by the node that routed it under n1's id after n1 died
        # (archive/recorder.py other_origin): one message, expected once
        + [("n1:2", "n1", 2, "pA", "t/1", 1, ts("12:00:02"))],
        PUB,
    )
    dlv = spark.createDataFrame([("s1", f"n1:{i}", "n1", ts(f"12:00:0{i}.5"), False, i) for i in (1, 2, 4, 5, 6)], DLV)
    # s1 heard pA on t/1 from seq 1 to 5, so it expects 1..5 there (n1:7 is after its last: not visible),
    # and n1:6 on t/2; n1:3 is the gap
    rows = A.audit_deliveries(A.expected_from_gaps(pub, dlv), A.first_deliveries(dlv))
    assertDataFrameEqual(
        A.lost_messages(rows).select("client_id", "msg_id"),
        spark.createDataFrame([("s1", "n1:3")], "client_id string, msg_id string"),
    )
    assert A.audit_streams(rows).select("expected", "delivered", "lost").collect()[0].asDict() == {
        "expected": 6,
        "delivered": 5,
        "lost": 1,
    }
