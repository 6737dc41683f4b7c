"""Ordered delivery (mesh/routing/order.py): each origin's QoS 1/2 messages reach a node in the order
the origin routed them, whatever was lost or overtaken on the way [MQTT-4.6.0-5, MQTT-4.6.0-6].

The in-memory network of support/engine_net.py delivers in order; these tests drop or hold
chosen ``fwd`` messages to make a later message overtake an earlier one.
"""

from __future__ import annotations

import pytest

from mqttmesh.mesh.routing.engine import MeshEngine, MeshSettings
from mqttmesh.mesh.routing.envelope import Envelope, EnvelopeError, decode_batch, encode_batch
from mqttmesh.mesh.routing.wire import decode_acks
from mqttmesh.message import Message
from support.engine_net import Net


def _publish(net: Net, node: str, topic: str, qos: int = 1) -> tuple[str, int, str]:
    """Route a message without settling the network: its envelopes wait in ``net.queue``
    once the next ``_flush_all`` runs."""
    net.seq[node] += 1
    msg = Message(topic, b"x", qos, False, node, net.seq[node], "c", net.t)
    net.engines[node].route_local(msg, net.t)
    return (node, net.seq[node], topic)


def _flush_all(net: Net) -> None:
    for name, e in net.engines.items():
        net._pump(name, e.flush(net.t))


def _drop_fwd(net: Net, frm: str, to: str) -> int:
    """Lose every ``fwd`` queued from ``frm`` to ``to`` (a link that swallowed them)."""
    kept = [q for q in net.queue if not (q[0] == frm and q[1] == to and q[2] == "fwd")]
    dropped = len(net.queue) - len(kept)
    net.queue.clear()
    net.queue.extend(kept)
    return dropped


def test_a_message_that_overtook_its_lost_predecessor_waits_and_the_origin_sends_it_at_once():
    net = Net(["a", "b"], [("a", "b")])
    net.subscribe("b", "t/#")
    m1 = _publish(net, "a", "t/1")
    _flush_all(net)
    assert _drop_fwd(net, "a", "b") == 1  # m1 lost on the way
    m2 = _publish(net, "a", "t/1")
    m3 = _publish(net, "a", "t/1", qos=2)
    net.settle()
    # m2 and m3 waited for m1; b asked a for it (nack), a sent it again at once, not after
    # retransmit_after: the settle above ran at one instant
    assert net.delivered["b"] == [m1, m2, m3]
    b, a = net.engines["b"], net.engines["a"]
    assert b.counters["reorder_held"] == 2 and a.counters["reorder_resent"] == 1
    assert b.counters["reorder_timeouts"] == 0 and not b._held and not b._held_ids
    assert a.custody == {}  # every message acknowledged once delivered


def test_qos0_is_not_held_and_a_qos0_gap_holds_nothing():
    net = Net(["a", "b"], [("a", "b")])
    net.subscribe("b", "t/#")
    q0 = _publish(net, "a", "t/1", qos=0)
    _flush_all(net)
    _drop_fwd(net, "a", "b")
    m = _publish(net, "a", "t/1")
    net.settle()
    assert net.delivered["b"] == [m] and q0 not in net.delivered["b"]
    assert net.engines["b"].counters["reorder_held"] == 0


def test_the_origin_says_skip_for_a_predecessor_the_destination_delivered_before_it_restarted():
    net = Net(["a", "b"], [("a", "b")])
    net.subscribe("b", "t/#")
    net.publish("a", "t/1", qos=1)
    # b restarts: its delivery filter is empty, a's chain to b goes on from the message above
    net.cut("a", "b")
    b2 = MeshEngine("b", 2, ["b:1883"], MeshSettings())
    b2.start(net.t)
    net.engines["b"] = b2
    net.delivered["b"] = []
    net.connect("a", "b")
    net.settle()
    net.subscribe("b", "t/#")
    m = net.publish("a", "t/1", qos=1)
    assert net.delivered["b"] == [m]
    assert b2.counters["reorder_held"] == 1 and b2.counters["reorder_skipped"] == 1
    assert net.engines["a"].custody == {}


def test_a_held_message_goes_out_after_reorder_wait_when_its_origin_cannot_answer():
    settings = MeshSettings(reorder_wait=5.0, retransmit_after=2.0)
    b = MeshEngine("b", 1, ["b:1883"], settings)
    b.start(0.0)
    msg = Message("t/1", b"x", 1, False, "a", 8, "c", 0.0)
    batch = encode_batch([Envelope(msg, ["b"], 4, 0, None, 7)], 0.0)
    got = b.receive("a", "fwd", batch, 0.0)
    assert list(got.deliveries) == [] and b.counters["reorder_held"] == 1
    # the same message again (the origin's retransmission): still waiting, not acknowledged
    again = b.receive("a", "fwd", encode_batch([Envelope(msg, ["b"], 4, 1, None, 7)], 0.0), 0.5)
    assert list(again.deliveries) == [] and b._acks_out == {}
    assert b.release_held(4.9) == []
    released = b.release_held(5.0)
    assert [(m.origin, m.seq) for m in released] == [("a", 8)]
    assert b.counters["reorder_timeouts"] == 1 and not b._held
    # the predecessor, late: delivered (out of order, but never lost)
    late = b.receive("a", "fwd", encode_batch([Envelope(Message("t/1", b"x", 1, False, "a", 7), ["b"], 4)], 0.0), 6.0)
    assert [(m.origin, m.seq) for m in late.deliveries] == [("a", 7)]


def test_the_origin_is_asked_again_while_the_message_waits():
    settings = MeshSettings(reorder_wait=10.0, retransmit_after=2.0)
    net = Net(["a", "b"], [("a", "b")], settings)
    b = net.engines["b"]
    msg = Message("t/1", b"x", 1, False, "a", 8, "c", 0.0)
    b.receive("a", "fwd", encode_batch([Envelope(msg, ["b"], 4, 0, None, 7)], 0.0), 0.0)
    first = [s for s in b.flush(0.0) if s.kind == "nack"]
    assert [(g.to, g.frm, list(g.seqs)) for s in first for g in decode_acks(s.payload)] == [("a", "b", [7])]
    assert b.release_held(1.0) == [] and not [s for s in b.flush(1.0) if s.kind == "nack"]
    assert b.release_held(2.0) == [] and [s for s in b.flush(2.0) if s.kind == "nack"]


def test_a_chain_of_waiting_messages_asks_only_for_the_first_missing_one():
    net = Net(["a", "b"], [("a", "b")])
    b = net.engines["b"]
    m = {s: Message("t/1", b"x", 1, False, "a", s, "c", 0.0) for s in (5, 6, 7, 8)}
    b.receive("a", "fwd", encode_batch([Envelope(m[5], ["b"], 4)], 0.0), 0.0)  # (no predecessor)
    b.receive("a", "fwd", encode_batch([Envelope(m[8], ["b"], 4, 0, None, 7)], 0.0), 0.0)
    b.receive("a", "fwd", encode_batch([Envelope(m[7], ["b"], 4, 0, None, 6)], 0.0), 0.0)
    nacks = [g for s in b.flush(0.0) if s.kind == "nack" for g in decode_acks(s.payload)]
    # 8 waited for 7 and asked for it; 7 came and waits for 6, and asked for it
    assert sorted(seq for g in nacks for seq in g.seqs) == [6, 7]
    got = b.receive("a", "fwd", encode_batch([Envelope(m[6], ["b"], 4, 0, None, 5)], 0.0), 0.1)
    assert [x.seq for x in got.deliveries] == [6, 7, 8]
    b.release_held(30.0)
    assert not [s for s in b.flush(30.0) if s.kind == "nack"] and not b._held


def test_order_holds_through_a_relay_that_splits_the_destinations():
    #   a -- r -- b
    #        |
    #        c
    net = Net(["a", "r", "b", "c"], [("a", "r"), ("r", "b"), ("r", "c")])
    net.subscribe("b", "t/#")
    net.subscribe("c", "t/#")
    m1 = _publish(net, "a", "t/1")
    _flush_all(net)
    # deliver a -> r, then lose r's copy to b only
    frm, to, kind, payload = net.queue.popleft()
    assert (frm, to, kind) == ("a", "r", "fwd")
    net._take(to, net.engines[to].receive(frm, kind, payload, net.t))
    _flush_all(net)
    assert _drop_fwd(net, "r", "b") == 1
    m2 = _publish(net, "a", "t/1")
    net.settle()
    assert net.delivered["b"] == [m1, m2] and net.delivered["c"] == [m1, m2]
    assert net.engines["b"].counters["reorder_held"] == 1
    assert net.engines["a"].custody == {}


def test_ordered_envelopes_round_trip_and_a_predecessor_after_its_message_is_refused():
    m = Message("t", b"p", 1, False, "a", 2**40 + 9, "pub", 1.0)
    [env] = decode_batch(encode_batch([Envelope(m, ["b", "c"], 4, 0, None, [2**40 + 3, 0])], 0.0), 0.0)
    assert env.prev == [2**40 + 3, 0] and env.dests == ["b", "c"]
    assert env.predecessors() == {"b": 2**40 + 3, "c": 0}
    [one] = decode_batch(encode_batch([Envelope(m, ["b"], 4, 0, None, 2**40 + 3)], 0.0), 0.0)
    assert one.prev == 2**40 + 3 and one.predecessors() == {"b": 2**40 + 3}
    [plain] = decode_batch(encode_batch([Envelope(m, ["b"], 4)], 0.0), 0.0)
    assert (plain.prev, plain.predecessors()) == (0, None)
    # a predecessor 2**32 numbers back or more is as good as none
    [far] = decode_batch(encode_batch([Envelope(m, ["b"], 4, 0, None, 9)], 0.0), 0.0)
    assert far.prev == 0
    bad = bytearray(encode_batch([Envelope(Message("t", b"p", 1, False, "a", 6), ["b"], 4, 0, None, 5)], 0.0))
    back_at = len(bad) - 1 - 4  # (the predecessor's u32, before one byte of payload)
    assert bad[back_at : back_at + 4] == b"\0\0\0\1"
    bad[back_at + 3] = 9  # 9 back from 6
    with pytest.raises(EnvelopeError):
        decode_batch(bytes(bad), 0.0)


def test_the_waiting_messages_are_bounded_and_the_oldest_goes_out_first():
    b = MeshEngine("b", 1, ["b:1883"], MeshSettings(reorder_limit=3))
    b.start(0.0)
    out = []
    for seq in (11, 21, 31, 41):  # each waits for a different missing predecessor
        msg = Message("t/1", b"x", 1, False, "a", seq, "c", 0.0)
        out += b.receive("a", "fwd", encode_batch([Envelope(msg, ["b"], 4, 0, None, seq - 1)], 0.0), 0.0).deliveries
    assert [m.seq for m in out] == [11] and b.counters["reorder_overflow"] == 1
    assert len(b._held_ids) == 3


def test_seen_after_is_seen_for_a_message_whose_predecessor_was_delivered():
    from mqttmesh.mesh.routing.dedup import NEW, SEEN, WAIT, DeliveryFilter

    f = DeliveryFilter(window=4)
    assert f.seen_after("a", 2, 1, 1) == WAIT  # nothing of a's delivered: wait
    assert not f.seen("a", 1, 1)
    assert f.seen_after("a", 3, 2, 1) == WAIT and not f.has("a", 3)  # (remembered nothing)
    assert f.seen_after("a", 2, 1, 1) == NEW and f.has("a", 2)
    assert f.seen_after("a", 2, 1, 1) == SEEN
    assert f.seen_after("a", 3, 2, 2) == NEW
    for seq in (4, 5, 6, 7, 8, 9, 10, 11, 12):  # two generations forgotten: the floor rises
        f.seen("a", seq, 1)
    assert f.has("a", 3)  # at or below the floor: nobody can tell, taken as delivered
    assert f.seen_after("a", 20, 3, 1) == NEW  # its predecessor is below the floor
    assert f.seen_after("a", 2, 1, 2) == SEEN and f.seen_after("a", 2, 1, 1) == NEW  # seen's rule
