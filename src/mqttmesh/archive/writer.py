"""The archive writer: chunks of records -> Parquet files, on a thread of its own.

I/O. ``submit`` is called on the event loop and only appends to a queue. The thread
turns each chunk into Arrow columns at once (the only step that holds the GIL),
drops ``$`` topics, and gathers the columns of each kind until a file is due: by
rows, by payload bytes, by age, or at ``close``. A file is split by hour under
``KIND/date=YYYY-MM-DD/hour=HH/`` and written under a hidden temporary name that is
then renamed, so readers see whole files or none. Parquet encoding and compression
run without the GIL.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from .recorder import Chunk, Recorder, file_name, partition_dir
from .schema import COLUMNS, DELIVERY, FORMAT_VERSION, KINDS, PUBLISH

__all__ = ["ArchiveWriter", "arrow_schema", "publish_table", "delivery_table", "split_by_hour"]

log = logging.getLogger("mqttmesh.archive")

_TS = pa.timestamp("us", tz="UTC")
_ARROW_TYPES = {"timestamp[us, UTC]": _TS, "string": pa.string(), "int64": pa.int64(), "int32": pa.int32(),
                "int8": pa.int8(), "bool": pa.bool_(), "binary": pa.binary()}

# the record tuples of recorder.py, as Arrow structs: one C++ pass over the tuples
_PUBLISH_RECORD = pa.struct([("timestamp", pa.float64()), ("seq", pa.int64()), ("publisher", pa.string()),
                             ("topic", pa.string()), ("qos", pa.int8()), ("retain", pa.bool_()),
                             ("payload", pa.binary())])
_DELIVERY_RECORD = pa.struct([("timestamp", pa.float64()), ("origin", pa.string()), ("seq", pa.int64()),
                              ("topic", pa.string()), ("published", pa.float64()), ("client_id", pa.string()),
                              ("qos", pa.int8()), ("dup", pa.bool_())])


def arrow_schema(kind: str, node_id: str = "") -> pa.Schema:
    fields = [pa.field(name, _ARROW_TYPES[typ], nullable=False) for name, typ, _ in COLUMNS[kind]]
    meta = {"mqttmesh.archive": str(FORMAT_VERSION), "mqttmesh.kind": kind, "mqttmesh.node": node_id}
    return pa.schema(fields, metadata=meta)


def _timestamps(seconds: pa.Array) -> pa.Array:
    """Float seconds -> timestamp[us, UTC], rounded to the microsecond."""
    return pc.cast(pc.round(pc.multiply(seconds, 1e6)), pa.int64()).cast(_TS)


def _msg_ids(origin: pa.Array, seq: pa.Array) -> pa.Array:
    return pc.binary_join_element_wise(origin, pc.cast(seq, pa.string()), ":")


def publish_table(rows: list, node_id: str) -> pa.Table:
    """Publish log rows from publish records of messages published at ``node_id``."""
    ts, seq, publisher, topic, qos, retain, payload = pa.array(rows, _PUBLISH_RECORD).flatten()
    origin = pa.array([node_id] * len(rows), pa.string())
    columns = [_timestamps(ts), _msg_ids(origin, seq), origin, seq, publisher, topic, qos, retain, payload,
               pc.binary_length(payload).cast(pa.int32())]
    return pa.Table.from_arrays(columns, schema=arrow_schema(PUBLISH, node_id))


def delivery_table(rows: list, node_id: str, first: int) -> pa.Table:
    """Delivery log rows from delivery records; ``first`` numbers the first one (log_seq)."""
    n = len(rows)
    ts, origin, seq, topic, published, client_id, qos, dup = pa.array(rows, _DELIVERY_RECORD).flatten()
    columns = [_timestamps(ts), _msg_ids(origin, seq), origin, seq, topic, _timestamps(published),
               pa.array([node_id] * n, pa.string()), client_id, qos, dup,
               pa.array(range(first, first + n), pa.int64())]
    return pa.Table.from_arrays(columns, schema=arrow_schema(DELIVERY, node_id))


def split_by_hour(table: pa.Table) -> list[tuple[int, pa.Table]]:
    """(hour since the epoch, its rows) by the table's ``timestamp`` column."""
    if table.num_rows == 0:
        return []
    hours = pc.divide(table.column("timestamp").cast(pa.int64()), 3_600_000_000)  # integer division
    lo, hi = (v.as_py() for v in pc.min_max(hours).values())
    if lo == hi:
        return [(lo, table)]
    return [(h, table.filter(pc.equal(hours, h))) for h in sorted(pc.unique(hours).to_pylist())]


class _Pending:
    """Arrow tables of one kind waiting for their file."""
    __slots__ = ("tables", "rows", "records", "nbytes", "since")

    def __init__(self):
        self.tables: list[pa.Table] = []
        self.rows = 0       # rows in the tables
        self.records = 0    # records of the chunks they came from (with the $ topics dropped)
        self.nbytes = 0     # payload bytes of those chunks
        self.since = 0.0    # monotonic time of the oldest chunk


class ArchiveWriter:
    """One thread that converts and writes the recorder's chunks, in order."""

    def __init__(self, directory: str, recorder: Recorder, compression: str = "zstd"):
        self.directory = directory
        self.recorder = recorder
        self.limits = recorder.limits
        self.compression = None if compression == "none" else compression
        self.node_id = ""
        self.incarnation = 0
        self._number = 0
        self._queue: deque[Chunk] = deque()
        self._cond = threading.Condition()
        self._closing = False
        self._pending = {k: _Pending() for k in KINDS}
        self._thread: threading.Thread | None = None
        self.last_error: str | None = None

    def start(self, node_id: str, incarnation: int) -> None:
        """Check that the directory can be written, then start the thread. Raises OSError."""
        self.node_id = node_id
        self.incarnation = incarnation
        os.makedirs(self.directory, exist_ok=True)
        probe = os.path.join(self.directory, f".probe-{os.getpid()}")
        with open(probe, "wb"):
            pass
        os.unlink(probe)
        self._thread = threading.Thread(target=self._run, name="archive-writer", daemon=True)
        self._thread.start()

    def submit(self, chunk: Chunk) -> None:
        """Queue a chunk (event loop thread): never waits for the disk."""
        with self._cond:
            self._queue.append(chunk)
            self._cond.notify()

    def close(self, timeout: float | None = None) -> bool:
        """Convert and write everything submitted, then end; False if not done in time."""
        with self._cond:
            self._closing = True
            self._cond.notify()
        if self._thread is None:
            return True
        self._thread.join(timeout)
        return not self._thread.is_alive()

    # -- the thread ---------------------------------------------------------------------------

    def _run(self) -> None:
        max_age = self.limits.flush_interval / 2
        while True:
            with self._cond:
                while not self._queue and not self._closing:
                    waiting = [p.since for p in self._pending.values() if p.records]
                    timeout = (min(waiting) + max_age - time.monotonic()) if waiting else None
                    if timeout is not None and timeout <= 0:
                        break
                    self._cond.wait(timeout)
                chunks = list(self._queue)
                self._queue.clear()
                closing = self._closing
            for chunk in chunks:
                self._convert(chunk)
            now = time.monotonic()
            for kind, p in self._pending.items():
                if p.records and (closing or p.rows >= self.limits.flush_rows
                                  or p.nbytes >= self.limits.flush_bytes or now - p.since >= max_age):
                    self._write(kind)
            if closing and not chunks:
                return

    def _convert(self, chunk: Chunk) -> None:
        rows = chunk.rows
        chunk.rows = []
        try:
            if chunk.kind == PUBLISH:
                table = publish_table(rows, self.node_id)
            else:
                table = delivery_table(rows, self.node_id, chunk.first)
            dollar = pc.starts_with(table.column("topic"), "$")
            if pc.any(dollar).as_py():  # $SYS, $mesh: never archived
                table = table.filter(pc.invert(dollar))
        except Exception as exc:  # a record the schema cannot hold: say which, drop the chunk
            self.last_error = f"{type(exc).__name__}: {exc}"
            log.error("archive: could not convert %d %s records: %s", len(rows), chunk.kind, self.last_error)
            self.recorder.rows_done(chunk.kind, len(rows), chunk.nbytes, failed=len(rows))
            return
        p = self._pending[chunk.kind]
        if not p.records:
            p.since = time.monotonic()
        p.tables.append(table)
        p.rows += table.num_rows
        p.records += len(rows)
        p.nbytes += chunk.nbytes

    def _write(self, kind: str) -> None:
        p = self._pending[kind]
        self._pending[kind] = _Pending()
        written = files = nbytes = 0
        try:
            table = pa.concat_tables(p.tables)
            p.tables = []
            for hour, part in split_by_hour(table):
                nbytes += self._write_file(kind, hour, part)
                written += part.num_rows
                files += 1
        except Exception as exc:  # a full or failing disk: count it, say so, keep going
            self.last_error = f"{type(exc).__name__}: {exc}"
            log.error("archive: could not write %d %s records under %s: %s",
                      p.rows - written, kind, self.directory, self.last_error)
        self.recorder.rows_done(kind, p.records, p.nbytes, written, p.rows - written, files, nbytes)

    def _write_file(self, kind: str, hour: int, table: pa.Table) -> int:
        folder = os.path.join(self.directory, partition_dir(kind, hour))
        os.makedirs(folder, exist_ok=True)
        self._number += 1
        name = file_name(self.node_id, self.incarnation, self._number)
        tmp = os.path.join(folder, f".{name}.tmp")
        try:
            pq.write_table(table, tmp, compression=self.compression)
            os.replace(tmp, os.path.join(folder, name))
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
        return os.path.getsize(os.path.join(folder, name))
