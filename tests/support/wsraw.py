"""A small, independent WebSocket client (RFC 6455) for the tests: it can do what a good
client does and what a bad one does (no subprotocol, unmasked or text frames, packets cut
across frames). Nothing of mqttmesh or wsproto is used.
"""

from __future__ import annotations

import base64
import hashlib
import os
import socket
import struct
import time

GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
TEXT, BINARY, CLOSE, PING, PONG = 0x1, 0x2, 0x8, 0x9, 0xA


class HandshakeRefused(Exception):
    def __init__(self, status: int, head: bytes):
        super().__init__(f"HTTP {status}")
        self.status = status
        self.head = head


def frame(opcode: int, payload: bytes, masked: bool = True, fin: bool = True) -> bytes:
    """One frame; a client's frames are masked (RFC 6455 5.3) unless ``masked`` is False."""
    head = bytes([(0x80 if fin else 0) | opcode])
    n = len(payload)
    mask_bit = 0x80 if masked else 0
    if n < 126:
        head += bytes([mask_bit | n])
    elif n < 65536:
        head += bytes([mask_bit | 126]) + struct.pack(">H", n)
    else:
        head += bytes([mask_bit | 127]) + struct.pack(">Q", n)
    if not masked:
        return head + payload
    key = os.urandom(4)
    return head + key + bytes(b ^ key[i % 4] for i, b in enumerate(payload))


class WsClient:
    def __init__(self, host: str, port: int, timeout: float = 5.0):
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.timeout = timeout
        self.buf = b""
        self.subprotocol: str | None = None
        self.close_code: int | None = None

    # -- the upgrade ------------------------------------------------------------------------

    def request(
        self, path: str = "/mqtt", protocols: str | None = "mqtt", version: str = "13", raw: bytes | None = None
    ):
        key = base64.b64encode(os.urandom(16))
        if raw is None:
            lines = [
                f"GET {path} HTTP/1.1",
                "Host: 127.0.0.1",
                "Upgrade: websocket",
                "Connection: Upgrade",
                f"Sec-WebSocket-Key: {key.decode()}",
                f"Sec-WebSocket-Version: {version}",
            ]
            if protocols is not None:
                lines.append(f"Sec-WebSocket-Protocol: {protocols}")
            raw = ("\r\n".join(lines) + "\r\n\r\n").encode()
        self.sock.sendall(raw)
        head = self._read_head()
        status = int(head.split(b" ", 2)[1])
        if status != 101:
            raise HandshakeRefused(status, head)
        headers = {}
        for line in head.split(b"\r\n")[1:]:
            if b":" in line:
                name, value = line.split(b":", 1)
                headers[name.strip().lower()] = value.strip()
        expected = base64.b64encode(hashlib.sha1(key + GUID).digest())
        assert headers.get(b"sec-websocket-accept") == expected, headers
        self.subprotocol = headers.get(b"sec-websocket-protocol", b"").decode() or None
        return self

    def _read_head(self) -> bytes:
        deadline = time.monotonic() + self.timeout
        while b"\r\n\r\n" not in self.buf:
            self._fill(deadline)
        head, self.buf = self.buf.split(b"\r\n\r\n", 1)
        return head

    # -- frames -----------------------------------------------------------------------------

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send_binary(self, payload: bytes, masked: bool = True) -> None:
        self.sock.sendall(frame(BINARY, payload, masked))

    def _fill(self, deadline: float) -> None:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("nothing from the server in time")
        self.sock.settimeout(left)
        data = self.sock.recv(65536)
        if not data:
            raise ConnectionError("closed by the server")
        self.buf += data

    def recv_frame(self, timeout: float | None = None) -> tuple[int, bytes]:
        """(opcode, payload) of the next frame from the server (never masked, RFC 6455 5.1)."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while len(self.buf) < 2:
            self._fill(deadline)
        b0, b1 = self.buf[0], self.buf[1]
        assert not b1 & 0x80, "a server frame must not be masked"
        n, at = b1 & 0x7F, 2
        if n == 126:
            while len(self.buf) < 4:
                self._fill(deadline)
            n, at = struct.unpack(">H", self.buf[2:4])[0], 4
        elif n == 127:
            while len(self.buf) < 10:
                self._fill(deadline)
            n, at = struct.unpack(">Q", self.buf[2:10])[0], 10
        while len(self.buf) < at + n:
            self._fill(deadline)
        payload, self.buf = self.buf[at : at + n], self.buf[at + n :]
        opcode = b0 & 0x0F
        if opcode == CLOSE:
            self.close_code = struct.unpack(">H", payload[:2])[0] if len(payload) >= 2 else 1005
        return opcode, payload

    def recv_mqtt(self, n: int, timeout: float | None = None) -> bytes:
        """At least ``n`` bytes of the MQTT stream (binary frames, in order)."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        got = b""
        while len(got) < n:
            opcode, payload = self.recv_frame(max(0.0, deadline - time.monotonic()))
            assert opcode == BINARY, f"expected a binary frame, got opcode {opcode} ({payload!r})"
            got += payload
        return got

    def closed(self, timeout: float = 5.0) -> bool:
        """The server ends the connection (after a close frame, if any): True once it has."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                opcode, _ = self.recv_frame(max(0.0, deadline - time.monotonic()))
            except ConnectionError:
                return True
            if opcode == CLOSE:
                continue  # (then the TCP close)

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
