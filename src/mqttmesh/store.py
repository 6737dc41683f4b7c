"""The store journal: state changes waiting to be made durable, coalesced per key.

Pure. The broker core records every change to persistent sessions, their
queued/in-flight messages and retained messages here; it leaves the writing to
the I/O layer (``server/sqlite_store.py``), which takes a batch, commits it in
one transaction and reports the batch number back. Acknowledgements that
depend on a batch are held until then (group commit).
"""

from __future__ import annotations

__all__ = ["Journal", "FORMAT_VERSION"]

FORMAT_VERSION = 1

# Incarnations count sixteenths of a second since 2024-01-01, so that a message id
# (incarnation << 28) + n stays below 2**63 (a signed 64-bit column, e.g. in Spark) for
# about sixty years.
INCARNATION_EPOCH = 1_704_067_200


def clock_incarnation(now: float) -> int:
    """The incarnation the clock gives at ``now`` (wall-clock seconds)."""
    return int((now - INCARNATION_EPOCH) * 16)


class Journal:
    def __init__(self, on_dirty=None):
        self._ops: dict[tuple, tuple] = {}
        self.on_dirty = on_dirty  # called when the first change of a batch arrives
        self._signalled = False
        self.batch = 1  # the batch being filled
        self.committed = 0  # the newest batch known to be durable
        self.writes = 0  # changes recorded, ever: lets a caller see if it wrote

    def __len__(self) -> int:
        return len(self._ops)

    # -- persistent sessions ------------------------------------------------------

    def session_put(self, client_id: str, subscriptions: dict[str, int]) -> None:
        self._record(("s", client_id), ("session_put", client_id, dict(subscriptions)))

    def session_delete(self, client_id: str) -> None:
        # Earlier changes of this client are moot; drop them so the delete lands
        # before anything a new session of the same ClientId records after it.
        for key in [k for k in self._ops if len(k) > 1 and k[1] == client_id and k[0] in "dsmr"]:
            del self._ops[key]
        # a key of its own: a session_put after it (same ClientId, new session) must not replace it
        self._record(("d", client_id), ("session_delete", client_id))

    def message_put(self, client_id: str, entry) -> None:
        # The entry is read when the batch is taken, so the newest state wins.
        self._record(("m", client_id, entry.key), ("message_put", client_id, entry))

    def message_remove(self, client_id: str, key: int) -> None:
        self._record(("m", client_id, key), ("message_remove", client_id, key))

    def awaiting_rel_put(self, client_id: str, packet_id: int) -> None:
        self._record(("r", client_id, packet_id), ("rel_put", client_id, packet_id))

    def awaiting_rel_remove(self, client_id: str, packet_id: int) -> None:
        self._record(("r", client_id, packet_id), ("rel_remove", client_id, packet_id))

    # -- messages a mesh origin holds until their destinations acknowledge them -------

    def custody_put(self, msg, dests: list[str]) -> None:
        self._record(("c", msg.seq), ("custody_put", msg, list(dests)))

    def custody_remove(self, seq: int) -> None:
        self._record(("c", seq), ("custody_remove", seq))

    # -- retained messages ------------------------------------------------------------

    def retained_put(self, topic: str, msg) -> None:
        self._record(("t", topic), ("retained_put", topic, msg))

    def retained_delete(self, topic: str) -> None:
        self._record(("t", topic), ("retained_delete", topic))

    # -- the I/O layer's side -----------------------------------------------------------

    def _record(self, key: tuple, op: tuple) -> None:
        ops = self._ops
        if not self._signalled:
            self._signalled = True
            if self.on_dirty is not None:
                self.on_dirty()
        if key in ops:
            del ops[key]  # re-insert so the newest change keeps its place in order
        ops[key] = op
        self.writes += 1

    def take(self) -> tuple[int, list[tuple]]:
        """Hand over the filled batch as plain tuples (safe to pass to a thread)."""
        number = self.batch
        ops = [_snapshot(op) for op in self._ops.values()]
        self._ops = {}
        self._signalled = False
        self.batch += 1
        return number, ops

    def mark_committed(self, number: int) -> None:
        if number > self.committed:
            self.committed = number


def _snapshot(op: tuple) -> tuple:
    kind = op[0]
    if kind == "message_put":
        _, client_id, e = op
        m = e.msg
        return (
            "message_put",
            client_id,
            e.key,
            m.topic,
            m.payload,
            m.qos,
            e.qos,
            e.retain,
            e.packet_id,
            e.state,
            m.origin,
            m.seq,
            m.publisher,
            m.timestamp,
        )
    if kind == "retained_put":
        _, topic, m = op
        return ("retained_put", topic, m.payload, m.qos, m.origin, m.seq, m.publisher, m.timestamp)
    if kind == "custody_put":
        _, m, dests = op
        return (
            "custody_put",
            m.seq,
            m.topic,
            m.payload,
            m.qos,
            int(m.retain),
            m.origin,
            m.publisher,
            m.timestamp,
            "\0".join(dests),
        )
    return op
