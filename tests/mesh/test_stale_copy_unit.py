"""Issue 20 (7 nodes, 400 msgs/s: 3,265 and 3,559 QoS 2 messages delivered twice): a copy of a
session that missed the settlements of messages it had queued brought them back, as new, to
the node the client moved to, once more ids had been settled since than a snapshot carried
(5,000). A snapshot now carries every settled id its copy remembers (TOMBSTONES, packed),
and past that the copy's floor per origin: a QoS 2 message at or below it that no up-to-date
copy holds is taken as settled, never delivered twice."""

from __future__ import annotations

import pytest

from mqttmesh.mesh.cluster import replica
from mqttmesh.mesh.cluster.cluster import ClusterSettings
from mqttmesh.mesh.cluster.cluster_values import ClusterWireError, Snapshot, SnapshotEntry, pack_ids, unpack_ids
from mqttmesh.mesh.cluster.snapshots import merge_snapshots
from support.cluster_net import Net, cid_with


def _complete_all(ch) -> int:
    """The client acknowledges every message in flight (PUBACK; PUBREC then PUBCOMP); how many."""
    n = 0
    session = ch.session
    while session.inflight:
        for pid, entry in list(session.inflight.items()):
            if entry.qos == 1:
                session.on_puback(pid, 0.0)
            else:
                session.on_pubrec(pid)
                session.on_pubcomp(pid, 0.0)
            n += 1
    return n


def _stale_holder(net: Net, qos: int, first: int, then: int):
    """A persistent subscriber on ``a`` (holders a and b); b takes the first ``first``
    messages but never hears that they were settled (a link that lost the batch, or b killed
    before it stored it); ``then`` more are settled with b following again."""
    cid = cid_with(net, lambda regs, holders: set(holders) == {"a", "b"})
    ch = net.connect("a", cid, clean=False)
    net.brokers["a"].table.subscribe(ch.session, "t/#", qos)
    net.pump()
    early = [net.publish("c", f"t/{i}", b"x", qos=qos) for i in range(first)]
    _complete_all(ch)
    net.clusters["a"].flush(net.t)
    net.queue = type(net.queue)(q for q in net.queue if not (q[1] == "b" and q[2] == "sess.settle"))
    net.pump()
    assert {(m.origin, m.seq) for m in early} <= set(net.brokers["b"].sessions[cid].ids)
    for i in range(then):
        net.publish("c", f"t/n{i}", b"y", qos=qos)
        _complete_all(ch)
    net.tick(0.1)
    ch.close("moved")
    net.pump()
    return cid, {(m.origin, m.seq) for m in early}


def _pending(ch) -> set[tuple[str, int]]:
    session = ch.session
    return {(e.msg.origin, e.msg.seq) for e in list(session.inflight.values()) + list(session.queue)}


def _net() -> Net:
    return Net(names=["a", "b", "c", "d"], settings=ClusterSettings(replication=2, stall=1e9))


@pytest.mark.parametrize("qos", [1, 2])
def test_a_copy_that_missed_settlements_beyond_the_old_5000_does_not_bring_them_back(qos):
    net = _net()
    cid, early = _stale_holder(net, qos, first=5, then=6000)
    moved = net.connect("d", cid, clean=False)  # d, not a holder, gathers a's and b's copies
    assert moved.state == "connected" and moved.present
    assert not _pending(moved) & early, "completed messages came back"
    # and b's copy, replaced by the one the client's node sends, hands none of them over
    assert net.clusters["b"].counters["late_forwarded"] == 0
    assert not set(net.brokers["b"].sessions[cid].ids) & early


def test_past_what_a_copy_remembers_qos2_is_taken_as_settled_and_qos1_as_new(monkeypatch):
    """The last resort, the delivery filter's (mesh/routing/dedup.py): at or below the floor a
    message cannot be told apart; a QoS 2 one never becomes twice, a QoS 1 one never never."""
    monkeypatch.setattr(replica, "TOMBSTONES", 100)
    for qos in (1, 2):
        net = _net()
        cid, early = _stale_holder(net, qos, first=5, then=300)
        floors = net.brokers["a"].sessions[cid].floors
        assert floors and all(seq <= floors["c"] for _, seq in early)
        moved = net.connect("d", cid, clean=False)
        assert moved.state == "connected" and moved.present
        back = _pending(moved) & early
        assert back == (early if qos == 1 else set())


def test_merge_takes_a_qos2_message_below_a_floor_for_settled_unless_the_latest_view_holds_it():
    def entry(seq, qos, state=0):
        return SnapshotEntry("n2", seq, "t", "eA==", qos, qos, 0, state, "p", 1.0)

    stale = Snapshot("c", {}, 0, [entry(5, 2), entry(6, 1), entry(50, 2)], [], [], "n4", 3, 40)
    latest = Snapshot("c", {}, 0, [entry(7, 2)], [("n2", 20)], [], "n0", 3, 90, floors={"n2": 10})
    merged = merge_snapshots([stale, latest])
    assert merged is not None
    # 5: QoS 2, below the floor, not held by the latest view: settled and forgotten
    # 6: QoS 1 below it: new (at least once); 7: the latest view holds it; 50: above the floor
    assert sorted(e.seq for e in merged.entries) == [6, 7, 50]
    assert merged.floors == {"n2": 10} and ("n2", 20) in merged.done


def test_packed_ids_round_trip_and_malformed_lists_name_the_origin():
    ids = [("n2", 8), ("n1", 1 << 40), ("n2", 3), ("n1", (1 << 40) + 300), ("n2", 3)]
    packed = pack_ids(ids)
    assert sorted(unpack_ids(packed, "x")) == sorted(set(ids))
    assert len("".join(packed.values())) < 20  # (two varints a few bytes each, base64)
    assert unpack_ids({}, "x") == []
    for bad, words in (
        ({"n1": "@@"}, "'n1' is not base64"),
        ({"n1": "gA=="}, "'n1' ends inside a number"),
        ({"n1": 5}, "'n1' is not a string"),
        ([], "not a JSON object"),
        ({"n1": "/////////////w=="}, "more than 64 bits"),
    ):
        with pytest.raises(ClusterWireError, match=words):
            unpack_ids(bad, "sess.copy snap done")


# --------------------------------------------------------------------------- found by the fuzzer


def test_a_message_a_holder_takes_late_goes_to_the_node_the_client_is_on():
    """Fuzzer seed 65 (8 nodes, a partition, two crashes): a QoS 2 message published while
    both holders of a session were out of reach was acknowledged, reached the holders 16 s
    later (custody's retransmission), after the client had moved to a node that took the
    message's first copy before the session was there: it stayed with the holders, and
    the client never got it. A copy whose client is elsewhere now hands over what it takes
    late (a retransmission, or below what it took from that origin already)."""
    from mqttmesh.message import Message

    net = Net()
    cid = cid_with(net, lambda regs, holders: set(holders) == {"b", "c"})
    ch = net.connect("a", cid, clean=False)  # (a: not one of the holders)
    net.brokers["a"].table.subscribe(ch.session, "t/#", 1)
    net.tick(11.0)  # (the hand-over's redirects are over)
    net.pump()
    sent = len(net.sent)
    late = Message("t/late", b"x", 1, False, "c", 77, "pub", 1e6)
    late.retried = True
    for n in ("b", "c"):
        copy = Message("t/late", b"x", 1, False, "c", 77, "pub", 1e6)
        copy.retried = True
        net.brokers[n].deliver_remote(copy)
    net.pump()
    assert sum(1 for f in ch.frames if b"t/late" in f) == 1  # once, from the two holders
    assert ("c", 77) in ch.session.ids
    assert [k for _, _, k in net.kinds(sent)].count("sess.fwd") == 2
    # one that came in order, as the mesh brings every message, is not handed over
    sent = len(net.sent)
    for n in ("b", "c"):
        net.brokers[n].deliver_remote(Message("t/next", b"y", 1, False, "c", 78, "pub", 1e6))
    net.pump()
    assert "sess.fwd" not in [k for _, _, k in net.kinds(sent)]
    # one below what a holder took from that origin already: late too
    net.brokers["b"].deliver_remote(Message("t/old", b"z", 1, False, "c", 70, "pub", 1e6))
    net.pump()
    assert any(b"t/old" in f for f in ch.frames)


def test_a_node_that_has_not_learned_the_meshs_subscriptions_refuses_every_client():
    """Fuzzer seed 281 (5 nodes, crashes): a node restarted 0.2 s before a clean publisher's
    QoS 2 PUBLISH knew no other node yet; it answered PUBREC and routed the message to no
    one, so the subscribers on the other nodes never got it. A node takes clients only once
    its routing engine holds a neighbour's whole database (or it has been alone for the
    grace, a mesh of one)."""
    from mqttmesh.mesh.cluster.membership import Membership

    m = Membership("a", 1, replication=2, will_delay=0.5, stall=1.0, grace=3.0)
    assert not m.routing_ready(0.0)  # no tick yet
    m.ticked(0.0)
    m.update(["a", "b"], {"a": 1, "b": 1}, 0.05, synced=False)  # a link up, its database not in
    assert not m.routing_ready(0.1)
    m.update(["a", "b"], {"a": 1, "b": 1}, 0.12, synced=True)
    assert m.routing_ready(0.12)
    m.update(["a"], {"a": 1, "b": 1}, 9.0, synced=False)  # (once learned, it stays learned)
    assert m.routing_ready(9.0)
    alone = Membership("z", 1, replication=2, will_delay=0.5, stall=1.0, grace=3.0)
    alone.ticked(0.0)
    alone.update(["z"], {"z": 1}, 0.0, synced=False)
    assert not alone.routing_ready(2.9) and alone.routing_ready(3.0)  # a mesh of one, after the grace
    stuck = Membership("y", 1, replication=2, will_delay=0.5, stall=1.0, grace=3.0)
    stuck.ticked(0.0)
    stuck.update(["y", "x"], {"y": 1, "x": 1}, 0.0, synced=False)  # a peer that never answers
    assert not stuck.routing_ready(5.9) and stuck.routing_ready(6.0)
    first = Membership("f", 1, replication=2, will_delay=0.5, expect_peers=False)
    assert first.routing_ready(0.0)  # no peer to dial, none seen before: it starts a mesh
    first.remember(["g"])
    assert not first.routing_ready(0.0)  # it had seen others: it waits to learn from them
    # the cluster answers CONNACK 0x03, clean sessions too
    net = Net()
    net.clusters["a"].members.synced = False
    net.clusters["a"].members.last_tick = None
    ch = net.connect("a", "pub-1", clean=True)
    assert ch.state == "claiming"  # just started: it waits for its links (issue 22), up to claim_timeout
    net.tick(net.settings.claim_timeout)
    assert ch.refused_rc == 0x03 and "not learned the mesh's subscriptions" in ch.reason
    assert net.clusters["a"].counters["refused_not_synced"] == 1


def test_a_restarted_node_counts_the_nodes_it_had_seen_and_is_no_mesh_of_one(tmp_path):
    """Fuzzer seed 525 (5 nodes, kills, a partition): a node restarted where it reached no
    other node knew none of them, took itself for a mesh of one after the grace, and served a
    persistent client a new, empty session (session present 0) while the session's copies
    were elsewhere. The nodes it has seen are stored, and count from the start."""
    from mqttmesh.broker import Broker, BrokerPorts, BrokerSettings
    from mqttmesh.mesh.cluster.membership import Membership
    from mqttmesh.server.sqlite_store import SqliteStore
    from mqttmesh.store import Journal

    net = Net()
    journal = Journal()
    net.clusters["a"].table.journal = journal  # (what the cluster stores through)
    net.clusters["a"].membership(["a", "b", "c"], {"a": 1, "b": 1, "c": 1, "d": 1}, 1.0)  # d: new
    ops = journal.take()[1]
    assert sorted(op for op in ops if op[0] == "node_seen") == [("node_seen", n) for n in "bcd"]
    store = SqliteStore(str(tmp_path))
    store.write(ops + [("node_seen", "b")])  # (a repeat is one row)
    store.db.close()
    again = SqliteStore(str(tmp_path))
    again.load(Broker(BrokerSettings(node_id="a"), None, None, BrokerPorts()))
    assert again.load_nodes() == ["b", "c", "d"]
    again.db.close()
    m = Membership("a", 2, replication=2, will_delay=0.5, stall=1.0, grace=3.0)
    m.remember(["b", "c"])
    for i in range(37):  # ticks every 0.25 s up to 9 s
        m.ticked(i * 0.25)
        assert not m.quorum(i * 0.25)  # 1 of the 3 nodes it has seen, whatever the grace
    assert m.known == ["a", "b", "c"]
    m.update(["a", "b"], {"a": 2, "b": 1}, 9.1)
    assert m.quorum(9.1) and m.known == ["a", "b", "c"]


def test_a_will_is_one_message_whoever_publishes_it():
    """Fuzzer seeds 22, 36 and others: a will could be published by the connection's node
    and again by a registrar that had not heard the connection end (a release lost in a
    partition, a registrar handing over to the next), two messages to every subscriber. The
    will's number is reserved at CONNECT and travels with the registration: whoever
    publishes it publishes that message, (the connection's node, that number), and every
    node's duplicate filter and every persistent session take it once."""
    from support import mqttraw

    net = Net(settings=ClusterSettings(will_delay=0.5))
    cid = cid_with(net, lambda regs, holders: regs[0] != "a", prefix="w")
    registrar = net.clusters["b"].members.registrars(cid)[0]
    ch = net.client("a")  # a real Channel
    ch.receive_data(mqttraw.connect(cid, will=("w/x", b"gone", 1, False)), net.t)
    net.pump()
    seq = ch.will_seq
    registry = net.clusters[registrar].registry
    before = registry.entries[cid]
    assert seq and ch.state == "connected" and before.will.seq == seq
    # the node publishes it when the connection breaks ...
    ch.connection_lost(net.t)
    net.pump()
    mine = [m for m in net.published["a"] if m.topic == "w/x"]
    assert [(m.origin, m.seq) for m in mine] == [("a", seq)]
    # ... and a registrar that finds that node gone before it heard of it publishes the same
    for n in ("b", "c"):  # (the release lost on its way, to the registrar and its backup)
        net.clusters[n].registry.entries[cid] = before
    net.up.discard("a")
    net.membership()
    net.tick(0.6)
    theirs = [(n, m) for n in ("b", "c") for m in net.published[n] if m.topic == "w/x"]
    assert [(m.origin, m.seq, m.ack_to) for n, m in theirs] == [("a", seq, n) for n, _ in theirs]
    assert len(theirs) == 1


def test_a_will_a_registrar_publishes_is_archived_there_under_its_id():
    """The registrar publishes a dead node's client's will as (that node, the number reserved
    at CONNECT): its archive records that origin, which the deliveries carry, not its own."""
    from mqttmesh.archive.capture import Capture
    from mqttmesh.archive.recorder import ArchiveLimits, Recorder
    from support import mqttraw

    chunks: dict[str, list] = {n: [] for n in ("a", "b", "c")}
    recorders = {n: Recorder(ArchiveLimits(), chunks[n].append, lambda: 0.0, ("#",)) for n in chunks}
    net = Net(settings=ClusterSettings(will_delay=0.5), archives={n: Capture(r) for n, r in recorders.items()})
    cid = cid_with(net, lambda regs, holders: regs[0] != "a", prefix="w")
    registrar = net.clusters["b"].members.registrars(cid)[0]
    ch = net.client("a")
    ch.receive_data(mqttraw.connect(cid, will=("w/x", b"gone", 1, False)), net.t)
    net.pump()
    net.up.discard("a")  # killed with the connection open: its registrar publishes the will
    net.membership()
    net.tick(0.6)
    (will,) = [m for m in net.published[registrar] if m.topic == "w/x"]
    assert (will.origin, will.seq) == ("a", ch.will_seq)
    recorders[registrar].flush()
    (chunk,) = chunks[registrar]
    assert [r[1:4] for r in chunk.rows] == [(ch.will_seq, cid, "w/x")]
    assert chunk.origins == [(0, "a")]  # archive/writer.py publish_table: origin a, msg_id a:SEQ
