"""The archive writer: batches of records -> Parquet files, on a thread of its own.

I/O. ``submit`` is called on the event loop and only appends to a queue; the thread
turns each batch into an Arrow table, drops ``$`` topics, splits it by hour and
writes one file per hour under ``KIND/date=YYYY-MM-DD/hour=HH/``, as a hidden
temporary name renamed into place, so readers see whole files or none. Arrow and
Parquet encoding run without the GIL; only the column extraction holds it.
"""

from __future__ import annotations

import logging
import os
import threading
from collections import deque

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from .recorder import Batch, Recorder, file_name, partition_dir
from .schema import COLUMNS, DELIVERY, FORMAT_VERSION, PUBLISH

__all__ = ["ArchiveWriter", "arrow_schema", "publish_table", "delivery_table"]

log = logging.getLogger("mqttmesh.archive")

_TS = pa.timestamp("us", tz="UTC")
_ARROW_TYPES = {"timestamp[us, UTC]": _TS, "string": pa.string(), "int64": pa.int64(), "int32": pa.int32(),
                "int8": pa.int8(), "bool": pa.bool_(), "binary": pa.binary()}


def arrow_schema(kind: str, node_id: str = "") -> pa.Schema:
    fields = [pa.field(name, _ARROW_TYPES[typ], nullable=False) for name, typ, _ in COLUMNS[kind]]
    meta = {"mqttmesh.archive": str(FORMAT_VERSION), "mqttmesh.kind": kind, "mqttmesh.node": node_id}
    return pa.schema(fields, metadata=meta)


def _timestamps(seconds: list) -> pa.Array:
    """Float seconds -> timestamp[us, UTC], computed by Arrow."""
    us = pc.multiply(pa.array(seconds, pa.float64()), 1e6)
    return pc.cast(pc.round(us), pa.int64()).cast(_TS)


def _msg_ids(origin: pa.Array, seq: pa.Array) -> pa.Array:
    return pc.binary_join_element_wise(origin, pc.cast(seq, pa.string()), ":")


def publish_table(rows: list, node_id: str) -> pa.Table:
    """Publish log rows from publish records (recorder.py) of messages published at ``node_id``."""
    n = len(rows)
    # a comprehension per column is the cheapest way to take many tuples apart
    seq = pa.array([r[1] for r in rows], pa.int64())
    origin = pa.array([node_id] * n, pa.string())
    payload = pa.array([r[6] for r in rows], pa.binary())
    columns = [
        _timestamps([r[0] for r in rows]),
        _msg_ids(origin, seq),
        origin,
        seq,
        pa.array([r[2] for r in rows], pa.string()),
        pa.array([r[3] for r in rows], pa.string()),
        pa.array([r[4] for r in rows], pa.int8()),
        pa.array([r[5] for r in rows], pa.bool_()),
        payload,
        pc.binary_length(payload).cast(pa.int32()),
    ]
    return pa.Table.from_arrays(columns, schema=arrow_schema(PUBLISH, node_id))


def delivery_table(rows: list, node_id: str, first: int) -> pa.Table:
    """Delivery log rows from delivery records; ``first`` numbers the first one (log_seq)."""
    n = len(rows)
    origin = pa.array([r[1] for r in rows], pa.string())
    seq = pa.array([r[2] for r in rows], pa.int64())
    columns = [
        _timestamps([r[0] for r in rows]),
        _msg_ids(origin, seq),
        origin,
        seq,
        pa.array([r[3] for r in rows], pa.string()),
        _timestamps([r[4] for r in rows]),
        pa.array([node_id] * n, pa.string()),
        pa.array([r[5] for r in rows], pa.string()),
        pa.array([r[6] for r in rows], pa.int8()),
        pa.array([r[7] for r in rows], pa.bool_()),
        pa.array(range(first, first + n), pa.int64()),
    ]
    return pa.Table.from_arrays(columns, schema=arrow_schema(DELIVERY, node_id))


def split_by_hour(table: pa.Table) -> list[tuple[int, pa.Table]]:
    """(hour since the epoch, rows of that hour) for the table's ``timestamp`` column."""
    if table.num_rows == 0:
        return []
    hours = pc.divide(table.column("timestamp").cast(pa.int64()), 3_600_000_000)  # integer division
    lo, hi = pc.min_max(hours).values()
    lo, hi = lo.as_py(), hi.as_py()
    if lo == hi:
        return [(lo, table)]
    return [(h, table.filter(pc.equal(hours, h))) for h in pc.unique(hours).to_pylist()]


class ArchiveWriter:
    """One thread that writes the recorder's batches, in order, and reports each one done."""

    def __init__(self, directory: str, recorder: Recorder, compression: str = "zstd"):
        self.directory = directory
        self.recorder = recorder
        self.compression = None if compression == "none" else compression
        self.node_id = ""
        self.incarnation = 0
        self._number = 0
        self._queue: deque[Batch] = deque()
        self._cond = threading.Condition()
        self._closing = False
        self._thread: threading.Thread | None = None
        self.last_error: str | None = None

    def start(self, node_id: str, incarnation: int) -> None:
        """Check the directory can be written, then start the thread. Raises OSError."""
        self.node_id = node_id
        self.incarnation = incarnation
        os.makedirs(self.directory, exist_ok=True)
        probe = os.path.join(self.directory, f".probe-{os.getpid()}")
        with open(probe, "wb"):
            pass
        os.unlink(probe)
        self._thread = threading.Thread(target=self._run, name="archive-writer", daemon=True)
        self._thread.start()

    def submit(self, batch: Batch) -> None:
        """Queue a batch (event loop thread): never waits for the disk."""
        with self._cond:
            self._queue.append(batch)
            self._cond.notify()

    def close(self, timeout: float | None = None) -> bool:
        """Write what is queued, then end the thread; False if it did not end in time."""
        with self._cond:
            self._closing = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(timeout)
            return not self._thread.is_alive()
        return True

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closing:
                    self._cond.wait()
                if not self._queue:
                    return
                batch = self._queue.popleft()
            self._write_batch(batch)

    def _write_batch(self, batch: Batch) -> None:
        rows = len(batch.rows)
        import os as _os
        _exp = _os.environ.get("MQTTMESH_ARCHIVE_EXPERIMENT", "")
        if _exp == "drop":
            batch.rows = []
            self.recorder.batch_done(batch.kind, rows, batch.nbytes, 0, 0, 0, 0)
            return
        if _exp == "convert":
            publish_table(batch.rows, self.node_id)
            batch.rows = []
            self.recorder.batch_done(batch.kind, rows, batch.nbytes, 0, 0, 0, 0)
            return
        written = skipped = files = nbytes = 0
        try:
            if batch.kind == PUBLISH:
                table = publish_table(batch.rows, self.node_id)
            else:
                table = delivery_table(batch.rows, self.node_id, batch.first)
            batch.rows = []  # the messages may go now
            dollar = pc.starts_with(table.column("topic"), "$")
            if pc.any(dollar).as_py():  # $SYS, $mesh: never archived
                table = table.filter(pc.invert(dollar))
                skipped = rows - table.num_rows
            for hour, part in split_by_hour(table):
                nbytes += self._write_file(batch.kind, hour, part)
                written += part.num_rows
                files += 1
        except Exception as exc:  # a full or failing disk: count it, say so, keep going
            self.last_error = f"{type(exc).__name__}: {exc}"
            log.error("archive: could not write %d %s records under %s: %s",
                      rows - written - skipped, batch.kind, self.directory, self.last_error)
        batch.rows = []
        self.recorder.batch_done(batch.kind, rows, batch.nbytes, written, rows - written - skipped,
                                 files, nbytes)

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
