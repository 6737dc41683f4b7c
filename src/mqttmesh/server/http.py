"""The operator's HTTP listener (``http.port``): Prometheus metrics and the node's status.

HTTP/1.1 through ``h11`` (sans-I/O), keep-alive, one request at a time per connection, a
bounded request head and body. Routes:

- ``GET /metrics``: the Prometheus text format (server/metrics.py);
- ``GET /api/v1/status``: the node's counters and, in a mesh, the mesh as this node sees it
  (JSON);
- ``GET /healthz``: 200 once the node serves clients.

Access: with ``http.token`` set, every request needs ``Authorization: Bearer TOKEN`` (401
without it, 403 with a wrong one); ``http.read_token`` is a second token that may only read
(every route here reads). Without a token the listener is open to whoever reaches its
address, which defaults to the loopback.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import time
from typing import Any

import h11

from .metrics import render

log = logging.getLogger("mqttmesh.http")

__all__ = ["HttpConnection", "MAX_HEAD"]

MAX_HEAD = 16 * 1024  # a request's line and headers
MAX_BODY = 64 * 1024
IDLE_TIMEOUT = 30.0  # seconds a connection may wait between requests (or within one)
PROMETHEUS = "text/plain; version=0.0.4; charset=utf-8"


class HttpConnection(asyncio.Protocol):
    def __init__(self, node: Any):
        self.node = node
        self.h11 = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD)
        self.transport: asyncio.Transport | None = None
        self.request: h11.Request | None = None
        self.body = b""
        self._timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()

    def _arm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self.node.loop.call_later(IDLE_TIMEOUT, self._idle)

    def _idle(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def data_received(self, data: bytes) -> None:
        self._arm()
        try:
            self.h11.receive_data(data)
            self._events()
        except h11.RemoteProtocolError as exc:
            self._error(exc.error_status_hint, str(exc))

    def eof_received(self) -> bool | None:
        try:
            self.h11.receive_data(b"")
        except h11.RemoteProtocolError:
            pass
        return None

    def _events(self) -> None:
        while True:
            event = self.h11.next_event()
            if event is h11.NEED_DATA or event is h11.PAUSED:
                return
            if isinstance(event, h11.Request):
                self.request, self.body = event, b""
            elif isinstance(event, h11.Data):
                self.body += event.data
                if len(self.body) > MAX_BODY:
                    self._error(413, "request body too large")
                    return
            elif isinstance(event, h11.EndOfMessage):
                self._answer()
                if self.h11.our_state is h11.MUST_CLOSE or self.transport is None or self.transport.is_closing():
                    self._close()
                    return
                self.h11.start_next_cycle()
            elif isinstance(event, h11.ConnectionClosed):
                self._close()
                return

    def _answer(self) -> None:
        request = self.request
        assert request is not None
        method = request.method.decode()
        target = request.target.decode("latin-1").split("?", 1)[0]
        headers = {k.decode().lower(): v.decode("latin-1") for k, v in request.headers}
        denied = self._denied(headers.get("authorization"))
        if denied:
            self._send(denied, "text/plain", f"{_REASONS[denied]}\n".encode(), [("WWW-Authenticate", "Bearer")])
            return
        if method not in ("GET", "HEAD"):
            self._send(405, "text/plain", b"method not allowed\n", [("Allow", "GET, HEAD")])
            return
        node = self.node
        if target == "/metrics":
            self._send(200, PROMETHEUS, render(node).encode(), head=method == "HEAD")
        elif target == "/api/v1/status":
            self._send(200, "application/json", json.dumps(node.http_status(), sort_keys=True).encode() + b"\n")
        elif target == "/healthz":
            self._send(200, "text/plain", b"ok\n")
        else:
            self._send(404, "text/plain", b"not found\n")

    def _denied(self, authorization: str | None) -> int:
        """0, or the status refusing a request with this Authorization header."""
        tokens = self.node.http_tokens
        if not tokens:
            return 0
        if not authorization or not authorization.lower().startswith("bearer "):
            return 401
        given = authorization[7:].strip().encode()
        if any(hmac.compare_digest(given, t.encode()) for t in tokens):
            return 0
        return 403

    def _send(
        self,
        status: int,
        content_type: str,
        body: bytes,
        extra: list[tuple[str, str]] | None = None,
        head: bool = False,
    ) -> None:
        headers = [
            ("Content-Type", content_type),
            ("Content-Length", str(len(body))),
            ("Date", time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime())),
            ("Server", "mqttmesh"),
            *(extra or []),
        ]
        out = self.h11.send(h11.Response(status_code=status, headers=headers, reason=_REASONS.get(status, "")))
        if not head:
            out += self.h11.send(h11.Data(data=body))
        out += self.h11.send(h11.EndOfMessage())
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(out)

    def _error(self, status: int, why: str) -> None:
        log.info("HTTP request refused (%d): %s", status, why)
        if self.h11.our_state in (h11.IDLE, h11.SEND_RESPONSE):
            try:
                self._send(status, "text/plain", f"{why}\n".encode())
            except h11.LocalProtocolError:
                pass
        self._close()

    def _close(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            if self.transport.can_write_eof():
                self.transport.write_eof()
            self.transport.close()


_REASONS = {
    200: "OK",
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    413: "Payload Too Large",
    431: "Request Header Fields Too Large",
}
