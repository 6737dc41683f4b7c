"""mqttmesh.session: delivery, the inflight window, the queue, acknowledgements, re-sending."""

from __future__ import annotations

import tracemalloc

import pytest

from mqttmesh.flow import Congestion
from mqttmesh.mesh.cluster.cluster_values import Snapshot
from mqttmesh.mesh.cluster.replica import replica_of
from mqttmesh.mesh.cluster.replica_sessions import DurableMeshSession, MeshSession, ReplicaSessions
from mqttmesh.mesh.cluster.snapshots import install
from mqttmesh.message import Message
from mqttmesh.session import OPEN, SENT_PUBLISH, SENT_PUBREL, Entry, Limits, Session
from mqttmesh.session_durable import DurableSession, Sessions
from mqttmesh.store import NULL_JOURNAL, Journal
from support.frames import FakeChannel, publish_fields


def h(text: str) -> bytes:
    return bytes.fromhex(text)


def msg(payload: str = "m", topic: str = "t", qos: int = 2, **kw) -> Message:
    return Message(topic, payload.encode(), qos, **kw)


def online(limits: Limits | None = None, cls=Session, **kw):
    if cls is DurableSession:
        s = DurableSession("c", limits or Limits(), kw["journal"])
    else:
        s = Session("c", False, limits or Limits())
    ch = FakeChannel()
    s.attach(ch, 0.0)
    return s, ch


# --------------------------------------------------------------------------- delivery while online


def test_qos0_exact_frame():
    s, ch = online()
    s.deliver(msg("hi", topic="a/b"), 0)
    assert ch.frames == [h("30 07 00 03 61 2f 62 68 69")]  # [MQTT-4.3.1-1] QoS 0, DUP 0
    assert s.inflight == {} and len(s.queue) == 0


def test_qos0_retained_delivery_sets_retain():
    s, ch = online()
    s.deliver(msg("hi", topic="a/b"), 0, retain=True)
    assert ch.frames == [h("31 07 00 03 61 2f 62 68 69")]


def test_qos1_exact_frame_and_puback():
    s, ch = online()
    s.deliver(msg("hi", topic="a/b"), 1)
    assert ch.frames == [h("32 09 00 03 61 2f 62 00 01 68 69")]  # [MQTT-4.3.2-1] QoS 1, DUP 0, id 1
    assert list(s.inflight) == [1]
    assert s.on_puback(2, 0.0) is False
    assert s.on_pubrec(1) is False  # a PUBREC for a QoS 1 message
    assert s.on_pubcomp(1, 0.0) is False
    assert s.on_puback(1, 0.0) is True
    assert s.inflight == {}
    assert s.on_puback(1, 0.0) is False  # already acknowledged


def test_qos2_exact_frame_and_flow():
    s, ch = online()
    s.deliver(msg("hi", topic="a/b"), 2, retain=True)
    assert ch.frames == [h("35 09 00 03 61 2f 62 00 01 68 69")]  # QoS 2, RETAIN 1, id 1
    assert s.on_pubcomp(1, 0.0) is False  # PUBCOMP before PUBREC
    assert s.on_puback(1, 0.0) is False  # PUBACK for a QoS 2 message
    assert s.on_pubrec(9) is False
    assert s.on_pubrec(1) is True
    assert s.inflight[1].state == SENT_PUBREL
    assert s.on_pubrec(1) is True  # a repeated PUBREC is harmless
    assert s.on_pubcomp(1, 0.0) is True
    assert s.inflight == {}
    assert s.on_pubcomp(1, 0.0) is False


def test_packet_ids_follow_send_order():
    s, ch = online()
    for i in range(3):
        s.deliver(msg(str(i)), 1)
    assert [publish_fields(p)[5] for p in ch.packets()] == [1, 2, 3]


def test_inflight_window_then_queue():
    s, ch = online(Limits(max_inflight=2))
    for i in range(4):
        s.deliver(msg(str(i)), 1)
    assert [p.payload for p in ch.take()] == [b"0", b"1"]
    assert len(s.queue) == 2 and s.pending == 4
    assert s.on_puback(1, 0.0)
    assert [publish_fields(p) for p in ch.take()] == [("t", b"2", 1, False, False, 3)]
    assert s.on_puback(2, 0.0)
    assert s.on_puback(3, 0.0)
    assert [publish_fields(p) for p in ch.take()] == [("t", b"3", 1, False, False, 4)]
    assert s.pending == 1


def test_qos2_window_frees_on_pubcomp_not_pubrec():
    s, ch = online(Limits(max_inflight=1))
    s.deliver(msg("a"), 2)
    s.deliver(msg("b"), 2)
    assert len(ch.take()) == 1
    s.on_pubrec(1)
    assert ch.take() == []
    s.on_pubcomp(1, 0.0)
    assert [p.payload for p in ch.take()] == [b"b"]


def test_order_kept_when_the_window_is_free_but_the_queue_is_not():
    """Messages behind the queue must not overtake it [MQTT-4.6.0-6]."""
    s = Session("c", False, Limits(max_inflight=10))
    for i in range(3):
        s.deliver(msg(str(i)), 1)  # offline: queued
    ch = FakeChannel()
    s.attach(ch, 0.0)
    s.deliver(msg("3"), 1)
    assert [p.payload for p in ch.take()] == [b"0", b"1", b"2", b"3"]


# --------------------------------------------------------------------------- the queue limit


@pytest.mark.parametrize("policy, kept", [("oldest", [b"2", b"3"]), ("newest", [b"1", b"2"])])
def test_queue_limit_drop_policy_online(policy, kept):
    s, ch = online(Limits(max_inflight=1, max_queued=2, drop_policy=policy))
    for i in range(4):
        s.deliver(msg(str(i)), 1)
    assert [p.payload for p in ch.take()] == [b"0"]
    assert [e.msg.payload for e in s.queue] == kept
    assert s.dropped == 1


@pytest.mark.parametrize("policy, kept", [("oldest", [b"3", b"4"]), ("newest", [b"0", b"1"])])
def test_queue_limit_drop_policy_offline(policy, kept):
    s = Session("c", False, Limits(max_queued=2, drop_policy=policy))
    for i in range(5):
        s.deliver(msg(str(i)), 1)
    assert [e.msg.payload for e in s.queue] == kept
    assert s.dropped == 3


def test_queue_limit_zero_drops_everything():
    s = Session("c", False, Limits(max_queued=0, drop_policy="oldest"))
    s.deliver(msg("x"), 1)
    assert len(s.queue) == 0
    assert s.dropped == 1


def test_queue_limit_zero_newest_drops_everything():
    s = Session("c", False, Limits(max_queued=0, drop_policy="newest"))
    s.deliver(msg("x"), 1)
    assert len(s.queue) == 0
    assert s.dropped == 1


# --------------------------------------------------------------------------- offline


def test_offline_queues_qos1_and_qos2_not_qos0():
    """[MQTT-3.1.2-5] QoS 1 and 2 are stored for a disconnected session; QoS 0 need not be."""
    s = Session("c", False, Limits())
    s.deliver(msg("zero"), 0)
    s.deliver(msg("one"), 1)
    s.deliver(msg("two"), 2)
    assert [(e.msg.payload, e.qos) for e in s.queue] == [(b"one", 1), (b"two", 2)]
    assert s.dropped == 0
    ch = FakeChannel()
    s.attach(ch, 0.0)
    assert [publish_fields(p) for p in ch.take()] == [
        ("t", b"one", 1, False, False, 1),
        ("t", b"two", 2, False, False, 2),
    ]


def test_offline_qos0_queued_with_queue_qos0():
    s = Session("c", False, Limits(queue_qos0=True))
    s.deliver(msg("zero"), 0)
    s.deliver(msg("one"), 1)
    s.deliver(msg("zero-r"), 0, retain=True)
    ch = FakeChannel()
    s.attach(ch, 0.0)
    assert [publish_fields(p) for p in ch.take()] == [
        ("t", b"zero", 0, False, False, None),
        ("t", b"one", 1, False, False, 1),
        ("t", b"zero-r", 0, True, False, None),
    ]
    assert list(s.inflight) == [1]


# --------------------------------------------------------------------------- packet identifiers


def test_packet_ids_skip_ids_in_flight_and_wrap_after_65535():
    """[MQTT-2.3.1-2] a currently unused id; never 0 [MQTT-2.3.1-1]; wraps after 65535."""
    s, ch = online(Limits(max_inflight=3))
    s.deliver(msg("held"), 1)  # id 1, never acknowledged
    assert publish_fields(ch.take()[0])[5] == 1
    seen = []
    for _ in range(65535):
        s.deliver(msg("x"), 1)
        pid = publish_fields(ch.take()[0])[5]
        seen.append(pid)
        assert s.on_puback(pid, 0.0)
    assert seen[:3] == [2, 3, 4]
    assert seen[65533] == 65535
    assert seen[65534] == 2  # 1 is still in flight
    assert 0 not in seen and 1 not in seen
    assert list(s.inflight) == [1]


def test_packet_ids_never_reuse_one_in_flight_with_a_full_id_space():
    s, ch = online(Limits(max_inflight=65535))
    for _ in range(65534):
        s.deliver(msg("x"), 1)
    ids = [publish_fields(p)[5] for p in ch.take()]
    assert ids == list(range(1, 65535))
    s.on_puback(7, 0.0)
    s.deliver(msg("y"), 1)
    s.deliver(msg("z"), 1)
    [p1, p2] = ch.take()
    assert publish_fields(p1)[5] == 65535
    assert publish_fields(p2)[5] == 7
    assert len(s.inflight) == 65535
    assert set(s.inflight) == set(range(1, 65536))


# --------------------------------------------------------------------------- re-sending on attach


def test_attach_resends_unacknowledged_in_original_order():
    """[MQTT-4.4.0-1] same ids, [MQTT-4.6.0-1] original order, [MQTT-3.3.1-1] DUP=1, PUBREL after PUBREC."""
    s, ch = online()
    s.deliver(msg("a", topic="x"), 1)
    s.deliver(msg("b", topic="x"), 2)
    s.deliver(msg("c", topic="x"), 2, retain=True)
    s.deliver(msg("d", topic="x"), 1)
    s.on_pubrec(2)
    ch.take()
    s.detach()
    assert s.channel is None
    s.deliver(msg("e", topic="x"), 1)  # queued while offline
    ch2 = FakeChannel()
    s.attach(ch2, 0.0)
    assert ch2.frames == [
        h("3a 06 00 01 78 00 01 61"),  # PUBLISH QoS 1 DUP id 1
        h("62 02 00 02"),  # PUBREL id 2 [MQTT-4.3.3-1]: not the PUBLISH again
        h("3d 06 00 01 78 00 03 63"),  # PUBLISH QoS 2 DUP RETAIN id 3
        h("3a 06 00 01 78 00 04 64"),  # PUBLISH QoS 1 DUP id 4
        h("32 06 00 01 78 00 05 65"),  # the queued one: new, DUP 0
    ]


def test_attach_twice_resends_again():
    s, ch = online()
    s.deliver(msg("a", topic="x"), 1)
    for _ in range(2):
        s.detach()
        ch = FakeChannel()
        s.attach(ch, 0.0)
        assert ch.frames == [h("3a 06 00 01 78 00 01 61")]
    assert s.on_puback(1, 0.0)
    s.detach()
    ch = FakeChannel()
    s.attach(ch, 0.0)
    assert ch.frames == []


def test_subscriptions():
    s = Session("c", False, Limits())
    s.subscribe("a/#", 1)
    s.subscribe("a/#", 2)
    assert s.subscriptions == {"a/#": 2}
    assert s.unsubscribe("a/+") is False
    assert s.unsubscribe("a/#") is True
    assert s.subscriptions == {}


def test_entry_defaults():
    e = Entry("m", 1)
    assert (e.msg, e.qos, e.retain, e.packet_id, e.state, e.key) == ("m", 1, False, 0, 0, 0)
    assert SENT_PUBLISH != SENT_PUBREL


# --------------------------------------------------------------------------- DurableSession journals


def _message_put(client, key, payload, msg_qos, qos, retain, pid, state):
    head = ("message_put", client, key, "t", payload, msg_qos, qos, retain, pid, state, "n1", 7, "pub", 1.5)
    return (*head, None, None, None, None)  # (props, share, root, expires)


def dmsg(payload: str, qos: int = 2) -> Message:
    return Message("t", payload.encode(), qos, False, "n1", 7, "pub", 1.5)


def test_durable_session_journals_queue_send_and_ack():
    j = Journal()
    s = DurableSession("c", Limits(), j)
    assert s.durable is True and s.clean is False
    s.deliver(dmsg("a"), 1)
    s.deliver(dmsg("b", qos=1), 1)
    assert j.take() == (
        1,
        [_message_put("c", 1, b"a", 2, 1, False, 0, 0), _message_put("c", 2, b"b", 1, 1, False, 0, 0)],
    )
    ch = FakeChannel()
    s.attach(ch, 0.0)
    assert j.take() == (
        2,
        [
            _message_put("c", 1, b"a", 2, 1, False, 1, SENT_PUBLISH),
            _message_put("c", 2, b"b", 1, 1, False, 2, SENT_PUBLISH),
        ],
    )
    s.on_puback(2, 0.0)
    assert j.take() == (3, [("message_remove", "c", 2)])


def test_durable_session_journals_qos2_states():
    j = Journal()
    s, ch = online(cls=DurableSession, journal=j)
    s.deliver(dmsg("a"), 2, retain=True)
    assert j.take()[1] == [_message_put("c", 1, b"a", 2, 2, True, 1, SENT_PUBLISH)]
    s.on_pubrec(1)
    assert j.take()[1] == [_message_put("c", 1, b"a", 2, 2, True, 1, SENT_PUBREL)]
    s.on_pubcomp(1, 0.0)
    assert j.take()[1] == [("message_remove", "c", 1)]


def test_durable_session_coalesces_within_a_batch():
    j = Journal()
    s, ch = online(cls=DurableSession, journal=j)
    s.deliver(dmsg("a"), 1)
    s.on_puback(1, 0.0)
    assert j.take()[1] == [("message_remove", "c", 1)]


def test_durable_session_drop_oldest_removes_from_store():
    j = Journal()
    s = DurableSession("c", Limits(max_queued=1), j)
    s.deliver(dmsg("a"), 1)
    j.take()
    s.deliver(dmsg("b"), 1)
    assert j.take()[1] == [("message_remove", "c", 1), _message_put("c", 2, b"b", 2, 1, False, 0, 0)]
    assert s.dropped == 1


def test_durable_session_drop_newest_stores_nothing():
    j = Journal()
    s = DurableSession("c", Limits(max_queued=1, drop_policy="newest"), j)
    s.deliver(dmsg("a"), 1)
    j.take()
    s.deliver(dmsg("b"), 1)
    assert j.take()[1] == []
    assert [e.msg.payload for e in s.queue] == [b"a"]


def test_durable_session_journals_subscriptions():
    j = Journal()
    s = DurableSession("c", Limits(), j)
    s.subscribe("a/#", 1)
    s.subscribe("b", 0)
    assert j.take()[1] == [("session_put", "c", {"a/#": 1, "b": 0}, None)]
    s.unsubscribe("a/#")
    assert j.take()[1] == [("session_put", "c", {"b": 0}, None)]
    s.unsubscribe("zzz")
    assert j.take()[1] == []


def test_durable_session_qos0_offline_queue_is_journaled_then_removed():
    j = Journal()
    s = DurableSession("c", Limits(queue_qos0=True), j)
    s.deliver(dmsg("a", qos=0), 0)
    assert j.take()[1] == [_message_put("c", 1, b"a", 0, 0, False, 0, 0)]
    ch = FakeChannel()
    s.attach(ch, 0.0)
    assert [publish_fields(p) for p in ch.take()] == [("t", b"a", 0, False, False, None)]
    assert j.take()[1] == [("message_remove", "c", 1)]


# --------------------------------------------------------------------------- what only a DurableSession journals


def test_inbound_qos2_ids_are_journaled_by_a_durable_session_only():
    """[MQTT-4.3.3-2] the ids between PUBREC and PUBREL: a durable session's must survive a
    restart, so the PUBREC and PUBCOMP wait for the batch they went into."""
    j = Journal()
    s = DurableSession("c", Limits(), j)
    assert s.awaiting_rel_add(3) == 1
    assert s.awaiting_rel == {3}
    assert j.take()[1] == [("rel_put", "c", 3)]
    assert s.awaiting_rel_remove(3) == 2
    assert s.awaiting_rel == set()
    assert j.take()[1] == [("rel_remove", "c", 3)]
    assert s.awaiting_rel_remove(3) == 0  # not awaited (a repeated PUBREL): nothing to wait for
    assert j.take()[1] == []

    m = Session("c", False, Limits())  # in memory: the same set, nothing to wait for
    assert m.awaiting_rel_add(3) == 0 and m.awaiting_rel == {3}
    assert m.awaiting_rel_remove(3) == 0 and m.awaiting_rel == set()
    assert m.awaiting_rel_remove(3) == 0


def test_discarding_journals_the_delete_of_a_durable_session_only():
    j = Journal()
    DurableSession("c", Limits(), j).discarded()
    assert j.take()[1] == [("session_delete", "c")]
    Session("c", False, Limits()).discarded()  # (nothing to tell anyone)


def test_installing_a_snapshot_journals_awaiting_rel_for_a_durable_replica_only():
    snap = Snapshot("c", {}, 0, [], [], [4, 2], None, 1, 0)  # (typed since issue 14 S3)
    j = Journal()
    durable = DurableMeshSession("c", Limits(), j)
    install(durable, snap, 0.0)
    assert durable.awaiting_rel == {2, 4}
    # (and the copy's epoch and version: a restarted holder's copy is ranked by them)
    assert sorted(j.take()[1]) == [("rel_put", "c", 2), ("rel_put", "c", 4), ("version_put", "c", 1, 0)]
    memory = MeshSession("c", Limits())
    install(memory, snap, 0.0)
    assert memory.awaiting_rel == {2, 4}


# --------------------------------------------------------------------------- the factories


def test_sessions_factory_makes_the_kind_the_connect_and_the_journal_call_for():
    j = Journal()
    congestion = Congestion()
    factory = Sessions(Limits(max_inflight=3), j, congestion)

    clean = factory.new("a", clean=True, durable=True)  # [MQTT-3.1.2-6]: lasts as long as the connection
    assert type(clean) is Session and clean.clean is True
    assert j.take()[1] == []

    persistent = factory.new("b", clean=False, durable=True)  # [MQTT-3.1.2-4]: stored
    assert type(persistent) is DurableSession and persistent.journal is j
    assert j.take()[1] == [("session_put", "b", {}, None)]

    peer = factory.new("$mesh-n2", clean=False, durable=False)  # a peer link: in memory
    assert type(peer) is Session and peer.clean is False
    assert j.take()[1] == []

    restored = factory.restored("d")  # the store fills it: nothing recorded again
    assert type(restored) is DurableSession
    assert j.take()[1] == []

    for session in (clean, persistent, peer, restored):
        assert session.congestion is congestion
        assert session.limits.max_inflight == 3
        assert replica_of(session) is None and session.gate is OPEN


def test_sessions_factory_without_a_store_keeps_persistent_sessions_in_memory():
    s = Sessions(Limits(), NULL_JOURNAL).new("b", clean=False, durable=True)
    assert type(s) is Session and s.clean is False and s.congestion is None


def test_replica_sessions_factory_replicates_persistent_sessions_only():
    j = Journal()
    congestion = Congestion()
    settled = []
    factory = ReplicaSessions(Limits(), j, congestion, lambda *a: settled.append(a))
    s = factory.new("b", clean=False, durable=True)
    assert type(s) is DurableMeshSession and replica_of(s) is s
    assert s.congestion is congestion and s.on_settled is not None
    assert j.take()[1] == [("session_put", "b", {}, None)]
    assert type(factory.restored("b")) is DurableMeshSession
    assert type(factory.new("a", clean=True, durable=True)) is Session
    assert type(factory.new("$mesh-n2", clean=False, durable=False)) is Session
    memory = ReplicaSessions(Limits(), NULL_JOURNAL, congestion, lambda *a: None).new("b", False, True)
    assert type(memory) is MeshSession and replica_of(memory) is memory
    assert j.take()[1] == []


# --------------------------------------------------------------------------- an output over its limit (issue 13)


def test_blocked_output_drops_qos0_and_counts_it_but_keeps_qos1():
    """While the connection's output is over limits.max_write_buffer (the I/O layer sets
    ``channel.blocked``), QoS 0 messages for it are dropped and counted [MQTT-4.3.1: at most
    once]; QoS 1 still goes through the inflight window and the queue."""
    s, ch = online(Limits(max_inflight=1))
    ch.blocked = True
    s.deliver(msg("a"), 0)
    s.deliver(msg("b"), 1)
    s.deliver(msg("c"), 1)
    assert s.dropped_qos0 == 1
    assert [publish_fields(p)[1] for p in ch.take()] == [b"b"]
    assert [e.msg.payload for e in s.queue] == [b"c"]


def test_queued_qos0_is_dropped_on_refill_while_blocked():
    s = Session("c", False, Limits(queue_qos0=True))
    s.deliver(msg("q0"), 0)  # offline: queued
    s.deliver(msg("q1"), 1)
    ch = FakeChannel()
    ch.blocked = True
    s.attach(ch, 0.0)
    assert [publish_fields(p)[1] for p in ch.take()] == [b"q1"]
    assert s.dropped_qos0 == 1


def test_installing_a_copy_never_brings_back_a_message_this_copy_settled():
    """Issue 15 (harness, 400/s): a copy that was away still held messages the session had
    completed long before; a snapshot carries only the last 5,000 settled ids, so a merge
    brought them back and the client got them again under new packet ids. The copy that
    installs it remembers TOMBSTONES ids of its own and drops those."""
    from mqttmesh.mesh.cluster.cluster_values import SnapshotEntry

    s = MeshSession("c", Limits())
    s.settle(("n2", 7), "done", 0)  # (completed at the node the client was on)
    stale = SnapshotEntry("n2", 7, "t", "eA==", 2, 2, 0, 0, "pub", 1.0)
    fresh = SnapshotEntry("n2", 8, "t", "eQ==", 2, 2, 0, 0, "pub", 1.5)
    install(s, Snapshot("c", {}, 0, [stale, fresh], [], [], None, 1, 3), 0.0)
    assert [e.msg.seq for e in s.queue] == [8] and ("n2", 7) not in s.ids


def test_in_origin_order_sorts_each_origins_items_in_their_own_places():
    """What reached a session by two ways leaves in each origin's order [MQTT-4.6.0-6];
    another origin's items and those without an id stay where they are."""
    from mqttmesh.message import in_origin_order

    items = [("a", 3), ("b", 9), None, ("a", 1), ("b", 4), ("a", 2), ("c", 5)]
    in_origin_order(items, lambda x: x)
    assert items == [("a", 1), ("b", 4), None, ("a", 2), ("b", 9), ("a", 3), ("c", 5)]
    ordered = [("a", 1), ("a", 2)]
    in_origin_order(ordered, lambda x: x)
    assert ordered == [("a", 1), ("a", 2)]


class _GatedChannel(FakeChannel):
    """Holds each gated frame until ``release`` passes its ticket, as channel_held.py does."""

    def __init__(self):
        super().__init__()
        self.held: list[tuple[bytes, int]] = []

    def write_gated(self, frame: bytes, ticket: int) -> None:
        self.held.append((bytes(frame), ticket))

    def release(self, passed: int) -> None:
        self.frames += [f for f, t in self.held if t <= passed]
        self.held = [(f, t) for f, t in self.held if t > passed]


def test_a_qos2_publish_the_gate_never_let_out_is_queued_again_when_the_client_leaves():
    """A replicated session frames a QoS 2 PUBLISH after telling the other holders its packet
    id ("sent"); the frame waits until they confirmed it. If the client leaves before they
    did (its node cut off from them), the client never had it: the entry goes back to the
    queue (state 0, no packet id), so that a claim elsewhere that never heard of it does not
    take it for completed (the fault harness, 7 nodes, seed 2: 20 QoS 2 messages lost), and it
    is sent afresh when a client comes back. One whose frame went out stays in flight."""
    reports: list[tuple] = []
    s = MeshSession("c", Limits(), on_settled=lambda sess, key, state, pid, m=None: reports.append((key, state, pid)))
    ch = _GatedChannel()
    s.attach(ch, 0.0)
    for seq in (1, 2, 3):
        s.deliver(msg(f"m{seq}", origin="o", seq=seq), 2)
    assert [r[1] for r in reports] == ["sent"] * 3 and len(s.inflight) == 3 and not ch.frames
    s.safe_version = 1  # (the holders confirmed the first "sent": its frame goes out)
    ch.release(s.safe_version)
    assert [p.packet_id for p in ch.take()] == [1]
    s.detach()
    assert list(s.inflight) == [1] and s.inflight[1].state == SENT_PUBLISH
    assert [(e.msg.seq, e.packet_id, e.state) for e in s.queue] == [(2, 0, 0), (3, 0, 0)]
    again = _GatedChannel()
    s.attach(again, 1.0)  # (back: the one it had is sent again, DUP=1; the others as new)
    again.release(10**6)
    sent = again.take()
    assert [(p.dup, p.packet_id) for p in sent][0] == (True, 1)
    assert [p.payload for p in sent] == [b"m1", b"m2", b"m3"] and not any(p.dup for p in sent[1:])


def test_a_qos1_publish_framed_behind_an_unconfirmed_step_is_queued_again_when_the_client_leaves():
    """A QoS 1 PUBLISH is written in order behind the frames the gate holds (channel_held.py):
    framed while a step of the session was unconfirmed by the other holders, it may never
    have left when the client goes (its node cut off from them: the fault harness, 7 nodes,
    seed 9, lost one so, merged away by a claim that never had it). Its entry goes back to the
    queue; one framed once every step was confirmed stays in flight (DUP=1 on return)."""
    reports: list[tuple] = []
    s = MeshSession("c", Limits(), on_settled=lambda sess, key, state, pid, m=None: reports.append((key, state, pid)))
    ch = _GatedChannel()
    s.attach(ch, 0.0)
    s.deliver(msg("m1", origin="o", seq=1), 1)  # (no step unconfirmed: written)
    s.deliver(msg("q2", origin="o", seq=2), 2)  # ("sent" reported: version 1, unconfirmed)
    s.deliver(msg("m3", origin="o", seq=3), 1)  # (behind the held QoS 2 frame)
    assert s.version == 1 and s.safe_version == 0 and sorted(s.unreleased) == [2, 3]
    s.detach()
    assert list(s.inflight) == [1]
    assert [(e.msg.seq, e.packet_id, e.state) for e in s.queue] == [(2, 0, 0), (3, 0, 0)]
    s2 = MeshSession("d", Limits(), on_settled=lambda sess, key, state, pid, m=None: None)
    s2.attach(_GatedChannel(), 0.0)
    s2.deliver(msg("q1", origin="o", seq=1), 2)
    s2.deliver(msg("m2", origin="o", seq=2), 1)
    s2.safe_version = s2.version  # (the holders confirmed: both frames went out)
    s2.detach()
    assert sorted(s2.inflight) == [1, 2] and not s2.queue


def test_a_publish_the_gate_holds_is_stored_as_queued_until_the_holders_confirm_it(tmp_path):
    """The fault harness (5 nodes, MQTT 5, seed 8) lost a QoS 2 message: a persistent
    member's home framed it, reported "sent" and stored the entry in flight, and was killed
    with kill -9 before the other holders confirmed the step (so before the frame left). The
    client went to another node, whose claim never heard of the message; the restarted home's
    copy had it in flight under the older claim, which a merge takes for completed
    (snapshots.py). The store now keeps such an entry as queued until the gate passes it:
    restarted, the copy has it queued and a merge with the newer claim keeps it. An entry
    whose frame went out is stored in flight (DUP=1 on return), as before."""
    from mqttmesh.mesh.cluster.snapshots import merge_snapshots, snapshot
    from support.restart import restarted_session, write_store

    j = Journal()
    s = DurableMeshSession("m", Limits(), j, on_settled=lambda *a: None)
    s.subscribe("t", 2)
    ch = _GatedChannel()
    s.attach(ch, 0.0)
    s.deliver(msg("q1", origin="o", seq=1), 2)  # version 1
    s.deliver(msg("q2", origin="o", seq=2), 2)  # version 2
    s.deliver(msg("a3", origin="o", seq=3), 1)  # (QoS 1, framed behind the held QoS 2 frames)
    s.confirmed(1)  # the holders have the first "sent": its frame may leave
    ch.release(s.safe_version)
    assert [p.payload for p in ch.take() if p.qos == 2] == [b"q1"]  # (the fake writes QoS 1 at once)

    def stored(ops):
        return {op[2]: (op[8], op[9]) for op in ops if op[0] == "message_put"}  # key -> (pid, state)

    ops = [("session_put", "m", {"t": 2}, None)] + j.take()[1]
    assert sorted(stored(ops).values()) == [(0, 0), (0, 0), (1, SENT_PUBLISH)]
    write_store(tmp_path, ops)
    back = restarted_session(tmp_path, "m")  # killed here (kill -9): restarted from the store
    assert {pid: e.msg.payload for pid, e in back.inflight.items()} == {1: b"q1"}
    assert [e.msg.payload for e in back.queue] == [b"q2", b"a3"]
    # a newer claim (epoch 1) that never had any of them: q2 and a3 are kept, queued; q1's
    # "sent" reached the holders that claim gathered from, so it was completed since
    newer = MeshSession("m", Limits(), on_settled=lambda *a: None)
    newer.epoch, newer.version = 1, 5
    merged = merge_snapshots([snapshot(back, 1.0), snapshot(newer, 1.0)])
    assert merged is not None
    assert [(e.seq, e.state) for e in merged.entries] == [(2, 0), (3, 0)]
    # once the holders confirm, the store has them in flight: the client may have them
    s.confirmed(s.version)
    assert sorted(stored(j.take()[1]).values()) == [(2, SENT_PUBLISH), (3, SENT_PUBLISH)]
    assert not s.unreleased and all(e.ticket == 0 for e in s.inflight.values())


def test_the_ticket_of_a_publish_is_dropped_when_its_client_answers_or_leaves():
    """PUBREC clears an entry's ticket (the client had it, whatever the gate's state in
    between); a detach clears every ticket (queued again, or stored as in flight)."""
    j = Journal()
    s = DurableMeshSession("m", Limits(), j, on_settled=lambda *a: None)
    s.attach(_GatedChannel(), 0.0)
    s.deliver(msg("q1", origin="o", seq=1), 2)
    s.deliver(msg("q2", origin="o", seq=2), 2)
    assert [e.ticket for e in s.inflight.values()] == [1, 2]
    s.safe_version = 1  # (as a test may: the gate let q1 out without ``confirmed``)
    assert s.on_pubrec(1) and s.inflight[1].ticket == 0 and s.inflight[1].state == SENT_PUBREL
    j.take()
    s.detach()
    assert [(e.msg.payload, e.ticket, e.state) for e in s.queue] == [(b"q2", 0, 0)]
    assert s.inflight[1].ticket == 0 and not s.unreleased


def test_an_inbound_qos2_message_a_node_routed_is_not_routed_again_where_its_client_goes():
    """The fault harness (7 nodes, seed 1, pub0:1854): a persistent publisher's QoS 2 message
    was routed by the node that took it, under its agreed id; its client moved before the
    PUBREC and the node it came to routed it again under that id. The duplicate filters keep
    a subscriber to one copy, but a shared group's member is chosen by each router from its
    own view of the mesh (a link flapping): two members got it. A snapshot now names the
    inbound messages a node routed and keeps in its store (committed: a kill -9 before then
    loses the route, and the next node must route it); a merge keeps the marks of the
    messages it keeps, and the node the client comes to routes only the others."""
    import json

    from mqttmesh.mesh.cluster.snapshots import merge_snapshots, snapshot

    j = Journal()
    took = DurableMeshSession("p", Limits(), j, on_settled=lambda *a: None)
    first = msg("x", topic="a", origin="n5", seq=41)
    second = msg("y", topic="a", origin="n5", seq=42)
    took.awaiting_rel_agreed(7, first)
    took.awaiting_rel_agreed(8, second)
    assert took.route_here(first)
    batch, _ = j.take()
    took.routed_in(first, batch)  # (the route's custody is in this batch)
    assert took.routed_ids() == []  # not committed yet: not named
    j.mark_committed(batch)
    assert took.routed_ids() == [("n5", 41)]
    snap = snapshot(took, 1.0)
    wire = Snapshot.from_json(json.loads(json.dumps(snap.to_json())), "test")
    assert wire.routed == [("n5", 41)]
    # a holder's copy heard both "in" steps and nothing of the route
    holder = MeshSession("p", Limits(), on_settled=lambda *a: None)
    holder.settle(("n5", 41), "in", 7, first)
    holder.settle(("n5", 42), "in", 8, second)
    merged = merge_snapshots([snapshot(holder, 1.0), wire])
    assert merged is not None and merged.routed == [("n5", 41)]
    claim = MeshSession("p", Limits(), on_settled=lambda *a: None)
    install(claim, merged, 1.0)
    assert [(m.origin, m.seq) for m in claim.unrouted()] == [("n5", 42)]
    assert not claim.route_here(first) and claim.route_here(second)
    # released: the mark goes with the message; a copy without marks sends the JSON of before
    claim.awaiting_rel_remove(7)
    assert claim.routed_ids() == [] and "routed" not in snapshot(holder, 1.0).to_json()


# -- what an idle session keeps (issue 26) --------------------------------------------------


def test_subscriptions_one_filter_then_a_dict_then_one_again():
    s = Session("c", True, Limits())
    assert s.subscriptions == {} and len(s.subscriptions) == 0
    s.subscribe("a/#", 1)
    assert type(s.subscriptions) is not dict  # (the one-filter form)
    assert s.subscriptions == {"a/#": 1} and dict(s.subscriptions) == {"a/#": 1}
    assert s.subscriptions.get("a/#") == 1 and s.subscriptions.get("b") is None
    assert "a/#" in s.subscriptions and "b" not in s.subscriptions
    assert list(s.subscriptions.items()) == [("a/#", 1)]
    with pytest.raises(KeyError):
        s.subscriptions["b"]
    s.subscribe("a/#", 2)  # (its QoS replaced, still one filter)
    assert type(s.subscriptions) is not dict and s.subscriptions == {"a/#": 2}
    s.subscribe("b", 0)
    assert type(s.subscriptions) is dict and s.subscriptions == {"a/#": 2, "b": 0}
    assert s.unsubscribe("a/#") and not s.unsubscribe("a/#")
    assert type(s.subscriptions) is not dict and s.subscriptions == {"b": 0}
    assert s.unsubscribe("b") and s.subscriptions == {}
    assert s.sub_changes == 5
    s.subscribe("x", 1)
    assert s.unsubscribe_all() == ["x"] and s.subscriptions == {}


def test_a_durable_session_journals_its_one_filter_as_a_dict():
    journal = Journal()
    s = DurableSession("d", Limits(), journal)
    s.subscribe("a/#", 1)
    ops = [op for op in journal.take()[1] if op[0] == "session_put"]
    assert ops[-1][2] == {"a/#": 1} and type(ops[-1][2]) is dict


def test_rare_counters_and_adapt_live_outside_the_slots():
    s = Session("c", True, Limits(max_inflight=10))
    assert (s.dropped, s.dropped_qos0, s.expired) == (0, 0, 0)
    s.dropped_qos0 += 1
    assert s.dropped_qos0 == 1 and Session.dropped_qos0 == 0

    def deliver(msg, qos, retain=False):
        pass

    s.adapt(5, deliver)
    assert s.deliver is deliver and s.limits.max_inflight == 5
    s.detach()
    assert s.deliver != deliver and s.limits.max_inflight == 10


def test_an_idle_session_with_one_subscription_keeps_no_dict():
    """The bytes a clean session with one subscription keeps (CPython 3.11: the slotted object
    184, its empty ``__dict__`` block 16, the one-filter mapping 48; with an instance dict and
    a one-entry dict of subscriptions it was 432): a dict coming back shows here."""
    limits = Limits()
    filters = [f"idle/{i}/#" for i in range(1000)]
    names = [f"idle-{i}" for i in range(1000)]
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        sessions = []
        for name, topic_filter in zip(names, filters, strict=True):
            session = Session(name, True, limits)
            session.subscribe(topic_filter, 1)
            sessions.append(session)
        kept = (tracemalloc.get_traced_memory()[0] - before) / len(sessions)
    finally:
        tracemalloc.stop()
    assert kept < 280, f"{kept:.0f} bytes a session"
