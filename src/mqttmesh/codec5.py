"""MQTT 5.0 packet bodies: bytes in, packets out; packets in, bytes out.

Pure. The packets are those of packets.py with their MQTT 5 fields (reason codes and
properties, properties.py); the fixed header, the remaining length and the choice of version
are codec.py's (its Decoder switches to these once a CONNECT of protocol level 5 is read).
It leaves to its caller every rule that needs session state: topic aliases, receive maximum,
what a reason code means for a session.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .fields import U16, Reader, binary, utf8, varint
from .packets import (
    _REQUIRED_FLAGS,
    AUTH,
    CONNACK,
    CONNECT,
    DISCONNECT,
    PINGREQ,
    PINGRESP,
    PUBACK,
    PUBCOMP,
    PUBLISH,
    PUBREC,
    PUBREL,
    SUBACK,
    SUBSCRIBE,
    UNSUBACK,
    UNSUBSCRIBE,
    Auth,
    ConnAck,
    Connect,
    Disconnect,
    MalformedPacket,
    PingReq,
    PingResp,
    Props,
    ProtocolError,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
    SubAck,
    Subscribe,
    UnsubAck,
    Unsubscribe,
    Will,
    _decode_utf8,
    _Packet,
    first_bytes_ok,
    validate_topic_filter,
)
from .properties import (
    MESSAGE_EXPIRY,
    SUBSCRIPTION_ID,
    TOPIC_ALIAS,
    WILL,
    encode_properties,
    forwarded,
    read_properties,
)

__all__ = [
    "REASON_CODES",
    "REASON_NAMES",
    "DECODERS",
    "FIRST_OK",
    "decode_connect",
    "encode5",
    "encode_publish5",
    "decode_publish_fast",
    "PublishProps",
]

# the subscription option bits after QoS, No Local and Retain As Published (section
# 3.8.3.1; session.py names those, as a subscription's value keeps them)
RETAIN_HANDLING_SHIFT = 4

# Table 2-6, by packet: the reason codes each may carry
_PUB = (0x00, 0x10, 0x80, 0x83, 0x87, 0x90, 0x91, 0x97, 0x99)
REASON_CODES: dict[int, frozenset[int]] = {
    CONNACK: frozenset(
        (0x00, 0x80, 0x81, 0x82, 0x83, 0x84, 0x85, 0x86, 0x87, 0x88, 0x89, 0x8A, 0x8C, 0x90, 0x95, 0x97, 0x99)
        + (0x9A, 0x9B, 0x9C, 0x9D, 0x9F)
    ),
    PUBACK: frozenset(_PUB),
    PUBREC: frozenset(_PUB),
    PUBREL: frozenset((0x00, 0x92)),
    PUBCOMP: frozenset((0x00, 0x92)),
    SUBACK: frozenset((0x00, 0x01, 0x02, 0x80, 0x83, 0x87, 0x8F, 0x91, 0x97, 0x9E, 0xA1, 0xA2)),
    UNSUBACK: frozenset((0x00, 0x11, 0x80, 0x83, 0x87, 0x8F, 0x91)),
    DISCONNECT: frozenset(
        (0x00, 0x04, 0x80, 0x81, 0x82, 0x83, 0x87, 0x89, 0x8B, 0x8C, 0x8D, 0x8E, 0x8F, 0x90, 0x93, 0x94, 0x95)
        + (0x96, 0x97, 0x98, 0x99, 0x9A, 0x9B, 0x9C, 0x9D, 0x9E, 0x9F, 0xA0, 0xA1, 0xA2)
    ),
    AUTH: frozenset((0x00, 0x18, 0x19)),
}

REASON_NAMES = {
    0x00: "Success",
    0x01: "Granted QoS 1",
    0x02: "Granted QoS 2",
    0x04: "Disconnect with Will Message",
    0x10: "No matching subscribers",
    0x11: "No subscription existed",
    0x18: "Continue authentication",
    0x19: "Re-authenticate",
    0x80: "Unspecified error",
    0x81: "Malformed Packet",
    0x82: "Protocol Error",
    0x83: "Implementation specific error",
    0x84: "Unsupported Protocol Version",
    0x85: "Client Identifier not valid",
    0x86: "Bad User Name or Password",
    0x87: "Not authorized",
    0x88: "Server unavailable",
    0x89: "Server busy",
    0x8A: "Banned",
    0x8B: "Server shutting down",
    0x8C: "Bad authentication method",
    0x8D: "Keep Alive timeout",
    0x8E: "Session taken over",
    0x8F: "Topic Filter invalid",
    0x90: "Topic Name invalid",
    0x91: "Packet Identifier in use",
    0x92: "Packet Identifier not found",
    0x93: "Receive Maximum exceeded",
    0x94: "Topic Alias invalid",
    0x95: "Packet too large",
    0x96: "Message rate too high",
    0x97: "Quota exceeded",
    0x98: "Administrative action",
    0x99: "Payload format invalid",
    0x9A: "Retain not supported",
    0x9B: "QoS not supported",
    0x9C: "Use another server",
    0x9D: "Server moved",
    0x9E: "Shared Subscriptions not supported",
    0x9F: "Connection rate exceeded",
    0xA0: "Maximum connect time",
    0xA1: "Subscription Identifiers not supported",
    0xA2: "Wildcard Subscriptions not supported",
}

_NAMES = {
    CONNACK: "CONNACK",
    PUBACK: "PUBACK",
    PUBREC: "PUBREC",
    PUBREL: "PUBREL",
    PUBCOMP: "PUBCOMP",
    SUBACK: "SUBACK",
    UNSUBACK: "UNSUBACK",
    DISCONNECT: "DISCONNECT",
    AUTH: "AUTH",
}

# Table 2.2 of 5.0: 3.1.1's flag nibbles, and AUTH's 0 [MQTT-3.15.1-1]
REQUIRED_FLAGS = {**_REQUIRED_FLAGS, AUTH: 0}
FLAG_RULES = {
    PUBREL: "MQTT-2.1.3-1",
    SUBSCRIBE: "MQTT-3.8.1-1",
    UNSUBSCRIBE: "MQTT-3.10.1-1",
    DISCONNECT: "MQTT-3.14.1-1",
    AUTH: "MQTT-3.15.1-1",
}
FIRST_OK = first_bytes_ok(REQUIRED_FLAGS)


def first_byte_error(first: int) -> MalformedPacket:
    ptype, flags = first >> 4, first & 0x0F
    if ptype == 0:
        return MalformedPacket("MQTT-2.1.3-1", "reserved packet type 0")
    if ptype == PUBLISH:
        if (flags >> 1) & 0x03 == 3:
            return MalformedPacket("MQTT-3.3.1-4", "PUBLISH with QoS 3")
        return MalformedPacket("MQTT-3.3.1-2", "DUP set on a QoS 0 PUBLISH")
    return MalformedPacket(FLAG_RULES.get(ptype, "MQTT-2.1.3-1"), f"invalid flags 0x{flags:x} for packet type {ptype}")


# --------------------------------------------------------------------------- decoding


# the statement that names each packet's reason codes
_REASON_RULES = {
    CONNACK: "MQTT-3.2.2-8",
    PUBACK: "MQTT-3.4.2-1",
    PUBREC: "MQTT-3.5.2-1",
    PUBREL: "MQTT-3.6.2-1",
    PUBCOMP: "MQTT-3.7.2-1",
    DISCONNECT: "MQTT-3.14.2-1",
    AUTH: "MQTT-3.15.2-1",
}


def _reason(r: Reader, ptype: int) -> int:
    code = r.u8()
    if code not in REASON_CODES[ptype]:
        raise MalformedPacket(_REASON_RULES[ptype], f"0x{code:02x} is not a {_NAMES[ptype]} reason code")
    return code


def decode_connect(r: Reader, cflags: int, keepalive: int) -> Connect:
    """The rest of a CONNECT of protocol level 5, after its keep alive (codec.py reads the
    protocol name and level, which decide the format)."""
    if cflags & 0x01:
        raise MalformedPacket("MQTT-3.1.2-3", "reserved CONNECT flag is set")
    will_flag = bool(cflags & 0x04)
    will_qos = (cflags >> 3) & 0x03
    will_retain = bool(cflags & 0x20)
    if not will_flag and will_qos:
        raise MalformedPacket("MQTT-3.1.2-11", "will QoS set without the will flag")
    if not will_flag and will_retain:
        raise MalformedPacket("MQTT-3.1.2-13", "will retain set without the will flag")
    if will_qos == 3:
        raise MalformedPacket("MQTT-3.1.2-12", "will QoS 3")
    props = read_properties(r, CONNECT)
    pkt = Connect(keepalive=keepalive, clean_session=bool(cflags & 0x02), protocol_level=5, properties=props)
    pkt.client_id = r.string("client identifier")
    if will_flag:
        will_props = read_properties(r, WILL)
        topic = r.string("will topic")
        _topic_name(topic)
        pkt.will = Will(topic, r.binary(), will_qos, will_retain, will_props)
    if cflags & 0x80:
        pkt.username = r.string("user name")
    if cflags & 0x40:
        pkt.password = r.binary()  # (MQTT 5 allows a password without a user name)
    if r.remaining:
        raise MalformedPacket("MQTT-3.1.3-1", f"{r.remaining} unexpected bytes after CONNECT payload")
    return pkt


def _topic_name(topic: str) -> None:
    if "+" in topic or "#" in topic:
        raise MalformedPacket("MQTT-3.3.2-2", f"wildcard in topic name {topic!r}", 0x90)


def _decode_connack(r: Reader, flags: int) -> ConnAck:
    ack_flags = r.u8()
    if ack_flags & 0xFE:
        raise MalformedPacket("MQTT-3.2.2-1", "reserved CONNACK flags set")
    code = _reason(r, CONNACK)
    pkt = ConnAck(bool(ack_flags & 1), code, read_properties(r, CONNACK) or None)
    _expect_end(r)
    return pkt


class PublishProps(dict):  # (a Props: dict[int, Any])
    """A PUBLISH's properties as read, with what its message carries on (``forwarded``:
    properties.forwarded) worked out once. The decoder keeps one per distinct property block
    and every PUBLISH with those bytes shares it: never modify one."""

    __slots__ = ("forwarded", "expiry")
    forwarded: bytes | None
    expiry: int | None  # its Message Expiry Interval, if it has one


# property blocks already read (most publishers send the same ones again and again): bytes ->
# PublishProps; emptied when full, so that blocks that are all different (a Correlation Data
# per request) cost what they would without it
_PUBLISH_PROPS: dict[bytes, PublishProps] = {}
PUBLISH_PROPS_CACHE = 4096


def _publish_props(raw: bytes) -> PublishProps:
    props = PublishProps(read_properties(Reader(varint(len(raw)) + raw, 0, len(raw) + 4, "PUBLISH"), PUBLISH))
    props.forwarded = forwarded(props)
    props.expiry = props.get(MESSAGE_EXPIRY)
    if len(_PUBLISH_PROPS) >= PUBLISH_PROPS_CACHE:
        _PUBLISH_PROPS.clear()
    _PUBLISH_PROPS[raw] = props
    return props


def decode_publish_fast(buf: bytes | bytearray | memoryview, i: int, end: int, first: int) -> Publish:
    """An MQTT 5 PUBLISH whose body is ``buf[i:end]`` (``first``: its first byte, already
    checked): ``decode_publish``'s checks, inline, and its property block read once for all
    the PUBLISHes that carry the same bytes."""
    if i + 2 > end:
        raise MalformedPacket("MQTT-4.8.0-1", "PUBLISH is truncated")
    tend = i + 2 + ((buf[i] << 8) | buf[i + 1])
    if tend > end:
        raise MalformedPacket("MQTT-4.8.0-1", "PUBLISH topic overruns the packet")
    topic = _decode_utf8(buf[i + 2 : tend], "topic name") if tend > i + 2 else ""
    _topic_name(topic)
    qos = (first >> 1) & 0x03
    p = tend
    pid = None
    if qos:
        if p + 2 > end:
            raise MalformedPacket("MQTT-4.8.0-1", "PUBLISH is truncated")
        pid = (buf[p] << 8) | buf[p + 1]
        if not pid:
            raise MalformedPacket("MQTT-2.2.1-3", "PUBLISH with packet identifier 0")
        p += 2
    if p >= end:
        raise MalformedPacket("MQTT-4.8.0-1", "PUBLISH is truncated")
    plen = buf[p]
    if plen < 128:
        p += 1
    else:
        r = Reader(buf, p, end, "PUBLISH")
        plen = r.varint("property length")
        p = r.pos
    pend = p + plen
    if pend > end:
        raise MalformedPacket("MQTT-4.8.0-1", f"PUBLISH: property length {plen} overruns the packet")
    props: Props | None = None
    if plen:
        raw = bytes(buf[p:pend])
        props = _PUBLISH_PROPS.get(raw)
        if props is None:
            props = _publish_props(raw)
    if not topic and (props is None or TOPIC_ALIAS not in props):
        raise ProtocolError("MQTT-3.3.2-1", "PUBLISH with an empty topic name and no Topic Alias")
    return Publish(topic, bytes(buf[pend:end]), qos, first & 1 == 1, first & 8 == 8, pid, props)


def decode_publish(r: Reader, flags: int) -> Publish:
    """``decode_publish_fast`` for a reader (the decoders' common form)."""
    return decode_publish_fast(r.buf, r.pos, r.end, 0x30 | flags)


def _decode_ack(cls: Callable[..., _Packet]) -> Callable[[Reader, int], _Packet]:
    ptype: int = cls.type  # type: ignore[attr-defined]

    def decode(r: Reader, flags: int) -> _Packet:
        pid = r.u16()
        if not pid:
            raise MalformedPacket("MQTT-2.2.1-5", f"{_NAMES[ptype]} with packet identifier 0")
        code, props = 0, None
        if r.remaining:
            code = _reason(r, ptype)
            if r.remaining:
                props = read_properties(r, ptype) or None
        _expect_end(r)
        return cls(pid, code, props)

    return decode


def _decode_subscribe(r: Reader, flags: int) -> Subscribe:
    pid = r.u16()
    if not pid:
        raise MalformedPacket("MQTT-2.2.1-3", "SUBSCRIBE with packet identifier 0")
    props = read_properties(r, SUBSCRIBE)
    ids = props.get(SUBSCRIPTION_ID)
    if ids is not None and len(ids) > 1:
        raise ProtocolError("MQTT-2.2.2-2", "SUBSCRIBE with more than one Subscription Identifier")
    topics = []
    while r.remaining:
        topic_filter = r.string("topic filter")
        _filter(topic_filter)
        options = r.u8()
        if options & 0xC0:
            raise MalformedPacket("MQTT-3.8.3-5", f"reserved subscription option bits set (0x{options:02x})")
        if options & 0x03 == 3:
            raise MalformedPacket("MQTT-3.8.3-5", "subscription with QoS 3")
        if (options >> RETAIN_HANDLING_SHIFT) & 0x03 == 3:
            raise ProtocolError("MQTT-3.8.3-5", "Retain Handling 3")
        topics.append((topic_filter, options))
    if not topics:
        raise ProtocolError("MQTT-3.8.3-2", "SUBSCRIBE without any topic filter")
    return Subscribe(pid, topics, props or None)


def _filter(topic_filter: str) -> None:
    try:
        validate_topic_filter(topic_filter)
    except MalformedPacket as exc:
        raise MalformedPacket(exc.rule, exc.detail, 0x8F) from None


def _decode_suback(r: Reader, flags: int) -> SubAck:
    pid = r.u16()
    props = read_properties(r, SUBACK)
    codes = list(r.rest())
    for code in codes:
        if code not in REASON_CODES[SUBACK]:
            raise MalformedPacket("MQTT-3.9.3-2", f"0x{code:02x} is not a SUBACK reason code")
    return SubAck(pid, codes, props or None)


def _decode_unsubscribe(r: Reader, flags: int) -> Unsubscribe:
    pid = r.u16()
    if not pid:
        raise MalformedPacket("MQTT-2.2.1-3", "UNSUBSCRIBE with packet identifier 0")
    props = read_properties(r, UNSUBSCRIBE)
    filters = []
    while r.remaining:
        topic_filter = r.string("topic filter")
        _filter(topic_filter)
        filters.append(topic_filter)
    if not filters:
        raise ProtocolError("MQTT-3.10.3-2", "UNSUBSCRIBE without any topic filter")
    return Unsubscribe(pid, filters, props or None)


def _decode_unsuback(r: Reader, flags: int) -> UnsubAck:
    pid = r.u16()
    props = read_properties(r, UNSUBACK)
    codes = list(r.rest())
    for code in codes:
        if code not in REASON_CODES[UNSUBACK]:
            raise MalformedPacket("MQTT-3.11.3-2", f"0x{code:02x} is not an UNSUBACK reason code")
    return UnsubAck(pid, codes, props or None)


def _decode_reasoned(cls: Callable[..., _Packet]) -> Callable[[Reader, int], _Packet]:
    """DISCONNECT and AUTH: no bytes at all means reason 0x00 and no properties."""
    ptype: int = cls.type  # type: ignore[attr-defined]

    def decode(r: Reader, flags: int) -> _Packet:
        code, props = 0, None
        if r.remaining:
            code = _reason(r, ptype)
            if r.remaining:
                props = read_properties(r, ptype) or None
        _expect_end(r)
        return cls(code, props)

    return decode


def _decode_empty(cls: Callable[[], _Packet]) -> Callable[[Reader, int], _Packet]:
    def decode(r: Reader, flags: int) -> _Packet:
        _expect_end(r)
        return cls()

    return decode


def _expect_end(r: Reader) -> None:
    if r.remaining:
        raise MalformedPacket("MQTT-4.8.0-1", f"{r.name} has {r.remaining} unexpected bytes")


# every type but CONNECT (codec.py decodes its head, which decides the version)
DECODERS: dict[int, Callable[[Reader, int], Any]] = {
    CONNACK: _decode_connack,
    PUBLISH: decode_publish,
    PUBACK: _decode_ack(PubAck),
    PUBREC: _decode_ack(PubRec),
    PUBREL: _decode_ack(PubRel),
    PUBCOMP: _decode_ack(PubComp),
    SUBSCRIBE: _decode_subscribe,
    SUBACK: _decode_suback,
    UNSUBSCRIBE: _decode_unsubscribe,
    UNSUBACK: _decode_unsuback,
    PINGREQ: _decode_empty(PingReq),
    PINGRESP: _decode_empty(PingResp),
    DISCONNECT: _decode_reasoned(Disconnect),
    AUTH: _decode_reasoned(Auth),
}


# --------------------------------------------------------------------------- encoding


def _frame(first: int, body: bytes) -> bytes:
    return bytes((first,)) + varint(len(body)) + body


def encode_publish5(
    topic: bytes,
    payload: bytes,
    qos: int = 0,
    retain: bool = False,
    dup: bool = False,
    packet_id: int | None = None,
    properties: bytes = b"\x00",
) -> bytes:
    """One MQTT 5 PUBLISH; ``topic`` UTF-8 encoded and ``properties`` already encoded
    (encode_properties), so a message going to many subscribers encodes them once."""
    first = 0x30 | (qos << 1) | (0x08 if dup else 0) | (0x01 if retain else 0)
    head = U16.pack(len(topic)) + topic
    if qos:
        head += U16.pack(packet_id or 0)
    return _frame(first, head + properties + payload)


def _reasoned(first: int, pid: int | None, code: int, props: Any) -> bytes:
    """An ack, DISCONNECT or AUTH in its shortest form: reason 0 without properties is
    left out (3.4.2.1, 3.14.2.1, 3.15.2.1)."""
    head = U16.pack(pid) if pid is not None else b""
    if props:
        return _frame(first, head + bytes((code,)) + encode_properties(props))
    if code:
        return _frame(first, head + bytes((code,)))
    return _frame(first, head)


def encode5(packet: Any) -> bytes:
    """Serialize any packet in its MQTT 5 form (either direction)."""
    t = packet.type
    if t == PUBLISH:
        return encode_publish5(
            packet.topic.encode("utf-8"),
            packet.payload,
            packet.qos,
            packet.retain,
            packet.dup,
            packet.packet_id,
            encode_properties(packet.properties),
        )
    if t in (PUBACK, PUBREC, PUBCOMP):
        return _reasoned(t << 4, packet.packet_id, packet.reason_code, packet.properties)
    if t == PUBREL:
        return _reasoned(0x62, packet.packet_id, packet.reason_code, packet.properties)
    if t in (DISCONNECT, AUTH):
        return _reasoned(t << 4, None, packet.reason_code, packet.properties)
    if t == CONNACK:
        body = bytes((1 if packet.session_present else 0, packet.return_code)) + encode_properties(packet.properties)
        return _frame(0x20, body)
    if t in (PINGREQ, PINGRESP):
        return bytes((t << 4, 0))
    if t == SUBSCRIBE:
        body = U16.pack(packet.packet_id) + encode_properties(packet.properties)
        body += b"".join(utf8(f) + bytes((o,)) for f, o in packet.topics)
        return _frame(0x82, body)
    if t == SUBACK:
        body = U16.pack(packet.packet_id) + encode_properties(packet.properties) + bytes(packet.return_codes)
        return _frame(0x90, body)
    if t == UNSUBSCRIBE:
        body = U16.pack(packet.packet_id) + encode_properties(packet.properties)
        return _frame(0xA2, body + b"".join(utf8(f) for f in packet.filters))
    if t == UNSUBACK:
        body = U16.pack(packet.packet_id) + encode_properties(packet.properties) + bytes(packet.reason_codes)
        return _frame(0xB0, body)
    if t == CONNECT:
        flags = 0x02 if packet.clean_session else 0
        payload = utf8(packet.client_id)
        will = packet.will
        if will is not None:
            flags |= 0x04 | (will.qos << 3) | (0x20 if will.retain else 0)
            payload += encode_properties(will.properties) + utf8(will.topic) + binary(will.payload)
        if packet.username is not None:
            flags |= 0x80
            payload += utf8(packet.username)
        if packet.password is not None:
            flags |= 0x40
            payload += binary(packet.password)
        head = utf8(packet.protocol_name) + bytes((5, flags)) + U16.pack(packet.keepalive)
        return _frame(0x10, head + encode_properties(packet.properties) + payload)
    raise ValueError(f"cannot encode {packet!r}")
