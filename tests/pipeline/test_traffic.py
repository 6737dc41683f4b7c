"""The traffic transforms on seven hand-made messages; every expected row was worked out by hand.
Each table is checked twice: from the messages, and rolled up from the per-minute base.

    #  time (2026-01-31)  node publisher topic   bytes
    1  12:00:05           n1   p1        a/b/c   10
    2  12:00:30           n1   p1        a/b/d   20
    3  12:00:59.999       n2   p2        a/b/c    5
    4  12:01:00           n2   p2        a/x      7
    5  12:01:10           n1   p3        z        1
    6  12:01:50           n2   p2        a/b/c    3
    7  12:02:00           n1   p1        a/b/c    4
"""

from __future__ import annotations

import pytest
from pyspark.testing import assertDataFrameEqual

from mqttmesh.pipeline import traffic as TR
from support.pipeline import ts

pytestmark = pytest.mark.spark

SCHEMA = "timestamp timestamp, origin string, publisher string, topic string, payload_size int"
ROWS = [
    (ts("12:00:05"), "n1", "p1", "a/b/c", 10),
    (ts("12:00:30"), "n1", "p1", "a/b/d", 20),
    (ts("12:00:59.999"), "n2", "p2", "a/b/c", 5),
    (ts("12:01:00"), "n2", "p2", "a/x", 7),
    (ts("12:01:10"), "n1", "p3", "z", 1),
    (ts("12:01:50"), "n2", "p2", "a/b/c", 3),
    (ts("12:02:00"), "n1", "p1", "a/b/c", 4),
]
W = "window_start timestamp, window_end timestamp"


@pytest.fixture(scope="module", params=["messages", "rollup"])
def pub(spark, request):
    df = spark.createDataFrame(ROWS, SCHEMA)
    return df if request.param == "messages" else TR.traffic_base(df, 60)


def test_the_base_has_one_row_per_minute_node_publisher_and_topic(spark):
    base = TR.traffic_base(spark.createDataFrame(ROWS, SCHEMA), 60)
    expected = spark.createDataFrame(
        [
            (ts("12:00:00"), ts("12:01:00"), "n1", "p1", "a/b/c", 1, 10, ts("12:00:05"), ts("12:00:05")),
            (ts("12:00:00"), ts("12:01:00"), "n1", "p1", "a/b/d", 1, 20, ts("12:00:30"), ts("12:00:30")),
            (ts("12:00:00"), ts("12:01:00"), "n2", "p2", "a/b/c", 1, 5, ts("12:00:59.999"), ts("12:00:59.999")),
            (ts("12:01:00"), ts("12:02:00"), "n2", "p2", "a/x", 1, 7, ts("12:01:00"), ts("12:01:00")),
            (ts("12:01:00"), ts("12:02:00"), "n1", "p3", "z", 1, 1, ts("12:01:10"), ts("12:01:10")),
            (ts("12:01:00"), ts("12:02:00"), "n2", "p2", "a/b/c", 1, 3, ts("12:01:50"), ts("12:01:50")),
            (ts("12:02:00"), ts("12:03:00"), "n1", "p1", "a/b/c", 1, 4, ts("12:02:00"), ts("12:02:00")),
        ],
        f"{W}, origin string, publisher string, topic string, messages long, bytes long, first timestamp, "
        f"last timestamp",
    )
    assertDataFrameEqual(base, expected)


def test_per_topic_and_minute(spark, pub):
    expected = spark.createDataFrame(
        [
            (ts("12:00:00"), ts("12:01:00"), "a/b/c", 2, 15, 2 / 60, 15 / 60),
            (ts("12:00:00"), ts("12:01:00"), "a/b/d", 1, 20, 1 / 60, 20 / 60),
            (ts("12:01:00"), ts("12:02:00"), "a/b/c", 1, 3, 1 / 60, 3 / 60),
            (ts("12:01:00"), ts("12:02:00"), "a/x", 1, 7, 1 / 60, 7 / 60),
            (ts("12:01:00"), ts("12:02:00"), "z", 1, 1, 1 / 60, 1 / 60),
            (ts("12:02:00"), ts("12:03:00"), "a/b/c", 1, 4, 1 / 60, 4 / 60),
        ],
        f"{W}, topic string, messages long, bytes long, msgs_per_s double, bytes_per_s double",
    )
    assertDataFrameEqual(TR.traffic_by(pub, ["topic"], 60), expected)


def test_per_node_and_minute(spark, pub):
    expected = spark.createDataFrame(
        [
            (ts("12:00:00"), ts("12:01:00"), "n1", 2, 30, 2 / 60, 30 / 60),
            (ts("12:00:00"), ts("12:01:00"), "n2", 1, 5, 1 / 60, 5 / 60),
            (ts("12:01:00"), ts("12:02:00"), "n1", 1, 1, 1 / 60, 1 / 60),
            (ts("12:01:00"), ts("12:02:00"), "n2", 2, 10, 2 / 60, 10 / 60),
            (ts("12:02:00"), ts("12:03:00"), "n1", 1, 4, 1 / 60, 4 / 60),
        ],
        f"{W}, origin string, messages long, bytes long, msgs_per_s double, bytes_per_s double",
    )
    assertDataFrameEqual(TR.traffic_by(pub, ["origin"], 60), expected)


def test_per_topic_prefix_of_two_levels_and_two_minute_windows(spark, pub):
    expected = spark.createDataFrame(
        [
            (ts("12:00:00"), ts("12:02:00"), "a/b", 4, 38, 4 / 120, 38 / 120),
            (ts("12:00:00"), ts("12:02:00"), "a/x", 1, 7, 1 / 120, 7 / 120),
            (ts("12:00:00"), ts("12:02:00"), "z", 1, 1, 1 / 120, 1 / 120),
            (ts("12:02:00"), ts("12:04:00"), "a/b", 1, 4, 1 / 120, 4 / 120),
        ],
        f"{W}, prefix string, messages long, bytes long, msgs_per_s double, bytes_per_s double",
    )
    assertDataFrameEqual(TR.traffic_by(TR.with_prefix(pub, 2), ["prefix"], 120), expected)


def test_per_publisher_over_the_whole_range(spark, pub):
    expected = spark.createDataFrame(
        [
            ("n1", "p1", 3, 34, ts("12:00:05"), ts("12:02:00"), 3 / 180, 3 / 7),
            ("n2", "p2", 3, 15, ts("12:00:59.999"), ts("12:01:50"), 3 / 180, 3 / 7),
            ("n1", "p3", 1, 1, ts("12:01:10"), ts("12:01:10"), 1 / 180, 1 / 7),
        ],
        "origin string, publisher string, messages long, bytes long, first timestamp, last timestamp, "
        "msgs_per_s double, share double",
    )
    assertDataFrameEqual(TR.traffic_totals(pub, ["origin", "publisher"], 180.0), expected)


def test_top_talkers_rank_by_messages_then_bytes(spark, pub):
    expected = spark.createDataFrame(
        [
            (1, "n1", "p1", 3, 34, 3 / 7),  # p1 and p2 both sent 3: p1's 34 bytes beat p2's 15
            (2, "n2", "p2", 3, 15, 3 / 7),
        ],
        "rank int, origin string, publisher string, messages long, bytes long, share double",
    )
    assertDataFrameEqual(TR.top_talkers(pub, 2), expected, checkRowOrder=True)


def test_summary(spark, pub):
    expected = spark.createDataFrame(
        [(7, 50, 3, 4, 2, ts("12:00:05"), ts("12:02:00"))],
        "messages long, bytes long, publishers long, topics long, nodes long, first timestamp, last timestamp",
    )
    assertDataFrameEqual(TR.traffic_summary(pub), expected)


@pytest.mark.parametrize("rollup", [False, True])
def test_summary_of_nothing(spark, rollup):
    empty = spark.createDataFrame([], SCHEMA)
    empty = TR.traffic_base(empty, 60) if rollup else empty
    expected = spark.createDataFrame(
        [(0, 0, 0, 0, 0, None, None)],
        "messages long, bytes long, publishers long, topics long, nodes long, first timestamp, last timestamp",
    )
    assertDataFrameEqual(TR.traffic_summary(empty), expected)


@pytest.mark.parametrize("window,level,top", [(60, 2, 10), (120, 1, 2)])
def test_the_batch_tables_from_one_query_are_the_transforms_tables(spark, window, level, top):
    """The batch job's tables (every key set rolled up in one Spark query, cut apart on the
    driver by split_rollups) equal, row for row and in order, those of the transforms above,
    one query each; ``complete`` marks the windows inside the range."""
    import datetime as dt

    base = TR.traffic_base(spark.createDataFrame(ROWS, SCHEMA), window)
    data = TR.traffic_rollups(base, level).toArrow()
    first, last = TR.rollup_span(data)
    assert (first, last) == (ts("12:00:05"), ts("12:02:00"))
    assert TR.rollup_summary(data) == {"messages": 7, "bytes": 50, "publishers": 3, "topics": 4, "nodes": 2}
    span = (last - first).total_seconds()
    start, end = ts("12:00:00"), ts("12:02:00")  # (the last window, from 12:02, is partial)
    tables = TR.split_rollups(data, window, span, start, end, top)
    per_window = {
        "per_node": ["origin"],
        "per_prefix": ["prefix"],
        "per_topic": ["topic"],
        "per_publisher": ["origin", "publisher"],
    }
    for name, keys in per_window.items():
        src = TR.with_prefix(base, level) if name == "per_prefix" else base
        expected = TR.traffic_by(src, keys, window).orderBy("window_start", *keys)
        got = tables[name]
        assert got.column_names[:-1] == expected.columns, name
        assertDataFrameEqual(spark.createDataFrame(got.drop_columns(["complete"])), expected, checkRowOrder=True)
        ends = got["window_end"].to_pylist()
        assert got["complete"].to_pylist() == [e <= end for e in ends], name
    assertDataFrameEqual(
        spark.createDataFrame(tables["topics"]), TR.traffic_totals(base, ["topic"], span), checkRowOrder=True
    )
    assertDataFrameEqual(
        spark.createDataFrame(tables["nodes"]), TR.traffic_totals(base, ["origin"], span), checkRowOrder=True
    )
    assertDataFrameEqual(spark.createDataFrame(tables["top_talkers"]), TR.top_talkers(base, top), checkRowOrder=True)
    assert isinstance(first, dt.datetime)
