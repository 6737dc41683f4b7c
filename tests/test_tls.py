"""TLS: a listener for clients (optionally with client certificates) and peer links over TLS."""

from __future__ import annotations

import shutil
import ssl
import subprocess
import sys

import paho.mqtt.client as mqtt
import pytest

from mqttmesh.mesh.link.peerauth import PEER_PROTOCOL
from support import mqttraw
from support.mesh import Subscriber, publish, wait_converged, wait_interest
from support.pki import make_pki
from support.processes import free_port, wait_for

pytestmark = [
    pytest.mark.process,
    pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command"),
]


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    """A test CA, a node certificate for 127.0.0.1 and a client certificate."""
    return make_pki(tmp_path_factory.mktemp("pki"))


def _paho(port, pki, cert=None, role="c"):
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=f"tls-{role}-{port}")
    client.tls_set(
        ca_certs=str(pki / "ca.pem"),
        certfile=str(pki / f"{cert}.pem") if cert else None,
        keyfile=str(pki / f"{cert}.key") if cert else None,
    )
    return client


def _roundtrip(port, pki, cert=None):
    got = []
    sub = _paho(port, pki, cert, "sub")
    subacked = []
    sub.on_message = lambda c, u, m: got.append(m.payload)
    sub.on_subscribe = lambda c, u, mid, codes, props: subacked.append(mid)
    sub.connect("127.0.0.1", port)
    sub.loop_start()
    try:
        wait_for(sub.is_connected, what="TLS subscriber connected")
        sub.subscribe("secure/#", qos=1)
        wait_for(lambda: subacked, what="SUBACK")
        pub = _paho(port, pki, cert, "pub")
        pub.connect("127.0.0.1", port)
        pub.loop_start()
        try:
            pub.publish("secure/x", b"over tls", qos=1).wait_for_publish(5)
            wait_for(lambda: got, what="the message over TLS")
        finally:
            pub.disconnect()
            pub.loop_stop()
    finally:
        sub.disconnect()
        sub.loop_stop()
    return got


@pytest.mark.interop
def test_tls_listener_beside_the_plain_one(broker_factory, pki):
    tls_port = free_port()
    broker_factory("--tls-port", str(tls_port), "--tls-cert", str(pki / "node.pem"), "--tls-key", str(pki / "node.key"))
    assert _roundtrip(tls_port, pki) == [b"over tls"]
    out = subprocess.run(
        [
            "mosquitto_pub",
            "-h",
            "127.0.0.1",
            "-p",
            str(tls_port),
            "--cafile",
            str(pki / "ca.pem"),
            "-t",
            "secure/y",
            "-m",
            "1",
            "-q",
            "1",
        ],
        capture_output=True,
        timeout=20,
    )
    assert out.returncode == 0, out.stderr


def test_client_certificate_required(broker_factory, pki):
    tls_port = free_port()
    broker_factory(
        "--tls-port",
        str(tls_port),
        "--tls-cert",
        str(pki / "node.pem"),
        "--tls-key",
        str(pki / "node.key"),
        "--tls-ca",
        str(pki / "ca.pem"),
        "--tls-require-certificate",
        "true",
    )
    assert _roundtrip(tls_port, pki, cert="client") == [b"over tls"]
    ctx = ssl.create_default_context(cafile=str(pki / "ca.pem"))
    import socket

    with socket.create_connection(("127.0.0.1", tls_port), timeout=5) as raw_sock:
        with pytest.raises((ssl.SSLError, ConnectionError, OSError)):
            with ctx.wrap_socket(raw_sock, server_hostname="127.0.0.1") as s:
                s.sendall(b"\x10\x0c\x00\x04MQTT\x04\x02\x00\x3c\x00\x00")
                if not s.recv(4):  # TLS 1.3 reports the refusal on the first read
                    raise ConnectionError("closed")


def test_peer_links_over_tls(broker_factory, pki):
    tls = [
        "--tls-cert",
        str(pki / "node.pem"),
        "--tls-key",
        str(pki / "node.key"),
        "--tls-ca",
        str(pki / "ca.pem"),
        "--mesh-tls",
        "true",
        "--cluster-secret",
        "s",
        "--connect",
        "configured",
        "--status-interval",
        "0.1",
    ]
    tls_a = free_port()
    a = broker_factory("--tls-port", str(tls_a), *tls, name="a")
    b = broker_factory("--tls-port", str(free_port()), *tls, "--peer", f"127.0.0.1:{tls_a}", name="b")
    nodes = {"a": a, "b": b}
    wait_converged(nodes, [("b", "a")])
    sub = Subscriber(a, "tls-sub", "over/#", qos=1)
    try:
        wait_interest(nodes, "over/#", "a")
        publish(b, "over/x", [b"through a TLS link"], qos=1)
        sub.wait_count(1)
        assert sub.payloads() == [b"through a TLS link"]
    finally:
        sub.close()


def test_tls_listener_without_certificate_is_a_config_error():
    out = subprocess.run(
        [sys.executable, "-m", "mqttmesh", "broker", "--port", "0", "--tls-port", str(free_port())],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 2
    assert "tls.cert_file" in out.stderr


def _peer_connect_over(sock) -> bytes:
    """Send a peer CONNECT (the current protocol, a well-formed nonce) and return the CONNACK's 4 bytes."""
    sock.sendall(
        mqttraw.connect(
            "$mesh-x",
            clean=False,
            keepalive=2,
            username="mqttmesh-peer",
            password=b"%d|x|1|" % PEER_PROTOCOL + b"ab" * 16,
        )
    )
    data = b""
    while len(data) < 4:
        chunk = sock.recv(4 - len(data))
        if not chunk:
            break
        data += chunk
    return data


def test_mutual_tls_between_peers_leaves_clients_without_certificates_alone(broker_factory, pki):
    import socket

    tls = [
        "--tls-cert",
        str(pki / "node.pem"),
        "--tls-key",
        str(pki / "node.key"),
        "--tls-ca",
        str(pki / "ca.pem"),
        "--mesh-tls",
        "true",
        "--mesh-tls-mutual",
        "true",
        "--cluster-secret",
        "s",
        "--connect",
        "configured",
        "--status-interval",
        "0.1",
    ]
    tls_a = free_port()
    a = broker_factory("--tls-port", str(tls_a), *tls, name="a")
    b = broker_factory("--tls-port", str(free_port()), *tls, "--peer", f"127.0.0.1:{tls_a}", name="b")
    nodes = {"a": a, "b": b}
    wait_converged(nodes, [("b", "a")])  # each node's certificate is also its client certificate
    sub = Subscriber(a, "mtls-sub", "over/#", qos=1)
    try:
        wait_interest(nodes, "over/#", "a")
        publish(b, "over/x", [b"through a mutual TLS link"], qos=1)
        sub.wait_count(1)
    finally:
        sub.close()
    # a peer CONNECT without a client certificate: not authorized, on the TLS port and the plain one
    ctx = ssl.create_default_context(cafile=str(pki / "ca.pem"))
    with socket.create_connection(("127.0.0.1", tls_a), timeout=5) as raw_sock:
        with ctx.wrap_socket(raw_sock, server_hostname="127.0.0.1") as s:
            assert _peer_connect_over(s) == b"\x20\x02\x00\x05"
    with socket.create_connection(("127.0.0.1", a.port), timeout=5) as s:
        assert _peer_connect_over(s) == b"\x20\x02\x00\x05"
    wait_for(lambda: "a peer link needs a TLS client certificate" in a.log(), what="the refusal logged")
    # with a certificate of the CA it may start the handshake (and must then prove the secret)
    ctx.load_cert_chain(str(pki / "client.pem"), str(pki / "client.key"))
    with socket.create_connection(("127.0.0.1", tls_a), timeout=5) as raw_sock:
        with ctx.wrap_socket(raw_sock, server_hostname="127.0.0.1") as s:
            assert _peer_connect_over(s) == b"\x20\x02\x00\x00"
    # ordinary TLS clients need no certificate, as before
    assert _roundtrip(tls_a, pki) == [b"over tls"]


def test_mutual_tls_needs_mesh_tls():
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "mqttmesh",
            "broker",
            "--port",
            "0",
            "--cluster-secret",
            "s",
            "--mesh-tls-mutual",
            "true",
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 2
    assert "mesh.tls_mutual" in out.stderr
