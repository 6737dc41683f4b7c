"""MQTT 5 Message Expiry in the pure parts: the message, a session's queue, the client's
frame, the envelope between nodes, the cluster's messages and snapshots, retained messages on
one node and at their owners. Times are explicit arguments; each node counts a message's
remaining life on its own clock, so what travels is the remaining time, never an instant.
Rule ids are MQTT 5.0's."""

from __future__ import annotations

import base64
import itertools

import pytest
from test_channel5_unit import answers, connect5, subscribe5

from mqttmesh import properties as P
from mqttmesh.auth import Auth
from mqttmesh.codec import Publish
from mqttmesh.mesh.cluster.cluster_values import Forwarded, Snapshot, SnapshotEntry
from mqttmesh.mesh.cluster.cluster_wire import Outbox, RetQuery, RetReply
from mqttmesh.mesh.cluster.replica import replica_of
from mqttmesh.mesh.cluster.replica_sessions import ReplicaSessions
from mqttmesh.mesh.cluster.snapshots import install, merge_snapshots, snapshot
from mqttmesh.mesh.routing.envelope import Envelope, decode_batch, encode_batch
from mqttmesh.message import Message
from mqttmesh.session import Limits, Session
from mqttmesh.store import NULL_JOURNAL
from mqttmesh.topics import RetainedTrie
from support import mqttraw
from support import mqttraw5 as r5
from support.frames import FakeChannel, Net, publish_fields, split_frames


def msg(topic: str = "t", seq: int = 1, qos: int = 1) -> Message:
    return Message(topic, b"p", qos, False, "n1", seq, "pub", 1.5)


# --------------------------------------------------------------------------- the message


def test_a_message_as_it_stands_at_a_later_time():
    m = msg().expiring(10.0, 100.0)
    assert (m.expires, m.ttl, m.expired) == (110.0, 10.0, False)
    later = m.at(104.0)
    assert later is not m and (later.expires, later.ttl, later.expired) == (110.0, 6.0, False)
    assert later.payload is m.payload and (later.origin, later.seq) == (m.origin, m.seq)
    assert m.at(110.0).expired and m.at(200.0).expired
    plain = msg()
    assert plain.at(1e9) is plain and not plain.expired  # no interval: it never expires


# --------------------------------------------------------------------------- a session's queue


def test_a_queued_message_that_expired_is_dropped_and_counted_never_sent():
    """[MQTT-3.3.2-5]: offline, then attached after one message's life ended; the window of
    one sends the next ones as the client acknowledges, each checked when its turn comes."""
    s = Session("c", False, Limits(max_inflight=1))
    s.deliver(msg("a", 1).expiring(5.0, 0.0), 1)
    s.deliver(msg("b", 2).expiring(50.0, 0.0), 1)
    s.deliver(msg("c", 3).expiring(8.0, 0.0), 1)
    s.deliver(msg("d", 4), 1)
    ch = FakeChannel()
    s.attach(ch, 6.0)
    assert [publish_fields(p)[0] for p in ch.take()] == ["b"]
    assert s.expired == 1
    s.on_puback(1, 9.0)  # c's life ended meanwhile (at 8): d goes next
    assert [publish_fields(p)[0] for p in ch.take()] == ["d"]
    assert s.expired == 2 and not s.queue


def test_a_message_in_flight_is_sent_again_after_its_expiry():
    """[MQTT-3.3.2-5] deletes only a copy whose onward delivery has not started: one in
    flight when the client left is re-sent (DUP) on its return, expired or not."""
    s = Session("c", False, Limits())
    ch = FakeChannel()
    s.attach(ch, 0.0)
    s.deliver(msg().expiring(5.0, 0.0), 1)
    assert len(ch.take()) == 1
    s.detach()
    again = FakeChannel()
    s.attach(again, 10.0)
    [p] = again.take()
    assert p.dup and s.expired == 0


# --------------------------------------------------------------------------- the client's frame


def test_an_mqtt5_subscriber_gets_what_is_left_of_the_interval():
    """[MQTT-3.3.2-6]: at once, the interval as published; after a wait in the queue, less
    the wait (whole seconds, rounded up); past it, nothing [MQTT-3.3.2-5]."""
    net = Net()
    sub, _ = connect5(net, "sub", clean=False, properties=r5.props((P.SESSION_EXPIRY, r5.u32(600))))
    subscribe5(sub, ("e/#", 1))
    pub, _ = connect5(net, "pub")
    expiry = r5.props((P.MESSAGE_EXPIRY, r5.u32(30)))
    pub.receive_data(r5.publish("e/now", b"x", 0, properties=expiry), 1.0)
    [now] = answers(sub)
    assert isinstance(now, Publish) and now.properties[P.MESSAGE_EXPIRY] == 30
    sub.close("gone", 2.0)
    pub.receive_data(r5.publish("e/later", b"y", 1, pid=1, properties=expiry), 2.0)
    short = r5.props((P.MESSAGE_EXPIRY, r5.u32(3)))
    pub.receive_data(r5.publish("e/never", b"z", 1, pid=2, properties=short), 2.0)
    back = net.channel(12.5)
    back.receive_data(r5.connect("sub", clean=False, properties=r5.props((P.SESSION_EXPIRY, r5.u32(600)))), 12.5)
    _, later = answers(back)
    assert later.topic == "e/later" and later.properties[P.MESSAGE_EXPIRY] == 20  # ceil(30 - 10.5)
    assert net.broker.sessions["sub"].expired == 1


def test_a_publish_that_waits_behind_held_frames_is_framed_when_it_leaves():
    """[MQTT-3.3.2-6]: a PUBLISH held behind an acknowledgement that waits for the store (or,
    for a replicated session, for its holders) carries what is left of the interval when it
    leaves, not when it was queued; one with nothing left does not leave [MQTT-3.3.2-5]: its
    packet id is freed and it is counted (the client never saw it)."""
    from mqttmesh.codec import PubAck
    from mqttmesh.store import Journal

    net = Net(journal=Journal())
    keep = r5.props((P.SESSION_EXPIRY, r5.u32(600)))
    sub, _ = connect5(net, "sub", clean=False, properties=keep)
    subscribe5(sub, ("e/#", 1))
    sub.receive_data(r5.publish("r/1", b"kept", 1, True, pid=9), 1.0)  # (its PUBACK waits for the store)
    pub, _ = connect5(net, "pub")
    for qos, (topic, seconds) in enumerate((("e/long", 10), ("e/short", 2), ("e/short1", 2))):
        expiry = r5.props((P.MESSAGE_EXPIRY, r5.u32(seconds)))
        pub.receive_data(r5.publish(topic, b"x", min(qos, 1), pid=qos + 1, properties=expiry), 1.0)
    assert answers(sub) == []  # (all behind the PUBACK)
    session = net.broker.sessions["sub"]
    assert len(session.inflight) == 2  # (the two QoS 1 ones have their ids already)
    net.committed(net.broker.journal.batch, 4.0)
    got = answers(sub)
    assert isinstance(got[0], PubAck)
    assert [(p.topic, p.properties[P.MESSAGE_EXPIRY]) for p in got[1:]] == [("e/long", 7)]
    assert session.expired == 2 and session.inflight == {}


# --------------------------------------------------------------------------- between nodes


def test_an_envelope_carries_the_remaining_time_counted_on_each_nodes_clock():
    """The sender's and the receiver's clocks have nothing in common: the batch says how
    much is left when it is made (milliseconds, rounded up), the receiver counts from its
    arrival on its own clock; an expired one arrives as expired (0), still to be
    acknowledged to its origin's custody."""
    live = msg("t/1", 1).expiring(2.5, 1000.0)
    dead = msg("t/2", 2).expiring(1.0, 1000.0)
    plain = msg("t/3", 3)
    batch = encode_batch([Envelope(m, ["b"], 4) for m in (live, dead, plain)], 1001.25)
    got = [e.msg for e in decode_batch(batch, 7.0)]
    assert got[0].expires == pytest.approx(7.0 + 1.25) and got[0].ttl == pytest.approx(1.25)
    assert got[1].expired and got[1].ttl == 0.0
    assert got[2].expires is None


def test_the_time_a_batch_spent_before_it_was_read_comes_off_the_remaining_life():
    """The batch says when it was made on the sender's wall clock: the time until the receiver
    read it (on the way, in its socket while it was paused or busy) is taken off, never added;
    a receiver whose wall clock is behind the sender's takes nothing off."""
    m = msg().expiring(2.5, 50.0)
    batch = encode_batch([Envelope(m, ["b"], 4)], 50.0, 1000.0)
    [late] = decode_batch(batch, 7.0, 1001.2)
    assert late.msg.ttl == pytest.approx(1.3) and late.msg.expires == pytest.approx(8.3)
    [behind] = decode_batch(batch, 7.0, 999.0)
    assert behind.msg.ttl == pytest.approx(2.5)
    [gone] = decode_batch(batch, 7.0, 1003.0)
    assert gone.msg.expired


def test_a_node_drops_a_message_that_arrives_expired_and_counts_it():
    """A message from another node whose life ended on the way (or while it waited for its
    predecessor, order.py) reaches no session here, a 3.1.1 one included [MQTT-3.3.2-5]."""
    net = Net()
    sub = net.connect("sub")
    sub.receive_data(mqttraw.subscribe(1, ("x/#", 1)), 0.0)
    sub.data_to_send()
    net.broker.deliver_remote(msg("x/1").expiring(1.0, 0.0).at(2.0))
    assert sub.data_to_send() == b"" and net.broker.stats.expired == 1
    net.broker.deliver_remote(msg("x/2", 2).expiring(1.0, 0.0).at(0.5))
    assert [publish_fields(p)[0] for p in split_frames(sub.data_to_send())] == ["x/2"]


def test_cluster_messages_carry_the_remaining_time():
    """A message a holder forwards carries its remaining life (ms), counted from its arrival."""
    m = msg().expiring(10.0, 50.0)
    fwd = Forwarded.of(m, 52.0)
    assert fwd.ttl_ms == 8000
    back = Forwarded.from_json(list(fwd), "sess.fwd msg").message(3.0)
    assert back.expires == pytest.approx(11.0)
    assert Forwarded.of(msg(), 52.0).ttl_ms is None
    assert Forwarded.of(m.at(70.0)).ttl_ms == 0  # (as handed on: its ttl then)


def test_the_time_a_cluster_message_was_on_the_way_comes_off_every_life_it_carries():
    """routing/wire.py ``age`` reaches ``decode``: a forwarded message, a settlement's inbound
    QoS 2 message, a snapshot's entries, inbound messages and Session Expiry countdown, and
    retained items arrive with that much less life (never below 0); messages without an
    expiry, and kinds that carry none, are unchanged."""
    from mqttmesh.mesh.cluster.cluster_values import RetainedItem, Settlement
    from mqttmesh.mesh.cluster.cluster_wire import (
        RegKick,
        RetSet,
        SessCopy,
        SessFwd,
        SessMerge,
        SessSettle,
        SessState,
        decode,
    )

    live = Forwarded.of(msg().expiring(10.0, 0.0), 0.0)
    plain = Forwarded.of(msg("t", 2), 0.0)
    entry = SnapshotEntry("n1", 1, "t", "eA==", 1, 1, 0, 0, "pub", 1.5, None, 10_000)
    snap = Snapshot(
        "c",
        {},
        0,
        [entry, entry._replace(seq=2, ttl_ms=None)],
        [],
        [4],
        None,
        1,
        1,
        inbound=[(4, live)],
        expires_ms=60_000,
    )
    item = RetainedItem("r", "eA==", 1, 1.5, "n1", 1, "pub", None, 10_000)

    def arrived(wire, ms):
        return decode(wire.KIND, wire.encode(), ms)

    assert arrived(SessFwd("c", live), 2500).msg.ttl_ms == 7500
    assert arrived(SessFwd("c", live), 20_000).msg.ttl_ms == 0
    assert arrived(SessFwd("c", plain), 2500).msg.ttl_ms is None
    settle = arrived(SessSettle("c", 1, [Settlement("n1", 1, "in", 4, live), Settlement("n1", 2, "done", 0)], 3), 500)
    assert [i.msg.ttl_ms if i.msg else None for i in settle.items] == [9500, None]
    for kind in (SessCopy, SessMerge):
        got = arrived(kind(snap), 1000).snap
        assert [e.ttl_ms for e in got.entries] == [9000, None]
        assert got.inbound[0][1].ttl_ms == 9000 and got.expires_ms == 59_000
    assert arrived(SessState("c", "k", snap), 1000).snap.expires_ms == 59_000
    assert arrived(SessState("c", "k", None), 1000).snap is None
    assert arrived(RetSet([item]), 4000).items[0].ttl_ms == 6000
    assert arrived(RetReply(1, [item]), 4000).items[0].ttl_ms == 6000
    kick = RegKick("c", "k", 3, "n2")
    assert arrived(kick, 4000) == kick
    assert arrived(SessFwd("c", live), 0).msg.ttl_ms == 10_000


def _replica(cid: str = "c"):
    factory = ReplicaSessions(Limits(), NULL_JOURNAL, None, lambda *a: None)
    return replica_of(factory.restored(cid))


def test_snapshots_taken_at_different_times_merge_onto_one_time():
    """A claim gathers copies that arrived at different times: the merged one counts every
    message's life from one time, so none comes out with more life than it had."""
    e1 = SnapshotEntry("n1", 1, "t", "eA==", 1, 1, 0, 0, "pub", 1.5, None, 10_000)
    e2 = SnapshotEntry("n1", 2, "t", "eA==", 1, 1, 0, 0, "pub", 1.5, None, 10_000)
    early = Snapshot("c", {}, 0, [e1], [], [], None, 1, 1, taken_at=100.0)
    late = Snapshot("c", {}, 0, [e2], [], [], None, 1, 1, taken_at=104.0)
    merged = merge_snapshots([early, late])
    assert merged.taken_at == 104.0
    assert {e.seq: e.ttl_ms for e in merged.entries} == {1: 6000, 2: 10_000}
    for ttl, want in ((9_000, 6_000), (3_000, 3_000)):  # (copies that disagree: the shortest life wins)
        other = Snapshot("c", {}, 0, [e1._replace(ttl_ms=ttl)], [], [], None, 1, 1, taken_at=104.0)
        assert merge_snapshots([early, other]).entries[0].ttl_ms == want
        assert merge_snapshots([other, early]).entries[0].ttl_ms == want
    session = _replica()
    install(session, merged, 105.0)
    assert sorted(e.msg.expires for e in session.queue) == [pytest.approx(110.0), pytest.approx(114.0)]
    again = snapshot(session, 112.0)
    assert sorted(e.ttl_ms for e in again.entries) == [0, 2000]


# --------------------------------------------------------------------------- retained messages


def test_an_expired_retained_message_is_not_sent_on_one_node():
    """[MQTT-3.3.2-5] for a retained message; the one sent carries what is left [MQTT-3.3.2-6]."""
    net = Net()
    pub, _ = connect5(net, "pub")
    for topic, seconds in (("r/short", 2), ("r/long", 60)):
        pub.receive_data(
            r5.publish(topic, b"v", 0, True, properties=r5.props((P.MESSAGE_EXPIRY, r5.u32(seconds)))), 0.0
        )
    sub, _ = connect5(net, "sub", now=5.0)
    sub.receive_data(r5.subscribe(1, ("r/#", 0)), 5.0)
    _, got = answers(sub)
    assert got.topic == "r/long" and got.retain and got.properties[P.MESSAGE_EXPIRY] == 55
    assert net.broker.stats.expired == 1


def test_retained_owners_answer_with_the_remaining_time_and_forget_expired_ones():
    """The owner of a retained topic answers a lookup with the remaining time, and forgets the
    message once it expired (with the tombstones: expire_tombstones)."""
    from mqttmesh.mesh.cluster.cluster_values import ClusterSettings
    from mqttmesh.mesh.cluster.membership import Membership
    from mqttmesh.mesh.cluster.retained import RetainedOwners

    class Net1:
        def reachable(self, node: str) -> bool:
            return True

    membership = Membership("a", 1, 2, 5.0)
    trie = RetainedTrie()
    owners = RetainedOwners(
        "a", membership, trie, NULL_JOURNAL, Auth(), Outbox(), Net1(), ClusterSettings(), itertools.count(1), 0.0
    )
    m = Message("r/1", b"v", 1, True, "a", 1, "pub", 1.0).expiring(10.0, 0.0)
    owners.retain(m)
    owners.on_query("b", RetQuery(7, "r/#"), 4.0)
    [reply] = [t.msg for t in owners.out.take() if isinstance(t.msg, RetReply)]
    assert reply.items[0].ttl_ms == 6000 and base64.b64decode(reply.items[0].payload_b64) == b"v"
    owners.expire_tombstones(11.0)
    assert trie.get("r/1") is None
