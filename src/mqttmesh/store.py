"""The store journal: state changes waiting to be made durable, coalesced per key.

Pure. The broker core records every change to persistent sessions, their
queued/in-flight messages and retained messages here; it leaves the writing to
the I/O layer (``server/sqlite_store.py``), which takes a batch, commits it in
one transaction and reports the batch number back. Acknowledgements that
depend on a batch are held until then (group commit). A node without a store
records into ``NULL_JOURNAL``, so no caller asks whether there is a journal.
Loading is the I/O layer's too; ``restore_sessions`` turns the rows it read back
into sessions.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from .message import Entry, Message
from .shared import is_resend_mark

if TYPE_CHECKING:
    from .ports import Batch
    from .session import Session, SessionFactory

__all__ = ["Journal", "NullJournal", "NULL_JOURNAL", "restore_sessions", "FORMAT_VERSION"]

# 2: messages keep their MQTT 5 properties (message.Message.props); 3: and when they expire;
# 4: a session's entry keeps the shared group it came through (its share, "$share/{g}/{f}");
# 5: and, a group's re-send, the message it re-sends (its root, as shared.py ``resend_mark``)
FORMAT_VERSION = 5

# Incarnations count sixteenths of a second since 2024-01-01, so that a message id
# (incarnation << 28) + n stays below 2**63 (a signed 64-bit column, e.g. in Spark) for
# about sixty years.
INCARNATION_EPOCH = 1_704_067_200


def clock_incarnation(now: float) -> int:
    """The incarnation the clock gives at ``now`` (wall-clock seconds)."""
    return int((now - INCARNATION_EPOCH) * 16)


class Journal:
    persistent = True

    def __init__(self, on_dirty: Callable[[], None] | None = None):
        self._ops: dict[tuple[Any, ...], tuple[Any, ...]] = {}
        self.on_dirty = on_dirty  # called when the first change of a batch arrives
        self._signalled = False
        self.batch = 1  # the batch being filled
        self.committed = 0  # the newest batch known to be durable
        self.writes = 0  # changes recorded, ever: lets a caller see if it wrote

    def __len__(self) -> int:
        return len(self._ops)

    # -- did the caller write? (its acknowledgement then waits for the batch) -------------

    def mark(self) -> int:
        return self.writes

    def since(self, mark: int) -> Batch:
        """The batch to wait for if anything was recorded since ``mark``, else 0."""
        return self.batch if self.writes != mark else 0

    # -- persistent sessions ------------------------------------------------------

    def session_put(self, client_id: str, subscriptions: Mapping[str, int], expires: float | None = None) -> None:
        """``expires``: when the session ends (Session.expires_at, on the clock of this run)."""
        self._record(("s", client_id), ("session_put", client_id, dict(subscriptions), expires))

    def session_delete(self, client_id: str) -> None:
        # Earlier changes of this client are moot; drop them so the delete lands
        # before anything a new session of the same ClientId records after it.
        for key in [k for k in self._ops if len(k) > 1 and k[1] == client_id and k[0] in "dsmrivx"]:
            del self._ops[key]
        # a key of its own: a session_put after it (same ClientId, new session) must not replace it
        self._record(("d", client_id), ("session_delete", client_id))

    def message_put(self, client_id: str, entry: Entry) -> None:
        # The entry is read when the batch is taken, so the newest state wins.
        self._record(("m", client_id, entry.key), ("message_put", client_id, entry))

    def message_remove(self, client_id: str, key: int) -> None:
        self._record(("m", client_id, key), ("message_remove", client_id, key))

    def awaiting_rel_put(self, client_id: str, packet_id: int) -> None:
        self._record(("r", client_id, packet_id), ("rel_put", client_id, packet_id))

    def awaiting_rel_remove(self, client_id: str, packet_id: int) -> None:
        self._record(("r", client_id, packet_id), ("rel_remove", client_id, packet_id))

    def inbound_put(self, client_id: str, packet_id: int, msg: Message) -> None:
        """The message of an inbound QoS 2 id awaiting PUBREL, for a session replicated in a
        mesh (mesh/cluster/replica.py): after a restart this node can still route it."""
        self._record(("i", client_id, packet_id), ("inbound_put", client_id, packet_id, msg))

    def inbound_remove(self, client_id: str, packet_id: int) -> None:
        self._record(("i", client_id, packet_id), ("inbound_remove", client_id, packet_id))

    def done_put(self, client_id: str, slot: int, number: int, origin: str, seq: int) -> None:
        """A message id a replicated session settled (its ``number``-th, kept in ``slot`` of a
        ring): a copy restarted from the store must not take it for a message it never had."""
        self._record(("x", client_id, slot), ("done_put", client_id, slot, number, origin, seq))

    def version_put(self, client_id: str, epoch: int, version: int) -> None:
        """A replicated session's (epoch, settlement version): after a restart its copy is
        ranked by what it holds, not as the oldest (mesh/cluster/replica.py merge_snapshots)."""
        self._record(("v", client_id), ("version_put", client_id, epoch, version))

    def floor_put(self, client_id: str, origin: str, seq: int) -> None:
        """A replicated session forgot settled ids of ``origin`` up to ``seq`` (its floor,
        mesh/cluster/replica.py): after a restart it still tells a settled QoS 2 message apart."""
        self._record(("f", client_id, origin), ("floor_put", client_id, origin, seq))

    def node_seen(self, node: str) -> None:
        """A node of the mesh this one had not seen before (mesh/cluster/membership.py): a restart
        that reaches none of them still counts them, and does not take itself for a mesh
        of one."""
        self._record(("n", node), ("node_seen", node))

    # -- messages a mesh origin holds until their destinations acknowledge them -------

    def custody_put(self, msg: Message, dests: list[str]) -> None:
        self._record(("c", msg.seq), ("custody_put", msg, list(dests)))

    def custody_remove(self, seq: int) -> None:
        self._record(("c", seq), ("custody_remove", seq))

    def rerouted_put(self, msg: Message, dests: list[str]) -> None:
        """Another origin's message this node routed again under its id (a persistent
        publisher's QoS 2 message, mesh/routing/dataplane.py ``route_local``), until its
        destinations acknowledge it: the publisher's session may be done with it."""
        self._record(("c", msg.origin, msg.seq), ("rerouted_put", msg, list(dests)))

    def rerouted_remove(self, origin: str, seq: int) -> None:
        self._record(("c", origin, seq), ("rerouted_remove", origin, seq))

    # -- retained messages ------------------------------------------------------------

    def retained_put(self, topic: str, msg: Message) -> None:
        self._record(("t", topic), ("retained_put", topic, msg))

    def retained_delete(self, topic: str) -> None:
        self._record(("t", topic), ("retained_delete", topic))

    # -- delayed wills (one node: in a mesh the registrar keeps them) -------------------

    def will_put(self, client_id: str, due: float, msg: Message, expiry: int | None) -> None:
        """A will waiting for its Will Delay Interval until ``due`` (the clock of this run):
        part of the session's state, so a restart publishes it when it is due [MQTT-3.1.2-8]."""
        self._record(("w", client_id), ("will_put", client_id, msg, expiry, due))

    def will_delete(self, client_id: str) -> None:
        """The delayed will of ``client_id`` was published, or a new connection came first."""
        self._record(("w", client_id), ("will_delete", client_id))

    # -- the I/O layer's side -----------------------------------------------------------

    def _record(self, key: tuple[Any, ...], op: tuple[Any, ...]) -> None:
        ops = self._ops
        if not self._signalled:
            self._signalled = True
            if self.on_dirty is not None:
                self.on_dirty()
        if key in ops:
            del ops[key]  # re-insert so the newest change keeps its place in order
        ops[key] = op
        self.writes += 1

    def take(self) -> tuple[int, list[tuple[Any, ...]]]:
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


class NullJournal:
    """The journal of a node that keeps everything in memory: it records nothing, so
    ``since`` is always 0 and no acknowledgement waits."""

    persistent = False

    def __init__(self) -> None:
        # instance attributes, read on the publish path like the Journal's
        self.writes = 0
        self.batch = 0
        self.committed = 0

    def __len__(self) -> int:
        return 0

    def mark(self) -> int:
        return 0

    def since(self, mark: int) -> Batch:
        return 0

    def session_put(self, client_id: str, subscriptions: Mapping[str, int], expires: float | None = None) -> None:
        pass

    def session_delete(self, client_id: str) -> None:
        pass

    def message_put(self, client_id: str, entry: Entry) -> None:
        pass

    def message_remove(self, client_id: str, key: int) -> None:
        pass

    def awaiting_rel_put(self, client_id: str, packet_id: int) -> None:
        pass

    def awaiting_rel_remove(self, client_id: str, packet_id: int) -> None:
        pass

    def inbound_put(self, client_id: str, packet_id: int, msg: Message) -> None:
        pass

    def inbound_remove(self, client_id: str, packet_id: int) -> None:
        pass

    def version_put(self, client_id: str, epoch: int, version: int) -> None:
        pass

    def done_put(self, client_id: str, slot: int, number: int, origin: str, seq: int) -> None:
        pass

    def floor_put(self, client_id: str, origin: str, seq: int) -> None:
        pass

    def node_seen(self, node: str) -> None:
        pass

    def custody_put(self, msg: Message, dests: list[str]) -> None:
        pass

    def custody_remove(self, seq: int) -> None:
        pass

    def rerouted_put(self, msg: Message, dests: list[str]) -> None:
        pass

    def rerouted_remove(self, origin: str, seq: int) -> None:
        pass

    def retained_put(self, topic: str, msg: Message) -> None:
        pass

    def retained_delete(self, topic: str) -> None:
        pass

    def will_put(self, client_id: str, due: float, msg: Message, expiry: int | None) -> None:
        pass

    def will_delete(self, client_id: str) -> None:
        pass

    def mark_committed(self, number: int) -> None:
        pass


NULL_JOURNAL = NullJournal()  # (it holds no state: one is enough)


def _root_mark(msg: Message) -> str | None:
    """A shared group's re-send: the mark naming its root (shared.py ``resend_mark``), kept so
    that after a restart the session still knows what it re-sends (``had``, and the merges of
    its copies: mesh/cluster/snapshots.py); None for any other message."""
    shares: tuple[str, ...] | None = getattr(msg, "shares", None)
    return shares[0] if shares and is_resend_mark(shares[0]) else None


def _snapshot(op: tuple[Any, ...]) -> tuple[Any, ...]:
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
            # (a PUBLISH the gate still holds never reached the client: stored as queued, so
            # that after a kill -9 no merge takes it for completed; mesh/cluster/replica.py)
            0 if e.ticket else e.packet_id,
            0 if e.ticket else e.state,
            m.origin,
            m.seq,
            m.publisher,
            m.timestamp,
            m.props,
            None if e.group is None else e.group.share,
            _root_mark(m),  # (the expiry stays last: sqlite_store)
            m.expires,
        )
    if kind == "inbound_put":
        _, client_id, pid, m = op
        return (
            "inbound_put",
            client_id,
            pid,
            m.topic,
            m.payload,
            int(m.retain),
            m.origin,
            m.seq,
            m.publisher,
            m.timestamp,
            m.props,
            m.expires,
        )
    if kind == "retained_put":
        _, topic, m = op
        return ("retained_put", topic, m.payload, m.qos, m.origin, m.seq, m.publisher, m.timestamp, m.props, m.expires)
    if kind == "will_put":
        _, client_id, m, expiry, due = op
        return (
            "will_put",
            client_id,
            m.topic,
            m.payload,
            m.qos,
            int(m.retain),
            m.origin,
            m.seq,
            m.publisher,
            m.timestamp,
            m.props,
            expiry,
            due,
        )
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
            m.props,
            m.expires,
        )
    if kind == "rerouted_put":
        _, m, dests = op
        return (
            "rerouted_put",
            m.origin,
            m.seq,
            m.topic,
            m.payload,
            m.qos,
            int(m.retain),
            m.publisher,
            m.timestamp,
            "\0".join(dests),
            m.props,
            m.expires,
        )
    return op


# --------------------------------------------------------------------------- loading


def restore_sessions(
    factory: SessionFactory,
    sessions: Iterable[tuple[str, dict[str, int], float | None]],
    messages: Iterable[tuple[Any, ...]],
    awaiting_rel: Iterable[tuple[str, int]],
    inbound: Iterable[tuple[Any, ...]] = (),
    versions: Iterable[tuple[str, int, int]] = (),
    tombstones: Iterable[tuple[str, int, str, int]] = (),
    floors: Iterable[tuple[str, str, int]] = (),
) -> list[Session]:
    """Rebuild the persistent sessions from what the store read back, in its row order.

    ``sessions``: (client_id, subscriptions, expires: when it ends, on the clock of this run,
    or None); ``messages``: (client_id, key, topic, payload,
    msg_qos, qos, retain, packet_id, state, origin, seq, publisher, timestamp, props, share,
    root, expires), ordered by client and key (``share``: the shared group the entry came
    through, "$share/{g}/{f}", or None; ``root``: a group's re-send's mark naming the message
    it re-sends, shared.py ``resend_mark``, or None; ``expires``: Message.expires, on the
    clock of this run, or None); ``awaiting_rel``: (client_id, packet_id); ``inbound``: (client_id, packet_id,
    topic, payload, retain, origin, seq, publisher, timestamp, props, expires), the messages of
    those ids in a mesh (mesh/cluster/replica.py); ``versions``: (client_id, epoch, version) of
    sessions replicated in a mesh; ``tombstones``: (client_id, number, origin, seq), the
    message ids they settled, oldest first; ``floors``: (client_id, origin, seq), up to
    which they forgot settled ids. Rows of unknown clients are
    skipped. Each is consumed only after the one before it.

    An entry that came through a shared group names it by its share (``Entry.group`` a str)
    until the session is registered, its subscriptions joined to this node's groups
    (``SessionTable.restore_session``, which puts the live group in its place).
    """
    restored: dict[str, Session] = {}
    for client_id, subscriptions, expires in sessions:
        session = factory.restored(client_id)
        session.subscriptions = subscriptions
        session.expires_at = expires
        restored[client_id] = session
    for row in messages:
        client_id, key, topic, payload, msg_qos, qos, retain, pid, state, origin, seq, pub, ts, props, *rest = row
        share, root, exp = rest
        owner = restored.get(client_id)
        if owner is None:
            continue
        props = bytes(props) if props is not None else None
        msg = Message(topic, bytes(payload), msg_qos, False, origin, seq, pub, ts, props)
        if root is not None and is_resend_mark(root):
            msg.shares = (root,)  # (to no group or subscriber if dispatched: a session's message)
        msg.expires = exp  # (its ``ttl`` is worked out where it is sent: Message.at)
        entry = Entry(msg, qos, bool(retain), key, share)
        entry.packet_id, entry.state = pid, state
        owner.restore_entry(entry)
    for client_id, pid in awaiting_rel:
        owner = restored.get(client_id)
        if owner is not None:
            owner._awaiting().add(pid)
    # the parts only a session replicated in a mesh has: its factory's business
    factory.restore_replicated(restored, inbound, versions, tombstones, floors)
    for session in restored.values():
        session.restore_done()
    return list(restored.values())
