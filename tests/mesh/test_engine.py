"""The routing engine on an instant in-memory network: loop freedom, exactly once, no flooding.

The network here delivers every Send at once, in order; the discrete-event
simulator (mqttmesh.sim) adds latency, loss and faults on top of the same engine.
"""

from __future__ import annotations

import json
import random

import pytest

from mqttmesh.mesh.link.hello import Hello, encode_hello
from mqttmesh.mesh.link.peerauth import PEER_PROTOCOL
from mqttmesh.mesh.routing.actions import Inbound, Send, Unicast
from mqttmesh.mesh.routing.custody import Custody
from mqttmesh.mesh.routing.engine import MeshEngine, MeshProtocolError, MeshSettings
from mqttmesh.mesh.routing.envelope import Envelope, EnvelopeError, decode_batch, encode_batch
from mqttmesh.mesh.routing.lsdb import newest_only
from mqttmesh.mesh.routing.wire import AckGroup, decode_acks
from mqttmesh.message import Message
from mqttmesh.sim.cluster import SimStore
from mqttmesh.store import Journal as StoreJournal
from support.engine_net import Net


def ring(n):
    names = [f"n{i}" for i in range(n)]
    return names, [(names[i], names[(i + 1) % n]) for i in range(n)]


def test_full_mesh_one_hop_and_only_to_interested_nodes():
    names = ["a", "b", "c"]
    net = Net(names, [("a", "b"), ("b", "c"), ("a", "c")])
    net.subscribe("c", "sensors/#")
    m = net.publish("a", "sensors/t")
    assert net.delivered["c"] == [m]
    assert net.delivered["b"] == []
    assert net.fwd_per_link == {("a", "c"): 1}  # b wants nothing and receives nothing


@pytest.mark.parametrize("n", [5, 8])
def test_ring_delivers_exactly_once_along_tree_edges(n):
    names, edges = ring(n)
    net = Net(names, edges)
    subscribers = names[1::2]
    for s in subscribers:
        net.subscribe(s, "t/#")
    for publisher in names:
        net.fwd_per_link.clear()
        for s in names:
            net.delivered[s].clear()
        m = net.publish(publisher, "t/x", qos=1)
        for s in names:
            expected = [m] if s in subscribers and s != publisher else []
            assert net.delivered[s] == expected, (publisher, s)
        # every link carries at most one copy, and exactly the edges of the union of paths
        assert all(v == 1 for v in net.fwd_per_link.values())
        net.engines[publisher].route_to(publisher)
        tree = net.engines[publisher].parent
        used = set()
        for s in subscribers:
            node = s
            while node != publisher:
                used.add((tree[node], node))
                node = tree[node]
        assert set(net.fwd_per_link) == used


def test_random_graph_with_cycles_no_loops_exactly_once():
    rng = random.Random(7)
    names = [f"r{i}" for i in range(8)]
    edges = {(names[i], names[i + 1]) for i in range(7)}
    while len(edges) < 14:
        a, b = rng.sample(names, 2)
        if (b, a) not in edges:
            edges.add((a, b))
    net = Net(names, sorted(edges))
    subs = rng.sample(names, 4)
    for s in subs:
        net.subscribe(s, "+/room/#")
    for publisher in names:
        for s in names:
            net.delivered[s].clear()
        net.fwd_per_link.clear()
        m = net.publish(publisher, "home/room/1")
        for s in names:
            assert net.delivered[s] == ([m] if s in subs and s != publisher else [])
        assert all(v == 1 for v in net.fwd_per_link.values())
        assert len(net.fwd_per_link) == len({e for e in net.fwd_per_link})


def test_link_failure_reroutes_and_custody_retransmits():
    # a - b - d and a - c - d; b is cheaper
    net = Net(["a", "b", "c", "d"], [("a", "b"), ("b", "d"), ("a", "c"), ("c", "d")])
    for x, y in [("a", "c"), ("c", "d")]:
        for u, v in [(x, y), (y, x)]:
            net.engines[u]._set_cost(v, 50_000, net.t)
    net.settle()
    net.subscribe("d", "q/#")
    assert net.engines["a"].route_to("d") == "b"
    # b dies silently with a message in its hands: a keeps it in custody
    net.links.discard(frozenset(("b", "d")))
    net.links.discard(frozenset(("a", "b")))
    m = net.publish("a", "q/1", qos=1)
    assert net.delivered["d"] == []
    assert len(net.engines["a"].custody) == 1
    net.t += 1
    net.engines["a"].link_down("b", net.t)
    net.engines["d"].link_down("b", net.t)
    net.settle()
    assert net.engines["a"].route_to("d") == "c"
    net.t += 0.1
    net._pump("a", net.engines["a"].tick(net.t))
    net.settle()
    assert net.delivered["d"] == [m]
    assert net.engines["a"].custody == {}


def test_duplicate_retransmission_is_delivered_once_and_acked_again():
    net = Net(["a", "b"], [("a", "b")])
    net.subscribe("b", "x")
    a = net.engines["a"]
    m = net.publish("a", "x", qos=2)
    assert net.delivered["b"] == [m] and a.custody == {}
    # resend the same message as a retransmission: delivered once, acked again
    msg = Message("x", b"x", 2, False, "a", m[1], "c", 0)
    a.custody[m[1]] = Custody(msg, {"b"}, 0.0, 0.0)
    net.t = 10
    net._pump("a", a.tick(net.t))
    net.settle()
    assert net.delivered["b"] == [m]
    assert a.custody == {}


def test_partition_and_heal_resynchronise_interest():
    net = Net(["a", "b", "c", "d"], [("a", "b"), ("b", "c"), ("c", "d"), ("d", "a")])
    net.cut("b", "c")
    net.cut("d", "a")
    net.settle()
    net.subscribe("c", "late/#")  # made during the split: a and b cannot know yet
    assert net.engines["a"].nodes_wanting("late/1") == []
    assert net.engines["d"].nodes_wanting("late/1") == ["c"]
    net.connect("b", "c")
    net.connect("d", "a")
    net.settle()
    assert net.engines["a"].nodes_wanting("late/1") == ["c"]
    m = net.publish("a", "late/1")
    assert net.delivered["c"] == [m]


def test_restart_with_higher_incarnation_replaces_old_state():
    net = Net(["a", "b"], [("a", "b")])
    net.subscribe("b", "old/#")
    net.cut("a", "b")
    fresh = MeshEngine("b", 2, ["b:1883"])
    fresh.start(net.t)
    net.engines["b"] = fresh
    net.connect("a", "b")
    net.settle()
    assert net.engines["a"].nodes_wanting("old/x") == []  # the new b has no subscribers
    assert net.engines["a"].routers["b"].inc == 2


def test_a_restarted_origins_retransmission_of_a_delivered_message_is_a_duplicate():
    """a's message reached b, whose acknowledgement was lost with a (kill -9): a restarts (a
    new incarnation, larger message numbers) and retransmits from its restored custody; b
    delivered it already and takes it as a duplicate, acknowledged again, not as a new message
    (the fault harness, 7 nodes, seed 2: b, whose group member had left, sent such a
    retransmission on to another member as new; a plain subscriber got it twice)."""
    j = Journal()
    net = Net(["a", "b"], [("a", "b")], custody={"a": j})
    net.subscribe("b", "t/#")
    a = net.engines["a"]
    for qos in (1, 2):
        a.route_local(Message("t/1", b"x", qos, False, "a", 10 + qos, "p", net.t), net.t)
    net._pump("a", a.flush(net.t))
    while net.queue:  # b takes both; its acknowledgements are still in its outbox
        frm, to, kind, payload = net.queue.popleft()
        net._take(to, net.engines[to].receive(frm, kind, payload, net.t))
    assert [seq for _, seq, _ in net.delivered["b"]] == [11, 12]
    net.cut("a", "b")  # a dies: b's acknowledgements are lost
    net.settle()
    fresh = MeshEngine("a", 2, ["a:1883"], MeshSettings(), custody=j)
    fresh.start(net.t)
    net.engines["a"] = fresh
    for qos in (1, 2):
        fresh.restore_custody(Message("t/1", b"x", qos, False, "a", 10 + qos, "p", 0.0), ["b"], net.t)
    net.connect("a", "b")
    net.settle()
    for step in range(1, 6):
        net.t = float(step)
        net._pump("a", fresh.tick(net.t))
        net.settle()
    assert [seq for _, seq, _ in net.delivered["b"]] == [11, 12]  # (once each)
    assert not fresh.custody and net.engines["b"].counters["duplicates"] >= 2


def test_unicast_is_routed_hop_by_hop_to_its_destination():
    names, edges = ring(5)
    net = Net(names, edges)
    got = []
    original = net._take

    def take(name, inbound):
        got.extend((name, *unicast) for unicast in inbound.unicasts)
        original(name, inbound)

    net._take = take
    assert net.engines["n0"].send_unicast("n2", "claim", b"\x00binary\xff")
    net.settle()
    assert got == [("n2", "n0", "claim", b"\x00binary\xff", 0.0)]  # (instant network: no age)
    assert not net.engines["n0"].send_unicast("nobody", "x", b"")


def test_delivery_filter_forgets_by_generations_and_fails_safe_per_qos():
    from mqttmesh.mesh.routing.dedup import DeliveryFilter

    f = DeliveryFilter(window=4)
    assert not f.seen("o", 1) and f.seen("o", 1)
    for seq in range(2, 20):
        assert not f.seen("o", seq)
    assert f.seen("o", 19) and f.seen("o", 13)  # the two generations still known
    # 3 was forgotten: QoS 1 may be delivered again (at least once), QoS 2 may not
    assert f.seen("o", 4, qos=2)
    assert not f.seen("o", 3, qos=1)
    assert not f.seen("other-origin", 3)  # origins are independent


# --- what the simulator found (docs/simulation.md, "Findings"), each fixed and kept fixed


def test_only_the_newest_version_of_an_advertisement_leaves_in_a_flush():
    # finding 3: a burst of link events queued several versions of a's router advertisement
    # for the same neighbour; only the newest goes, and each full interest only once
    a = MeshEngine("a", 1)
    a.start(0.0)
    a.link_up("b", 0.0)
    for peer in ("c", "d", "e"):
        a.link_up(peer, 0.0)
        a.link_down(peer, 0.0)
    sent = [json.loads(p) for peer, kind, p, _q in a.flush(0.0) if peer == "b" and kind == "lsa"]
    routers = [lsa for batch in sent for lsa in batch if lsa["t"] == "router" and lsa["node"] == "a"]
    assert [r["seq"] for r in routers] == [a.routers["a"].seq]
    assert routers[0]["links"] == {"b": 1000}


def test_newest_only_keeps_deltas_after_a_full_interest():
    lsas = [
        {"t": "interest", "node": "x", "inc": 1, "ver": 2, "base": 1, "add": ["a"], "del": []},
        {"t": "interest", "node": "x", "inc": 1, "ver": 3, "full": ["a", "b"]},
        {"t": "interest", "node": "x", "inc": 1, "ver": 3, "full": ["a", "b"]},
        {"t": "interest", "node": "x", "inc": 1, "ver": 4, "base": 3, "add": ["c"], "del": []},
        {"t": "router", "node": "x", "inc": 1, "seq": 7, "links": {}},
        {"t": "router", "node": "x", "inc": 1, "seq": 5, "links": {}},
        {"t": "interest", "node": "y", "inc": 2, "ver": 1, "base": 0, "add": ["q"], "del": []},
    ]
    kept = newest_only(lsas)
    assert kept == [lsas[1], lsas[3], lsas[4], lsas[6]]


def test_refreshes_are_jittered_and_deterministic():
    # finding 7: nodes whose last origination coincided must not refresh together for ever
    settings = MeshSettings(refresh_interval=30.0)
    due = []
    for name in ("a", "b", "c", "d"):
        e = MeshEngine(name, 1, settings=settings)
        e.start(0.0)
        due.append(e._next_refresh)
        again = MeshEngine(name, 1, settings=settings)
        again.start(0.0)
        assert again._next_refresh == e._next_refresh  # no hidden randomness
    assert all(22.5 <= d <= 30.0 for d in due)
    assert len(set(due)) == 4


def test_the_handshake_rtt_is_the_first_cost_of_a_link():
    # finding 2: a link is advertised once, at its measured cost, not at the floor first
    a = MeshEngine("a", 1)
    a.start(0.0)
    a.link_up("b", 0.0, cost=40_000)
    assert a.routers["a"].links == {"b": 40_000}
    a.link_rtt("b", 41_000, 1.0)  # the first PINGRESP agrees: nothing to re-advertise
    assert a.routers["a"].seq == 2
    hello = encode_hello(Hello(a.node_id, a.incarnation, a.addresses, rtt_us=40_000.4))
    assert json.loads(hello) == {"node": "a", "inc": 1, "addr": [], "rtt": 40_000, "proto": PEER_PROTOCOL}


def test_custody_lets_go_of_a_node_that_aged_out():
    # finding 4: a destination gone for good no longer pins messages in custody
    settings = MeshSettings(max_age=10.0)
    net = Net(["a", "b", "c"], [("a", "b"), ("b", "c")], settings)
    net.subscribe("b", "t/#")
    net.subscribe("c", "t/#")
    net.links.discard(frozenset(("b", "c")))
    net.t = 1.0
    net.engines["b"].link_down("c", net.t)
    net.settle()
    net.publish("a", "t/1", qos=1)  # b acknowledges, c is unreachable
    assert [c.dests for c in net.engines["a"].custody.values()] == [{"c"}]
    net.t = 20.0
    net._pump("a", net.engines["a"].tick(net.t))
    assert net.engines["a"].custody == {}
    assert net.engines["a"].counters["custody_expired"] == 1


def test_a_full_custody_gives_up_on_the_oldest_message():
    settings = MeshSettings(custody_limit=3)
    net = Net(["a", "b"], [("a", "b")], settings)
    net.subscribe("b", "t/#")
    net.links.clear()  # b stops answering
    seqs = [net.publish("a", "t/1", qos=1)[1] for _ in range(5)]
    assert list(net.engines["a"].custody) == seqs[2:]
    assert net.engines["a"].counters["custody_overflow"] == 2


# --- the engine's actions as named types (Send, Inbound, Unicast), pinned as they were tuples


def test_flush_returns_sends_and_a_fwd_batch_brings_deliveries_only():
    net = Net(["a", "b"], [("a", "b")])
    net.subscribe("b", "t/#")
    a, b = net.engines["a"], net.engines["b"]
    zero = Message("t/1", b"0", 0, False, "a", 1, "c", 0.0)
    one = Message("t/2", b"1", 1, False, "a", 2, "c", 0.0)
    a.route_local(zero, net.t)
    (only_zero,) = a.flush(net.t)
    assert isinstance(only_zero, Send)
    assert (only_zero.peer, only_zero.kind, only_zero.qos) == ("b", "fwd", 0)  # QoS 0 only: no link ack
    a.route_local(zero, net.t)
    a.route_local(one, net.t)
    (mixed,) = a.flush(net.t)
    assert (mixed.peer, mixed.kind, mixed.qos) == ("b", "fwd", 1)
    inbound = b.receive("a", "fwd", mixed.payload, net.t)
    assert isinstance(inbound, Inbound)
    assert [(m.origin, m.seq, m.qos) for m in inbound.deliveries] == [("a", 1, 0), ("a", 2, 1)]
    assert list(inbound.unicasts) == []
    assert b.flush(net.t) == []  # nothing acknowledged yet: the caller says when a delivery is safe
    b.delivered(inbound.deliveries[1])
    (ack,) = b.flush(net.t)
    assert (ack.peer, ack.kind, ack.qos) == ("a", "e2e", 0)
    assert decode_acks(ack.payload) == [AckGroup("a", "b", (2,))]


def test_a_uni_message_brings_unicasts_only_and_control_brings_nothing():
    net = Net(["a", "b"], [("a", "b")])
    a, b = net.engines["a"], net.engines["b"]
    assert a.send_unicast("b", "reg.claim", b"{}")
    (uni,) = a.flush(net.t)
    assert (uni.peer, uni.kind, uni.qos) == ("b", "uni", 1)
    inbound = b.receive("a", "uni", uni.payload, net.t)
    assert list(inbound.deliveries) == []
    assert list(inbound.unicasts) == [Unicast("a", "reg.claim", b"{}")]
    assert inbound.unicasts[0].frm == "a"
    for kind, payload in [("lsa", b"[]"), ("lsreq", b"[]"), ("cost", b'{"cost": 1000}'), ("e2e", b"")]:
        assert b.receive("a", kind, payload, net.t) == ((), ())


def test_a_unicast_says_how_long_it_was_on_the_way_across_relays():
    """wire.py ``age``: each hop adds what its wall clock says passed since the message was
    sent (here 2 s unread at b, 3 s more at c); a clock behind the sender's adds nothing."""
    net = Net(["a", "b", "c"], [("a", "b"), ("b", "c")])
    a, b, c = (net.engines[n] for n in "abc")
    a.wall_offset, b.wall_offset, c.wall_offset = 1000.0, 1000.0, 990.0
    assert a.send_unicast("c", "sess.fwd", b"{}")
    (uni,) = a.flush(10.0)
    assert b.receive("a", "uni", uni.payload, 12.0) == ((), ())  # (passed on)
    (relayed,) = b.flush(12.5)
    assert relayed.peer == "c"
    [got] = c.receive("b", "uni", relayed.payload, 25.5).unicasts  # 3 s after b sent it
    assert got == Unicast("a", "sess.fwd", b"{}", pytest.approx(5.0))
    [late_clock] = c.receive("b", "uni", relayed.payload, 20.0).unicasts  # c's clock behind b's
    assert late_clock.age == pytest.approx(2.0)


def test_receive_refuses_unknown_kinds_and_bad_bodies_by_kind():
    net = Net(["a", "b"], [("a", "b")])
    b = net.engines["b"]
    cases = [
        ("nope", b"{}", "unknown message kind 'nope'"),
        ("nope", b"{", "nope: invalid JSON"),  # decoded before the kind is looked up, as before
        ("lsa", b"not json", "lsa: invalid JSON"),
        ("cost", b"{}", "cost: malformed"),
        ("lsa", b'[{"t": "router"}]', "advertisement without node"),
        ("fwd", b"\x00", "malformed envelope batch"),
        ("e2e", b"\x01", "malformed e2e"),
        ("uni", b"\x01", "malformed unicast"),
    ]
    stats = b.peer_stats["a"]
    control_in, batches_in = stats.control_in, stats.batches_in
    for kind, payload, message in cases:
        with pytest.raises(MeshProtocolError, match=message):
            b.receive("a", kind, payload, net.t)
    assert (stats.control_in - control_in, stats.batches_in - batches_in) == (7, 1)  # counted, as before


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_acknowledging_exactly_the_qos_1_and_2_deliveries_empties_every_custody(seed):
    # The engine used to say per delivery whether it needed an end-to-end ack; it was always
    # qos > 0, so the Message alone says it now. Over a random mesh that loses data and acks
    # (retransmissions, duplicates), the callers' rule (ack iff qos) gets an ack on the wire
    # for every QoS 1/2 delivery, never one for a QoS 0 message, and empties every custody.
    print(f"seed={seed}")
    rng = random.Random(seed)
    names = [f"r{i}" for i in range(8)]
    edges = {(names[i], names[i + 1]) for i in range(7)}
    while len(edges) < 14:
        x, y = rng.sample(names, 2)
        if (y, x) not in edges:
            edges.add((x, y))
    net = Net(names, sorted(edges))
    for s in rng.sample(names, 4):
        net.engines[s].local_filter_added("s/#")
    net.settle()
    lossy = [True]
    acked = set()  # (acknowledging node, origin, seq) seen on any link
    delivered = []  # (node, origin, seq, qos)
    pump, take = net._pump, net._take

    def lossy_pump(name, sends):
        kept = []
        for send in sends:
            if send.kind == "e2e":
                acked.update((frm, to, seq) for to, frm, seqs in decode_acks(send.payload) for seq in seqs)
            if not (lossy[0] and send.kind in ("fwd", "e2e") and rng.random() < 0.3):
                kept.append(send)
        pump(name, kept)

    def recording_take(name, inbound):
        delivered.extend((name, m.origin, m.seq, m.qos) for m in inbound.deliveries)
        take(name, inbound)

    net._pump, net._take = lossy_pump, recording_take
    qos_of = {}
    for _ in range(60):
        origin = rng.choice(names)
        net.seq[origin] += 1
        qos_of[(origin, net.seq[origin])] = qos = rng.choice((0, 1, 2))
        net.engines[origin].route_local(Message("s/x", b"x", qos, False, origin, net.seq[origin], "c", net.t), net.t)
    net.settle()
    lossy[0] = False
    for _ in range(12):  # retransmissions back off to at most 30 s
        net.t += 30.0
        for name, e in net.engines.items():
            net._pump(name, e.tick(net.t))
        net.settle()
    assert any(q for *_x, q in delivered) and any(not q for *_x, q in delivered)
    assert {(n, o, s) for n, o, s, q in delivered if q} <= acked
    assert not [key for key in acked if qos_of[key[1:]] == 0]
    assert all(e.custody == {} for e in net.engines.values())


class Journal:
    """A CustodyJournal that records what the engine made durable, in order."""

    def __init__(self):
        self.ops = []

    def custody_put(self, msg, dests):
        self.ops.append(("put", msg.seq, list(dests)))

    def custody_remove(self, seq):
        self.ops.append(("remove", seq))

    def rerouted_put(self, msg, dests):
        self.ops.append(("put", (msg.origin, msg.seq), list(dests)))

    def rerouted_remove(self, origin, seq):
        self.ops.append(("remove", (origin, seq)))


def _publish(net, origin, seq, qos):
    net.engines[origin].route_local(Message("t/1", b"", qos, False, origin, seq), net.t)
    net.settle()


def test_custody_journal_overflow_drops_the_oldest_before_taking_the_new():
    j = Journal()
    net = Net(["a", "b"], [("a", "b")], MeshSettings(custody_limit=3), custody={"a": j})
    net.subscribe("b", "t/#")
    net.links.clear()  # b stops answering
    for seq in range(1, 6):
        _publish(net, "a", seq, 1)
    put = [("put", s, ["b"]) for s in range(1, 6)]
    assert j.ops == [*put[:3], ("remove", 1), put[3], ("remove", 2), put[4]]


def test_custody_journal_put_before_sending_and_removed_after_the_last_ack():
    j = Journal()
    net = Net(["a", "b", "c"], [("a", "b"), ("b", "c")], custody={"a": j})
    net.subscribe("b", "t/#")
    net.subscribe("c", "t/#")
    _publish(net, "a", 1, 0)  # QoS 0: never in custody
    net.engines["a"].route_local(Message("t/1", b"", 1, False, "a", 2), net.t)
    assert j.ops == [("put", 2, ["b", "c"])]  # written before anything is sent (before the PUBACK)
    net.settle()
    _publish(net, "a", 3, 2)
    assert j.ops == [("put", 2, ["b", "c"]), ("remove", 2), ("put", 3, ["b", "c"]), ("remove", 3)]


def test_custody_journal_expiry_and_age_out_remove_once():
    j = Journal()
    net = Net(["a", "b"], [("a", "b")], MeshSettings(custody_timeout=10.0), custody={"a": j})
    net.subscribe("b", "t/#")
    net.links.clear()
    _publish(net, "a", 1, 1)
    for now in (1.0, 5.0, 11.0, 40.0, 80.0):
        net.t = now
        net._pump("a", net.engines["a"].tick(now))
        net.settle()
    assert j.ops == [("put", 1, ["b"]), ("remove", 1)]

    j = Journal()
    net = Net(["a", "b", "c"], [("a", "b"), ("b", "c")], MeshSettings(max_age=10.0), custody={"a": j})
    net.subscribe("b", "t/#")
    net.subscribe("c", "t/#")
    net.links.discard(frozenset(("b", "c")))
    net.t = 1.0
    net.engines["b"].link_down("c", net.t)
    net.settle()
    _publish(net, "a", 1, 1)  # b acknowledges: c still holds it in custody
    assert j.ops == [("put", 1, ["b", "c"])]
    net.t = 20.0
    net._pump("a", net.engines["a"].tick(net.t))  # c aged out
    assert j.ops == [("put", 1, ["b", "c"]), ("remove", 1)]


def test_restored_custody_is_not_written_again_and_is_removed_when_acked():
    j = Journal()
    net = Net(["a", "b"], [("a", "b")], custody={"a": j})
    net.subscribe("b", "t/#")
    net.engines["a"].restore_custody(Message("t/1", b"", 1, False, "a", 7), ["b"], net.t)
    net.t = 1.0
    net._pump("a", net.engines["a"].tick(net.t))
    net.settle()
    assert j.ops == [("remove", 7)]


def test_a_message_routed_again_under_its_origins_id_reaches_each_node_once_and_is_acked_to_the_router():
    """Issue 15: a persistent publisher's QoS 2 message whose id its session's holders agreed
    on may be routed by its origin and again by the node its client moved to (the origin died
    before the message was known to be out). Each destination takes it once, whoever sent it
    first; the second router keeps it in custody by (origin, seq), journaled so (its publisher
    may be done with it: the test after this one), and the destinations acknowledge to it."""
    j = Journal()
    net = Net(["a", "b", "c", "d"], [("a", "b"), ("b", "c"), ("c", "d"), ("d", "a")], custody={"b": j})
    net.subscribe("c", "t/#")
    net.subscribe("d", "t/#")
    a, b = net.engines["a"], net.engines["b"]
    first = Message("t/1", b"x", 2, False, "a", 41, "p", net.t)
    a.route_local(first, net.t)
    net.settle()
    assert sorted(n for n, got in net.delivered.items() if got) == ["c", "d"] and a.custody == {}
    # b routes it again under a's id (same origin and seq): no destination takes it twice
    again = Message("t/1", b"x", 2, False, "a", 41, "p", net.t)
    assert b.route_local(again, net.t) and again.ack_to == "b"
    assert set(b.custody) == {("a", 41)} and j.ops == [("put", ("a", 41), ["c", "d"])]
    net.settle()
    assert net.delivered["c"] == [("a", 41, "t/1")] and net.delivered["d"] == [("a", 41, "t/1")]
    assert b.custody == {} and j.ops[1:] == [("remove", ("a", 41))]  # acknowledged again, to b
    # the same when the origin never sent it: b's copy is the one delivered
    lost = Message("t/2", b"y", 2, False, "a", 42, "p", net.t)
    b.route_local(lost, net.t)
    net.settle()
    assert ("a", 42, "t/2") in net.delivered["c"] and ("a", 42, "t/2") in net.delivered["d"]
    assert net.delivered["a"] == [] and b.custody == {}


def test_the_origin_takes_its_own_message_routed_again_by_another_node_and_acks_to_that_node():
    """The origin may have subscribers of the topic (its restart lost what it had routed): a
    copy under its own id that another node routes is delivered to it, not taken for a loop."""
    net = Net(["a", "b"], [("a", "b")])
    net.subscribe("a", "t/#")
    b = net.engines["b"]
    b.route_local(Message("t/1", b"x", 2, False, "a", 7, "p", net.t), net.t)
    net.settle()
    assert net.delivered["a"] == [("a", 7, "t/1")] and b.custody == {}


def test_a_message_routed_again_for_a_node_out_of_reach_survives_the_routers_restart():
    """The fault harness, 7 nodes, MQTT 5, seed 13 (pub0:230/232 and pub1:548/550 lost for
    sub5): a persistent publisher's QoS 2 messages that their first node had not routed (n6
    killed; the client left n5) were routed by n2 under their origin's id while every holder
    of the subscriber's session (n3, n5, n6) was across a black hole; the publisher was done
    with them (PUBREC, PUBREL; its session marked them routed by n2), and n2 was killed
    (kill -9) before the heal. The second router's custody lived in its memory alone: no
    node had them any more for the subscriber's holders. It is stored as an origin's own is,
    and a restart sends it again, still acknowledged to that router."""
    store = SimStore()
    journal = StoreJournal()
    net = Net(["a", "b", "c"], [("a", "b"), ("b", "c")], custody={"b": journal})
    net.subscribe("c", "t/#")
    net.cut("a", "b")  # the origin is gone
    net.cut("b", "c")  # and the destination across a partition
    net.settle()
    b = net.engines["b"]
    b.route_local(Message("t/1", b"x", 2, False, "a", 41, "p", net.t), net.t)
    net.settle()
    assert set(b.custody) == {("a", 41)} and net.delivered["c"] == []
    store.write(journal.take()[1])  # (committed before the PUBREC: the channel waits for it)
    journal = StoreJournal()  # b killed (kill -9) and started again from its store
    fresh = MeshEngine("b", 2, ["b:1883"], MeshSettings(), custody=journal)
    fresh.start(net.t)
    net.engines["b"] = fresh
    for msg, dests in store.load_custody():
        fresh.restore_custody(msg, dests, net.t)
    net.connect("b", "c")
    net.settle()
    for step in range(1, 6):
        net.t = float(step)
        net._pump("b", fresh.tick(net.t))
        net.settle()
    assert net.delivered["c"] == [("a", 41, "t/1")]
    assert fresh.custody == {}  # acknowledged to b again, and out of its store
    store.write(journal.take()[1])
    assert store.load_custody() == []


def test_an_envelope_to_acknowledge_elsewhere_round_trips_and_a_malformed_one_is_refused():
    msg = Message("t", b"p", 2, False, "a", 5, "pub", 1.0)
    msg.ack_to = "b"
    [env] = decode_batch(encode_batch([Envelope(msg, ["c"], 4)], 0.0), 0.0)
    assert (env.msg.origin, env.msg.ack_to, env.msg.seq) == ("a", "b", 5)
    plain = decode_batch(encode_batch([Envelope(Message("t", b"p", 2, False, "a", 6), ["c"], 4)], 0.0), 0.0)[0]
    assert plain.msg.ack_to == "" and plain.msg.origin == "a"
    bad = bytearray(encode_batch([Envelope(Message("t", b"p", 2, False, "a", 6), ["c"], 4)], 0.0))
    flags_at = len(bad) - 1 - 35  # (the record's flags byte: 35 bytes of record and 1 of payload)
    bad[flags_at] |= 8
    with pytest.raises(EnvelopeError):
        decode_batch(bytes(bad), 0.0)


def test_an_engine_is_synced_once_it_holds_a_neighbours_whole_database():
    """Issue 20 (fuzzer seed 281): a node that has just started knows no other node's
    subscriptions; it says when it holds a neighbour's whole database (``synced``), and the
    cluster takes no client before (membership.routing_ready)."""
    net = Net(["a", "b", "c"], [("a", "b"), ("b", "c")])
    net.subscribe("c", "s/#")
    assert all(e.synced for e in net.engines.values())
    late = MeshEngine("d", 1, ["d:1883"], MeshSettings())
    late.start(net.t)
    net.engines["d"] = late
    net.delivered["d"] = []
    net.seq["d"] = 0
    assert not late.synced  # started, no link: it knows nobody
    net.links.add(frozenset(("d", "a")))
    late.link_up("a", net.t)
    net.engines["a"].link_up("d", net.t)
    assert not late.synced  # the link is up, the database not in yet
    net.settle()
    assert late.synced and "c" in late.nodes_wanting("s/x")
    # what it publishes now reaches the subscriber it had not heard of before the exchange
    m = net.publish("d", "s/x", qos=1)
    assert m in net.delivered["c"]


def test_an_envelope_carries_a_messages_mqtt5_properties_and_the_simulators_reader_skips_them():
    """Envelope version 4: flag 32 and the properties, as encoded, before the payload; a
    3.1.1 message has none and costs nothing more. The simulator's reader (sim/observe.py,
    written apart from the decoder) finds the same envelopes."""
    from mqttmesh.sim.observe import read_envelope_heads

    props = b"\x03\x00\x04json&\x00\x01k\x00\x01v"
    with5 = Message("t", b"payload", 1, False, "a", 7, "pub", 1.0, props)
    plain = Message("t", b"payload", 1, False, "a", 8, "pub", 1.0)
    raw = encode_batch([Envelope(with5, ["b", "c"], 4, 0, None, [5, 0]), Envelope(plain, ["b"], 4, 0, None, 7)], 0.0)
    a, b = decode_batch(raw, 0.0)
    assert (a.msg.props, a.msg.payload, a.prev) == (props, b"payload", [5, 0])
    assert (b.msg.props, b.msg.payload, b.prev) == (None, b"payload", 7)
    assert [h[:2] for h in read_envelope_heads(raw)] == [("a", 7), ("a", 8)]
    cut = raw[: raw.index(props) + 3]  # properties that overrun the batch
    with pytest.raises(EnvelopeError):
        decode_batch(cut, 0.0)


def test_an_envelope_says_which_shared_groups_each_destination_serves():
    """Envelope version 6: flag 128 and a string of the table naming, for the destinations
    that serve shared groups, which; relays split it with the destinations. The simulator's
    reader finds the same envelopes."""
    from mqttmesh.mesh.routing.envelope import for_dests, parse_shares, shares_text
    from mqttmesh.sim.observe import read_envelope_heads

    msg = Message("t/x", b"payload", 1, False, "a", 7, "pub", 1.0)
    smap = {"c": ("$share/g/t/#", "$share/h/t/+"), "d": ("$share/g/t/#",)}
    raw = encode_batch([Envelope(msg, ["b", "c", "d"], 4, 0, None, [5, 0, 0], smap)], 0.0)
    [env] = decode_batch(raw, 0.0)
    assert env.shares == smap and env.prev == [5, 0, 0]
    assert for_dests(env.msg, ["c"], 3, 0, env.predecessors(), env.shares).shares == {"c": smap["c"]}
    assert for_dests(env.msg, ["b"], 3, 0, env.predecessors(), env.shares).shares is None
    assert [h[:2] for h in read_envelope_heads(raw)] == [("a", 7)]
    assert parse_shares(shares_text(smap)) == smap
    for bad in ("c\x002\x00$share/g/t", "c\x00x", "c\x001\x00t/#"):
        with pytest.raises(EnvelopeError):
            parse_shares(bad)


def _shares_seen(net: Net) -> dict[str, list[tuple[int, tuple[str, ...] | None]]]:
    """Each node's deliveries from now on, with the shared groups they go to there."""
    seen: dict[str, list[tuple[int, tuple[str, ...] | None]]] = {n: [] for n in net.engines}
    take = net._take

    def taking(name, inbound):
        for msg in inbound.deliveries:
            seen[name].append((msg.seq, msg.shares))
        take(name, inbound)

    net._take = taking
    return seen


@pytest.mark.parametrize("strategy", ["round_robin", "local", "hash_topic", "sticky"])
def test_each_message_goes_to_one_node_of_each_shared_group(strategy):
    """A group with members on b and c ("$share/g/t/#" in their interest): each message a
    publishes reaches one of them marked for the group, as the strategy picks; c's plain
    subscriber gets every one, marked or not. local: the nearest node with a member (b, on
    the way), or the publisher's own (b publishing: nothing crosses a link for the group)."""
    net = Net(["a", "b", "c"], [("a", "b"), ("b", "c")], settings=MeshSettings(shared_strategy=strategy))
    seen = _shares_seen(net)
    for n in ("b", "c"):
        net.subscribe(n, "$share/g/t/#")
    net.subscribe("c", "t/#")
    for i in range(8):
        net.publish("a", f"t/{i % 2}", qos=1)
    marked = {n: [seq for seq, shares in seen[n] if shares and "$share/g/t/#" in shares] for n in ("b", "c")}
    assert sorted(marked["b"] + marked["c"]) == list(range(1, 9))  # once each
    assert sorted(seq for seq, _ in seen["c"]) == list(range(1, 9))  # (its plain subscriber)
    if strategy == "round_robin":
        assert len(marked["b"]) == len(marked["c"]) == 4
    elif strategy == "local":
        assert marked["b"] == list(range(1, 9))
    elif strategy == "sticky":
        assert not marked["b"] or not marked["c"]
    else:  # hash_topic: each topic to one node
        assert {seq % 2 for seq in marked["b"]} in ({0}, {1}, set(), {0, 1})
        assert not ({seq % 2 for seq in marked["b"]} & {seq % 2 for seq in marked["c"]})
    b = net.engines["b"]
    msg = Message("t/x", b"x", 1, False, "b", 100, "c", net.t)
    b.route_local(msg, net.t)
    if strategy == "local":
        assert msg.shares == ("$share/g/t/#",)  # served at b, where it entered
    net.cut("a", "b")  # (a has no member: the group is out of its reach now)
    gone = Message("t/x", b"x", 1, False, "a", 101, "c", net.t)
    net.engines["a"].route_local(gone, net.t)
    assert net.engines["a"].counters["shared_unreachable"] == 1


def test_a_message_for_a_group_only_goes_to_another_node_with_a_member():
    """route_to_group (a member left holding the message, with no other member on its node):
    one other node with a member, marked for that group only (first a mark naming the message
    it re-sends: shared.resend_mark), and no destination for the plain subscribers."""
    net = Net(["a", "b", "c"], [("a", "b"), ("b", "c")])
    seen = _shares_seen(net)
    for n in ("b", "c"):
        net.subscribe(n, "$share/g/t/#")
    net.subscribe("a", "t/#")
    msg = Message("t/x", b"x", 1, False, "b", 1, "c", net.t)
    assert net.engines["b"].route_to_group(msg, "$share/g/t/#", net.t)
    net.settle()
    assert seen["c"] == [(1, ("$share/b 1", "$share/g/t/#"))] and seen["a"] == []
    net.engines["c"].local_filter_removed("$share/g/t/#")
    net.settle()
    assert not net.engines["b"].route_to_group(
        Message("t/x", b"x", 1, False, "b", 2, "c", net.t), "$share/g/t/#", net.t
    )


def test_a_node_chosen_for_a_group_that_goes_out_of_reach_is_chosen_again():
    """The node a QoS 1 message's group was served on (b) dies before acknowledging it: after
    ``shared_reroute`` seconds out of reach, the origin sends it again, under a new id of its
    own, to the other node with a member (c), for the group only; custody no longer waits for
    b, which was a destination for the group alone."""
    settings = MeshSettings(shared_strategy="sticky", shared_reroute=3.0)
    net = Net(["a", "b", "c"], [("a", "b"), ("a", "c"), ("b", "c")], settings=settings)
    seen = _shares_seen(net)
    for n in ("b", "c"):
        net.subscribe(n, "$share/g/t/#")
    a = net.engines["a"]
    seqs = iter(range(100, 200))
    a.new_seq = lambda: next(seqs)
    first = Message("t/x", b"x", 1, False, "a", 1, "p", net.t)
    a.route_local(first, net.t)
    chosen = next(n for n in ("b", "c") if n in a.custody[1].shares)
    other = "c" if chosen == "b" else "b"
    for n in ("a", other):
        net.cut(n, chosen)  # (it dies before the message reaches it)
    net.settle()
    assert seen[chosen] == [] and 1 in a.custody
    for step in range(1, 15):
        net.t = step * 0.5
        net._pump("a", a.tick(net.t))
        net.settle()
    assert seen[other] == [(100, ("$share/a 1", "$share/g/t/#"))]  # (a re-send of a:1)
    assert a.counters["shared_rerouted"] == 1 and 1 not in a.custody


def test_a_node_acknowledges_a_groups_message_once_its_member_has_and_not_before():
    """b's member took a's QoS 1 message through the group (``hold``): a keeps it in custody,
    a retransmission finds it held and is not acknowledged, the member's PUBACK (``settle``)
    releases it. Had b died meanwhile, a would choose another node (the test above)."""
    net = Net(["a", "b"], [("a", "b")], settings=MeshSettings(retransmit_after=1.0))
    net.subscribe("b", "$share/g/t/#")
    a, b = net.engines["a"], net.engines["b"]
    took: list[Message] = []
    take = net._take

    def member_takes(name, inbound):
        for msg in inbound.deliveries:
            if name == "b" and msg.shares:
                b.hold(msg, net.t)  # (the Broker's group delivery, before the node's ack)
                took.append(msg)
        take(name, inbound)

    net._take = member_takes
    net.publish("a", "t/1", qos=1)
    assert [m.seq for m in took] == [1] and 1 in a.custody and b.counters["shared_held"] == 1
    for step in range(1, 8):  # retransmissions, each a duplicate at b: still held
        net.t = step * 1.0
        net._pump("a", a.tick(net.t))
        net.settle()
    assert a.counters["custody_retransmits"] >= 2 and b.counters["duplicates"] >= 2
    assert 1 in a.custody and len(took) == 1
    b.settle(took[0])  # the member's PUBACK
    net.settle()
    assert 1 not in a.custody and not b._holds
    b.settle(took[0])  # (once more: nothing waits, nothing said)
    assert not b._acks_out


def test_a_hold_nothing_settles_ends_when_the_origins_custody_would():
    net = Net(["a", "b"], [("a", "b")], settings=MeshSettings(custody_timeout=50.0, retransmit_after=1.0))
    net.subscribe("b", "$share/g/t/#")
    b = net.engines["b"]
    take = net._take

    def member_takes(name, inbound):
        for msg in inbound.deliveries:
            if name == "b":
                b.hold(msg, net.t)
        take(name, inbound)

    net._take = member_takes
    net.publish("a", "t/1", qos=1)
    assert b._holds
    net.t = 51.0
    net._pump("b", b.tick(net.t))
    net.settle()
    assert not b._holds and b.counters["shared_hold_expired"] == 1
    assert 1 not in net.engines["a"].custody


def test_a_node_chosen_for_a_group_whose_last_member_just_left_sends_it_on():
    """b's last member left while a's message was on its way to b for the group: b (its
    plain subscriber served) sends it again, under its own id, to c's member for that group
    only, and does not serve the group for it itself (a group it has but advertises as none,
    its members all away and granted QoS 0, would only drop it: finding 34); such a re-send
    that finds no member either goes on, naming the same root, to a node that has one (b
    again, whose member is back), not dropped."""
    net = Net(["a", "b", "c"], [("a", "b"), ("b", "c")])  # (local: b, the nearest)
    seen = _shares_seen(net)
    for n in ("b", "c"):
        net.subscribe(n, "$share/g/t/#")
    a, b = net.engines["a"], net.engines["b"]
    seqs = iter(range(500, 600))
    b.new_seq = lambda: next(seqs)
    b.local_filter_removed("$share/g/t/#")  # (not yet heard of at a)
    a.route_local(Message("t/x", b"x", 1, False, "a", 1, "p", net.t), net.t)
    net.settle()
    assert seen["b"] == [(1, ())]  # (to b's plain subscribers, if any: not to its groups)
    assert seen["c"] == [(500, ("$share/a 1", "$share/g/t/#"))]
    assert b.counters["shared_rerouted"] == 1 and not b.custody and not a.custody
    c = net.engines["c"]
    c.new_seq = lambda: next(seqs)
    c.local_filter_removed("$share/g/t/#")
    b.local_filter_added("$share/g/t/#")  # (b's view: c still has one; c has none now)
    seen["b"].clear()
    b.route_to_group(Message("t/y", b"y", 1, False, "b", 501, "p", net.t), "$share/g/t/#", net.t)
    net.settle()
    assert c.counters["shared_rerouted"] == 1  # (c's view: b has a member now)
    assert [shares for _, shares in seen["b"]] == [("$share/b 501", "$share/g/t/#")]


def test_a_node_whose_members_all_queue_is_chosen_only_when_no_member_is_connected():
    """b's members are offline persistent sessions ("$share/g/t/#" + QUEUED), c has a
    connected one: a's messages go to c, though b is nearer; once c has none, to b."""
    from mqttmesh.shared import QUEUED

    net = Net(["a", "b", "c"], [("a", "b"), ("b", "c")])
    seen = _shares_seen(net)
    net.subscribe("b", "$share/g/t/#" + QUEUED)
    net.subscribe("c", "$share/g/t/#")
    a = net.engines["a"]
    assert a.shared_online_elsewhere("$share/g/t/#") and not a.shared_online_elsewhere("$share/h/t/#")
    net.publish("a", "t/1", qos=1)
    assert [s for s, g in seen["c"] if g] == [1] and not [s for s, g in seen["b"] if g]
    net.engines["c"].local_filter_removed("$share/g/t/#")
    net.settle()
    assert not net.engines["b"].shared_online_elsewhere("$share/g/t/#")
    net.publish("a", "t/1", qos=1)
    assert [s for s, g in seen["b"] if g] == [2]
    net.engines["b"].local_filter_removed("$share/g/t/#" + QUEUED)
    net.engines["b"].local_filter_added("$share/g/t/#")  # (a member connected again)
    net.settle()
    assert a._share_nodes == {"$share/g/t/#": {"b": True}}


def test_round_robin_weighs_each_node_by_its_connected_members():
    """b advertises four connected members (WEIGHT 4), c one: round robin from a gives b four
    messages of every five; an unreadable weight is not served."""
    from mqttmesh.shared import WEIGHT

    net = Net(["a", "b", "c"], [("a", "b"), ("a", "c")], settings=MeshSettings(shared_strategy="round_robin"))
    seen = _shares_seen(net)
    net.subscribe("b", "$share/g/t/#" + WEIGHT + "4")
    net.subscribe("c", "$share/g/t/#")
    for _ in range(10):
        net.publish("a", "t/1", qos=1)
    assert (len([s for s, g in seen["b"] if g]), len([s for s, g in seen["c"] if g])) == (8, 2)
    net.subscribe("c", "$share/h/t/#" + WEIGHT + "x")
    assert "$share/h/t/#" not in net.engines["a"]._share_nodes


def test_a_held_message_sent_on_to_another_nodes_member_is_acknowledged_once_that_one_is():
    """b's member took a's message and left (b has no other member): b sends it on as its own
    message 100 to c's member; a's custody keeps the original until c acknowledged 100, so
    b dying in between would not lose it."""
    net = Net(["a", "b", "c"], [("a", "b"), ("b", "c")])
    for n in ("b", "c"):
        net.subscribe(n, "$share/g/t/#")
    a, b = net.engines["a"], net.engines["b"]
    took: list[Message] = []
    take = net._take
    hold_c = [True]

    def members_take(name, inbound):
        for msg in inbound.deliveries:
            if msg.shares and (name == "b" or hold_c[0]):
                net.engines[name].hold(msg, net.t)
                took.append(msg)
        take(name, inbound)

    net._take = members_take
    net.publish("a", "t/1", qos=1)  # (local: b, the nearest)
    [original] = took
    assert 1 in a.custody
    copy = Message("t/1", b"x", 1, False, "b", 100, "p", net.t)
    assert b.route_to_group(copy, "$share/g/t/#", net.t)
    b.hold_until_acked(100, original)
    net.settle()
    assert 1 in a.custody and 100 in b.custody  # (c's member holds the copy)
    net.engines["c"].settle(took[-1])  # c's member acknowledges it
    net.settle()
    assert 100 not in b.custody and 1 not in a.custody and not b._holds and not b._after


@pytest.mark.parametrize("strategy", ["local", "round_robin", "sticky", "hash_topic"])
def test_a_qos2_message_routed_again_by_another_node_is_served_where_its_origin_chose(strategy):
    """A persistent publisher's QoS 2 message may be routed by the node that took it (a) and
    again, under a's id, by the node its client moved to (d): both choose the same node for
    the group (b, nearest a; d has a member itself), so the duplicate filter there keeps it
    to one member."""
    net = Net(
        ["a", "b", "c", "d"], [("a", "b"), ("b", "c"), ("c", "d")], settings=MeshSettings(shared_strategy=strategy)
    )
    for n in ("b", "d"):
        net.subscribe(n, "$share/g/t/#")
    a, d = net.engines["a"], net.engines["d"]
    for seq in range(1, 9):
        first = Message("t/1", b"x", 2, False, "a", seq, "p", net.t)
        again = Message("t/1", b"x", 2, False, "a", seq, "p", net.t)
        a.route_local(first, net.t)
        d.route_local(again, net.t)
        chosen_a = set(a.custody[seq].shares or {})
        held = d.custody.get(("a", seq))  # (none when d serves it itself: nothing to send)
        chosen_d = set(held.shares or {}) if held is not None else set()
        if again.shares:  # (d's own groups serve it)
            chosen_d.add("d")
        assert chosen_a == chosen_d and len(chosen_a) == 1
        if strategy in ("local", "sticky"):
            assert chosen_a == {"b"}


def _group_cut_off_from_its_origin():
    """c, the only node with a member of the group, cut off from a; a has published a QoS 1
    message to it (a's new ids from 100): (net, what each node's broker saw, a)."""
    net = Net(["a", "b", "c"], [("a", "b"), ("b", "c")])
    seen = _shares_seen(net)
    net.subscribe("c", "$share/g/t/#")
    a = net.engines["a"]
    seqs = iter(range(100, 200))
    a.new_seq = lambda: next(seqs)
    net.cut("b", "c")
    net.settle()
    a.route_local(Message("t/1", b"x", 1, False, "a", 1, "p", net.t), net.t)
    return net, seen, a


def test_a_groups_message_whose_nodes_are_all_out_of_reach_is_kept_until_one_is():
    """c, the only node with a member, is cut off from a: a's QoS 1 message for the group is
    kept (as a new message of a, for that group alone) and sent at the first tick after the
    heal; a QoS 0 one is not kept."""
    net, seen, a = _group_cut_off_from_its_origin()
    a.route_local(Message("t/1", b"y", 0, False, "a", 2, "p", net.t), net.t)
    net.settle()
    assert seen["c"] == [] and len(a._parked) == 1 and a.counters["shared_parked"] == 1
    assert a.counters["shared_unreachable"] == 1  # (the QoS 0 one)
    net.t = 1.0
    net._pump("a", a.tick(net.t))
    net.settle()
    assert len(a._parked) == 1  # (still out of reach)
    net.connect("b", "c")
    net.settle()
    net.t = 2.0
    net._pump("a", a.tick(net.t))
    net.settle()
    assert seen["c"] == [(100, ("$share/a 1", "$share/g/t/#"))] and not a._parked and not a.custody


def test_custody_and_kept_group_messages_are_stored_with_their_groups_and_restored_so():
    """A restart (kill -9) of the node holding a group's message in custody, or keeping one
    for a group out of reach, restores which node serves which group: the retransmission
    after the restart still serves the group."""
    from mqttmesh.mesh.routing.shares import share_entries, split_entries

    assert split_entries(["b", *share_entries({"b": ("$share/g/t/#",), "": ("$share/h/t",)})]) == (
        ["b"],
        {"b": ("$share/g/t/#",), "": ("$share/h/t",)},
    )
    j = Journal()
    net = Net(["a", "b", "c"], [("a", "b"), ("b", "c")], custody={"a": j})
    seen = _shares_seen(net)
    net.subscribe("c", "$share/g/t/#")
    a = net.engines["a"]
    a.new_seq = lambda: 50
    net.cut("b", "c")
    net.settle()
    a.route_local(Message("t/1", b"x", 1, False, "a", 1, "p", net.t), net.t)
    [(kind, seq, dests)] = [op for op in j.ops if op[0] == "put"]
    assert seq == 50 and split_entries(dests)[1] == {"": ("$share/a 1", "$share/g/t/#")}
    net.connect("b", "c")
    net.settle()
    fresh = Net(["a", "b", "c"], [("a", "b"), ("b", "c")])  # (a restarted: what its store had)
    seen = _shares_seen(fresh)
    fresh.subscribe("c", "$share/g/t/#")
    fresh.engines["a"].restore_custody(Message("t/1", b"x", 1, False, "a", 50, "p", 0.0), dests, fresh.t)
    fresh.t = 1.0
    fresh._pump("a", fresh.engines["a"].tick(fresh.t))
    fresh.settle()
    assert seen["c"] == [(50, ("$share/a 1", "$share/g/t/#"))]  # (the root survives the restart)
    again = Net(["a", "b", "c"], [("a", "b"), ("b", "c")])
    seen = _shares_seen(again)
    again.subscribe("c", "$share/g/t/#")
    stored = ["c", *share_entries({"c": ("$share/g/t/#",)})]  # (in custody for c when it stopped)
    again.engines["a"].restore_custody(Message("t/1", b"y", 1, False, "a", 9, "p", 0.0), stored, again.t)
    again.t = 1.0
    again._pump("a", again.engines["a"].tick(again.t))
    again.settle()
    assert seen["c"] == [(9, ("$share/g/t/#",))]


def test_a_node_that_just_started_keeps_a_groups_message_until_it_knows_the_groups():
    """A node restarted (kill -9) gets a retransmission for a group its members were in, and
    has none now: it sends it on, but knows no other node's groups yet (not synced): it keeps
    it, and sends it once it has heard of c's member."""
    net = Net(["a", "c"], [])
    seen = _shares_seen(net)
    a = net.engines["a"]
    assert not a.synced
    msg = Message("t/1", b"x", 1, False, "a", 100, "p", net.t)
    assert a.route_to_group(msg, "$share/g/t/#", net.t) and len(a._parked) == 1
    net.subscribe("c", "$share/g/t/#")
    net.connect("a", "c")
    net.settle()
    net.t = 1.0
    net._pump("a", a.tick(net.t))
    net.settle()
    assert seen["c"] == [(100, ("$share/a 100", "$share/g/t/#"))] and not a._parked


def test_a_restarted_node_that_knows_no_group_yet_sends_a_groups_message_on_rather_than_dropping_it():
    """a chose b's member for its QoS 2 message and b was killed as it arrived: a's custody
    sends it again to the restarted b before b has heard of any group (its own member gone,
    no other node's groups known: nothing shared anywhere, as far as it knows). b keeps it for
    the group, a new message of its own, instead of handing it to its broker, where no group
    would take it while its acknowledgement ended a's wait (the fault harness, 7 nodes,
    seed 7: one acknowledged QoS 2 message lost so)."""
    net = Net(["a", "b", "c"], [("a", "b"), ("b", "c")])
    net.subscribe("b", "$share/g/t/#")
    net.subscribe("c", "$share/g/t/#")
    a = net.engines["a"]
    a.route_local(Message("t/1", b"x", 2, False, "a", 1, "p", net.t), net.t)
    [(peer, kind, payload, _)] = [s for s in a.flush(net.t) if s[1] == "fwd"]
    assert peer == "b" and a.custody[1].shares == {"b": ("$share/g/t/#",)}
    fresh = MeshEngine("b", 2, ["b:1883"], MeshSettings())  # (b after kill -9: knows nothing yet)
    fresh.start(net.t)
    seqs = iter(range(100, 200))
    fresh.new_seq = lambda: next(seqs)
    assert not fresh.synced and not fresh._share_nodes
    inbound = fresh.receive("a", "fwd", payload, net.t)
    [msg] = inbound.deliveries
    assert msg.shares == ()  # (kept for the group: its broker does not serve it as well)
    assert len(fresh._parked) == 1 and fresh.counters["shared_parked"] == 1
    [(kept, share, _)] = fresh._parked
    assert share == "$share/g/t/#" and kept.shares == ("$share/a 1",) and kept.origin == "b"


def test_a_groups_message_released_after_waiting_for_its_predecessor_goes_on_if_the_member_left():
    """b's member left while a's message 2 waited at b for message 1 (lost on the way): when
    it is released (``release_held``, the predecessor given up) it goes on to c's member, as
    one delivered at once would (``_served_elsewhere``), not to b's broker, where no group
    takes it."""
    net = Net(["a", "b", "c"], [("a", "b"), ("b", "c")])
    net.subscribe("b", "$share/g/t/#")
    a, b = net.engines["a"], net.engines["b"]
    seqs = iter(range(100, 200))
    b.new_seq = lambda: next(seqs)
    seen = _shares_seen(net)
    a.route_local(Message("t/1", b"x", 1, False, "a", 1, "p", net.t), net.t)
    assert [s[1] for s in a.flush(net.t)] == ["fwd"]  # (lost on the way)
    a.route_local(Message("t/1", b"x", 1, False, "a", 2, "p", net.t), net.t)
    [(_, _, payload, _)] = [s for s in a.flush(net.t) if s[1] == "fwd"]
    assert b.receive("a", "fwd", payload, net.t).deliveries == [] and b._held  # (2 waits at b for 1)
    b.flush(net.t)  # (its question for 1 lost too)
    b.local_filter_removed("$share/g/t/#")  # (b's last member left)
    net.subscribe("c", "$share/g/t/#")
    net.t = b.settings.reorder_wait + 0.1
    released = b.release_held(net.t)
    assert [m.seq for m in released] == [2] and released[0].shares == ()  # (not to b's groups)
    net.settle()
    assert b.counters["shared_rerouted"] == 1 and seen["c"] == [(100, ("$share/a 2", "$share/g/t/#"))]


def test_a_node_that_sends_a_groups_message_on_holds_its_acknowledgement_until_that_one_is_settled():
    """Issue 24 (finding 35): b, chosen for a's QoS 1 message for a group whose last member
    here had left (or were all away at QoS 0: finding 34), sends it on as its own message 500
    to c's member (``_served_elsewhere``). a's custody keeps the original until c's member
    settled 500: had b acknowledged it at once, b dying before c's member acknowledged (its
    copy in memory, or not yet committed) would lose a message its publisher got a PUBACK for.
    b dead, a chooses another node's member again (a counted re-send)."""
    net = Net(["a", "b", "c"], [("a", "b"), ("b", "c")], settings=MeshSettings(retransmit_after=1.0))
    for n in ("b", "c"):
        net.subscribe(n, "$share/g/t/#")
    a, b, c = net.engines["a"], net.engines["b"], net.engines["c"]
    seqs = iter(range(500, 600))
    b.new_seq = lambda: next(seqs)
    b.local_filter_removed("$share/g/t/#")  # (not yet heard of at a: a chooses b, the nearest)
    took: list[Message] = []
    take = net._take

    def member_takes(name, inbound):
        for msg in inbound.deliveries:
            if name == "c" and msg.shares:
                c.hold(msg, net.t)  # (c's member took it and has not acknowledged it yet)
                took.append(msg)
        take(name, inbound)

    net._take = member_takes
    a.route_local(Message("t/x", b"x", 1, False, "a", 1, "p", net.t), net.t)
    net.settle()
    assert [(m.origin, m.seq) for m in took] == [("b", 500)] and b.counters["shared_rerouted"] == 1
    assert 500 in b.custody and 1 in a.custody  # (not acknowledged to a: c's member holds it)
    assert b._holds and b._after == {500: b._holds[("a", 1)].msg}
    c.settle(took[0])  # c's member acknowledges the copy
    net.settle()
    assert not c._holds and 500 not in b.custody and not b._holds and not b._after
    assert 1 not in a.custody  # (now a lets go)


def test_a_node_that_sends_a_groups_message_on_and_dies_leaves_it_in_its_origins_custody():
    """As above, b dies (its copy lost with it) before c's member settles: a still holds the
    original and chooses c itself once b is out of reach, a counted re-send."""
    settings = MeshSettings(retransmit_after=1.0, shared_reroute=2.0)
    net = Net(["a", "b", "c"], [("a", "b"), ("b", "c"), ("a", "c")], settings=settings)
    net.cut("a", "c")  # (b is a's nearest node with a member)
    net.settle()
    for n in ("b", "c"):
        net.subscribe(n, "$share/g/t/#")
    a, b = net.engines["a"], net.engines["b"]
    seqs, own = iter(range(500, 600)), iter(range(900, 1000))
    b.new_seq, a.new_seq = (lambda: next(seqs)), (lambda: next(own))
    b.local_filter_removed("$share/g/t/#")
    held = []  # b's sends, never delivered: b dies before they leave it
    pump = net._pump

    def b_dies_after_sending(name, sends):
        if name == "b" and held is not None:
            held.extend(sends)
            return
        pump(name, sends)

    net._pump = b_dies_after_sending
    a.route_local(Message("t/x", b"x", 1, False, "a", 1, "p", net.t), net.t)
    net.settle()
    assert b.counters["shared_rerouted"] == 1 and 500 in b.custody
    assert not [s for s in held if s[1] == "e2e"]  # (no acknowledgement to a among b's sends)
    assert 1 in a.custody
    net._pump = pump
    net.cut("a", "b")
    net.cut("b", "c")
    net.connect("a", "c")
    net.settle()
    net.t = 5.0
    net._pump("a", a.tick(net.t))
    net.settle()
    assert a.counters["shared_rerouted"] == 1 and 1 not in a.custody
    assert [d[:2] for d in net.delivered["c"]] == [("a", 900)]  # (b's copy 500 died with b)


def test_an_origin_whose_own_members_are_the_only_ones_left_serves_a_lost_share_itself():
    """Simulator finding 36: a's QoS 1 message was chosen for b's member (round robin: the
    first for a's own), and b died before it arrived. After ``shared_reroute`` out of reach,
    a's custody sends it again, a counted re-send under a new id, and the only member in
    reach is a's own: the copy is a's broker's to serve (``served_here``, for the group alone,
    naming its root), not kept for nodes that are gone (``_park``: it waited there for b until
    ``custody_timeout``, delivered to nobody)."""
    settings = MeshSettings(shared_strategy="round_robin", retransmit_after=1.0, shared_reroute=2.0)
    net = Net(["a", "b"], [("a", "b")], settings=settings)
    for n in ("a", "b"):
        net.subscribe(n, "$share/g/t/#")
    a = net.engines["a"]
    own = iter(range(900, 1000))
    a.new_seq = lambda: next(own)
    first, second = (Message("t/x", b"x", 1, False, "a", seq, "p", net.t) for seq in (1, 2))
    a.route_local(first, net.t)
    a.route_local(second, net.t)
    assert first.shares == ("$share/g/t/#",) and second.shares == ()  # (a serves the first)
    assert a.custody[2].shares == {"b": ("$share/g/t/#",)}
    net.cut("a", "b")  # (b dies before the second reaches it)
    net.settle()
    for step in range(1, 7):
        net.t = step * 0.5
        net._pump("a", a.tick(net.t))
        net.settle()
    assert not a._parked and a.counters["shared_parked"] == 0
    here = a.served_here()
    assert [(m.origin, m.seq, m.qos, m.shares) for m in here] == [("a", 900, 1, ("$share/a 2", "$share/g/t/#"))]
    assert a.counters["shared_rerouted"] == 1 and 2 not in a.custody
    assert a.served_here() == []  # (handed over once)
    assert net.delivered["b"] == []


def test_a_re_route_for_a_member_that_left_goes_to_another_node_only():
    """What a member here held when it left, with no other member here (``route_to_group``
    without ``here``): to another node's member, never this node's own again, though ``local``
    would choose them first."""
    net = Net(["a", "b"], [("a", "b")])
    for n in ("a", "b"):
        net.subscribe(n, "$share/g/t/#")
    a = net.engines["a"]
    msg = Message("t/x", b"x", 1, False, "a", 7, "p", net.t)
    assert a.route_to_group(msg, "$share/g/t/#", net.t)
    net.settle()
    assert a.served_here() == [] and [d[:2] for d in net.delivered["b"]] == [("a", 7)]


def test_a_kept_groups_message_goes_to_a_member_that_joins_here_meanwhile():
    """A QoS 1 message for a group whose only node with members (c) is cut off is kept by its
    origin a (``_park``); a member joins on a before c is back: a's broker serves it
    (``served_here``, for the group alone), it leaves what is kept and custody, and c never
    gets it. Before, ``_unpark`` chose another node only, and the message waited for c, or
    for ``custody_timeout``, with a member connected on its origin."""
    net, seen, a = _group_cut_off_from_its_origin()
    net.settle()
    assert len(a._parked) == 1 and a.served_here() == []
    net.subscribe("a", "$share/g/t/#")  # (a member joins on a)
    net.t = 1.0
    net._pump("a", a.tick(net.t))
    net.settle()
    here = a.served_here()
    assert [(m.origin, m.seq, m.shares) for m in here] == [("a", 100, ("$share/a 1", "$share/g/t/#"))]
    assert not a._parked and not a.custody and a.counters["shared_unparked_here"] == 1
    net.connect("b", "c")
    net.settle()
    net.t = 2.0
    net._pump("a", a.tick(net.t))
    net.settle()
    assert seen["c"] == [] and a.served_here() == []
