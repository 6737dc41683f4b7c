"""The payload pass's Arrow side (pipeline/payload_batches.py) against Spark's own parser.

``payloads.payload_pass`` reads each Arrow batch of payloads with Arrow's JSON reader and hands
back, marked ``slow``, every payload Arrow would read otherwise than Spark's ``from_json`` and
``json_object_keys``; ``payloads.spark_pass`` reads them all with Spark's parser. The tables of
the two must be equal, on payloads chosen to tell them apart: each guard of ``fast_rows`` and
``read_objects`` has payloads here that Arrow alone would misread, so removing the slow path,
or a guard, fails these tests.
"""

from __future__ import annotations

import random

import pytest
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.testing import assertDataFrameEqual

from mqttmesh.pipeline import payload_batches as B
from mqttmesh.pipeline import payloads as P
from mqttmesh.pipeline.common import with_pattern
from support.pipeline import ts

pa = pytest.importorskip("pyarrow")

pytestmark = pytest.mark.spark

SCHEMA = T.StructType(
    [
        T.StructField("t", T.DoubleType()),
        T.StructField("h", T.DoubleType()),
        T.StructField("meta", T.StructType([T.StructField("v", T.LongType()), T.StructField("w", T.StringType())])),
        T.StructField("n", T.IntegerType()),
    ]
)
FIELDS = [("t",), ("h",), ("meta", "v"), ("n",)]

# (payload, what Arrow may take: True only for what it reads exactly as Spark)
PAYLOADS = [
    (b'{"t": 20.5, "h": 40}', True),
    (b'{"t": 21.5, "h": 50, "meta": {"v": 3}}', True),
    (b'{"t": 10}', True),
    (b"hello", False),  # not JSON
    (b"[1, 2]", False),  # JSON, not an object
    (b'{"t": 22.5, "h": null}', True),
    (b"\xff\xfe", False),  # not UTF-8
    (b'{"t": "warm"}', True),  # a string for a number: Arrow refuses it (then Spark reads it)
    (b'[{"t": 1}]', False),
    (b'{"t": 1} x', False),  # trailing text: Spark reads the object
    (b'  {"h": 7}\t', True),
    (b'{"other": 1}', True),
    (b"{}", True),
    (b'{"t": 1', False),
    (b'{"t": NaN, "h": 3}', False),  # NaN: not a number for Spark, a double for Arrow
    (b'{"x": NaN, "t": 1}', False),  # ... in a field the pass does not read, too
    (b'{"x": -Infinity, "t": 2}', False),
    (b'{"x": "Info", "t": 3}', False),  # (the letters in a string: Spark's, to be safe)
    (b"null", False),
    (b'{"meta": {"v": 9}, "t": "x"}', True),
    (b'{"x": "\xff", "t": 4}', False),  # invalid UTF-8 in a skipped string: Arrow reads it, Spark not
    (b'{"x": "\xed\xa0\x80", "t": 4}', False),  # (an encoded surrogate)
    (b'{"t": 1, "t": 2}', True),  # a key twice: Arrow refuses it
    (b'{"meta": {"v": 1, "v": 2}}', True),
    (b'{"t": 5}{"t": 6}', True),  # two objects: Arrow reads two rows
    (b'{"t": 5}\n{"t": 6}', True),
    (b'{"t":\n7}', True),
    (b'{"t":\r8}', True),  # (a carriage return is a blank to both)
    (b'\n{"t": 9}', False),
    (b'\xef\xbb\xbf{"t": 9}', False),  # a byte-order mark
    (b'{"t": true}', True),
    (b'{"t": "1"}', True),
    (b'{"t": [1]}', True),
    (b'{"t": {"a": 1}}', True),
    (b'{"meta": 5, "t": 11}', True),  # a number where an object goes: Spark keeps t
    (b'{"meta": null, "t": 12}', True),
    (b'{"meta": [1], "h": 13}', True),
    (b'{"meta": {"v": 3.5}, "t": 14}', True),  # a fraction where an integer goes
    (b'{"meta": {"v": 3.0}}', True),
    (b'{"meta": {"v": 1e2}}', True),
    (b'{"meta": {"v": 9223372036854775808}}', True),  # past a long
    (b'{"meta": {"v": -9223372036854775808}}', True),
    (b'{"n": 2147483648, "t": 15}', True),  # past an int
    (b'{"n": -7}', True),
    (b'{"t": 1e999}', True),  # Spark: Infinity; Arrow refuses it
    (b'{"t": 123456789012345678901234567890}', True),
    (b'{"t": -1e-999, "h": 2.5e-324}', True),
    (b'{"t": -0.0, "h": 0.1e1}', True),
    (b'{"t": 01}', True),
    (b'{"t": .5}', True),
    (b'{"t": 1.}', True),
    (b"{'t': 1}", True),  # single quotes: Spark reads them, Arrow does not
    (b"{t: 1}", True),
    (b'{"t": 1,}', True),
    (b'{"T": 16}', True),  # (names are case-sensitive in both)
    (b'{"\\u0074": 17}', True),
    (b'{"x": "a\\"b", "t": 18}', True),
    (b'{"x": "a\x01b", "t": 19}', True),  # a raw control character in a string
    (b'{"x": "a\x00b", "t": 20}', True),
    (b'{"t": 21}\x00', False),
    (b'{"x": [1, {"y": [null, "z"]}], "t": 22}', True),
    (b'{"x": "\\ud800", "t": 23}', True),  # a lone surrogate escape
    (b'{"t": 24, "pad": "' + b"p" * 1000 + b'"}', False),  # longer than MAX_FAST_BYTES
    (b"", False),
    (b" ", False),
]


def _frame(spark, payloads, topics=("s/a/t1", "s/b/t1", "s/c/t2")):
    rows = [
        (ts(f"12:{(i // 7) % 60:02d}:{i % 60:02d}"), topics[i % len(topics)], payload)
        for i, payload in enumerate(payloads)
    ]
    df = spark.createDataFrame(rows, "timestamp timestamp, topic string, payload binary")
    return with_pattern(df, level=2).select("timestamp", "pattern", "payload")


@pytest.fixture
def batch_rows(spark):
    """Sets Spark's Arrow batch size for one test (and puts it back)."""
    key = "spark.sql.execution.arrow.maxRecordsPerBatch"
    before = spark.conf.get(key)

    def use(rows: int) -> None:
        spark.conf.set(key, str(rows))

    yield use
    spark.conf.set(key, before)


def _without_sketches(df, fields):
    return df.drop(*[f"q{i}" for i in range(len(fields))])


def _assert_same_tables(passed, reference, fields):
    assertDataFrameEqual(_without_sketches(passed, fields), _without_sketches(reference, fields), checkRowOrder=False)
    assertDataFrameEqual(P.quality_of(passed), P.quality_of(reference))
    assertDataFrameEqual(P.stats_of(passed, fields), P.stats_of(reference, fields), checkRowOrder=False)
    assertDataFrameEqual(P.totals_of(passed, fields), P.totals_of(reference, fields))


def test_what_arrow_may_read():
    payloads = pa.array([p for p, _ in PAYLOADS] + [None], pa.binary())
    fast = B.fast_rows(payloads)
    assert [bool(x) for x in fast] == [f for _, f in PAYLOADS] + [False]


def test_the_rows_arrow_refuses_are_found_one_by_one():
    """Of the payloads fast_rows lets through, read_objects leaves to Spark exactly those
    Arrow refuses or reads as more than one object; the others are read in place."""
    schema = B.arrow_schema(P.pruned(SCHEMA, FIELDS))
    payloads = pa.array([p for p, _ in PAYLOADS], pa.binary())
    fast = B.fast_rows(payloads)
    table = B.read_objects(payloads, fast, schema)
    assert table.num_rows == len(PAYLOADS)
    kept = {p for (p, _), f in zip(PAYLOADS, fast, strict=True) if f}
    assert kept == {
        b'{"t": 20.5, "h": 40}',
        b'{"t": 21.5, "h": 50, "meta": {"v": 3}}',
        b'{"t": 10}',
        b'{"t": 22.5, "h": null}',
        b'  {"h": 7}\t',
        b'{"other": 1}',
        b"{}",
        b'{"t":\n7}',  # (a newline is a blank between tokens to both)
        b'{"t":\r8}',
        b'{"meta": null, "t": 12}',
        b'{"meta": {"v": -9223372036854775808}}',
        b'{"n": -7}',
        b'{"t": 123456789012345678901234567890}',
        b'{"t": -1e-999, "h": 2.5e-324}',
        b'{"t": -0.0, "h": 0.1e1}',
        b'{"T": 16}',
        b'{"\\u0074": 17}',
        b'{"x": "a\\"b", "t": 18}',
        b'{"x": [1, {"y": [null, "z"]}], "t": 22}',
    }
    t = {p: r["t"] for (p, _), r, f in zip(PAYLOADS, table.to_pylist(), fast, strict=True) if f}
    assert t[b'{"t": 20.5, "h": 40}'] == 20.5 and t[b'{"\\u0074": 17}'] == 17.0 and t[b'{"T": 16}'] is None
    assert t[b'{"t": 123456789012345678901234567890}'] == 1.2345678901234568e29


def test_kll_images_are_the_ones_spark_writes(spark):
    rng = random.Random(7)
    for n in (1, 2, 3, 999, 1000):
        values = [rng.choice([rng.uniform(-1e6, 1e6), float(rng.randint(0, 5)), -0.0]) for _ in range(n)]
        df = spark.createDataFrame([(v,) for v in values], "v double").coalesce(1)
        sparks = df.agg(F.kll_sketch_agg_double("v", P.KLL_K)).collect()[0][0]
        import numpy as np

        assert B.kll_sketch(np.array(values), P.KLL_K) == bytes(sparks), n


def test_a_batch_by_hand():
    """Six payloads of two windows and two patterns: two groups read by Arrow, whose partial
    rows go back on the first payload Arrow read; one marker for each payload left to Spark;
    nothing on the others."""
    stamps = [ts("12:00:01"), ts("12:00:02"), ts("12:00:59"), ts("12:01:00"), ts("12:00:03"), None]
    payloads = [b'{"t": 2, "h": 1}', b"nope", b'{"t": 4}', b'{"t": 8}', b'{"t": "x"}', b'{"t": 1}']
    patterns = ["a/#", "a/#", "a/#", "b/#", "a/#", "a/#"]
    schema = B.arrow_schema(T.StructType([T.StructField("t", T.DoubleType()), T.StructField("h", T.DoubleType())]))
    out = B.batch_pass(
        pa.array(stamps, pa.timestamp("us", tz="UTC")),
        pa.array(patterns),
        pa.array(payloads, pa.binary()),
        schema,
        [("t",), ("h",)],
        60_000_000,
        1000,
    ).to_pylist()
    a, b = out[0]
    assert (a["slow"], a["window_start"], a["pattern"], a["messages"], a["json"]) == (
        False,
        ts("12:00:00"),
        "a/#",
        2,
        2,
    )
    assert (a["first"], a["last"]) == (ts("12:00:01"), ts("12:00:59"))
    assert (a["c0"], a["lo0"], a["hi0"], a["sum0"]) == (2, 2.0, 4.0, 6.0)
    assert (a["c1"], a["lo1"], a["hi1"], a["sum1"]) == (1, 1.0, 1.0, 1.0)
    assert (b["window_start"], b["pattern"], b["messages"], b["c0"], b["sum0"]) == (ts("12:01:00"), "b/#", 1, 1, 8.0)
    assert (b["c1"], b["lo1"], b["sum1"], b["q1"]) == (0, None, None, None)
    marker = {**dict.fromkeys(a), "slow": True}
    assert out[1:] == [[marker], None, None, [marker], [marker]]  # not JSON; counted in a, b; refused; no time
    import numpy as np

    assert a["q0"] == B.kll_sketch(np.array([2.0, 4.0]), 1000) and a["q1"] == B.kll_sketch(np.array([1.0]), 1000)
    # a batch whose first payloads are Spark's: their markers come before the partial rows
    out = B.batch_pass(
        pa.array(stamps[:3], pa.timestamp("us", tz="UTC")),
        pa.array(patterns[:3]),
        pa.array([b"x", b"y", b'{"t": 4}'], pa.binary()),
        schema,
        [("t",), ("h",)],
        60_000_000,
        1000,
    ).to_pylist()
    assert out[:2] == [[marker], [marker]] and [r["messages"] for r in out[2]] == [1]


@pytest.mark.parametrize("rows_per_batch", [3, 10_000])
@pytest.mark.parametrize("window", [60, 600])
def test_the_arrow_pass_gives_the_tables_of_sparks_parser(spark, batch_rows, rows_per_batch, window):
    """Batches of 3 mix every kind of payload with every other; one batch holds them all."""
    batch_rows(rows_per_batch)
    df = _frame(spark, [p for p, _ in PAYLOADS] * 3)
    passed = P.payload_pass(df, SCHEMA, FIELDS, window)
    reference = P.spark_pass(df, SCHEMA, FIELDS, window)
    _assert_same_tables(passed, reference, FIELDS)
    # the per-message transforms (the stream job's) agree too
    flagged = P.with_json_flag(df)
    melted = P.melt_numeric(P.parse_payloads(flagged.where("is_json"), SCHEMA), FIELDS)
    assertDataFrameEqual(P.quality_of(passed), P.payload_quality(flagged))
    assertDataFrameEqual(P.stats_of(passed, FIELDS), P.payload_stats(melted, window), checkRowOrder=False)


def test_the_slow_path_reads_what_arrow_leaves(spark, batch_rows):
    """Of the payloads above Arrow reads 19 (in one batch); Spark's parser reads the others,
    which count as messages, and several as JSON objects (with their values)."""
    batch_rows(10_000)
    df = _frame(spark, [p for p, _ in PAYLOADS]).coalesce(1)
    passed = P.payload_pass(df, SCHEMA, FIELDS, 3600)
    reference = P.spark_pass(df, SCHEMA, FIELDS, 3600)
    total = passed.agg(F.sum("messages"), F.sum("json"), F.sum("c0")).collect()[0]
    assert tuple(total) == tuple(reference.agg(F.sum("messages"), F.sum("json"), F.sum("c0")).collect()[0])
    assert total[0] == len(PAYLOADS) and total[1] > 19 and total[2] > 12


def test_a_group_of_more_than_k_values_in_one_batch(spark, batch_rows):
    """2,500 values of one window and pattern in one batch: three sketches of at most 1,000
    values, merged by Spark into one of all 2,500."""
    batch_rows(10_000)
    values = list(range(2500))
    random.Random(3).shuffle(values)
    df = _frame(spark, [b'{"t": ' + str(v).encode() + b"}" for v in values], topics=("s/a/t1",)).coalesce(1)
    df = df.withColumn("timestamp", F.lit(ts("12:00:00")))
    passed = P.payload_pass(df, SCHEMA, [("t",)], 60)
    row = passed.select("messages", "c0", "lo0", "hi0", "sum0", F.kll_sketch_get_n_double("q0").alias("n")).collect()
    assert [tuple(r) for r in row] == [(2500, 2500, 0.0, 2499.0, float(sum(values)), 2500)]
    stats = P.stats_of(passed, [("t",)]).collect()[0]
    # KLL, k = 1,000: the rank of each quantile within 1 % of the true one
    assert abs(stats.p50 - 1249) <= 25 and abs(stats.p95 - 2374) <= 25


def test_a_schema_arrow_reads_otherwise_takes_sparks_parser(spark):
    schema = T.StructType([T.StructField("t", T.FloatType()), T.StructField("d", T.DecimalType(10, 2))])
    assert B.arrow_schema(schema) is None
    df = _frame(spark, [b'{"t": 0.1, "d": 1.25}', b'{"t": 3.4028235e38}', b"x"])
    fields = [("t",), ("d",)]
    assertDataFrameEqual(P.payload_pass(df, schema, fields, 60), P.spark_pass(df, schema, fields, 60))


def _random_payload(rng: random.Random) -> bytes:
    numbers = ["0", "-0", "7", "-12", "3.25", "1e3", "-2.5E-3", "12345678901234567890", "0.1", "1e400", "1.5e-320"]
    others = ['"s"', '"NaN"', "true", "false", "null", "[]", "[1, 2]", '{"v": 1}', '{"v": 2.5}', '{"w": "x"}', "{}"]
    keys = ["t", "h", "meta", "n", "other", "T"]
    parts = []
    for key in rng.sample(keys, rng.randint(0, len(keys))):
        if key == "meta":
            value = rng.choice(
                ['{"v": ' + rng.choice(numbers) + "}", '{"v": ' + rng.choice(numbers) + ', "w": "a"}'] + others
            )
        else:
            value = rng.choice(numbers + others)
        parts.append(f'"{key}"{rng.choice([":", ": ", " : "])}{value}')
    text = "{" + rng.choice([",", ", "]).join(parts) + "}"
    mutation = rng.random()
    if mutation < 0.06:
        text = text[: rng.randint(0, len(text))]
    elif mutation < 0.09:
        text = text.replace(": ", ': NaN, "z": ', 1)
    elif mutation < 0.12 and parts:
        text = text[:-1] + ", " + parts[0] + "}"  # a key twice
    elif mutation < 0.14:
        text = text + text
    elif mutation < 0.16:
        text = rng.choice(["[", "1", '"x"', "nul", " "]) + text
    data = text.encode()
    if rng.random() < 0.03:
        data = data.replace(b'"s"', b'"\xc3"')
    return data


def test_random_payloads_agree_with_sparks_parser(spark, batch_rows):
    """2,000 payloads built at random (the seed is printed), mutated to break them in every
    way above, in batches of 50: the tables equal those of Spark's parser."""
    seed = random.randrange(1 << 30)
    print("seed", seed)
    rng = random.Random(seed)
    batch_rows(50)
    df = _frame(spark, [_random_payload(rng) for _ in range(2000)])
    _assert_same_tables(P.payload_pass(df, SCHEMA, FIELDS, 120), P.spark_pass(df, SCHEMA, FIELDS, 120), FIELDS)
