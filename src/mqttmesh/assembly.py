"""The one place the pure objects of a node are wired together: ``build_core``.

Pure. The server (server/node.py) calls it once the node's id, incarnation and wall
offset are known, and so can the simulator and the tests. Every object gets what it
calls in its constructor, and the order below is the only order there is: an object
built earlier never holds a later one (docs/design.md, "How the code is laid out").

    congestion, retained trie                      the Broker's, made first to be shared
    engine, gateway (MeshPort)                     mesh nodes only
    membership, replication, retained owners       mesh nodes only (mesh/cluster/cluster.py cluster_parts)
    sessions (ReplicaSessions in a mesh)
    broker (BrokerPorts: all of the above)
    cluster (ClaimPort), links (PeerPort)          mesh nodes only
    channels: NodeCore.channel(owner, peer, now, certified)

What is left to the caller is I/O: the MeshIO (timers, flushes, nonces) and the Owner of
each connection.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .auth import Auth
from .broker import Broker, BrokerPorts, BrokerSettings
from .channel import Channel
from .flow import Congestion
from .mesh.cluster.cluster import Cluster, ClusterSettings, cluster_parts
from .mesh.cluster.replica_sessions import ReplicaSessions
from .mesh.link.gateway import MeshGateway
from .mesh.link.links import PeerLinks
from .mesh.routing.engine import MeshEngine, MeshSettings
from .session_durable import Sessions
from .store import NULL_JOURNAL
from .topics import RetainedTrie

if TYPE_CHECKING:
    from .ports import ArchivePort, JournalPort, Log, MeshIO, Owner, PeerLink, RandomHex

__all__ = ["MeshConfig", "NodeCore", "build_core", "seq_base"]


def seq_base(incarnation: int) -> int:
    """Where this start's message numbers begin: (node, seq) stays unique across restarts,
    since a later start has a larger incarnation (sixteenths of a second), and 2**28
    numbers per sixteenth of a second is plenty."""
    return incarnation << 28


@dataclass(frozen=True)
class MeshConfig:
    """What a mesh node needs beyond a standalone one."""

    secret: bytes  # the cluster secret (mesh/link/peerauth.py)
    addresses: list[str]  # advertised to the other nodes
    io: MeshIO  # the event loop's side (server/mesh_node.py MeshNode)
    log: Log
    settings: MeshSettings = field(default_factory=MeshSettings)
    cluster: ClusterSettings = field(default_factory=ClusterSettings)
    certificate_required: bool = False  # mesh.tls_mutual
    connect_all: bool = False  # mesh.connect = "all"


class NodeCore:
    """The pure objects of one node, wired; ``channel`` makes the Channel of a connection."""

    def __init__(
        self,
        broker: Broker,
        engine: MeshEngine | None = None,
        gateway: MeshGateway | None = None,
        cluster: Cluster | None = None,
        links: PeerLinks | None = None,
    ):
        self.broker = broker
        self.engine = engine
        self.gateway = gateway
        self.cluster = cluster
        self.links = links

    def committed(self, batch: int, now: float) -> None:
        """The I/O layer made journal ``batch`` durable: each part releases what it held for
        it (the Broker its clients' acknowledgements; the links the end-to-end
        acknowledgements of messages from other nodes; the cluster its answers to holders)."""
        for channel in self.broker.committed(batch):
            channel.release_acks(batch, now)
        if self.links is not None:
            self.links.committed(batch)
        if self.cluster is not None:
            self.cluster.committed(batch)

    def channel(self, owner: Owner[Channel], peer: str, now: float, certified: bool = False) -> Channel:
        """The Channel of a new connection: in a mesh it answers peers through the links
        and claims ClientIds through the cluster."""
        return Channel(self.broker, owner, peer, now, certified, peers=self.links, claims=self.cluster)


def build_core(
    settings: BrokerSettings,
    *,
    incarnation: int = 0,
    now: float = 0.0,
    wall_offset: float = 0.0,
    auth: Auth | None = None,
    journal: JournalPort = NULL_JOURNAL,
    archive: ArchivePort | None = None,
    random_hex: RandomHex | None = None,
    mesh: MeshConfig | None = None,
) -> NodeCore:
    """Wire one node: standalone, or in a mesh when ``mesh`` is given. ``now`` is the
    caller's clock (the mesh engine starts at it); ``wall_offset`` turns that clock into
    wall-clock time (message timestamps)."""
    auth = auth if auth is not None else Auth()
    node_id = settings.node_id
    congestion = Congestion(settings.slow_consumer_timeout, settings.backpressure_timeout)
    retained_trie = RetainedTrie()
    on_sent = None if archive is None else archive.sent  # the archive's delivery log
    if mesh is None:
        sessions = Sessions(settings.limits, journal, congestion, on_sent)
        ports = BrokerPorts(sessions, congestion, archive=archive, random_hex=random_hex)
        broker = Broker(
            settings,
            auth,
            journal,
            ports,
            seq_base=seq_base(incarnation),
            wall_offset=wall_offset,
            retained_trie=retained_trie,
        )
        return NodeCore(broker)
    # with a store, QoS 1/2 messages held for other nodes survive a crash of this one
    engine = MeshEngine(
        node_id,
        incarnation,
        mesh.addresses,
        mesh.settings,
        custody=journal if journal.persistent else None,
        codec=json,
        wall_offset=wall_offset,
    )
    engine.start(now)
    link_table: dict[str, PeerLink] = {}  # peer node -> its current link (PeerLinks keeps it)
    gateway = MeshGateway(engine, congestion, wall_offset, link_table, mesh.io)
    parts = cluster_parts(
        node_id,
        incarnation,
        gateway,
        retained_trie,
        journal,
        auth,
        mesh.cluster,
        wall_offset,
        mesh.io.flush_soon,
        mesh.io.flush_later,
    )
    # CleanSession=0 sessions are replicated (mesh/cluster/replica.py), journaled too with a store
    replication = parts.replication
    hooks = (
        replication.on_settled,
        on_sent,
        replication.late,
        replication.subs_changed,
        replication.shared_taken,
        replication.hurry,
    )
    sessions = ReplicaSessions(settings.limits, journal, congestion, *hooks)
    ports = BrokerPorts(sessions, congestion, gateway, parts.retained, replication, archive, random_hex)
    broker = Broker(
        settings,
        auth,
        journal,
        ports,
        seq_base=seq_base(incarnation),
        wall_offset=wall_offset,
        retained_trie=retained_trie,
    )
    engine.new_seq = broker.next_seq  # (custody sends a shared group's message again under a new id)
    # one table of sessions: the Broker delivers through it, the cluster keeps its copies there
    cluster = Cluster(node_id, incarnation, broker.table, broker, gateway, parts, mesh.cluster, wall_offset)
    links = PeerLinks(
        node_id,
        incarnation,
        mesh.secret,
        engine,
        link_table,
        broker,
        cluster,
        mesh.io,
        mesh.log,
        certificate_required=mesh.certificate_required,
        connect_all=mesh.connect_all,
    )
    return NodeCore(broker, engine, gateway, cluster, links)
