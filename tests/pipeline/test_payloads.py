"""The payload transforms on eight hand-made messages; every expected row was worked out by hand.

    #  time      topic    payload
    1  12:00:01  s/a/t1   {"t": 20.5, "h": 40}
    2  12:00:02  s/a/t2   {"t": 21.5, "h": 50, "meta": {"v": 3}}
    3  12:00:03  s/b/t1   {"t": 10}
    4  12:00:04  s/a/t1   hello                   not JSON
    5  12:00:05  s/b/t1   [1, 2]                  JSON, but not an object
    6  12:01:00  s/a/t1   {"t": 22.5, "h": null}
    7  12:01:01  s/b/t2   ff fe (bytes)           not UTF-8
    8  12:01:02  s/a/t3   {"t": "warm"}           an object whose t is not a number

Percentiles are percentile_approx's: the value of rank ceil(p * n) in ascending order
(exact for inputs this small), so p50 of [20.5, 21.5] is 20.5 and p95 is 21.5.
"""

from __future__ import annotations

import pytest
from pyspark.sql import types as T
from pyspark.testing import assertDataFrameEqual

from mqttmesh.pipeline import payloads as P
from mqttmesh.pipeline.common import OTHER, with_pattern
from support.pipeline import ts

pytestmark = pytest.mark.spark

ROWS = [
    (ts("12:00:01"), "s/a/t1", b'{"t": 20.5, "h": 40}'),
    (ts("12:00:02"), "s/a/t2", b'{"t": 21.5, "h": 50, "meta": {"v": 3}}'),
    (ts("12:00:03"), "s/b/t1", b'{"t": 10}'),
    (ts("12:00:04"), "s/a/t1", b"hello"),
    (ts("12:00:05"), "s/b/t1", b"[1, 2]"),
    (ts("12:01:00"), "s/a/t1", b'{"t": 22.5, "h": null}'),
    (ts("12:01:01"), "s/b/t2", b"\xff\xfe"),
    (ts("12:01:02"), "s/a/t3", b'{"t": "warm"}'),
]
W = "window_start timestamp, window_end timestamp"
STATS = "count long, min double, max double, mean double, p50 double, p95 double"


@pytest.fixture(scope="module")
def flagged(spark):
    df = spark.createDataFrame(ROWS, "timestamp timestamp, topic string, payload binary")
    return P.with_json_flag(with_pattern(df, level=2))


def test_patterns_by_level_and_by_filters(spark):
    df = spark.createDataFrame([("s/a/t1",), ("s/a",), ("s",), ("x/y/z/w",)], "topic string")
    by_level = spark.createDataFrame(
        [("s/a/t1", "s/a/#"), ("s/a", "s/a"), ("s", "s"), ("x/y/z/w", "x/y/#")], "topic string, pattern string"
    )
    assertDataFrameEqual(with_pattern(df, level=2), by_level)
    by_filter = spark.createDataFrame(
        [("s/a/t1", "s/+/t1"), ("s/a", "s/#"), ("s", "s/#"), ("x/y/z/w", OTHER)], "topic string, pattern string"
    )
    assertDataFrameEqual(with_pattern(df, patterns=["s/+/t1", "s/#"]), by_filter)


def test_only_json_objects_count_as_json(spark, flagged):
    assert [r.is_json for r in flagged.orderBy("timestamp").collect()] == [
        True,
        True,
        True,
        False,
        False,
        True,
        False,
        True,
    ]
    # an object whose field does not fit the schema keeps its other fields
    parsed = P.parse_payloads(flagged, T.DataType.fromDDL("t double, h double"))
    assert [tuple(r.json) if r.json else None for r in parsed.orderBy("timestamp").collect()] == [
        (20.5, 40.0),
        (21.5, 50.0),
        (10.0, None),
        None,
        None,
        (22.5, None),
        None,
        (None, None),
    ]


def test_quality_counts_what_is_not_json_per_pattern(spark, flagged):
    expected = spark.createDataFrame(
        [("s/a/#", 5, 4, 1, 1 / 5), ("s/b/#", 3, 1, 2, 2 / 3)],
        "pattern string, messages long, json long, non_json long, non_json_share double",
    )
    assertDataFrameEqual(P.payload_quality(flagged), expected)


def test_stats_per_pattern_field_and_minute_with_a_given_schema(spark, flagged):
    schema = T.DataType.fromDDL("t double, h double, meta struct<v: bigint>")
    fields = P.numeric_fields(schema)
    assert fields == [("t",), ("h",), ("meta", "v")]
    melted = P.melt_numeric(P.parse_payloads(flagged.where("is_json"), schema), fields)
    expected = spark.createDataFrame(
        [
            (ts("12:00:00"), ts("12:01:00"), "s/a/#", "h", 2, 40.0, 50.0, 45.0, 40.0, 50.0),
            (ts("12:00:00"), ts("12:01:00"), "s/a/#", "meta.v", 1, 3.0, 3.0, 3.0, 3.0, 3.0),
            (ts("12:00:00"), ts("12:01:00"), "s/a/#", "t", 2, 20.5, 21.5, 21.0, 20.5, 21.5),
            (ts("12:00:00"), ts("12:01:00"), "s/b/#", "t", 1, 10.0, 10.0, 10.0, 10.0, 10.0),
            (ts("12:01:00"), ts("12:02:00"), "s/a/#", "t", 1, 22.5, 22.5, 22.5, 22.5, 22.5),
        ],
        f"{W}, pattern string, field string, {STATS}",
    )
    assertDataFrameEqual(P.payload_stats(melted, 60), expected)


def test_totals_over_the_whole_range(spark, flagged):
    schema = T.DataType.fromDDL("t double")
    melted = P.melt_numeric(P.parse_payloads(flagged.where("is_json"), schema), [("t",)])
    # s/a/#: t = 20.5, 21.5, 22.5 -> p50 rank ceil(1.5) = 2 -> 21.5, p95 rank ceil(2.85) = 3 -> 22.5
    expected = spark.createDataFrame(
        [("s/a/#", "t", 3, 20.5, 22.5, 21.5, 21.5, 22.5), ("s/b/#", "t", 1, 10.0, 10.0, 10.0, 10.0, 10.0)],
        f"pattern string, field string, {STATS}",
    )
    assertDataFrameEqual(P.payload_totals(melted), expected)


def test_an_inferred_schema_finds_the_numeric_leaves(spark, flagged):
    extra = spark.createDataFrame(
        [(ts("12:00:09"), "s/c/x", b'{"t": 1, "ok": true, "name": "x", "list": [1, 2]}')],
        "timestamp timestamp, topic string, payload binary",
    )
    sample = P.with_json_flag(with_pattern(extra, level=2)).unionByName(flagged.where("topic != 's/a/t3'"))
    schema = P.infer_schema(spark, sample)
    # inferred fields come sorted by name: h, list, meta, name, ok, t; t mixes 20.5 and 10 -> double
    assert P.numeric_fields(schema) == [("h",), ("meta", "v"), ("t",)]
    assert isinstance(schema["t"].dataType, T.DoubleType)
    assert isinstance(schema["ok"].dataType, T.BooleanType)


def test_no_json_at_all_gives_no_fields_and_no_rows(spark):
    df = spark.createDataFrame([(ts("12:00:00"), "x", b"plain")], "timestamp timestamp, topic string, payload binary")
    flagged = P.with_json_flag(with_pattern(df, level=1))
    schema = P.infer_schema(spark, flagged)
    assert schema.fields == [] and P.numeric_fields(schema) == []
    assert P.melt_numeric(P.parse_payloads(flagged, schema), []).count() == 0


def test_the_schema_inferred_on_the_driver_is_sparks(spark):
    """payloads.schema_of (plain Python: no Spark job, no RDD) gives the schema Spark's own
    JSON inference gives, on objects that mix every kind of value."""
    texts = [
        '{"t": 20.5, "h": 40, "ok": true, "name": "x", "meta": {"v": 3, "fw": "1.2"}, "list": [1, 2]}',
        '{"t": 10, "h": null, "gone": null, "meta": {"v": 3.5}, "list": [1.5], "mixed": 1}',
        '{"ok": false, "mixed": "one", "deep": {"a": {"b": 1}}, "empty": [], "objs": [{"x": 1}, {"y": 2.0}]}',
        '{"zeta": 1, "Alpha": 2, "big": 123456789012345678, "neg": -1e-3, "flag": 1}',
        '{"flag": true, "meta": 7}',
        "[1, 2]",
        "not json",
    ]
    objects = [t for t in texts if t.startswith("{")]
    sparks = spark.read.json(spark.sparkContext.parallelize(objects, 1)).schema
    assert P.schema_of(texts) == sparks
    assert P.schema_of([]) == T.StructType([]) == P.schema_of(["[1]", "3", "x"])


TRICKY = [
    (ts("12:02:00"), "s/c/t1", b'[{"t": 1}]'),  # an array of objects: not an object
    (ts("12:02:01"), "s/c/t1", b'{"t": 1} x'),  # trailing text after an object (Spark reads the object)
    (ts("12:02:02"), "s/c/t1", b'  {"h": 7}  '),  # blanks around
    (ts("12:02:03"), "s/c/t1", b'{"other": 1}'),  # an object with none of the fields
    (ts("12:02:04"), "s/c/t1", b"{}"),
    (ts("12:02:05"), "s/c/t1", b'{"t": 1'),  # cut short
    (ts("12:02:06"), "s/c/t1", b'{"t": NaN, "h": 3}'),  # NaN is not a value
    (ts("12:02:07"), "s/c/t1", b"null"),
    (ts("12:02:08"), "s/c/t1", b'{"meta": {"v": 9}, "t": "x"}'),
]


def same(a, b) -> bool:
    """Two pyarrow tables of the same columns, types and rows in order (a column's
    nullability aside: Spark marks some not null, a union of tables none)."""
    return [(f.name, f.type) for f in a.schema] == [
        (f.name, f.type) for f in b.schema
    ] and a.to_pylist() == b.to_pylist()


@pytest.mark.parametrize("window", [60, 120])
def test_the_single_pass_gives_the_tables_of_the_transforms(spark, window):
    """payload_pass + stats_of / totals_of / quality_of (the batch job's one reading of each
    payload, quantiles from KLL sketches, exact at this size) equal the per-message transforms
    the stream job uses (classified by json_object_keys, parsed, melted)."""
    df = spark.createDataFrame(ROWS + TRICKY, "timestamp timestamp, topic string, payload binary")
    patterned = with_pattern(df, level=2)
    schema = T.DataType.fromDDL("t double, h double, meta struct<v: bigint, w: string>, other double")
    fields = [("t",), ("h",), ("meta", "v")]
    passed = P.payload_pass(patterned, schema, fields, window)
    flagged = P.with_json_flag(patterned)
    melted = P.melt_numeric(P.parse_payloads(flagged.where("is_json"), schema), fields)
    assertDataFrameEqual(P.quality_of(passed), P.payload_quality(flagged))
    assertDataFrameEqual(P.stats_of(passed, fields), P.payload_stats(melted, window), checkRowOrder=False)
    assertDataFrameEqual(P.totals_of(passed, fields), P.payload_totals(melted))
    assert P.stats_of(passed, []).count() == 0 and P.totals_of(passed, []).count() == 0
    # the same tables taken in one query and cut apart on the driver, in the report's order
    first, last = ts("12:00:01"), ts("12:02:08")
    for chosen in (fields, []):
        parts = P.split_tables(P.tables_of(passed, chosen).toArrow(), first, last)
        assert parts["span"] == (first, last)
        assert same(parts["payload_quality"], P.quality_of(passed).toArrow())
        assert same(parts["payload_totals"], P.totals_of(passed, chosen).toArrow())
        stats = P.stats_of(passed, chosen).orderBy("window_start", "pattern", "field").toArrow()
        assert same(parts["payload_stats"].drop_columns(["complete"]), stats)
        # complete: the window within [first, last] (the first one starts before 12:00:01)
        complete = [r["window_start"] >= first and r["window_end"] <= last for r in stats.to_pylist()]
        assert parts["payload_stats"]["complete"].to_pylist() == complete
        assert (
            P.split_tables(P.tables_of(passed, chosen).toArrow(), None, None)["payload_stats"]["complete"].to_pylist()
            == [False] * stats.num_rows
        )
    # the pass parses with a schema of the chosen fields only
    assert P.pruned(schema, fields).simpleString() == "struct<t:double,h:double,meta:struct<v:bigint>>"
