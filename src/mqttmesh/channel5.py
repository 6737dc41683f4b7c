"""What an MQTT 5 client's connection does beyond a 3.1.1 one, as part of the Channel.

Pure. The Channel decodes an MQTT 5 client's packets with codec5.py (the decoder turns to it
at a CONNECT of level 5) and answers through these steps: what the CONNECT asked for and the
CONNACK grants (``Conn5``), the PUBLISH frames in MQTT 5's form with the message's
properties, the matching subscriptions' identifiers and topic aliases (``Conn5.frame``), a
PUBLISH in with its topic alias resolved and its properties kept (``_on_publish5``),
SUBSCRIBE with its options and UNSUBSCRIBE with reason codes, DISCONNECT with its reason
both ways. Everything else (sessions, routing, the store, the mesh) is shared with 3.1.1:
a message's properties travel with it (message.Message.props), a subscription's options
in its value (session.SUB_QOS).

Session Expiry Interval: 0 ends the session with the connection, as CleanSession=1 does;
0xFFFFFFFF keeps it, as CleanSession=0 does; any other value ends it that many seconds after
the connection (session.Session.expiry, SessionTable.close_session; in a mesh its copies
carry the remaining time, docs/design.md 3.7).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from . import codec
from . import properties as P
from .channel_held import ProtocolViolation
from .codec5 import REASON_NAMES, PublishProps, encode5, encode_publish5
from .fields import varint
from .packets import ACCEPTED, BAD_CREDENTIALS, BAD_PROTOCOL, ID_REJECTED, NOT_AUTHORIZED, UNAVAILABLE, ProtocolError
from .session import NO_LOCAL, RETAIN_AS_PUBLISHED, SUB_ID_SHIFT, SUB_QOS
from .shared import SHARE_PREFIX, ShareError, split_share
from .topics import filter_matches

if TYPE_CHECKING:
    from .broker import Broker
    from .message import Message
    from .ports import Batch
    from .session import Frame0Fn, FrameFn, Session

__all__ = ["Conn5", "Mqtt5", "CONNACK_CODES"]

# the 3.1.1 refusals the Channel decides on, as MQTT 5 reason codes
CONNACK_CODES = {
    ACCEPTED: 0x00,
    BAD_PROTOCOL: 0x84,  # Unsupported Protocol Version
    ID_REJECTED: 0x85,  # Client Identifier not valid
    UNAVAILABLE: 0x88,  # Server unavailable
    BAD_CREDENTIALS: 0x86,  # Bad User Name or Password
    NOT_AUTHORIZED: 0x87,  # Not authorized
}

# the Session Expiry Interval of a session that does not expire

# shared subscriptions are issue 24's: until then, a filter in their form is refused with
# 0x9E and CONNACK says they are not available

# the largest MQTT packet (1 type byte + 4 length bytes + 268,435,455)
_MAX_PACKET = 268_435_460

_NO_MATCH: tuple[list[int], bool] = ([], False)
_LENGTH1 = [bytes((n,)) for n in range(128)]
_MATCHES_KEPT = 1024  # topics a connection remembers the matching subscriptions of


class Conn5:
    """What one MQTT 5 connection agreed on, and its topic aliases both ways. ``frame`` and
    ``frame0`` build its PUBLISH frames (session.Attached)."""

    __slots__ = (
        "channel",
        "session_expiry",
        "asked_expiry",
        "receive_maximum",
        "max_packet",
        "alias_max_out",
        "aliases_out",
        "alias_max_in",
        "aliases_in",
        "response_info",
        "assigned",
        "server_keepalive",
        "_matches",
        "_matches_at",
    )

    def __init__(self, channel: Any, props: P.Props, alias_max_in: int):
        self.channel = channel
        self.session_expiry: int = props.get(P.SESSION_EXPIRY, 0)
        self.asked_expiry = self.session_expiry  # (CONNACK tells the client when they differ)
        self.receive_maximum: int = props.get(P.RECEIVE_MAXIMUM, 65535)
        self.max_packet: int = props.get(P.MAXIMUM_PACKET_SIZE, _MAX_PACKET)
        self.alias_max_out: int = props.get(P.TOPIC_ALIAS_MAXIMUM, 0)
        self.aliases_out: dict[str, int] = {}  # topic -> alias we set [MQTT-3.3.2-11]
        self.alias_max_in = alias_max_in
        self.aliases_in: dict[int, str] = {}  # alias -> topic the client set (this connection only [MQTT-3.3.2-7])
        self.response_info: bool = props.get(P.REQUEST_RESPONSE_INFO, 0) == 1
        self.assigned: str | None = None  # the ClientId we made for it [MQTT-3.1.3-7]
        self.server_keepalive: int | None = None
        # topic -> (identifiers, retain as published) of the session's subscriptions matching
        # it, as of the session's ``sub_changes`` in ``_matches_at`` (None: none has options)
        self._matches: dict[str, tuple[list[int], bool]] | None = None
        self._matches_at = -1

    # -- PUBLISH frames to the client ----------------------------------------------------

    def _matching(self, topic: str) -> tuple[list[int], bool]:
        """The identifiers of the session's subscriptions matching ``topic``, and whether one
        of them keeps the RETAIN flag as published (remembered per topic until the session's
        subscriptions change)."""
        session = self.channel.session
        if session is None:
            return _NO_MATCH
        matches = self._matches
        if self._matches_at != session.sub_changes:
            self._matches_at = session.sub_changes
            special = any(value > SUB_QOS for value in session.subscriptions.values())
            matches = self._matches = {} if special else None
        if matches is None:
            return _NO_MATCH  # (no subscription of the session has an option)
        hit = matches.get(topic)
        if hit is not None:
            return hit
        if len(matches) >= _MATCHES_KEPT:
            matches.clear()
        hit = matches[topic] = self._match(session, topic)
        return hit

    @staticmethod
    def _match(session: Session, topic: str) -> tuple[list[int], bool]:
        ids: list[int] = []
        keep = False
        for topic_filter, value in session.subscriptions.items():
            if value > SUB_QOS and filter_matches(_served(topic_filter), topic):
                sid = value >> SUB_ID_SHIFT
                if sid:
                    ids.append(sid)  # [MQTT-3.3.4-3] [MQTT-3.3.4-4]
                if value & RETAIN_AS_PUBLISHED:
                    keep = True
        return ids, keep

    def size(self, msg: Message, qos: int) -> int:
        """The bytes of ``msg``'s frame to this client, without a topic alias."""
        ids, _ = self._matching(msg.topic)
        props = len(msg.props or b"") + sum(1 + len(varint(i)) for i in ids) + (5 if msg.expires is not None else 0)
        body = 2 + len(msg.topic_bytes) + (2 if qos else 0) + len(varint(props)) + props + len(msg.payload)
        return 1 + len(varint(body)) + body

    def frame(self, msg: Message, qos: int, packet_id: int | None, dup: bool = False, retain: bool = False) -> bytes:
        """``msg`` as an MQTT 5 PUBLISH to this client: its properties unaltered and in order,
        the identifiers of the subscriptions it matches, a topic alias when the client takes
        them; RETAIN as published for a subscription that asked for it [MQTT-3.3.1-12]."""
        ids, keep = self._matching(msg.topic)
        if keep and msg.retain:
            retain = True
        topic = msg.topic_bytes
        props = msg.props or b""
        if msg.expires is not None:  # what is left of it [MQTT-3.3.2-6]
            props = _expiry_field(msg.ttl) + props
        if self.alias_max_out:
            aliases = self.aliases_out
            alias = aliases.get(msg.topic)
            if alias is not None:
                props = b"\x23" + alias.to_bytes(2, "big") + props
                topic = b""
            elif len(aliases) < self.alias_max_out and len(topic) > 3:
                alias = len(aliases) + 1  # (the first use carries the topic and sets it)
                aliases[msg.topic] = alias
                props = b"\x23" + alias.to_bytes(2, "big") + props
        if ids:
            props += b"".join(b"\x0b" + varint(i) for i in ids)
        n = len(props)
        field = (_LENGTH1[n] if n < 128 else varint(n)) + props
        return encode_publish5(topic, msg.payload, qos, retain, dup, packet_id, field)

    def frame0(self, msg: Message) -> bytes:
        return self.frame(msg, 0, None)


def _expiry_field(ttl: float) -> bytes:
    """The Message Expiry Interval of a message with ``ttl`` seconds left: whole seconds,
    rounded up (a message with 0.3 s left is not sent as one that expires at once)."""
    left = math.ceil(ttl) if ttl > 0.0 else 0
    return b"\x02" + min(left, 0xFFFFFFFF).to_bytes(4, "big")


class Mqtt5:
    """The MQTT 5 handlers of a Channel (a mixin: the Channel keeps the state)."""

    __slots__ = ()

    if TYPE_CHECKING:  # what they use of the Channel
        broker: Broker
        session: Session | None
        v5: Conn5 | None
        client_id: str
        username: str | None
        will: codec.Will | None
        clean_disconnect: bool
        close_reason: str | None
        decoder: codec.Decoder
        frame: FrameFn
        frame0: Frame0Fn

        def write(self, frame: bytes) -> None: ...

        def close(self, reason: str, now: float | None = None) -> None: ...

        def _send_after(self, frame: bytes, batch: Batch, ticket: int = 0) -> None: ...

        def _on_publish(
            self, pkt: codec.Publish, now: float, props: bytes | None = None, expiry: int | None = None
        ) -> None: ...

        def _end(self, publish_will: bool, now: float | None = None) -> None: ...

    # -- CONNECT, CONNACK ---------------------------------------------------------------------

    def _connect5(self, pkt: codec.Connect) -> int | None:
        """Read what an MQTT 5 CONNECT asks for; a CONNACK reason code when it is refused."""
        settings = self.broker.settings
        props = pkt.properties or {}
        conn = self.v5 = Conn5(self, props, settings.topic_alias_maximum)  # type: ignore[misc]  # (the Channel's slot)
        if P.AUTH_METHOD in props:
            return 0x8C  # no enhanced authentication method is served (4.12)
        if settings.max_session_expiry and conn.session_expiry > settings.max_session_expiry:
            conn.session_expiry = settings.max_session_expiry  # (CONNACK says it: 3.2.2.3.2)
        if settings.max_keepalive and (pkt.keepalive == 0 or pkt.keepalive > settings.max_keepalive):
            conn.server_keepalive = settings.max_keepalive  # [MQTT-3.2.2-21]
            pkt.keepalive = settings.max_keepalive
        # the client must not receive packets larger than it takes: our answers are small
        return None

    def connack5(self, present: bool) -> bytes:
        """CONNACK 0x00 with what this node holds the client to."""
        conn: Conn5 = self.v5  # type: ignore[assignment]
        settings = self.broker.settings
        props: P.Props = {
            P.RECEIVE_MAXIMUM: settings.receive_maximum,
            P.MAXIMUM_PACKET_SIZE: settings.max_packet_size,
            P.TOPIC_ALIAS_MAXIMUM: settings.topic_alias_maximum,
            P.SHARED_SUB_AVAILABLE: 1 if shared_for(self.broker, conn.session_expiry == 0) else 0,
        }
        if settings.topic_alias_maximum == 0:
            del props[P.TOPIC_ALIAS_MAXIMUM]
        if settings.max_qos < 2:
            props[P.MAXIMUM_QOS] = settings.max_qos
        if not settings.retain_available:
            props[P.RETAIN_AVAILABLE] = 0
        if conn.session_expiry != conn.asked_expiry:  # (what is served, when it differs)
            props[P.SESSION_EXPIRY] = conn.session_expiry
        if conn.assigned is not None:
            props[P.ASSIGNED_CLIENT_ID] = conn.assigned  # [MQTT-3.1.3-7]
        if conn.server_keepalive is not None:
            props[P.SERVER_KEEP_ALIVE] = conn.server_keepalive
        if conn.response_info and settings.response_information:
            # (4.10: where the client may have responses sent; the ACL still decides)
            props[P.RESPONSE_INFO] = settings.response_information.replace("{client_id}", self.client_id)
        return encode5(codec.ConnAck(present, 0, props))

    def attach5(self, session: Session) -> None:
        """The session is this client's from now on: its frames in MQTT 5's form, its window
        within the client's Receive Maximum, and the deliveries the client must not get
        filtered out before they take a packet id."""
        conn: Conn5 = self.v5  # type: ignore[assignment]
        self.frame = conn.frame  # (a slot of the Channel)
        self.frame0 = conn.frame0
        session.adapt(conn.receive_maximum, _filtered(session, conn, self.broker))

    def _refuse5(self, rc: int, detail: str) -> None:
        """A refusal's CONNACK in MQTT 5's form, then the close [MQTT-3.2.2-6] [MQTT-3.2.2-7];
        ``rc`` a 3.1.1 return code or a reason code."""
        code = CONNACK_CODES.get(rc, rc)
        self.write(encode5(codec.ConnAck(False, code)))
        self.close(f"CONNACK 0x{code:02x} ({REASON_NAMES.get(code, '?')}): {detail}")

    # -- PUBLISH from the client ---------------------------------------------------------------

    def _on_publish5(self, pkt: codec.Publish, now: float) -> None:
        props = pkt.properties
        if props is not None:
            conn: Conn5 = self.v5  # type: ignore[assignment]
            if P.SUBSCRIPTION_ID in props:
                raise ProtocolError("MQTT-3.3.4-6", "a PUBLISH from a client with a Subscription Identifier")
            alias = props.get(P.TOPIC_ALIAS)
            if alias is not None:
                if alias > conn.alias_max_in:
                    raise ProtocolError(
                        "MQTT-3.3.2-12", f"Topic Alias {alias} over the maximum {conn.alias_max_in}", 0x94
                    )
                if pkt.topic:
                    conn.aliases_in[alias] = pkt.topic
                else:
                    topic = conn.aliases_in.get(alias)
                    if topic is None:
                        raise ProtocolError("MQTT-3.3.2-12", f"Topic Alias {alias} was never set on this connection")
                    pkt.topic = topic
        if pkt.qos == 2 and self.session is not None:
            if len(self.session.awaiting_rel) >= self.broker.settings.receive_maximum:
                if pkt.packet_id not in self.session.awaiting_rel:
                    raise ProtocolError("MQTT-3.3.4-7", "more QoS 2 messages than the Receive Maximum", 0x93)
        if props is None:
            return self._on_publish(pkt, now)
        if type(props) is PublishProps:
            self._on_publish(pkt, now, props.forwarded, props.expiry)
        else:
            self._on_publish(pkt, now, P.forwarded(props), props.get(P.MESSAGE_EXPIRY))

    # -- SUBSCRIBE, UNSUBSCRIBE --------------------------------------------------------------

    def _on_subscribe5(self, pkt: codec.Subscribe, now: float) -> None:
        broker = self.broker
        session: Session = self.session  # type: ignore[assignment]  # (CONNECTED: it has one)
        journal = broker.journal
        mark = journal.mark()
        sid = (pkt.properties or {}).get(P.SUBSCRIPTION_ID, [0])[0]
        codes = []
        retained = []
        for topic_filter, options in pkt.topics:  # as a sequence of SUBSCRIBEs
            refused = refusal(broker, self.username, self.client_id, topic_filter, session.clean)
            if refused:
                codes.append(refused)
                continue
            shared = topic_filter.startswith(SHARE_PREFIX)
            if shared and options & NO_LOCAL:
                raise ProtocolError("MQTT-3.8.3-4", f"No Local on the shared subscription {topic_filter!r}")
            granted = min(options & SUB_QOS, broker.settings.max_qos)  # [MQTT-3.2.2-10] (5.0)
            existed = topic_filter in session.subscriptions
            value = granted | (options & 0x3C) | (sid << SUB_ID_SHIFT)
            broker.table.subscribe(session, topic_filter, value)  # replaces it [MQTT-3.8.4-3]
            codes.append(granted)
            handling = (options >> 4) & 0x03
            if shared:
                continue  # no retained messages on a shared subscription (4.8.2)
            if handling == 0 or (handling == 1 and not existed):  # [MQTT-3.3.1-9] [MQTT-3.3.1-10] [MQTT-3.3.1-11]
                retained.append((topic_filter, granted))
        self._send_after(encode5(codec.SubAck(pkt.packet_id, codes)), journal.since(mark))
        for topic_filter, granted in retained:
            broker.send_retained(session, topic_filter, granted, now)

    def _on_unsubscribe5(self, pkt: codec.Unsubscribe, now: float) -> None:
        broker = self.broker
        journal = broker.journal
        mark = journal.mark()
        session: Session = self.session  # type: ignore[assignment]
        codes = [0x00 if broker.table.unsubscribe(session, f, now) else 0x11 for f in pkt.filters]  # [MQTT-3.11.3-2]
        self._send_after(encode5(codec.UnsubAck(pkt.packet_id, codes)), journal.since(mark))

    # -- DISCONNECT, AUTH -------------------------------------------------------------------

    def _on_disconnect5(self, pkt: codec.Disconnect, now: float) -> None:
        conn: Conn5 = self.v5  # type: ignore[assignment]
        expiry = (pkt.properties or {}).get(P.SESSION_EXPIRY)
        if expiry is not None and conn.session_expiry == 0 and expiry != 0:
            raise ProtocolError("MQTT-3.14.2-2", "DISCONNECT sets a Session Expiry Interval the CONNECT had as 0")
        session = self.session
        if expiry is not None and session is not None:
            cap = self.broker.settings.max_session_expiry
            if cap and expiry > cap:
                expiry = cap
            conn.session_expiry = expiry  # (the session ends that long after this connection)
            session.expiry = expiry
            if expiry == 0:
                session.clean = True
        if pkt.reason_code != 0x04:
            self.will = None  # type: ignore[misc]  # [MQTT-3.14.4-3]: 0x04 asks for the will, anything else drops it
        self.clean_disconnect = pkt.reason_code != 0x04  # type: ignore[misc]
        name = REASON_NAMES.get(pkt.reason_code, "?")
        self.close_reason = f"client sent DISCONNECT 0x{pkt.reason_code:02x} ({name})"  # type: ignore[misc]
        self._end(publish_will=pkt.reason_code == 0x04, now=now)
        self.owner.close(self, self.close_reason)  # type: ignore[attr-defined]  # (the Channel's)

    def _on_auth5(self, pkt: codec.Auth, now: float) -> None:
        # no authentication method was agreed at CONNECT (4.12): an AUTH is out of place
        raise ProtocolError("MQTT-4.12.0-1", "AUTH without an authentication method agreed at CONNECT")

    def disconnect5(self, reason: int) -> None:
        """Tell an MQTT 5 client why the server closes its connection (4.13)."""
        self.write(encode5(codec.Disconnect(reason)))


def _filtered(session: Session, conn: Conn5, broker: Broker) -> Any:
    """``session.deliver`` for an MQTT 5 client: not its own messages on a No Local
    subscription [MQTT-3.8.3-3], nothing larger than its Maximum Packet Size."""
    deliver = type(session).deliver
    client_id = session.client_id
    limited = conn.max_packet < _MAX_PACKET
    stats = broker.stats

    def filtered(msg: Message, qos: int, retain: bool = False) -> None:
        if msg.publisher == client_id and not retain and _local_refused(session, msg.topic):
            return
        if limited and conn.size(msg, qos) > conn.max_packet:
            stats.too_large += 1  # not sent, counted [MQTT-3.1.2-25] (5.0)
            return
        deliver(session, msg, qos, retain)

    return filtered


def _local_refused(session: Session, topic: str) -> bool:
    """Every subscription of ``session`` matching ``topic`` has No Local (one of its shared
    groups, which has none [MQTT-3.8.3-4], delivers apart: ``Session.sharing``)."""
    if session.sharing is not None:
        return False
    for topic_filter, value in session.subscriptions.items():
        if not value & NO_LOCAL and not topic_filter.startswith(SHARE_PREFIX) and filter_matches(topic_filter, topic):
            return False
    return True


def _served(topic_filter: str) -> str:
    """The filter a subscription matches topics with: a shared one's, after its share name."""
    if topic_filter.startswith(SHARE_PREFIX):
        try:
            share = split_share(topic_filter)
        except ShareError:
            return topic_filter
        if share is not None:
            return share[1]
    return topic_filter


def shared_for(broker: Broker, clean: bool) -> bool:
    """Does this node take shared subscriptions from a session that ends with its connection
    (``clean``), or from a persistent one? (In a mesh, only the first, for now.)"""
    return broker.shared_available and (clean or broker.shared_persistent)


def refusal(broker: Broker, username: str | None, client_id: str, topic_filter: str, clean: bool = True) -> int:
    """0 when the client may subscribe to ``topic_filter``, else why not, as an MQTT 5 SUBACK
    reason code (a 3.1.1 client gets 0x80 for any): 0x9E where shared subscriptions are not
    taken (for a session like the client's, ``clean``: one that ends with its connection),
    0x8F for a ``$share/`` filter that is none [MQTT-4.8.2-1] [MQTT-4.8.2-2], the operator's
    denied code for ``$mesh`` and what the ACL refuses (for a shared subscription, its
    filter after the share name)."""
    served = topic_filter
    if topic_filter.startswith(SHARE_PREFIX):
        if not shared_for(broker, clean):
            return 0x9E
        try:
            share = split_share(topic_filter)
        except ShareError:
            return 0x8F
        served = share[1] if share is not None else topic_filter
    if served.startswith("$mesh") or not broker.auth.can_subscribe(username, client_id, served):
        return broker.settings.subscribe_denied_code
    return 0


def reason_of(exc: Exception) -> int:
    """The DISCONNECT reason code for a protocol error the Channel caught."""
    if isinstance(exc, codec.MalformedPacket):
        return exc.reason
    if isinstance(exc, ProtocolViolation):
        return 0x82
    return 0x80
