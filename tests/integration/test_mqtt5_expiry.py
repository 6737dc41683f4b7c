"""MQTT 5 Message Expiry with real clients (paho-mqtt 2.x, ``protocol=MQTTv5``), on one node
and across a 3-node mesh, with nodes killed (kill -9) while the messages wait (issue 23).

What each test checks: a message whose Message Expiry Interval passed before it could be
sent is never delivered [MQTT-3.3.2-5]; one that is sent carries what is left of its
interval [MQTT-3.3.2-6]; a message without one never expires. "Never delivered" is checked
without waiting for nothing to happen: the same publisher sends a marker after the messages
under test, and the mesh keeps one publisher's messages in order [MQTT-4.6.0-6], so an
expired message that got through would arrive before the marker.
"""

from __future__ import annotations

import time

import pytest

from support.mesh import start_mesh, wait_converged, wait_interest
from support.processes import wait_for

pytestmark = [pytest.mark.process]

SESSION = 300  # the subscribers' Session Expiry Interval: their sessions outlive the tests


def _interval(msg) -> int | None:
    """The Message Expiry Interval a delivered PUBLISH carries, None without one."""
    return getattr(msg.properties, "MessageExpiryInterval", None) if msg.properties is not None else None


def _until(instant: float, what: str) -> None:
    """Wait until the monotonic clock passes ``instant`` (a message's life ends then)."""
    wait_for(lambda: time.monotonic() > instant, instant - time.monotonic() + 5.0, what=what)


def _received_until_marker(client, marker: str, timeout: float = 10.0) -> dict:
    """The messages ``client`` gets up to and including the one on topic ``marker``, by topic."""
    got: dict = {}
    deadline = time.monotonic() + timeout
    while marker not in got:
        msg = client.get(max(0.1, deadline - time.monotonic()))
        assert msg.topic not in got, f"{msg.topic} delivered twice"
        got[msg.topic] = msg
    return got


def _offline_subscriber(paho5, node, client_id: str, topic_filter: str):
    """A persistent MQTT 5 session subscribed to ``topic_filter`` at ``node``, its client gone."""
    sub = paho5(client_id)
    assert sub.connect(node, clean_start=False, SessionExpiryInterval=SESSION)[0] == 0
    assert sub.subscribe(topic_filter, 1) == [1]
    sub.stop()  # (DISCONNECT: the session stays for SESSION seconds)


def test_the_remaining_interval_is_forwarded_at_each_hop(mesh, paho5):
    """[MQTT-3.3.2-6]: a live subscriber two hops from the publisher gets the interval less the
    time it waited (next to none here); a message without one arrives without one."""
    sub = paho5("hop-sub")
    assert sub.connect(mesh["a"])[0] == 0
    assert sub.subscribe("hop/#", 1) == [1]
    wait_interest(mesh, "hop/#", "a")
    pub = paho5("hop-pub")
    assert pub.connect(mesh["c"])[0] == 0
    pub.publish("hop/exp", b"e", 1, MessageExpiryInterval=30)
    pub.publish("hop/none", b"n", 1)
    got = _received_until_marker(sub, "hop/none")
    assert 28 <= _interval(got["hop/exp"]) <= 30
    assert _interval(got["hop/none"]) is None


def test_a_message_that_expired_in_an_offline_queue_is_not_delivered_on_another_node(mesh, paho5):
    """[MQTT-3.3.2-5]: the session's messages wait at a while its client is away; the client
    comes back at b, after one message's life ended: the others are delivered, with what is
    left of their interval [MQTT-3.3.2-6], the expired one never."""
    _offline_subscriber(paho5, mesh["a"], "exp-sub", "exp/#")
    wait_interest(mesh, "exp/#", "a")
    pub = paho5("exp-pub")
    assert pub.connect(mesh["c"])[0] == 0
    sent = time.monotonic()
    pub.publish("exp/short", b"s", 1, MessageExpiryInterval=1)
    pub.publish("exp/long", b"l", 1, MessageExpiryInterval=60)
    pub.publish("exp/none", b"n", 1)
    _until(sent + 1.5, "the short message's life to end")
    pub.publish("exp/marker", b"m", 1)
    back = paho5("exp-sub")
    rc, flags, _ = back.connect(mesh["b"], clean_start=False, SessionExpiryInterval=SESSION)
    assert rc == 0 and flags.session_present
    got = _received_until_marker(back, "exp/marker")
    assert sorted(got) == ["exp/long", "exp/marker", "exp/none"]
    assert 50 <= _interval(got["exp/long"]) <= 59  # (1.5 s or more of its 60 went by)
    assert _interval(got["exp/none"]) is None


def test_an_expired_retained_message_is_not_sent_to_a_new_subscription_on_another_node(mesh, paho5):
    """[MQTT-3.3.2-5] for retained messages, kept by the topics' owner nodes: after the short
    one's life ended a subscription at a gets only the long one, with RETAIN set and what is
    left of its interval."""
    pub = paho5("ret-pub")
    assert pub.connect(mesh["c"])[0] == 0
    sent = time.monotonic()
    for topic, interval in (("ret/short", 1), ("ret/long", 60)):
        pub.c.publish(topic, b"r", 1, retain=True, properties=pub.props("PUBLISH", MessageExpiryInterval=interval))
    pub.publish("ret/plain", b"p", 1)  # (acknowledged after the two: they are with their owners)
    _until(sent + 1.5, "the short retained message's life to end")
    sub = paho5("ret-sub")
    assert sub.connect(mesh["a"])[0] == 0
    assert sub.subscribe("ret/#", 1) == [1]
    wait_interest(mesh, "ret/#", "a")
    pub.publish("ret/marker", b"m", 1)  # (after the retained ones: the lookup answered first)
    got = _received_until_marker(sub, "ret/marker")
    assert sorted(got) == ["ret/long", "ret/marker"]
    assert got["ret/long"].retain and 50 <= _interval(got["ret/long"]) <= 59


def test_message_expiry_holds_when_the_sessions_node_is_killed(broker_factory, tmp_path, paho5):
    """The node that held the queue dies (kill -9) while the messages wait: the session's copy
    on another node serves the client, with the same expiry (the copies carry the remaining
    time, counted on each node's own clock), and after a's restart from its store neither
    node brings the expired message back."""
    names, edges = ["a", "b", "c"], [("b", "a"), ("c", "b"), ("c", "a")]
    nodes = start_mesh(broker_factory, names, edges, data_dirs=tmp_path)
    wait_converged(nodes, edges)
    _offline_subscriber(paho5, nodes["a"], "k9-sub", "k9/#")
    wait_interest(nodes, "k9/#", "a")
    pub = paho5("k9-pub")
    assert pub.connect(nodes["c"])[0] == 0
    sent = time.monotonic()
    pub.publish("k9/short", b"s", 1, MessageExpiryInterval=2)
    pub.publish("k9/long", b"l", 1, MessageExpiryInterval=60)
    nodes["a"].kill()
    _until(sent + 2.5, "the short message's life to end")
    pub.publish("k9/marker", b"m", 1)
    back = paho5("k9-sub")
    rc, flags, _ = back.connect(nodes["b"], clean_start=False, SessionExpiryInterval=SESSION)
    assert rc == 0 and flags.session_present
    got = _received_until_marker(back, "k9/marker")
    assert sorted(got) == ["k9/long", "k9/marker"]
    assert 50 <= _interval(got["k9/long"]) <= 58
    back.stop()
    nodes["a"].start()
    wait_converged(nodes, edges)
    pub.publish("k9/after", b"a", 1)
    again = paho5("k9-sub")
    assert again.connect(nodes["a"], clean_start=False, SessionExpiryInterval=SESSION)[0] == 0
    later = _received_until_marker(again, "k9/after")
    assert "k9/short" not in later


def test_message_expiry_is_kept_across_a_kill_9_of_a_single_node(broker_factory, tmp_path, paho5):
    """One node with a data directory, killed while a queued message and a retained one wait:
    the store keeps when they expire (on the wall clock), so after the restart the expired
    ones are neither delivered nor sent as retained, and the others carry what is left."""
    node = broker_factory("--data-dir", str(tmp_path / "data"))
    _offline_subscriber(paho5, node, "one-sub", "one/q/#")
    pub = paho5("one-pub")
    assert pub.connect(node)[0] == 0
    sent = time.monotonic()
    for topic, interval in (("one/q/short", 2), ("one/q/long", 60)):
        pub.publish(topic, b"q", 1, MessageExpiryInterval=interval)
    for topic, interval in (("one/r/short", 2), ("one/r/long", 60)):
        pub.c.publish(topic, b"r", 1, retain=True, properties=pub.props("PUBLISH", MessageExpiryInterval=interval))
    pub.publish("one/r/plain", b"p", 1)  # (acknowledged after the retained ones: stored)
    pub.stop()
    node.kill()
    node.start()
    _until(sent + 2.5, "the short messages' lives to end")
    back = paho5("one-sub")
    rc, flags, _ = back.connect(node, clean_start=False, SessionExpiryInterval=SESSION)
    assert rc == 0 and flags.session_present
    assert back.subscribe("one/r/#", 1) == [1]
    marker = paho5("one-pub2")
    assert marker.connect(node)[0] == 0
    marker.publish("one/q/marker", b"m", 1)
    marker.publish("one/r/marker", b"m", 1)
    got = _received_until_marker(back, "one/r/marker")
    assert sorted(got) == ["one/q/long", "one/q/marker", "one/r/long", "one/r/marker"]
    assert 50 <= _interval(got["one/q/long"]) <= 58 and 50 <= _interval(got["one/r/long"]) <= 58
