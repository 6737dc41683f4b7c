"""Hostile TLS clients: sockets that never start the handshake, certificates the node must
refuse. The PKI (two CAs, a node certificate for 127.0.0.1, a client certificate from each
CA) is made at test time with the openssl command.
"""

from __future__ import annotations

import shutil
import socket
import ssl

import pytest

from support import attacks, mqttraw, probes
from support.hostile import check, run, target_of
from support.processes import free_port

pytestmark = [
    pytest.mark.hostile,
    pytest.mark.process,
    pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command"),
]


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return attacks.make_pki(tmp_path_factory.mktemp("pki"))


def tls_args(pki, port):
    return ["--tls-port", str(port), "--tls-cert", str(pki / "node.pem"), "--tls-key", str(pki / "node.key")]


def test_idle_tls_handshakes_count_and_time_out(nodes, pki):
    """20 TCP connections to the TLS port that never start the handshake (--connect-timeout
    2, --max-connections 22: the canary's 2 and these 20 fill it): while they are open a
    21st client on the plain port is refused, and the node closes them within 2 + 1.5 s
    (the connect timeout counts from accept and covers the handshake)."""
    port = free_port()
    b = nodes(*tls_args(pki, port), "--connect-timeout", "2", "--max-connections", "22")
    t = target_of(b, tls_port=port, connect_timeout=2.0, max_connections=22)
    check(run(t, attacks.idle_tls_handshakes, n=20, margin=1.5))


def test_client_certificates_are_checked(nodes, pki):
    """--tls-require-certificate with --tls-ca: a TLS client without a certificate, or with
    one from another CA, gets no CONNACK; one with a certificate from the CA connects and
    round-trips a QoS 1 message. The canary (plain port) does not notice."""
    port = free_port()
    b = nodes(*tls_args(pki, port), "--tls-ca", str(pki / "ca.pem"), "--tls-require-certificate", "true")
    check(run(target_of(b, tls_port=port), _certificates, pki, port))


def _tls_connect(pki, port, cert):
    ctx = ssl.create_default_context(cafile=str(pki / "ca.pem"))
    if cert:
        ctx.load_cert_chain(str(pki / f"{cert}.pem"), str(pki / f"{cert}.key"))
    raw = socket.create_connection(("127.0.0.1", port), timeout=5)
    try:
        s = ctx.wrap_socket(raw, server_hostname="127.0.0.1")
    except BaseException:
        raw.close()
        raise
    return s


def _certificates(target, canary, pki, port):
    out = probes.Outcome("TLS client certificates")
    for cert in (None, "rogue"):
        what = "no certificate" if cert is None else "a certificate from another CA"
        try:
            s = _tls_connect(pki, port, cert)
        except (ssl.SSLError, OSError):
            continue  # refused in the handshake
        try:
            s.sendall(mqttraw.connect(client_id=f"tls-{cert}"))
            data = s.recv(4)  # TLS 1.3 reports a refused certificate on the first read
            if data:
                out.problems.append(f"a TLS client with {what} was answered: {data!r}")
        except (ssl.SSLError, OSError):
            pass
        finally:
            s.close()
    s = _tls_connect(pki, port, "client")
    try:
        s.sendall(
            mqttraw.connect(client_id="tls-good")
            + mqttraw.subscribe(1, ("tls/t", 1))
            + mqttraw.publish("tls/t", b"over tls", qos=1, pid=2)
        )
        got = b""
        while got.count(b"over tls") < 1:
            data = s.recv(4096)
            if not data:
                out.problems.append("the client with a good certificate was disconnected")
                break
            got += data
        if not got.startswith(b"\x20\x02\x00\x00"):
            out.problems.append(f"the client with a good certificate got {got[:8]!r}")
    finally:
        s.close()
    return out
