"""PUBLISH in both directions: acknowledgements, QoS, DUP, order, inflight window."""

from __future__ import annotations

import pytest

from support import mqttraw
from support.mqttraw import PINGRESP, PUBACK, PUBCOMP, PUBREC

pytestmark = pytest.mark.process


def test_qos0_publish_gets_no_response(broker, clients):
    """[MQTT-3.3.4-1] QoS 0: no response; the next packet is the PINGRESP."""
    c = clients(broker, client_id="q0")
    c.send(mqttraw.publish("q/0", b"x", qos=0))
    c.send(mqttraw.PINGREQ_BYTES)
    assert c.recv().type == PINGRESP


def test_qos1_publish_gets_puback_with_its_packet_id(broker, clients):
    """[MQTT-3.3.4-1] QoS 1 -> PUBACK (40 02 id) [MQTT-2.3.1-6]."""
    c = clients(broker, client_id="q1")
    c.send(mqttraw.publish("q/1", b"x", qos=1, pid=0x1234))
    p = c.recv()
    assert (p.type, p.flags, p.body) == (PUBACK, 0, b"\x12\x34")


def test_qos2_flow_pubrec_then_pubrel_pubcomp(broker, clients):
    """[MQTT-3.3.4-1] QoS 2 -> PUBREC (50 02 id); PUBREL -> PUBCOMP (70 02 id) [MQTT-4.3.3-2]."""
    c = clients(broker, client_id="q2")
    c.send(mqttraw.publish("q/2", b"x", qos=2, pid=0xABCD))
    p = c.recv()
    assert (p.type, p.flags, p.body) == (PUBREC, 0, b"\xab\xcd")
    c.send(mqttraw.pubrel(0xABCD))
    p = c.recv()
    assert (p.type, p.flags, p.body) == (PUBCOMP, 0, b"\xab\xcd")


def test_pubrel_for_unknown_packet_id_still_gets_pubcomp(broker, clients):
    """[MQTT-4.3.3-2] respond to a PUBREL with PUBCOMP with the same identifier (the
    client may be re-sending a PUBREL whose PUBCOMP got lost)."""
    c = clients(broker, client_id="q2-rel")
    c.send(mqttraw.pubrel(77))
    p = c.recv()
    assert (p.type, p.body) == (PUBCOMP, b"\x00\x4d")


def test_qos2_duplicate_before_pubrel_is_delivered_once(broker, clients):
    """[MQTT-4.3.3-2] until PUBREL, a re-sent PUBLISH (DUP=1, same id) gets PUBREC again
    and is not delivered again; after PUBCOMP the id is free and a new PUBLISH with it is
    a new message."""
    sub = clients(broker, client_id="dd-sub")
    assert sub.sub(1, ("dd/#", 2)) == [2]
    pub = clients(broker, client_id="dd-pub")
    pub.send(mqttraw.publish("dd/t", b"once", qos=2, pid=5))
    pub.expect_ack(PUBREC, 5)
    pub.send(mqttraw.publish("dd/t", b"once", qos=2, pid=5, dup=True))
    pub.expect_ack(PUBREC, 5)
    pub.send(mqttraw.publish("dd/t", b"once", qos=2, pid=5, dup=True))
    pub.expect_ack(PUBREC, 5)
    pub.send(mqttraw.pubrel(5))
    pub.expect_ack(PUBCOMP, 5)
    pub.pub("dd/t", b"second", qos=2, pid=5)  # the id is reusable after PUBCOMP
    got = sub.publishes(2)
    assert [p.payload for p in got] == [b"once", b"second"]
    for p in got:
        sub.ack(p)
        sub.expect_ack(mqttraw.PUBREL, p.packet_id)
        sub.send(mqttraw.pubcomp(p.packet_id))
    sub.expect_silence(0.3)


def test_qos1_same_packet_id_after_puback_is_a_new_publication(broker, clients):
    """[MQTT-4.3.2-2] after PUBACK, a PUBLISH with the same id is new, whatever its DUP."""
    sub = clients(broker, client_id="d1-sub")
    assert sub.sub(1, ("d1/#", 1)) == [1]
    pub = clients(broker, client_id="d1-pub")
    pub.pub("d1/t", b"a", qos=1, pid=9)
    pub.pub("d1/t", b"a", qos=1, pid=9, dup=True)
    got = sub.publishes(2)
    assert [p.payload for p in got] == [b"a", b"a"]


@pytest.mark.parametrize("pub_qos", [0, 1, 2])
def test_delivery_qos_is_min_of_publish_and_granted(broker, clients, pub_qos):
    """[MQTT-3.8.4-6] outbound QoS = min(publish QoS, granted QoS); QoS 0 has DUP=0
    [MQTT-4.3.1-1] and QoS 1/2 carry a non-zero packet id [MQTT-2.3.1-1]."""
    subs = {}
    for granted in (0, 1, 2):
        c = clients(broker, client_id=f"min-{granted}")
        assert c.sub(1, ("min/t", granted)) == [granted]
        subs[granted] = c
    pub = clients(broker, client_id="min-pub")
    pub.pub("min/t", b"payload", qos=pub_qos, pid=3)
    for granted, c in subs.items():
        (p,) = c.publishes(1)
        assert (p.topic, p.payload, p.qos, p.dup, p.retain) == (
            "min/t",
            b"payload",
            min(pub_qos, granted),
            False,
            False,
        )
        if p.qos:
            assert p.packet_id != 0
        else:
            assert p.body == mqttraw.s("min/t") + b"payload"  # no packet id [MQTT-2.3.1-5]


def test_overlapping_subscriptions_give_one_copy_at_the_highest_qos(broker, clients):
    """[MQTT-3.3.5-1] one message per matching PUBLISH, at the maximum QoS of all the
    client's matching subscriptions."""
    sub = clients(broker, client_id="ov-sub")
    assert sub.sub(1, ("ov/+", 0), ("ov/#", 2), ("ov/a", 1), ("#", 0)) == [0, 2, 1, 0]
    pub = clients(broker, client_id="ov-pub")
    pub.pub("ov/a", b"one", qos=2, pid=1)
    pub.pub("ov/a", b"two", qos=1, pid=2)
    first, second = sub.publishes(2)
    assert (first.payload, first.qos) == (b"one", 2)
    assert (second.payload, second.qos) == (b"two", 1)
    sub.expect_silence(0.3)


@pytest.mark.parametrize("qos", [1, 2])
def test_dup_flag_is_not_propagated(broker, clients, qos):
    """[MQTT-3.3.1-3] an incoming DUP=1 does not make the outgoing PUBLISH DUP=1."""
    sub = clients(broker, client_id="dup-sub")
    assert sub.sub(1, ("dup/#", 2)) == [2]
    pub = clients(broker, client_id="dup-pub")
    pub.pub("dup/t", b"re-sent", qos=qos, pid=11, dup=True)
    (p,) = sub.publishes(1)
    assert (p.payload, p.qos, p.dup) == (b"re-sent", qos, False)


def test_publish_reaches_only_matching_filters(broker, clients):
    """[MQTT-3.3.2-3] the topic of a delivered PUBLISH matches the subscription (4.7)."""
    sub = clients(broker, client_id="match-sub")
    assert sub.sub(1, ("m/+/x", 0), ("n/#", 0)) == [0, 0]
    pub = clients(broker, client_id="match-pub")
    for topic in ("m/a/x", "m/a/y", "m/x", "m/a/x/z", "n", "n/1/2", "N/1", "m//x", "x/n"):
        pub.send(mqttraw.publish(topic, topic.encode()))
    pub.pub("n/end", b"end", qos=1)
    got = [p.topic for p in sub.publishes(5)]
    assert got == ["m/a/x", "n", "n/1/2", "m//x", "n/end"]


def test_1000_qos1_messages_arrive_in_publish_order(broker, clients):
    """[MQTT-4.6.0-6] same topic, same QoS, one publisher: the subscriber gets them in
    the order they were published (and every one exactly once)."""
    n = 1000
    sub = clients(broker, client_id="order-sub")
    assert sub.sub(1, ("order/t", 1)) == [1]
    pub = clients(broker, client_id="order-pub")
    pub.send(b"".join(mqttraw.publish("order/t", str(i).encode(), qos=1, pid=i + 1) for i in range(n)))
    payloads = []
    while len(payloads) < n:
        (p,) = sub.publishes(1)
        assert p.qos == 1
        payloads.append(int(p.payload))
        sub.ack(p)
    assert payloads == list(range(n))
    acked = [pub.recv() for _ in range(n)]
    assert all(p.type == PUBACK for p in acked)
    assert sorted(p.packet_id for p in acked) == list(range(1, n + 1))
    sub.expect_silence(0.2)


def test_inflight_window_limits_unacknowledged_messages(broker_factory, clients):
    """--max-inflight 5: a subscriber that does not acknowledge gets exactly 5 QoS 1
    messages; each PUBACK lets one more out, in order [MQTT-4.6.0-6]."""
    b = broker_factory("--max-inflight", "5")
    sub = clients(b, client_id="win-sub")
    assert sub.sub(1, ("win/t", 1)) == [1]
    pub = clients(b, client_id="win-pub")
    for i in range(12):
        pub.pub("win/t", str(i).encode(), qos=1, pid=i + 1)
    first = sub.publishes(5)
    assert [int(p.payload) for p in first] == [0, 1, 2, 3, 4]
    assert len({p.packet_id for p in first}) == 5  # unused ids [MQTT-2.3.1-2]
    sub.expect_silence(0.5)
    sub.ack(first[0])
    sub.ack(first[1])
    more = sub.publishes(2)
    assert [int(p.payload) for p in more] == [5, 6]
    sub.expect_silence(0.3)
    for p in first[2:] + more:
        sub.ack(p)
    rest = sub.publishes(5)
    assert [int(p.payload) for p in rest] == [7, 8, 9, 10, 11]
    sub.expect_silence(0.3)


def test_inflight_window_counts_qos2_until_pubcomp(broker_factory, clients):
    """--max-inflight 2 with QoS 2: PUBREC -> PUBREL [MQTT-4.3.3-1]; the next message
    goes out once a flow completes."""
    b = broker_factory("--max-inflight", "2")
    sub = clients(b, client_id="w2-sub")
    assert sub.sub(1, ("w2/t", 2)) == [2]
    pub = clients(b, client_id="w2-pub")
    for i in range(4):
        pub.pub("w2/t", str(i).encode(), qos=2, pid=i + 1)
    a, b2 = sub.publishes(2)
    assert [a.payload, b2.payload] == [b"0", b"1"]
    sub.expect_silence(0.3)
    sub.send(mqttraw.pubrec(a.packet_id))
    rel = sub.expect_ack(mqttraw.PUBREL, a.packet_id)
    assert rel.flags == 2  # PUBREL fixed header 0110 0010 [MQTT-3.6.1-1]
    sub.send(mqttraw.pubcomp(a.packet_id))
    (c,) = sub.publishes(1)
    assert c.payload == b"2"


def test_unsubscribe_stops_delivery_and_unsuback_always_comes(broker, clients):
    """[MQTT-3.10.4-2] no new messages after the subscription is deleted;
    [MQTT-3.10.4-4] UNSUBACK with the same id; [MQTT-3.10.4-5] even if nothing matched;
    [MQTT-3.10.4-1] filters are compared character by character."""
    sub = clients(broker, client_id="us-sub")
    assert sub.sub(1, ("us/#", 1), ("us/a", 1)) == [1, 1]
    pub = clients(broker, client_id="us-pub")
    sub.send(mqttraw.unsubscribe(0x0102, "us/+", "nothing/here"))
    p = sub.recv()
    assert (p.type, p.flags, p.body) == (mqttraw.UNSUBACK, 0, b"\x01\x02")
    pub.pub("us/a", b"still", qos=1)  # "us/+" is not "us/#": both subscriptions remain
    (p,) = sub.publishes(1)
    assert p.payload == b"still"
    sub.ack(p)
    sub.unsub(3, "us/#", "us/a")  # [MQTT-3.10.4-6] several filters, one UNSUBACK
    pub.pub("us/a", b"gone", qos=1, pid=2)
    pub.pub("us/b", b"gone", qos=1, pid=3)
    sub.expect_silence(0.4)


def test_subscribe_return_codes_in_order(broker_factory, clients):
    """[MQTT-3.9.3-1] one return code per filter, in order; [MQTT-3.8.4-5] the granted
    QoS; [MQTT-3.8.4-2] same packet id. --max-qos 1 grants at most 1 [MQTT-3.8.4-6]."""
    b = broker_factory("--max-qos", "1")
    c = clients(b, client_id="codes")
    c.send(mqttraw.subscribe(0x4242, ("a/0", 0), ("a/2", 2), ("a/1", 1), ("a/#", 2)))
    p = c.recv()
    assert (p.type, p.flags, p.body) == (mqttraw.SUBACK, 0, b"\x42\x42\x00\x01\x01\x01")
    pub = clients(b, client_id="codes-pub")
    pub.pub("a/2", b"x", qos=2)
    (m,) = c.publishes(1)
    assert m.qos == 1  # min(2, granted 1)


def test_resubscribe_replaces_the_subscription(broker, clients):
    """[MQTT-3.8.4-3] an identical filter replaces the subscription (new QoS, one copy)."""
    c = clients(broker, client_id="rs")
    assert c.sub(1, ("rs/t", 2)) == [2]
    assert c.sub(2, ("rs/t", 0)) == [0]
    pub = clients(broker, client_id="rs-pub")
    pub.pub("rs/t", b"x", qos=2)
    (p,) = c.publishes(1)
    assert p.qos == 0
    c.expect_silence(0.3)


def test_publisher_receives_its_own_message_when_subscribed(broker, clients):
    """3.1.1 has no no-local option: a client subscribed to its own topic gets its message.
    [MQTT-4.5.0-1] every session with a matching subscription."""
    c = clients(broker, client_id="self")
    assert c.sub(1, ("self/t", 1)) == [1]
    c.send(mqttraw.publish("self/t", b"me", qos=1, pid=4))
    got = [c.recv(), c.recv()]
    types = sorted(p.type for p in got)
    assert types == [mqttraw.PUBLISH, PUBACK]
    (p,) = [p for p in got if p.type == mqttraw.PUBLISH]
    assert (p.payload, p.qos) == (b"me", 1)


def test_large_payload_roundtrip(broker, clients):
    """A 512 KiB payload (under the default 1 MiB limit) arrives byte for byte. [MQTT-4.5.0-1]"""
    payload = bytes(range(256)) * 2048
    sub = clients(broker, client_id="big-sub")
    assert sub.sub(1, ("big/t", 1)) == [1]
    pub = clients(broker, client_id="big-pub")
    pub.pub("big/t", payload, qos=1)
    (p,) = sub.publishes(1)
    assert p.payload == payload


def test_unsubscribe_completes_qos2_delivery_already_started(broker, clients):
    """[MQTT-3.10.4-3] a QoS 2 message sent before the UNSUBSCRIBE is still completed
    (PUBREC -> PUBREL -> PUBCOMP); QoS 1 likewise accepts its PUBACK."""
    sub = clients(broker, client_id="uc-sub")
    assert sub.sub(1, ("uc/#", 2)) == [2]
    pub = clients(broker, client_id="uc-pub")
    pub.pub("uc/a", b"two", qos=2, pid=1)
    pub.pub("uc/a", b"one", qos=1, pid=2)
    two, one = sub.publishes(2)
    sub.unsub(2, "uc/#")
    sub.send(mqttraw.pubrec(two.packet_id))
    rel = sub.expect_ack(mqttraw.PUBREL, two.packet_id)
    assert rel.flags == 2
    sub.send(mqttraw.pubcomp(two.packet_id))
    sub.send(mqttraw.puback(one.packet_id))
    sub.ping()
    pub.pub("uc/a", b"after", qos=1, pid=3)
    sub.expect_silence(0.3)


def test_max_awaiting_rel_limits_unreleased_qos2(broker_factory, clients):
    """--max-awaiting-rel 2: two QoS 2 messages awaiting PUBREL are fine; a third is a
    transient error that closes the connection [MQTT-4.8.0-2] and is not delivered."""
    b = broker_factory("--max-awaiting-rel", "2")
    sub = clients(b, client_id="ar-sub")
    assert sub.sub(1, ("ar/#", 0)) == [0]
    pub = clients(b, client_id="ar-pub")
    for i in (1, 2):
        pub.send(mqttraw.publish("ar/t", f"m{i}".encode(), qos=2, pid=i))
        pub.expect_ack(PUBREC, i)
    pub.send(mqttraw.publish("ar/t", b"m3", qos=2, pid=3))
    pub.expect_closed()
    got = sub.publishes(2)
    assert [p.payload for p in got] == [b"m1", b"m2"]
    sub.expect_silence(0.3)


def test_topics_are_matched_without_normalisation(broker, clients):
    """[MQTT-4.7.3-4] no Unicode normalisation: U+00E9 and 'e' + U+0301 are different
    topics; [MQTT-1.5.3-3] a leading U+FEFF is part of the name, not stripped."""
    sub = clients(broker, client_id="uni-sub")
    assert sub.sub(1, ("caf\u00e9", 1), ("\ufeffbom", 1), ("Ω/+", 1)) == [1, 1, 1]
    pub = clients(broker, client_id="uni-pub")
    pub.pub("cafe\u0301", b"decomposed", qos=1, pid=1)
    pub.pub("bom", b"no bom", qos=1, pid=2)
    pub.pub("caf\u00e9", b"composed", qos=1, pid=3)
    pub.pub("\ufeffbom", b"with bom", qos=1, pid=4)
    pub.pub("Ω/ß", b"greek", qos=1, pid=5)
    got = sub.publishes(3)
    assert [(p.topic, p.payload) for p in got] == [
        ("caf\u00e9", b"composed"),
        ("\ufeffbom", b"with bom"),
        ("Ω/ß", b"greek"),
    ]
    assert got[1].body.startswith(mqttraw.s("\ufeffbom"))  # sent back byte for byte
    sub.expect_silence(0.3)


def test_empty_levels_and_leading_slash_are_distinct(broker, clients):
    """4.7: '/a' has an empty first level ('+/a' matches it, 'a' does not); 'a/' has an
    empty last level ('a/+' matches it).
    [MQTT-4.7.1-3] '+' may be the first or last level."""
    sub = clients(broker, client_id="lv-sub")
    assert sub.sub(1, ("+/a", 0), ("lv/+", 0)) == [0, 0]
    pub = clients(broker, client_id="lv-pub")
    for topic in ("/a", "a", "lv/", "lv", "lv//"):
        pub.send(mqttraw.publish(topic, topic.encode()))
    pub.pub("lv/end", b"end", qos=1)
    assert [p.topic for p in sub.publishes(3)] == ["/a", "lv/", "lv/end"]
    sub.expect_silence(0.2)


def test_longest_topic_name_65535_bytes(broker, clients):
    """[MQTT-4.7.3-3] a topic may be up to 65535 bytes of UTF-8; such a PUBLISH (well
    under the default 1 MiB packet limit) is routed like any other."""
    topic = "t/" + "é" * 32766 + "x"  # 2 + 65532 + 1 bytes
    assert len(topic.encode()) == 65535
    sub = clients(broker, client_id="long-sub")
    assert sub.sub(1, (topic, 1), ("t/+", 0)) == [1, 0]
    pub = clients(broker, client_id="long-pub")
    pub.pub(topic, b"far", qos=1)
    (p,) = sub.publishes(1)
    assert (p.topic, p.payload, p.qos) == (topic, b"far", 1)


def test_routing_follows_subscription_changes_immediately(broker, clients):
    """[MQTT-3.3.5-1]/[MQTT-3.10.4-2]: after a topic has been routed once, later
    SUBSCRIBEs and UNSUBSCRIBEs of other clients on overlapping filters take effect for
    the very next PUBLISH; one client's UNSUBSCRIBE does not affect another's."""
    a = clients(broker, client_id="rc-a")
    b = clients(broker, client_id="rc-b")
    pub = clients(broker, client_id="rc-pub")
    assert a.sub(1, ("rc/x/y", 1)) == [1]
    pub.pub("rc/x/y", b"1", qos=1, pid=1)
    assert [p.payload for p in a.publishes(1)] == [b"1"]
    assert b.sub(1, ("rc/+/y", 1), ("rc/#", 0)) == [1, 0]
    pub.pub("rc/x/y", b"2", qos=1, pid=2)
    assert [p.payload for p in a.publishes(1)] == [b"2"]
    (p,) = b.publishes(1)
    assert (p.payload, p.qos) == (b"2", 1)
    b.ack(p)
    a.unsub(2, "rc/x/y")
    b.unsub(2, "rc/+/y")
    pub.pub("rc/x/y", b"3", qos=1, pid=3)
    (p,) = b.publishes(1)
    assert (p.payload, p.qos) == (b"3", 0)  # only rc/# (QoS 0) is left for b
    a.expect_silence(0.3)
    assert a.sub(3, ("rc/x/y", 1)) == [1]
    pub.pub("rc/x/y", b"4", qos=1, pid=4)
    assert [p.payload for p in a.publishes(1)] == [b"4"]
    assert [p.payload for p in b.publishes(1)] == [b"4"]
