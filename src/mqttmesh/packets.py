"""MQTT packets as values (3.1.1, and the fields MQTT 5.0 adds): packet types, the
fixed-header rules, the packet classes, and the checks of strings and topics (sections 1.5,
2, 3 and 4.7 of the standard).

Pure: no bytes are read or written here (codec.py does that). It leaves to its caller
everything but what a well-formed packet is.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "ACCEPTED",
    "BAD_PROTOCOL",
    "ID_REJECTED",
    "UNAVAILABLE",
    "BAD_CREDENTIALS",
    "NOT_AUTHORIZED",
    "CONNACK_REASONS",
    "CONNECT",
    "CONNACK",
    "PUBLISH",
    "PUBACK",
    "PUBREC",
    "PUBREL",
    "PUBCOMP",
    "SUBSCRIBE",
    "SUBACK",
    "UNSUBSCRIBE",
    "UNSUBACK",
    "PINGREQ",
    "PINGRESP",
    "DISCONNECT",
    "AUTH",
    "PACKET_NAMES",
    "MalformedPacket",
    "ProtocolError",
    "Props",
    "Auth",
    "Will",
    "Connect",
    "ConnAck",
    "Publish",
    "PubAck",
    "PubRec",
    "PubRel",
    "PubComp",
    "Subscribe",
    "SubAck",
    "Unsubscribe",
    "UnsubAck",
    "PingReq",
    "PingResp",
    "Disconnect",
    "validate_topic_name",
    "validate_topic_filter",
    "DEFAULT_MAX_PACKET_SIZE",
]

CONNECT, CONNACK, PUBLISH, PUBACK, PUBREC, PUBREL, PUBCOMP = 1, 2, 3, 4, 5, 6, 7
SUBSCRIBE, SUBACK, UNSUBSCRIBE, UNSUBACK, PINGREQ, PINGRESP, DISCONNECT = 8, 9, 10, 11, 12, 13, 14
AUTH = 15  # MQTT 5 only

# MQTT 5 properties by identifier (properties.py); a multi-valued one holds a list
Props = dict[int, Any]

PACKET_NAMES = {
    0: "Reserved(0)",
    CONNECT: "CONNECT",
    CONNACK: "CONNACK",
    PUBLISH: "PUBLISH",
    PUBACK: "PUBACK",
    PUBREC: "PUBREC",
    PUBREL: "PUBREL",
    PUBCOMP: "PUBCOMP",
    SUBSCRIBE: "SUBSCRIBE",
    SUBACK: "SUBACK",
    UNSUBSCRIBE: "UNSUBSCRIBE",
    UNSUBACK: "UNSUBACK",
    PINGREQ: "PINGREQ",
    PINGRESP: "PINGRESP",
    DISCONNECT: "DISCONNECT",
    15: "Reserved(15)",
}

# Table 2.2: the only flag nibble allowed for each type other than PUBLISH.
_REQUIRED_FLAGS = {
    CONNECT: 0,
    CONNACK: 0,
    PUBACK: 0,
    PUBREC: 0,
    PUBREL: 2,
    PUBCOMP: 0,
    SUBSCRIBE: 2,
    SUBACK: 0,
    UNSUBSCRIBE: 2,
    UNSUBACK: 0,
    PINGREQ: 0,
    PINGRESP: 0,
    DISCONNECT: 0,
}
_FLAG_RULES = {
    PUBREL: "MQTT-3.6.1-1",
    SUBSCRIBE: "MQTT-3.8.1-1",
    UNSUBSCRIBE: "MQTT-3.10.1-1",
    DISCONNECT: "MQTT-3.14.1-1",
}


def first_bytes_ok(required: dict[int, int]) -> bytes:
    """For each byte value, whether it can start a packet whose types and flag nibbles are
    ``required`` (PUBLISH's flags: any QoS but 3, DUP only with a QoS)."""

    def ok(first: int) -> bool:
        ptype, flags = first >> 4, first & 0x0F
        if ptype == PUBLISH:
            qos = (flags >> 1) & 0x03
            return qos != 3 and not (qos == 0 and flags & 0x08)
        return required.get(ptype) == flags

    return bytes(ok(b) for b in range(256))


# fixed-header first bytes that can start a valid packet, by value: checked as soon as the
# byte arrives, so a bad header is refused without waiting for the body it announces
_FIRST_OK = first_bytes_ok(_REQUIRED_FLAGS)


def first_byte_error(first: int) -> MalformedPacket:
    """Why ``first`` cannot start a packet (it is not in ``_FIRST_OK``)."""
    ptype, flags = first >> 4, first & 0x0F
    if ptype not in _REQUIRED_FLAGS and ptype != PUBLISH:
        return MalformedPacket("MQTT-2.2.2-1", f"reserved packet type {ptype}")
    if ptype == PUBLISH:
        if (flags >> 1) & 0x03 == 3:
            return MalformedPacket("MQTT-3.3.1-4", "PUBLISH with QoS 3")
        return MalformedPacket("MQTT-3.3.1-2", "DUP set on a QoS 0 PUBLISH")
    return MalformedPacket(
        _FLAG_RULES.get(ptype, "MQTT-2.2.2-2"), f"invalid flags 0x{flags:x} for {PACKET_NAMES[ptype]}"
    )


# the largest packet MQTT can express: 1 type byte + 4 length bytes + 268,435,455
DEFAULT_MAX_PACKET_SIZE = 1 + 4 + 268_435_455

# CONNACK return codes (table 3.1)
ACCEPTED, BAD_PROTOCOL, ID_REJECTED, UNAVAILABLE, BAD_CREDENTIALS, NOT_AUTHORIZED = range(6)
CONNACK_REASONS = {
    BAD_PROTOCOL: "unacceptable protocol level",
    ID_REJECTED: "identifier rejected",
    UNAVAILABLE: "server unavailable",
    BAD_CREDENTIALS: "bad user name or password",
    NOT_AUTHORIZED: "not authorized",
}


class MalformedPacket(Exception):
    """The bytes break a rule of MQTT; ``rule`` is the statement id (of 3.1.1 or of 5.0: the
    same id names different statements in the two), ``reason`` the MQTT 5 reason code a
    DISCONNECT or CONNACK gives for it (0x81 Malformed Packet unless the standard names
    another)."""

    reason = 0x81

    def __init__(self, rule: str, message: str, reason: int | None = None):
        super().__init__(f"[{rule}] {message}")
        self.rule = rule
        self.detail = message
        if reason is not None:
            self.reason = reason


class ProtocolError(MalformedPacket):
    """Well-formed bytes that MQTT 5.0 calls a Protocol Error (reason code 0x82): a property
    given twice, a value out of its range, a packet out of place. The connection closes as for
    a malformed packet (section 4.13)."""

    reason = 0x82


# --------------------------------------------------------------------------- packets


class Will:
    """``properties``: MQTT 5 Will Properties (properties.py), None for 3.1.1. ``seq``: the
    sequence number the will's message takes, reserved by the node that took the CONNECT
    (the Channel keeps the CONNECT's will ``numbered``; the codec's is 0): whichever node
    publishes it (that one, or the registrar that finds it gone) publishes the same message
    (node, seq), so the mesh delivers it once (mesh/cluster/registry.py). Not on the wire."""

    # (``seq`` costs a Will no memory, 80 bytes either way, and a Channel one slot: issue 26)
    __slots__ = ("topic", "payload", "qos", "retain", "properties", "seq")

    def __init__(
        self,
        topic: str,
        payload: bytes,
        qos: int = 0,
        retain: bool = False,
        properties: Props | None = None,
        seq: int = 0,
    ):
        self.topic, self.payload, self.qos, self.retain = topic, payload, qos, retain
        self.properties = properties
        self.seq = seq

    def numbered(self, seq: int) -> Will:
        """This will, its message to take the sequence number ``seq``."""
        return Will(self.topic, self.payload, self.qos, self.retain, self.properties, seq)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Will) and _fields(self) == _fields(other)

    def __repr__(self) -> str:
        props = f", properties={self.properties!r}" if self.properties is not None else ""
        return f"Will({self.topic!r}, {self.payload!r}, qos={self.qos}, retain={self.retain}{props})"


def _fields(obj: Any) -> tuple[Any, ...]:
    return tuple(getattr(obj, name) for name in _slots(type(obj)))


def _slots(cls: type) -> tuple[str, ...]:
    """Every slot of ``cls`` and its bases (a subclass's ``__slots__`` names only its own)."""
    names: list[str] = []
    for klass in reversed(cls.__mro__):
        names.extend(klass.__dict__.get("__slots__", ()))
    return tuple(names)


class _Packet:
    __slots__ = ()
    type = 0

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other) and _fields(self) == _fields(other)

    def __repr__(self) -> str:
        names = _slots(type(self))
        args = ", ".join(f"{n}={getattr(self, n)!r}" for n in names)
        return f"{type(self).__name__}({args})"


class Connect(_Packet):
    __slots__ = (
        "client_id",
        "clean_session",
        "keepalive",
        "will",
        "username",
        "password",
        "protocol_name",
        "protocol_level",
        "properties",
    )
    type = CONNECT

    def __init__(
        self,
        client_id: str = "",
        clean_session: bool = True,
        keepalive: int = 60,
        will: Will | None = None,
        username: str | None = None,
        password: bytes | None = None,
        protocol_name: str = "MQTT",
        protocol_level: int = 4,
        properties: Props | None = None,
    ):
        # (in MQTT 5 ``clean_session`` is the Clean Start flag)
        self.client_id, self.clean_session, self.keepalive = client_id, clean_session, keepalive
        self.will, self.username, self.password = will, username, password
        self.protocol_name, self.protocol_level = protocol_name, protocol_level
        self.properties = properties


class ConnAck(_Packet):
    """``return_code``: the 3.1.1 return code, or the MQTT 5 reason code."""

    __slots__ = ("session_present", "return_code", "properties")
    type = CONNACK

    def __init__(self, session_present: bool = False, return_code: int = 0, properties: Props | None = None):
        self.session_present, self.return_code = session_present, return_code
        self.properties = properties


class Publish(_Packet):
    """``properties``: MQTT 5 properties (properties.py), None for 3.1.1; the topic is "" when
    an MQTT 5 client sends only a Topic Alias."""

    __slots__ = ("topic", "payload", "qos", "retain", "dup", "packet_id", "properties")
    type = PUBLISH

    def __init__(
        self,
        topic: str,
        payload: bytes = b"",
        qos: int = 0,
        retain: bool = False,
        dup: bool = False,
        packet_id: int | None = None,
        properties: Props | None = None,
    ):
        self.topic, self.payload, self.qos = topic, payload, qos
        self.retain, self.dup, self.packet_id = retain, dup, packet_id
        self.properties = properties


class _IdOnly(_Packet):
    """PUBACK, PUBREC, PUBREL, PUBCOMP; MQTT 5 adds a reason code and properties."""

    __slots__ = ("packet_id", "reason_code", "properties")

    def __init__(self, packet_id: int, reason_code: int = 0, properties: Props | None = None):
        self.packet_id, self.reason_code, self.properties = packet_id, reason_code, properties


class PubAck(_IdOnly):
    __slots__ = ()
    type = PUBACK


class PubRec(_IdOnly):
    __slots__ = ()
    type = PUBREC


class PubRel(_IdOnly):
    __slots__ = ()
    type = PUBREL


class PubComp(_IdOnly):
    __slots__ = ()
    type = PUBCOMP


class UnsubAck(_Packet):
    """``reason_codes``: MQTT 5's, one per topic filter (3.1.1 has none: an empty list)."""

    __slots__ = ("packet_id", "reason_codes", "properties")
    type = UNSUBACK

    def __init__(self, packet_id: int, reason_codes: list[int] | None = None, properties: Props | None = None):
        self.packet_id, self.properties = packet_id, properties
        self.reason_codes = reason_codes if reason_codes is not None else []


class Subscribe(_Packet):
    """``topics``: (filter, options byte); in 3.1.1 the byte is the QoS, in MQTT 5 it also
    holds No Local (bit 2), Retain As Published (bit 3) and Retain Handling (bits 4-5)."""

    __slots__ = ("packet_id", "topics", "properties")
    type = SUBSCRIBE

    def __init__(self, packet_id: int, topics: list[tuple[str, int]], properties: Props | None = None):
        self.packet_id, self.topics, self.properties = packet_id, topics, properties


class SubAck(_Packet):
    __slots__ = ("packet_id", "return_codes", "properties")
    type = SUBACK

    def __init__(self, packet_id: int, return_codes: list[int], properties: Props | None = None):
        self.packet_id, self.return_codes, self.properties = packet_id, return_codes, properties


class Unsubscribe(_Packet):
    __slots__ = ("packet_id", "filters", "properties")
    type = UNSUBSCRIBE

    def __init__(self, packet_id: int, filters: list[str], properties: Props | None = None):
        self.packet_id, self.filters, self.properties = packet_id, filters, properties


class _Empty(_Packet):
    __slots__ = ()


class PingReq(_Empty):
    __slots__ = ()
    type = PINGREQ


class PingResp(_Empty):
    __slots__ = ()
    type = PINGRESP


class Disconnect(_Packet):
    """MQTT 5 adds a reason code (0x00 Normal disconnection when absent) and properties."""

    __slots__ = ("reason_code", "properties")
    type = DISCONNECT

    def __init__(self, reason_code: int = 0, properties: Props | None = None):
        self.reason_code, self.properties = reason_code, properties


class Auth(_Packet):
    """MQTT 5's AUTH (type 15; reserved in 3.1.1)."""

    __slots__ = ("reason_code", "properties")
    type = AUTH

    def __init__(self, reason_code: int = 0, properties: Props | None = None):
        self.reason_code, self.properties = reason_code, properties


# --------------------------------------------------------------------------- strings and topics


def _decode_utf8(raw: bytes | bytearray | memoryview, what: str) -> str:
    try:
        text = bytes(raw).decode("utf-8")  # strict: rejects surrogates and overlong forms
    except UnicodeDecodeError as exc:
        raise MalformedPacket("MQTT-1.5.3-1", f"{what} is not well-formed UTF-8 ({exc.reason})") from None
    if "\x00" in text:
        raise MalformedPacket("MQTT-1.5.3-2", f"{what} contains U+0000")
    return text


def validate_topic_name(topic: str) -> None:
    """Raise MalformedPacket unless ``topic`` may appear in a PUBLISH."""
    if not topic:
        raise MalformedPacket("MQTT-4.7.3-1", "topic name is empty")
    if "+" in topic or "#" in topic:
        raise MalformedPacket("MQTT-3.3.2-2", f"wildcard in topic name {topic!r}")


def validate_topic_filter(topic_filter: str) -> None:
    """Raise MalformedPacket unless ``topic_filter`` is a valid 3.1.1 filter (section 4.7)."""
    if not topic_filter:
        raise MalformedPacket("MQTT-4.7.3-1", "topic filter is empty")
    if "+" not in topic_filter:
        hashes = topic_filter.count("#")
        if not hashes or (hashes == 1 and (topic_filter == "#" or topic_filter.endswith("/#"))):
            return  # (no wildcard, or one '#' that is a whole last level: most filters)
    levels = topic_filter.split("/")
    last = len(levels) - 1
    for i, level in enumerate(levels):
        if "#" in level:
            if level != "#" or i != last:
                raise MalformedPacket("MQTT-4.7.1-2", f"misplaced '#' in filter {topic_filter!r}")
        elif "+" in level and level != "+":
            raise MalformedPacket("MQTT-4.7.1-3", f"'+' must fill a whole level in {topic_filter!r}")
