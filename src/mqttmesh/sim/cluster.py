"""A whole simulated node: Broker, Journal, MeshEngine and Cluster, built and wired as the server does.

``build_node`` is the one place where the simulator assembles a node's pure objects
(issue 14: when ``assembly.build_core`` exists, it replaces this function). It
builds them with the constructors server/node.py and server/mesh_node.py use, in
their order (Broker with a Journal; Cluster, which installs the replicated sessions;
the store loaded; the engine with the journal as custody; the broker's hooks), and
``SimCore`` holds the glue server/mesh_node.py has between them: how a unicast
leaves, what an engine's inbound messages become, the membership check, the flush
and tick order. That glue mirrors mesh_node.py until the pure ``PeerLinks`` (S6)
exists; only the Cluster's public API (connect/disconnected via the Channel,
receive, membership, tick, flush, status, clients) and the Broker's are used.

Storage: ``SimStore`` is the node's "disk", a few dicts written with the very op
tuples ``Journal.take`` hands server/sqlite_store.py, and read back through
``store.restore_sessions`` as SqliteStore does. What was not committed when the
node crashed is gone (kill -9).
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable
from typing import Any, Protocol

from ..broker import Broker, BrokerSettings
from ..mesh.actions import Inbound, Send
from ..mesh.cluster import Cluster, ClusterSettings
from ..mesh.engine import MeshEngine, MeshSettings
from ..message import Message
from ..session import Limits
from ..store import Journal, restore_sessions

__all__ = ["SimStore", "SimCore", "NodeIO", "build_node"]


class NodeIO(Protocol):
    """What a simulated node asks of the simulator (the server's event loop does it there)."""

    def flush_soon(self) -> None: ...  # a FLUSH event, once per loop iteration

    def commit_soon(self) -> None: ...  # the journal has a batch to commit

    def published(self, msg: Message) -> None: ...  # observed: a message published at this node

    def error(self, what: str) -> None: ...  # a cluster handler raised (mesh_node logs it)


class SimStore:
    """The committed state of one node, as server/sqlite_store.py would hold it."""

    def __init__(self) -> None:
        self.sessions: dict[str, dict[str, int]] = {}
        self.messages: dict[tuple[str, int], tuple[Any, ...]] = {}
        self.rels: set[tuple[str, int]] = set()
        self.retained: dict[str, tuple[Any, ...]] = {}
        self.custody: dict[int, tuple[Any, ...]] = {}
        self.batches = 0

    def write(self, ops: list[tuple[Any, ...]]) -> None:
        """One committed batch (the op tuples of ``Journal.take``), applied in order."""
        self.batches += 1
        for op in ops:
            kind = op[0]
            if kind == "session_put":
                self.sessions[op[1]] = dict(op[2])
            elif kind == "session_delete":
                cid = op[1]
                self.sessions.pop(cid, None)
                for key in [k for k in self.messages if k[0] == cid]:
                    del self.messages[key]
                self.rels = {r for r in self.rels if r[0] != cid}
            elif kind == "message_put":
                self.messages[(op[1], op[2])] = op[1:]
            elif kind == "message_remove":
                self.messages.pop((op[1], op[2]), None)
            elif kind == "rel_put":
                self.rels.add((op[1], op[2]))
            elif kind == "rel_remove":
                self.rels.discard((op[1], op[2]))
            elif kind == "retained_put":
                self.retained[op[1]] = op[1:]
            elif kind == "retained_delete":
                self.retained.pop(op[1], None)
            elif kind == "custody_put":
                self.custody[op[1]] = op[1:]
            elif kind == "custody_remove":
                self.custody.pop(op[1], None)
            else:
                raise ValueError(f"unknown journal op {kind!r}")

    def load(self, broker: Broker) -> None:
        """Restore sessions and retained messages into ``broker`` (SqliteStore.load)."""
        sessions = restore_sessions(
            broker.session_factory,
            sorted(self.sessions.items()),
            [self.messages[k] for k in sorted(self.messages)],
            sorted(self.rels),
        )
        for session in sessions:
            broker.restore_session(session)
        for topic, payload, qos, origin, seq, publisher, ts in sorted(self.retained.values()):
            broker.retained.set(topic, Message(topic, bytes(payload), qos, True, origin, seq, publisher, ts))

    def load_custody(self) -> list[tuple[Message, list[str]]]:
        out = []
        for seq in sorted(self.custody):
            _, topic, payload, qos, retain, origin, publisher, ts, dests = self.custody[seq]
            out.append(
                (Message(topic, bytes(payload), qos, bool(retain), origin, seq, publisher, ts), dests.split("\0"))
            )
        return out


class SimCore:
    """One node's pure objects and the glue between them (server/mesh_node.py's, mirrored)."""

    def __init__(self, broker: Broker, journal: Journal, engine: MeshEngine, cluster: Cluster, io: NodeIO):
        self.broker = broker
        self.journal = journal
        self.engine = engine
        self.cluster = cluster
        self.io = io
        self.wall_offset = broker.wall_offset
        self._membership: tuple[Any, ...] | None = None
        self._seen_changes = -1
        self.membership_changes = 0
        self.membership_at = 0.0  # when this node's cluster last heard of a membership change
        # mesh_node checks membership at every flush (a shortest-path run whenever the
        # advertisements changed); false: at ticks only, a simulator shortcut for large runs
        self.membership_at_flush = True

    # the broker's hooks (MeshNode._filter_added, _filter_removed, _local_publish)
    def filter_added(self, topic_filter: str) -> None:
        if not topic_filter.startswith("$"):  # $SYS and $mesh stay local to each node
            self.engine.local_filter_added(topic_filter)
            self.io.flush_soon()

    def filter_removed(self, topic_filter: str) -> None:
        if not topic_filter.startswith("$"):
            self.engine.local_filter_removed(topic_filter)
            self.io.flush_soon()

    def local_publish(self, msg: Message) -> None:
        self.io.published(msg)
        if msg.topic[0] != "$":
            if self.engine.route_local(msg, msg.timestamp - self.broker.wall_offset):
                self.io.flush_soon()

    def unicast(self, dest: str, kind: str, payload: bytes) -> bool:  # MeshNode._unicast
        ok = self.engine.send_unicast(dest, kind, payload)
        self.io.flush_soon()
        return ok

    # what the engine received (MeshNode._receive, persistent journal)
    def inbound(self, inbound: Inbound, now: float) -> None:
        for frm, kind, body in inbound.unicasts:
            self.cluster.wall = now + self.wall_offset
            try:
                self.cluster.receive(frm, kind, body, now)
            except Exception as exc:  # mesh_node logs and goes on; the simulator reports it
                self.io.error(f"handling {kind} from {frm} failed: {exc!r}")
        broker = self.broker
        for msg in inbound.deliveries:
            wrote = broker.deliver_remote(msg)
            if msg.qos:
                broker.after_commit(wrote, _Ack(self, msg))
        self.io.flush_soon()

    def _delivered(self, msg: Message) -> None:
        self.engine.delivered(msg)
        self.io.flush_soon()

    def _check_membership(self, now: float) -> None:  # MeshNode._check_membership
        engine = self.engine
        if engine.changes == self._seen_changes:
            return
        self._seen_changes = engine.changes
        live = engine.reachable()
        routers = engine.routers
        incs = {n: routers[n].inc for n in live if n in routers}
        # (live is sorted, so incs.items() is too: the same key as mesh_node's, without a sort)
        key = (tuple(live), tuple(incs.items()))
        if key != self._membership:
            self._membership = key
            self.membership_changes += 1
            self.membership_at = now
            self.cluster.wall = now + self.wall_offset
            self.cluster.membership(live, incs, now)

    def flush(self, now: float) -> list[Send]:  # MeshNode._send: membership, cluster, engine
        if self.membership_at_flush:
            self._check_membership(now)
        self.cluster.flush()
        return self.engine.flush(now)

    def tick(self, now: float) -> list[Send]:  # MeshNode._tick
        self.cluster.wall = now + self.wall_offset
        self._check_membership(now)
        self.cluster.tick(now)
        self.cluster.flush()
        return self.engine.tick(now)

    def committed(self, batch: int) -> None:
        self.broker.committed(batch)


class _Ack:
    """After the commit of a delivery: the end-to-end acknowledgement to the origin's custody."""

    __slots__ = ("core", "msg")

    def __init__(self, core: SimCore, msg: Message):
        self.core, self.msg = core, msg

    def __call__(self) -> None:
        self.core._delivered(self.msg)


def build_node(
    name: str,
    incarnation: int,
    now: float,
    mesh_settings: MeshSettings,
    cluster_settings: ClusterSettings,
    store: SimStore,
    io: NodeIO,
    *,
    seed: int | str = 0,
    wall_offset: float = 0.0,
    limits: Limits | None = None,
    membership_at_flush: bool = True,
    codec: Any = json,
    spf_timer: Callable[[], float] | None = time.perf_counter,
) -> SimCore:
    """A started node of incarnation ``incarnation``, its state loaded from ``store``."""
    journal = Journal(on_dirty=io.commit_soon)
    ids = random.Random(f"{seed}/ids/{name}")
    broker = Broker(
        BrokerSettings(node_id=name, limits=limits or Limits()),
        None,
        journal,
        random_hex=lambda n: f"{ids.getrandbits(8 * n):0{2 * n}x}",
    )
    holder: list[SimCore] = []

    def unicast(dest: str, kind: str, payload: bytes) -> bool:
        return holder[0].unicast(dest, kind, payload)

    cluster = Cluster(name, incarnation, broker, unicast, cluster_settings)  # (sets the replicated sessions)
    cluster.wall = now + wall_offset
    store.load(broker)
    # (node, seq) stays unique across restarts, as in server/node.py
    broker.seq = incarnation << 28
    broker.wall_offset = wall_offset
    engine = MeshEngine(
        name, incarnation, [f"{name}:1883"], mesh_settings, custody=journal, codec=codec, spf_timer=spf_timer
    )
    engine.start(now)
    core = SimCore(broker, journal, engine, cluster, io)
    core.membership_at_flush = membership_at_flush
    holder.append(core)
    for msg, dests in store.load_custody():
        engine.restore_custody(msg, dests, now)
    for topic_filter in broker.router.filters():  # restored persistent sessions
        core.filter_added(topic_filter)
    broker.on_filter_added.append(core.filter_added)
    broker.on_filter_removed.append(core.filter_removed)
    broker.on_publish.append(core.local_publish)
    return core
