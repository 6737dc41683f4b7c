"""Shared subscriptions on one node (shared.py, session_table.py, broker.py, the channels).

Clients are real Channels of one pure Broker (tests/support/frames.py), their bytes from the
independent helpers tests/support/mqttraw.py (3.1.1) and mqttraw5.py (5.0). Rule ids are
MQTT 5.0's (section 4.8.2; 3.1.1 has no shared subscriptions, which the node offers its
clients too).
"""

from __future__ import annotations

import collections

import pytest

from mqttmesh import properties as P
from mqttmesh.auth import Acl, Auth
from mqttmesh.channel import CLOSED
from mqttmesh.codec import Decoder, Disconnect, Publish, SubAck
from mqttmesh.session import Limits
from mqttmesh.shared import STRATEGIES, SharedGroup, ShareError, split_share
from support import mqttraw
from support import mqttraw5 as r5
from support.frames import FakeChannel, Net, out, publishes
from support.mqttraw import varint

# --------------------------------------------------------------------------- the filter


@pytest.mark.parametrize(
    ("topic_filter", "share"),
    [
        ("$share/g/a/b", ("g", "a/b")),
        ("$share/g/#", ("g", "#")),
        ("$share/workers/+/t", ("workers", "+/t")),
        ("$share/g/$SYS/x", ("g", "$SYS/x")),
        ("$share/g//", ("g", "/")),
        ("a/b", None),
        ("$shared/g/a", None),
        ("$share", None),
    ],
)
def test_a_shared_subscription_is_share_name_then_filter(topic_filter, share):
    """[MQTT-4.8.2-1] [MQTT-4.8.2-2]: "$share/", a share name of at least one character
    without "/", "+" or "#", then "/" and a topic filter; anything else is an ordinary filter."""
    assert split_share(topic_filter) == share


@pytest.mark.parametrize("topic_filter", ["$share/", "$share//a", "$share/g", "$share/g/", "$share/+/a", "$share/#"])
def test_a_share_filter_that_is_no_shared_subscription_raises(topic_filter):
    with pytest.raises(ShareError):
        split_share(topic_filter)


# --------------------------------------------------------------------------- 3.1.1 clients


def _publish(net: Net, topic: str, n: int, qos: int = 0, now: float = 0.0) -> None:
    pub = net.connect("pub", now)
    for i in range(n):
        pid = i + 1 if qos else None
        pub.receive_data(mqttraw.publish(topic, b"%d" % i, qos=qos, pid=pid), now)
    out(pub)


def _got(channel) -> list[bytes]:
    return [p[1] for p in publishes(channel)]


def test_each_message_goes_to_one_member_of_each_group_and_to_every_plain_subscriber():
    """Two groups on one filter each get every message once, spread over their members;
    a plain subscriber of the filter gets every message; a client in a group and subscribed
    plainly gets both copies."""
    net = Net()
    a1 = net.subscriber("a1", ("$share/A/t/#", 1))
    a2 = net.subscriber("a2", ("$share/A/t/#", 1))
    b1 = net.subscriber("b1", ("$share/B/t/#", 0), ("t/#", 0))
    plain = net.subscriber("plain", ("t/+", 0))
    _publish(net, "t/x", 10)
    got_a1, got_a2, got_b1, got_plain = _got(a1), _got(a2), _got(b1), _got(plain)
    assert sorted(got_a1 + got_a2) == sorted(b"%d" % i for i in range(10))  # once per group
    assert len(got_a1) == len(got_a2) == 5  # (round robin on one node)
    assert collections.Counter(got_b1) == {b"%d" % i: 2 for i in range(10)}  # its group's and its own
    assert got_plain == [b"%d" % i for i in range(10)]


def test_a_malformed_share_gets_0x80_and_the_granted_qos_is_the_members():
    """A 3.1.1 client gets SUBACK 0x80 for a "$share/" filter that is none; a member gets
    each message at the QoS it was granted [MQTT-4.8.2-3], not above the publisher's."""
    net = Net()
    ch = net.connect("s")
    ch.receive_data(mqttraw.subscribe(1, ("$share/+/t", 1), ("$share/g/t", 1), ("$share/g", 0)), 0.0)
    [suback] = out(ch)
    assert suback.type == mqttraw.SUBACK and suback.body[2:] == bytes([0x80, 1, 0x80])
    _publish(net, "t", 1, qos=2)
    [(topic, payload, qos, *_)] = publishes(ch)
    assert (topic, qos) == ("t", 1)


def test_no_retained_message_on_a_shared_subscribe():
    net = Net()
    pub = net.connect("pub")
    pub.receive_data(mqttraw.publish("t", b"kept", retain=True), 0.0)
    member = net.subscriber("m", ("$share/g/t", 0))
    plain = net.subscriber("p", ("t", 0))
    assert _got(member) == []
    assert _got(plain) == [b"kept"]


def test_unsubscribing_takes_the_exact_shared_filter():
    net = Net()
    m1 = net.subscriber("m1", ("$share/g/t", 0))
    m2 = net.subscriber("m2", ("$share/g/t", 0))
    m1.receive_data(mqttraw.unsubscribe(2, "t", "$share/h/t"), 0.0)  # (neither is its subscription)
    out(m1)
    _publish(net, "t", 4)
    assert len(_got(m1)) == 2
    m1.receive_data(mqttraw.unsubscribe(3, "$share/g/t"), 0.0)
    out(m1)
    _publish(net, "t", 4)
    assert _got(m1) == [] and len(_got(m2)) == 4 + 2


def test_the_acl_judges_a_members_filter_and_each_message():
    """The ACL judges the filter after the share name; a message goes only to a member that
    may read its topic (none may: dropped, counted)."""
    acl = Acl.parse("user u1\ntopic readwrite t/#\nuser u2\ntopic read t/open\n")
    net = Net(auth=Auth(acl=acl))
    m1 = net.subscriber("m1", ("$share/g/t/#", 0), username="u1")
    m2 = net.connect("m2", username="u2")
    m2.receive_data(mqttraw.subscribe(1, ("$share/g/t/#", 0), ("$share/g/t/open", 0)), 0.0)
    [suback] = out(m2)
    assert suback.body[2:] == bytes([0x80, 0])
    pub = net.connect("pub", username="u1")
    for _ in range(4):
        pub.receive_data(mqttraw.publish("t/secret", b"s"), 0.0)
    assert len(_got(m1)) == 4 and _got(m2) == []


# --------------------------------------------------------------------------- strategies


class _Member:
    """Just what a group reads of a session."""

    def __init__(self, client_id: str, online: bool = True):
        self.client_id = client_id
        self.channel = object() if online else None
        self.backlogged = False


def _msg(topic: str = "t", publisher: str = "p"):
    from mqttmesh.message import Message

    return Message(topic, b"", 1, False, "n", 1, publisher, 0.0)


def _group(strategy: str, *names: str) -> tuple[SharedGroup, list[_Member]]:
    group = SharedGroup("g", "t/#", strategy)
    members = [_Member(n) for n in names]
    for m in members:
        group.members[m] = 1  # type: ignore[index]
    return group, members


def test_every_strategy_spreads_or_keeps_as_it_says():
    assert set(STRATEGIES) == {"local", "round_robin", "hash_topic", "hash_clientid", "sticky"}
    for strategy in ("local", "round_robin"):
        group, members = _group(strategy, "a", "b", "c")
        picks = collections.Counter(group.choose(_msg(f"t/{i}")).client_id for i in range(30))
        assert picks == {"a": 10, "b": 10, "c": 10}
    group, members = _group("hash_topic", "a", "b", "c")
    for i in range(20):
        assert len({group.choose(_msg(f"t/{i}", publisher=f"p{j}")).client_id for j in range(5)}) == 1
    assert len({group.choose(_msg(f"t/{i}")).client_id for i in range(30)}) == 3
    group, members = _group("hash_clientid", "a", "b", "c")
    for j in range(20):
        assert len({group.choose(_msg(f"t/{i}", publisher=f"p{j}")).client_id for i in range(5)}) == 1
    group, members = _group("sticky", "a", "b", "c")
    first = group.choose(_msg())
    assert all(group.choose(_msg(f"t/{i}")) is first for i in range(10))
    first.channel = None  # (it went away: the next one, kept from then on)
    second = group.choose(_msg())
    assert second is not first and all(group.choose(_msg(f"t/{i}")) is second for i in range(10))


def test_a_connected_member_is_chosen_before_one_that_would_queue():
    group, (a, b, c) = _group("round_robin", "a", "b", "c")
    a.channel = c.channel = None
    assert {group.choose(_msg()).client_id for _ in range(6)} == {"b"}
    b.channel = None  # (none connected: they queue it, in turn)
    assert {group.choose(_msg()).client_id for _ in range(6)} == {"a", "b", "c"}


def test_an_unknown_strategy_is_refused():
    from mqttmesh.shared import SharedSubscriptions

    with pytest.raises(ValueError, match="one of local, round_robin"):
        SharedSubscriptions("random")


# --------------------------------------------------------------------------- nothing lost


def _pids(channel) -> list[tuple[bytes, int]]:
    return [(p[1], p[5]) for p in publishes(channel)]


def _acked(channel, now: float) -> list[tuple[bytes, int]]:
    """What ``channel`` is sent from now on, each acknowledged as it comes."""
    got = []
    while True:
        more = _pids(channel)
        if not more:
            return got
        got += more
        for _, pid in more:
            channel.receive_data(mqttraw.puback(pid), now)


def test_a_clean_member_that_leaves_without_acknowledging_hands_its_messages_on():
    """A clean-session member's connection drops holding unacknowledged QoS 1 messages, in
    flight and queued: they go to the other member (those in flight may have reached the
    client: counted as re-sent)."""
    net = Net(limits=Limits(max_inflight=2))
    m1 = net.subscriber("m1", ("$share/g/t", 1))
    m2 = net.subscriber("m2", ("$share/g/t", 1))
    _publish(net, "t", 8, qos=1)
    got1 = _pids(m1)
    got2 = _pids(m2)
    assert len(got1) == len(got2) == 2  # (two in flight each, two queued each)
    for _, pid in got2:
        m2.receive_data(mqttraw.puback(pid), 1.0)
    m1.connection_lost(2.0)
    assert m1.state == CLOSED
    later = _acked(m2, 3.0)
    # m2 has every message once: its own, and all m1 held (those m1 was sent, again)
    assert sorted(p for p, _ in got2 + later) == sorted(b"%d" % i for i in range(8))
    assert {p for p, _ in got1} <= {p for p, _ in later}
    shared = net.broker.shared
    assert (shared.resent, shared.redispatched, shared.dropped) == (2, 2, 0)


def test_a_member_that_unsubscribes_completes_what_is_in_flight_and_hands_on_its_queue():
    """[MQTT-3.10.4-3] A member that unsubscribes from its group completes the QoS 1 messages
    it was sent (the client acknowledges them on this connection); only what was queued goes
    to the other member. Handed on too, a message in flight reached two members, and its
    packet id was free for another message while the client still held it (the simulator's
    harsh scenario, seed 35: a held PUBLISH left after its message had expired)."""
    net = Net(limits=Limits(max_inflight=2))
    m1 = net.subscriber("m1", ("$share/g/t", 1))
    m2 = net.subscriber("m2", ("$share/g/t", 1))
    _publish(net, "t", 8, qos=1)
    got1 = _pids(m1)
    got2 = _acked(m2, 1.0)
    assert len(got1) == 2 and len(got2) == 4  # (m1: two in flight, two queued)
    m1.receive_data(mqttraw.unsubscribe(5, "$share/g/t"), 2.0)
    assert [p.type for p in out(m1)] == [mqttraw.UNSUBACK]  # (nothing more for m1)
    for _, pid in got1:  # m1 completes what it was sent
        m1.receive_data(mqttraw.puback(pid), 3.0)
    assert out(m1) == [] and not m1.session.inflight
    later = _acked(m2, 4.0)
    # every message once across the group: m1 its two, m2 its own and m1's queued two
    assert sorted(p for p, _ in got1 + got2 + later) == sorted(b"%d" % i for i in range(8))
    shared = net.broker.shared
    assert (shared.resent, shared.redispatched, shared.dropped) == (0, 2, 0)


def test_a_persistent_member_that_goes_away_hands_its_queue_to_a_connected_one_only():
    """Its queue goes to a member that is connected; when it is the only member, it keeps
    it for its return [MQTT-3.1.2-5]."""
    net = Net()
    p1 = net.subscriber("p1", ("$share/g/t", 1), clean=False)
    p1.connection_lost(0.5)
    _publish(net, "t", 3, qos=1, now=1.0)  # (the only member: queued for it)
    assert len(net.broker.sessions["p1"].queue) == 3
    m2 = net.subscriber("m2", ("$share/g/t", 1), now=2.0)
    back = net.connect("p1", 3.0, clean=False, expect=b"\x20\x02\x01\x00")
    kept = _pids(back)
    assert len(kept) == 3  # (kept: nobody else was there when it went)
    for _, pid in kept:
        back.receive_data(mqttraw.puback(pid), 3.0)
    _publish(net, "t", 2, qos=1, now=3.0)
    assert len(_pids(back)) == 1  # (one each, in turn; not acknowledged)
    back.connection_lost(4.0)  # away again, m2 connected: what it holds goes to m2
    _publish(net, "t", 4, qos=1, now=5.0)
    assert len(_pids(m2)) == 1 + 1 + 4  # (its turn; the one moved; four new)
    p1 = net.broker.sessions["p1"]
    assert not p1.queue and not p1.inflight
    assert (net.broker.shared.resent, net.broker.shared.redispatched) == (1, 0)


def test_a_qos2_message_in_flight_stays_with_its_member():
    """[MQTT-4.8.2-4]: the member's connection breaks before the QoS 2 delivery completed:
    it is completed when that client returns, not given to another member; [MQTT-4.8.2-5]:
    if its session ends first, to no other member either."""
    net = Net()
    p1 = net.subscriber("p1", ("$share/g/t", 2), clean=False)
    m2 = net.subscriber("m2", ("$share/g/t", 2))
    _publish(net, "t", 2, qos=2)
    [(first, pid)] = _pids(p1)
    assert len(_pids(m2)) == 1
    p1.connection_lost(1.0)
    assert _pids(m2) == []
    back = net.connect("p1", 2.0, clean=False, expect=b"\x20\x02\x01\x00")
    [(again, same)] = _pids(back)
    assert (again, same) == (first, pid)  # re-sent to it [MQTT-4.3.3-1]
    back.connection_lost(3.0)
    net.connect("p1", 4.0, clean=True)  # its session ends with the message still in flight
    assert _pids(m2) == []
    assert net.broker.shared.abandoned == 1


def test_a_refusal_by_puback_is_not_sent_to_another_member():
    """[MQTT-4.8.2-6]: a PUBACK with a reason code of 0x80 or more discards the message."""
    net = Net()
    ch = net.channel()
    ch.receive_data(r5.connect("m1"), 0.0)
    ch.receive_data(r5.subscribe(1, ("$share/g/t", 1)), 0.0)
    m2 = net.subscriber("m2", ("$share/g/t", 1))
    _publish(net, "t", 2, qos=1)
    d = Decoder(version=5)
    d.feed(ch.data_to_send())
    [publish] = [p for p in d.packets() if isinstance(p, Publish)]
    ch.receive_data(r5.ack(4, publish.packet_id, 0x80), 1.0)
    ch.connection_lost(2.0)
    assert len(_pids(m2)) == 1  # (its own share only)
    assert net.broker.shared.resent == 0


def test_a_persistent_members_shared_subscription_is_restored_with_its_session():
    """After a restart the store's session is a member of its group again (the table
    restores every subscription it kept, the shared ones into their groups)."""
    from mqttmesh.store import restore_sessions

    net = Net()
    [session] = restore_sessions(net.broker.session_factory, [("p", {"$share/g/t": 1}, None)], [], [])
    net.broker.table.restore_session(session)
    _publish(net, "t", 2, qos=1)
    assert len(session.queue) == 2
    back = net.connect("p", 1.0, clean=False, expect=b"\x20\x02\x01\x00")
    assert [p for p, _ in _pids(back)] == [b"0", b"1"]


@pytest.mark.parametrize("stored", ["format 4", "format 3"])
def test_what_a_restored_member_queued_from_its_group_goes_to_another_member_when_it_ends(stored):
    """The store keeps the group each entry came through (format 4): restored, the entry is
    the group's again once the session has joined it (``shared.rejoin_entries``), so that when
    the member's session ends (its client back with CleanSession=1 [MQTT-3.1.2-6]) what it
    had queued from the group goes to the connected member, once each [MQTT-4.8.2-3]. An
    entry of format 3 names no group: it ends with the session, as before. A tag of a group
    the session no longer subscribes to is no group (the plain subscription's entry neither)."""
    from mqttmesh.store import restore_sessions

    def row(key, payload, share):
        share = share if stored == "format 4" else None
        return ("p", key, "t", payload, 1, 1, 0, 0, 0, "n1", key, "pub", 1.5, None, share, None, None)

    net = Net()
    [session] = restore_sessions(
        net.broker.session_factory,
        [("p", {"$share/g/t": 1, "t": 1}, None)],
        [
            row(1, b"0", "$share/g/t"),
            row(2, b"plain", None),
            row(3, b"left", "$share/other/t"),
            row(4, b"1", "$share/g/t"),
        ],
        [],
    )
    net.broker.table.restore_session(session)
    group = net.broker.shared.groups[("g", "t")]
    tagged = group if stored == "format 4" else None
    assert [e.group for e in session.queue] == [tagged, None, None, tagged]
    b = net.subscriber("b", ("$share/g/t", 1))
    assert _got(b) == []  # (a member joining takes nothing from the others)
    net.connect("p", 1.0, clean=True)  # (its old session discarded)
    assert _got(b) == ([b"0", b"1"] if stored == "format 4" else [])
    assert net.broker.shared.redispatched == (2 if stored == "format 4" else 0)


# --------------------------------------------------------------------------- MQTT 5 clients


def _connect5(net: Net, client_id: str):
    ch = net.channel()
    ch.receive_data(r5.connect(client_id), 0.0)
    d = Decoder(version=5)
    d.feed(ch.data_to_send())
    [ack] = list(d.packets())
    return ch, ack


def _answers5(ch) -> list:
    d = Decoder(version=5)
    d.feed(ch.data_to_send())
    return list(d.packets())


def test_mqtt5_shared_subscriptions_available_and_their_reason_codes():
    """CONNACK: Shared Subscription Available 1; SUBACK 0x8F for a "$share/" filter that is
    none [MQTT-4.8.2-1] [MQTT-4.8.2-2]; a member's Subscription Identifier comes with what
    its group gives it."""
    net = Net()
    ch, ack = _connect5(net, "m")
    assert ack.properties[P.SHARED_SUB_AVAILABLE] == 1
    ch.receive_data(r5.subscribe(1, ("$share/+/t", 1), ("$share/g/t", 1)), 0.0)
    [suback] = _answers5(ch)
    assert isinstance(suback, SubAck) and suback.return_codes == [0x8F, 1]
    props = r5.props((P.SUBSCRIPTION_ID, varint(7)))
    ch.receive_data(r5.subscribe(2, ("$share/h/u", 1), properties=props), 0.0)
    _answers5(ch)
    _publish(net, "u", 1, qos=1)
    [publish] = [p for p in _answers5(ch) if isinstance(p, Publish)]
    assert publish.properties[P.SUBSCRIPTION_ID] == [7]


def test_no_local_on_a_shared_subscription_is_a_protocol_error():
    """[MQTT-3.8.3-4]: DISCONNECT 0x82 (Protocol Error), the connection closed."""
    net = Net()
    ch, _ = _connect5(net, "m")
    ch.receive_data(r5.subscribe(1, ("$share/g/t", 0x04 | 1)), 0.0)
    answers = _answers5(ch)
    assert answers == [Disconnect(0x82, answers[0].properties)]
    assert ch.state == CLOSED


def test_a_member_gets_its_own_messages_through_its_group():
    """No Local is not for shared subscriptions: a member that publishes to its group's
    filter may be the member chosen (it has no other subscription to it)."""
    net = Net()
    ch, _ = _connect5(net, "m")
    ch.receive_data(r5.subscribe(1, ("$share/g/t", 1)), 0.0)
    _answers5(ch)
    ch.receive_data(r5.publish("t", b"own", qos=0), 0.0)
    assert [p.payload for p in _answers5(ch) if isinstance(p, Publish)] == [b"own"]


# --------------------------------------------------------------------------- in a mesh: holds


def _holds(net: Net) -> tuple[collections.Counter, collections.Counter]:
    """What the group tells the mesh (Broker: ``mesh.hold`` and ``mesh.settle``), by payload:
    a member took a QoS 1/2 message, and it was settled (acknowledged, moved on, or gone)."""
    held: collections.Counter = collections.Counter()
    settled: collections.Counter = collections.Counter()
    shared = net.broker.shared
    shared.hold = lambda m, share, clean: held.update([m.payload])
    shared.settle = lambda m, share: settled.update([m.payload])
    return held, settled


def test_a_members_acknowledgement_settles_what_it_took_once_and_a_move_settles_nothing():
    """Each QoS 1 message a member takes is held once (the node's acknowledgement to the
    origin waits); the member's PUBACK settles it; what a leaving member held moves to the
    other member still held, and that member's PUBACK settles it: once each, never twice."""
    net = Net(limits=Limits(max_inflight=2))
    held, settled = _holds(net)
    m1 = net.subscriber("m1", ("$share/g/t", 1))
    m2 = net.subscriber("m2", ("$share/g/t", 1))
    _publish(net, "t", 8, qos=1)
    every = collections.Counter(b"%d" % i for i in range(8))
    assert held == every and not settled
    first = _pids(m2)
    for _, pid in first:
        m2.receive_data(mqttraw.puback(pid), 1.0)
    assert settled == collections.Counter(p for p, _ in first)
    m1.connection_lost(2.0)  # (its four go to m2: still waited for)
    assert settled == collections.Counter(p for p, _ in first)
    _acked(m2, 3.0)
    assert settled == every and held == every


def test_each_hold_and_its_settle_name_the_same_group_and_say_whether_the_member_is_clean():
    """The mesh keeps a node's own message that a clean member holds in its store, per group
    (mesh/routing/custody.py ``hold_own``), and lets it go at the settle of the same group:
    two groups on one filter, a clean member in one and a persistent one in the other; every
    (message, group) held once is settled once under that group, whether by a PUBACK or by
    the clean member's connection ending."""
    net = Net(limits=Limits(max_inflight=4))
    held: collections.Counter = collections.Counter()
    settled: collections.Counter = collections.Counter()
    shared = net.broker.shared
    shared.hold = lambda m, share, clean: held.update([(m.payload, share, clean)])
    shared.settle = lambda m, share: settled.update([(m.payload, share)])
    a = net.subscriber("a", ("$share/ga/t", 1))
    b = net.subscriber("b", ("$share/gb/t", 1), clean=False)
    _publish(net, "t", 3, qos=1)
    assert held == collections.Counter(
        [(b"%d" % i, "$share/ga/t", True) for i in range(3)] + [(b"%d" % i, "$share/gb/t", False) for i in range(3)]
    )
    for _, pid in _pids(b):
        b.receive_data(mqttraw.puback(pid), 1.0)
    assert settled == collections.Counter((b"%d" % i, "$share/gb/t") for i in range(3))
    assert len(_pids(a)) == 3
    a.connection_lost(2.0)  # (the only member of ga: what it held goes to nobody here)
    assert settled == collections.Counter((b"%d" % i, g) for i in range(3) for g in ("$share/ga/t", "$share/gb/t"))


def test_qos2_settles_at_pubrec_and_a_full_queue_or_an_ended_session_settles_what_it_drops():
    net = Net(limits=Limits(max_inflight=1, max_queued=1))
    held, settled = _holds(net)
    m = net.subscriber("m", ("$share/g/t", 2))
    _publish(net, "t", 3, qos=2)  # one in flight, one queued, then the oldest queued dropped: settled
    assert held == collections.Counter([b"0", b"1", b"2"]) and settled == collections.Counter([b"1"])
    [(payload, pid)] = _pids(m)
    m.receive_data(mqttraw.pubrec(pid), 1.0)  # the member owns it now
    assert settled[payload] == 1
    m.receive_data(mqttraw.pubcomp(pid), 1.0)  # (no second settle; the queued one is sent)
    assert settled[payload] == 1
    [(last, _)] = _pids(m)
    m.connection_lost(2.0)  # a clean session: its QoS 2 in flight goes with it [MQTT-4.8.2-5]
    assert settled == collections.Counter([b"0", b"1", b"2"]) and net.broker.shared.abandoned == 1


def test_a_move_to_a_member_granted_qos0_settles_at_once():
    net = Net()
    held, settled = _holds(net)
    m1 = net.subscriber("m1", ("$share/g/t", 1))
    _publish(net, "t", 1, qos=1)
    m0 = net.subscriber("m0", ("$share/g/t", 0))
    m1.connection_lost(1.0)  # (to m0, at QoS 0: nothing more to wait for)
    assert [p for p, _ in _pids(m0)] == [b"0"]
    assert held == settled == collections.Counter([b"0"])


class _Interest:
    """A mesh port that records what the node tells the mesh of its filters."""

    def __init__(self) -> None:
        self.told: list[tuple[str, str]] = []

    def filter_added(self, topic_filter: str) -> None:
        self.told.append(("+", topic_filter))

    def filter_removed(self, topic_filter: str) -> None:
        self.told.append(("-", topic_filter))

    def published(self, msg):
        return ()

    def first_here(self, msg) -> bool:
        return True

    def comes_later(self, msg) -> bool:
        return False

    def hold(self, msg) -> None:
        pass

    def settle(self, msg) -> None:
        pass

    def online_elsewhere(self, share: str) -> bool:
        return False

    def to_group(self, msg, share: str) -> bool:
        return False


def test_a_group_tells_the_mesh_of_its_members_by_powers_of_two_and_of_none_connected():
    """What each membership change costs in interest changes: the first member, the 2nd and
    the 4th connected one (WEIGHT), none for the 3rd and 5th; a persistent member alone and
    offline makes the group QUEUED, its return makes it served again; the last one gone,
    the group is withdrawn."""
    from mqttmesh.broker import BrokerPorts
    from mqttmesh.shared import QUEUED, WEIGHT

    mesh = _Interest()
    net = Net(ports=BrokerPorts(mesh=mesh))  # type: ignore[arg-type]
    share = "$share/g/t"
    members = [net.subscriber(f"m{i}", (share, 1)) for i in range(5)]
    assert mesh.told == [("+", share), ("-", share), ("+", share + WEIGHT + "2")] + [
        ("-", share + WEIGHT + "2"),
        ("+", share + WEIGHT + "4"),
    ]
    for i, m in enumerate(members):
        m.connection_lost(1.0 + i)
    assert mesh.told[-1] == ("-", share)
    mesh.told.clear()
    p = net.subscriber("p", (share, 1), clean=False)
    p.connection_lost(2.0)
    assert mesh.told == [("+", share), ("-", share), ("+", share + QUEUED)]
    net.connect("p", 3.0, clean=False, expect=b"\x20\x02\x01\x00")
    assert mesh.told[-2:] == [("-", share + QUEUED), ("+", share)]


def _resend(root: tuple[str, int], seq: int, qos: int = 1):
    """A re-send of message ``root`` by node r (mesh/routing/custody.py ``_group_copy``), as a
    node receives it: for the group g/t only, its root named first (shared.resend_mark)."""
    from mqttmesh.message import Message
    from mqttmesh.shared import resend_mark

    m = Message("t", b"x", qos, False, "r", seq, "p", 0.0)
    m.shares = (resend_mark(root), "$share/g/t")
    return m


def _two_connected_members(shared):
    """Two connected replicated sessions, a then b, members of group ``g`` on filter ``t``."""
    from mqttmesh.mesh.cluster.replica_sessions import MeshSession

    a, b = MeshSession("a", Limits()), MeshSession("b", Limits())
    for s in (a, b):
        s.attach(FakeChannel(), 0.0)
        shared.join(s, "g", "t", 1)
    return a, b, shared.groups[("g", "t")]


def test_a_resend_does_not_reach_a_member_that_has_or_had_its_root_unless_it_gave_it_away():
    """A message re-sent under a new id (its member's node died, or its member left holding
    it) names the message it re-sends (its root): a member that still has the root, or took
    it, is not given it again (the fault harness's QoS 2 twice to one member, MQTT 5, 7 nodes,
    seed 2); one that gave the root away to another member (an offline persistent member)
    takes it; and once a member took a re-send, the root itself is a duplicate there."""
    from mqttmesh.mesh.cluster.replica_sessions import MeshSession
    from mqttmesh.message import Message
    from mqttmesh.shared import SharedSubscriptions, root_of, take_entries

    shared = SharedSubscriptions("round_robin")
    a, b, group = _two_connected_members(shared)
    root = Message("t", b"x", 1, False, "o", 7, "p", 0.0)
    assert root_of(root) == ("o", 7) and root_of(_resend(("o", 7), 1)) == ("o", 7)
    assert shared.deliver(group, root) is a and ("o", 7) in a.ids  # (in flight at a)
    for seq in (1, 2):  # re-sent twice: a has it, neither copy goes to b
        assert shared.deliver(group, _resend(("o", 7), seq)) is a
    assert not b.ids and shared.kept_once == 2
    a.on_puback(next(iter(a.inflight)), 1.0)  # a took it: it had it
    assert ("o", 7) in a.done and shared.deliver(group, _resend(("o", 7), 3)) is a and not b.ids
    # a message an offline persistent member gave away comes back to it as a re-send: taken
    c = MeshSession("c", Limits())
    c.attach(FakeChannel(), 0.0)
    shared.join(c, "g", "u", 1)
    other = shared.groups[("g", "u")]
    first = Message("u", b"y", 1, False, "o", 8, "p", 0.0)
    shared.deliver(other, first)
    c.detach()
    [entry] = take_entries(c)
    assert entry.msg is first and not c.had(("o", 8))
    back = _resend(("o", 8), 4)
    back.topic = "u"
    back.shares = (back.shares[0], "$share/g/u")
    assert shared.deliver(other, back) is c and c.had(("o", 8)) and c.queue
    # the root reaching a member after its re-send: a duplicate there
    d = MeshSession("d", Limits())
    d.attach(FakeChannel(), 0.0)
    shared.join(d, "h", "t", 1)
    group_h = shared.groups[("h", "t")]
    took = _resend(("o", 9), 5)
    took.shares = (took.shares[0], "$share/h/t")
    assert shared.deliver(group_h, took) is d and len(d.inflight) == 1
    d.deliver(Message("t", b"x", 1, False, "o", 9, "p", 0.0), 1)
    assert len(d.inflight) == 1 and not d.queue


def test_a_message_handed_back_to_the_member_that_gave_it_away_goes_on_to_another():
    """A persistent member whose client left handed a message to another member; that one's
    client left too before acknowledging it: the message must not go back to the first one,
    whose session settled its id when it gave it away and would drop it as a duplicate (lost
    for every member: the simulator's shared-persistent-publishers-7-harsh, seed 35, a QoS 2
    message). With no other member here it goes to another node's (``elsewhere``); a member
    that still has it keeps it."""
    from mqttmesh.mesh.cluster.replica_sessions import MeshSession
    from mqttmesh.message import Message
    from mqttmesh.shared import SharedSubscriptions, take_entries

    shared = SharedSubscriptions("round_robin")
    sent: list[tuple[Message, str]] = []
    shared.elsewhere = lambda msg, share, now: sent.append((msg, share)) is None
    a, b, group = _two_connected_members(shared)
    m = Message("t", b"x", 1, False, "o", 7, "p", 0.0)
    assert shared.deliver(group, m) is a
    a.detach()  # (its client left: what it held goes to b, connected)
    shared.redispatch(a, take_entries(a), 1.0)
    assert ("o", 7) in b.ids and ("o", 7) in a.done
    b.detach()  # (b's too, before its PUBACK: a, offline, would queue it, but settled it)
    shared.redispatch(b, take_entries(b), 2.0)
    assert not a.ids and not b.ids
    assert [(msg.origin, msg.seq, share) for msg, share in sent] == [("o", 7, "$share/g/t")]
    assert shared.dropped == 0
    # a member that has the message keeps it: it does not go to a second one
    c = MeshSession("c", Limits())
    shared.join(c, "g", "t", 1)
    c.deliver(Message("t", b"y", 1, False, "o", 8, "p", 0.0), 1)
    d = Message("t", b"y", 1, False, "o", 8, "p", 0.0)
    assert shared.deliver(group, d, but=a, moved=True) is c and len(c.queue) == 1 and not b.ids


def test_with_every_member_away_a_qos1_message_goes_to_one_whose_session_queues_it():
    """[MQTT-4.8.2-3]: a member gets a message at its granted QoS. With every member away, one
    granted QoS 0 takes a QoS 1/2 message at QoS 0, which its session drops (an absent client
    gets no QoS 0 message unless ``limits.queue_qos0``): the simulator's finding 32, acknowledged
    and lost while a member granted QoS 1 would have queued it. The choice among absent members
    takes those whose session queues it; with none, it goes to nobody, counted."""
    from mqttmesh.message import Message
    from mqttmesh.session import Session
    from mqttmesh.shared import SharedSubscriptions

    shared = SharedSubscriptions("round_robin")
    zero, one = Session("zero", False, Limits()), Session("one", False, Limits())
    shared.join(zero, "g", "t", 0)
    shared.join(one, "g", "t", 1)
    group = shared.groups[("g", "t")]
    for seq in range(1, 5):  # (round robin would have given every other one to ``zero``)
        assert shared.deliver(group, Message("t", b"x", 1, False, "o", seq, "p", 0.0)) is one
    assert len(one.queue) == 4 and not zero.queue and shared.dropped == 0
    # a QoS 0 message may still go to either: neither queues it
    shared.deliver(group, Message("t", b"y", 0, False, "o", 5, "p", 0.0))
    alone = SharedSubscriptions("round_robin")
    alone.join(zero, "h", "t", 0)
    assert alone.deliver(alone.groups[("h", "t")], Message("t", b"z", 1, False, "o", 6, "p", 0.0)) is None
    assert not zero.queue and alone.dropped == 1  # (to nobody: counted)


def test_a_group_whose_members_are_away_and_granted_qos0_only_is_told_to_the_mesh_as_none():
    """Simulator, finding 34 (fuzz seed 185): a node whose only member of a group was a
    persistent session granted QoS 0, its client gone, told the mesh QUEUED; an origin chose
    it for a QoS 1 message (its member still connected when it chose), which came to a session
    that keeps no QoS 0 message for an absent client: dropped, acknowledged, while another
    node's member was connected. Such a group takes no message here, so the node tells the
    mesh it has none (the mesh sends what it was chosen for on to another node's member,
    routing/shares.py ``_served_elsewhere``); a member granted QoS 1 away makes it QUEUED."""
    from mqttmesh.broker import BrokerPorts
    from mqttmesh.shared import QUEUED

    mesh = _Interest()
    net = Net(ports=BrokerPorts(mesh=mesh))  # type: ignore[arg-type]
    share = "$share/g/t"
    zero = net.subscriber("zero", (share, 0), clean=False)
    zero.connection_lost(2.0)
    assert mesh.told == [("+", share), ("-", share)]
    back = net.connect("zero", 3.0, clean=False, expect=b"\x20\x02\x01\x00")
    assert mesh.told[-1] == ("+", share)
    one = net.subscriber("one", (share, 1), clean=False)
    one.connection_lost(4.0)
    back.connection_lost(5.0)  # (both away: one of them queues QoS 1/2)
    assert mesh.told[-2:] == [("-", share), ("+", share + QUEUED)]


def test_a_qos2_message_whose_sent_step_was_unconfirmed_stays_with_its_member_when_it_leaves():
    """[MQTT-4.8.2-4] A persistent member's node reported a QoS 2 message "sent" to the
    session's other holders, and its frame waited for them (the gate); the client left (its
    node cut off from its majority, fenced) before they confirmed. Whether a holder had the
    step is unknown: one that had it serves the message to the client as in flight if the
    client claims on its side. So the message stays this member's (queued, sent afresh when
    it returns), not handed to another member: the fault harness, 7 nodes, 3.1.1, shared,
    seed 1, had pub2:2464 at two members so. A QoS 1 one held the same way, and anything
    queued that was never sent, goes on as before."""
    from mqttmesh.mesh.cluster.replica_sessions import MeshSession
    from mqttmesh.message import Message
    from mqttmesh.shared import SharedSubscriptions, take_entries

    class Gated(FakeChannel):  # (the gate holds every frame: channel_held.py)
        def write_gated(self, frame: bytes, ticket: int) -> None:
            pass

    shared = SharedSubscriptions("round_robin")
    a = MeshSession("a", Limits(), on_settled=lambda sess, key, state, pid, m=None: None)
    b = MeshSession("b", Limits())
    a.attach(Gated(), 0.0)
    b.attach(FakeChannel(), 0.0)
    for s in (a, b):
        shared.join(s, "g", "t", 2)
    group = shared.groups[("g", "t")]
    q2 = Message("t", b"two", 2, False, "o", 7, "p", 0.0)
    q1 = Message("t", b"one", 1, False, "o", 8, "p", 0.0)
    assert shared.deliver(group, q2, but=b) is a  # ("sent" reported, unconfirmed: the frame waits)
    assert shared.deliver(group, q1, but=b) is a  # (framed behind it)
    assert shared.deliver(group, Message("t", b"later", 2, False, "o", 9, "p", 0.0), but=b) is a
    assert a.version > a.safe_version and sorted(a.unreleased) == [1, 2, 3]
    a.detach()
    assert not a.inflight and [e.msg.seq for e in a.queue] == [7, 8, 9]
    taken = take_entries(a, lambda g: shared.online_besides(a, g))
    assert [e.msg.seq for e in taken] == [8]  # (the QoS 1 one; both QoS 2 ones stay)
    assert [e.msg.seq for e in a.queue] == [7, 9] and all(a.keeps(e) for e in a.queue)
    shared.redispatch(a, taken, 1.0)
    assert ("o", 8) in b.ids and ("o", 7) not in b.ids
    # back: sent afresh, and once its id settles the mark goes with it
    a.attach(Gated(), 2.0)
    assert sorted(e.msg.seq for e in a.inflight.values()) == [7, 9] and not a.queue
    for pid in list(a.inflight):
        a.on_pubrec(pid)
        a.on_pubcomp(pid, 3.0)
    assert not a.maybe_sent and not a.inflight
    # a message queued and never sent goes to another member as before
    a.detach()
    fresh = Message("t", b"new", 2, False, "o", 10, "p", 0.0)
    assert shared.deliver(group, fresh, but=b) is a and [e.msg.seq for e in a.queue] == [10]
    assert [e.msg.seq for e in take_entries(a, lambda g: shared.online_besides(a, g))] == [10]
