"""One client TCP connection: an asyncio Protocol that feeds a Channel.

The Channel decides everything; this class moves bytes, keeps the keepalive
timer, and batches writes: frames produced anywhere during one loop iteration
go out to each client in a single ``transport.write`` (see Node.flush).
"""

from __future__ import annotations

import asyncio
import logging

from ..channel import CONNECTED, Channel

log = logging.getLogger("mqttmesh.connection")


class Connection(asyncio.Protocol):
    __slots__ = ("node", "transport", "channel", "peer", "_timer", "_announced", "_loop", "paused",
                 "closing")

    def __init__(self, node):
        self.node = node
        self.transport = None
        self.channel: Channel | None = None
        self.peer = "?"
        self._timer = None
        self._announced = False
        self._loop = node.loop
        self.paused = False
        self.closing = False

    # -- asyncio callbacks ---------------------------------------------------------------

    def connection_made(self, transport) -> None:
        self.transport = transport
        addr = transport.get_extra_info("peername")
        self.peer = f"{addr[0]}:{addr[1]}" if isinstance(addr, tuple) else str(addr)
        refusal = self.node.admit(self)
        if refusal:
            log.warning("refused connection from %s: %s", self.peer, refusal)
            self.node.broker.stats.connections_refused += 1
            self.closing = True
            transport.abort()
            return
        transport.set_write_buffer_limits(high=256 * 1024)
        # a client certificate that verified against tls.ca_file (mesh.tls_mutual asks for one)
        certified = bool(transport.get_extra_info("peercert"))
        self.channel = Channel(self.node.broker, self, self.peer, self._loop.time(), certified)
        self._arm_timer()

    def data_received(self, data: bytes) -> None:
        channel = self.channel
        if channel is None:
            return
        self.node.broker.stats.bytes_received += len(data)
        channel.receive_data(data, self._loop.time())
        if not self._announced and channel.state is CONNECTED:
            self.connected()

    def connected(self, channel=None) -> None:
        """The Channel accepted the CONNECT: log it and switch to the keepalive timer."""
        if self._announced:
            return
        channel = self.channel
        self._announced = True
        log.info("client %r connected from %s (user=%r, keepalive=%ds)", channel.client_id,
                 self.peer, channel.username, channel.keepalive)
        if self._timer is not None:
            self._timer.cancel()
        self._arm_timer()

    def eof_received(self):
        return False  # close our side too

    def connection_lost(self, exc) -> None:
        self.node.forget(self)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        channel = self.channel
        if channel is None:
            return
        was_open = channel.state != "closed"
        channel.connection_lost(self._loop.time())
        if was_open:
            reason = f"connection lost ({exc})" if exc else "connection closed by client"
            log.info("client %r from %s: %s", channel.client_id or "-", self.peer, reason)

    def pause_writing(self) -> None:
        # the client reads slower than we write: its publishers wait (flow.py)
        self.paused = True
        channel = self.channel
        if channel is not None and channel.session is not None and channel.session.channel is channel:
            self.node.broker.congestion.add(channel.session, "socket")

    def resume_writing(self) -> None:
        self.paused = False
        channel = self.channel
        if channel is not None and channel.session is not None:
            self.node.broker.congestion.remove(channel.session, "socket")

    # -- the Channel's owner interface ------------------------------------------------------

    def wake(self, channel) -> None:
        self.node.mark_dirty(self)

    def close(self, channel, reason: str) -> None:
        if self.closing:
            return
        self.closing = True
        level = logging.INFO if channel.clean_disconnect else logging.WARNING
        log.log(level, "closing client %r from %s: %s", channel.client_id or "-", self.peer, reason)
        data = channel.data_to_send()  # e.g. a CONNACK with a refusal code goes out first
        transport = self.transport
        if data and not transport.is_closing():
            transport.write(data)
        transport.close()

    def authenticate(self, channel, username, password) -> None:
        self.node.authenticate(self, username, password)

    def pause_reading(self, channel) -> None:
        if not self.closing:
            self.transport.pause_reading()

    def resume_reading(self, channel) -> None:
        if not self.closing and not self.transport.is_closing():
            self.transport.resume_reading()

    # -- writing and timers ----------------------------------------------------------------------

    def flush(self) -> None:
        channel = self.channel
        if channel is None or self.closing:
            return
        data = channel.data_to_send()
        if not data:
            return
        transport = self.transport
        transport.write(data)
        stats = self.node.broker.stats
        stats.bytes_sent += len(data)
        if self.paused and transport.get_write_buffer_size() > self.node.max_write_buffer:
            stats.slow_consumers += 1
            channel.close(f"slow consumer: more than {self.node.max_write_buffer} bytes unsent")
            self.transport.abort()

    def _arm_timer(self) -> None:
        channel = self.channel
        deadline = channel.deadline() if channel is not None else None
        if deadline is not None:
            self._timer = self._loop.call_at(deadline, self._on_timer)
        else:
            self._timer = None

    def _on_timer(self) -> None:
        channel = self.channel
        channel.tick(self._loop.time())
        if channel.state != "closed":
            self._arm_timer()
