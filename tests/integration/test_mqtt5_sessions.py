"""MQTT 5 sessions across a 3-node mesh with paho-mqtt 2.x (``protocol=MQTTv5``), issue 23:
Clean Start and the Session Expiry Interval asked apart, each served as asked whichever node
the client comes back to."""

from __future__ import annotations

import pytest

from support.mesh import start_mesh, wait_converged, wait_interest

pytestmark = [pytest.mark.process]


@pytest.fixture
def mesh(broker_factory):
    names, edges = ["a", "b", "c"], [("b", "a"), ("c", "b"), ("c", "a")]
    nodes = start_mesh(broker_factory, names, edges)
    wait_converged(nodes, edges)
    return nodes


def _queue_one(mesh, paho5, topic: str) -> None:
    pub = paho5(f"pub-{topic}")
    assert pub.connect(mesh["c"])[0] == 0
    pub.publish(topic, b"while away", 1)
    pub.stop()


def test_clean_start_with_an_interval_starts_a_new_session_that_outlives_its_connection(mesh, paho5):
    """[MQTT-3.1.2-4]: Clean Start 1 discards what the ClientId had, and with an interval the
    new session is kept after the connection [MQTT-3.1.2-23]: a message that arrives while
    the client is away waits for it on another node."""
    old = paho5("cs1")
    assert old.connect(mesh["a"], clean_start=False, SessionExpiryInterval=600)[0] == 0
    assert old.subscribe("cs1/old", 1) == [1]
    old.stop()
    new = paho5("cs1")
    rc, flags, _ = new.connect(mesh["a"], clean_start=True, SessionExpiryInterval=600)
    assert rc == 0 and not flags.session_present
    assert new.subscribe("cs1/new", 1) == [1]
    wait_interest(mesh, "cs1/new", "a")
    new.stop()
    _queue_one(mesh, paho5, "cs1/new")
    back = paho5("cs1")
    rc, flags, _ = back.connect(mesh["b"], clean_start=False, SessionExpiryInterval=600)
    assert rc == 0 and flags.session_present
    msg = back.get()
    assert (msg.topic, msg.payload) == ("cs1/new", b"while away")


def test_clean_start_0_with_interval_0_resumes_the_session_and_ends_it_with_the_connection(mesh, paho5):
    """Clean Start 0 resumes what the ClientId had, on any node [MQTT-3.1.2-5], and a Session
    Expiry Interval of 0 ends it with this connection [MQTT-3.1.2-23]: the next connection
    finds none, wherever it comes."""
    first = paho5("cs0")
    assert first.connect(mesh["a"], clean_start=False, SessionExpiryInterval=600)[0] == 0
    assert first.subscribe("cs0/t", 1) == [1]
    wait_interest(mesh, "cs0/t", "a")
    first.stop()
    _queue_one(mesh, paho5, "cs0/t")
    resumed = paho5("cs0")
    rc, flags, props = resumed.connect(mesh["b"], clean_start=False, SessionExpiryInterval=0)
    assert rc == 0 and flags.session_present
    assert getattr(props, "SessionExpiryInterval", 0) == 0
    msg = resumed.get()
    assert (msg.topic, msg.payload) == ("cs0/t", b"while away")
    resumed.stop()
    for node in ("c", "a"):  # (each asks for none after it: it leaves none behind)
        later = paho5("cs0")
        rc, flags, _ = later.connect(mesh[node], clean_start=False, SessionExpiryInterval=0)
        assert rc == 0 and not flags.session_present, node
        later.stop()
