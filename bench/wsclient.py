"""MQTT over WebSocket for the load generator: a Protocol that does the upgrade and the
frames (wsproto, client side: masked frames, as RFC 6455 requires of a client) in front of
the generator's own MQTT Protocol, which sees a byte stream as it does over TCP.

Each ``write`` of the MQTT Protocol (a batch of packets) goes out as one binary message;
what arrives is handed on as the messages' bytes, however the server framed them. The
same adapter serves every broker measured, so what it costs the generator is the same on
both sides of a comparison.
"""

from __future__ import annotations

import asyncio
from typing import Any

from wsproto import ConnectionType, WSConnection
from wsproto.connection import ConnectionState
from wsproto.events import AcceptConnection, BytesMessage, CloseConnection, Ping, RejectConnection, Request

__all__ = ["WsAdapter"]


class _Framed:
    """The transport the MQTT Protocol writes to."""

    def __init__(self, adapter: WsAdapter):
        self._a = adapter

    def write(self, data: bytes) -> None:
        a = self._a
        if a.ws.state is ConnectionState.OPEN:
            a.raw.write(a.ws.send(BytesMessage(data=data)))

    def writelines(self, chunks) -> None:
        self.write(b"".join(chunks))

    def close(self) -> None:
        a = self._a
        if a.ws.state is ConnectionState.OPEN:
            a.raw.write(a.ws.send(CloseConnection(code=1000)))
        a.raw.close()

    def is_closing(self) -> bool:
        return self._a.raw.is_closing()

    def get_write_buffer_size(self) -> int:
        return self._a.raw.get_write_buffer_size()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._a.raw, name)  # get_extra_info, pause_reading, abort...


class WsAdapter(asyncio.Protocol):
    def __init__(self, inner: asyncio.Protocol, host: str, path: str):
        self.inner = inner
        self.host = host
        self.path = path
        self.ws = WSConnection(ConnectionType.CLIENT)
        self.raw: asyncio.Transport = None  # type: ignore[assignment]
        self.open = False
        # the upgrade accepted (the MQTT Protocol is connected), or why it failed
        self.opened: asyncio.Future = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.raw = transport  # type: ignore[assignment]
        transport.write(self.ws.send(Request(host=self.host, target=self.path, subprotocols=["mqtt"])))  # type: ignore[attr-defined]

    def data_received(self, data: bytes) -> None:
        ws = self.ws
        ws.receive_data(data)
        chunks = []
        for event in ws.events():
            if isinstance(event, BytesMessage):
                chunks.append(event.data)
            elif isinstance(event, AcceptConnection):
                self.open = True
                self.inner.connection_made(_Framed(self))  # type: ignore[arg-type]
                if not self.opened.done():
                    self.opened.set_result(True)
            elif isinstance(event, Ping):
                self.raw.write(ws.send(event.response()))
            elif isinstance(event, CloseConnection):
                if ws.state is not ConnectionState.CLOSED:
                    self.raw.write(ws.send(event.response()))
                self.raw.close()
            elif isinstance(event, RejectConnection):
                if not self.opened.done():
                    self.opened.set_exception(ConnectionError(f"WebSocket upgrade refused: {event.status_code}"))
                self.raw.close()
        if chunks:
            self.inner.data_received(chunks[0] if len(chunks) == 1 else b"".join(chunks))

    def connection_lost(self, exc: Exception | None) -> None:
        if self.open:
            self.inner.connection_lost(exc)
        elif not self.opened.done():
            self.opened.set_exception(ConnectionError(f"connection lost before the WebSocket upgrade ({exc})"))

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()
