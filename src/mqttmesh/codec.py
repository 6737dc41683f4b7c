"""MQTT packet codec: bytes in, packets out; packets in, bytes out (3.1.1 here, 5.0 in codec5.py).

Pure: no sockets, no clock, no session state. It leaves to its caller where the
bytes come from, when to read more, and what a packet means for a session; it
only decides whether bytes form a well-formed packet (and says which rule of
the standard they break when they do not).
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator
from typing import Any, cast

from . import codec5
from .fields import Reader, binary, utf8, varint
from .packets import (  # re-exported: the codec is where callers find packets
    _FIRST_OK,
    _FLAG_RULES,
    _REQUIRED_FLAGS,
    ACCEPTED,
    AUTH,
    BAD_CREDENTIALS,
    BAD_PROTOCOL,
    CONNACK,
    CONNACK_REASONS,
    CONNECT,
    DEFAULT_MAX_PACKET_SIZE,
    DISCONNECT,
    ID_REJECTED,
    NOT_AUTHORIZED,
    PACKET_NAMES,
    PINGREQ,
    PINGRESP,
    PUBACK,
    PUBCOMP,
    PUBLISH,
    PUBREC,
    PUBREL,
    SUBACK,
    SUBSCRIBE,
    UNAVAILABLE,
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
    _Packet,
    first_byte_error,
    validate_topic_filter,
    validate_topic_name,
)

__all__ = [
    "ACCEPTED",
    "BAD_CREDENTIALS",
    "BAD_PROTOCOL",
    "CONNACK_REASONS",
    "ID_REJECTED",
    "NOT_AUTHORIZED",
    "UNAVAILABLE",
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
    "Auth",
    "ProtocolError",
    "Props",
    "PACKET_NAMES",
    "MalformedPacket",
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
    "Decoder",
    "encode",
    "encode_publish",
    "encode_remaining_length",
    "validate_topic_name",
    "validate_topic_filter",
    "DEFAULT_MAX_PACKET_SIZE",
]

_U16 = struct.Struct(">H")
_Reader = Reader


# --------------------------------------------------------------------------- decoding


def _packet_id(r: _Reader, what: str) -> int:
    pid = r.u16()
    if pid == 0:
        raise MalformedPacket("MQTT-2.3.1-1", f"{what} with packet identifier 0")
    return pid


def _decode_connect(r: _Reader, flags: int) -> Connect:
    name = r.string("protocol name")
    level = r.u8()
    cflags = r.u8()
    keepalive = r.u16()
    pkt = Connect(protocol_name=name, protocol_level=level, keepalive=keepalive, clean_session=bool(cflags & 0x02))
    if name == "MQIsdp":
        return pkt  # MQTT 3.1: the caller answers CONNACK 0x01 so the client can fall back
    if name != "MQTT":
        # We continue under no other specification, so we close [MQTT-3.1.2-1].
        raise MalformedPacket("MQTT-3.1.2-1", f"protocol name {name!r} is not 'MQTT'")
    if level == 5:
        return codec5.decode_connect(r, cflags, keepalive)
    if level != 4:
        return pkt  # the caller answers CONNACK 0x01 [MQTT-3.1.2-2]; the rest may be another format
    if cflags & 0x01:
        raise MalformedPacket("MQTT-3.1.2-3", "reserved CONNECT flag is set")
    will_flag = bool(cflags & 0x04)
    will_qos = (cflags >> 3) & 0x03
    will_retain = bool(cflags & 0x20)
    has_password = bool(cflags & 0x40)
    has_username = bool(cflags & 0x80)
    if not will_flag and (will_qos or will_retain):
        raise MalformedPacket("MQTT-3.1.2-11", "will QoS/retain set without the will flag")
    if will_qos == 3:
        raise MalformedPacket("MQTT-3.1.2-14", "will QoS 3")
    if has_password and not has_username:
        raise MalformedPacket("MQTT-3.1.2-22", "password flag set without user name flag")
    pkt.client_id = r.string("client identifier")
    if will_flag:
        topic = r.string("will topic")
        validate_topic_name(topic)
        pkt.will = Will(topic, r.binary(), will_qos, will_retain)
    if has_username:
        pkt.username = r.string("user name")
    if has_password:
        pkt.password = r.binary()
    if r.remaining:
        raise MalformedPacket("MQTT-3.1.3-1", f"{r.remaining} unexpected bytes after CONNECT payload")
    return pkt


def _decode_connack(r: _Reader, flags: int) -> ConnAck:
    ack_flags = r.u8()
    if ack_flags & 0xFE:
        raise MalformedPacket("MQTT-2.2.2-1", "reserved CONNACK flags set")
    pkt = ConnAck(bool(ack_flags & 1), r.u8())
    _expect_end(r)
    return pkt


def _decode_publish(r: _Reader, flags: int) -> Publish:
    qos = (flags >> 1) & 0x03
    if qos == 3:
        raise MalformedPacket("MQTT-3.3.1-4", "PUBLISH with both QoS bits set")
    dup = bool(flags & 0x08)
    if dup and qos == 0:
        raise MalformedPacket("MQTT-3.3.1-2", "DUP set on a QoS 0 PUBLISH")
    topic = r.string("topic name")
    validate_topic_name(topic)
    pid = _packet_id(r, "PUBLISH") if qos else None
    return Publish(topic, r.rest(), qos, bool(flags & 0x01), dup, pid)


def _decode_id_only(cls: Callable[[int], _Packet]) -> Callable[[_Reader, int], _Packet]:
    def decode(r: _Reader, flags: int) -> _Packet:
        pkt = cls(_packet_id(r, PACKET_NAMES[cls.type]))  # type: ignore[attr-defined]
        _expect_end(r)
        return pkt

    return decode


def _decode_subscribe(r: _Reader, flags: int) -> Subscribe:
    pid = _packet_id(r, "SUBSCRIBE")
    topics = []
    while r.remaining:
        topic_filter = r.string("topic filter")
        validate_topic_filter(topic_filter)
        options = r.u8()
        if options & 0xFC or (options & 0x03) == 3:
            raise MalformedPacket("MQTT-3.8.3-4", f"requested QoS byte 0x{options:02x} is invalid")
        topics.append((topic_filter, options))
    if not topics:
        raise MalformedPacket("MQTT-3.8.3-3", "SUBSCRIBE without any topic filter")
    return Subscribe(pid, topics)


def _decode_suback(r: _Reader, flags: int) -> SubAck:
    pid = _packet_id(r, "SUBACK")
    codes = list(r.rest())
    for code in codes:
        if code not in (0, 1, 2, 0x80):
            raise MalformedPacket("MQTT-3.9.3-2", f"reserved SUBACK return code 0x{code:02x}")
    return SubAck(pid, codes)


def _decode_unsubscribe(r: _Reader, flags: int) -> Unsubscribe:
    pid = _packet_id(r, "UNSUBSCRIBE")
    filters = []
    while r.remaining:
        topic_filter = r.string("topic filter")
        validate_topic_filter(topic_filter)
        filters.append(topic_filter)
    if not filters:
        raise MalformedPacket("MQTT-3.10.3-2", "UNSUBSCRIBE without any topic filter")
    return Unsubscribe(pid, filters)


def _decode_empty(cls: Callable[[], _Packet]) -> Callable[[_Reader, int], _Packet]:
    def decode(r: _Reader, flags: int) -> _Packet:
        _expect_end(r)
        return cls()

    return decode


def _expect_end(r: _Reader) -> None:
    if r.remaining:
        raise MalformedPacket("MQTT-4.8.0-1", f"{r.name} has {r.remaining} unexpected bytes")


_DECODERS: dict[int, Callable[[_Reader, int], _Packet]] = {
    CONNECT: _decode_connect,
    CONNACK: _decode_connack,
    PUBLISH: _decode_publish,
    PUBACK: _decode_id_only(PubAck),
    PUBREC: _decode_id_only(PubRec),
    PUBREL: _decode_id_only(PubRel),
    PUBCOMP: _decode_id_only(PubComp),
    SUBSCRIBE: _decode_subscribe,
    SUBACK: _decode_suback,
    UNSUBSCRIBE: _decode_unsubscribe,
    UNSUBACK: _decode_id_only(UnsubAck),
    PINGREQ: _decode_empty(PingReq),
    PINGRESP: _decode_empty(PingResp),
    DISCONNECT: _decode_empty(Disconnect),
}


_ACK_CLASSES = {PUBACK: PubAck, PUBREC: PubRec, PUBREL: PubRel, PUBCOMP: PubComp}
PACKET_NAMES5 = {**PACKET_NAMES, AUTH: "AUTH"}


# a Decoder's buffer while it holds no byte (``feed`` makes a bytearray): an empty bytes
# object, shared, which cannot be added to or cut in place, so a path that forgot fails loudly
NOTHING_BUFFERED: bytearray = cast("bytearray", b"")


class Decoder:
    """Incremental decoder: ``feed`` bytes as they arrive, then iterate ``packets()``.

    Each packet is yielded as soon as its last byte is fed. A malformed packet
    raises MalformedPacket; the decoder is then unusable, as the connection must
    close [MQTT-4.8.0-1].

    ``version``: 4 (MQTT 3.1.1) or 5; it becomes 5 when a CONNECT of protocol level 5 is
    decoded (a server's decoder learns its client's version from it), and a client sets it.
    """

    __slots__ = ("_buf", "max_packet_size", "broken", "version")

    def __init__(self, max_packet_size: int = DEFAULT_MAX_PACKET_SIZE, version: int = 4):
        # (``NOTHING_BUFFERED`` while nothing is: an idle connection's decoder keeps no buffer)
        self._buf = NOTHING_BUFFERED
        self.max_packet_size = max_packet_size
        self.broken = False
        self.version = version

    def feed(self, data: bytes) -> None:
        if self._buf is NOTHING_BUFFERED:
            self._buf = bytearray(data)
        else:
            self._buf += data

    def first_byte(self) -> int:
        """The first byte buffered (the next packet's fixed header), or -1."""
        return self._buf[0] if self._buf else -1

    @property
    def buffered(self) -> int:
        return len(self._buf)

    def packets(self, keep: list[bytearray] | None = None) -> Iterator[Any]:
        """Yield every complete packet in the buffer, in order.

        ``keep``: a list to which the bytes of the packets yielded are appended once the
        iteration ends (whole packets, in order; for the archive, archive/capture.py).
        """
        if self.broken:
            raise MalformedPacket("MQTT-4.8.0-1", "decoder used after a malformed packet")
        buf = self._buf
        size = len(buf)
        max_size = self.max_packet_size
        v5 = self.version == 5
        first_ok = codec5.FIRST_OK if v5 else _FIRST_OK
        pos = 0
        try:
            while size > pos:
                first = buf[pos]
                if not first_ok[first]:
                    raise codec5.first_byte_error(first) if v5 else first_byte_error(first)
                # remaining length: up to four bytes, seven bits each (2.2.3); one byte (below
                # 128) for nearly every packet, so that one is read without the loop
                i = pos + 1
                if i >= size:
                    return
                length = buf[i]
                i += 1
                if length & 0x80:
                    length &= 0x7F
                    shift = 7
                    while True:
                        if i >= size:
                            return
                        byte = buf[i]
                        length |= (byte & 0x7F) << shift
                        i += 1
                        if not byte & 0x80:
                            break
                        shift += 7
                        if shift == 28:
                            raise MalformedPacket("MQTT-4.8.0-1", "remaining length longer than four bytes")
                if i - pos + length > max_size:
                    raise MalformedPacket(
                        "MQTT-4.8.0-1",
                        f"packet of {i - pos + length} bytes exceeds the maximum packet size {max_size}",
                        0x95,  # (MQTT 5: Packet too large)
                    )
                end = i + length
                if end > size:
                    return
                ptype = first >> 4
                if ptype == PUBLISH:
                    if v5:
                        packet = codec5.decode_publish_fast(buf, i, end, first)
                        pos = end
                        yield packet
                        continue
                    # the hot path, inlined: same checks as _decode_publish
                    qos = (first >> 1) & 0x03
                    if qos == 3 or (qos == 0 and first & 0x08) or length < 2:
                        _decode_publish(_Reader(buf, i, end, "PUBLISH"), first & 0x0F)
                    tend = i + 2 + ((buf[i] << 8) | buf[i + 1])
                    if tend > end:
                        raise MalformedPacket("MQTT-4.8.0-1", "PUBLISH topic overruns the packet")
                    try:
                        topic = buf[i + 2 : tend].decode("utf-8")
                    except UnicodeDecodeError as exc:
                        raise MalformedPacket(
                            "MQTT-1.5.3-1", f"topic name is not well-formed UTF-8 ({exc.reason})"
                        ) from None
                    if not topic or "+" in topic or "#" in topic or "\x00" in topic:
                        _decode_publish(_Reader(buf, i, end, "PUBLISH"), first & 0x0F)
                    if qos:
                        if tend + 2 > end:
                            raise MalformedPacket("MQTT-4.8.0-1", "PUBLISH is truncated")
                        pid = (buf[tend] << 8) | buf[tend + 1]
                        if not pid:
                            raise MalformedPacket("MQTT-2.3.1-1", "PUBLISH with packet identifier 0")
                        packet = Publish(topic, bytes(buf[tend + 2 : end]), qos, first & 1 == 1, first & 8 == 8, pid)
                    else:
                        packet = Publish(topic, bytes(buf[tend:end]), 0, first & 1 == 1, False, None)
                    pos = end
                    yield packet
                    continue
                if length == 2 and (first == 0x40 or first == 0x50 or first == 0x62 or first == 0x70):
                    pid = (buf[i] << 8) | buf[i + 1]  # PUBACK, PUBREC, PUBREL, PUBCOMP
                    if not pid:
                        raise MalformedPacket("MQTT-2.3.1-1", f"{PACKET_NAMES[ptype]} with packet identifier 0")
                    pos = end
                    yield _ACK_CLASSES[ptype](pid)
                    continue
                if v5:
                    packet = codec5.DECODERS[ptype](_Reader(buf, i, end, PACKET_NAMES5[ptype]), first & 0x0F)
                    pos = end
                    yield packet
                    continue
                flags = first & 0x0F
                decode = _DECODERS.get(ptype)
                if decode is None:
                    raise MalformedPacket("MQTT-2.2.2-1", f"reserved packet type {ptype}")
                if ptype != PUBLISH and flags != _REQUIRED_FLAGS[ptype]:
                    raise MalformedPacket(
                        _FLAG_RULES.get(ptype, "MQTT-2.2.2-2"), f"invalid flags 0x{flags:x} for {PACKET_NAMES[ptype]}"
                    )
                decoded = decode(_Reader(buf, i, end, PACKET_NAMES[ptype]), flags)
                pos = end
                if isinstance(decoded, Connect) and decoded.protocol_level == 5 and decoded.protocol_name == "MQTT":
                    self.version = 5  # what follows is MQTT 5
                    v5, first_ok = True, codec5.FIRST_OK
                yield decoded
        except MalformedPacket:
            self.broken = True
            raise
        finally:
            if pos:
                if keep is not None:
                    keep.append(buf[:pos])
                del buf[:pos]
                if not buf:
                    self._buf = NOTHING_BUFFERED


# --------------------------------------------------------------------------- encoding


# the Remaining Length is a Variable Byte Integer (2.2.3); strings and binary fields are
# length-prefixed (1.5): fields.py writes them for both versions
encode_remaining_length = varint
_str = utf8
_bin = binary


def _frame(first: int, body: bytes) -> bytes:
    return bytes((first,)) + encode_remaining_length(len(body)) + body


def encode_publish(
    topic: bytes, payload: bytes, qos: int = 0, retain: bool = False, dup: bool = False, packet_id: int | None = None
) -> bytes:
    """One PUBLISH frame; ``topic`` is already UTF-8 encoded (the hot path reuses it)."""
    first = 0x30 | (qos << 1) | (0x08 if dup else 0) | (0x01 if retain else 0)
    tlen = len(topic)
    if qos:
        length = 4 + tlen + len(payload)
        head = _U16.pack(tlen) + topic + _U16.pack(packet_id)
    else:
        length = 2 + tlen + len(payload)
        head = _U16.pack(tlen) + topic
    if length < 128:
        return bytes((first, length)) + head + payload
    return bytes((first,)) + encode_remaining_length(length) + head + payload


def encode(packet: Any) -> bytes:
    """Serialize any packet (both directions: a peer link is a client too).

    (``packet`` is any ``_Packet``; typed Any because the fields read depend on
    ``packet.type``, which a type checker cannot narrow on.)"""
    t = packet.type
    if t == PUBLISH:
        return encode_publish(
            packet.topic.encode("utf-8"), packet.payload, packet.qos, packet.retain, packet.dup, packet.packet_id
        )
    if t in (PUBACK, PUBREC, PUBCOMP, UNSUBACK):
        return bytes((t << 4, 2)) + _U16.pack(packet.packet_id)
    if t == PUBREL:
        return bytes((0x62, 2)) + _U16.pack(packet.packet_id)
    if t == CONNACK:
        return bytes((0x20, 2, 1 if packet.session_present else 0, packet.return_code))
    if t in (PINGREQ, PINGRESP, DISCONNECT):
        return bytes((t << 4, 0))
    if t == SUBSCRIBE:
        body = _U16.pack(packet.packet_id) + b"".join(_str(f) + bytes((q,)) for f, q in packet.topics)
        return _frame(0x82, body)
    if t == SUBACK:
        return _frame(0x90, _U16.pack(packet.packet_id) + bytes(packet.return_codes))
    if t == UNSUBSCRIBE:
        return _frame(0xA2, _U16.pack(packet.packet_id) + b"".join(_str(f) for f in packet.filters))
    if t == CONNECT:
        flags = 0x02 if packet.clean_session else 0
        payload = _str(packet.client_id)
        will = packet.will
        if will is not None:
            flags |= 0x04 | (will.qos << 3) | (0x20 if will.retain else 0)
            payload += _str(will.topic) + _bin(will.payload)
        if packet.username is not None:
            flags |= 0x80
            payload += _str(packet.username)
        if packet.password is not None:
            flags |= 0x40
            payload += _bin(packet.password)
        body = (
            _str(packet.protocol_name) + bytes((packet.protocol_level, flags)) + _U16.pack(packet.keepalive) + payload
        )
        return _frame(0x10, body)
    raise ValueError(f"cannot encode {packet!r}")
