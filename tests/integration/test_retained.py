"""Retained messages (3.3.1.3) and topics beginning with $ (4.7.2)."""

from __future__ import annotations

import pytest

from support import mqttraw
from support.processes import wait_for

pytestmark = pytest.mark.process


def test_retained_message_sent_on_subscribe_with_retain_1(broker, clients):
    """[MQTT-3.3.1-5] stored with its QoS; [MQTT-3.3.1-6] sent on a new subscription with
    [MQTT-3.3.1-8] RETAIN=1, at min(stored QoS, granted) [MQTT-3.8.4-6]; it outlives the
    publisher's session [MQTT-3.1.2-7]."""
    pub = clients(broker, client_id="rt-pub")
    pub.pub("rt/a", b"kept", qos=1, retain=True)
    pub.send(mqttraw.DISCONNECT_BYTES)
    pub.expect_closed()
    for granted in (0, 1, 2):
        c = clients(broker, client_id=f"rt-sub{granted}")
        assert c.sub(1, ("rt/a", granted)) == [granted]
        (p,) = c.publishes(1)
        assert (p.topic, p.payload, p.retain, p.qos, p.dup) == ("rt/a", b"kept", True, min(1, granted), False)
        c.expect_silence(0.2)


def test_live_delivery_has_retain_0_even_for_retained_publishes(broker, clients):
    """[MQTT-3.3.1-9] RETAIN=0 for a PUBLISH that matches an established subscription."""
    sub = clients(broker, client_id="rl-sub")
    assert sub.sub(1, ("rl/#", 1)) == [1]
    pub = clients(broker, client_id="rl-pub")
    pub.pub("rl/a", b"r0", qos=0, retain=True)
    pub.pub("rl/b", b"r1", qos=1, retain=True)
    got = sub.publishes(2)
    assert [(p.payload, p.retain) for p in got] == [(b"r0", False), (b"r1", False)]


def test_retained_message_is_replaced(broker, clients):
    """[MQTT-3.3.1-7] a new retained message (QoS 0 too) replaces the previous one."""
    pub = clients(broker, client_id="rr-pub")
    pub.pub("rr/a", b"first", qos=1, retain=True)
    pub.pub("rr/a", b"second", qos=0, retain=True)
    pub.ping()  # the QoS 0 publish has been processed
    c = clients(broker, client_id="rr-sub")
    assert c.sub(1, ("rr/a", 2)) == [2]
    (p,) = c.publishes(1)
    assert (p.payload, p.qos, p.retain) == (b"second", 0, True)
    c.expect_silence(0.2)


def test_empty_retained_payload_deletes_and_is_still_delivered_live(broker, clients):
    """[MQTT-3.3.1-10] processed as normal (live subscribers get the empty message) and
    the retained message is removed; [MQTT-3.3.1-11] the empty one is not stored."""
    pub = clients(broker, client_id="rd-pub")
    pub.pub("rd/a", b"to delete", qos=1, retain=True)
    live = clients(broker, client_id="rd-live")
    assert live.sub(1, ("rd/a", 1)) == [1]
    (r,) = live.publishes(1)
    assert r.retain
    live.ack(r)
    pub.pub("rd/a", b"", qos=1, retain=True, pid=2)
    (p,) = live.publishes(1)
    assert (p.payload, p.retain) == (b"", False)
    late = clients(broker, client_id="rd-late")
    assert late.sub(1, ("rd/#", 1)) == [1]
    late.expect_silence(0.3)


def test_non_retained_publish_does_not_touch_the_retained_message(broker, clients):
    """[MQTT-3.3.1-12] RETAIN=0: not stored, and the retained message neither removed
    nor replaced (an empty non-retained payload does not delete it either)."""
    pub = clients(broker, client_id="rn-pub")
    pub.pub("rn/a", b"retained", qos=1, retain=True)
    pub.pub("rn/a", b"not retained", qos=1, retain=False, pid=2)
    pub.pub("rn/a", b"", qos=1, retain=False, pid=3)
    pub.pub("rn/b", b"never retained", qos=1, retain=False, pid=4)
    c = clients(broker, client_id="rn-sub")
    assert c.sub(1, ("rn/#", 1)) == [1]
    (p,) = c.publishes(1)
    assert (p.topic, p.payload, p.retain) == ("rn/a", b"retained", True)
    c.expect_silence(0.3)


def test_resubscribing_resends_retained_messages(broker, clients):
    """[MQTT-3.8.4-3] an identical filter replaces the subscription and the matching
    retained messages are sent again; live flow continues with one copy."""
    pub = clients(broker, client_id="rs-pub")
    pub.pub("rs/a", b"state", qos=1, retain=True)
    c = clients(broker, client_id="rs-sub")
    for pid in (1, 2, 3):
        assert c.sub(pid, ("rs/#", 1)) == [1]
        (p,) = c.publishes(1)
        assert (p.payload, p.retain) == (b"state", True)
        c.ack(p)
    pub.pub("rs/a", b"live", qos=1, pid=2)
    (p,) = c.publishes(1)
    assert (p.payload, p.retain) == (b"live", False)
    c.expect_silence(0.3)


def test_wildcard_subscription_gets_every_matching_retained_message(broker, clients):
    """[MQTT-3.3.1-6] the last retained message on *each* matching topic (4.7 matching)."""
    pub = clients(broker, client_id="rw-pub")
    for i, topic in enumerate(("rw", "rw/a", "rw/b", "rw/b/c", "other/a")):
        pub.pub(topic, topic.encode(), qos=1, retain=True, pid=i + 1)
    c = clients(broker, client_id="rw-sub")
    assert c.sub(1, ("rw/#", 0)) == [0]
    assert sorted(p.topic for p in c.publishes(4)) == ["rw", "rw/a", "rw/b", "rw/b/c"]
    c.expect_silence(0.2)
    assert c.sub(2, ("rw/+", 0)) == [0]
    assert sorted(p.topic for p in c.publishes(2)) == ["rw/a", "rw/b"]
    assert c.sub(3, ("+/a", 0)) == [0]
    assert sorted(p.topic for p in c.publishes(2)) == ["other/a", "rw/a"]
    c.expect_silence(0.2)


def test_dollar_topics_not_matched_by_leading_wildcards(broker_factory, clients):
    """[MQTT-4.7.2-1] with --sys-interval 0.2 the broker publishes $SYS/broker/...
    (retained and live): '#' and '+/...' get none of it, '$SYS/#' gets both kinds."""
    # the fixture passes --sys-interval 0 first; argparse keeps the last value
    b = broker_factory("--sys-interval", "0.2")
    sys_sub = clients(b, client_id="sys-sub")
    assert sys_sub.sub(1, ("$SYS/#", 0)) == [0]
    first = sys_sub.publishes(1)[0]
    assert first.topic.startswith("$SYS/broker/") and first.retain
    hash_sub = clients(b, client_id="hash-sub")
    assert hash_sub.sub(1, ("#", 0)) == [0]
    plus_sub = clients(b, client_id="plus-sub")
    assert plus_sub.sub(1, ("+/broker/#", 0), ("+/+/uptime", 0)) == [0, 0]
    # wait until live (RETAIN=0) $SYS updates reached the $SYS/# subscriber twice, so the
    # other two subscribers were subscribed while $SYS messages were being dispatched
    live = []

    def two_live_rounds():
        p = sys_sub.recv(1.0)
        if not p.retain and p.topic == "$SYS/broker/uptime":
            live.append(p)
        return len(live) >= 2

    wait_for(two_live_rounds, 5, what="two live $SYS rounds")
    pub = clients(b, client_id="sys-marker")
    pub.pub("marker/broker/uptime", b"m", qos=1)
    for c in (hash_sub, plus_sub):
        (p,) = c.publishes(1)
        assert p.topic == "marker/broker/uptime", p


def test_clients_cannot_publish_dollar_topics_but_are_acknowledged(broker_factory, clients):
    """[MQTT-3.3.5-2] an unauthorised PUBLISH is positively acknowledged (here: any
    client PUBLISH to a $ topic is dropped) and nothing is delivered or retained."""
    b = broker_factory()
    sub = clients(b, client_id="dollar-sub")
    assert sub.sub(1, ("$SYS/#", 1), ("$foo/#", 1)) == [1, 1]
    pub = clients(b, client_id="dollar-pub")
    pub.pub("$SYS/broker/fake", b"spoof", qos=1, retain=True)
    pub.pub("$foo/bar", b"spoof", qos=2, retain=True, pid=2)
    sub.expect_silence(0.3)
    late = clients(b, client_id="dollar-late")
    assert late.sub(1, ("$SYS/#", 1), ("$foo/#", 1)) == [1, 1]
    late.expect_silence(0.3)
