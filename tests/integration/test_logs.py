"""The broker log says who connected from where, and why a connection was refused or closed."""

from __future__ import annotations

import pytest

from support import mqttraw
from support.integration import make_password_file, wait_log

pytestmark = pytest.mark.process


def peer(c) -> str:
    host, port = c.sock.getsockname()[:2]
    return f"{host}:{port}"


def test_startup_line_names_address_and_port(broker):
    """The first lines say where the broker listens. (Operations.)"""
    wait_log(broker, "listening on", f"127.0.0.1:{broker.port}")


def test_connect_is_logged_with_client_id_address_and_user(broker_factory, tmp_path, clients):
    """Each accepted CONNECT is logged with ClientId, peer address, user and keepalive.
    (Operations.)"""
    pw = make_password_file(tmp_path / "pw", {"loguser": "pw"})
    b = broker_factory("--password-file", str(pw))
    c = clients(b, client_id="log-conn", username="loguser", password="pw", keepalive=42)
    wait_log(b, "'log-conn'", "connected", peer(c), "loguser", "42")


def test_refusals_are_logged_with_the_reason(broker_factory, tmp_path, clients):
    """CONNACK refusals name client, address and the return code's meaning. (Operations; the
    refusals are [MQTT-3.2.2-5].)"""
    pw = make_password_file(tmp_path / "pw", {"alice": "right"})
    b = broker_factory("--password-file", str(pw), "--allow-anonymous", "false")
    bad = clients.raw(b)
    bad.send(mqttraw.connect(client_id="log-badpw", username="alice", password="wrong"))
    bad.expect_closed()
    wait_log(b, "'log-badpw'", peer(bad), "0x04", "bad user name or password")
    anon = clients.raw(b)
    anon.send(mqttraw.connect(client_id="log-anon"))
    anon.expect_closed()
    wait_log(b, "'log-anon'", peer(anon), "0x05", "not authorized")
    lvl = clients.raw(b)
    lvl.send(mqttraw.connect(client_id="log-level", level=3))
    lvl.expect_closed()
    # (the payload of an unknown protocol level is not parsed, so no ClientId here)
    wait_log(b, peer(lvl), "0x01", "protocol", "level 3")
    empty = clients.raw(b)
    empty.send(mqttraw.connect(client_id="", clean=False))
    empty.expect_closed()
    wait_log(b, peer(empty), "0x02", "identifier rejected")


def test_closes_are_logged_with_the_reason(broker_factory, clients):
    """Every close says why: client close, DISCONNECT, protocol violation with its statement id
    ([MQTT-4.8.0-1]), takeover by whom ([MQTT-3.1.4-2]), connect timeout, keepalive
    ([MQTT-3.1.2-24]). (Operations.)"""
    b = broker_factory("--connect-timeout", "0.5")
    gone = clients(b, client_id="log-gone")
    p_gone = peer(gone)
    gone.close()
    wait_log(b, "'log-gone'", p_gone, "closed by client")

    polite = clients(b, client_id="log-polite")
    polite.send(mqttraw.DISCONNECT_BYTES)
    polite.expect_closed()
    wait_log(b, "'log-polite'", peer(polite), "DISCONNECT")

    rude = clients(b, client_id="log-rude")
    rude.send(mqttraw.publish("a/#", b"x"))
    rude.expect_closed()
    wait_log(b, "'log-rude'", peer(rude), "protocol violation", "MQTT-3.3.2-2")

    first = clients(b, client_id="log-twice")
    second = clients(b, client_id="log-twice")
    first.expect_closed()
    wait_log(b, "'log-twice'", peer(first), peer(second))  # taken over: by whom

    mute = clients.raw(b)
    mute.expect_closed()
    wait_log(b, peer(mute), "CONNECT", "timeout")

    sleepy = clients(b, client_id="log-sleepy", keepalive=1)
    sleepy.expect_closed(timeout=5)
    wait_log(b, "'log-sleepy'", peer(sleepy), "keepalive")


def test_no_tracebacks_in_a_busy_log(broker, clients):
    """Normal traffic, refusals and protocol errors are logged as lines, not tracebacks.
    (Operations.)"""
    c = clients(broker, client_id="busy")
    assert c.sub(1, ("busy/#", 2)) == [2]
    for qos in (0, 1, 2):
        c.pub("busy/t", b"x", qos=qos, pid=qos + 1)
    bad = clients(broker, client_id="busy-bad")
    bad.send(b"\xf0\x00")
    bad.expect_closed()
    c.send(mqttraw.DISCONNECT_BYTES)
    c.expect_closed()
    wait_log(broker, "'busy'", "DISCONNECT")
    assert "Traceback" not in broker.log()
