"""Node-wide memory limits (issue 13): all connections' buffers together, and the bytes held
by connections that have not been answered CONNACK yet. Real node processes, raw sockets.
(Broker limits, no statement of the standard.)"""

from __future__ import annotations

import socket
import struct
import threading

import pytest

from support import mqttraw
from support.integration import Client, connack, control_roundtrip, log_has, wait_log
from support.processes import wait_for

pytestmark = pytest.mark.process


def _stuck_subscriber(b, client_id: str, topic_filter: str) -> socket.socket:
    """Subscribes, reads its CONNACK and SUBACK, and never reads again."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.settimeout(5)
    s.connect((b.host, b.port))
    s.sendall(mqttraw.connect(client_id=client_id) + mqttraw.subscribe(1, (topic_filter, 0)))
    head = b""
    while len(head) < 9:
        head += s.recv(9 - len(head))
    return s


def test_buffers_over_the_budget_pause_reading_from_clients_until_they_drain(broker_factory):
    """Stuck subscribers fill their output buffers past --buffer-memory (1 MiB): the node
    stops reading from clients and says so; once the stuck ones are reset as slow consumers
    the buffers drain, reading resumes and a fresh pair works."""
    b = broker_factory(
        "--buffer-memory",
        str(1 << 20),
        "--max-write-buffer",
        str(8 << 20),
        "--backpressure-timeout",
        "0.2",
        "--slow-consumer-timeout",
        "2",
        "--sys-interval",
        "0",
    )
    stuck = [_stuck_subscriber(b, f"mem-stuck-{i}", "mem/#") for i in range(3)]
    flooder = Client(b.host, b.port, timeout=10)
    errors: list = []
    try:
        assert connack(flooder.connect(client_id="mem-flooder"))[1] == 0
        chunk = b"".join(mqttraw.publish("mem/t", b"M" * 4000) for _ in range(250))  # ~1 MB

        def flood():
            try:
                for _ in range(6):
                    flooder.send(chunk)
            except OSError as exc:
                errors.append(exc)

        t = threading.Thread(target=flood, daemon=True)
        t.start()
        wait_log(b, "over limits.buffer_memory", timeout=10)
        wait_log(b, "'mem-stuck-", "slow consumer", timeout=10)
        wait_log(b, "reading from clients again", timeout=10)
        t.join(20)
        assert not t.is_alive() and errors == []
        control_roundtrip(b, "after-memory-pause")
        assert "Traceback" not in b.log() and not log_has(b, "failed"), b.log()[-3000:]
    finally:
        for s in stuck:
            s.close()
        flooder.close()


def test_unauthenticated_connections_share_the_preauth_budget(broker_factory):
    """Two connections each send 40 kB of a 60 kB CONNECT and hold it before CONNACK; the one
    whose bytes would take the total past --preauth-memory (64 KiB) is reset and counted, the
    other completes its CONNECT and is served, and an ordinary client still connects."""
    b = broker_factory("--preauth-memory", "65536", "--max-connect-size", "65536", "--connect-timeout", "10")
    body = b"\x00\x04MQTT\x04\x02\x00\x3c" + struct.pack(">H", 60000) + b"c" * 60000
    connect = b"\x10" + mqttraw.varint(len(body)) + body
    pair = [mqttraw.RawClient(b.host, b.port), mqttraw.RawClient(b.host, b.port)]
    try:
        for c in pair:
            c.send(connect[:40000])
        wait_log(b, "limits.preauth_memory", timeout=5)
        with Client(b.host, b.port) as c:  # a small CONNECT still fits
            assert connack(c.connect(client_id="preauth-ok"))[1] == 0
        served, reset = [], []
        for c in pair:
            try:
                c.send(connect[40000:])
                p = c.recv()
                assert (p.type, p.body) == (mqttraw.CONNACK, b"\x00\x00"), p
                served.append(c)
            except (mqttraw.Closed, ConnectionResetError, BrokenPipeError):
                reset.append(c)
        assert len(served) == 1 and len(reset) == 1
        assert not log_has(b, "Traceback")
    finally:
        for c in pair:
            c.sock.close()


def test_blocked_output_drops_qos0_resets_the_client_and_its_session_keeps_qos1(broker_factory):
    """A persistent QoS 1 subscriber stops reading while QoS 0 floods its topic: over
    --max-write-buffer (256 KiB) its QoS 0 messages are dropped and counted, after
    --slow-consumer-timeout it is reset, and when it comes back its session still holds
    every QoS 1 message the publisher was acknowledged [MQTT-3.1.2-5] [MQTT-4.4.0-1]."""
    b = broker_factory(
        "--max-write-buffer",
        str(256 * 1024),
        "--slow-consumer-timeout",
        "3",
        "--backpressure-timeout",
        "0.2",
        "--sys-interval",
        "0.2",
    )
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.settimeout(5)
    s.connect((b.host, b.port))
    s.sendall(mqttraw.connect(client_id="keeper", clean=False) + mqttraw.subscribe(1, ("keep/#", 1)))
    head = b""
    while len(head) < 9:
        head += s.recv(9 - len(head))
    pub = Client(b.host, b.port, timeout=10)
    watch = Client(b.host, b.port)
    try:
        assert connack(pub.connect(client_id="keep-pub"))[1] == 0
        assert connack(watch.connect(client_id="keep-watch"))[1] == 0
        assert watch.sub(
            1, ("$SYS/broker/clients/outputs_blocked", 0), ("$SYS/broker/publish/dropped/slow_qos0", 0)
        ) == [0, 0]
        flood = b"".join(mqttraw.publish("keep/flood", b"F" * 4000) for _ in range(500))  # 2 MB
        for _ in range(4):  # more than the kernel's socket buffers take
            pub.send(flood)
        wait_for(
            lambda: _sys_value(watch, "clients/outputs_blocked") > 0, 10, what="the subscriber's output to be blocked"
        )
        pub.send(flood)  # QoS 0 for a blocked output: dropped
        for i in range(1, 21):
            pub.pub("keep/q1", f"q1-{i}".encode(), qos=1, pid=i)
        wait_for(
            lambda: _sys_value(watch, "publish/dropped/slow_qos0") > 0, 10, what="dropped QoS 0 messages to be counted"
        )
        wait_log(b, "'keeper'", "slow consumer", timeout=10)
        s.close()
        with Client(b.host, b.port) as back:
            assert connack(back.connect(client_id="keeper", clean=False))[0] & 1 == 1
            got = []
            while len([g for g in got if g.startswith(b"q1-")]) < 20:
                p = back.recv()
                if p.type == mqttraw.PUBLISH:
                    if p.qos:
                        back.send(mqttraw.puback(p.packet_id))
                    got.append(p.payload)
            assert [g for g in got if g.startswith(b"q1-")] == [f"q1-{i}".encode() for i in range(1, 21)]
        assert "Traceback" not in b.log()
    finally:
        s.close()
        pub.close()
        watch.close()


def _sys_value(client: Client, name: str) -> int:
    """The newest value of ``$SYS/broker/<name>`` that arrives within 0.5 s, or -1."""
    value = -1
    try:
        while True:
            p = client.recv(0.5)
            if p.type == mqttraw.PUBLISH and p.topic == f"$SYS/broker/{name}":
                value = int(p.payload)
                if value > 0:
                    return value
    except TimeoutError:
        return value
