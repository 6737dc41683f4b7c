"""A live Spark source for the mesh: ``spark.readStream.format("mqttmesh")``, with Spark 4's
Python Data Source API.

    from mqttmesh.pipeline.source import register
    register(spark)
    df = (spark.readStream.format("mqttmesh").option("port", 1883)
          .option("filter", "sensors/#").load())

Options: ``host`` (127.0.0.1), ``port`` (1883), ``filter`` (comma-separated topic
filters, default ``#``), ``qos`` (1), ``client_id`` (default: a random one),
``clean_session`` (default true; false with a fixed client_id keeps a persistent
session on the node), ``username``, ``password``, ``keepalive`` (30 s),
``max_buffer`` (100000 messages waiting for a micro-batch; beyond it new messages are
dropped and counted in the log).

Delivery guarantee, honestly: **at most once**, best effort. The source is an ordinary
MQTT subscriber living in Spark's driver-side Python worker; it acknowledges each
QoS 1/2 message as soon as it is in its buffer (holding acknowledgements until a batch
commits would stall the publishers through the node's flow control). A message is in
at most one committed micro-batch while that process lives; what is buffered but not
yet committed is lost if the driver or the worker dies, and a restarted query does not
replay anything (MQTT has no replay). With ``clean_session=false`` and a fixed
``client_id``, messages published while the query is down wait on the node (QoS 1/2,
up to ``limits.max_queued``) and arrive when it reconnects; a QoS 1 message whose
acknowledgement was lost with a connection can arrive twice. For complete,
exactly-once analytics use the archive and the ``stream`` job.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections import deque

from pyspark.sql.datasource import DataSource, SimpleDataSourceStreamReader

from ..codec import (
    CONNACK,
    PINGRESP,
    PUBLISH,
    PUBREL,
    SUBACK,
    Connect,
    Decoder,
    MalformedPacket,
    PubAck,
    PubComp,
    PubRec,
    Subscribe,
    encode,
)

__all__ = ["MqttmeshDataSource", "register", "SCHEMA"]

log = logging.getLogger("mqttmesh.source")

SCHEMA = "timestamp timestamp, topic string, payload binary, payload_size int, qos int, retain boolean, dup boolean"


def register(spark) -> None:
    """Make ``format("mqttmesh")`` known to this session."""
    spark.dataSource.register(MqttmeshDataSource)


class MqttmeshDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "mqttmesh"

    def schema(self) -> str:
        return SCHEMA

    def simpleStreamReader(self, schema):
        return MqttmeshStreamReader(dict(self.options))


class _Subscriber(threading.Thread):
    """A blocking MQTT 3.1.1 subscriber that reconnects; appends (n, row) to a bounded buffer."""

    def __init__(self, options: dict):
        super().__init__(name="mqttmesh-source", daemon=True)
        self.host = options.get("host", "127.0.0.1")
        self.port = int(options.get("port", 1883))
        self.filters = [f for f in options.get("filter", "#").split(",") if f]
        self.qos = int(options.get("qos", 1))
        self.client_id = options.get("client_id") or f"spark-{uuid.uuid4().hex[:12]}"
        self.clean = str(options.get("clean_session", "true")).lower() in ("true", "1", "yes")
        self.username = options.get("username")
        password = options.get("password")
        self.password = password.encode() if password is not None else None
        self.keepalive = int(options.get("keepalive", 30))
        self.max_buffer = int(options.get("max_buffer", 100_000))
        self.lock = threading.Lock()
        self.buffer: deque = deque()  # (n, row), n counts messages received by this process
        self.received = 0
        self.dropped = 0
        self.connected = threading.Event()
        self.stopped = threading.Event()
        self.last_error = ""

    def run(self) -> None:
        delay = 0.2
        while not self.stopped.is_set():
            try:
                self._session()
                delay = 0.2
            except (OSError, MalformedPacket, ConnectionError) as exc:
                self.last_error = str(exc)
                log.warning("mqttmesh source: %s:%d: %s; reconnecting in %.1fs", self.host, self.port, exc, delay)
            self.connected.clear()
            self.stopped.wait(delay)
            delay = min(delay * 2, 5.0)

    def _session(self) -> None:
        with socket.create_connection((self.host, self.port), timeout=10) as sock:
            sock.sendall(
                encode(
                    Connect(self.client_id, self.clean, self.keepalive, username=self.username, password=self.password)
                )
            )
            sock.sendall(encode(Subscribe(1, [(f, self.qos) for f in self.filters])))
            decoder = Decoder(max_packet_size=268_435_460)
            sock.settimeout(1.0)
            last_ping = time.monotonic()
            while not self.stopped.is_set():
                now = time.monotonic()
                if now - last_ping >= self.keepalive / 2:
                    sock.sendall(b"\xc0\x00")  # PINGREQ
                    last_ping = now
                try:
                    data = sock.recv(1 << 20)
                except TimeoutError:
                    continue
                if not data:
                    raise ConnectionError("the node closed the connection")
                decoder.feed(data)
                out = []
                for pkt in decoder.packets():
                    if pkt.type == CONNACK:
                        if pkt.return_code:
                            raise ConnectionError(f"CONNACK {pkt.return_code:#04x}: connection refused")
                    elif pkt.type == SUBACK:
                        if any(rc == 0x80 for rc in pkt.return_codes):
                            raise ConnectionError(f"the node refused a subscription to {self.filters}")
                        self.connected.set()
                    elif pkt.type == PUBLISH:
                        self._add(pkt)
                        if pkt.qos == 1:
                            out.append(encode(PubAck(pkt.packet_id)))
                        elif pkt.qos == 2:
                            out.append(encode(PubRec(pkt.packet_id)))
                    elif pkt.type == PUBREL:
                        out.append(encode(PubComp(pkt.packet_id)))
                    elif pkt.type == PINGRESP:
                        pass
                if out:
                    sock.sendall(b"".join(out))

    def _add(self, pkt) -> None:
        payload = bytes(pkt.payload)
        row = (_utcnow(), pkt.topic, payload, len(payload), pkt.qos, pkt.retain, pkt.dup)
        with self.lock:
            if len(self.buffer) >= self.max_buffer:
                self.dropped += 1
                if self.dropped == 1 or self.dropped % 10_000 == 0:
                    log.warning(
                        "mqttmesh source: buffer full (max_buffer=%d): %d messages dropped so far",
                        self.max_buffer,
                        self.dropped,
                    )
                return
            self.received += 1
            self.buffer.append((self.received, row))


def _utcnow():
    import datetime as dt

    return dt.datetime.now(dt.UTC)


class MqttmeshStreamReader(SimpleDataSourceStreamReader):
    """Offsets are {"session": id of this reader process, "n": messages received by it}: an
    offset from another process (a restart) means "from what this one has"."""

    def __init__(self, options: dict):
        self.session = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.sub = _Subscriber(options)
        self.sub.start()
        self.sub.connected.wait(float(options.get("connect_timeout", 10)))

    def __getstate__(self):
        # Spark pickles the reader for the tasks that re-read a batch (readBetweenOffsets);
        # the subscriber (a socket and a thread) stays in the driver-side worker
        state = self.__dict__.copy()
        state["sub"] = None
        return state

    def initialOffset(self) -> dict:
        return {"session": self.session, "n": 0}

    def _after(self, start: dict) -> int:
        return start.get("n", 0) if start.get("session") == self.session else 0

    def read(self, start: dict):
        first = self._after(start)
        if self.sub is None:
            return iter([]), start
        with self.sub.lock:
            rows = [row for n, row in self.sub.buffer if n > first]
            last = self.sub.received
        return iter(rows), {"session": self.session, "n": max(last, first)}

    def readBetweenOffsets(self, start: dict, end: dict):
        if end.get("session") != self.session or self.sub is None:
            return iter([])  # received by a process that is gone (or elsewhere): not replayable
        lo, hi = self._after(start), end.get("n", 0)
        with self.sub.lock:
            return iter([row for n, row in self.sub.buffer if lo < n <= hi])

    def commit(self, end: dict) -> None:
        if end.get("session") != self.session or self.sub is None:
            return
        upto = end.get("n", 0)
        with self.sub.lock:
            buf = self.sub.buffer
            while buf and buf[0][0] <= upto:
                buf.popleft()
