"""Archive records: what a node published and delivered, cut into chunks for the writer.

Pure. It leaves to its caller the clock (delivery times come from the ``clock`` it
is given; the caller calls ``tick`` four times per flush interval), the files (each
chunk goes to ``submit``, for a writer thread that reports back with ``rows_done``)
and logging (it only counts; ``take_drops`` says what to report).

The hooks run on the broker's hot path, once per message: they append one tuple of
the message's values to a list and do nothing else. Publish records are
``(timestamp, seq, publisher, topic, qos, retain, payload)``; delivery records
``(time, origin, seq, topic, published, client_id, qos, dup)``. A publish record has
no origin: the writer names the node. A message this node routes under another node's
id (``other_origin_hook``, rare: the Broker picks it) gets the same record, and its
origin goes into the chunk's ``origins``, by position, for the writer. Chunks are small
(``CHUNK_ROWS``) so that the Python objects they keep alive stay few and recent: the
writer turns each chunk into Arrow columns at once and gathers those into files.
"""

from __future__ import annotations

import datetime as _dt
import re
from collections.abc import Callable
from dataclasses import dataclass

from ..codec import MalformedPacket, validate_topic_filter
from ..topics import filter_matches
from .schema import DELIVERY, KINDS, PUBLISH

__all__ = ["ArchiveLimits", "Chunk", "Recorder", "CHUNK_ROWS", "topic_filter", "partition_dir", "file_name", "hour_of"]

_MiB = 1024 * 1024

# Records per chunk. Measured on the broker's hot path (fanin QoS 0): keeping 50,000
# records alive costs twice as much per message as keeping 4,096 (cache misses on fresh
# memory), and 1,024 a little less again; below that the per-chunk pipe write counts.
CHUNK_ROWS = 1024

# Messages per chunk of captured reads. A read is one object however many messages it
# holds, so the reason for small chunks above does not apply; the writer converts each
# chunk with numpy and Arrow calls that cost about the same for 1,024 messages as for
# 8,192 (measured on reads of 200 messages: 0.36 us a message in chunks of 1,024, 0.20
# in chunks of 8,192, and 0.38 for 200,000 at once, out of the CPU's caches).
READS_CHUNK_ROWS = 8192


@dataclass(frozen=True)
class ArchiveLimits:
    """Every bound of the archive; each one is a setting (config.py, ``[archive]``)."""

    flush_interval: float = 10.0  # longest time a record waits in memory for its file
    flush_rows: int = 200_000  # records per file (and hour)
    flush_bytes: int = 64 * _MiB  # payload bytes per file
    max_queue_rows: int = 1_000_000  # records handed to the writer and not yet in a file
    max_queue_bytes: int = 256 * _MiB  # their payload bytes

    @property
    def chunk_rows(self) -> int:
        return min(CHUNK_ROWS, self.flush_rows)

    @property
    def reads_chunk_rows(self) -> int:
        return min(READS_CHUNK_ROWS, self.flush_rows)

    @property
    def chunk_bytes(self) -> int:
        return min(4 * _MiB, self.flush_bytes)

    def problems(self) -> list[str]:
        """What makes these limits unusable, by setting name (empty when they are fine)."""
        out = []
        if self.max_queue_rows < 2 * self.flush_rows:
            out.append(
                f"max_queue_rows ({self.max_queue_rows}) must be at least twice flush_rows "
                f"({self.flush_rows}): one file being written, the next one filling"
            )
        if self.max_queue_bytes < 2 * self.flush_bytes:
            out.append(
                f"max_queue_bytes ({self.max_queue_bytes}) must be at least twice flush_bytes "
                f"({self.flush_bytes}): one file being written, the next one filling"
            )
        return out


class Chunk:
    """Records of one kind, cut together; ``first`` numbers its first record in this run.

    ``rows`` are record tuples, or, when ``reads`` is true, read records of publish
    records (archive/reads.py), ``count`` records in all. In the node a read record
    holds its bytes; in the writer it holds their size, and ``data`` has the bytes of
    all the reads, one after the other (archive/wire.py). ``origins``: ``(index, origin)``
    of the publish records (by their index in ``rows``) whose message has another node's
    id; every other record's origin is the node's (mostly none: an empty tuple).
    """

    __slots__ = ("kind", "rows", "nbytes", "first", "count", "reads", "data", "origins")

    def __init__(
        self,
        kind: str,
        rows: list,
        nbytes: int,
        first: int,
        count: int | None = None,
        reads: bool = False,
        data: bytes = b"",
        origins: list[tuple[int, str]] | tuple[()] = (),
    ):
        self.kind = kind
        self.rows = rows
        self.nbytes = nbytes
        self.first = first
        self.count = len(rows) if count is None else count
        self.reads = reads
        self.data = data
        self.origins = origins

    def __len__(self) -> int:
        return self.count

    def __repr__(self):
        form = f"{len(self.rows)} reads of " if self.reads else ""
        return f"Chunk({self.kind}, {form}{self.count} records, {self.nbytes} bytes, first={self.first})"


def topic_filter(filters) -> Callable[[str], bool] | None:
    """A matcher for the archive's topic filters; None when they take everything (``#``).

    Raises ValueError naming a filter that is not a valid MQTT topic filter.
    """
    filters = tuple(filters)
    if not filters:
        raise ValueError("no topic filter: archive nothing by turning the archive off instead")
    for f in filters:
        try:
            validate_topic_filter(f)
        except MalformedPacket as exc:
            raise ValueError(f"{f!r} is not a topic filter: {exc}") from None
    if "#" in filters:
        return None  # `$` topics, which `#` does not match [MQTT-4.7.2-1], are dropped by the writer
    cache: dict[str, bool] = {}

    def matches(topic: str) -> bool:
        hit = cache.get(topic)
        if hit is None:
            if len(cache) >= 65536:
                cache.clear()
            hit = cache[topic] = any(filter_matches(f, topic) for f in filters)
        return hit

    return matches


class Recorder:
    def __init__(
        self,
        limits: ArchiveLimits,
        submit: Callable[[Chunk], None],
        clock: Callable[[], float],
        filters=("#",),
        delivery_log: bool = False,
    ):
        self.limits = limits
        self._submit = submit
        self.clock = clock
        self._filter = topic_filter(filters)
        self.filters = tuple(filters)
        # counters per kind (written, failed, files and done_* follow the writer's reports)
        self.cut_rows = {k: 0 for k in KINDS}  # records handed to the writer
        self.cut_bytes = {k: 0 for k in KINDS}
        self.dropped = {k: 0 for k in KINDS}  # records refused: the queue was full
        self.written = {k: 0 for k in KINDS}  # records in files
        self.failed = {k: 0 for k in KINDS}  # records the writer could not write
        self.files = 0
        self.file_bytes = 0
        self.done = {k: 0 for k in KINDS}  # records the writer is done with
        self.done_rows = 0  # ... of both kinds, and their payload bytes
        self.done_bytes = 0
        self._drops_reported = 0
        self._buffers: dict[str, tuple] = {}
        self.publish_hook, self.other_origin_hook = self._buffer(PUBLISH)
        self.delivery_hook = self._buffer(DELIVERY)[0] if delivery_log else None
        # every topic archived: whole reads from clients (archive/reads.py) instead of a
        # record per message; with filters the node picks the messages itself
        self.capture_hook = self._reads_buffer() if self._filter is None else None

    # -- the hot path --------------------------------------------------------------------

    def _buffer(self, kind: str):
        """The hook for ``kind`` and, for the publish log, the hook for messages under
        another node's id (else None); registers their buffer for tick and flush."""
        rows: list = []
        append = rows.append
        nbytes = 0
        generation = 0
        origins: list[tuple[int, str]] = []  # (index in rows, origin): other_origin below
        max_rows, max_bytes = self.limits.chunk_rows, self.limits.chunk_bytes
        filt = self._filter
        dropped = self.dropped

        def cut(force: bool = False) -> bool:
            nonlocal rows, append, nbytes, generation, origins
            if not rows:
                return True
            chunk = Chunk(kind, rows, nbytes, self.cut_rows[kind], origins=origins or ())
            if not self._hand_over(chunk, force):
                return False
            rows = []
            append = rows.append
            nbytes = 0
            if origins:
                origins = []
            generation += 1
            return True

        def full(record, size: int) -> None:
            nonlocal nbytes
            if cut():
                append(record)
                nbytes += size
            else:
                dropped[kind] += 1

        # A record is a tuple of the message's plain values, not the Message: tuples of
        # str/bytes/numbers leave the garbage collector's lists, while thousands of live
        # Messages make every full collection walk them (measured: +0.8 us per message).
        if kind == PUBLISH and filt is None:

            def hook(msg) -> None:
                nonlocal nbytes
                payload = msg.payload
                if len(rows) < max_rows and nbytes < max_bytes:
                    append((msg.timestamp, msg.seq, msg.publisher, msg.topic, msg.qos, msg.retain, payload))
                    nbytes += len(payload)
                else:
                    full((msg.timestamp, msg.seq, msg.publisher, msg.topic, msg.qos, msg.retain, payload), len(payload))
        elif kind == PUBLISH:

            def hook(msg) -> None:
                nonlocal nbytes
                if filt(msg.topic):  # type: ignore[misc]  # (filt is not None on this branch)
                    payload = msg.payload
                    if len(rows) < max_rows and nbytes < max_bytes:
                        append((msg.timestamp, msg.seq, msg.publisher, msg.topic, msg.qos, msg.retain, payload))
                        nbytes += len(payload)
                    else:
                        full(
                            (msg.timestamp, msg.seq, msg.publisher, msg.topic, msg.qos, msg.retain, payload),
                            len(payload),
                        )
        else:
            clock = self.clock

            def hook(session, msg, qos: int, dup: bool) -> None:  # type: ignore[misc]  # (the delivery hook)
                topic = msg.topic
                if topic[0] == "$" or (filt is not None and not filt(topic)):
                    return  # $mesh batches to peer nodes and $SYS are not client deliveries
                record = (clock(), msg.origin, msg.seq, topic, msg.timestamp, session.client_id, qos, dup)
                if len(rows) < max_rows:
                    append(record)
                else:
                    full(record, 0)

        self._buffers[kind] = (cut, lambda: len(rows), lambda: generation, [None])
        if kind != PUBLISH:
            return hook, None

        def other_origin(msg) -> None:  # (not on the hot path: clarity over speed)
            """A message this node routes under another node's id (Broker.publish): an
            inbound QoS 2 message under the id its session's holders agreed on, whose client
            moved here, or whose node died, before it went out (mesh/cluster/replica.py); a
            will the registrar publishes for a dead node's client (mesh/cluster/registry.py).
            Its record, and its origin by position."""
            nonlocal nbytes
            if filt is not None and not filt(msg.topic):
                return
            payload = msg.payload
            if not (len(rows) < max_rows and nbytes < max_bytes) and not cut():
                dropped[kind] += 1
                return
            append((msg.timestamp, msg.seq, msg.publisher, msg.topic, msg.qos, msg.retain, payload))
            nbytes += len(payload)
            origins.append((len(rows) - 1, msg.origin))

        return hook, other_origin

    def _reads_buffer(self):
        """The capture hook (Broker.capture) and its buffer of read records."""
        reads: list = []
        count = nbytes = generation = 0
        max_rows, max_bytes = self.limits.reads_chunk_rows, self.limits.chunk_bytes
        dropped = self.dropped

        def cut(force: bool = False) -> bool:
            nonlocal reads, count, nbytes, generation
            if not reads:
                return True
            if not self._hand_over(Chunk(PUBLISH, reads, nbytes, self.cut_rows[PUBLISH], count, reads=True), force):
                return False
            reads = []
            count = nbytes = 0
            generation += 1
            return True

        def capture(publisher: str, timestamp: float, packets: list, segments: list, skips: list, n: int) -> None:
            nonlocal count, nbytes
            records = n - len(skips)
            if (count >= max_rows or nbytes >= max_bytes) and not cut():
                dropped[PUBLISH] += records
                return
            data = packets[0] if len(packets) == 1 else b"".join(packets)
            reads.append((publisher, timestamp, data, segments, skips, n))
            count += records
            nbytes += len(data)

        self._buffers["reads"] = (cut, lambda: count, lambda: generation, [None])
        return capture

    def _hand_over(self, chunk: Chunk, force: bool) -> bool:
        """Submit ``chunk`` and count it, if the writer's queue has room for it or ``force``."""
        if not force and not self._room(len(chunk), chunk.nbytes):
            return False
        self.cut_rows[chunk.kind] += len(chunk)
        self.cut_bytes[chunk.kind] += chunk.nbytes
        self._submit(chunk)
        return True

    def _room(self, rows: int, nbytes: int) -> bool:
        queued_rows = sum(self.cut_rows.values()) - self.done_rows
        queued_bytes = sum(self.cut_bytes.values()) - self.done_bytes
        return queued_rows + rows <= self.limits.max_queue_rows and queued_bytes + nbytes <= self.limits.max_queue_bytes

    # -- the caller's timer and stop ---------------------------------------------------------

    def tick(self) -> None:
        """Cut every buffer that already held records at the previous tick.

        Called every ``flush_interval / 4`` seconds: a record reaches the writer within
        half the interval, and the writer writes what waited the other half.
        """
        for cut, pending, generation, seen in self._buffers.values():
            if pending() and seen[0] == generation():
                cut()
            seen[0] = generation() if pending() else None

    def flush(self) -> None:
        """Hand everything buffered to the writer, whatever the queue holds (graceful stop)."""
        for cut, *_ in self._buffers.values():
            cut(force=True)

    def pending(self) -> int:
        """Records buffered and not cut yet."""
        return sum(p() for _, p, _, _ in self._buffers.values())

    def queued(self) -> tuple[int, int]:
        """(records, payload bytes) handed to the writer and not yet done."""
        return (sum(self.cut_rows.values()) - self.done_rows, sum(self.cut_bytes.values()) - self.done_bytes)

    # -- the writer's report ---------------------------------------------------------------------

    def rows_done(
        self, kind: str, rows: int, nbytes: int, written: int = 0, failed: int = 0, files: int = 0, file_bytes: int = 0
    ) -> None:
        """The writer is done with ``rows`` records (called on its thread, the only one that
        advances these counters); those neither written nor failed were ``$`` topics."""
        self.written[kind] += written
        self.failed[kind] += failed
        self.files += files
        self.file_bytes += file_bytes
        self.done[kind] += rows
        self.done_bytes += nbytes
        self.done_rows += rows

    def abandon_queued(self) -> int:
        """The writer is gone with what it had: count all of it as failed; how many records."""
        lost = 0
        for kind in KINDS:
            n = self.cut_rows[kind] - self.done[kind]
            self.failed[kind] += n
            self.done[kind] += n
            self.done_rows += n
            lost += n
        self.done_bytes = sum(self.cut_bytes.values())
        return lost

    def take_drops(self) -> int:
        """Records dropped since the last call."""
        total = sum(self.dropped.values())
        new = total - self._drops_reported
        self._drops_reported = total
        return new

    def stats(self) -> dict[str, int]:
        queued_rows, queued_bytes = self.queued()
        out = {}
        for k in KINDS:
            out[f"{k}/written"] = self.written[k]
            out[f"{k}/dropped"] = self.dropped[k]
            out[f"{k}/failed"] = self.failed[k]
        out.update(
            files=self.files,
            bytes=self.file_bytes,
            queued=queued_rows,
            queued_bytes=queued_bytes,
            buffered=self.pending(),
        )
        return out


# -- file layout ------------------------------------------------------------------------------

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


def hour_of(timestamp: float) -> int:
    """Hours since the epoch (UTC) of a wall-clock time in seconds: the partition key."""
    return int(timestamp // 3600)


def partition_dir(kind: str, hour: int) -> str:
    """``publish/date=YYYY-MM-DD/hour=HH`` for an hour since the epoch (UTC)."""
    t = _dt.datetime.fromtimestamp(hour * 3600, _dt.UTC)
    return f"{kind}/date={t:%Y-%m-%d}/hour={t:%H}"


def file_name(node_id: str, incarnation, number: int) -> str:
    """A file name no other node or run of this node uses: node, incarnation (with the
    writer's restart count after a dot if it was restarted), counter.

    The writer writes ``.NAME.tmp`` first and renames it: readers (Spark) skip names
    that start with a dot, so a file appears whole or not at all.
    """
    node = _UNSAFE.sub("_", node_id) or "node"
    return f"{node}-{incarnation}-{number:06d}.parquet"
