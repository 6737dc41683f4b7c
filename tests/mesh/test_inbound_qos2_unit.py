"""Issue 15: a persistent publisher's QoS 2 message, whatever moment its node dies at.

The client sent PUBLISH (QoS 2) to node a and did not get PUBREC; a dies; the client
connects to b and re-sends the PUBLISH (DUP=1, same id) [MQTT-4.3.3-2]. Whether a died
before its session's holders had the message, after they had it but before it was routed,
or after it was routed, every subscriber gets the message exactly once. The message is
routed only once the holders have it with its id (origin, seq); the node the client moves
to routes it again under that id, and each node takes an id once (the engine's delivery
filter, test_engine.py; here support.cluster_net's ``route``).

Real Channels for the publisher (channel.py), the cluster parts of three nodes on the
in-memory network of support.cluster_net; no process, no clock, no socket.
"""

from __future__ import annotations

from collections import deque

import pytest

from mqttmesh.mesh.cluster.cluster import ClusterSettings
from support import mqttraw
from support.cluster_net import Net, cid_with
from support.frames import out, publish_fields, split_frames


def _setup(archives=None) -> tuple[Net, object, object]:
    # (every node holds every session)
    net = Net(settings=ClusterSettings(replication=3, stall=1e9), archives=archives)
    sub = net.connect("c", "sub", clean=False)
    net.brokers["c"].table.subscribe(sub.session, "t/#", 2)
    net.pump()
    pub = net.client("a")
    pub.receive_data(mqttraw.connect("pub", clean=False), net.t)
    net.pump()
    assert [p.type for p in out(pub)] == [mqttraw.CONNACK]
    return net, sub, pub


def _kill(net: Net, node: str) -> None:
    """kill -9: what it sent is in flight still; what was sent to it is lost."""
    net.up.discard(node)
    net.queue = deque(m for m in net.queue if m[1] != node)
    net.membership()


def _deliver_from(net: Net, node: str) -> None:
    """Hand over what ``node`` sent, and nothing the answers cause."""
    net.clusters[node].flush(net.t)
    for frm, dest, kind, payload in [m for m in net.queue if m[0] == node]:
        net.queue.remove((frm, dest, kind, payload))
        net.clusters[dest].receive(frm, kind, payload, net.t)


def _received(sub) -> list[bytes]:
    """The payloads of the new QoS 2 PUBLISHes the subscriber's connection got (DUP=0)."""
    packets = [p for f in sub.frames for p in split_frames(f)]
    return [publish_fields(p)[1] for p in packets if p.type == mqttraw.PUBLISH and not p.dup]


def _move_and_resend(net: Net, to: str):
    """The client connects to ``to`` and re-sends its unacknowledged PUBLISH, then PUBREL."""
    pub = net.client(to)
    pub.receive_data(mqttraw.connect("pub", clean=False), net.t)
    net.pump()
    net.route(to)
    pub.receive_data(mqttraw.publish("t/1", b"x", qos=2, pid=1, dup=True), net.t)
    net.pump()
    net.route(to)
    pub.receive_data(mqttraw.pubrel(1), net.t)
    net.pump()
    net.route(to)
    return pub


@pytest.mark.parametrize("window", ["before the holders had it", "before it was routed", "after it was routed"])
def test_a_qos2_publish_resent_to_another_node_after_its_node_died_is_delivered_once(window):
    net, sub, pub = _setup()
    pub.receive_data(mqttraw.publish("t/1", b"x", qos=2, pid=1), net.t)
    assert net.published["a"] == []  # not routed: the holders do not have it yet
    if window == "before it was routed":
        _deliver_from(net, "a")  # b and c have the message and its id; their answers are lost
    elif window == "after it was routed":
        net.pump()
        assert [m.payload for m in net.route("a")] == [b"x"]
        net.pump()
        assert _received(sub) == [b"x"]
    pub.data_to_send()  # (the PUBREC, if any, never reaches the client)
    _kill(net, "a")
    moved = _move_and_resend(net, "b")
    frames = out(moved)
    assert [p.type for p in frames] == [mqttraw.CONNACK, mqttraw.PUBREC, mqttraw.PUBCOMP]
    assert frames[0].body[0] == 1  # session present: the holders had the session all along
    net.pump()
    assert _received(sub) == [b"x"]  # exactly once [MQTT-4.3.3-2]
    routed_by_b = [(m.origin, m.payload) for m in net.published["b"]]
    if window == "before the holders had it":
        assert routed_by_b == [("b", b"x")]  # b never heard of it: the re-send is the message
    else:
        assert routed_by_b == [("a", b"x")]  # under a's id, whether a routed it or not
    assert net.brokers["b"].sessions["pub"].awaiting_rel == set()


@pytest.mark.parametrize("z_reached_b", [True, False], ids=["b had the new id", "b never heard of it"])
def test_a_released_qos2_id_stays_released_when_a_copy_that_missed_the_release_ranks_first(z_reached_b):
    """The 7-node MQTT 5 fault-harness run of seed 1 (c03b0d5) lost pub1:1642 at all six
    subscribers: its re-send (DUP=1) on node n1 had PUBREC at once and was routed nowhere,
    while the messages re-sent with it (1641, 1643) reached a subscriber on n3. Its packet id
    was taken there for one still awaiting PUBREL: a copy of the session cut off before the
    client released that id an earlier time ranked first by (epoch, version), and a merge
    took the ids awaiting PUBREL from the first copy only. A copy's epoch can outrank the
    claims after it that did not gather it: epochs come from registrars, which forget theirs
    in a restart (test_cluster_unit.py: a claim is newer than every copy *it gathered*).
    Here: X on id 1 is released while c is away, Z reuses id 1 on a, a dies before Z is
    routed, c comes back with X still awaiting PUBREL and the larger epoch, and the client
    re-sends Z on b. Z must be delivered once."""
    net = Net(names=["a", "b", "c", "d", "e"], settings=ClusterSettings(replication=3, stall=1e9))
    cid = cid_with(net, lambda regs, holders: sorted(holders) == ["a", "b", "c"], prefix="pub")
    sid = cid_with(net, lambda regs, holders: sorted(holders) == ["b", "d", "e"], prefix="sub")
    sub = net.connect("b", sid, clean=False)  # (its session's nodes stay in reach throughout)
    net.brokers["b"].table.subscribe(sub.session, "t/#", 2)
    net.pump()
    pub = net.client("a")
    pub.receive_data(mqttraw.connect(cid, clean=False), net.t)
    net.pump()
    pub.receive_data(mqttraw.publish("t/1", b"x", qos=2, pid=1), net.t)
    net.pump()
    net.route("a")
    net.pump()
    assert net.brokers["c"].sessions[cid].awaiting_rel == {1}  # every holder has X's id
    net.up.discard("c")  # c falls out of reach, its copy as it is
    net.membership()
    pub.receive_data(mqttraw.pubrel(1), net.t)  # X released (a and b follow); id 1 is free
    net.pump()
    pub.receive_data(mqttraw.publish("t/1", b"z", qos=2, pid=1), net.t)  # Z on id 1
    if z_reached_b:
        _deliver_from(net, "a")  # b has Z under its id; a never routed it
    assert [p.type for p in out(pub)] == [mqttraw.CONNACK, mqttraw.PUBREC, mqttraw.PUBCOMP]  # (none for Z)
    _kill(net, "a")
    # c's copy belongs to a claim with a larger epoch than the others' (a registrar ahead of
    # the copies: it granted it, then forgot it in a restart), cut off before anyone gathered it
    net.brokers["c"].sessions[cid].epoch += 5
    net.up.add("c")
    net.membership()
    moved = net.client("b")
    moved.receive_data(mqttraw.connect(cid, clean=False), net.t)
    net.pump()
    net.route("b")
    moved.receive_data(mqttraw.publish("t/1", b"z", qos=2, pid=1, dup=True), net.t)
    net.pump()
    net.route("b")
    moved.receive_data(mqttraw.pubrel(1), net.t)
    net.pump()
    net.route("b")
    net.pump()
    assert sub.state == "connected"
    assert [p.type for p in out(moved)] == [mqttraw.CONNACK, mqttraw.PUBREC, mqttraw.PUBCOMP]
    assert _received(sub) == [b"x", b"z"]  # Z once, X not again [MQTT-4.3.3-2]
    assert net.brokers["b"].sessions[cid].awaiting_rel == set()


def _archive_ids(recorder, chunks: list, node: str) -> tuple[list[tuple[str, int]], list[tuple[str, int]]]:
    """The (origin, seq) ids of what ``recorder`` archived at ``node`` (its ``chunks``): its
    publish records (the node's own id but where the chunk's ``origins`` name another:
    archive/writer.py ``publish_table``), and its delivery records."""
    recorder.flush()
    published, delivered = [], []
    for chunk in chunks:
        if chunk.kind == "delivery":
            delivered += [(r[1], r[2]) for r in chunk.rows]
        elif not chunk.reads:
            other = dict(chunk.origins)
            published += [(other.get(i, node), r[1]) for i, r in enumerate(chunk.rows)]
    return published, delivered


@pytest.mark.parametrize("window", ["before the holders had it", "before it was routed", "after it was routed"])
def test_the_archive_of_the_node_that_routes_it_records_it_under_the_id_it_was_routed_with(window):
    """The fault harness's audit (bench/chaos/auditcheck.py) counted such a message lost for
    every subscriber: b archived it under its own id while the deliveries carried a's. The
    node that routes it archives it under the id it routes it with, so the deliveries join."""
    from mqttmesh.archive.capture import Capture
    from mqttmesh.archive.recorder import ArchiveLimits, Recorder

    chunks: dict[str, list] = {n: [] for n in ("a", "b", "c")}
    recorders = {n: Recorder(ArchiveLimits(), chunks[n].append, lambda: 0.0, ("#",), True) for n in chunks}
    net, sub, pub = _setup({n: Capture(r) for n, r in recorders.items()})
    pub.receive_data(mqttraw.publish("t/1", b"x", qos=2, pid=1), net.t)
    if window == "before it was routed":
        _deliver_from(net, "a")
    elif window == "after it was routed":
        net.pump()
        net.route("a")
        net.pump()
    _kill(net, "a")
    _move_and_resend(net, "b")
    net.pump()
    assert _received(sub) == [b"x"]
    ids = {n: _archive_ids(r, chunks[n], n) for n, r in recorders.items()}
    (routed,) = [(m.origin, m.seq) for m in net.published["b"]]
    delivered = ids["c"][1]
    assert delivered == [routed]  # the subscriber's node logged the id the message came under
    if window == "after it was routed":
        # a archived it (its own message, the common case: no origins) and b, which the
        # delivery filter let route it again, did not (b took a's copy first: route)
        assert ids["a"][0] == [routed] and ids["b"][0] == []
        assert all(c.origins == () for c in chunks["a"])
    elif window == "before it was routed":
        assert routed[0] == "a" and ids["b"][0] == [routed]  # under a's id, archived by b
        assert ids["a"][0] == []
    else:
        assert routed[0] == "b" and ids["b"][0] == [routed]  # b's own message: no origins
        assert all(c.origins == () for c in chunks["b"])
