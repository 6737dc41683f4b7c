"""The node's listeners beside plain MQTT: TLS, WebSocket (ws:// and wss://) and HTTP.

The I/O layer. Plain MQTT's listener is the Node's own (it names the node). The others are
bound here before the node serves anything, started once its state is loaded, and closed
with it. A TLS connection (MQTT or WebSocket) is accepted, admitted against the node's
limits, and only then handshaken: it counts against ``limits.max_connections``, and its
connect timeout runs, from the moment it is accepted. A reload (SIGHUP) swaps the TLS
context for the next handshakes; live connections keep theirs.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
import struct
from collections.abc import Callable
from typing import Any

from ..auth import ConfigError
from ..config import Config, read_first_line
from .connection import Connection, TlsConnection
from .http import HttpConnection
from .tls import server_context
from .websocket import WebSocketLink

# the server/node.py Node, typed loosely: node.py imports this module (no circle)
Node = Any

# makes the protocol of a connection accepted on a TLS listener (the node, when accepted)
MakeProtocol = Callable[[Node, float], "Connection | WebSocketLink"]

log = logging.getLogger("mqttmesh.node")


class Listeners:
    """TLS (``tls.port``, or ``mesh.tls``), ws (``websocket.port``), wss
    (``websocket.tls_port``) and HTTP (``http.port``); each port is 0 when it is off."""

    def __init__(self, node: Node, config: Config):
        self.node = node
        self.config = config
        self.loop = node.loop
        self.tls: ssl.SSLContext | None = None
        self.tls_port = self.ws_port = self.wss_port = self.http_port = 0
        self._tls_sock: socket.socket | None = None
        self._wss_sock: socket.socket | None = None
        self._ws_server: asyncio.base_events.Server | None = None
        self._http_server: asyncio.base_events.Server | None = None
        self._tasks: list[asyncio.Task] = []
        self._handshakes: set[asyncio.Task] = set()

    async def bind(self) -> None:
        """Bind every listener that is configured (serving nothing yet): the ports are known."""
        config, host = self.config, self.config.host
        self.tls = server_context(config)
        if self.tls is not None:
            if config.get("tls.port") or config.get("mesh.tls"):
                self._tls_sock = _listening_socket(host, config.get("tls.port"))
                self.tls_port = self._tls_sock.getsockname()[1]
            if config.get("websocket.tls_port"):
                self._wss_sock = _listening_socket(host, config.get("websocket.tls_port"))
                self.wss_port = self._wss_sock.getsockname()[1]
        node = self.node
        if config.get("http.port"):
            self._http_server = await self.loop.create_server(
                lambda: HttpConnection(node),
                config.get("http.host"),
                config.get("http.port"),
                reuse_address=True,
                start_serving=False,
            )
            self.http_port = self._http_server.sockets[0].getsockname()[1]
        if config.get("websocket.port"):
            path = config.get("websocket.path")
            self._ws_server = await self.loop.create_server(
                lambda: WebSocketLink(node, path),
                host,
                config.get("websocket.port"),
                backlog=1024,
                reuse_address=True,
                start_serving=False,
            )
            self.ws_port = self._ws_server.sockets[0].getsockname()[1]

    async def serve(self) -> None:
        config, host = self.config, self.config.host
        path = config.get("websocket.path")
        if self._tls_sock is not None:
            self._tasks.append(self.loop.create_task(self._accept_tls(self._tls_sock, _plain)))
            log.info("TLS listener on %s:%d", host, self.tls_port)
        if self._http_server is not None:
            await self._http_server.start_serving()
            log.info("HTTP listener on http://%s:%d", config.get("http.host"), self.http_port)
        if self._ws_server is not None:
            await self._ws_server.start_serving()
            log.info("WebSocket listener on ws://%s:%d%s", host, self.ws_port, path)
        if self._wss_sock is not None:
            make: MakeProtocol = lambda node, at: WebSocketLink(node, path, at)  # noqa: E731
            self._tasks.append(self.loop.create_task(self._accept_tls(self._wss_sock, make)))
            log.info("WebSocket TLS listener on wss://%s:%d%s", host, self.wss_port, path)

    def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for sock in (self._tls_sock, self._wss_sock):
            if sock is not None:
                sock.close()
        for server in (self._ws_server, self._http_server):
            if server is not None:
                server.close()
        for task in list(self._handshakes):
            task.cancel()

    def reload_tls(self, fresh: Config) -> str | None:
        """The TLS certificate and key from ``fresh`` for the next handshakes; an error
        keeps the ones in force (returned, to be logged)."""
        if self.tls is None:
            return None
        try:
            tls = server_context(fresh)
        except ConfigError as exc:
            return str(exc)
        if tls is not None:
            self.tls = tls
        return None

    # -- TLS: accept, admit, then handshake -------------------------------------------------

    async def _accept_tls(self, sock: socket.socket, make: MakeProtocol) -> None:
        """Accept on a TLS listener (``make``: the protocol of each connection, a plain
        Connection or a WebSocketLink around one)."""
        while True:
            try:
                client, addr = await self.loop.sock_accept(sock)
            except OSError as exc:  # out of file descriptors, say: try again shortly
                log.warning("TLS listener: accept failed: %s", exc)
                await asyncio.sleep(0.1)
                continue
            self._tls_accepted(client, addr, make)
            while True:  # and whatever else is waiting, now: each counts from this moment
                try:
                    client, addr = sock.accept()
                except (BlockingIOError, InterruptedError):
                    break
                except OSError as exc:
                    log.warning("TLS listener: accept failed: %s", exc)
                    break
                self._tls_accepted(client, addr, make)

    def _tls_accepted(self, sock: socket.socket, addr, make: MakeProtocol) -> None:
        """Admit a TLS connection before its handshake: it counts against the limits now."""
        node = self.node
        protocol = make(node, self.loop.time())
        conn = protocol if isinstance(protocol, Connection) else protocol.inner
        assert isinstance(conn, TlsConnection)  # (made with its time of accept: _plain, WebSocketLink)
        conn.peer = f"{addr[0]}:{addr[1]}" if isinstance(addr, tuple) else str(addr)
        refusal = node.admit(conn)
        if refusal:
            log.warning("refused connection from %s: %s", conn.peer, refusal)
            node.broker.stats.connections_refused += 1
            _close_with_reset(sock)
            return
        task = self.loop.create_task(self._tls_handshake(protocol, conn, sock))
        self._handshakes.add(task)
        task.add_done_callback(self._handshakes.discard)

    async def _tls_handshake(self, protocol: asyncio.Protocol, conn: Connection, sock: socket.socket) -> None:
        node = self.node
        try:
            sock.setblocking(False)
            await self.loop.connect_accepted_socket(
                lambda: protocol,
                sock,
                ssl=self.tls,
                # (TLS connections are admitted with their time: accepted_at is set)
                ssl_handshake_timeout=max(
                    0.05, conn.accepted_at + node.broker.settings.connect_timeout - self.loop.time()
                ),
            )
        except (TimeoutError, OSError, ssl.SSLError, RuntimeError) as exc:
            # (the socket belongs to the transport now, which closed it)
            log.info("TLS handshake with %s failed: %s", conn.peer, exc or type(exc).__name__)
            node.forget(conn)
        except asyncio.CancelledError:
            node.forget(conn)
            raise


def _plain(node: Node, accepted_at: float) -> Connection:
    """A TLS listener's connection: a plain MQTT Connection."""
    return TlsConnection(node, accepted_at)


def _listening_socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    sock.listen(1024)
    sock.setblocking(False)
    return sock


def _close_with_reset(sock: socket.socket) -> None:
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    sock.close()


def http_tokens(config: Config) -> dict[str, str]:
    """The bearer tokens the HTTP listener accepts, each with what it may do: "admin"
    (everything) or "read" (what only reads). None: it asks for none."""
    path = config.get("http.token_file")
    token = read_first_line("http.token_file", path) if path else config.get("http.token")
    read = config.get("http.read_token")
    if read and not token:
        raise ConfigError("http.read_token: needs http.token (or http.token_file) as well")
    if read and read == token:
        raise ConfigError("http.read_token: must differ from http.token")
    tokens = {token: "admin"} if token else {}
    if read:
        tokens[read] = "read"
    return tokens
