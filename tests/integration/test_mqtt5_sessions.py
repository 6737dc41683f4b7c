"""MQTT 5 sessions across a 3-node mesh with paho-mqtt 2.x (``protocol=MQTTv5``), issue 23:
Clean Start and the Session Expiry Interval asked apart, each served as asked whichever node
the client comes back to."""

from __future__ import annotations

import time

import pytest

from support.mesh import start_mesh, wait_converged, wait_interest
from support.processes import wait_for

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


def _persistent(paho5, node, client_id: str, expiry: int, topic: str) -> None:
    """A session with one subscription whose client leaves with a Session Expiry Interval."""
    c = paho5(client_id)
    assert c.connect(node, clean_start=False, SessionExpiryInterval=expiry)[0] == 0
    assert c.subscribe(topic, 1) == [1]
    c.stop()


def _present(paho5, node, client_id: str) -> bool:
    """Whether a connection of ``client_id`` at ``node`` finds a session (and leaves none)."""
    c = paho5(client_id)
    rc, flags, _ = c.connect(node, clean_start=False, SessionExpiryInterval=0)
    assert rc == 0
    c.stop()
    return flags.session_present


def _after(seconds: float, since: float) -> None:
    wait_for(lambda: time.monotonic() > since + seconds, seconds + 5.0, what=f"{seconds} s to pass")


def test_a_session_expires_on_every_node_and_one_resumed_in_time_is_kept(mesh, paho5):
    """[MQTT-4.1.0-2] [MQTT-3.1.2-23]: a session left at a with 2 s is gone 2 s later wherever
    the client comes back; one with 60 s is resumed on another node. CONNACK says what is
    served: the interval asked."""
    c = paho5("probe")
    _, _, props = c.connect(mesh["a"], clean_start=False, SessionExpiryInterval=2)
    assert getattr(props, "SessionExpiryInterval", None) is None  # (served as asked)
    c.stop()
    _persistent(paho5, mesh["a"], "short", 2, "se/short")
    _persistent(paho5, mesh["a"], "long", 60, "se/long")
    left = time.monotonic()
    _after(3.0, left)
    assert _present(paho5, mesh["b"], "short") is False
    assert _present(paho5, mesh["c"], "long") is True


def test_a_session_expires_after_its_node_was_killed(mesh, paho5):
    """kill -9 of the node the client left: the copies on the other nodes end the session at
    the same time (they were told when), and keep one that has time left."""
    _persistent(paho5, mesh["a"], "k-short", 3, "sk/short")
    _persistent(paho5, mesh["a"], "k-long", 60, "sk/long")
    left = time.monotonic()
    mesh["a"].kill()
    _after(4.0, left)
    assert _present(paho5, mesh["b"], "k-short") is False
    assert _present(paho5, mesh["c"], "k-long") is True


def test_a_session_expires_across_a_kill_9_of_a_single_node(broker_factory, tmp_path, paho5):
    """One node with a data directory: the store keeps when the session ends (on the wall
    clock), so a restart neither loses the session early nor keeps it past its end."""
    node = broker_factory("--data-dir", str(tmp_path / "data"))
    _persistent(paho5, node, "one-short", 3, "so/short")
    _persistent(paho5, node, "one-long", 60, "so/long")
    left = time.monotonic()
    node.kill()
    node.start()
    _after(4.5, left)  # (the node ends expired sessions once a second)
    assert _present(paho5, node, "one-short") is False
    assert _present(paho5, node, "one-long") is True


def _raw5(node, client_id: str):
    """A raw MQTT 5 connection (bytes from tests/support/mqttraw5.py) with a kept session."""
    from mqttmesh import properties as P
    from support import mqttraw5 as r5
    from support.mqttraw import CONNACK, RawClient

    c = RawClient(node.host, node.port)
    c.send(r5.connect(client_id, clean=False, properties=r5.props((P.SESSION_EXPIRY, r5.u32(600)))))
    assert c.expect(CONNACK).body[1] == 0
    return c


def _taken_over(c) -> None:
    """``c`` is told DISCONNECT 0x8E (Session taken over) and closed [MQTT-3.1.4-3]."""
    from support.mqttraw import DISCONNECT

    p = c.expect(DISCONNECT, timeout=15.0)
    assert p.body[:1] == b"\x8e"
    c.expect_closed()


def test_a_take_over_on_another_node_tells_the_first_connection_0x8e(mesh, paho5):
    """The ClientId connects at b while connected at a: a's connection gets DISCONNECT 0x8E
    and the session goes on at b (session present)."""
    first = _raw5(mesh["a"], "tk")
    second = paho5("tk")
    rc, flags, _ = second.connect(mesh["b"], clean_start=False, SessionExpiryInterval=600)
    assert rc == 0 and flags.session_present
    _taken_over(first)


def test_a_take_over_while_a_node_is_killed_still_tells_the_first_connection(mesh, paho5):
    """kill -9 of the third node (which may be the ClientId's registrar) just before the take
    over: once the mesh has noticed, the new connection at b is accepted and the one at a is
    told 0x8E; never two connections for one ClientId."""
    first = _raw5(mesh["a"], "tk9")
    mesh["c"].kill()

    def taken() -> bool:
        second = paho5("tk9")
        try:
            rc, flags, _ = second.connect(mesh["b"], clean_start=False, SessionExpiryInterval=600)
        except Exception:
            second.stop()
            return False
        if rc != 0:
            second.stop()
            return False
        return flags.session_present

    assert wait_for(taken, 30.0, interval=0.5, what="the take-over at b to be accepted")
    _taken_over(first)
