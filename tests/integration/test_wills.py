"""Keep alive (3.1.2.10) and Will messages (3.1.2.5 to 3.1.2.7, 3.14.4)."""

from __future__ import annotations

import time

import pytest

from support import mqttraw
from support.integration import wait_log
from support.mqttraw import Closed

pytestmark = pytest.mark.process


def test_silent_client_is_disconnected_after_1_5_keepalive_and_its_will_published(broker, clients):
    """[MQTT-3.1.2-24] keepalive 1 s, nothing sent: closed after ~1.5 s, as if the network
    failed, so the will is published [MQTT-3.1.2-8]. Meanwhile a client that PINGs
    [MQTT-3.12.4-1], one that only sends QoS 0 PUBLISHes (any Control Packet counts) and
    one with keepalive 0 (no timeout at all) all stay connected."""
    watcher = clients(broker, client_id="ka-watch")
    assert watcher.sub(1, ("ka/will", 1)) == [1]
    pinger = clients(broker, client_id="ka-pinger", keepalive=1)
    talker = clients(broker, client_id="ka-talker", keepalive=1)
    zero = clients(broker, client_id="ka-zero", keepalive=0)
    silent = clients(broker, client_id="ka-silent", keepalive=1, will=("ka/will", b"silent gone", 1, False))
    t0 = time.monotonic()
    closed_at = None
    while time.monotonic() - t0 < 3.5:
        pinger.ping()  # one packet per ~0.4 s keeps a 1 s keepalive satisfied
        talker.send(mqttraw.publish("ka/traffic", b"x"))
        if closed_at is None:
            try:
                p = silent.recv(0.4)
            except TimeoutError:
                continue
            except Closed:
                closed_at = time.monotonic() - t0
                continue
            raise AssertionError(f"unexpected packet to the silent client: {p!r}")
        else:
            pinger.expect_silence(0.4)
    assert closed_at is not None, "the silent client was never disconnected"
    assert 1.0 <= closed_at <= 3.0, closed_at
    (p,) = watcher.publishes(1)
    assert (p.topic, p.payload, p.qos, p.retain) == ("ka/will", b"silent gone", 1, False)
    for c in (pinger, talker, zero):  # 3.5 s later, all still connected
        c.ping()


# --------------------------------------------------------------------------- wills


@pytest.mark.parametrize("qos,retain", [(0, False), (1, False), (2, False), (1, True), (2, True)])
def test_will_published_with_its_qos_and_retain_on_abnormal_close(broker, clients, qos, retain):
    """[MQTT-3.1.2-8] published when the connection closes without DISCONNECT, at its
    QoS; [MQTT-3.1.2-16] non-retained / [MQTT-3.1.2-17] retained. Live subscribers get
    RETAIN=0 [MQTT-3.3.1-9]; a later subscriber gets the retained will with RETAIN=1."""
    watcher = clients(broker, client_id="w-watch")
    assert watcher.sub(1, ("will/#", 2)) == [2]
    w = clients(broker, client_id="w-owner", will=("will/t", b"bye", qos, retain))
    w.close()  # abnormal: no DISCONNECT
    (p,) = watcher.publishes(1)
    assert (p.topic, p.payload, p.qos, p.retain, p.dup) == ("will/t", b"bye", qos, False, False)
    watcher.ack(p)
    late = clients(broker, client_id="w-late")
    assert late.sub(1, ("will/t", 2)) == [2]
    if retain:
        (r,) = late.publishes(1)
        assert (r.topic, r.payload, r.qos, r.retain) == ("will/t", b"bye", qos, True)
    else:
        late.expect_silence(0.3)


def test_will_not_published_after_disconnect(broker, clients):
    """[MQTT-3.14.4-3] DISCONNECT discards the will; [MQTT-3.1.2-10]."""
    watcher = clients(broker, client_id="wd-watch")
    assert watcher.sub(1, ("wd/#", 1)) == [1]
    w = clients(broker, client_id="wd-owner", will=("wd/will", b"must not", 1, True))
    w.send(mqttraw.DISCONNECT_BYTES)
    w.expect_closed()  # the broker has processed the DISCONNECT
    marker = clients(broker, client_id="wd-marker")
    marker.pub("wd/marker", b"after", qos=1)
    (p,) = watcher.publishes(1)
    assert (p.topic, p.payload) == ("wd/marker", b"after")
    late = clients(broker, client_id="wd-late")
    assert late.sub(1, ("wd/will", 1)) == [1]
    late.expect_silence(0.3)  # and it was not retained either


def test_will_published_when_taken_over_by_same_client_id(broker, clients):
    """[MQTT-3.1.4-2] closing the existing connection is a network close, so its will
    is published [MQTT-3.1.2-8]; the new connection's own will is not."""
    watcher = clients(broker, client_id="wt-watch")
    assert watcher.sub(1, ("wt/#", 1)) == [1]
    first = clients(broker, client_id="wt-same", will=("wt/will", b"first", 1, False))
    second = clients(broker, client_id="wt-same", will=("wt/will", b"second", 1, False))
    first.expect_closed()
    (p,) = watcher.publishes(1)
    assert (p.topic, p.payload, p.qos) == ("wt/will", b"first", 1)
    watcher.ack(p)
    second.send(mqttraw.DISCONNECT_BYTES)
    second.expect_closed()
    watcher.expect_silence(0.3)


def test_will_published_when_server_closes_for_protocol_violation(broker, clients):
    """[MQTT-3.1.2-8] the will goes out whenever the connection closes without
    DISCONNECT, including a close the server makes [MQTT-4.8.0-1]."""
    watcher = clients(broker, client_id="wp-watch")
    assert watcher.sub(1, ("wp/#", 0)) == [0]
    w = clients(broker, client_id="wp-owner", will=("wp/will", b"violated", 0, False))
    w.send(mqttraw.publish("wp/+", b"wildcard topic"))  # [MQTT-3.3.2-2]
    w.expect_closed()
    (p,) = watcher.publishes(1)
    assert (p.topic, p.payload) == ("wp/will", b"violated")


def test_no_will_flag_no_will(broker, clients):
    """[MQTT-3.1.2-12] without the will flag nothing is published on an abnormal close."""
    watcher = clients(broker, client_id="wn-watch")
    assert watcher.sub(1, ("#", 0)) == [0]
    w = clients(broker, client_id="wn-owner")
    w.close()
    wait_log(broker, "'wn-owner'", "connection closed by client")  # the broker saw the close
    marker = clients(broker, client_id="wn-marker")
    marker.pub("wn/marker", b"m", qos=1)
    (p,) = watcher.publishes(1)
    assert p.topic == "wn/marker"
    watcher.expect_silence(0.3)


def test_empty_retained_will_clears_the_retained_message(broker, clients):
    """[MQTT-3.3.1-10] a will is published as a normal PUBLISH: retained + empty payload
    removes the topic's retained message."""
    pub = clients(broker, client_id="we-pub")
    pub.pub("we/status", b"online", qos=1, retain=True)
    w = clients(broker, client_id="we-owner", will=("we/status", b"", 1, True))
    watcher = clients(broker, client_id="we-watch")
    assert watcher.sub(1, ("we/status", 1)) == [1]
    (r,) = watcher.publishes(1)
    assert (r.payload, r.retain) == (b"online", True)
    watcher.ack(r)
    w.close()
    (p,) = watcher.publishes(1)
    assert (p.payload, p.retain) == (b"", False)
    watcher.ack(p)
    late = clients(broker, client_id="we-late")
    assert late.sub(1, ("we/status", 1)) == [1]
    late.expect_silence(0.3)
