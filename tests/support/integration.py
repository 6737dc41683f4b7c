"""Helpers for the black-box integration tests (tests/integration).

Their fixtures (``clients``, ``paho``) are in tests/integration/conftest.py.
Everything on the wire is built by ``support.mqttraw`` (independent of
mqttmesh's codec), or sent by real clients (paho-mqtt, mosquitto_pub/sub).
"""

from __future__ import annotations

import queue
import subprocess
import sys
import threading
import time
from collections import deque
from pathlib import Path

from support import mqttraw
from support.mqttraw import CONNACK, PINGRESP, PUBACK, PUBCOMP, PUBLISH, PUBREC, SUBACK, UNSUBACK, Packet
from support.processes import wait_for

PYTHON = sys.executable


# --------------------------------------------------------------------------- raw client


class Client(mqttraw.RawClient):
    """RawClient plus a backlog: PUBLISHes that arrive while waiting for an ack are kept.

    The standard lets a server send matching PUBLISHes (retained ones, say)
    before the SUBACK (3.8.4), so waiting for an ack must not drop them.
    """

    def __init__(self, host: str, port: int, timeout: float = 5.0, source: str | None = None):
        super().__init__(host, port, timeout, source)
        self.backlog: deque[Packet] = deque()

    def recv(self, timeout: float | None = None) -> Packet:
        if self.backlog:
            return self.backlog.popleft()
        return super().recv(timeout)

    def expect_ack(self, ptype: int, pid: int, timeout: float | None = None) -> Packet:
        """The ack ``ptype`` for ``pid``; PUBLISHes before it go to the backlog."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        kept = []
        try:
            while True:
                p = mqttraw.RawClient.recv(self, max(0.0, deadline - time.monotonic()))
                if p.type == PUBLISH:
                    kept.append(p)
                    continue
                assert p.type == ptype and p.packet_id == pid, f"expected type {ptype} for packet id {pid}, got {p!r}"
                return p
        finally:
            self.backlog.extend(kept)

    def sub(self, pid: int, *filters) -> list[int]:
        """SUBSCRIBE (filter, qos) pairs; the SUBACK return codes."""
        self.send(mqttraw.subscribe(pid, *filters))
        return list(self.expect_ack(SUBACK, pid).body[2:])

    def unsub(self, pid: int, *filters) -> None:
        self.send(mqttraw.unsubscribe(pid, *filters))
        self.expect_ack(UNSUBACK, pid)

    def pub(self, topic, payload=b"", qos=0, retain=False, pid=1, dup=False) -> None:
        """PUBLISH and complete the QoS flow (PUBACK, or PUBREC-PUBREL-PUBCOMP)."""
        self.send(mqttraw.publish(topic, payload, qos, retain, dup, pid if qos else None))
        if qos == 1:
            self.expect_ack(PUBACK, pid)
        elif qos == 2:
            self.expect_ack(PUBREC, pid)
            self.send(mqttraw.pubrel(pid))
            self.expect_ack(PUBCOMP, pid)

    def publishes(self, n: int, timeout: float = 5.0) -> list[Packet]:
        """The next ``n`` packets, each of which must be a PUBLISH (no acks sent)."""
        deadline = time.monotonic() + timeout
        out = []
        while len(out) < n:
            p = self.recv(max(0.0, deadline - time.monotonic()))
            assert p.type == PUBLISH, f"expected PUBLISH, got {p!r}"
            out.append(p)
        return out

    def ack(self, p: Packet) -> None:
        """Acknowledge a received PUBLISH as a well-behaved client (QoS 2: PUBREC only)."""
        if p.qos == 1:
            self.send(mqttraw.puback(p.packet_id))
        elif p.qos == 2:
            self.send(mqttraw.pubrec(p.packet_id))

    def ping(self, timeout: float | None = None) -> None:
        self.send(mqttraw.PINGREQ_BYTES)
        p = self.recv(timeout)
        assert p.type == PINGRESP, f"expected PINGRESP, got {p!r}"


def connack(p: Packet) -> tuple[int, int]:
    """(session present, return code) of a CONNACK."""
    assert p.type == CONNACK and len(p.body) == 2, f"not a CONNACK: {p!r}"
    return p.body[0], p.body[1]


def open_client(broker, client_id="c", clean=True, expect_rc=0, timeout=5.0, **kw) -> Client:
    """A raw connection that sent CONNECT and got a CONNACK with ``expect_rc``."""
    c = Client(broker.host, broker.port, timeout)
    try:
        present, rc = connack(c.connect(client_id=client_id, clean=clean, **kw))
        assert rc == expect_rc, f"CONNACK return code {rc:#x}, expected {expect_rc:#x}"
        c.session_present = present
    except BaseException:
        c.close()
        raise
    return c


def log_has(broker, *needles: str) -> bool:
    """One line of the broker log contains every needle."""
    return any(all(n in line for n in needles) for line in broker.log().splitlines())


def wait_log(broker, *needles: str, timeout: float = 5.0) -> None:
    wait_for(
        lambda: log_has(broker, *needles), timeout, what=f"a log line with {needles!r}; log:\n{broker.log()[-3000:]}"
    )


def control_roundtrip(broker, tag: str, timeout: float = 5.0) -> None:
    """A fresh publisher/subscriber pair still works: QoS 1 there and back."""
    with Client(broker.host, broker.port, timeout) as sub, Client(broker.host, broker.port, timeout) as pub:
        assert connack(sub.connect(client_id=f"ctl-sub-{tag}"))[1] == 0
        assert connack(pub.connect(client_id=f"ctl-pub-{tag}"))[1] == 0
        assert sub.sub(1, (f"control/{tag}", 1)) == [1]
        pub.pub(f"control/{tag}", b"alive", qos=1, pid=7)
        (p,) = sub.publishes(1, timeout)
        assert (p.topic, p.payload, p.qos) == (f"control/{tag}", b"alive", 1)


# --------------------------------------------------------------------------- paho-mqtt


class Paho:
    """A paho-mqtt 2.x client with blocking connect/subscribe and a message queue."""

    def __init__(self, client_id: str, **kw):
        import paho.mqtt.client as mqtt

        self.mqtt = mqtt
        self.c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv311, **kw)
        self.messages: queue.Queue = queue.Queue()
        self.connacks: queue.Queue = queue.Queue()
        self.subacks: dict[int, list] = {}
        self.disconnected = threading.Event()
        self.c.on_message = lambda c, u, m: self.messages.put((m.topic, bytes(m.payload), m.qos, bool(m.retain)))
        self.c.on_connect = lambda c, u, flags, rc, props: self.connacks.put(rc)
        self.c.on_subscribe = lambda c, u, mid, codes, props: self.subacks.__setitem__(mid, codes)
        self.c.on_disconnect = lambda c, u, flags, rc, props: self.disconnected.set()
        self.started = False

    def connect(self, broker, keepalive: int = 60, timeout: float = 5.0):
        """Connect and return the CONNACK reason code; the loop is stopped on refusal."""
        self.c.connect(broker.host, broker.port, keepalive)
        self.c.loop_start()
        self.started = True
        rc = self.connacks.get(timeout=timeout)
        if rc.is_failure:
            self.stop()
        return rc

    def subscribe(self, topic: str, qos: int, timeout: float = 5.0) -> list:
        result, mid = self.c.subscribe(topic, qos)
        assert result == self.mqtt.MQTT_ERR_SUCCESS
        return wait_for(lambda: self.subacks.get(mid), timeout, what=f"SUBACK for {topic}")

    def publish(self, topic: str, payload: bytes, qos: int = 0, retain: bool = False, timeout: float = 5.0) -> None:
        info = self.c.publish(topic, payload, qos, retain)
        info.wait_for_publish(timeout)
        assert info.is_published(), f"paho did not complete the publish to {topic}"

    def get(self, timeout: float = 5.0):
        return self.messages.get(timeout=timeout)

    def stop(self) -> None:
        if self.started:
            self.started = False
            try:
                self.c.disconnect()
            finally:
                self.c.loop_stop()


# --------------------------------------------------------------------------- subprocesses


def run_cli(*args: str, timeout: float = 30.0, cwd=None) -> subprocess.CompletedProcess:
    """``python -m mqttmesh ARGS`` to completion (bounded by ``timeout``)."""
    return subprocess.run([PYTHON, "-m", "mqttmesh", *args], capture_output=True, text=True, timeout=timeout, cwd=cwd)


def make_password_file(path: Path, users: dict[str, str]) -> Path:
    for user, password in users.items():
        r = run_cli("passwd", str(path), user, "-b", password, "--iterations", "1000")
        assert r.returncode == 0, r.stderr
    return path
