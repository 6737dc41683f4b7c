"""The little MQTT (3.1.1, and 5.0 for the ``-v5`` brokers) the load generator needs, written
from the standards.

It shares no code with ``mqttmesh.codec`` on purpose: a bug mirrored in the
broker's encoder and decoder must not be able to hide from the benchmark.

Only what the generator sends and receives is here: CONNECT/CONNACK,
SUBSCRIBE/SUBACK, PUBLISH and its acknowledgements, DISCONNECT. The hot paths
(building many PUBLISH frames, splitting a read into frames) are written for
speed: a PUBLISH of the benchmark is a constant prefix plus one ``struct.pack``.
"""

from __future__ import annotations

import struct

# packet types (high nibble of the first byte)
CONNECT, CONNACK, PUBLISH, PUBACK, PUBREC, PUBREL, PUBCOMP = 1, 2, 3, 4, 5, 6, 7
SUBSCRIBE, SUBACK, UNSUBSCRIBE, UNSUBACK, PINGREQ, PINGRESP, DISCONNECT = 8, 9, 10, 11, 12, 13, 14

# first bytes of the four two-byte acknowledgements; PUBREL has flags 0b0010 [MQTT-3.6.1-1]
PUBACK_B, PUBREC_B, PUBREL_B, PUBCOMP_B = 0x40, 0x50, 0x62, 0x70
DISCONNECT_PACKET = b"\xe0\x00"

# The benchmark payload: run id, publisher id, sequence number, send time
# (time.monotonic_ns(): CLOCK_MONOTONIC is one clock for the whole machine on
# Linux, so a subscriber process can subtract another process's timestamp).
# Padded with zeros to PAYLOAD_SIZE bytes.
PAYLOAD_SIZE = 64
PAYLOAD_HEAD = struct.Struct("!IIQQ")  # 24 bytes
assert PAYLOAD_HEAD.size <= PAYLOAD_SIZE
# the same with the packet identifier in front, for QoS 1/2 PUBLISH (one pack per message)
_PAD = PAYLOAD_SIZE - PAYLOAD_HEAD.size
PAYLOAD_QOS0 = struct.Struct(f"!IIQQ{_PAD}x")
PAYLOAD_QOS12 = struct.Struct(f"!HIIQQ{_PAD}x")


def varint(n: int) -> bytes:
    """The Remaining Length encoding (section 2.2.3)."""
    if not 0 <= n <= 268_435_455:
        raise ValueError(f"remaining length {n} out of range")
    out = bytearray()
    while True:
        digit, n = n & 0x7F, n >> 7
        out.append(digit | (0x80 if n else 0))
        if not n:
            return bytes(out)


def mqtt_str(text: str) -> bytes:
    raw = text.encode("utf-8")
    return struct.pack("!H", len(raw)) + raw


def packet(first_byte: int, body: bytes) -> bytes:
    return bytes((first_byte,)) + varint(len(body)) + body


# MQTT 5 (section 2.2.2): what a benchmark PUBLISH of an MQTT 5 client carries, a Content
# Type and a User Property, as a typical device message does; a subscriber takes up to
# ALIASES5 topic aliases from the broker (Topic Alias Maximum)
PROPS5 = b"\x03" + mqtt_str("application/octet-stream") + b"\x26" + mqtt_str("site") + mqtt_str("bench")
PROPS5_FIELD = bytes((len(PROPS5),)) + PROPS5  # (shorter than 128 bytes: its length is one byte)
assert len(PROPS5) < 128
ALIASES5 = 16


def connect(client_id: str, keepalive: int = 0, clean: bool = True, version: int = 4, aliases: int = 0) -> bytes:
    # keepalive 0 turns the keepalive off [MQTT-3.1.2-24 note]: runs are short and
    # the generator does not want PINGREQ traffic in its measurements
    flags = 0x02 if clean else 0x00
    head = mqtt_str("MQTT") + bytes((version, flags)) + struct.pack("!H", keepalive)
    if version == 5:
        # Session Expiry Interval: a persistent (clean=False) session outlives the connection
        props = b"" if clean else b"\x11" + struct.pack("!I", 0xFFFFFFFF)
        if aliases:
            props += b"\x22" + struct.pack("!H", aliases)  # Topic Alias Maximum
        head += bytes((len(props),)) + props
    return packet(0x10, head + mqtt_str(client_id))


def subscribe(packet_id: int, filters: list[tuple[str, int]], version: int = 4) -> bytes:
    body = struct.pack("!H", packet_id) + (b"\x00" if version == 5 else b"")  # (MQTT 5: no properties)
    body += b"".join(mqtt_str(f) + bytes((q,)) for f, q in filters)
    return packet(0x82, body)  # flags 0b0010 [MQTT-3.8.1-1]


def ack(first_byte: int, packet_id: int) -> bytes:
    return bytes((first_byte, 2, packet_id >> 8, packet_id & 0xFF))


def publish_prefix(topic: str, qos: int, version: int = 4) -> bytes:
    """Fixed header and topic of a benchmark PUBLISH; the packet id (QoS>0) and payload follow.
    MQTT 5: the properties (PROPS5_FIELD) come after the packet id, so at QoS 0 they are part
    of the prefix, and at QoS 1/2 the caller puts them between the id and the payload."""
    topic_field = mqtt_str(topic)
    props = len(PROPS5_FIELD) if version == 5 else 0
    remaining = len(topic_field) + (2 if qos else 0) + props + PAYLOAD_SIZE
    prefix = bytes((0x30 | (qos << 1),)) + varint(remaining) + topic_field
    return prefix + PROPS5_FIELD if version == 5 and not qos else prefix


def split_frames(data: bytes, pos: int = 0) -> tuple[list[tuple[int, int, int]], int]:
    """Complete frames in ``data[pos:]`` as (first byte, body start, body end); and where the rest starts.

    For the cold paths (CONNACK, SUBACK, acknowledgements); the subscriber's hot
    loop does the same inline.
    """
    frames = []
    n = len(data)
    while pos + 2 <= n:
        first = data[pos]
        # Remaining Length: at most four bytes
        length = 0
        shift = 0
        i = pos + 1
        while True:
            if i >= n:
                return frames, pos
            b = data[i]
            length |= (b & 0x7F) << shift
            i += 1
            if not b & 0x80:
                break
            shift += 7
            if shift > 21:
                raise ValueError("malformed Remaining Length")
        end = i + length
        if end > n:
            break
        frames.append((first, i, end))
        pos = end
    return frames, pos
