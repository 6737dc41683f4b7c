"""What the ``payloads`` job learns of the payloads before its pass, on the driver: a sample of
the first JSON objects (``sample_payloads``, read with pyarrow from a local archive), their
schema by Spark's rules of inference (``schema_of``), their numeric fields
(``numeric_fields``) and which of those measure something (``measurements``: not identifiers
or counters). Plain Python on a few thousand rows; ``payloads`` holds the Spark transforms.
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import types as T

__all__ = ["sample_payloads", "local_sample", "schema_of", "measurements", "numeric_fields", "COUNTER_SHARE"]

_NUMERIC = (T.ByteType, T.ShortType, T.IntegerType, T.LongType, T.FloatType, T.DoubleType, T.DecimalType)


def sample_payloads(
    df: DataFrame, sample: int = 10_000, files: list[str] | None = None, since=None, until=None
) -> list[tuple[str, object, str]]:
    """(topic, timestamp, text) of the first ``sample`` JSON payloads of ``df`` (a DataFrame
    from ``with_json_flag``): what ``schema_of`` and ``measurements`` look at.

    With ``files``, the Parquet files ``df`` reads (``DataFrame.inputFiles()``) and the
    ``since``/``until`` it was read with, local files are sampled on the driver with pyarrow,
    in the order of their paths (the archive's hours in order): no Spark job, which at 1 M rows
    is a tenth of the job's time (its first query, on a JVM not yet warm). Anything else (a
    URI, a file pyarrow cannot read) is sampled by Spark, in its partitions' order."""
    if files:
        rows = local_sample(files, int(sample), since, until)
        if rows is not None:
            return rows
    found = df.where("is_json").select("topic", "timestamp", "text").limit(int(sample)).collect()
    return [(r.topic, r.timestamp, r.text) for r in found]


def local_sample(files: list[str], sample: int, since, until) -> list[tuple[str, object, str]] | None:
    """``sample_payloads`` on the driver; None when a file is not local or pyarrow cannot read it."""
    import json

    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    paths = []
    for f in files:
        if f.startswith("file:"):
            f = f[len("file:") :]
            f = "/" + f.lstrip("/") if f.startswith("//") else f
        elif "://" in f:
            return None
        paths.append(f)
    out: list[tuple[str, object, str]] = []

    def no_constant(name: str) -> object:  # (NaN, Infinity: not JSON, as json_object_keys says)
        raise ValueError(name)

    try:
        for path in sorted(paths):
            for batch in pq.ParquetFile(path).iter_batches(4096, columns=["topic", "timestamp", "payload"]):
                if since is not None:
                    batch = batch.filter(pc.greater_equal(batch.column("timestamp"), since))
                if until is not None:
                    batch = batch.filter(pc.less(batch.column("timestamp"), until))
                for topic, ts, payload in zip(
                    *(batch.column(c).to_pylist() for c in ("topic", "timestamp", "payload")), strict=True
                ):
                    if payload is None:
                        continue
                    try:
                        text = payload.decode()
                        value = json.loads(text, parse_constant=no_constant)
                    except (ValueError, RecursionError):
                        continue
                    if isinstance(value, dict):
                        out.append((topic, ts, text))
                        if len(out) >= sample:
                            return out
    except (OSError, ValueError, KeyError):  # (pyarrow's errors are these; Spark reads it then)
        return None
    return out


def schema_of(texts: list[str]) -> T.StructType:
    """The schema of JSON objects ``texts`` by Spark's rules of JSON schema inference, on the
    driver (no Spark job, and no RDD: a Spark Connect session has none): fields sorted by
    name; integers LONG, other numbers DOUBLE, the two together DOUBLE; true/false BOOLEAN;
    objects STRUCT, arrays ARRAY of their elements' type; anything else, mixed kinds and
    fields only ever null STRING. Texts that are not JSON objects are skipped."""
    import json

    merged: object = None
    for text in texts:
        try:
            value = json.loads(text)
        except ValueError:
            continue
        if isinstance(value, dict):
            merged = _merge(merged, _type_of(value))
    if not isinstance(merged, T.StructType):
        return T.StructType([])
    return _no_nulls(merged)  # type: ignore[return-value]  # (a struct stays a struct)


def _type_of(value) -> T.DataType | None:
    """A JSON value's type as Spark infers it; None for null (merges into anything)."""
    if value is None:
        return None
    if isinstance(value, bool):
        return T.BooleanType()
    if isinstance(value, int):
        return T.LongType() if -(2**63) <= value < 2**63 else T.DoubleType()
    if isinstance(value, float):
        return T.DoubleType()
    if isinstance(value, str):
        return T.StringType()
    if isinstance(value, list):
        element = None
        for item in value:
            element = _merge(element, _type_of(item))
        return T.ArrayType(element if element is not None else T.NullType())
    fields = [T.StructField(k, _type_of(v) or T.NullType()) for k, v in sorted(value.items())]
    return T.StructType(fields)


def _merge(a, b):
    """The type of values of types ``a`` and ``b`` (Spark's compatibleType for JSON)."""
    if a is None or isinstance(a, T.NullType):
        return b
    if b is None or isinstance(b, T.NullType):
        return a
    if a == b:
        return a
    numbers = (T.LongType, T.DoubleType)
    if isinstance(a, numbers) and isinstance(b, numbers):
        return T.DoubleType()
    if isinstance(a, T.StructType) and isinstance(b, T.StructType):
        types = {f.name: f.dataType for f in a.fields}
        for f in b.fields:
            types[f.name] = _merge(types.get(f.name), f.dataType)
        return T.StructType([T.StructField(k, types[k] or T.NullType()) for k in sorted(types)])
    if isinstance(a, T.ArrayType) and isinstance(b, T.ArrayType):
        return T.ArrayType(_merge(a.elementType, b.elementType) or T.NullType())
    return T.StringType()


def _no_nulls(t: T.DataType) -> T.DataType:
    """NULL types (fields only ever null, empty arrays) as STRING, as Spark leaves them."""
    if isinstance(t, T.NullType):
        return T.StringType()
    if isinstance(t, T.StructType):
        return T.StructType([T.StructField(f.name, _no_nulls(f.dataType)) for f in t.fields])
    if isinstance(t, T.ArrayType):
        return T.ArrayType(_no_nulls(t.elementType))
    return t


# a numeric field by one of these names (or ending in _id / Id) names or counts messages, it
# does not measure anything: its mean and percentiles mean nothing
_NOT_MEASURED = {
    "seq",
    "seqno",
    "seq_no",
    "sequence",
    "sequence_number",
    "counter",
    "id",
    "msgid",
    "msg_id",
    "message_id",
    "ts",
    "time",
    "timestamp",
    "epoch",
}
# the share of a sample's topics (those with 3 values or more) on which an integer field rises
# on every message that makes it a counter. (A field with one value per topic is not taken for
# an identifier from the data: a battery level that did not move in the sample looks the same,
# and its statistics across devices mean something; identifiers are known by name.)
COUNTER_SHARE = 0.9


def measurements(
    fields: list[tuple[str, ...]], sample: list[tuple[str, object, str]]
) -> tuple[list[tuple[str, ...]], dict[str, str]]:
    """The numeric ``fields`` that measure something, and the others with the reason they
    were left out: by name (``seq``, ``id``, ``*_id``, ``timestamp``...), or, from ``sample``
    (``sample_payloads``), integers that rise on every message of (nearly) every topic
    (counters). Pure Python, on the driver: the sample is a few thousand rows."""
    import json

    left_out: dict[str, str] = {}
    rest = []
    for path in fields:
        name = path[-1]
        if name.lower() in _NOT_MEASURED or name.lower().endswith("_id") or (name.endswith("Id") and len(name) > 2):
            left_out[".".join(path)] = "an identifier or counter by its name"
        else:
            rest.append(path)
    if not rest or not sample:
        return rest, left_out
    per_topic: dict[str, list[tuple[object, list]]] = {}
    for topic, ts, text in sample:
        try:
            obj = json.loads(text)
        except ValueError:
            continue
        values = []
        for path in rest:
            v = obj
            for key in path:
                v = v.get(key) if isinstance(v, dict) else None
            values.append(v)
        per_topic.setdefault(topic, []).append((ts, values))
    kept = []
    for i, path in enumerate(rest):
        series: list[list[int]] = []
        for rows in per_topic.values():
            vals = [v[i] for _, v in sorted(rows, key=lambda r: (r[0] is None, r[0]))]
            vals = [v for v in vals if v is not None]
            if not all(isinstance(v, int) and not isinstance(v, bool) for v in vals):
                series = []
                break  # (a float anywhere: a measurement)
            if len(vals) >= 3:
                series.append(vals)
        if series:
            rising = sum(all(b > a for a, b in zip(s, s[1:], strict=False)) for s in series)
            if rising >= COUNTER_SHARE * len(series):
                left_out[".".join(path)] = "a counter: it rises on every message of a topic"
                continue
        kept.append(path)
    return kept, left_out


def numeric_fields(schema: T.StructType, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Paths of the numeric leaves of a JSON schema (nested objects included, arrays not)."""
    out = []
    for field in schema.fields:
        path = prefix + (field.name,)
        if isinstance(field.dataType, T.StructType):
            out.extend(numeric_fields(field.dataType, path))
        elif isinstance(field.dataType, _NUMERIC):
            out.append(path)
    return out
