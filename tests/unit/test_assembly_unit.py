"""assembly.build_core: one node's pure objects wired at construction, and one PUBLISH
through them, on one node and across two nodes joined by an in-memory link.

No process, no socket, no clock: the times are arguments, the I/O side (MeshIO) and the
links are recorded in memory.
"""

from __future__ import annotations

import types

import pytest

from mqttmesh.assembly import MeshConfig, build_core, seq_base
from mqttmesh.broker import Broker, BrokerSettings
from mqttmesh.mesh.cluster.cluster import ClusterSettings
from mqttmesh.mesh.cluster.replica_sessions import DurableMeshSession, MeshSession, ReplicaSessions
from mqttmesh.mesh.link.gateway import MeshGateway
from mqttmesh.mesh.link.peerauth import NONCE_BYTES
from mqttmesh.session import Session
from mqttmesh.session_durable import DurableSession, Sessions
from mqttmesh.store import NULL_JOURNAL, Journal
from support import mqttraw
from support.frames import Net, ack, out, publishes

SECRET = b"assembly-secret"


class IO:
    """The event loop's side of the mesh (a ports.MeshIO), recorded."""

    def __init__(self):
        self.soon = 0
        self.nonces = 0

    def flush_later(self):
        self.flush_soon()

    def flush_soon(self):
        self.soon += 1

    def flush_now(self):
        pass

    def write_clients_now(self):
        pass

    def nonce(self):
        self.nonces += 1
        return bytes([self.nonces]) * NONCE_BYTES

    def learned(self, address, node):
        pass


class Log:
    def __init__(self):
        self.lines = []

    def info(self, msg, *args):
        self.lines.append(msg % args)

    warning = exception = info


class MemLink:
    """One end of an in-memory peer link (a ports.PeerLink)."""

    def __init__(self, dialler, proved, answers_hello, address, rtt=None):
        self.dialler, self.peer, self.proved = dialler, "", proved
        self.handshake_rtt, self.answers_hello, self.address = rtt, answers_hello, address
        self.sent: list[tuple[str, bytes, int]] = []
        self.closed = None

    def send(self, kind, payload, qos):
        if self.closed is None:
            self.sent.append((kind, payload, qos))

    def close(self, reason):
        self.closed = self.closed or reason

    def congestion_key(self):
        return self


def mesh_core(name, journal=NULL_JOURNAL, incarnation=1, wall_offset=0.0):
    io, log = IO(), Log()
    # (no grace: a node alone serves persistent sessions from its first tick, issue 15)
    config = MeshConfig(SECRET, [f"{name}.example:1883"], io, log, cluster=ClusterSettings(quorum_grace=0.0))
    core = build_core(
        BrokerSettings(node_id=name),
        incarnation=incarnation,
        now=0.0,
        wall_offset=wall_offset,
        journal=journal,
        mesh=config,
    )
    core.cluster.tick(0.0)
    return core, io


class Pair:
    """Two assembled nodes; ``a`` dialled ``b``. ``pump`` moves what each side sent."""

    def __init__(self, a, b):
        self.a, self.b = a, b
        self.out = MemLink("a", "b", False, "b.example:1883", 0.002)  # a's end
        self.inb = MemLink("a", "a", True, "10.0.0.1:50000")  # b's end
        a.links.dialled_ready(self.out)

    def pump(self, now, rounds=50):
        for _ in range(rounds):
            self.a.links.flush(now)
            self.b.links.flush(now)
            moved = False
            for link, far, far_link in ((self.out, self.b, self.inb), (self.inb, self.a, self.out)):
                sent, link.sent = link.sent, []
                for kind, payload, _qos in sent:
                    moved = True
                    far.links.receive(far_link, kind, payload, now)
            if not moved:
                return
        raise AssertionError("the two nodes never went quiet")


def reachable_from(root, *kinds):
    """The objects of ``kinds`` reachable from ``root`` through attributes, containers,
    bound methods and closures."""
    seen, stack, found = set(), [root], []
    while stack:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, (str, bytes, int, float, bool, type(None), type, types.ModuleType)):
            continue
        seen.add(id(obj))
        if isinstance(obj, kinds):
            found.append(obj)
        if isinstance(obj, dict):
            stack.extend(obj.keys())
            stack.extend(obj.values())
        elif isinstance(obj, (list, tuple, set, frozenset)):
            stack.extend(obj)
        else:
            for name in getattr(type(obj), "__slots__", ()):
                stack.append(getattr(obj, name, None))
            stack.extend(getattr(obj, "__dict__", {}).values())
            owner = getattr(obj, "__self__", None)  # a bound method holds its object
            if owner is not None:
                stack.append(owner)
            if isinstance(obj, types.FunctionType):  # a closure holds its variables
                stack.extend(cell.cell_contents for cell in obj.__closure__ or ())
    return found


# --------------------------------------------------------------------------- standalone


def test_a_standalone_core_has_no_mesh_and_its_channels_no_ports():
    core = build_core(BrokerSettings(node_id="n1"))
    broker = core.broker
    assert core.engine is core.gateway is core.cluster is core.links is None
    assert broker.mesh is broker.retained_port is broker.forwarding is broker.archive is None
    assert type(broker.session_factory) is Sessions
    assert broker.session_factory.congestion is broker.congestion  # one Congestion, shared
    ch = core.channel(object(), "peer", 0.0)
    assert ch.peers is None and ch.claims is None and ch.broker is broker


def test_a_standalone_publish_goes_channel_broker_session_owner_bytes():
    core = build_core(BrokerSettings(node_id="n1"), incarnation=3, wall_offset=1_000.0)
    net = Net.of(core)
    sub = net.subscriber("sub", ("t/#", 1))
    pub = net.connect("pub")
    pub.receive_data(mqttraw.publish("t/1", b"hello", 1, pid=7), 5.0)
    assert [p.type for p in out(pub)] == [mqttraw.PUBACK]
    assert publishes(sub) == [("t/1", b"hello", 1, False, False, 1)]
    # numbered from the incarnation's base, stamped with the wall clock
    (msg,) = [e.msg for e in core.broker.sessions["sub"].inflight.values()]
    assert (msg.origin, msg.seq, msg.publisher, msg.timestamp) == ("n1", seq_base(3) + 1, "pub", 1_005.0)
    assert seq_base(3) == 3 << 28


def test_a_durable_core_journals_persistent_sessions_and_holds_acks_for_the_store():
    journal = Journal()
    core = build_core(BrokerSettings(node_id="n1"), journal=journal)
    net = Net.of(core)
    sub = net.connect("sub", clean=False)
    sub.receive_data(mqttraw.subscribe(1, ("t/#", 1)), 0.0)
    assert out(sub) == []  # the SUBACK waits for the subscription to be durable
    core.committed(journal.take()[0], 0.0)
    assert [p.type for p in out(sub)] == [mqttraw.SUBACK]
    assert type(core.broker.sessions["sub"]) is DurableSession
    pub = net.connect("pub")
    pub.receive_data(mqttraw.publish("t/1", b"x", 1, pid=7), 1.0)
    assert out(pub) == []  # the PUBACK waits: the message is in a durable session's queue
    core.committed(journal.take()[0], 0.0)
    assert pub.data_to_send() == ack(0x40, 7)
    assert [p[:3] for p in publishes(sub)] == [("t/1", b"x", 1)]


# --------------------------------------------------------------------------- in a mesh


def test_a_mesh_core_gives_every_port_at_construction_and_the_arrows_go_one_way():
    core, _io = mesh_core("a", wall_offset=50.0)
    broker, cluster, links, gateway = core.broker, core.cluster, core.links, core.gateway
    assert isinstance(gateway, MeshGateway) and broker.mesh is gateway
    assert broker.retained_port is cluster.retained and broker.forwarding is cluster.replication
    assert type(broker.session_factory) is ReplicaSessions
    assert broker.forwarding is cluster.replication is cluster.holders.replication  # one owner of the redirects
    assert gateway.links is links.links and gateway.congestion is broker.congestion
    assert gateway.wall_offset == broker.wall_offset == cluster.wall_offset == 50.0
    ch = core.channel(object(), "peer", 0.0)
    assert ch.peers is links and ch.claims is cluster
    # built before the Broker, nothing the Broker holds leads back to the Cluster or the links
    from mqttmesh.mesh.cluster.cluster import Cluster
    from mqttmesh.mesh.link.links import PeerLinks

    assert reachable_from(broker, Cluster, PeerLinks) == []
    assert reachable_from(cluster, PeerLinks) == []
    # (and the walk does find what is there: later objects hold earlier ones)
    assert reachable_from(links, Cluster) == [cluster] and reachable_from(cluster, Broker) == [broker]
    assert reachable_from(broker, MeshGateway) == [gateway]


@pytest.mark.parametrize("durable", [False, True])
def test_a_mesh_core_replicates_persistent_sessions(durable):
    journal = Journal() if durable else NULL_JOURNAL
    core, _io = mesh_core("a", journal)
    net = Net.of(core)
    ch = net.channel(0.0)
    ch.receive_data(mqttraw.connect("c", clean=False), 0.0)  # this node is its own registrar
    if durable:
        core.committed(journal.take()[0], 0.0)
    assert out(ch)[0].type == mqttraw.CONNACK
    session = core.broker.sessions["c"]
    assert type(session) is (DurableMeshSession if durable else MeshSession)
    assert session.on_settled == core.cluster.replication.on_settled  # a constructor argument
    assert session.on_subs == core.cluster.replication.subs_changed
    assert type(core.broker.sessions.get("c")) is not Session


def test_a_publish_crosses_two_cores_over_an_in_memory_link():
    (a, _), (b, _) = mesh_core("a"), mesh_core("b")
    pair = Pair(a, b)
    pair.pump(0.0)
    assert a.links.links == {"b": pair.out} and b.links.links == {"a": pair.inb}
    na, nb = Net.of(a), Net.of(b)
    sub = na.channel(0.1)
    sub.receive_data(mqttraw.connect("sub"), 0.1)
    pair.pump(0.1)  # the claim may go to the other node, its registrar
    sub.receive_data(mqttraw.subscribe(1, ("t/#", 1)), 0.1)
    assert [p.type for p in out(sub)] == [mqttraw.CONNACK, mqttraw.SUBACK]
    pair.pump(0.1)  # the subscription's interest reaches b
    pub = nb.channel(0.2)
    pub.receive_data(mqttraw.connect("pub"), 0.2)
    pair.pump(0.2)
    assert [p.type for p in out(pub)] == [mqttraw.CONNACK]
    # Channel -> Broker -> MeshGateway -> engine -> link -> PeerLinks -> Broker -> Session
    pub.receive_data(mqttraw.publish("t/1", b"across", 1, pid=3), 0.3)
    pair.pump(0.3)
    assert [p[:3] for p in publishes(sub)] == [("t/1", b"across", 1)]
    assert pub.data_to_send() == ack(0x40, 3)
