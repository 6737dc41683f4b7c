"""A small MQTT 3.1.1 byte builder and blocking client, independent of mqttmesh's codec.

Black-box tests build the exact bytes they send with these helpers (written
from the standard's tables, sharing no code with ``mqttmesh.codec``) so that a
bug mirrored in our encoder and decoder cannot hide.
"""

from __future__ import annotations

import socket
import struct
import time

CONNECT, CONNACK, PUBLISH, PUBACK, PUBREC, PUBREL, PUBCOMP = 1, 2, 3, 4, 5, 6, 7
SUBSCRIBE, SUBACK, UNSUBSCRIBE, UNSUBACK, PINGREQ, PINGRESP, DISCONNECT = 8, 9, 10, 11, 12, 13, 14


# --------------------------------------------------------------------------- building bytes


def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        digit, n = n % 128, n // 128
        out.append(digit | (0x80 if n else 0))
        if not n:
            return bytes(out)


def s(text) -> bytes:
    """A length-prefixed string field (bytes are taken as already encoded)."""
    raw = text.encode("utf-8") if isinstance(text, str) else bytes(text)
    return struct.pack(">H", len(raw)) + raw


def packet(first_byte: int, body: bytes = b"") -> bytes:
    return bytes([first_byte]) + varint(len(body)) + body


def connect(
    client_id="c",
    clean=True,
    keepalive=60,
    will=None,
    username=None,
    password=None,
    proto=b"MQTT",
    level=4,
    flags_extra=0,
) -> bytes:
    """will = (topic, payload, qos, retain)."""
    flags = (0x02 if clean else 0) | flags_extra
    payload = s(client_id)
    if will is not None:
        topic, message, qos, retain = will
        flags |= 0x04 | (qos << 3) | (0x20 if retain else 0)
        payload += s(topic) + s(message)
    if username is not None:
        flags |= 0x80
        payload += s(username)
    if password is not None:
        flags |= 0x40
        payload += s(password)
    body = s(proto) + bytes([level, flags]) + struct.pack(">H", keepalive) + payload
    return packet(0x10, body)


def publish(topic, payload=b"", qos=0, retain=False, dup=False, pid=None) -> bytes:
    first = 0x30 | (0x08 if dup else 0) | (qos << 1) | (0x01 if retain else 0)
    body = s(topic)
    if qos:
        body += struct.pack(">H", pid if pid is not None else 1)
    return packet(first, body + (payload.encode() if isinstance(payload, str) else payload))


def subscribe(pid, *filters) -> bytes:
    """filters: (topic_filter, qos) pairs."""
    return packet(0x82, struct.pack(">H", pid) + b"".join(s(f) + bytes([q]) for f, q in filters))


def unsubscribe(pid, *filters) -> bytes:
    return packet(0xA2, struct.pack(">H", pid) + b"".join(s(f) for f in filters))


def puback(pid) -> bytes:
    return packet(0x40, struct.pack(">H", pid))


def pubrec(pid) -> bytes:
    return packet(0x50, struct.pack(">H", pid))


def pubrel(pid) -> bytes:
    return packet(0x62, struct.pack(">H", pid))


def pubcomp(pid) -> bytes:
    return packet(0x70, struct.pack(">H", pid))


PINGREQ_BYTES = b"\xc0\x00"
DISCONNECT_BYTES = b"\xe0\x00"


# --------------------------------------------------------------------------- reading packets


class Packet:
    def __init__(self, first: int, body: bytes):
        self.type = first >> 4
        self.flags = first & 0x0F
        self.body = body

    @property
    def qos(self) -> int:
        return (self.flags >> 1) & 3

    @property
    def retain(self) -> bool:
        return bool(self.flags & 1)

    @property
    def dup(self) -> bool:
        return bool(self.flags & 8)

    @property
    def packet_id(self) -> int:
        if self.type == PUBLISH:
            tlen = struct.unpack(">H", self.body[:2])[0]
            return struct.unpack(">H", self.body[2 + tlen : 4 + tlen])[0]
        return struct.unpack(">H", self.body[:2])[0]

    @property
    def topic(self) -> str:
        tlen = struct.unpack(">H", self.body[:2])[0]
        return self.body[2 : 2 + tlen].decode()

    @property
    def payload(self) -> bytes:
        tlen = struct.unpack(">H", self.body[:2])[0]
        return self.body[2 + tlen + (2 if self.qos else 0) :]

    def __repr__(self):
        return f"Packet(type={self.type}, flags={self.flags:#x}, body={self.body!r})"


class Closed(Exception):
    pass


class RawClient:
    """A blocking socket that sends raw bytes and reads whole packets."""

    def __init__(self, host: str, port: int, timeout: float = 5.0, source: str | None = None):
        """``source``: the local address to connect from (e.g. 127.0.0.2 on loopback)."""
        self.sock = socket.create_connection(
            (host, port), timeout=timeout, source_address=(source, 0) if source else None
        )
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""
        self.timeout = timeout

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _fill(self, deadline: float) -> None:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("no packet before the deadline")
        self.sock.settimeout(remaining)
        try:
            chunk = self.sock.recv(65536)
        except TimeoutError:
            raise TimeoutError("no packet before the deadline") from None
        except ConnectionResetError:
            chunk = b""
        if not chunk:
            raise Closed("connection closed by the broker")
        self.buf += chunk

    def recv(self, timeout: float | None = None) -> Packet:
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while True:
            if len(self.buf) >= 2:
                mult, length, i = 1, 0, 1
                while i < len(self.buf):
                    b = self.buf[i]
                    length += (b & 0x7F) * mult
                    mult *= 128
                    i += 1
                    if not b & 0x80:
                        if len(self.buf) >= i + length:
                            first = self.buf[0]
                            body = self.buf[i : i + length]
                            self.buf = self.buf[i + length :]
                            return Packet(first, body)
                        break
            self._fill(deadline)

    def expect(self, ptype: int, timeout: float | None = None) -> Packet:
        p = self.recv(timeout)
        assert p.type == ptype, f"expected packet type {ptype}, got {p!r}"
        return p

    def connect(self, **kw) -> Packet:
        """Send CONNECT and return the CONNACK."""
        self.send(connect(**kw))
        return self.expect(CONNACK)

    def expect_closed(self, timeout: float = 5.0) -> None:
        """The broker closes the connection (after any packets it still had to send)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.buf = b""
                self._fill(deadline)
            except Closed:
                return
            except TimeoutError:
                raise AssertionError("the broker did not close the connection") from None

    def expect_silence(self, duration: float = 0.3) -> None:
        """Nothing arrives for ``duration`` seconds (and the connection stays open)."""
        try:
            p = self.recv(duration)
        except TimeoutError:
            return
        raise AssertionError(f"unexpected packet {p!r}")

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
