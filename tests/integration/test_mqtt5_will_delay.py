"""MQTT 5 Will Delay Interval with real sockets, on one node and across a 3-node mesh, with the
client's node killed (kill -9) too (issue 23).

The client with the will is a raw socket (bytes from tests/support/mqttraw5.py, independent
of the codec) so that its connection can end without a DISCONNECT; the subscriber is paho
(``protocol=MQTTv5``). A will that must never come is checked by waiting until well after
the instant it would have been due, a deadline on the clock, then finding nothing.
"""

from __future__ import annotations

import queue
import time

import pytest

from mqttmesh import properties as P
from support import mqttraw
from support import mqttraw5 as r5
from support.mesh import start_mesh, wait_converged, wait_interest
from support.mqttraw import CONNACK, SUBACK, RawClient
from support.processes import wait_for

pytestmark = [pytest.mark.process]

SESSION = 300


def _will_client(node, client_id: str, delay: int, topic: str) -> RawClient:
    """A persistent MQTT 5 session whose will (QoS 1) waits ``delay`` seconds."""
    c = RawClient(node.host, node.port)
    keep = r5.props((P.SESSION_EXPIRY, r5.u32(SESSION)))
    will = (topic, b"gone", 1, False, r5.props((P.WILL_DELAY, r5.u32(delay))))
    c.send(r5.connect(client_id, clean=False, properties=keep, will=will))
    assert c.expect(CONNACK).body[1] == 0
    return c


def _back(node, client_id: str) -> RawClient:
    """The same ClientId connects again (Clean Start 0), without a will."""
    c = _try_back(node, client_id)
    assert c is not None
    return c


def _try_back(node, client_id: str) -> RawClient | None:
    """As ``_back``, but None when the node answers 0x88 (Server unavailable): what a node
    says while it cannot yet decide the persistent session's one live copy (its registrar
    was on a node just killed and not yet known dead), for the client to try again."""
    c = RawClient(node.host, node.port, timeout=15.0)
    c.send(r5.connect(client_id, clean=False, properties=r5.props((P.SESSION_EXPIRY, r5.u32(SESSION)))))
    code = c.expect(CONNACK).body[1]
    if code == 0x88:
        c.close()
        return None
    assert code == 0
    return c


def _nothing_until(sub, instant: float) -> None:
    """No message reaches ``sub`` before the monotonic clock passes ``instant``."""
    while (left := instant - time.monotonic()) > 0:
        try:
            msg = sub.get(left)
        except queue.Empty:
            return
        raise AssertionError(f"unexpected {msg.topic} {msg.payload!r}")


def test_one_node_killed_and_restarted_publishes_the_delayed_will_from_its_store(broker_factory, paho5, tmp_path):
    """[MQTT-3.1.2-8] across a kill -9: the will and its delay are part of the session's state
    (the session outlives the node's restart), so the node publishes the will once its delay
    has passed since the connection ended, not at the restart and not never."""
    node = broker_factory("--data-dir", str(tmp_path / "data"))
    c = _will_client(node, "dev", 5, "kw1/dev")
    c.close()  # (no DISCONNECT)
    closed = time.monotonic()
    wait_for(lambda: "'dev' from" in node.log() and "connection closed by client" in node.log(), 5.0)
    # the store commits in order: once a later persistent SUBSCRIBE is acknowledged (durable
    # before its SUBACK), the will's batch is committed too
    probe = RawClient(node.host, node.port)
    assert probe.connect(client_id="probe", clean=False).body[1] == 0
    probe.send(mqttraw.subscribe(1, ("probe/#", 1)))
    probe.expect(SUBACK)
    node.kill()
    node.start()
    sub = paho5("ksub1")
    assert sub.connect(node)[0] == 0 and sub.subscribe("kw1/#", 1) == [1]
    msg = sub.get(15.0)
    assert (msg.topic, msg.payload) == ("kw1/dev", b"gone")
    assert time.monotonic() - closed >= 4.9
    _nothing_until(sub, time.monotonic() + 2.0)  # once


@pytest.fixture
def mesh(broker_factory):
    names, edges = ["a", "b", "c"], [("b", "a"), ("c", "b"), ("c", "a")]
    nodes = start_mesh(broker_factory, names, edges, extra=("--mesh-keepalive", "0.5"))
    wait_converged(nodes, edges)
    return nodes


def test_one_node_publishes_a_delayed_will_after_its_delay_and_not_after_a_reconnect(broker, paho5):
    """[MQTT-3.1.2-8]: after the connection ended and the delay passed; [MQTT-3.1.3-9]: not if
    the client connected again first."""
    sub = paho5("sub")
    assert sub.connect(broker)[0] == 0 and sub.subscribe("w/#", 1) == [1]
    c = _will_client(broker, "late", 2, "w/late")
    c.close()  # (no DISCONNECT)
    closed = time.monotonic()
    msg = sub.get(10.0)
    assert (msg.topic, msg.payload) == ("w/late", b"gone")
    assert time.monotonic() - closed >= 1.9
    again = _will_client(broker, "back", 2, "w/back")
    again.close()
    closed = time.monotonic()
    _back(broker, "back")
    _nothing_until(sub, closed + 4.5)


def test_across_the_mesh_a_delayed_will_is_published_once_after_its_delay(mesh, paho5):
    """The client was on a, its subscriber is on c: the will comes once, after the delay."""
    sub = paho5("msub")
    assert sub.connect(mesh["c"])[0] == 0 and sub.subscribe("mw/#", 1) == [1]
    wait_interest(mesh, "mw/#", "c")
    c = _will_client(mesh["a"], "mlate", 2, "mw/late")
    c.close()
    closed = time.monotonic()
    msg = sub.get(10.0)
    assert (msg.topic, msg.payload) == ("mw/late", b"gone")
    assert time.monotonic() - closed >= 1.9
    _nothing_until(sub, time.monotonic() + 2.0)  # once


def test_across_the_mesh_a_reconnect_on_another_node_cancels_the_will(mesh, paho5):
    """[MQTT-3.1.3-9]: the connection at a ends, the client connects again at b within the
    delay: no node publishes the will."""
    sub = paho5("msub2")
    assert sub.connect(mesh["c"])[0] == 0 and sub.subscribe("mw/#", 1) == [1]
    wait_interest(mesh, "mw/#", "c")
    c = _will_client(mesh["a"], "mback", 3, "mw/back")
    c.close()
    closed = time.monotonic()
    _back(mesh["b"], "mback")
    assert time.monotonic() - closed < 3.0
    _nothing_until(sub, closed + 6.0)


def test_the_will_of_a_client_whose_node_was_killed_waits_for_its_delay(mesh, paho5):
    """kill -9 of the client's node: the registrar publishes the will once, its delay after
    the node was found gone, not at once."""
    sub = paho5("ksub")
    assert sub.connect(mesh["c"])[0] == 0 and sub.subscribe("kw/#", 1) == [1]
    wait_interest(mesh, "kw/#", "c")
    _will_client(mesh["a"], "kdead", 4, "kw/dead")
    mesh["a"].kill()
    killed = time.monotonic()
    msg = sub.get(30.0)
    assert (msg.topic, msg.payload) == ("kw/dead", b"gone")
    assert time.monotonic() - killed >= 3.9
    _nothing_until(sub, time.monotonic() + 2.0)  # once


def test_a_reconnect_after_the_clients_node_was_killed_cancels_the_will(mesh, paho5):
    """kill -9 of the client's node, the client connects again at b within the delay: never."""
    sub = paho5("ksub2")
    assert sub.connect(mesh["c"])[0] == 0 and sub.subscribe("kw/#", 1) == [1]
    wait_interest(mesh, "kw/#", "c")
    _will_client(mesh["a"], "kback", 8, "kw/back")
    mesh["a"].kill()
    killed = time.monotonic()
    wait_for(lambda: _try_back(mesh["b"], "kback"), 15.0, what="the client to connect again at b")
    assert time.monotonic() - killed < 8.0
    _nothing_until(sub, killed + 14.0)
