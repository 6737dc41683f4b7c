"""MQTT 5 properties (section 2.2.2 of MQTT 5.0): their identifiers, types and packets,
read from and written to bytes.

Pure. Properties are a dict from identifier to value; the two that may appear more than
once hold a list: User Property (pairs, in order [MQTT-3.3.2-18]) and Subscription
Identifier. It leaves to its caller what a property means, and every check that needs
session state (a Topic Alias within the maximum, a Receive Maximum exceeded).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .fields import Reader, binary, u16, u32, utf8, varint
from .packets import (
    AUTH,
    CONNACK,
    CONNECT,
    DISCONNECT,
    PUBACK,
    PUBCOMP,
    PUBLISH,
    PUBREC,
    PUBREL,
    SUBACK,
    SUBSCRIBE,
    UNSUBACK,
    UNSUBSCRIBE,
    MalformedPacket,
    Props,
    ProtocolError,
)

__all__ = [
    "PAYLOAD_FORMAT",
    "MESSAGE_EXPIRY",
    "CONTENT_TYPE",
    "RESPONSE_TOPIC",
    "CORRELATION_DATA",
    "SUBSCRIPTION_ID",
    "SESSION_EXPIRY",
    "ASSIGNED_CLIENT_ID",
    "SERVER_KEEP_ALIVE",
    "AUTH_METHOD",
    "AUTH_DATA",
    "REQUEST_PROBLEM_INFO",
    "WILL_DELAY",
    "REQUEST_RESPONSE_INFO",
    "RESPONSE_INFO",
    "SERVER_REFERENCE",
    "REASON_STRING",
    "RECEIVE_MAXIMUM",
    "TOPIC_ALIAS_MAXIMUM",
    "TOPIC_ALIAS",
    "MAXIMUM_QOS",
    "RETAIN_AVAILABLE",
    "USER_PROPERTY",
    "MAXIMUM_PACKET_SIZE",
    "WILDCARD_SUB_AVAILABLE",
    "SUB_ID_AVAILABLE",
    "SHARED_SUB_AVAILABLE",
    "WILL",
    "NAMES",
    "read_properties",
    "encode_properties",
    "encode_body",
    "forwarded",
    "FORWARDED",
]

PAYLOAD_FORMAT = 0x01
MESSAGE_EXPIRY = 0x02
CONTENT_TYPE = 0x03
RESPONSE_TOPIC = 0x08
CORRELATION_DATA = 0x09
SUBSCRIPTION_ID = 0x0B
SESSION_EXPIRY = 0x11
ASSIGNED_CLIENT_ID = 0x12
SERVER_KEEP_ALIVE = 0x13
AUTH_METHOD = 0x15
AUTH_DATA = 0x16
REQUEST_PROBLEM_INFO = 0x17
WILL_DELAY = 0x18
REQUEST_RESPONSE_INFO = 0x19
RESPONSE_INFO = 0x1A
SERVER_REFERENCE = 0x1C
REASON_STRING = 0x1F
RECEIVE_MAXIMUM = 0x21
TOPIC_ALIAS_MAXIMUM = 0x22
TOPIC_ALIAS = 0x23
MAXIMUM_QOS = 0x24
RETAIN_AVAILABLE = 0x25
USER_PROPERTY = 0x26
MAXIMUM_PACKET_SIZE = 0x27
WILDCARD_SUB_AVAILABLE = 0x28
SUB_ID_AVAILABLE = 0x29
SHARED_SUB_AVAILABLE = 0x2A

# the Will Properties of a CONNECT are a property set of their own (not a packet type)
WILL = 100

BYTE, TWO, FOUR, VARINT, STRING, BINARY, PAIR = "byte", "two", "four", "varint", "string", "binary", "pair"

_ACKS = (PUBACK, PUBREC, PUBREL, PUBCOMP)
_MESSAGE = (PUBLISH, WILL)

# Table 2-4: identifier -> (name, type, where it may appear)
TABLE: dict[int, tuple[str, str, tuple[int, ...]]] = {
    PAYLOAD_FORMAT: ("Payload Format Indicator", BYTE, _MESSAGE),
    MESSAGE_EXPIRY: ("Message Expiry Interval", FOUR, _MESSAGE),
    CONTENT_TYPE: ("Content Type", STRING, _MESSAGE),
    RESPONSE_TOPIC: ("Response Topic", STRING, _MESSAGE),
    CORRELATION_DATA: ("Correlation Data", BINARY, _MESSAGE),
    SUBSCRIPTION_ID: ("Subscription Identifier", VARINT, (PUBLISH, SUBSCRIBE)),
    SESSION_EXPIRY: ("Session Expiry Interval", FOUR, (CONNECT, CONNACK, DISCONNECT)),
    ASSIGNED_CLIENT_ID: ("Assigned Client Identifier", STRING, (CONNACK,)),
    SERVER_KEEP_ALIVE: ("Server Keep Alive", TWO, (CONNACK,)),
    AUTH_METHOD: ("Authentication Method", STRING, (CONNECT, CONNACK, AUTH)),
    AUTH_DATA: ("Authentication Data", BINARY, (CONNECT, CONNACK, AUTH)),
    REQUEST_PROBLEM_INFO: ("Request Problem Information", BYTE, (CONNECT,)),
    WILL_DELAY: ("Will Delay Interval", FOUR, (WILL,)),
    REQUEST_RESPONSE_INFO: ("Request Response Information", BYTE, (CONNECT,)),
    RESPONSE_INFO: ("Response Information", STRING, (CONNACK,)),
    SERVER_REFERENCE: ("Server Reference", STRING, (CONNACK, DISCONNECT)),
    REASON_STRING: ("Reason String", STRING, (CONNACK, *_ACKS, SUBACK, UNSUBACK, DISCONNECT, AUTH)),
    RECEIVE_MAXIMUM: ("Receive Maximum", TWO, (CONNECT, CONNACK)),
    TOPIC_ALIAS_MAXIMUM: ("Topic Alias Maximum", TWO, (CONNECT, CONNACK)),
    TOPIC_ALIAS: ("Topic Alias", TWO, (PUBLISH,)),
    MAXIMUM_QOS: ("Maximum QoS", BYTE, (CONNACK,)),
    RETAIN_AVAILABLE: ("Retain Available", BYTE, (CONNACK,)),
    USER_PROPERTY: (
        "User Property",
        PAIR,
        (CONNECT, CONNACK, PUBLISH, WILL, *_ACKS, SUBSCRIBE, SUBACK, UNSUBSCRIBE, UNSUBACK, DISCONNECT, AUTH),
    ),
    MAXIMUM_PACKET_SIZE: ("Maximum Packet Size", FOUR, (CONNECT, CONNACK)),
    WILDCARD_SUB_AVAILABLE: ("Wildcard Subscription Available", BYTE, (CONNACK,)),
    SUB_ID_AVAILABLE: ("Subscription Identifier Available", BYTE, (CONNACK,)),
    SHARED_SUB_AVAILABLE: ("Shared Subscription Available", BYTE, (CONNACK,)),
}
NAMES = {pid: name for pid, (name, _, _) in TABLE.items()}

# may appear more than once (Subscription Identifier: in a PUBLISH to a client; a SUBSCRIBE
# carries one at most, which codec5.py checks)
MULTIPLE = frozenset({USER_PROPERTY, SUBSCRIPTION_ID})

# the properties whose value must be 0 or 1 ("It is a Protocol Error to include a value
# other than 0 or 1"); Payload Format Indicator's two values are 0 and 1 too
_ZERO_ONE = frozenset(
    {
        PAYLOAD_FORMAT,
        REQUEST_PROBLEM_INFO,
        REQUEST_RESPONSE_INFO,
        MAXIMUM_QOS,
        RETAIN_AVAILABLE,
        WILDCARD_SUB_AVAILABLE,
        SUB_ID_AVAILABLE,
        SHARED_SUB_AVAILABLE,
    }
)
# "It is a Protocol Error to include ... a value of 0"
_NOT_ZERO = frozenset({RECEIVE_MAXIMUM, MAXIMUM_PACKET_SIZE, SUBSCRIPTION_ID, TOPIC_ALIAS})

_KINDS = {
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
    DISCONNECT: "DISCONNECT",
    AUTH: "AUTH",
    WILL: "Will Properties",
}


def _read_value(r: Reader, kind: str, name: str) -> Any:
    if kind == BYTE:
        return r.u8()
    if kind == TWO:
        return r.u16()
    if kind == FOUR:
        return r.u32()
    if kind == VARINT:
        return r.varint(name)
    if kind == STRING:
        return r.string(name)
    if kind == BINARY:
        return r.binary()
    return (r.string(f"{name} name"), r.string(f"{name} value"))


def read_properties(r: Reader, where: int) -> Props:
    """The property set at ``r`` (its length first), for packet type ``where`` (or WILL).

    A property that ``where`` may not carry, or a value that is not of its type, is a
    Malformed Packet; a single-valued one given twice, or a value out of its range, a
    Protocol Error (section 2.2.2.2)."""
    length = r.varint("property length")
    end = r.pos + length
    if end > r.end:
        raise MalformedPacket("MQTT-4.8.0-1", f"{r.name}: property length {length} overruns the packet")
    outer, r.end = r.end, end  # a value may not run past the properties
    props: Props = {}
    try:
        while r.pos < end:
            pid = r.varint("property identifier")
            entry = TABLE.get(pid)
            if entry is None:
                raise MalformedPacket("MQTT-2.2.2-2", f"{r.name}: unknown property identifier 0x{pid:02x}")
            name, kind, allowed = entry
            if where not in allowed:
                raise MalformedPacket("MQTT-2.2.2-2", f"{name} (0x{pid:02x}) is not allowed in {_KINDS[where]}")
            value = _read_value(r, kind, name)
            if pid in _ZERO_ONE and value > 1:
                raise ProtocolError("MQTT-2.2.2-2", f"{name} is {value}: only 0 or 1 is allowed")
            if pid in _NOT_ZERO and value == 0:
                # (a Topic Alias of 0 is Topic Alias invalid, 0x94 [MQTT-3.3.2-8])
                raise ProtocolError("MQTT-2.2.2-2", f"{name} of 0", 0x94 if pid == TOPIC_ALIAS else None)
            if pid in MULTIPLE:
                props.setdefault(pid, []).append(value)
            elif pid in props:
                raise ProtocolError("MQTT-2.2.2-2", f"{name} given more than once in {_KINDS[where]}")
            else:
                props[pid] = value
    finally:
        r.end = outer
    return props


_WRITERS: dict[str, Callable[[Any], bytes]] = {
    BYTE: lambda v: bytes((v,)),
    TWO: u16,
    FOUR: u32,
    VARINT: varint,
    STRING: utf8,
    BINARY: binary,
    PAIR: lambda kv: utf8(kv[0]) + utf8(kv[1]),
}


def encode_properties(props: Props | None) -> bytes:
    """The property set, its length first (one zero byte when there is none [MQTT-2.2.2-1])."""
    if not props:
        return b"\x00"
    body = encode_body(props)
    return varint(len(body)) + body


# what a server passes on unaltered with an application message, from its PUBLISH or will
# to every subscriber [MQTT-3.3.2-4] [MQTT-3.3.2-15] [MQTT-3.3.2-16] [MQTT-3.3.2-17] [MQTT-3.3.2-20]
FORWARDED = (PAYLOAD_FORMAT, CONTENT_TYPE, RESPONSE_TOPIC, CORRELATION_DATA, USER_PROPERTY)


def forwarded(props: Props | None) -> bytes | None:
    """The properties of ``props`` a message carries to its subscribers, encoded without
    their length (message.Message.props), or None when there is none."""
    if not props:
        return None
    kept = {pid: props[pid] for pid in FORWARDED if pid in props}
    return encode_body(kept) if kept else None


def encode_body(props: Props) -> bytes:
    """The properties without their length prefix."""
    out = bytearray()
    for pid, value in props.items():
        write = _WRITERS[TABLE[pid][1]]
        if pid in MULTIPLE:
            for item in value if isinstance(value, list) else [value]:
                out.append(pid)
                out += write(item)
        else:
            out.append(pid)
            out += write(value)
    return bytes(out)
