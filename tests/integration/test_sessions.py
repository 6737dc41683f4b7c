"""Persistent sessions (CleanSession=0): 3.1.2.4, 4.1, 4.4 (in memory, no --data-dir)."""

from __future__ import annotations

import pytest

from support import mqttraw
from support.integration import control_roundtrip, wait_log
from support.mqttraw import PUBLISH, PUBREL

pytestmark = pytest.mark.process


def offline_subscriber(broker, clients, client_id, *filters):
    """Connect with CleanSession=0, subscribe, DISCONNECT: a stored session, offline."""
    c = clients(broker, client_id=client_id, clean=False)
    assert c.sub(1, *filters) == [q for _, q in filters]
    c.send(mqttraw.DISCONNECT_BYTES)
    c.expect_closed()


def test_subscriptions_kept_and_qos1_qos2_queued_while_offline(broker, clients):
    """[MQTT-3.1.2-4] the session resumes (session present [MQTT-3.2.2-2]);
    [MQTT-3.1.2-5] QoS 1 and 2 messages are stored while offline, QoS 0 are not (by
    default), and they arrive in order [MQTT-4.6.0-6]; the kept subscription delivers
    live messages without a new SUBSCRIBE."""
    offline_subscriber(broker, clients, "ps", ("ps/#", 2))
    pub = clients(broker, client_id="ps-pub")
    pub.pub("ps/a", b"q1-a", qos=1, pid=1)
    pub.pub("ps/a", b"q0", qos=0)
    pub.pub("ps/a", b"q2", qos=2, pid=2)
    pub.pub("ps/a", b"q1-b", qos=1, pid=3)
    c = clients(broker, client_id="ps", clean=False)
    assert c.session_present == 1
    got = c.publishes(3)
    assert [(p.payload, p.qos, p.dup) for p in got] == [(b"q1-a", 1, False), (b"q2", 2, False), (b"q1-b", 1, False)]
    for p in got:
        c.ack(p)
    c.expect_ack(PUBREL, got[1].packet_id)
    c.send(mqttraw.pubcomp(got[1].packet_id))
    pub.pub("ps/b", b"live", qos=1, pid=4)
    (p,) = c.publishes(1)
    assert p.payload == b"live"
    c.ack(p)
    c.expect_silence(0.3)


def test_qos0_queued_for_offline_session_with_queue_qos0(broker_factory, clients):
    """--queue-qos0 true: QoS 0 messages are kept for an offline persistent session too.
    [MQTT-3.1.2-5] requires QoS 1/2 only; QoS 0 is optional."""
    b = broker_factory("--queue-qos0", "true")
    offline_subscriber(b, clients, "pq0", ("pq0/#", 1))
    pub = clients(b, client_id="pq0-pub")
    for i in range(3):
        pub.send(mqttraw.publish("pq0/t", f"zero-{i}".encode(), qos=0))
    pub.pub("pq0/t", b"one", qos=1)
    c = clients(b, client_id="pq0", clean=False)
    got = c.publishes(4)
    assert [(p.payload, p.qos) for p in got] == [(b"zero-0", 0), (b"zero-1", 0), (b"zero-2", 0), (b"one", 1)]


@pytest.mark.parametrize(
    "policy,expected",
    [
        ("oldest", [b"7", b"8", b"9"]),
        ("newest", [b"0", b"1", b"2"]),
    ],
)
def test_max_queued_with_drop_policy(broker_factory, clients, policy, expected):
    """--max-queued 3: ten QoS 1 messages to an offline session; 'oldest' keeps the last
    three, 'newest' the first three. Every publish is still acknowledged.
    [MQTT-3.1.2-5] within the limit; [MQTT-3.3.4-1] acks."""
    b = broker_factory("--max-queued", "3", "--drop-policy", policy)
    offline_subscriber(b, clients, "mq", ("mq/t", 1))
    pub = clients(b, client_id="mq-pub")
    for i in range(10):
        pub.pub("mq/t", str(i).encode(), qos=1, pid=i + 1)
    c = clients(b, client_id="mq", clean=False)
    got = c.publishes(3)
    assert [p.payload for p in got] == expected
    for p in got:
        c.ack(p)
    c.expect_silence(0.4)


def test_max_queued_zero_queues_nothing_and_keeps_publishers_working(broker_factory, clients):
    """--max-queued 0 (its documented minimum): nothing is queued for an offline session,
    the publisher is still acknowledged [MQTT-3.3.4-1] and stays connected."""
    b = broker_factory("--max-queued", "0", "--drop-policy", "oldest")
    offline_subscriber(b, clients, "mq0", ("mq0/t", 1))
    pub = clients(b, client_id="mq0-pub", timeout=2.0)
    pub.pub("mq0/t", b"dropped", qos=1)
    pub.ping()
    c = clients(b, client_id="mq0", clean=False)
    c.expect_silence(0.3)


def test_max_queued_zero_with_drop_newest(broker_factory, clients):
    """--max-queued 0 --drop-policy newest: nothing queued, publisher acknowledged.
    [MQTT-3.3.4-1]"""
    b = broker_factory("--max-queued", "0", "--drop-policy", "newest")
    offline_subscriber(b, clients, "mqn", ("mqn/t", 1))
    pub = clients(b, client_id="mqn-pub")
    pub.pub("mqn/t", b"dropped", qos=1)
    pub.ping()
    c = clients(b, client_id="mqn", clean=False)
    c.expect_silence(0.3)


def test_clean_session_1_discards_the_stored_session(broker, clients):
    """[MQTT-3.1.2-6] CleanSession=1 discards the previous session: no queued messages,
    no subscriptions, and a later CleanSession=0 connect finds nothing [MQTT-3.2.2-3]."""
    offline_subscriber(broker, clients, "cs", ("cs/#", 1))
    pub = clients(broker, client_id="cs-pub")
    pub.pub("cs/a", b"queued", qos=1)
    c = clients(broker, client_id="cs", clean=True)
    assert c.session_present == 0
    c.expect_silence(0.3)
    pub.pub("cs/a", b"after clean", qos=1, pid=2)
    c.expect_silence(0.3)
    c.send(mqttraw.DISCONNECT_BYTES)
    c.expect_closed()
    c = clients(broker, client_id="cs", clean=False)
    assert c.session_present == 0
    c.expect_silence(0.3)


def test_clean_session_ends_with_the_connection(broker, clients):
    """[MQTT-3.1.2-6] a CleanSession=1 session lasts as long as the connection: nothing
    is kept for it, and reconnecting with CleanSession=0 finds no session."""
    c = clients(broker, client_id="cl", clean=True)
    assert c.sub(1, ("cl/#", 1)) == [1]
    c.close()
    wait_log(broker, "'cl'", "connection closed by client")
    pub = clients(broker, client_id="cl-pub")
    pub.pub("cl/a", b"nobody", qos=1)
    c = clients(broker, client_id="cl", clean=False)
    assert c.session_present == 0
    c.expect_silence(0.3)


def test_unacknowledged_messages_resent_with_dup_in_order_on_reconnect(broker, clients):
    """[MQTT-4.4.0-1] on reconnect with CleanSession=0 the server re-sends unacknowledged
    PUBLISHes (DUP=1 [MQTT-3.3.1-1], original ids) and the PUBREL of a QoS 2 message
    whose PUBREC it had received; [MQTT-4.6.0-1] in the original order."""
    c = clients(broker, client_id="rd", clean=False)
    assert c.sub(1, ("rd/#", 2)) == [2]
    pub = clients(broker, client_id="rd-pub")
    pub.pub("rd/1", b"m1", qos=1, pid=1)
    pub.pub("rd/2", b"m2", qos=2, pid=2)
    pub.pub("rd/3", b"m3", qos=2, pid=3)
    pub.pub("rd/4", b"m4", qos=1, pid=4)
    pub.pub("rd/5", b"m5", qos=2, pid=5)
    m1, m2, m3, m4, m5 = c.publishes(5)
    assert [m.payload for m in (m1, m2, m3, m4, m5)] == [b"m1", b"m2", b"m3", b"m4", b"m5"]
    assert not any(m.dup for m in (m1, m2, m3, m4, m5))
    c.send(mqttraw.pubrec(m3.packet_id))  # m3 reached PUBREC; nothing else acknowledged
    c.expect_ack(PUBREL, m3.packet_id)
    c.close()

    c = clients(broker, client_id="rd", clean=False)
    assert c.session_present == 1
    got = [c.recv() for _ in range(5)]
    publishes = [p for p in got if p.type == PUBLISH]
    assert [(p.payload, p.qos, p.dup, p.packet_id) for p in publishes] == [
        (b"m1", 1, True, m1.packet_id),
        (b"m2", 2, True, m2.packet_id),
        (b"m4", 1, True, m4.packet_id),
        (b"m5", 2, True, m5.packet_id),
    ]
    rels = [p for p in got if p.type == PUBREL]
    assert [(p.packet_id, p.flags) for p in rels] == [(m3.packet_id, 2)]
    # PUBREL in its original place: after m2's re-send, before m4's [MQTT-4.6.0-1]
    assert [p.type for p in got] == [PUBLISH, PUBLISH, PUBREL, PUBLISH, PUBLISH]
    c.expect_silence(0.3)

    # complete every flow; then nothing is left to re-send
    c.send(mqttraw.puback(m1.packet_id))
    c.send(mqttraw.pubrec(m2.packet_id))
    c.expect_ack(PUBREL, m2.packet_id)
    c.send(mqttraw.pubcomp(m2.packet_id))
    c.send(mqttraw.pubcomp(m3.packet_id))
    c.send(mqttraw.puback(m4.packet_id))
    c.send(mqttraw.pubrec(m5.packet_id))
    c.expect_ack(PUBREL, m5.packet_id)
    c.send(mqttraw.pubcomp(m5.packet_id))
    c.ping()
    c.close()
    c = clients(broker, client_id="rd", clean=False)
    assert c.session_present == 1
    c.expect_silence(0.4)


def test_takeover_of_persistent_session_keeps_it(broker, clients):
    """[MQTT-3.1.4-2] the old connection is closed; with CleanSession=0 the new one
    resumes the same session [MQTT-3.2.2-2] and gets its unacknowledged message again."""
    first = clients(broker, client_id="tp", clean=False)
    assert first.sub(1, ("tp/t", 1)) == [1]
    pub = clients(broker, client_id="tp-pub")
    pub.pub("tp/t", b"unacked", qos=1)
    (m,) = first.publishes(1)
    second = clients(broker, client_id="tp", clean=False)
    assert second.session_present == 1
    first.expect_closed()
    (again,) = second.publishes(1)
    assert (again.payload, again.packet_id, again.dup) == (b"unacked", m.packet_id, True)
    second.ack(again)
    pub.pub("tp/t", b"live", qos=1, pid=2)
    (live,) = second.publishes(1)
    assert live.payload == b"live"


def test_queue_behind_inflight_window_is_kept_across_reconnect(broker_factory, clients):
    """--max-inflight 2: messages waiting behind the window stay in the session and are
    delivered, in order, after the re-sent ones [MQTT-4.6.0-1]."""
    b = broker_factory("--max-inflight", "2")
    c = clients(b, client_id="qw", clean=False)
    assert c.sub(1, ("qw/t", 1)) == [1]
    pub = clients(b, client_id="qw-pub")
    for i in range(6):
        pub.pub("qw/t", str(i).encode(), qos=1, pid=i + 1)
    assert [p.payload for p in c.publishes(2)] == [b"0", b"1"]
    c.close()
    c = clients(b, client_id="qw", clean=False)
    got = c.publishes(2)
    assert [(p.payload, p.dup) for p in got] == [(b"0", True), (b"1", True)]
    payloads = [p.payload for p in got]
    for p in got:
        c.ack(p)
    while len(payloads) < 6:
        (p,) = c.publishes(1)
        payloads.append(p.payload)
        c.ack(p)
    assert payloads == [b"0", b"1", b"2", b"3", b"4", b"5"]
    control_roundtrip(b, "qw")
