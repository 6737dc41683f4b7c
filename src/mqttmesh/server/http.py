"""The operator's HTTP listener (``http.port``): requests in, replies out.

HTTP/1.1 through ``h11`` (sans-I/O), keep-alive, one request at a time per connection (a
pipelined request waits for the reply before it), a bounded request head and body. The
routes are api.py's: the console, ``/metrics``, ``/healthz`` and the admin API under
``/api/v1/``; a reply that needs the other nodes' answers comes when they have answered.

Access: with ``http.token`` set, every request but the console's own files and ``/healthz``
needs ``Authorization: Bearer TOKEN`` (401 without it, 403 with a wrong one);
``http.read_token`` is a second token that may only read (403 on DELETE and POST routes).
Without a token the listener is open to whoever reaches its address, which defaults to the
loopback.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
from typing import Any

import h11

from .api import Reply, answer

log = logging.getLogger("mqttmesh.http")

__all__ = ["HttpConnection", "MAX_HEAD"]

MAX_HEAD = 16 * 1024  # a request's line and headers
MAX_BODY = 64 * 1024
IDLE_TIMEOUT = 30.0  # seconds a connection may wait between requests (or within one)


class HttpConnection(asyncio.Protocol):
    def __init__(self, node: Any):
        self.node = node
        self.h11 = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD)
        self.transport: asyncio.Transport | None = None
        self.request: h11.Request | None = None
        self.body = b""
        self._timer: asyncio.TimerHandle | None = None
        self._busy: asyncio.Task | None = None  # the reply being made (other nodes asked)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
        if self._busy is not None:
            self._busy.cancel()
        self.transport = None

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
            if self._busy is None:
                self._events()
            elif len(self.h11.trailing_data[0]) > MAX_HEAD + MAX_BODY:
                self._error(431, "too much pipelined before the reply")
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
                self._busy = self.node.loop.create_task(self._answer())
                return  # (the next request is read once this one is answered)
            elif isinstance(event, h11.ConnectionClosed):
                self._close()
                return

    async def _answer(self) -> None:
        request = self.request
        assert request is not None
        method = request.method.decode()
        target = request.target.decode("latin-1")
        headers = {k.decode().lower(): v.decode("latin-1") for k, v in request.headers}
        denied, role = self._denied(headers.get("authorization"))
        if denied == 403:
            reply = Reply(403, "text/plain", b"Forbidden\n", [("WWW-Authenticate", "Bearer")])
        else:
            try:
                reply = await answer(self.node, method, target, role)
            except Exception:  # a bug of ours gets a 500, not a hung connection
                log.exception("HTTP %s %s failed", method, target)
                reply = Reply(500, "text/plain", b"internal error\n")
        self._busy = None
        if self.transport is None:
            return
        try:
            self._send(reply.status, reply.content_type, reply.body, reply.headers, head=method == "HEAD")
        except h11.LocalProtocolError:
            self._close()
            return
        if self.h11.our_state is h11.MUST_CLOSE or self.transport is None or self.transport.is_closing():
            self._close()
            return
        self.h11.start_next_cycle()
        try:
            self._events()  # a pipelined request that came meanwhile
        except h11.RemoteProtocolError as exc:
            self._error(exc.error_status_hint, str(exc))

    def _denied(self, authorization: str | None) -> tuple[int, str | None]:
        """(0 or the status refusing the token, the role it gives: "admin", "read", or None
        when it gives none). No token configured: everyone is admin."""
        tokens = self.node.http_tokens
        if not tokens:
            return 0, "admin"
        if not authorization or not authorization.lower().startswith("bearer "):
            return 0, None  # (public routes are served; the others answer 401)
        given = authorization[7:].strip().encode()
        for token, role in tokens.items():
            if hmac.compare_digest(given, token.encode()):
                return 0, role
        return 403, None

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
    422: "Unprocessable Content",
    500: "Internal Server Error",
    503: "Service Unavailable",
    431: "Request Header Fields Too Large",
}
