"""A whole simulated node: ``assembly.build_core``, as the server builds it, and the ports it asks for.

Every node of ``mode = "cluster"`` is the ``NodeCore`` server/node.py builds: Broker,
Channels (``NodeCore.channel``), replicated sessions, Journal, Cluster, MeshEngine,
MeshGateway and PeerLinks, unmodified. The simulator supplies only what the server's
I/O layer supplies (docs/simulation.md, section 8):

- ``ports.MeshIO``: a flush soon is the simulator's FLUSH event, a flush now happens at
  once; no nonce is ever drawn (simulated peer links start at the hello, the handshake
  before it has unit tests); addresses learned are of no use (every pair is dialled);
- ``ports.PeerLink``: ``SimLink``, one per side of a simulated connection, whose sends
  cross the simulated network (sim/network.py);
- ``ports.Log``: a handler that raised, or a peer's message the node could not read,
  is a violation;
- ``ports.ArchivePort``: sees every message published at the node (the wills counted
  where they are published); it archives nothing;
- the Journal's commits: ``SimStore``, the node's "disk", a few dicts written with the
  very op tuples ``Journal.take`` hands server/sqlite_store.py, and read back through
  ``store.restore_sessions`` as SqliteStore does. What was not committed when the node
  crashed is gone (kill -9).
"""

from __future__ import annotations

import random
import sys
from typing import TYPE_CHECKING, Any, Protocol

from ..assembly import MeshConfig, NodeCore, build_core
from ..broker import Broker, BrokerSettings
from ..mesh.cluster.cluster import ClusterSettings
from ..mesh.routing.engine import MeshSettings
from ..message import Message
from ..session import Limits
from ..store import Journal, restore_sessions

if TYPE_CHECKING:
    from collections.abc import Hashable

    from ..channel import Channel
    from ..ports import Owner, ReadCapture, SentHook

__all__ = ["SimStore", "SimNode", "SimLink", "NodeIO", "build_node", "SECRET"]

SECRET = b"simulated cluster"  # the cluster secret: checked by no simulated handshake


class NodeIO(Protocol):
    """What a simulated node asks of the simulator (the server's event loop does it there)."""

    def flush_soon(self) -> None: ...  # a FLUSH event, once per loop iteration

    def flush_later(self) -> None: ...  # one within mesh.batch_delay (or the sooner one)

    def flush_now(self) -> None: ...  # hand what was routed to the links at once

    def commit_soon(self) -> None: ...  # the journal has a batch to commit

    def published(self, msg: Message) -> None: ...  # observed: a message published at this node

    def error(self, what: str) -> None: ...  # a cluster handler raised, a peer sent something unreadable

    def link_send(self, link: SimLink, kind: str, payload: bytes, qos: int) -> None: ...  # onto the network

    def link_close(self, link: SimLink, reason: str) -> None: ...  # the node closes a peer link


class SimStore:
    """The committed state of one node, as server/sqlite_store.py would hold it."""

    def __init__(self) -> None:
        self.sessions: dict[str, tuple[dict[str, int], float | None]] = {}
        self.messages: dict[tuple[str, int], tuple[Any, ...]] = {}
        self.rels: set[tuple[str, int]] = set()
        self.inbound: dict[tuple[str, int], tuple[Any, ...]] = {}
        self.versions: dict[str, tuple[str, int, int]] = {}
        self.tombstones: dict[tuple[str, int], tuple[str, int, str, int]] = {}  # (cid, slot) -> row
        self.floors: dict[tuple[str, str], int] = {}  # (cid, origin) -> seq
        self.nodes_seen: set[str] = set()
        self.retained: dict[str, tuple[Any, ...]] = {}
        self.custody: dict[int, tuple[Any, ...]] = {}
        self.rerouted: dict[tuple[str, int], tuple[Any, ...]] = {}  # (origin, seq) -> row
        self.batches = 0

    def write(self, ops: list[tuple[Any, ...]]) -> None:
        """One committed batch (the op tuples of ``Journal.take``), applied in order."""
        self.batches += 1
        for op in ops:
            kind = op[0]
            if kind == "session_put":
                self.sessions[op[1]] = (dict(op[2]), op[3])
            elif kind == "session_delete":
                cid = op[1]
                self.sessions.pop(cid, None)
                for key in [k for k in self.messages if k[0] == cid]:
                    del self.messages[key]
                self.rels = {r for r in self.rels if r[0] != cid}
                self.inbound = {k: v for k, v in self.inbound.items() if k[0] != cid}
                self.versions.pop(cid, None)
                self.tombstones = {k: v for k, v in self.tombstones.items() if k[0] != cid}
                self.floors = {k: v for k, v in self.floors.items() if k[0] != cid}
            elif kind == "message_put":
                self.messages[(op[1], op[2])] = op[1:]
            elif kind == "message_remove":
                self.messages.pop((op[1], op[2]), None)
            elif kind == "rel_put":
                self.rels.add((op[1], op[2]))
            elif kind == "rel_remove":
                self.rels.discard((op[1], op[2]))
            elif kind == "inbound_put":
                self.inbound[(op[1], op[2])] = op[1:]
            elif kind == "inbound_remove":
                self.inbound.pop((op[1], op[2]), None)
            elif kind == "version_put":
                self.versions[op[1]] = op[1:]
            elif kind == "done_put":
                self.tombstones[(op[1], op[2])] = (op[1], op[3], op[4], op[5])
            elif kind == "floor_put":
                self.floors[(op[1], op[2])] = op[3]
            elif kind == "node_seen":
                self.nodes_seen.add(op[1])
            elif kind == "retained_put":
                self.retained[op[1]] = op[1:]
            elif kind == "retained_delete":
                self.retained.pop(op[1], None)
            elif kind == "custody_put":
                self.custody[op[1]] = op[1:]
            elif kind == "custody_remove":
                self.custody.pop(op[1], None)
            elif kind == "rerouted_put":
                self.rerouted[(op[1], op[2])] = op[1:]
            elif kind == "rerouted_remove":
                self.rerouted.pop((op[1], op[2]), None)
            else:
                raise ValueError(f"unknown journal op {kind!r}")

    def load(self, broker: Broker) -> None:
        """Restore sessions and retained messages into ``broker`` (SqliteStore.load)."""
        sessions = restore_sessions(
            broker.session_factory,
            [(cid, subs, expires) for cid, (subs, expires) in sorted(self.sessions.items())],
            [self.messages[k] for k in sorted(self.messages)],
            sorted(self.rels),
            [self.inbound[k] for k in sorted(self.inbound)],
            [self.versions[k] for k in sorted(self.versions)],
            sorted(self.tombstones.values()),
            [(cid, origin, seq) for (cid, origin), seq in sorted(self.floors.items())],
        )
        for session in sessions:
            broker.table.restore_session(session)
        for topic, payload, qos, origin, seq, publisher, ts, props, expires in sorted(self.retained.values()):
            msg = Message(topic, bytes(payload), qos, True, origin, seq, publisher, ts, props)
            msg.expires = expires  # (the simulated clock goes on across a restart: kept as is)
            broker.retained.set(topic, msg)

    def load_nodes(self) -> list[str]:
        return sorted(self.nodes_seen)

    def load_custody(self) -> list[tuple[Message, list[str]]]:
        out = []
        for seq in sorted(self.custody):
            _, topic, payload, qos, retain, origin, publisher, ts, dests, props, expires = self.custody[seq]
            msg = Message(topic, bytes(payload), qos, bool(retain), origin, seq, publisher, ts, props)
            msg.expires = expires
            out.append((msg, dests.split("\0")))
        for key in sorted(self.rerouted):
            origin, seq, topic, payload, qos, retain, publisher, ts, dests, props, expires = self.rerouted[key]
            msg = Message(topic, bytes(payload), qos, bool(retain), origin, seq, publisher, ts, props)
            msg.expires = expires
            out.append((msg, dests.split("\0")))
        return out


class SimLink:
    """One side of one simulated peer connection (a ports.PeerLink): what PeerLinks sends on
    it crosses the simulated network; the simulator hands it what arrives, its round trips
    and its end (``PeerLinks.receive``, ``rtt``, ``closed``)."""

    __slots__ = ("io", "node", "conn", "dialler", "peer", "proved", "handshake_rtt", "answers_hello", "address")

    def __init__(self, io: NodeIO, node: str, other: str, dialler: str, conn: int, handshake_rtt: float | None):
        self.io = io
        self.node = node  # this side
        self.conn = conn  # the simulated connection's number: a later one is another link
        self.dialler = dialler
        self.peer = ""  # PeerLinks sets it from the hello
        self.proved = other  # the node at the far end (its handshake is taken as done)
        self.handshake_rtt = handshake_rtt  # the dialler's SUBSCRIBE/SUBACK round trip
        self.answers_hello = dialler != node  # the listening side answers the dialler's hello
        self.address: str | None = f"{other}:1883"

    def send(self, kind: str, payload: bytes, qos: int) -> None:
        self.io.link_send(self, kind, payload, qos)

    def close(self, reason: str) -> None:
        self.io.link_close(self, reason)

    def congestion_key(self) -> Hashable:
        return self


class _Ports:
    """The node's MeshIO, Log and ArchivePort, all answered by the simulator's NodeIO."""

    sent: SentHook | None = None  # ArchivePort: no delivery log

    def __init__(self, io: NodeIO):
        self.io = io

    # ports.MeshIO
    def flush_soon(self) -> None:
        self.io.flush_soon()

    def flush_later(self) -> None:
        self.io.flush_later()

    def flush_now(self) -> None:
        self.io.flush_now()

    def write_clients_now(self) -> None:
        pass  # a client's bytes leave at the end of the simulated instant anyway

    def nonce(self) -> bytes:
        raise RuntimeError("simulated peer links start at the hello: no handshake draws a nonce")

    def learned(self, address: str, node: str) -> None:
        pass  # the simulator dials every link of the topology, by node

    def inquiry(self, frm: str, kind: str, payload: bytes) -> None:
        pass  # no operator asks a simulated node

    # ports.Log
    def info(self, msg: str, *args: object) -> None:
        pass

    def warning(self, msg: str, *args: object) -> None:
        # a cluster message the node could not read (the other warnings: a link went down, or
        # one the node closes, which SimLink.close reports)
        if "sent an invalid" in msg:
            self.io.error(msg % args)

    def exception(self, msg: str, *args: object) -> None:
        self.io.error(f"{msg % args}: {sys.exc_info()[1]!r}")

    # ports.ArchivePort
    def published(self, msg: Message) -> None:
        self.io.published(msg)

    def other_origin(self, msg: Message) -> None:
        self.io.published(msg)  # (a message published here all the same)

    def read(self, client_id: str) -> ReadCapture | None:
        return None  # messages one by one, to published()


class SimNode:
    """One node's core and journal, and what the simulator's event loop does with them
    (server/mesh_node.py's ``_send`` and ``_tick``: the I/O side of the MeshIO)."""

    def __init__(self, core: NodeCore, journal: Journal):
        assert core.engine is not None and core.gateway is not None
        assert core.cluster is not None and core.links is not None
        self.core = core
        self.broker = core.broker
        self.engine = core.engine
        self.gateway = core.gateway
        self.cluster = core.cluster
        self.links = core.links
        self.journal = journal
        self.membership_at = 0.0  # when this node's cluster last heard of a membership change
        self._live = self.cluster.members.live

    def channel(self, owner: Owner, peer: str, now: float) -> Channel:
        return self.core.channel(owner, peer, now)

    def flush(self, now: float) -> None:
        """What the cluster and the engine queued goes to the links (MeshNode._send)."""
        self.gateway.sent()
        self.links.flush(now)
        self._observe(now)

    def tick(self, now: float) -> None:
        self.links.tick(now)  # (no dials to make: connect_all is off)
        self._observe(now)

    def committed(self, batch: int, now: float) -> None:
        self.core.committed(batch, now)

    def _observe(self, now: float) -> None:
        live = self.cluster.members.live  # a new list at every membership change
        if live is not self._live:
            self._live = live
            self.membership_at = now


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
) -> SimNode:
    """A started node of incarnation ``incarnation``, its state loaded from ``store``, in the
    order of server/node.py and server/mesh_node.py: the core, the disk, custody, a flush."""
    journal = Journal(on_dirty=io.commit_soon)
    ids = random.Random(f"{seed}/ids/{name}")
    ports = _Ports(io)
    core = build_core(
        # (one strategy for the node's groups and the mesh's choice, as server/node.py and
        # server/mesh_node.py both read mqtt.shared_strategy)
        BrokerSettings(node_id=name, limits=limits or Limits(), shared_strategy=mesh_settings.shared_strategy),
        incarnation=incarnation,
        now=now,
        wall_offset=wall_offset,
        journal=journal,
        archive=ports,
        random_hex=lambda n: f"{ids.getrandbits(8 * n):0{2 * n}x}",
        mesh=MeshConfig(SECRET, [f"{name}:1883"], ports, ports, mesh_settings, cluster_settings),
    )
    node = SimNode(core, journal)
    store.load(node.broker)
    node.core.cluster.remember(store.load_nodes(), now)
    for msg, dests in store.load_custody():
        node.engine.restore_custody(msg, dests, now)
    io.flush_soon()  # what the restored sessions' filters told the engine
    return node
