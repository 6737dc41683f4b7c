"""The pure peer-link manager (mesh/link/links.py PeerLinks), driven over in-memory links.

No sockets, no clock: the links are MemLink objects (a ports.PeerLink) whose sends are
moved to the other node by hand, the cluster is a recorder, and time is an argument.
"""

from __future__ import annotations

import pytest

from mqttmesh.broker import BrokerPorts, BrokerSettings
from mqttmesh.flow import Congestion
from mqttmesh.mesh.link.gateway import MeshGateway
from mqttmesh.mesh.link.hello import Hello, encode_hello
from mqttmesh.mesh.link.links import FLUSH_EVERY, AcceptedLink, PeerLinks, refusal_reason
from mqttmesh.mesh.link.peerauth import NONCE_BYTES, PEER_PROTOCOL, DiallerAuth, ListenerAuth
from mqttmesh.mesh.routing.actions import Inbound, Send, Unicast
from mqttmesh.mesh.routing.engine import MeshEngine
from mqttmesh.message import Message
from mqttmesh.ports import PeerRefused
from mqttmesh.store import Journal
from support import mqttraw
from support.frames import Net, publishes

SECRET = b"cluster-secret"


class Log:
    """A ports.Log that keeps its lines."""

    def __init__(self):
        self.lines: list[tuple[str, str]] = []

    def _add(self, level, msg, *args):
        self.lines.append((level, msg % args if args else msg))

    def info(self, msg, *args):
        self._add("info", msg, *args)

    def warning(self, msg, *args):
        self._add("warning", msg, *args)

    def exception(self, msg, *args):
        self._add("exception", msg, *args)

    def text(self, level=None) -> str:
        return "\n".join(line for lv, line in self.lines if level is None or lv == level)


class IO:
    """A ports.MeshIO that counts what it is asked."""

    def __init__(self):
        self.soon = 0
        self.now = 0
        self.clients_now = 0
        self.learnt: list[tuple[str, str]] = []
        self.nonces = 0

    def flush_soon(self):
        self.soon += 1

    def flush_later(self):
        self.soon += 1

    def flush_now(self):
        self.now += 1

    def write_clients_now(self):
        self.clients_now += 1

    def nonce(self):
        self.nonces += 1
        return bytes([self.nonces]) * NONCE_BYTES

    def learned(self, address, node):
        self.learnt.append((address, node))


class Cluster:
    """The cluster protocols as PeerLinks sees them: records, and fails where told."""

    def __init__(self):
        self.received: list[tuple[str, str, bytes]] = []
        self.ages: list[float] = []  # how long each was on the way (routing/wire.py)
        self.memberships: list[tuple[list[str], dict[str, int]]] = []
        self.flushes = 0
        self.ticks = 0

    def receive(self, frm, kind, body, now, age=0.0):
        if kind == "bug":
            raise RuntimeError("a bug of ours")
        if kind == "bad":
            raise ValueError("no such field")
        self.received.append((frm, kind, body))
        self.ages.append(age)

    def membership(self, live, incs, now, synced=True):
        self.memberships.append((list(live), dict(incs)))

    def flush(self, now):
        self.flushes += 1

    def tick(self, now):
        self.ticks += 1

    def status(self):
        return {"registrations": 0}


class MemLink:
    """One end of an in-memory peer link (a ports.PeerLink)."""

    def __init__(self, dialler, proved, answers_hello, address=None, rtt=None):
        self.dialler = dialler
        self.peer = ""
        self.proved = proved
        self.handshake_rtt = rtt
        self.answers_hello = answers_hello
        self.address = address
        self.sent: list[tuple[str, bytes, int]] = []
        self.closed: str | None = None

    def send(self, kind, payload, qos):
        if self.closed is None:
            self.sent.append((kind, payload, qos))

    def close(self, reason):
        if self.closed is None:
            self.closed = reason

    def congestion_key(self):
        return self


class Node:
    """A Broker, a MeshEngine, a PeerLinks and a MeshGateway, wired as assembly.build_core
    does (with a fake cluster)."""

    def __init__(self, name, journal=None, connect_all=False):
        self.name = name
        self.engine = MeshEngine(name, 1, [f"{name}.example:1883"])
        self.engine.start(0.0)
        self.io = IO()
        self.log = Log()
        table = {}
        congestion = Congestion(BrokerSettings().slow_consumer_timeout, BrokerSettings().backpressure_timeout)
        self.gateway = MeshGateway(self.engine, congestion, 0.0, table, self.io)
        self.net = Net(node_id=name, journal=journal, ports=BrokerPorts(congestion=congestion, mesh=self.gateway))
        self.broker = self.net.broker
        self.cluster = Cluster()
        self.links = PeerLinks(
            name, 1, SECRET, self.engine, table, self.broker, self.cluster, self.io, self.log, connect_all=connect_all
        )
        self.net.peers = self.links


def hello_of(node, rtt_us=None, **fields) -> bytes:
    return encode_hello(Hello(node, 1, [f"{node}.example:1883"], rtt_us, **fields))


class Pair:
    """Two Nodes joined by a link ``dialler`` dialled; ``pump`` moves what each side sent."""

    def __init__(self, dialler: Node, listener: Node, rtt=0.002):
        self.nodes = (dialler, listener)
        self.out = MemLink(dialler.name, listener.name, False, f"{listener.name}.example:1883", rtt)
        self.inb = MemLink(dialler.name, dialler.name, True, "10.0.0.1:50000")
        self.batches: list[int] = []
        # the dialler introduces itself once the listener proved the secret (PeerClient)
        dialler.links.dialled_ready(self.out)

    def pump(self, now=0.0, rounds=20):
        (a, b) = self.nodes
        for _ in range(rounds):
            a.links.flush(now)
            b.links.flush(now)
            moved = False
            for link, far, far_link in ((self.out, b, self.inb), (self.inb, a, self.out)):
                sent, link.sent = link.sent, []
                for kind, payload, _qos in sent:
                    moved = True
                    self.batches.append(far.links.receive(far_link, kind, payload, now)[0])
            if not moved:
                return
        raise AssertionError("the two nodes never went quiet")


# ====================================================================== the hello and identity


def test_hellos_make_the_link_on_both_sides_with_the_first_cost():
    a, b = Node("a"), Node("b")
    pair = Pair(a, b)
    pair.pump()
    assert a.links.links == {"b": pair.out} and b.links.links == {"a": pair.inb}
    assert pair.out.peer == "b" and pair.inb.peer == "a"
    # both sides advertise the dialler's SUBSCRIBE/SUBACK round trip as the first cost
    assert a.engine.routers["a"].links == {"b": 2000}
    assert b.engine.routers["b"].links == {"a": 2000}
    assert ("b.example:1883", "b") in a.io.learnt  # the dialler learns its address's node
    assert "link to b up (dialled by a)" in a.log.text()


def test_identity_mismatch_closes_and_logs_on_both_sides():
    node = Node("b")
    inbound = MemLink("a", "a", True, "10.0.0.1:50000")
    node.links.receive(inbound, "hello", hello_of("x"), 0.0)
    dialled = MemLink("b", "a", False, "a.example:1883")
    node.links.receive(dialled, "hello", hello_of("x"), 0.0)
    reason = "hello from 'x' on a link authenticated as 'a'"
    assert inbound.closed == reason and dialled.closed == reason
    assert node.links.links == {}
    warnings = node.log.text("warning")
    assert f"peer 10.0.0.1:50000: {reason}" in warnings and f"peer a.example:1883: {reason}" in warnings
    assert inbound.sent == []  # no hello answered to an impostor


def test_hello_of_another_version_is_refused_naming_both():
    node = Node("b")
    link = MemLink("a", "a", True, "10.0.0.1:50000")
    node.links.receive(link, "hello", hello_of("a", proto=PEER_PROTOCOL + 1), 0.0)
    said = f"peer 'a' speaks mesh protocol {PEER_PROTOCOL + 1}, this node {PEER_PROTOCOL}"
    assert link.closed == said
    assert said in node.log.text("warning")
    assert node.links.links == {}


@pytest.mark.parametrize("payload", [b"not json", b"[]", b'{"inc": 1}', b'{"node": "a"}'])
def test_invalid_hello_closes_the_link(payload):
    node = Node("b")
    link = MemLink("a", "a", True)
    node.links.receive(link, "hello", payload, 0.0)
    assert link.closed.startswith("invalid hello")
    assert node.links.links == {}


def test_a_link_to_ourselves_is_refused():
    node = Node("a")
    link = MemLink("a", "a", False, "a.example:1883")  # we dialled our own address
    node.links.receive(link, "hello", hello_of("a"), 0.0)
    assert link.closed == "that is this node itself"
    assert node.links.links == {} and node.engine.routers["a"].links == {}


def test_anything_before_the_hello_is_ignored_on_both_paths():
    node = Node("b")
    dialled = MemLink("b", "a", False)
    assert node.links.receive(dialled, "lsa", b"garbage that would close the link", 0.0) == (0, ())
    assert dialled.closed is None
    channel = FakeChannel("a")
    assert node.links.peer_input(channel, Message("$mesh/from/a/lsa", b"garbage", 1), 0.0) == (0, ())
    assert channel.closed is None
    node.links.link_message(dialled, "$mesh/to/b/lsa", b"garbage", 0.0)
    assert dialled.closed is None


# ====================================================================== duplicate links


# (the dialler of the link that came first, of the one that came second, which one stays)
TIE_BREAK = [
    ("a", "b", "first"),  # a < b: the link a dialled stays
    ("b", "a", "second"),
    ("a", "a", "second"),  # the same dialler again: a reconnect, the new link replaces
    ("b", "b", "second"),
]


@pytest.mark.parametrize("me", ["a", "b"])
@pytest.mark.parametrize(("first", "second", "stays"), TIE_BREAK)
def test_duplicate_link_tie_break(me, first, second, stays):
    other = "b" if me == "a" else "a"
    node = Node(me)

    def link(dialler):
        return MemLink(dialler, other, dialler != me)

    links = {"first": link(first), "second": link(second)}
    for which in ("first", "second"):
        node.links.receive(links[which], "hello", hello_of(other), 0.0)
    kept, dropped = links[stays], links["second" if stays == "first" else "first"]
    assert node.links.links == {other: kept}
    assert kept.closed is None and dropped.closed is not None
    # the end of the link that lost changes nothing
    node.links.closed(dropped, "connection closed", 1.0)
    assert node.links.links == {other: kept}
    assert other in node.engine.routers[me].links


@pytest.mark.parametrize("me", ["a", "b"])
def test_both_arrival_orders_keep_the_link_the_smaller_id_dialled(me):
    other = "b" if me == "a" else "a"
    finals = []
    for order in (("a", "b"), ("b", "a")):
        node = Node(me)
        made = {d: MemLink(d, other, d != me) for d in order}
        for dialler in order:
            node.links.receive(made[dialler], "hello", hello_of(other), 0.0)
        finals.append(node.links.links[other].dialler)
    assert finals == ["a", "a"]


def test_only_the_current_link_going_down_takes_the_peer_down():
    a, b = Node("a"), Node("b")
    pair = Pair(a, b)
    pair.pump()
    stale = MemLink("a", "b", False)
    stale.peer = "b"
    a.links.closed(stale, "connection closed", 1.0)
    assert "b" in a.links.links
    a.links.closed(pair.out, "connection closed", 1.0)
    assert a.links.links == {} and a.engine.routers["a"].links == {}
    assert "link to b down: connection closed" in a.log.text("warning")


def test_rtt_counts_only_on_the_current_link():
    a, b = Node("a"), Node("b")
    pair = Pair(a, b)
    pair.pump()
    soon = a.io.soon
    stale = MemLink("a", "b", False)
    stale.peer = "b"
    a.links.rtt(stale, 0.5, 1.0)
    assert a.io.soon == soon
    a.links.rtt(pair.out, 0.004, 1.0)
    assert a.io.soon == soon + 1


# ====================================================================== the one receive path


class FakeSession:
    def __init__(self, channel):
        self.channel = channel
        self.delivered: list[tuple[Message, int]] = []

    def deliver(self, msg, qos):
        self.delivered.append((msg, qos))


class FakeChannel:
    """A peer's Channel as PeerLinks sees it."""

    def __init__(self, peer_node):
        self.peer_node = peer_node
        self.peer = "10.0.0.9:40000"
        self.session = FakeSession(self)
        self.closed: str | None = None
        self.close_reason = None

    def close(self, reason):
        if self.closed is None:
            self.closed = self.close_reason = reason


def test_inbound_channel_hello_is_answered_on_the_peers_session():
    node = Node("b")
    channel = FakeChannel("a")
    assert node.links.peer_input(channel, Message("$mesh/from/a/hello", hello_of("a", 3000), 1), 0.0) == (0, ())
    (msg, qos), *_ = channel.session.delivered
    assert (msg.topic, qos) == ("$mesh/to/a/hello", 1)
    assert isinstance(node.links.links["a"], AcceptedLink)
    assert node.engine.routers["b"].links == {"a": 3000}  # the cost the dialler measured
    node.links.peer_closed(channel, 2.0)
    assert node.links.links == {}


def test_a_peer_publishing_outside_its_topic_is_closed():
    node = Node("b")
    channel = FakeChannel("a")
    assert node.links.peer_input(channel, Message("$mesh/from/x/hello", hello_of("a"), 1), 0.0) == (0, ())
    assert channel.closed == "peer a published on '$mesh/from/x/hello'"


def test_a_message_on_another_nodes_topic_is_ignored_on_the_dialled_side():
    node = Node("b")
    link = MemLink("b", "a", False)
    node.links.link_message(link, "$mesh/to/c/hello", hello_of("a"), 0.0)
    assert node.links.links == {}


def two_nodes(journal=None):
    a, b = Node("a", journal=journal), Node("b")
    pair = Pair(b, a)  # b dials a: a is the listener, its side is the inbound path
    pair.pump()
    return a, b, pair


def test_a_message_routes_between_two_brokers():
    a, b, pair = two_nodes()
    sub = a.net.subscriber("sub", ("t/#", 0))
    pair.pump(0.1)
    pub = b.net.connect("pub")
    pub.receive_data(mqttraw.publish("t/1", b"hello mesh"), 0.2)
    pair.pump(0.2)
    assert [p[:3] for p in publishes(sub)] == [("t/1", b"hello mesh", 0)]
    # $ topics stay local to each node
    b.net.subscriber("sys", ("$SYS/#", 0))
    pair.pump(0.3)
    assert "$SYS/#" not in str(a.engine.status())


def test_in_memory_qos1_is_acknowledged_end_to_end_at_once():
    a, b, pair = two_nodes()
    sub = a.net.subscriber("sub", ("t/#", 1))
    pair.pump(0.1)
    pub = b.net.connect("pub")
    pub.receive_data(mqttraw.publish("t/1", b"x", 1, pid=1), 0.2)
    b.links.flush(0.2)
    fwd = [s for s in pair.out.sent if s[0] == "fwd"]
    pair.out.sent = [s for s in pair.out.sent if s[0] != "fwd"]
    assert fwd
    assert a.links.receive(pair.inb, "fwd", fwd[0][1], 0.2) == (0, ())
    assert [p[:3] for p in publishes(sub)] == [("t/1", b"x", 1)]
    a.links.flush(0.2)
    assert any(kind == "e2e" for kind, _, _ in pair.inb.sent)


def commit(node: Node) -> int:
    """What the store does: take the batch being filled, write it, report it durable."""
    batch, _ops = node.broker.journal.take()
    for channel in node.broker.committed(batch):  # (as assembly.NodeCore.committed does)
        channel.release_acks(batch, 0.0)
    node.links.committed(batch)
    return batch


def test_journaled_delivery_returns_its_batch_and_acks_after_commit():
    a, b, pair = two_nodes(journal=Journal())
    sub = a.net.connect("sub", clean=False)
    sub.receive_data(mqttraw.subscribe(1, ("t/#", 1)), 0.0)  # its SUBACK waits for the journal
    commit(a)
    pair.pump(0.1)
    pub = b.net.connect("pub")
    pub.receive_data(mqttraw.publish("t/1", b"x", 1, pid=1), 0.2)
    b.links.flush(0.2)
    fwd = [s for s in pair.out.sent if s[0] == "fwd"]
    pair.out.sent = []
    pair.inb.sent = []
    batch, _hits = a.links.receive(pair.inb, "fwd", fwd[0][1], 0.2)
    assert batch > 0  # the PUBACK to the peer waits for it
    a.links.flush(0.2)
    assert not any(kind == "e2e" for kind, _, _ in pair.inb.sent)
    assert commit(a) == batch
    a.links.flush(0.2)
    assert any(kind == "e2e" for kind, _, _ in pair.inb.sent)
    assert [p[:3] for p in publishes(sub)] == [("t/1", b"x", 1)]


def test_a_groups_message_its_origins_custody_takes_off_a_dead_node_reaches_a_member_here():
    """Simulator finding 36, through the brokers: a's QoS 1 message was chosen for b's member
    of the group (round robin: the first for a's own), and b died before it left a. Once b
    is out of reach for ``shared_reroute``, the tick re-routes it to the only member in reach,
    a's own, and hands the copy to a's broker for the group alone: b's plain subscriber of
    nothing, a's plain subscriber not twice."""
    a, b = Node("a"), Node("b")
    a.engine.settings.shared_strategy = "round_robin"
    a.engine.new_seq = a.broker.next_seq  # (as assembly.build_core wires it)
    pair = Pair(a, b)
    pair.pump()
    member = a.net.subscriber("ma", ("$share/g/t/#", 1))
    plain = a.net.subscriber("plain", ("t/#", 1))
    b.net.subscriber("mb", ("$share/g/t/#", 1))
    pair.pump(0.1)
    pub = a.net.connect("pub")
    for pid in (1, 2):  # (the first to a's member, the second chosen for b's)
        pub.receive_data(mqttraw.publish("t/x", b"%d" % pid, 1, pid=pid), 0.2)
    assert [p[1] for p in publishes(member)] == [b"1"]
    assert [p[1] for p in publishes(plain)] == [b"1", b"2"]
    a.links.closed(pair.out, "b died", 0.3)  # (its envelope never left a)
    for step in range(1, 9):
        a.links.tick(0.3 + step)
    assert [p[:3] for p in publishes(member)] == [("t/x", b"2", 1)]
    assert publishes(plain) == []  # (the copy is for the group alone)
    assert a.engine.counters["shared_rerouted"] == 1 and not a.engine.custody and not a.engine._parked


def linked(node: Node, peer="a") -> MemLink:
    link = MemLink(peer, peer, True)
    node.links.receive(link, "hello", hello_of(peer), 0.0)
    assert node.links.links[peer] is link
    return link


def test_a_failing_cluster_handler_does_not_stop_the_rest_of_the_read():
    node = Node("b")
    link = linked(node)
    unicasts = [Unicast("a", "bad", b"{}"), Unicast("a", "bug", b"{}"), Unicast("a", "reg.claim", b"{}", 1.5)]
    node.engine.receive = lambda peer, kind, payload, now: Inbound((), unicasts)
    node.links.receive(link, "uni", b"", 0.0)
    assert node.cluster.received == [("a", "reg.claim", b"{}")] and node.cluster.ages == [1.5]
    assert "node a sent an invalid bad: ValueError('no such field')" in node.log.text("warning")
    assert "handling bug from node a failed" in node.log.text("exception")
    assert link.closed is None


def test_a_read_of_many_batches_writes_the_clients_at_once():
    node = Node("b")
    link = linked(node)
    many = [Unicast("a", "reg.claim", b"{}")] * (FLUSH_EVERY // 4)
    node.engine.receive = lambda peer, kind, payload, now: Inbound((), many)
    node.links.receive(link, "uni", b"", 0.0)
    assert node.io.clients_now == 1
    node.engine.receive = lambda peer, kind, payload, now: Inbound((), many[1:])
    node.links.receive(link, "uni", b"", 0.0)
    assert node.io.clients_now == 1


def test_an_invalid_mesh_message_closes_its_link():
    node = Node("b")
    link = linked(node)
    assert node.links.receive(link, "lsa", b"not json", 0.0) == (0, ())
    assert link.closed.startswith("mesh protocol error:")
    assert "peer a sent something invalid" in node.log.text("warning")


# ====================================================================== membership, tick, status


class FakeEngine:
    """The few engine calls flush/tick/membership make."""

    def __init__(self):
        self.changes = 0
        self.synced = True
        self.live = ["b"]
        self.routers = {}
        self.known = {}
        self.sends: list[Send] = []
        self.addresses = []

    def reachable(self):
        return list(self.live)

    def flush(self, now):
        sends, self.sends = self.sends, []
        return sends

    def tick(self, now):
        return self.flush(now)

    def release_held(self, now):
        return []

    def served_here(self):
        return []

    def known_addresses(self):
        return self.known

    def status(self):
        return {"nodes": self.live}


class Router:
    def __init__(self, inc):
        self.inc = inc


def fake_links(connect_all=False):
    engine, cluster, io, log = FakeEngine(), Cluster(), IO(), Log()
    links = PeerLinks("b", 1, SECRET, engine, {}, Net(node_id="b").broker, cluster, io, log, connect_all=connect_all)
    return links, engine, cluster


def test_membership_is_told_once_per_change_and_not_on_a_refresh():
    links, engine, cluster = fake_links()
    engine.routers = {"b": Router(1)}
    links.flush(0.0)
    assert cluster.memberships == [(["b"], {"b": 1})]
    engine.changes += 1  # a refresh: same nodes, same incarnations
    links.flush(1.0)
    links.tick(1.0)
    assert len(cluster.memberships) == 1
    engine.changes += 1
    engine.live = ["a", "b"]
    engine.routers["a"] = Router(4)
    links.flush(2.0)
    engine.changes += 1
    engine.routers["a"] = Router(5)  # a restarted
    links.tick(3.0)
    assert cluster.memberships[1:] == [(["a", "b"], {"a": 4, "b": 1}), (["a", "b"], {"a": 5, "b": 1})]


def test_membership_names_the_nodes_of_the_database_out_of_reach_too():
    """Issue 15: a node that starts on one side of a partition learns of the other side from
    its neighbours' databases; it must count those nodes in its quorum and in each session's
    home as they do, or it serves a session whose latest state is across the partition."""
    links, engine, cluster = fake_links()
    engine.live = ["b", "c"]
    engine.routers = {"b": Router(1), "c": Router(2), "d": Router(3), "e": Router(4)}  # d, e: out of reach
    engine.changes += 1
    links.flush(0.0)
    assert cluster.memberships == [(["b", "c"], {"b": 1, "c": 2, "d": 3, "e": 4})]


def test_flush_hands_sends_to_the_current_links_only():
    links, engine, cluster = fake_links()
    link = MemLink("a", "a", True)
    links.links["a"] = link
    engine.sends = [Send("a", "lsa", b"1", 1), Send("c", "lsa", b"2", 1)]
    links.flush(0.0)
    assert link.sent == [("lsa", b"1", 1)] and cluster.flushes == 1


def test_connect_all_dials_larger_ids_not_linked():
    links, engine, cluster = fake_links(connect_all=True)
    engine.known = {"a": ["h:1"], "c": ["h:3", "h:33"], "d": [], "e": ["h:5"]}
    links.links["e"] = MemLink("b", "e", False)
    assert links.tick(0.0) == [("c", "h:3")]
    assert cluster.ticks == 1
    plain, engine2, _ = fake_links(connect_all=False)
    engine2.known = engine.known
    assert plain.tick(0.0) == []


def test_status_names_the_links_without_a_time():
    links, engine, cluster = fake_links()
    links.links["a"] = MemLink("a", "a", True, "10.0.0.1:5")
    status = links.status()
    assert status["links"] == {"a": {"dialled_by": "a", "address": "10.0.0.1:5"}}
    assert status["cluster"] == {"registrations": 0} and "time" not in status


def test_handshake_takes_a_fresh_nonce_from_the_io():
    links, engine, cluster = fake_links()
    password = DiallerAuth(SECRET, "a", 7, bytes(NONCE_BYTES)).password()
    first, second = links.listen("$mesh-a", password, False), links.listen("$mesh-a", password, False)
    assert isinstance(first, ListenerAuth) and isinstance(second, ListenerAuth)
    assert first.handshake.listener_nonce != second.handshake.listener_nonce
    assert first.handshake.listener == "b" and first.dialler == "a"
    assert links.listen("$mesh-x", password, False) == PeerRefused(0x02, "peer ClientId must be $mesh-<node>")


def test_refusal_reasons():
    assert "another protocol version" in refusal_reason(0x04)
    assert refusal_reason(0x80) == "it refused our SUBSCRIBE"
    assert refusal_reason(0x03) == "see its log"
