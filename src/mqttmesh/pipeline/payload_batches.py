"""The payload pass's work on one Arrow batch, in Spark's Python worker: the batch's JSON
payloads read at once by Arrow's JSON reader (C++: one buffer of the payloads, one a line), then
counted, summed and sketched per window and topic pattern with numpy. No Python runs per row.

What it leaves to its caller (``payloads.payload_pass``): every payload it cannot read exactly
as Spark's ``from_json`` and ``json_object_keys`` would, which it marks ``slow`` for Spark's own
parser; the merging of the batches' partial rows; time windows as Spark defines them (a partial
row's ``window_start`` is a window's first microsecond, floor-aligned as Spark's ``window``).
"""

from __future__ import annotations

import struct

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj
from pyspark.sql import types as T

__all__ = ["arrow_schema", "fast_rows", "read_objects", "kll_sketch", "batch_pass", "result_type", "MAX_FAST_BYTES"]

# a payload longer than this goes to Spark's parser: within it no number, name or nesting can
# reach the limits of Spark's JSON parser (Jackson's StreamReadConstraints: 1,000 digits, depth
# 1,000), so a payload Arrow reads is one Spark reads too
MAX_FAST_BYTES = 1000

_ARROW: dict[type, pa.DataType] = {
    T.ByteType: pa.int8(),
    T.ShortType: pa.int16(),
    T.IntegerType: pa.int32(),
    T.LongType: pa.int64(),
    T.DoubleType: pa.float64(),
}
# JSON tokens that are not numbers under the pass's strict options (allowNonNumericNumbers
# false), which Arrow's reader takes for numbers (NaN, Inf, Infinity, signed): a payload holding
# these letters anywhere, in a string too, is Spark's to read
_NON_NUMERIC = (b"NaN", b"Inf")


def arrow_schema(schema: T.StructType) -> pa.Schema | None:
    """The Arrow schema that reads ``schema``'s fields as ``from_json`` does, or None when one of
    its types converts differently (FLOAT rounds through a double in Spark; DECIMAL, strings,
    booleans, arrays are not what the pass reads)."""

    def arrow_type(t: T.DataType) -> pa.DataType | None:
        if isinstance(t, T.StructType):
            fields = [(f.name, arrow_type(f.dataType)) for f in t.fields]
            if any(a is None for _, a in fields):
                return None
            return pa.struct(fields)
        return _ARROW.get(type(t))

    top = arrow_type(schema)
    return pa.schema(list(top)) if top is not None else None


def fast_rows(payload: pa.Array) -> np.ndarray:
    """Which payloads Arrow's reader may take: present, at most MAX_FAST_BYTES, a ``{...}``
    between blanks (spaces, tabs), valid UTF-8 (Arrow's reader does not check strings it
    skips; Spark's parser refuses them), no NaN or Infinity token. (Control characters and
    newlines need no check: Arrow's reader refuses the first, and a newline splits a payload
    into lines it refuses or into more objects than payloads: ``read_objects`` finds both.)"""
    ok = pc.fill_null(pc.less_equal(pc.binary_length(payload), MAX_FAST_BYTES), False)
    text = payload.cast(pa.binary()).view(pa.string())  # (bytes as they are: checked below)
    trimmed = pc.ascii_trim(text, " \t")
    ok = pc.and_(ok, pc.and_(pc.starts_with(trimmed, "{"), pc.ends_with(trimmed, "}")))
    mask = _numpy(pc.fill_null(ok, False), bool)
    mask[_holding(payload, _NON_NUMERIC)] = False
    _mark_invalid_utf8(text, mask, 0, len(payload))
    return mask


def _holding(payload: pa.Array, tokens: tuple[bytes, ...]) -> np.ndarray:
    """The rows of ``payload`` (a binary array) holding one of ``tokens`` (three bytes each,
    first bytes rare in JSON numbers): numpy over the array's bytes, where Arrow's substring
    search costs 2.5 ns a byte."""
    binary = payload.cast(pa.binary())
    if len(binary) == 0:
        return np.zeros(0, dtype=np.int64)
    offsets = np.frombuffer(binary.buffers()[1], dtype=np.int32, count=len(binary) + 1, offset=binary.offset * 4)
    data = np.frombuffer(binary.buffers()[2] or b"", dtype=np.uint8)[offsets[0] : offsets[-1]]
    starts = np.zeros(len(data), dtype=bool)
    for first in {t[0] for t in tokens}:
        starts |= data == first
    at = np.flatnonzero(starts)
    at = at[at + 2 < len(data)]
    hit = np.zeros(len(at), dtype=bool)
    for token in tokens:
        hit |= (data[at] == token[0]) & (data[at + 1] == token[1]) & (data[at + 2] == token[2])
    # (a token across two payloads marks the first: too careful, never wrong)
    return np.searchsorted(offsets - offsets[0], at[hit], side="right") - 1


def _mark_invalid_utf8(text: pa.Array, mask: np.ndarray, lo: int, hi: int) -> None:
    """Clears ``mask`` where ``text[lo:hi]`` is not UTF-8, halving the range until each bad
    row is found (one C++ check when the batch is clean, as it nearly always is)."""
    try:
        text.slice(lo, hi - lo).validate(full=True)
        return
    except pa.ArrowInvalid:
        pass
    if hi - lo == 1:
        mask[lo] = False
        return
    mid = (lo + hi) // 2
    _mark_invalid_utf8(text, mask, lo, mid)
    _mark_invalid_utf8(text, mask, mid, hi)


def _read(payload: pa.Array, schema: pa.Schema) -> pa.Table | None:
    """The payloads, one a line, read with ``schema`` (other fields skipped); None when Arrow
    refuses the lines or reads another number of objects than there are lines (two objects on
    one line)."""
    n = len(payload)
    lines = pc.binary_join_element_wise(payload.cast(pa.binary()), pa.scalar(b"", pa.binary()), b"\n")
    data = lines.buffers()[2]
    offsets = np.frombuffer(lines.buffers()[1], dtype=np.int32, count=n + 1, offset=lines.offset * 4)
    buf = data.slice(int(offsets[0]), int(offsets[-1] - offsets[0]))
    try:
        table = pj.read_json(
            pa.BufferReader(buf),
            read_options=pj.ReadOptions(use_threads=False, block_size=max(buf.size + 1, 1 << 16)),
            parse_options=pj.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore"),
        )
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None
    return table if table.num_rows == n else None


def read_objects(payload: pa.Array, fast: np.ndarray, schema: pa.Schema) -> pa.Table:
    """``payload`` read with ``schema``, one row per payload; rows where ``fast`` is false (and
    comes out false: the payloads Arrow's reader refused, found by halving the batch until
    each is alone) read as ``{}``."""
    n = len(payload)
    empty = pa.scalar(b"{}", pa.binary())
    lines = pc.if_else(pa.array(fast), payload.cast(pa.binary()), empty)
    tables: list[pa.Table] = []

    def read(lo: int, hi: int) -> None:
        part = lines.slice(lo, hi - lo)
        table = _read(part, schema)
        if table is not None:
            tables.append(table)
            return
        if hi - lo == 1:
            fast[lo] = False
            empty = _read(pa.array([b"{}"], pa.binary()), schema)
            assert empty is not None
            tables.append(empty)
            return
        mid = (lo + hi) // 2
        read(lo, mid)
        read(mid, hi)

    if n:
        read(0, n)
        return pa.concat_tables(tables).combine_chunks()
    return schema.empty_table()


def _leaf(table: pa.Table, path: tuple[str, ...]) -> np.ndarray:
    """A numeric leaf as doubles, NaN where absent (null, or a null struct on the way)."""
    col = table.column(path[0])
    for name in path[1:]:
        col = pc.struct_field(col, name)
    # (a long past 2^53 rounds to the nearest double, as Spark casts it)
    return _numpy(pc.fill_null(pc.cast(col, pa.float64(), safe=False), np.nan), np.float64)


def kll_sketch(values: np.ndarray, k: int) -> bytes:
    """The compact image of a KLL sketch (Apache DataSketches' format, as Spark's
    ``kll_sketch_agg_double`` writes it) holding ``values`` exactly: 1 to ``k`` doubles, none
    NaN, in the order they came."""
    n = len(values)
    if n == 1:  # (single-item form: 2 preamble ints, serial version 2, flag SINGLE_ITEM)
        return struct.pack("<BBBBHBx", 2, 2, 15, 4, k, 8) + values.astype("<f8").tobytes()
    head = struct.pack("<BBBBHBxQHBxI", 5, 1, 15, 0, k, 8, n, k, 1, k - n)
    bounds = struct.pack("<dd", float(values.min()), float(values.max()))
    return head + bounds + values[::-1].astype("<f8").tobytes()  # (level 0 fills downwards)


def result_type(fields: int) -> T.ArrayType:
    """The Spark type of ``batch_pass``'s rows: a list of partial rows."""
    cols = [
        T.StructField("slow", T.BooleanType()),
        T.StructField("window_start", T.TimestampType()),
        T.StructField("pattern", T.StringType()),
        T.StructField("messages", T.LongType()),
        T.StructField("json", T.LongType()),
        T.StructField("first", T.TimestampType()),
        T.StructField("last", T.TimestampType()),
    ]
    for i in range(fields):
        cols += [
            T.StructField(f"c{i}", T.LongType()),
            T.StructField(f"lo{i}", T.DoubleType()),
            T.StructField(f"hi{i}", T.DoubleType()),
            T.StructField(f"sum{i}", T.DoubleType()),
            T.StructField(f"q{i}", T.BinaryType()),
        ]
    return T.ArrayType(T.StructType(cols))


def _column(values: np.ndarray, valid: np.ndarray, type_: pa.DataType) -> pa.Array:
    return pa.array(values, mask=~valid, type=type_)


def batch_pass(
    timestamp: pa.Array,
    pattern: pa.Array,
    payload: pa.Array,
    schema: pa.Schema,
    fields: list[tuple[str, ...]],
    window_us: int,
    k: int,
) -> pa.ListArray:
    """One list per row of the batch, of type ``result_type``: on the first payload Arrow
    read, the partial rows of the (window, pattern) groups of all it read: ``messages``,
    ``json``, ``first``, ``last``, and per field its count, min, max, sum and KLL sketch
    (``k``); a group whose field has more than ``k`` values in the batch takes further rows,
    each with the next ``k`` values' sketch only (sketches of ``k`` values or fewer are exact;
    Spark merges them as it merges its own). On a payload Spark must read itself, one row
    ``slow`` (nothing else set). Null elsewhere: so the batch that goes back to Spark is a few
    rows, not one per payload."""
    n = len(payload)
    item = pa.struct(_arrow_fields(len(fields)))
    if n == 0:
        return pa.array([], pa.list_(item))
    ts_us = timestamp.cast(pa.timestamp("us", tz="UTC")).cast(pa.int64())
    fast = fast_rows(payload)
    fast &= _numpy(pc.is_valid(ts_us), bool)
    fast &= _numpy(pc.is_valid(pattern), bool)
    table = read_objects(payload, fast, schema)
    rows = np.flatnonzero(fast)
    # the groups of the fast rows, (window, pattern); rows in their order within a group
    encoded = pc.dictionary_encode(pattern.cast(pa.string()))
    dictionary = encoded.dictionary
    code = _numpy(pc.fill_null(encoded.indices, 0), np.int64)[rows]
    ts = _numpy(pc.fill_null(ts_us, 0), np.int64)[rows]
    window = np.floor_divide(ts, window_us)
    key = (window - (window.min() if len(rows) else 0)) * max(len(dictionary), 1) + code
    gid = np.unique(key, return_inverse=True)[1].reshape(-1)
    order = np.argsort(gid, kind="stable")
    ts, gid, code = ts[order], gid[order], code[order]
    starts = np.flatnonzero(np.r_[True, gid[1:] != gid[:-1]]) if len(rows) else np.zeros(0, np.int64)
    sizes = np.diff(np.r_[starts, len(rows)]).astype(np.int64)
    values = [_leaf(table, path)[rows][order] for path in fields]
    counts = [_reduce(np.add, (~np.isnan(v)).astype(np.int64), starts) for v in values]
    # partial rows per group: one, or one per k values of its most numerous field
    chunks = np.ones(len(starts), np.int64)
    for count in counts:
        chunks = np.maximum(chunks, (count + k - 1) // k)
    out_group = np.repeat(np.arange(len(starts)), chunks)
    first_row = np.r_[0, np.cumsum(chunks)[:-1]].astype(np.int64) if len(starts) else np.zeros(0, np.int64)
    m = len(out_group)
    head = np.zeros(m, dtype=bool)
    head[first_row] = True

    def keyed(per_group: np.ndarray, type_: pa.DataType) -> pa.Array:
        """per_group on every partial row of its group"""
        return pa.array(per_group[out_group], type=type_)

    def headed(per_group: np.ndarray, type_: pa.DataType, valid: np.ndarray | None = None) -> pa.Array:
        """per_group on the first partial row of its group"""
        full = np.zeros(m, dtype=per_group.dtype)
        ok = head.copy()
        full[first_row] = per_group
        if valid is not None:
            ok[first_row] = valid
        return _column(full, ok, type_)

    stamp = pa.timestamp("us", tz="UTC")
    cols: list[pa.Array] = [
        pa.array(np.zeros(m, dtype=bool)),
        keyed(ts[starts] - np.mod(ts[starts], window_us), pa.int64()).cast(stamp),
        pc.take(dictionary, keyed(code[starts], pa.int64())),
        headed(sizes, pa.int64()),
        headed(sizes, pa.int64()),  # (every payload Arrow read is a JSON object)
        headed(_reduce(np.minimum, ts, starts), pa.int64()).cast(stamp),
        headed(_reduce(np.maximum, ts, starts), pa.int64()).cast(stamp),
    ]
    for v, count in zip(values, counts, strict=True):
        has = count > 0
        cols.append(headed(count, pa.int64()))
        cols.append(headed(_reduce(np.fmin, v, starts), pa.float64(), has))
        cols.append(headed(_reduce(np.fmax, v, starts), pa.float64(), has))
        cols.append(headed(_reduce(np.add, np.where(np.isnan(v), 0.0, v), starts), pa.float64(), has))
        cols.append(_sketches(v, starts, sizes, first_row, m, k))
    partials = pa.StructArray.from_arrays(cols, fields=_arrow_fields(len(fields)))
    # the list of each row: the partial rows on the first fast row, a marker on each slow row
    slow = np.flatnonzero(~fast)
    marker = pa.StructArray.from_arrays(
        [pa.array(np.ones(len(slow), dtype=bool))]
        + [pa.nulls(len(slow), f.type) for f in _arrow_fields(len(fields))[1:]],
        fields=_arrow_fields(len(fields)),
    )
    lengths = np.zeros(n, dtype=np.int32)
    lengths[slow] = 1
    before = int(np.searchsorted(slow, rows[0])) if len(rows) else len(slow)
    if len(rows):
        lengths[rows[0]] = m
    items = pa.concat_arrays([marker.slice(0, before), partials, marker.slice(before)])
    offsets = pa.array(np.r_[0, np.cumsum(lengths)].astype(np.int32))
    valid = lengths > 0
    return pa.ListArray.from_arrays(offsets, items, mask=pa.array(~valid))


def _numpy(array: pa.Array, dtype) -> np.ndarray:
    return np.asarray(array.to_numpy(zero_copy_only=False), dtype=dtype)


def _reduce(ufunc, values: np.ndarray, starts: np.ndarray) -> np.ndarray:
    return ufunc.reduceat(values, starts) if len(starts) else np.zeros(0, values.dtype)


def _sketches(values, starts, sizes, first_row, m, k) -> pa.Array:
    """Each group's values (not NaN), k at a time, as exact KLL sketches on its partial rows."""
    images: list[bytes] = []
    where: list[int] = []
    for g, (s, size) in enumerate(zip(starts, sizes, strict=True)):
        v = values[s : s + size]
        v = v[~np.isnan(v)]
        for j in range(0, len(v), k):
            images.append(kll_sketch(v[j : j + k], k))
            where.append(int(first_row[g] + j // k))
    lengths = np.zeros(m, dtype=np.int32)
    lengths[where] = [len(b) for b in images]
    offsets = np.r_[0, np.cumsum(lengths)].astype(np.int32)
    valid = np.zeros(m, dtype=bool)
    valid[where] = True
    return _binary(offsets, b"".join(images), valid)


def _binary(offsets: np.ndarray, data: bytes, valid: np.ndarray) -> pa.Array:
    array = pa.Array.from_buffers(pa.binary(), len(valid), [None, pa.py_buffer(offsets.tobytes()), pa.py_buffer(data)])
    return pc.if_else(pa.array(valid), array, pa.scalar(None, pa.binary()))


def _arrow_fields(fields: int) -> list[pa.Field]:
    ts = pa.timestamp("us", tz="UTC")
    out = [
        pa.field("slow", pa.bool_()),
        pa.field("window_start", ts),
        pa.field("pattern", pa.string()),
        pa.field("messages", pa.int64()),
        pa.field("json", pa.int64()),
        pa.field("first", ts),
        pa.field("last", ts),
    ]
    for i in range(fields):
        out += [
            pa.field(f"c{i}", pa.int64()),
            pa.field(f"lo{i}", pa.float64()),
            pa.field(f"hi{i}", pa.float64()),
            pa.field(f"sum{i}", pa.float64()),
            pa.field(f"q{i}", pa.binary()),
        ]
    return out
