"""CONNECT / CONNACK over raw sockets (MQTT 3.1.1 sections 3.1, 3.2)."""

from __future__ import annotations

import socket
import time

import pytest

from support import mqttraw
from support.integration import Client, connack
from support.mqttraw import CONNACK, PINGRESP, s

pytestmark = pytest.mark.process


def read_until_closed(c: Client, timeout: float = 5.0) -> list:
    """Every packet the broker sends until it closes the connection."""
    got = []
    deadline = time.monotonic() + timeout
    while True:
        try:
            got.append(c.recv(max(0.0, deadline - time.monotonic())))
        except mqttraw.Closed:
            return got
        except TimeoutError:
            raise AssertionError(f"the broker did not close the connection (got {got!r})") from None


def connect_bytes(flags: int, payload: bytes, proto=b"MQTT", level=4, keepalive=60) -> bytes:
    """A CONNECT whose flags byte and payload are given exactly."""
    body = s(proto) + bytes([level, flags]) + keepalive.to_bytes(2, "big") + payload
    return mqttraw.packet(0x10, body)


# --------------------------------------------------------------------------- protocol name/level


@pytest.mark.parametrize("level", [3, 0, 6, 255])
def test_unsupported_protocol_level_gets_connack_0x01_then_close(broker, clients, level):
    """[MQTT-3.1.2-2] CONNACK 0x01 then disconnect; session present 0 [MQTT-3.2.2-4]. (Level
    5 is MQTT 5, served: tests/integration/test_mqtt5.py.)"""
    c = clients.raw(broker)
    c.send(mqttraw.connect(client_id="lvl", level=level))
    packets = read_until_closed(c)
    assert [(p.type, p.flags, p.body) for p in packets] == [(CONNACK, 0, b"\x00\x01")]


def test_level_5_in_the_311_layout_is_malformed_mqtt5(broker, clients):
    """A CONNECT of level 5 is read as MQTT 5: without its property length, the ClientId's
    length byte is read as one and the rest does not parse: closed without CONNACK (4.13)."""
    c = clients.raw(broker)
    c.send(mqttraw.connect(client_id="lvl", level=5))
    assert read_until_closed(c) == []


@pytest.mark.parametrize("name", [b"MQTX", b"mqtt", b"MQT", b"", b"MQTT\x00"])
def test_wrong_protocol_name_closed_without_connack(broker, clients, name):
    """[MQTT-3.1.2-1] we do not continue under another spec, so [MQTT-3.1.4-1]: close, no
    CONNACK."""
    c = clients.raw(broker)
    c.send(mqttraw.connect(client_id="name", proto=name))
    assert read_until_closed(c) == []


def test_reserved_connect_flag_closes_without_connack(broker, clients):
    """[MQTT-3.1.2-3] reserved flag bit 0 must be zero; [MQTT-3.1.4-1] no CONNACK."""
    c = clients.raw(broker)
    c.send(mqttraw.connect(client_id="rsv", flags_extra=0x01))
    assert read_until_closed(c) == []


# --------------------------------------------------------------------------- ClientId


def test_empty_client_id_with_clean_session_0_is_rejected_0x02(broker, clients):
    """[MQTT-3.1.3-8] zero-byte ClientId and CleanSession=0: CONNACK 0x02 and close."""
    c = clients.raw(broker)
    c.send(mqttraw.connect(client_id="", clean=False))
    packets = read_until_closed(c)
    assert [(p.type, p.body) for p in packets] == [(CONNACK, b"\x00\x02")]


def test_empty_client_id_with_clean_session_1_gets_a_unique_id(broker, clients):
    """[MQTT-3.1.3-6] accepted, each with its own ClientId: two such clients do not
    take each other over [MQTT-3.1.4-2], and both can publish and subscribe."""
    a = clients(broker, client_id="")
    b = clients(broker, client_id="")
    assert a.session_present == 0 and b.session_present == 0  # [MQTT-3.2.2-1]
    assert a.sub(1, ("anon/t", 1)) == [1]
    b.pub("anon/t", b"hi", qos=1, pid=3)
    (p,) = a.publishes(1)
    assert (p.topic, p.payload) == ("anon/t", b"hi")
    a.ping()
    b.ping()


def test_23_character_alphanumeric_client_id_is_accepted(broker, clients):
    """[MQTT-3.1.3-5] 1 to 23 bytes of [0-9a-zA-Z] must be allowed."""
    c = clients(broker, client_id="abcdefghijklmnopqrstuvW")
    c.ping()
    c1 = clients(broker, client_id="0")
    c1.ping()


# --------------------------------------------------------------------------- flags consistency


@pytest.mark.parametrize(
    "flags,payload,rule",
    [
        (0x02 | 0x08, s("w"), "MQTT-3.1.2-13: will QoS 1 without will flag"),
        (0x02 | 0x10, s("w"), "MQTT-3.1.2-13: will QoS 2 without will flag"),
        (0x02 | 0x20, s("w"), "MQTT-3.1.2-15: will retain without will flag"),
        (0x02 | 0x04 | 0x18, s("w") + s("wt") + s("wm"), "MQTT-3.1.2-14: will QoS 3"),
        (0x02 | 0x04, s("w"), "MQTT-3.1.2-9: will flag without will topic and message"),
        (0x02, s("w") + s("wt") + s("wm"), "MQTT-3.1.2-11: will fields present without will flag"),
        (0x02 | 0x40, s("w") + s("pw"), "MQTT-3.1.2-22: password without user name"),
        (0x02 | 0x80, s("w"), "MQTT-3.1.2-19: user name flag without user name"),
        (0x02 | 0x80 | 0x40, s("w") + s("u"), "MQTT-3.1.2-21: password flag without password"),
        (0x02, s("w") + s("u"), "MQTT-3.1.2-18: user name present without its flag"),
        (0x02, b"", "MQTT-3.1.3-3: no ClientId at all"),
    ],
)
def test_inconsistent_connect_flags_close_without_connack(broker, clients, flags, payload, rule):
    """[MQTT-3.1.4-1] a CONNECT that does not conform to 3.1 closes without CONNACK."""
    c = clients.raw(broker)
    c.send(connect_bytes(flags, payload))
    assert read_until_closed(c) == [], rule


def test_password_without_user_name_closes(broker, clients):
    """[MQTT-3.1.2-22] built with the helper too: password flag set, user name flag not."""
    c = clients.raw(broker)
    c.send(mqttraw.connect(client_id="pw", password="secret"))
    assert read_until_closed(c) == []


# --------------------------------------------------------------------------- packet order


def test_second_connect_is_a_protocol_violation(broker, clients):
    """[MQTT-3.1.0-2] a second CONNECT disconnects the client."""
    c = clients(broker, client_id="twice")
    c.send(mqttraw.connect(client_id="twice"))
    assert read_until_closed(c) == []


@pytest.mark.parametrize(
    "first",
    [
        mqttraw.PINGREQ_BYTES,
        mqttraw.publish("a/b", b"x"),
        mqttraw.subscribe(1, ("a/#", 0)),
        mqttraw.DISCONNECT_BYTES,
    ],
    ids=["PINGREQ", "PUBLISH", "SUBSCRIBE", "DISCONNECT"],
)
def test_first_packet_not_connect_closes(broker, clients, first):
    """[MQTT-3.1.0-1] the first packet must be CONNECT; nothing is answered."""
    c = clients.raw(broker)
    c.send(first)
    assert read_until_closed(c) == []


def test_same_client_id_takes_over_and_closes_the_first(broker, clients):
    """[MQTT-3.1.4-2] the existing connection of that ClientId is closed."""
    first = clients(broker, client_id="dup-id")
    second = clients(broker, client_id="dup-id")
    first.expect_closed()
    second.ping()  # the new connection is the one that stays


def test_takeover_new_connection_owns_the_subscriptions(broker, clients):
    """[MQTT-3.1.4-2] after a takeover with CleanSession=1 the old session is gone
    [MQTT-3.1.2-6]: the new connection does not get the old one's subscription."""
    first = clients(broker, client_id="tk")
    assert first.sub(1, ("tk/t", 0)) == [0]
    second = clients(broker, client_id="tk")
    first.expect_closed()
    assert second.sub(2, ("tk/other", 0)) == [0]
    pub = clients(broker, client_id="tk-pub")
    pub.pub("tk/t", b"old-sub", qos=1, pid=1)
    pub.pub("tk/other", b"new-sub", qos=1, pid=2)
    (p,) = second.publishes(1)
    assert p.payload == b"new-sub"


# --------------------------------------------------------------------------- session present


def test_session_present_flag_follows_stored_state(broker, clients):
    """[MQTT-3.2.2-1] clean=1 -> 0; [MQTT-3.2.2-3] clean=0, nothing stored -> 0;
    [MQTT-3.2.2-2] clean=0 with a stored session -> 1; [MQTT-3.1.2-6] clean=1 discards it."""
    c = clients(broker, client_id="sp", clean=True)
    assert c.session_present == 0
    c.close()
    c = clients(broker, client_id="sp", clean=False)
    assert c.session_present == 0
    c.send(mqttraw.DISCONNECT_BYTES)
    c.expect_closed()
    c = clients(broker, client_id="sp", clean=False)
    assert c.session_present == 1
    c.close()
    c = clients(broker, client_id="sp", clean=True)
    assert c.session_present == 0
    c.send(mqttraw.DISCONNECT_BYTES)
    c.expect_closed()
    c = clients(broker, client_id="sp", clean=False)
    assert c.session_present == 0


def test_connack_is_exactly_four_bytes(broker, clients):
    """[MQTT-3.2.0-1] the first packet from the server is CONNACK: 20 02 00 00."""
    c = clients.raw(broker)
    c.send(mqttraw.connect(client_id="bytes"))
    c.sock.settimeout(5)
    data = b""
    while len(data) < 4:
        chunk = c.sock.recv(4 - len(data))
        assert chunk, "closed before the CONNACK"
        data += chunk
    assert data == b"\x20\x02\x00\x00"


# --------------------------------------------------------------------------- connect timeout


def test_socket_that_never_sends_connect_is_closed_after_connect_timeout(broker_factory):
    """A connection that sends nothing is closed after --connect-timeout (0.5 s). (The standard
    only advises this in prose, 3.1.4: no statement id.)"""
    b = broker_factory("--connect-timeout", "0.5")
    with Client(b.host, b.port) as idle, Client(b.host, b.port) as partial:
        t0 = time.monotonic()
        partial.send(mqttraw.connect(client_id="slow")[:5])  # a CONNECT that never completes
        idle.expect_closed(timeout=5)
        elapsed = time.monotonic() - t0
        partial.expect_closed(timeout=5)
        assert 0.4 <= elapsed <= 3.0, elapsed
    # a client that does send CONNECT in time is unaffected
    with Client(b.host, b.port) as ok:
        assert connack(ok.connect(client_id="in-time"))[1] == 0
        ok.expect_silence(0.8)  # past the connect timeout, still open
        ok.ping()


# --------------------------------------------------------------------------- PINGREQ


def test_pingreq_gets_pingresp(broker, clients):
    """[MQTT-3.12.4-1] PINGREQ -> PINGRESP (d0 00), repeatedly."""
    c = clients(broker, client_id="pinger")
    for _ in range(3):
        c.send(mqttraw.PINGREQ_BYTES)
        p = c.recv()
        assert (p.type, p.flags, p.body) == (PINGRESP, 0, b"")


def test_connect_then_immediate_packets_in_one_segment(broker, clients):
    """Clients need not wait for CONNACK (3.1.4): CONNECT+SUBSCRIBE+PINGREQ in one write
    get CONNACK [MQTT-3.2.0-1] first, then SUBACK, then PINGRESP."""
    c = clients.raw(broker)
    c.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 0)
    c.send(mqttraw.connect(client_id="pipelined") + mqttraw.subscribe(9, ("p/#", 1)) + mqttraw.PINGREQ_BYTES)
    assert connack(c.recv()) == (0, 0)
    p = c.recv()
    assert (p.type, p.body) == (mqttraw.SUBACK, b"\x00\x09\x01")
    assert c.recv().type == PINGRESP


def test_client_id_longer_than_the_limit_is_rejected_0x02(broker_factory, clients):
    """[MQTT-3.1.3-9] a ClientId the server rejects: CONNACK 0x02 and close
    (--max-client-id-length 23 keeps exactly the required 1..23 range [MQTT-3.1.3-5])."""
    b = broker_factory("--max-client-id-length", "23")
    clients(b, client_id="x" * 23).ping()
    c = clients.raw(b)
    c.send(mqttraw.connect(client_id="x" * 24))
    packets = read_until_closed(c)
    assert [(p.type, p.body) for p in packets] == [(CONNACK, b"\x00\x02")]


def test_clean_0_takeover_of_a_clean_1_connection_finds_no_session(broker, clients):
    """[MQTT-3.1.4-2] the clean=1 connection is closed and its session ends with it
    [MQTT-3.1.2-6], so the clean=0 newcomer gets session present 0 [MQTT-3.2.2-3] and
    none of the old subscriptions."""
    first = clients(broker, client_id="tk01", clean=True)
    assert first.sub(1, ("tk01/t", 1)) == [1]
    second = clients(broker, client_id="tk01", clean=False)
    assert second.session_present == 0
    first.expect_closed()
    pub = clients(broker, client_id="tk01-pub")
    pub.pub("tk01/t", b"x", qos=1)
    second.expect_silence(0.3)
