"""One client TCP (or TLS) connection: an asyncio Protocol that feeds a Channel.

The Channel decides everything; this class moves bytes, keeps the connect and
keepalive deadline (on the node's one timer for them all: deadlines.py), and batches
writes: frames produced anywhere during one loop iteration go out to each client in a
single ``transport.write`` (see Node.flush).

It also keeps each connection's use of memory bounded and its failures its own:
reading stops while the CONNECT is checked, an output over ``max_write_buffer``
drops QoS 0 (session.py) and is cut after ``slow_consumer_timeout``, a write to a
connection that is already gone is dropped, and a connection the node gives up on
is ended with a TCP reset so its socket and slot are freed at once.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import struct
from collections import deque
from typing import cast

from ..channel import AUTHENTICATING, CLAIMING, CLOSED, CONNECTED, Channel
from .deadlines import Entry

log = logging.getLogger("mqttmesh.connection")

# why reading from a connection is paused: each reason is lifted on its own
PAUSE_AUTH = 1  # its CONNECT is being checked: nothing more is read before CONNACK
PAUSE_FLOW = 2  # it published to a congested client (flow.py)
PAUSE_MEMORY = 4  # all connections together are over limits.buffer_memory
PAUSE_SLICE = 8  # what it sent waits for the next turn of the loop (Node.read_slice)
SMALL_READ = 4096  # a read this small is handled in the turn it came, spent or not

_LINGER_RST = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() sends a reset
WRITE_HIGH = 256 * 1024  # transport buffer above which the client counts as congested
# ``Connection.waiting`` while no read waits: an idle connection keeps no empty deque
NO_READS: deque[bytes] = cast("deque[bytes]", ())
DRAIN_SECONDS = 2.0  # longest a connection we closed is read (and dropped) before it is closed


class Connection(asyncio.Protocol):
    # (what only a TLS connection has, its time of accept and the address accept gave, is a
    # TlsConnection's: a plain connection reads the class's None; issue 26)
    __slots__ = (
        "node",
        "transport",
        "channel",
        "_timer",
        "closing",
        "pauses",
        "out_bytes",
        "in_bytes",
        "_reset",
        "_linger",
        "written",
        "draining",
        "waiting",
        "connected_at",
    )

    # a TlsConnection's (its slots): when it was accepted, before its handshake
    # (listeners.py), and the client's address as accept gave it, before there is a
    # transport; a plain connection has neither: it counts from connection_made, and
    # ``peer`` asks the transport
    accepted_at: float | None = None
    _peer: str | None = None

    def __init__(self, node):
        self.node = node
        self.transport: asyncio.Transport | None = None
        self.channel: Channel | None = None
        self._timer: Entry | None = None  # its deadline in node.deadlines (connect timeout, keepalive)
        self.closing = False
        self.pauses = 0  # PAUSE_* bits: reading is paused while any is set
        self.out_bytes = 0  # the transport's buffer as last seen (Node.buffered)
        self.in_bytes = 0  # the decoder's buffer as last seen (Node.buffered / preauth)
        # when it was answered CONNACK 0, on the loop's clock (the admin API shows it, plus
        # the node's wall offset): the Channel's ``last_rx`` then (Channel._connected sets it
        # to that time), the same float object, so an idle connection keeps no float for it;
        # None until then (``announced``)
        self.connected_at: float | None = None
        self._reset = False  # end with a TCP reset, not a graceful close
        self._linger = None  # timer that resets a graceful close that does not finish
        self.written = 0  # bytes handed to the transport, ever (progress: Node._progress)
        self.draining = False  # closed by us: what the client still sends is read and dropped
        # reads handled at a later turn of the loop (Node.read_slice), in the order they came
        self.waiting: deque[bytes] = NO_READS  # (a deque while reads wait: data_received)

    @property
    def announced(self) -> bool:
        """CONNACK 0 was sent: the connection is past authentication."""
        return self.connected_at is not None

    @property
    def peer(self) -> str:
        """The client's address, ``host:port``: made when asked (a log line, the admin API)
        from the transport, which keeps it also once closed; an idle connection keeps no
        string of it (issue 26)."""
        peer = self._peer
        if peer is not None:
            return peer
        transport = self.transport
        return "?" if transport is None else address(transport.get_extra_info("peername"))

    # -- asyncio callbacks ---------------------------------------------------------------

    def connection_made(self, transport) -> None:
        self.transport = transport
        node = self.node
        if self.accepted_at is None:  # (a TLS connection was admitted when it was accepted)
            refusal = node.admit(self)
            if refusal:
                log.warning("refused connection from %s: %s", self.peer, refusal)
                node.broker.stats.connections_refused += 1
                self.closing = True
                _reset(transport)
                return
        elif self.closing:  # the node gave up on it during the handshake
            _reset(transport)
            return
        # (pause_writing comes before an output is blocked, so resume_writing unblocks it)
        transport.set_write_buffer_limits(high=min(WRITE_HIGH, node.max_write_buffer // 2))
        now = node.loop.time()
        # a client certificate that verified against tls.ca_file (mesh.tls_mutual asks for one)
        certified = bool(transport.get_extra_info("peercert"))
        # the connect timeout counts from accept, the TLS handshake included; the Channel
        # asks this connection for the peer's address when it needs it ("": ``peer``)
        self.channel = node.core.channel(self, "", now if self.accepted_at is None else self.accepted_at, certified)
        self._arm_timer()

    def data_received(self, data: bytes) -> None:
        channel = self.channel
        if channel is None or self.draining:
            return  # (closing: read only so that the kernel has nothing unread, see close)
        node = self.node
        node.broker.stats.bytes_received += len(data)
        if self.connected_at is None:  # (not ``announced`` yet)
            self._received_before_connack(channel, data)
            return
        if self.waiting or (len(data) > SMALL_READ and node.turn_spent()):
            # this turn of the loop has handled its share of input: the read waits, in order,
            # and nothing more is read from this client until it is handled (Node.next_turn);
            # a small one (acknowledgements that free a subscriber's window, a PINGREQ) is
            # cheap and goes at once, lest it wait behind every flooding publisher's
            waiting = self.waiting
            if not waiting:
                node.wait_turn(self)
                if waiting is NO_READS:
                    waiting = self.waiting = deque()
            waiting.append(data)
            node.reads_waited += 1
            node.buffered += len(data)
            self.pause(PAUSE_SLICE)
            return
        self._handle(channel, data)

    def handle_waiting(self) -> None:
        """A read that waited for this turn of the loop (Node.next_turn)."""
        if not self.waiting:
            return  # (closed meanwhile)
        data = self.waiting.popleft()
        self.node.buffered -= len(data)
        channel = self.channel
        if channel is None or self.draining or self.closing:
            self.node.buffered -= sum(map(len, self.waiting))  # (dropped: not held any more)
            self.waiting = NO_READS
            return
        self._handle(channel, data)
        if not self.waiting:
            self.resume(PAUSE_SLICE)

    def _handle(self, channel: Channel, data: bytes) -> None:
        node = self.node
        channel.receive_data(data, self.node.loop.time())
        held = channel.decoder.buffered
        if held or self.in_bytes:
            node.buffered += held - self.in_bytes
            self.in_bytes = held
            if node.buffered > node.buffer_high:
                node.memory_pressure()

    def _received_before_connack(self, channel: Channel, data: bytes) -> None:
        """Bytes from a client not yet answered CONNACK 0: one CONNECT, bounded memory."""
        node = self.node
        if node.preauth_bytes + len(data) > node.preauth_memory:
            node.broker.stats.preauth_refused += 1
            self._reset = True
            channel.close(
                f"limits.preauth_memory ({node.preauth_memory} bytes) held by connections not yet authenticated"
            )
            return
        channel.receive_data(data, self.node.loop.time())
        state = channel.state
        if state is CONNECTED:
            self.connected()  # moves what is buffered from the pre-auth count to the other
            return
        if state is AUTHENTICATING or state is CLAIMING:
            self.pause(PAUSE_AUTH)  # read no further until CONNACK
        held = channel.decoder.buffered if state is not CLOSED else 0
        node.preauth_bytes += held - self.in_bytes
        self.in_bytes = held

    def connected(self, channel=None) -> None:
        """The Channel accepted the CONNECT: log it and switch to the keepalive timer."""
        if self.connected_at is not None:  # (``announced`` already)
            return
        channel = self.channel
        self.connected_at = channel.last_rx  # (``announced`` from now on)
        node = self.node
        node.preauth_bytes -= self.in_bytes  # what is buffered now counts as an ordinary input
        held = channel.decoder.buffered
        node.buffered += held
        self.in_bytes = held
        log.info(
            "client %r connected from %s (user=%r, keepalive=%ds)",
            channel.client_id,
            self.peer,
            channel.username,
            channel.keepalive,
        )
        if self._timer is not None:
            node.deadlines.cancel(self._timer)
        self._arm_timer()
        if node.reading_paused and not channel.is_peer:
            self.pause(PAUSE_MEMORY)  # (it resumes with the others: Node._flow_tick)
        self.resume(PAUSE_AUTH)

    def eof_received(self):
        return False  # close our side too

    def connection_lost(self, exc) -> None:
        node = self.node
        node.forget(self)
        if self._timer is not None:
            node.deadlines.cancel(self._timer)
            self._timer = None
        if self._linger is not None:
            self._linger.cancel()
            self._linger = None
        if self.announced:
            node.buffered -= self.in_bytes + self.out_bytes + sum(map(len, self.waiting))
        else:
            node.preauth_bytes -= self.in_bytes
        self.in_bytes = self.out_bytes = 0
        self.waiting = NO_READS
        channel = self.channel
        if channel is None:
            return
        was_open = channel.state != "closed"
        channel.connection_lost(self.node.loop.time())
        if was_open:
            reason = f"connection lost ({exc})" if exc else "connection closed by client"
            log.info("client %r from %s: %s", channel.client_id or "-", self.peer, reason)

    def pause_writing(self) -> None:
        # the client reads slower than we write: the publishers that feed it wait (flow.py)
        channel = self.channel
        if channel is not None and channel.session is not None and channel.session.channel is channel:
            self.node.broker.congestion.add(channel.session, "socket")

    def resume_writing(self) -> None:
        channel = self.channel
        if channel is None:
            return
        node = self.node
        if self.out_bytes:
            size = self.transport.get_write_buffer_size()
            node.buffered += size - self.out_bytes
            self.out_bytes = size
        if channel.blocked:
            self.unblock()
        if channel.session is not None:
            node.broker.congestion.remove(channel.session, "socket")

    def unblock(self) -> None:
        """The output drained below its limit: QoS 0 goes out again."""
        self.channel.blocked = False
        self.node.blocked.pop(self, None)

    # -- the Channel's owner interface ------------------------------------------------------

    def wake(self, channel) -> None:
        if channel.pending_frames > 1:
            # a read brought this client many messages: write them now, so that a client
            # that cannot take them is congested before more is read (flow.py)
            self.flush()
        else:
            self.node.mark_dirty(self)

    def close(self, channel, reason: str) -> None:
        if self.closing:
            return
        self.closing = True
        transport = self.transport
        node = self.node
        node.blocked.pop(self, None)
        if self._reset:
            log.warning("resetting client %r from %s: %s", channel.client_id or "-", self.peer, reason)
            _reset(transport)
            return
        level = logging.INFO if channel.clean_disconnect else logging.WARNING
        log.log(level, "closing client %r from %s: %s", channel.client_id or "-", self.peer, reason)
        data = channel.data_to_send()  # e.g. a CONNACK with a refusal code goes out first
        if transport.is_closing():
            return
        if data:
            transport.write(data)
        # A socket closed with bytes it has not read is reset by the kernel, and a reset can
        # destroy the last bytes on their way: a client that pinged or published while its
        # CONNECT was checked (reading was paused) would get ECONNRESET instead of its
        # CONNACK 0x03. So the node says it is done (FIN after the data), reads and drops
        # what still comes, and closes once the client closes, or after DRAIN_SECONDS.
        self.draining = True
        if transport.can_write_eof():
            transport.write_eof()
        self.pauses = 0
        if not transport.is_reading():
            transport.resume_reading()
        self._linger = node.loop.call_later(
            min(DRAIN_SECONDS, node.broker.settings.slow_consumer_timeout), self._drained
        )

    def _drained(self) -> None:
        """The client did not close within the drain time: close (reset if bytes are left)."""
        self._linger = None
        transport = self.transport
        if transport.is_closing():
            return
        transport.close()
        if transport.get_write_buffer_size():
            # a client that does not read what is left would hold its socket and its slot
            # for as long as the kernel keeps trying: it gets as long as a slow consumer
            node = self.node
            self._linger = node.loop.call_later(node.broker.settings.slow_consumer_timeout, self._linger_expired)

    def _linger_expired(self) -> None:
        self._linger = None
        log.info("client from %s did not take its last bytes: reset", self.peer)
        _reset(self.transport)

    def reset(self, reason: str) -> None:
        """Give up on this connection: close it (the will goes out) with a TCP reset."""
        self._reset = True
        channel = self.channel
        if channel is not None and channel.state != "closed":
            channel.close(reason, self.node.loop.time())
        else:
            _reset(self.transport)

    def authenticate(self, channel, username, password) -> None:
        self.node.authenticate(self, username, password)

    def pause_reading(self, channel) -> None:
        self.pause(PAUSE_FLOW)

    def resume_reading(self, channel) -> None:
        self.resume(PAUSE_FLOW)

    def pause(self, reason: int) -> None:
        if not self.pauses and not self.closing:
            self.transport.pause_reading()
        self.pauses |= reason

    def resume(self, reason: int) -> None:
        if not self.pauses & reason:
            return
        self.pauses &= ~reason
        if not self.pauses and not self.closing and not self.transport.is_closing():
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
        if transport.is_closing():
            return  # reset by the client: connection_lost follows, nothing can be sent
        transport.write(data)
        self.written += len(data)
        node = self.node
        node.broker.stats.bytes_sent += len(data)
        size = transport.get_write_buffer_size()  # what the kernel did not take at once
        if size or self.out_bytes:
            node.buffered += size - self.out_bytes
            self.out_bytes = size
            if size:
                node.buffering.add(self)  # Node._flow_tick sees it drain
            if size > node.max_write_buffer and not channel.blocked:
                # QoS 0 for this client is dropped from now on (session.py); if it stays over
                # for slow_consumer_timeout it is reset (Node._sweep)
                channel.blocked = True
                node.blocked[self] = node.loop.time()  # (since when: Node._sweep)
                node.broker.stats.outputs_blocked += 1
            if node.buffered > node.buffer_high:
                node.memory_pressure()

    def _arm_timer(self) -> None:
        channel = self.channel
        deadline = channel.deadline() if channel is not None else None
        if deadline is not None:
            self._timer = self.node.deadlines.add(deadline, self)
        else:
            self._timer = None

    def on_deadline(self) -> None:
        """The deadline it armed came (deadlines.Deadlines)."""
        self._timer = None
        channel = self.channel
        now = self.node.loop.time()
        if self.pauses & PAUSE_MEMORY:
            channel.last_rx = now  # we are not reading it: its silence is ours [MQTT-3.1.2-24]
        channel.tick(now)
        if channel.state != "closed":
            self._arm_timer()


class TlsConnection(Connection):
    """A TLS listener's connection (listeners.py): admitted when accepted, before its
    handshake, its connect timeout counting from then (``accepted_at``), and named by the
    address accept gave (``peer``) until the handshake makes a transport."""

    __slots__ = ("accepted_at", "_peer")

    def __init__(self, node, accepted_at: float):
        super().__init__(node)
        self.accepted_at = accepted_at
        self._peer = None

    @property
    def peer(self) -> str:
        return super().peer  # (``_peer`` first: Connection.peer)

    @peer.setter
    def peer(self, peer: str) -> None:
        self._peer = peer  # (a plain Connection has no slot for it: its transport names it)


def accepted(node, accepted_at: float | None = None) -> Connection:
    """A Connection for a client accepted at ``accepted_at`` (a TLS listener's, before its
    handshake), else one that counts from ``connection_made``."""
    return Connection(node) if accepted_at is None else TlsConnection(node, accepted_at)


def address(addr) -> str:
    """A transport's ``peername`` as text: ``host:port`` (a Unix socket's path as it is)."""
    return f"{addr[0]}:{addr[1]}" if isinstance(addr, tuple) else str(addr)


def _reset(transport) -> None:
    """Close with a TCP reset: the kernel frees the socket at once, unsent bytes are dropped."""
    if transport is None:
        return
    sock = transport.get_extra_info("socket")
    if sock is not None:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RST)
        except (OSError, ValueError, RuntimeError):
            pass  # already closed
    transport.abort()
