"""Archive files: records -> Arrow -> Parquet, partitioned by kind, date and hour.

I/O (files), no threads and no event loop: the archive writer process
(archive/worker.py) drives a FileWriter. Each chunk of records becomes an Arrow
array at once; the arrays of a kind wait until a file is due (by records, by
payload bytes, by age, or at ``close``). Then the columns are derived, ``$`` topics
dropped, and one file per hour is written under ``KIND/date=YYYY-MM-DD/hour=HH/``
with a hidden temporary name that is then renamed, so readers see whole files or
none. Every file carries the format version in its metadata.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from .reads import messages
from .recorder import ArchiveLimits, Chunk, file_name, partition_dir
from .schema import COLUMNS, DELIVERY, FORMAT_VERSION, KINDS, PUBLISH

__all__ = ["FileWriter", "arrow_schema", "records_array", "publish_table", "delivery_table", "split_by_hour"]

log = logging.getLogger("mqttmesh.archive")

_TS = pa.timestamp("us", tz="UTC")
_ARROW_TYPES = {
    "timestamp[us, UTC]": _TS,
    "string": pa.string(),
    "int64": pa.int64(),
    "int32": pa.int32(),
    "int8": pa.int8(),
    "bool": pa.bool_(),
    "binary": pa.binary(),
}

# the record tuples of recorder.py, as Arrow structs: one C++ pass over the tuples
_PUBLISH_RECORD = pa.struct(
    [
        ("timestamp", pa.float64()),
        ("seq", pa.int64()),
        ("publisher", pa.string()),
        ("topic", pa.string()),
        ("qos", pa.int8()),
        ("retain", pa.bool_()),
        ("payload", pa.binary()),
    ]
)
_DELIVERY_RECORD = pa.struct(
    [
        ("timestamp", pa.float64()),
        ("origin", pa.string()),
        ("seq", pa.int64()),
        ("topic", pa.string()),
        ("published", pa.float64()),
        ("client_id", pa.string()),
        ("qos", pa.int8()),
        ("dup", pa.bool_()),
    ]
)


# Dictionaries only where values repeat; deltas for the columns that grow: measured on
# 50,000 JSON readings, 6.5 bytes per message instead of 15 and half the encoding time.
# No min/max statistics for payloads and message ids, which no query filters on by
# range: they cost 20 % of the publish log's encoding time.
_ENCODING = {
    PUBLISH: dict(
        use_dictionary=["origin", "publisher", "topic"],
        column_encoding={
            "timestamp": "DELTA_BINARY_PACKED",
            "seq": "DELTA_BINARY_PACKED",
            "payload_size": "DELTA_BINARY_PACKED",
        },
        write_statistics=[name for name, _, _ in COLUMNS[PUBLISH] if name not in ("payload", "msg_id")],
    ),
    DELIVERY: dict(
        use_dictionary=["origin", "topic", "node", "client_id"],
        column_encoding={
            "timestamp": "DELTA_BINARY_PACKED",
            "seq": "DELTA_BINARY_PACKED",
            "published": "DELTA_BINARY_PACKED",
            "log_seq": "DELTA_BINARY_PACKED",
        },
    ),
}


def arrow_schema(kind: str, node_id: str = "") -> pa.Schema:
    fields = [pa.field(name, _ARROW_TYPES[typ], nullable=False) for name, typ, _ in COLUMNS[kind]]
    meta = {"mqttmesh.archive": str(FORMAT_VERSION), "mqttmesh.kind": kind, "mqttmesh.node": node_id}
    return pa.schema(fields, metadata=meta)


def _timestamps(seconds: pa.Array) -> pa.Array:
    """Float seconds -> timestamp[us, UTC], rounded to the microsecond."""
    return pc.cast(pc.round(pc.multiply(seconds, 1e6)), pa.int64()).cast(_TS)


def _msg_ids(origin: pa.Array, seq: pa.Array) -> pa.Array:
    return pc.binary_join_element_wise(origin, pc.cast(seq, pa.string()), ":")


def records_array(kind: str, rows: list) -> pa.StructArray:
    """Record tuples (recorder.py) -> one Arrow struct array: the only step that reads
    Python objects, in one C++ pass with the GIL held once."""
    return pa.array(rows, _PUBLISH_RECORD if kind == PUBLISH else _DELIVERY_RECORD)


def reads_array(reads: list, data: bytes) -> pa.StructArray:
    """Read records and their bytes (archive/reads.py) -> the same struct array as their
    messages' record tuples.

    The topics and payloads are byte ranges of the reads: one Arrow array over all the
    reads' bytes whose elements are, in turn, a topic, the bytes up to its payload, the
    payload and the bytes up to the next topic; every fourth element from the first is a
    topic, from the third a payload, and ``take`` copies them out in one C++ pass.
    """
    m = messages(reads, data)
    n = len(m.seq)
    if n:
        wide = len(m.data) >= 1 << 31
        ranges = pa.Array.from_buffers(
            pa.large_binary() if wide else pa.binary(),
            4 * n - 1,
            [None, pa.py_buffer(m.bounds.astype(np.int64 if wide else np.int32)), pa.py_buffer(m.data)],
        )
        topic_at = np.arange(0, 4 * n, 4)
        topics = ranges.take(topic_at).cast(pa.string())
        payloads = ranges.take(topic_at + 2).cast(pa.binary())
    else:
        topics, payloads = pa.array([], pa.string()), pa.array([], pa.binary())
    first = pa.array(m.first)
    qos = pc.bit_wise_and(pc.shift_right(first, 1), 3).cast(pa.int8())
    retain = pc.equal(pc.bit_wise_and(first, 1), 1)
    publishers = pa.DictionaryArray.from_arrays(m.publisher, pa.array(m.publishers, pa.string())).cast(pa.string())
    arrays = [pa.array(m.timestamp), pa.array(m.seq), publishers, topics, qos, retain, payloads]
    return pa.StructArray.from_arrays(arrays, fields=list(_PUBLISH_RECORD))


def publish_table(records: pa.ChunkedArray, node_id: str, origins: Sequence[tuple[int, str]] = ()) -> pa.Table:
    """Publish log rows from publish records of messages published at ``node_id``, but
    for those ``origins`` names: ``(index, origin)``, ascending, of the records of messages
    this node published under another node's id (recorder.py ``other_origin``)."""
    ts, seq, publisher, topic, qos, retain, payload = _fields(records)
    origin = _origins(node_id, len(records), origins)
    columns = [
        _timestamps(ts),
        _msg_ids(origin, seq),
        origin,
        seq,
        publisher,
        topic,
        qos,
        retain,
        payload,
        pc.binary_length(payload).cast(pa.int32()),
    ]
    return _drop_dollar(pa.Table.from_arrays(columns, schema=arrow_schema(PUBLISH, node_id)))


def delivery_table(records: pa.ChunkedArray, node_id: str, first: int) -> pa.Table:
    """Delivery log rows from delivery records; ``first`` numbers the first one (log_seq)."""
    n = len(records)
    ts, origin, seq, topic, published, client_id, qos, dup = _fields(records)
    log_seq = pc.add(pc.cumulative_sum(pa.repeat(1, n).cast(pa.int64())), first - 1) if n else pa.array([], pa.int64())
    columns = [
        _timestamps(ts),
        _msg_ids(origin, seq),
        origin,
        seq,
        topic,
        _timestamps(published),
        pa.repeat(node_id, n).cast(pa.string()),
        client_id,
        qos,
        dup,
        log_seq,
    ]
    return _drop_dollar(pa.Table.from_arrays(columns, schema=arrow_schema(DELIVERY, node_id)))


def _origins(node_id: str, n: int, origins: Sequence[tuple[int, str]]) -> pa.Array:
    """The origin column: ``node_id`` but at the indices ``origins`` names (ascending)."""
    column = pa.repeat(node_id, n).cast(pa.string())
    if not origins:
        return column
    mask = np.zeros(n, bool)
    mask[[i for i, _ in origins]] = True
    return pc.replace_with_mask(column, pa.array(mask), pa.array([o for _, o in origins], pa.string()))


def _fields(records: pa.ChunkedArray) -> list[pa.ChunkedArray]:
    width = records.type.num_fields
    return [pa.chunked_array([c.field(i) for c in records.chunks], records.type.field(i).type) for i in range(width)]


def _drop_dollar(table: pa.Table) -> pa.Table:
    """$SYS and $mesh topics are never archived (a ``#`` filter does not match them either)."""
    dollar = pc.starts_with(table.column("topic"), "$")
    return table.filter(pc.invert(dollar)) if pc.any(dollar).as_py() else table


def split_by_hour(table: pa.Table) -> list[tuple[int, pa.Table]]:
    """(hour since the epoch, its rows) by the table's ``timestamp`` column."""
    if table.num_rows == 0:
        return []
    hours = pc.divide(table.column("timestamp").cast(pa.int64()), 3_600_000_000)  # integer division
    lo, hi = (v.as_py() for v in pc.min_max(hours).values())
    if lo == hi:
        return [(lo, table)]
    return [(h, table.filter(pc.equal(hours, h))) for h in sorted(pc.unique(hours).to_pylist())]


def _chunk_origins(chunk: Chunk, n: int) -> list[tuple[int, str]]:
    """A chunk's ``origins``, checked: ascending indices of its ``n`` publish records."""
    origins = list(chunk.origins)
    if not origins:
        return origins
    if chunk.kind != PUBLISH or chunk.reads:
        raise ValueError(f"origins in a chunk of {'reads' if chunk.reads else chunk.kind}")
    last = -1
    for entry in origins:
        if not (isinstance(entry, (tuple, list)) and len(entry) == 2):
            raise ValueError(f"origin {entry!r} is not (index, origin)")
        i, origin = entry
        if not (isinstance(i, int) and last < i < n and isinstance(origin, str)):
            raise ValueError(f"origin {entry!r}: not a record after {last} of {n}, or not a node id")
        last = i
    return [(i, o) for i, o in origins]


class _Pending:
    """Arrow arrays of one kind waiting for their file."""

    __slots__ = ("arrays", "first", "records", "nbytes", "since", "origins")

    def __init__(self):
        self.arrays: list[pa.StructArray] = []
        self.origins: list[tuple[int, str]] = []  # publish_table's, over all the arrays
        self.first = 0  # number of the first record (delivery log_seq)
        self.records = 0  # records in the arrays
        self.nbytes = 0  # payload bytes of those records
        self.since = 0.0  # when the oldest of them arrived (the caller's clock)


RETRIES = 5  # attempts at a Delta commit before its rows are counted as failed
RETRY_AFTER = 2.0  # seconds between two of them


class _Retry:
    """A flush whose commit failed, kept under its version to be committed again (at most
    once: table.py)."""

    __slots__ = ("kind", "table", "version", "records", "nbytes", "attempts", "due")

    def __init__(self, kind: str, table: pa.Table, version: int, records: int, nbytes: int, due: float):
        self.kind, self.table, self.version = kind, table, version
        self.records, self.nbytes = records, nbytes
        self.attempts = 0
        self.due = due


class FileWriter:
    """Chunks in, files out; ``report(kind, records, nbytes, written, failed, files, file_bytes)``
    is called once per set of records it is done with (written, failed, or ``$`` topics).
    ``fmt``: "parquet" (format 1: a file per flush and hour, renamed into place) or "delta"
    (a commit per flush to the log's Delta table, archive/table.py; a commit that fails is
    tried again, under its version, up to RETRIES times)."""

    def __init__(
        self,
        directory: str,
        node_id: str,
        incarnation: int | str,  # "INC.GEN" for a writer the node started again (worker.py)
        limits: ArchiveLimits,
        compression: str = "zstd",
        report=None,
        fmt: str = "parquet",
    ):
        self.directory = directory
        self.node_id = node_id
        self.incarnation = incarnation
        self.limits = limits
        self.compression = None if compression == "none" else compression
        self.report = report if report is not None else (lambda *args: None)
        self.number = 0
        self.pending = {k: _Pending() for k in KINDS}
        self.last_error: str | None = None
        self.tables = None
        self.retries: list[_Retry] = []
        if fmt == "delta":
            from .table import TableWriter

            self.tables = {k: TableWriter(directory, node_id, k, self.compression) for k in KINDS}
        elif fmt != "parquet":
            raise ValueError(f"archive format {fmt!r}: parquet or delta")

    def add(self, chunk: Chunk, now: float) -> None:
        rows, data = chunk.rows, chunk.data
        chunk.rows, chunk.data = [], b""
        n = len(chunk)
        try:
            array = reads_array(rows, data) if chunk.reads else records_array(chunk.kind, rows)
            if len(array) != n:
                raise ValueError(f"{len(array)} records where the node counted {n}")
            origins = _chunk_origins(chunk, n)
        except Exception as exc:  # a record the schema cannot hold: say so, drop the chunk
            self.last_error = f"{type(exc).__name__}: {exc}"
            log.error("archive: could not convert %d %s records: %s", n, chunk.kind, self.last_error)
            self.report(chunk.kind, n, chunk.nbytes, 0, n, 0, 0)
            return
        p = self.pending[chunk.kind]
        if not p.records:
            p.since = now
            p.first = chunk.first
        p.arrays.append(array)
        if origins:
            p.origins += [(p.records + i, o) for i, o in origins]
        p.records += n
        p.nbytes += chunk.nbytes
        if p.records >= self.limits.flush_rows or p.nbytes >= self.limits.flush_bytes:
            self.write(chunk.kind, now)

    def next_due(self) -> float | None:
        """When the oldest waiting records must be written (None: nothing waits)."""
        waiting = [p.since + self.limits.flush_interval / 2 for p in self.pending.values() if p.records]
        waiting += [r.due for r in self.retries]
        return min(waiting) if waiting else None

    def write_due(self, now: float) -> None:
        if self.retries:
            self._retry(now)
        for kind, p in self.pending.items():
            if p.records and now - p.since >= self.limits.flush_interval / 2:
                self.write(kind, now)

    def close(self) -> None:
        for kind, p in self.pending.items():
            if p.records:
                self.write(kind)
        while self.retries:  # (the node waits for the files: each failed commit tried again)
            self._retry(0.0, force=True)

    def write(self, kind: str, now: float = 0.0) -> None:
        p = self.pending[kind]
        self.pending[kind] = _Pending()
        written = files = nbytes = rows = 0
        try:
            records = pa.chunked_array(p.arrays, p.arrays[0].type)
            p.arrays = []
            if kind == PUBLISH:
                table = publish_table(records, self.node_id, p.origins)
            else:
                table = delivery_table(records, self.node_id, p.first)
            rows = table.num_rows
            if self.tables is not None and rows:
                r = _Retry(kind, table, self.tables[kind].next_version(), p.records, p.nbytes, now)
                # (in version order: behind a failed commit of this log, it waits for it)
                if any(x.kind == kind for x in self.retries) or not self._commit(r):
                    r.due = now + RETRY_AFTER
                    self.retries.append(r)
                return
            for hour, part in split_by_hour(table):
                nbytes += self._write_file(kind, hour, part)
                written += part.num_rows
                files += 1
        except Exception as exc:  # a full or failing disk: count it, say so, keep going
            self.last_error = f"{type(exc).__name__}: {exc}"
            rows = rows or p.records
            log.error(
                "archive: could not write %d %s records under %s: %s",
                rows - written,
                kind,
                self.directory,
                self.last_error,
            )
        self.report(kind, p.records, p.nbytes, written, rows - written, files, nbytes)

    def _commit(self, r: _Retry) -> bool:
        """One flush as one commit of its log's table. False: it failed, to be tried again
        (under the same version: a commit that landed unbeknown to us is not made twice);
        True: committed, or given up after RETRIES attempts (its rows counted as failed)."""
        from .table import TableError

        assert self.tables is not None
        r.attempts += 1
        try:
            c = self.tables[r.kind].append(r.table, r.version)
        except TableError as exc:
            self.last_error = str(exc)
            rows = r.table.num_rows
            if r.attempts < RETRIES:
                log.warning(
                    "archive: could not commit %d %s records (attempt %d of %d): %s",
                    rows,
                    r.kind,
                    r.attempts,
                    RETRIES,
                    exc,
                )
                return False
            log.error("archive: could not commit %d %s records, given up: %s", rows, r.kind, exc)
            self.report(r.kind, r.records, r.nbytes, 0, rows, 0, 0)
            return True
        # (None: committed already, by an attempt whose success did not reach us)
        files, nbytes = (0, 0) if c is None else (c.files, c.nbytes)
        self.report(r.kind, r.records, r.nbytes, r.table.num_rows, 0, files, nbytes)
        return True

    def _retry(self, now: float, force: bool = False) -> None:
        """The failed commits that are due, oldest first; one that fails again holds back
        the later ones of its log (versions commit in order: a table keeps one high-water
        version per writer)."""
        keep: list[_Retry] = []
        blocked: set[str] = set()
        for r in self.retries:
            if r.kind in blocked or (not force and r.due > now):
                blocked.add(r.kind)
                keep.append(r)
            elif not self._commit(r):
                r.due = now + RETRY_AFTER
                blocked.add(r.kind)
                keep.append(r)
        self.retries = keep

    def _write_file(self, kind: str, hour: int, table: pa.Table) -> int:
        folder = os.path.join(self.directory, partition_dir(kind, hour))
        os.makedirs(folder, exist_ok=True)
        self.number += 1
        name = file_name(self.node_id, self.incarnation, self.number)
        tmp = os.path.join(folder, f".{name}.tmp")
        try:
            pq.write_table(table, tmp, compression=self.compression, **_ENCODING[kind])
            os.replace(tmp, os.path.join(folder, name))
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
        return os.path.getsize(os.path.join(folder, name))
