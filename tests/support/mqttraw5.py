"""MQTT 5.0 bytes built by hand, independent of mqttmesh's codec (like mqttraw.py for 3.1.1).

Written from the standard's figures: each packet is its fixed header, its variable header with
the property set, and its payload. A property is given as (identifier, raw value bytes) so
that a test can build what the codec would never write: duplicates, wrong packets, wrong
types.
"""

from __future__ import annotations

import struct

from support.mqttraw import packet, s, varint

__all__ = [
    "props",
    "u16",
    "u32",
    "pair",
    "connect",
    "publish",
    "ack",
    "subscribe",
    "unsubscribe",
    "disconnect",
    "auth",
]


def u16(n: int) -> bytes:
    return struct.pack(">H", n)


def u32(n: int) -> bytes:
    return struct.pack(">I", n)


def pair(key: str, value: str) -> bytes:
    return s(key) + s(value)


def props(*items: tuple[int, bytes]) -> bytes:
    """A property set: its length, then each identifier (one byte here) and value."""
    body = b"".join(bytes((pid,)) + raw for pid, raw in items)
    return varint(len(body)) + body


def connect(
    client_id: str = "c",
    clean: bool = True,
    keepalive: int = 60,
    properties: bytes = b"\x00",
    will: tuple[str, bytes, int, bool, bytes] | None = None,
    username: str | None = None,
    password: bytes | None = None,
    flags_extra: int = 0,
) -> bytes:
    """will = (topic, payload, qos, retain, will properties)."""
    flags = (0x02 if clean else 0) | flags_extra
    payload = s(client_id)
    if will is not None:
        topic, message, qos, retain, will_props = will
        flags |= 0x04 | (qos << 3) | (0x20 if retain else 0)
        payload += will_props + s(topic) + s(message)
    if username is not None:
        flags |= 0x80
        payload += s(username)
    if password is not None:
        flags |= 0x40
        payload += s(password)
    head = s("MQTT") + bytes((5, flags)) + u16(keepalive)
    return packet(0x10, head + properties + payload)


def publish(
    topic: str,
    payload: bytes = b"",
    qos: int = 0,
    retain: bool = False,
    dup: bool = False,
    pid: int | None = None,
    properties: bytes = b"\x00",
) -> bytes:
    first = 0x30 | (qos << 1) | (0x08 if dup else 0) | (0x01 if retain else 0)
    head = s(topic) + (u16(pid) if qos else b"")
    return packet(first, head + properties + payload)


def ack(ptype: int, pid: int, reason: int | None = None, properties: bytes | None = None) -> bytes:
    """PUBACK (4), PUBREC (5), PUBREL (6), PUBCOMP (7); reason and properties left out when None."""
    first = (ptype << 4) | (2 if ptype == 6 else 0)
    body = u16(pid)
    if reason is not None:
        body += bytes((reason,))
        if properties is not None:
            body += properties
    return packet(first, body)


def subscribe(pid: int, *filters: tuple[str, int], properties: bytes = b"\x00") -> bytes:
    """filters: (topic filter, subscription options byte)."""
    return packet(0x82, u16(pid) + properties + b"".join(s(f) + bytes((o,)) for f, o in filters))


def unsubscribe(pid: int, *filters: str, properties: bytes = b"\x00") -> bytes:
    return packet(0xA2, u16(pid) + properties + b"".join(s(f) for f in filters))


def disconnect(reason: int | None = None, properties: bytes | None = None) -> bytes:
    body = b""
    if reason is not None:
        body = bytes((reason,)) + (properties if properties is not None else b"")
    return packet(0xE0, body)


def auth(reason: int | None = None, properties: bytes | None = None) -> bytes:
    body = b""
    if reason is not None:
        body = bytes((reason,)) + (properties if properties is not None else b"")
    return packet(0xF0, body)
