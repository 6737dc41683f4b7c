"""MQTT over WebSocket (RFC 6455, MQTT 3.1.1 section 6): ``ws://`` and ``wss://`` listeners.

A WebSocket connection is a TCP (or TLS) connection that starts with an HTTP upgrade and
then carries the MQTT byte stream in binary frames. ``WebSocketLink`` is the asyncio
Protocol of such a connection: it runs the upgrade and the frames through ``wsproto``
(sans-I/O) and hands the bytes of the binary messages to a plain ``Connection``, which sees
a byte stream as from TCP through ``_Framed``, a transport that writes each batch of frames
as one binary WebSocket message. So the Channel, every limit (connect timeout from accept,
packet size, buffers, back-pressure, read slices) and every guarantee are those of TCP.

What is refused: a request that is not a WebSocket upgrade, or larger than h11's limit
(16 KiB), gets HTTP 400; another path than ``websocket.path`` 404; a client that does not
offer the ``mqtt`` subprotocol [MQTT-6.0.0-3] 400; a wrong WebSocket version 426 (wsproto).
After the upgrade, an unmasked client frame or a malformed one closes with 1002, a text
frame with 1003 [MQTT-6.0.0-1]; in each case the MQTT connection is closed as after any
protocol error (the will is published). MQTT packets may span frames and a frame may hold
several [MQTT-6.0.0-2]: the Channel's decoder reads a stream.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from wsproto import ConnectionType, WSConnection
from wsproto.connection import ConnectionState
from wsproto.events import (
    AcceptConnection,
    BytesMessage,
    CloseConnection,
    Message,
    Ping,
    RejectConnection,
    Request,
    TextMessage,
)
from wsproto.utilities import LocalProtocolError, RemoteProtocolError

from .connection import accepted

log = logging.getLogger("mqttmesh.websocket")

__all__ = ["WebSocketLink", "SUBPROTOCOL"]

SUBPROTOCOL = "mqtt"  # [MQTT-6.0.0-3, MQTT-6.0.0-4]
UNSUPPORTED_DATA = 1003  # RFC 6455 7.4.1: a text frame where binary ones are expected


class WebSocketLink(asyncio.Protocol):
    """One client's WebSocket connection around the ``Connection`` that serves it."""

    __slots__ = ("inner", "ws", "transport", "framed", "path", "upgraded")

    def __init__(self, node: Any, path: str, accepted_at: float | None = None):
        self.inner = accepted(node, accepted_at)  # (admitted and counted by the node as any connection)
        self.ws = WSConnection(ConnectionType.SERVER)
        self.transport: asyncio.Transport | None = None
        self.framed: _Framed | None = None
        self.path = path
        self.upgraded = False  # the upgrade was accepted: bytes go in binary frames

    # -- asyncio callbacks ----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # (a stream transport)
        self.framed = _Framed(transport, self)  # type: ignore[arg-type]
        # admitted now, its connect timeout counting from now: the upgrade is part of it
        self.inner.connection_made(self.framed)

    def data_received(self, data: bytes) -> None:
        inner = self.inner
        if inner.channel is None or inner.draining or self.ws.state is ConnectionState.CLOSED:
            return  # (refused, or closing: what still comes is read and dropped)
        try:
            self.ws.receive_data(data)
            events = list(self.ws.events())
        except RemoteProtocolError as exc:  # a bad HTTP request or upgrade
            self._reject(exc.event_hint if isinstance(exc.event_hint, RejectConnection) else None, str(exc))
            return
        for event in events:
            if isinstance(event, BytesMessage):
                if event.data:
                    inner.data_received(bytes(event.data))
            elif isinstance(event, Request):
                self._upgrade(event)
            elif isinstance(event, Ping):
                self._send(event.response())
            elif isinstance(event, TextMessage):
                self._fail(UNSUPPORTED_DATA, "a text frame (MQTT needs binary frames) [MQTT-6.0.0-1]")
                return
            elif isinstance(event, CloseConnection):
                self._closed_by_client(event)
                return
            if inner.closing:
                return

    def eof_received(self) -> bool | None:
        return self.inner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()

    # -- the upgrade ----------------------------------------------------------------------

    def _upgrade(self, request: Request) -> None:
        path = request.target.split("?", 1)[0]
        if path != self.path:
            self._reject(RejectConnection(status_code=404), f"path {path!r} (the MQTT path is {self.path!r})")
            return
        if SUBPROTOCOL not in request.subprotocols:
            self._reject(RejectConnection(status_code=400), "no 'mqtt' WebSocket subprotocol offered [MQTT-6.0.0-3]")
            return
        self.transport.write(self.ws.send(AcceptConnection(subprotocol=SUBPROTOCOL)))  # type: ignore[union-attr]
        self.upgraded = True

    def _reject(self, answer: RejectConnection | None, why: str) -> None:
        """Refuse the HTTP request (400 unless ``answer`` says otherwise) and close."""
        inner = self.inner
        log.info("WebSocket upgrade from %s refused: %s", inner.peer, why)
        transport = self.transport
        try:
            data = self.ws.send(answer if answer is not None else RejectConnection(status_code=400))
        except LocalProtocolError:
            data = b""  # (wsproto is past the point where it can answer)
        if data and transport is not None and not transport.is_closing():
            transport.write(data)
        self._close_mqtt(f"WebSocket upgrade refused: {why}")

    # -- after the upgrade ----------------------------------------------------------------

    def _send(self, event: Any) -> None:
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        try:
            transport.write(self.ws.send(event))
        except LocalProtocolError:
            pass  # (closing: nothing more can be sent)

    def _fail(self, code: int, why: str) -> None:
        """A WebSocket protocol error: a close frame with ``code``, and the MQTT connection
        is closed as after any protocol error (its will is published)."""
        self._send(CloseConnection(code=code, reason=why[:100]))
        self._close_mqtt(why)

    def _closed_by_client(self, event: CloseConnection) -> None:
        if self.ws.state is not ConnectionState.REMOTE_CLOSING:
            # wsproto's verdict on a frame (unmasked 1002, bad UTF-8 1007, ...), not a close
            # the client sent: the connection fails with that code
            self._fail(event.code, f"WebSocket protocol error: {event.reason}")
            return
        if event.code not in (1000, 1001, 1005):
            log.info("WebSocket from %s closed with %d: %s", self.inner.peer, event.code, event.reason)
        self._send(event.response())  # (our answer to the client's close)
        # then as a TCP FIN without DISCONNECT: the will goes out unless a DISCONNECT came
        transport = self.transport
        if transport is not None and not transport.is_closing():
            transport.close()

    def _close_mqtt(self, why: str) -> None:
        channel = self.inner.channel
        loop = self.inner.node.loop
        if channel is not None and channel.state != "closed":
            channel.close(why, loop.time())
        elif self.transport is not None and not self.transport.is_closing():
            self.transport.close()


def is_websocket(transport: object) -> bool:
    """Is this the transport of a Connection served over WebSocket?"""
    return isinstance(transport, _Framed)


class _Framed:
    """The transport a WebSocket's Connection writes to: its bytes go out as binary
    messages; everything else is the socket's transport."""

    __slots__ = ("_t", "_link")

    def __init__(self, transport: asyncio.Transport, link: WebSocketLink):
        self._t = transport
        self._link = link

    def write(self, data: bytes) -> None:
        link = self._link
        if not link.upgraded or link.ws.state is not ConnectionState.OPEN:
            return  # (nothing the Channel says can precede the upgrade, or follow a close)
        self._t.write(link.ws.send(Message(data=data)))

    def write_eof(self) -> None:
        link = self._link
        if link.upgraded:
            link._send(CloseConnection(code=1000))
        if self._t.can_write_eof():
            self._t.write_eof()

    def can_write_eof(self) -> bool:
        return True  # (a close frame at least)

    def is_closing(self) -> bool:
        return self._t.is_closing()

    def get_write_buffer_size(self) -> int:
        return self._t.get_write_buffer_size()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._t, name)  # get_extra_info, pause/resume_reading, close, abort...
