"""The server side of one MQTT 3.1.1 client connection: a state machine.

Pure: bytes and times in, bytes and requests out. It leaves to its caller (the
*owner*, the I/O layer: ``ports.Owner``) the socket, the timers, and slow password
checks, and to the broker the randomness of auto ClientIds. In a mesh it is given, at
construction, the peer links (``peers``, a ports.PeerPort: mesh/link/links.py) for a node
that dials us, and the mesh-wide ClientIds (``claims``, a ports.ClaimPort:
mesh/cluster/cluster.py) for a client; both are None outside a mesh.

Every transition is in TRANSITIONS below; a packet that is not there is a
protocol violation, refused with the statement of the standard it breaks. Three
mixins hold parts of it, the Channel keeping their state: the frames out, held while an
acknowledgement waits for the store (channel_held.py), a client's PUBLISH in
(channel_publish.py), and the listening side of a peer's handshake (channel_peer.py).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from . import codec
from .channel5 import Conn5, Mqtt5, reason_of
from .channel_held import NO_FRAMES, NO_ROUTING, NOTHING_HELD, PUBREL_FIRST, HeldFrames, ProtocolViolation, ack_frame
from .channel_peer import PEER_AUTH, PeerListening
from .channel_publish import Publishing, will_delay
from .channel_states import AUTHENTICATING, AWAIT_CONNECT, CLAIMING, CLOSED, CONNECTED, violation
from .channel_subscribe import Subscribing
from .codec import (
    AUTH,
    CONNECT,
    DISCONNECT,
    PINGREQ,
    PUBACK,
    PUBCOMP,
    PUBLISH,
    PUBREC,
    PUBREL,
    SUBSCRIBE,
    UNSUBSCRIBE,
    Decoder,
    MalformedPacket,
    Will,
)
from .message import Message
from .packets import (
    ACCEPTED,
    BAD_PROTOCOL,
    CONNACK_REASONS,
    ID_REJECTED,
)
from .ports import PEER_USERNAME
from .session import KEPT

if TYPE_CHECKING:
    from .broker import Broker, ClaimingChannel
    from .channel_held import Pending, Routing
    from .packets import Will
    from .ports import Batch, Owner, PeerListener, PeerPort, ReadCapture
    from .session import Frame0Fn, FrameFn, Session

__all__ = [
    "Channel",
    "ClaimPort",
    "AWAIT_CONNECT",
    "AUTHENTICATING",
    "CLAIMING",
    "PEER_AUTH",
    "CONNECTED",
    "CLOSED",
    "TRANSITIONS",
]

_PINGRESP = codec.encode(codec.PingResp())
# bytes that may wait behind the CONNECT before CONNACK: what one read from the socket
# brings (uvloop and asyncio read at most 256 KiB at a time)
PREAUTH_READ_SLACK = 256 * 1024


class ClaimPort(Protocol):
    """Mesh-wide ClientIds, as a client's Channel sees them (mesh/cluster/cluster.py Cluster).
    None outside a mesh: the Channel opens the session with the Broker itself."""

    def connect(
        self,
        channel: ClaimingChannel,
        cid: str,
        clean: bool,
        will: Will | None,
        now: float,
        will_seq: int = 0,
        fresh: bool | None = None,
        expiry: int = KEPT,
    ) -> None:
        """A client passed authentication: claim ``cid``, gather its session, and answer
        with ``channel.claimed(session, present, now)`` (``will_seq``: the number its will's
        message takes, wherever it is published; ``clean``: the session ends with the
        connection, ``fresh``: the one held is discarded first, ``clean`` when None;
        ``expiry``: its Session Expiry Interval)."""

    def disconnected(self, channel: ClaimingChannel, now: float, delayed: bool = False) -> None:
        """A local connection ended; its will, if due now, is the Channel's to publish;
        ``delayed``: it waits for its Will Delay Interval (the mesh publishes it then)."""


class Opening:
    """What a Channel keeps only until its CONNACK (a peer: until it proved the cluster
    secret): when the connection was opened (the connect timeout counts from it), whether its
    TLS client certificate verified (mesh.tls_mutual), the CONNECT being checked, and a
    peer's handshake (channel_peer.py). An idle connection keeps none of it."""

    __slots__ = ("opened_at", "certified", "connect", "peer_auth", "peer_filter")

    def __init__(self, opened_at: float, certified: bool):
        self.opened_at = opened_at
        self.certified = certified
        self.connect: codec.Connect | None = None  # AUTHENTICATING, CLAIMING, PEER_AUTH
        self.peer_auth: PeerListener | None = None  # PEER_AUTH: the listener's half of the handshake (peerauth.py)
        self.peer_filter: tuple[str, int] | None = None  # PEER_AUTH: (filter, granted QoS) of its SUBSCRIBE


class Channel(Publishing, Subscribing, PeerListening, HeldFrames, Mqtt5):
    __slots__ = (
        "v5",
        "frame",
        "frame0",
        "broker",
        "owner",
        "_peer",
        "state",
        "decoder",
        "session",
        "client_id",
        "username",
        "will",
        "keepalive",
        "last_rx",
        "_opening",
        "close_reason",
        "clean_disconnect",
        "_out",
        "_held",
        "_deferred",
        "peer_node",
        "_processing",
        "blocked",
        "_read",
        "peers",
        "claims",
    )

    def __init__(
        self,
        broker: Broker,
        owner: Owner[Channel],
        peer: str,
        now: float,
        certified: bool = False,
        *,
        peers: PeerPort[Channel] | None = None,
        claims: ClaimPort | None = None,
    ):
        self.broker = broker
        self.owner = owner
        self.peers = peers  # None: no mesh, a peer's CONNECT is refused
        self.claims = claims  # None: no mesh, the Broker alone opens the session
        self._peer = peer  # ("": the owner's ``peer``, asked when needed)
        self.state = AWAIT_CONNECT
        # before CONNACK only a CONNECT within the pre-auth limit is read (section 3.1)
        settings = broker.settings
        self.decoder = Decoder(min(settings.max_connect_size, settings.max_packet_size))
        self.session: Session | None = None
        self.client_id = ""
        self.username: str | None = None
        # the CONNECT's will, numbered at CONNECT (``Will.seq``: its message's sequence number)
        self.will: Will | None = None
        self.keepalive = 0
        self.last_rx = now
        # what is kept only until CONNACK (an idle connection keeps none of it)
        self._opening: Opening | None = Opening(now, certified)
        self.close_reason: str | None = None
        self.clean_disconnect = False
        # a peer link's node id once it proved the cluster secret (peerauth.py); None: a client
        self.peer_node: str | None = None
        self._processing = False
        # the owner found its output over limits.max_write_buffer: QoS 0 messages for this
        # client are dropped (session.py) until the output drains
        self.blocked = False
        # the archive's capture of the read being processed (archive/capture.py), if any
        self._read: ReadCapture | None = None
        self._out: list[bytes] = NO_FRAMES  # (a list while frames wait: channel_held.py)
        # frames waiting for a journal batch and a ticket of the session's gate, in order
        self._held: deque[tuple[int, int, bytes | Routing | Pending]] = NOTHING_HELD  # (made by _hold)
        # messages in ``_held`` not routed yet: while there is one, what this client publishes
        # waits behind it, in order [MQTT-4.6.0-6]
        self._deferred: deque[Routing] = NO_ROUTING  # (made by _defer)
        # what an MQTT 5 client agreed on (channel5.py), None for 3.1.1; the PUBLISH frames
        # of its messages (session.Attached), its packets' handlers
        self.v5: Conn5 | None = None
        self.frame: FrameFn = Message.frame
        self.frame0: Frame0Fn = Message.frame_qos0

    @property
    def is_peer(self) -> bool:  # a peer link from another mesh node (the per-packet paths read peer_node)
        return self.peer_node is not None

    @property
    def will_seq(self) -> int:  # the number the will's message takes (``Will.seq``), 0: no will
        return 0 if self.will is None else self.will.seq

    @property
    def peer(self) -> str:
        """The client's address as its owner gave it; an owner that gave "" is asked (a
        server connection, which keeps no string of it while the client is idle)."""
        return self._peer or self.owner.peer

    # -- bytes in (bytes out: channel_held.py) ------------------------------------------

    def receive_data(self, data: bytes, now: float) -> None:
        if self.state is CLOSED:
            return  # [MQTT-3.1.4-5]: nothing after a refusal or a close is processed
        self.last_rx = now
        decoder = self.decoder
        decoder.feed(data)
        state = self.state
        if state is not CONNECTED:
            if state is AWAIT_CONNECT:
                first = decoder.first_byte()
                if first != 0x10 and first >= 0:
                    # refused at the first byte, without waiting for the body it announces
                    self.broker.stats.protocol_errors += 1
                    rule = "MQTT-2.2.2-2" if first >> 4 == CONNECT else "MQTT-3.1.0-1"
                    return self.close(f"protocol violation: [{rule}] first byte 0x{first:02x} is not a CONNECT header")
            elif decoder.buffered > decoder.max_packet_size + PREAUTH_READ_SLACK:
                # the owner stops reading while the CONNECT is checked; this is the backstop
                return self.close("more data before CONNACK than one read behind the CONNECT")
        if state is AUTHENTICATING or state is CLAIMING or self._processing:
            return  # read on once the password check is done (authenticated)
        self._process(now)

    def _process(self, now: float) -> None:
        self._processing = True
        archive = self.broker.archive
        read = None
        if archive is not None and self.state is CONNECTED and self.peer_node is None:
            read = self._read = archive.read(self.client_id)
        try:
            for packet in self.decoder.packets(None if read is None else read.keep):
                # (the packets of an MQTT 5 client, ``v5``, from its CONNECT on: TRANSITIONS5)
                table = (TRANSITIONS if self.v5 is None else TRANSITIONS5)[self.state]
                handler = table.get(packet.type)
                if handler is None:
                    raise violation(self.state, packet.type)
                handler(self, packet, now)
                if self.state is not CONNECTED and self.state is not PEER_AUTH:
                    break  # closed, or waiting for a password check: read no further
        except (MalformedPacket, ProtocolViolation) as exc:
            self.broker.stats.protocol_errors += 1
            self.close_because(reason_of(exc), f"protocol violation: {exc}", now)  # [MQTT-4.13.1-1] (5.0)
        finally:
            self._processing = False
            if read is not None:
                self._read = None
                read.end(now + self.broker.wall_offset)
        if self.decoder.buffered > self.decoder.max_packet_size and self.state is not CLOSED:
            self.close("input buffer over the maximum packet size", now)  # pragma: no cover

    @property
    def claiming(self) -> bool:
        """In a mesh: the ClientId is being claimed, the session gathered (mesh/cluster/cluster.py)."""
        return self.state is CLAIMING

    # -- flow control (flow.py): a ports.Pausable ------------------------------------------

    def pause_reading(self) -> None:
        self.owner.pause_reading(self)

    def resume_reading(self) -> None:
        if self.state is CONNECTED:  # (a closed channel's socket is the owner's business)
            self.owner.resume_reading(self)

    # -- time -----------------------------------------------------------------------------

    def deadline(self) -> float | None:
        """When ``tick`` must next be called, or None."""
        if self.state is AWAIT_CONNECT or self.state is PEER_AUTH:
            return self._opened_at() + self.broker.settings.connect_timeout
        if self.state is CONNECTED and self.keepalive:
            return self.last_rx + 1.5 * self.keepalive
        return None

    def _opened_at(self) -> float:
        """When the connection was opened (before CONNACK: the connect timeout counts from it)."""
        opening = self._opening
        assert opening is not None
        return opening.opened_at

    def tick(self, now: float) -> None:
        if self.state is AWAIT_CONNECT and now >= self._opened_at() + self.broker.settings.connect_timeout:
            self.close("no CONNECT within the connect timeout", now)
        elif self.state is PEER_AUTH and now >= self._opened_at() + self.broker.settings.connect_timeout:
            self.broker.stats.connections_refused += 1
            self.close(
                f"peer {self._opening.peer_auth.handshake.dialler!r} did not prove the cluster secret "
                f"within the connect timeout",
                now,
            )
        elif self.state is CONNECTED and self.keepalive and now >= self.last_rx + 1.5 * self.keepalive:
            if self in self.broker.congestion.paused:
                # we stopped reading this publisher (flow.py): its silence is ours, not its
                self.last_rx = now
                return
            self.close_because(0x8D, f"keepalive: nothing received for 1.5 x {self.keepalive}s", now)  # [MQTT-3.1.2-24]

    # -- closing ---------------------------------------------------------------------------------

    def close(self, reason: str, now: float | None = None) -> None:
        """End the connection from the server side; the will is published [MQTT-3.1.2-8].
        ``now``: the caller's time, when it has one (else the channel's last read)."""
        if self.state is CLOSED:
            return
        self.close_reason = reason
        self._end(publish_will=True, now=now)
        self.owner.close(self, reason)

    def kick(self, reason: str, now: float) -> None:
        """Another connection took this ClientId over [MQTT-3.1.4-2], or the mesh fenced it:
        the connection ends at ``now``, not at its last read, which can be long before (the
        session's copy for its holders is taken then: docs/simulation.md, finding 24)."""
        self.close_because(0x8E, reason, now)  # (MQTT 5: Session taken over)

    def close_because(self, code: int, reason: str, now: float | None = None) -> None:
        """``close``, an MQTT 5 client told why first: DISCONNECT with reason ``code``."""
        if self.v5 is not None and self.state is CONNECTED:
            self.disconnect5(code)
        self.close(reason, now)

    def connection_lost(self, now: float) -> None:
        """The network connection is gone (either side closed it)."""
        if self.state is not CLOSED:
            self.close_reason = self.close_reason or "connection lost"
            self._end(publish_will=not self.clean_disconnect, now=now)

    def _end(self, publish_will: bool, now: float | None = None) -> None:
        """``now``: when the connection was lost or closed; a close from this side whose
        caller has no time counts as of the channel's last read."""
        self._read = None  # the will is no packet of the read being captured
        was_connected = self.state is CONNECTED
        self.state = CLOSED
        broker = self.broker
        if self in broker.congestion.paused:
            broker.congestion.unpause(self)
        session = self.session
        will = self.will if publish_will and was_connected else None
        delay = will_delay(will, session)
        if session is not None and session.channel is self:
            broker.table.close_session(session, self.last_rx if now is None else now)
        if self._deferred:
            # messages waiting for the holders are not routed from a closed connection: the
            # session keeps them and the node the client comes back to routes them
            self._drop_deferred()
        if self.is_peer and was_connected and self.peers is not None:
            self.peers.peer_closed(self, self.last_rx if now is None else now)
        if was_connected and self.claims is not None and not self.is_peer:
            # in a mesh a delayed will is the registrar's to publish (or to drop, when the
            # client connects again on any node first: mesh/cluster/registry.py); it and the
            # session's expiry count from the end, as close_session does, not from the last
            # read (docs/simulation.md, finding 21)
            self.claims.disconnected(self, self.last_rx if now is None else now, delayed=bool(delay))
            if delay:
                will = None
        if will is not None:
            self._publish_will(will, delay, self.last_rx if now is None else now)
        self.will = None  # [MQTT-3.1.2-10]

    # -- CONNECT -------------------------------------------------------------------------------

    def _on_connect(self, pkt: codec.Connect, now: float) -> None:
        if pkt.protocol_level == 5 and pkt.protocol_name == "MQTT":
            rc = self._connect5(pkt)
            if rc is not None:
                return self._refuse(rc, "an authentication method this node does not serve")
        elif pkt.protocol_level != 4 or pkt.protocol_name != "MQTT":
            return self._refuse(
                BAD_PROTOCOL, f"protocol {pkt.protocol_name!r} level {pkt.protocol_level}"
            )  # [MQTT-3.1.2-2]
        if not pkt.client_id and not pkt.clean_session and self.v5 is None:
            return self._refuse(ID_REJECTED, "empty ClientId with CleanSession=0")  # [MQTT-3.1.3-8]
        if self.v5 is None and self.broker.settings.max_keepalive:
            if pkt.keepalive == 0 or pkt.keepalive > self.broker.settings.max_keepalive:
                # 3.1.1 has no Server Keep Alive: refused, as Mosquitto does (mqtt.max_keepalive)
                return self._refuse(ID_REJECTED, f"keep alive {pkt.keepalive}s over mqtt.max_keepalive")
        if len(pkt.client_id.encode()) > self.broker.settings.max_client_id_length:
            return self._refuse(ID_REJECTED, "ClientId longer than max_client_id_length")  # [MQTT-3.1.3-9]
        self.username = pkt.username
        self.keepalive = pkt.keepalive
        self.client_id = pkt.client_id
        will = pkt.will
        self.will = None if will is None else will.numbered(self.broker.next_seq())
        self.state = AUTHENTICATING
        self._opening.connect = pkt  # (AWAIT_CONNECT: it has one)
        if pkt.username == PEER_USERNAME:
            return self._on_peer_connect(pkt, now)
        if pkt.client_id.startswith("$mesh"):
            return self._accept(ID_REJECTED, now, "ClientIds starting with $mesh are reserved for peer links")
        rc = self.broker.auth.check_fast(pkt.username, pkt.password)
        if rc is None:
            self.owner.authenticate(self, pkt.username, pkt.password)
        else:
            self._accept(rc, now)

    def authenticated(self, rc: int, now: float, why: str = "") -> None:
        """The result of the slow password check for the pending CONNECT (``why``: a
        refusal's reason for the log, when it is not the credentials)."""
        if self.state is not AUTHENTICATING:
            return  # the connection ended while the check ran
        self._accept(rc, now, why)
        if self.state is CONNECTED and not self._processing:
            self._process(now)  # packets that arrived behind the CONNECT
        # (when the owner answered from inside authenticate(), the running
        # _process loop goes on with them by itself)

    def _accept(self, rc: int, now: float, why: str = "") -> None:
        opening = self._opening
        assert opening is not None and opening.connect is not None  # (AUTHENTICATING: the CONNECT checked)
        pkt = opening.connect
        opening.connect = None
        if rc != ACCEPTED:
            return self._refuse(rc, why or f"user {_quoted(pkt.username)}")
        conn = self.v5
        if not pkt.client_id:
            # [MQTT-3.1.3-6]: a unique ClientId of our own making
            self.client_id = f"auto-{self.broker.node_id}-{self.broker.random_hex(6)}"
            if conn is not None:
                conn.assigned = self.client_id  # [MQTT-3.1.3-7] (5.0)
        broker = self.broker
        # 3.1.1's CleanSession is two things MQTT 5 asks apart: start afresh (Clean Start),
        # and end with the connection (a Session Expiry Interval of 0)
        fresh = clean = pkt.clean_session
        if conn is not None:
            clean = conn.session_expiry == 0
        if self.claims is not None and not self.is_peer:
            # one ClientId, one connection, mesh-wide [MQTT-3.1.4-2]: the cluster claims
            # the id and gathers the session, then calls claimed() (mesh/cluster/cluster.py)
            self.state = CLAIMING
            expiry = conn.session_expiry if conn is not None else broker.settings.max_session_expiry or KEPT
            will = self.will
            seq = 0 if will is None else will.seq
            self.claims.connect(self, self.client_id, clean, will, now, seq, fresh, expiry)
            return
        mark = broker.journal.mark()
        session, present = broker.table.open_session(
            self, self.client_id, clean, now, durable=not self.is_peer, fresh=fresh
        )
        # a session created or discarded must be durable before CONNACK says so [MQTT-3.1.2-6]
        self._connected(session, present, now, broker.journal.since(mark))

    def claimed(self, session: Session, present: bool, now: float) -> None:
        """The mesh claimed the ClientId for this connection and has its session ready."""
        if self.state is not CLAIMING:
            return
        self._connected(session, present, now)
        self.owner.connected(self)
        if not self._processing:
            self._process(now)  # packets that arrived behind the CONNECT

    def refused(self, rc: int, reason: str, now: float) -> None:
        """The mesh could not claim the ClientId for this connection: CONNACK ``rc`` (0x03,
        server unavailable: mesh/cluster/claimant.py says when), close."""
        if self.state is not CLAIMING:
            return
        self._refuse(rc, reason)

    def _connected(self, session: Session, present: bool, now: float, batch: Batch = 0) -> None:
        self.state = CONNECTED
        self._opening = None
        self.last_rx = now
        if not self.is_peer:
            self.decoder.max_packet_size = self.broker.settings.max_packet_size
        self.broker.stats.connections_total += 1
        self.broker.cancel_will(self.client_id)  # a new connection came first [MQTT-3.1.3-9]
        if not session.clean and not self.is_peer:  # its Session Expiry Interval, for when the connection ends
            session.expiry = self.broker.settings.max_session_expiry or KEPT
            if self.v5 is not None:
                session.expiry = self.v5.session_expiry
        session.username = self.username
        self.session = session
        if self.v5 is None:
            self._send_after(bytes((0x20, 2, 1 if present else 0, ACCEPTED)), batch)  # [MQTT-3.2.2-1..3]
        else:
            self._send_after(self.connack5(present), batch)
            self.attach5(session)
        session.attach(self, now)  # re-send unacknowledged messages [MQTT-4.4.0-1]
        if self.broker.shared_groups:
            self.broker.table.attached(session)  # (a member back: its groups are served here)
        self._route_unrouted(session, now)

    def _refuse(self, rc: int, detail: str) -> None:
        self.broker.stats.connections_refused += 1
        self.will = None
        if self.v5 is not None:
            return self._refuse5(rc, detail)
        self.write(bytes((0x20, 2, 0, rc)))  # session present 0 [MQTT-3.2.2-4]
        self.close(f"CONNACK 0x{rc:02x} ({CONNACK_REASONS[rc]}): {detail}")  # [MQTT-3.2.2-5]

    def _peer_proved(self, dialler: str, now: float) -> None:
        """A provisional peer proved the cluster secret (channel_peer.py): a peer link now."""
        opening = self._opening
        assert opening is not None and opening.connect is not None and opening.peer_filter is not None
        connect = opening.connect
        topic_filter, granted = opening.peer_filter
        self._opening = None
        self.peer_node = dialler  # (a peer link from now on: ``is_peer``)
        # a peer proved the cluster secret: session snapshots, retained lookups and full
        # advertisements may exceed the clients' limits.max_packet_size
        self.decoder.max_packet_size = codec.DEFAULT_MAX_PACKET_SIZE
        broker = self.broker
        session, _ = broker.table.open_session(self, self.client_id, connect.clean_session, now, durable=False)
        self.state = CONNECTED
        self.last_rx = now
        broker.stats.connections_total += 1
        session.username = self.username
        self.session = session
        session.attach(self, now)  # re-send what the peer's session held [MQTT-4.4.0-1]
        broker.table.subscribe(session, topic_filter, granted)

    # -- acknowledgements, server to client messages --------------------------------------

    def _on_puback(self, pkt: codec.PubAck, now: float) -> None:
        self.session.on_puback(pkt.packet_id, now)

    def _on_pubrec(self, pkt: codec.PubRec, now: float) -> None:
        journal = self.broker.journal
        mark = journal.mark()
        session = self.session
        session.on_pubrec(pkt.packet_id)
        # after a crash (here, or of this node in a mesh) the PUBLISH must not be re-sent
        # once its PUBREL went out [MQTT-4.3.3-1]
        self._send_after(ack_frame(PUBREL_FIRST, pkt.packet_id), journal.since(mark), session.gate.ticket())

    def _on_pubcomp(self, pkt: codec.PubComp, now: float) -> None:
        self.session.on_pubcomp(pkt.packet_id, now)

    def _on_pingreq(self, pkt: codec.PingReq, now: float) -> None:
        self.write(_PINGRESP)  # [MQTT-3.12.4-1]

    def _on_disconnect(self, pkt: codec.Disconnect, now: float) -> None:
        self.will = None  # [MQTT-3.14.4-3]
        self.clean_disconnect = True
        self.close_reason = "client sent DISCONNECT"
        self._end(publish_will=False)
        self.owner.close(self, self.close_reason)


def _quoted(name: str | None, limit: int = 64) -> str:
    """A client-chosen name for a log line: escaped, and cut (user names may be 64 KiB)."""
    if name is None:
        return "None"
    return repr(name[:limit]) + ("..." if len(name) > limit else "")


# state -> {packet type -> handler}; anything else is a protocol violation (channel_states.violation)
TRANSITIONS: dict[str, dict[int, Callable[[Channel, Any, float], None]]] = {
    AWAIT_CONNECT: {CONNECT: Channel._on_connect},
    AUTHENTICATING: {},
    CLAIMING: {},
    # a provisional peer may only take the challenge and answer it (mesh/link/peerauth.py)
    PEER_AUTH: {
        SUBSCRIBE: Channel._on_peer_subscribe,
        PUBLISH: Channel._on_peer_proof,
        PINGREQ: Channel._on_pingreq,
        DISCONNECT: Channel._on_disconnect,
    },
    CONNECTED: {
        PUBLISH: Channel._on_publish,
        PUBACK: Channel._on_puback,
        PUBREC: Channel._on_pubrec,
        PUBREL: Channel._on_pubrel,
        PUBCOMP: Channel._on_pubcomp,
        SUBSCRIBE: Channel._on_subscribe,
        UNSUBSCRIBE: Channel._on_unsubscribe,
        PINGREQ: Channel._on_pingreq,
        DISCONNECT: Channel._on_disconnect,
    },
    CLOSED: {},
}

# an MQTT 5 client's (channel5.py); the same states
TRANSITIONS5: dict[str, dict[int, Callable[[Channel, Any, float], None]]] = {
    **TRANSITIONS,
    CONNECTED: {
        **TRANSITIONS[CONNECTED],
        PUBLISH: Channel._on_publish5,
        SUBSCRIBE: Channel._on_subscribe5,
        UNSUBSCRIBE: Channel._on_unsubscribe5,
        DISCONNECT: Channel._on_disconnect5,
        AUTH: Channel._on_auth5,
    },
}
