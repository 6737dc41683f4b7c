"""The dialling side of a peer link: a plain MQTT 3.1.1 client state machine.

Pure: bytes, times and nonces in, bytes and events out. A node that dials a peer is an
ordinary MQTT client of the peer's listener [MQTT-7.0.0-1]: CONNECT with the peer
credentials, SUBSCRIBE to its own ``$mesh/to/<node>/#`` topic, the two-way proof of the
cluster secret (mesh/link/peerauth.py), then PUBLISH (QoS 0/1) both ways, PINGREQ for
keepalive and round-trip time. It leaves to its caller the socket, the clock, the
nonces (one per connection) and what the messages mean.

States: idle -> connecting (CONNECT sent) -> subscribing (CONNACK 0, SUBSCRIBE sent) ->
authenticating (SUBACK; the listener's proof expected) -> ready (its proof checked,
ours sent); any failure -> refused. A handshake not finished within
``handshake_timeout`` of the connection is dead (tick).

Its QoS 1 messages go out as the listener's go to it: through a ``session.Session`` (the
outbound window of every client session: packet ids, at most ``max_inflight`` in flight,
``max_queued`` waiting, the newest dropped beyond), here one of the link's own, attached
while the link is ready. So unacknowledged QoS 1 PUBLISH packets survive a reconnect and
are re-sent with DUP=1 and their packet ids once the listener proved the secret
[MQTT-4.4.0-1], in the one way both directions of a link do it.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from ...codec import (
    CONNACK,
    PINGRESP,
    PUBACK,
    PUBLISH,
    SUBACK,
    Connect,
    Decoder,
    MalformedPacket,
    PubAck,
    Publish,
    Subscribe,
    encode,
    encode_publish,
)
from ...message import Entry, Message
from ...session import Limits, Session
from .peerauth import PEER_USERNAME, DiallerAuth, PeerAuthError

__all__ = [
    "LinkClient",
    "LinkEvent",
    "Ready",
    "Refused",
    "AuthFailed",
    "Received",
    "Rtt",
    "ProtocolError",
]

_PINGREQ = b"\xc0\x00"


# -- what a read brings (``receive_data``) ---------------------------------------------
# (plain slotted classes, not frozen: one Received per PUBLISH on the link, and a frozen
# dataclass costs about three times as much to make)


@dataclass(slots=True)
class Ready:
    """The listener proved the secret and ours is on its way: send the hello. ``rtt``: the
    SUBSCRIBE/SUBACK round trip, the link's first cost sample (seconds)."""

    rtt: float


@dataclass(slots=True)
class Refused:
    """The listener refused the CONNECT (its return code) or the SUBSCRIBE (0x80)."""

    code: int


@dataclass(slots=True)
class AuthFailed:
    """The listener did not prove the cluster secret for this connection."""

    reason: str


@dataclass(slots=True)
class Received:
    """A PUBLISH from the peer on our ``$mesh/to/<node>/`` subscription."""

    topic: str
    payload: bytes


@dataclass(slots=True)
class Rtt:
    """A PINGREQ/PINGRESP round trip (seconds)."""

    seconds: float


@dataclass(slots=True)
class ProtocolError:
    """The listener broke MQTT or the handshake's order: close."""

    reason: str


LinkEvent = Ready | Refused | AuthFailed | Received | Rtt | ProtocolError


class LinkClient:
    def __init__(
        self,
        node_id: str,
        incarnation: int,
        secret: bytes,
        keepalive: float,
        handshake_timeout: float,
        max_inflight: int = 100,
        max_queued: int = 100_000,
    ):
        self.node_id = node_id
        self.incarnation = incarnation
        self.secret = secret
        self.client_id = f"$mesh-{node_id}"
        self.subscribe_filter = f"$mesh/to/{node_id}/#"
        self._challenge_topic = f"$mesh/to/{node_id}/auth"
        self._proof_topic = f"$mesh/from/{node_id}/auth".encode()
        self.keepalive = keepalive  # seconds between PINGREQs; dead after 3 x this
        self.handshake_timeout = handshake_timeout
        # the outbound QoS 1 window, kept across connections (the listener keeps ours as a
        # CleanSession=0 session too); attached to this client while the link is ready
        limits = Limits(max_inflight=max_inflight, max_queued=max_queued, drop_policy="newest")
        self.session = Session(self.client_id, False, limits)
        self._out: list[bytes] = []
        self._reset()

    def _reset(self) -> None:
        self.state = "idle"
        self.session.detach()  # (QoS 1 waits in its queue until the link is ready again)
        self.decoder = Decoder()
        self._out = []
        self.last_rx = 0.0
        self._last_ping = 0.0
        self._ping_sent: float | None = None
        self._opened = 0.0
        self._subscribe_sent = 0.0
        self._handshake_rtt = 0.0
        self._auth: DiallerAuth | None = None
        self.session_present = False
        self.peer: str | None = None  # the listener's node id, once it proved the secret
        self.peer_incarnation: int | None = None

    # -- connection life -------------------------------------------------------------

    def connection_made(self, now: float, nonce: bytes) -> None:
        """A new connection; ``nonce``: NONCE_BYTES fresh random bytes, never used before."""
        self._reset()
        self.state = "connecting"
        self.last_rx = self._last_ping = self._opened = now
        self._auth = DiallerAuth(self.secret, self.node_id, self.incarnation, nonce)
        # CONNECT's keepalive is twice our ping interval, so the peer drops a dead
        # link after 1.5 x 2 = 3 ping intervals, as we do [MQTT-3.1.2-24]
        self._out.append(
            encode(
                Connect(
                    self.client_id,
                    clean_session=False,
                    keepalive=max(1, int(round(2 * self.keepalive))),
                    username=PEER_USERNAME,
                    password=self._auth.password(),
                )
            )
        )

    def connection_lost(self) -> None:
        self.state = "idle"
        self.session.detach()
        self._auth = None

    def receive_data(self, data: bytes, now: float) -> list[LinkEvent]:
        """What the read brought, in order (the event classes above).

        At ``Ready`` the listener's node id and incarnation are in ``peer`` and ``peer_incarnation``.
        """
        self.last_rx = now
        self.decoder.feed(data)
        events: list[LinkEvent] = []
        try:
            for pkt in self.decoder.packets():
                t = pkt.type
                if t == PUBLISH and self.state == "ready":
                    if pkt.qos:
                        self._out.append(encode(PubAck(pkt.packet_id)))
                    events.append(Received(pkt.topic, pkt.payload))
                elif t == PUBACK:
                    self.session.on_puback(pkt.packet_id, now)  # (an unknown id is ignored)
                elif t == PINGRESP:
                    if self._ping_sent is not None:
                        events.append(Rtt(now - self._ping_sent))
                        self._ping_sent = None
                elif t == CONNACK and self.state == "connecting":
                    if pkt.return_code != 0:
                        events.append(Refused(pkt.return_code))
                        self.state = "refused"
                        return events
                    self.session_present = pkt.session_present
                    self.state = "subscribing"
                    self._subscribe_sent = now
                    self._out.append(encode(Subscribe(1, [(self.subscribe_filter, 1)])))
                elif t == SUBACK and self.state == "subscribing":
                    if pkt.return_codes[0] == 0x80:
                        events.append(Refused(0x80))
                        self.state = "refused"
                        return events
                    self.state = "authenticating"
                    self._handshake_rtt = now - self._subscribe_sent
                elif t == PUBLISH and self.state == "authenticating":
                    failure = self._check_listener(pkt, now)
                    if failure:
                        events.append(AuthFailed(failure))
                        self.state = "refused"
                        return events
                    events.append(Ready(self._handshake_rtt))
                else:
                    events.append(ProtocolError(f"unexpected packet type {t} in state {self.state}"))
                    self.state = "refused"
                    return events
        except MalformedPacket as exc:
            events.append(ProtocolError(str(exc)))
            self.state = "refused"
        return events

    def _check_listener(self, pkt: Publish, now: float) -> str | None:
        """The listener's proof: on success our own goes out and the link is ready."""
        if pkt.topic != self._challenge_topic or pkt.qos or pkt.retain:
            return (
                f"expected the listener's proof (QoS 0 on {self._challenge_topic}), "
                f"got a QoS {pkt.qos} PUBLISH on {pkt.topic!r}"
            )
        try:
            hs = self._auth.check_listener(pkt.payload)  # type: ignore[union-attr]  # (this handshake's dialler half)
        except PeerAuthError as exc:
            return str(exc)
        self._out.append(encode_publish(self._proof_topic, self._auth.proof(hs)))  # type: ignore[union-attr]  # (this handshake's dialler half)
        self.peer, self.peer_incarnation = hs.listener, hs.listener_incarnation
        self._auth = None  # one proof per connection
        self.state = "ready"
        self.session.attach(_Ready(self), now)  # what is in flight again, DUP=1 [MQTT-4.4.0-1], then the queue
        return None

    # -- sending -------------------------------------------------------------------------

    def publish(self, topic: str, payload: bytes, qos: int) -> None:
        """A message for the listener, at QoS 0 or 1: it goes out while the link is ready; QoS 1
        waits in the session's queue otherwise, QoS 0 is lost."""
        self.session.deliver(Message(topic, payload, qos), qos)

    @property
    def queue(self) -> deque[Entry]:
        """QoS 1 messages waiting behind the window or for the link (flow control reads it)."""
        return self.session.queue

    @property
    def acked(self) -> int:
        """PUBACKs received, ever (progress, for flow control)."""
        return self.session.acked

    def data_to_send(self) -> bytes:
        out = self._out
        if not out:
            return b""
        self._out = []
        return b"".join(out)

    # -- time ---------------------------------------------------------------------------------

    def tick(self, now: float) -> str | None:
        """Send a PINGREQ when due; a reason string when the link is to be declared dead."""
        if self.state in ("idle", "refused"):
            return None
        if self.state != "ready" and now - self._opened > self.handshake_timeout:
            # a listener may answer and ping forever without proving the secret
            return f"peer handshake not finished within {self.handshake_timeout:g}s (state {self.state})"
        if now - self.last_rx > 3 * self.keepalive:
            return f"nothing received for {now - self.last_rx:.1f}s (3 x keepalive {self.keepalive:g}s)"
        # a PINGREQ every keepalive, busy or not, answered or not (we may have stopped
        # reading for flow control): it keeps the link alive and measures it
        if now - self._last_ping >= self.keepalive * 0.999:
            self._last_ping = now
            if self._ping_sent is None:
                self._ping_sent = now
            self._out.append(_PINGREQ)
        return None


class _Ready:
    """The session's connection (session.Attached) while the link is ready: the frames its
    window writes go out with the client's."""

    __slots__ = ("client",)

    peer = "link"  # (the log line of a takeover: a link's session is never taken over)
    blocked = False  # (QoS 0 goes past the session: nothing for it to drop)
    frame = staticmethod(Message.frame)  # (a link speaks 3.1.1)
    frame0 = staticmethod(Message.frame_qos0)

    def __init__(self, client: LinkClient):
        self.client = client

    def write(self, frame: bytes) -> None:
        self.client._out.append(frame)

    def write_gated(self, frame: bytes, ticket: int) -> None:
        self.client._out.append(frame)  # (a link's session is not replicated)

    def write_expiring(
        self, msg: Message, qos: int, packet_id: int | None, dup: bool, retain: bool, ticket: int = 0
    ) -> None:
        self.client._out.append(Message.frame(msg, qos, packet_id, dup, retain))  # (nothing waits here)

    def release_acks(self, committed: int, now: float) -> None:
        pass  # (nothing of a link's session waits for a store)

    def waits_for_gate(self, passed: int) -> bool:
        return False  # (nor for a gate)

    def kick(self, reason: str, now: float) -> None:
        pass  # (never taken over: the session is the link's own)

    def close(self, reason: str) -> None:
        pass  # (the link's end is its caller's: tick says when)
