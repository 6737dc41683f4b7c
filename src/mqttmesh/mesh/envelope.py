"""Envelopes: application messages on their way between nodes, batched per PUBLISH.

Pure. One PUBLISH on a peer link (topic ``$mesh/to/<node>/fwd``) carries a
batch of envelopes; each envelope is one message with its mesh-wide identity,
its remaining destination nodes and its hop limit. The format is versioned
(the first byte of a batch) so nodes of different versions can tell.

    batch    = version:u8  count:u32  envelope*
    envelope = flags:u8 hop_limit:u8 attempt:u8  seq:u64  ts:f64
               origin:str8  publisher:str16  topic:str16  payload:bytes32
               ndest:u16 dest:str8*
    flags    = qos (bits 0-1) | retain (bit 2)
"""

from __future__ import annotations

import struct

from ..message import Message

__all__ = ["VERSION", "Envelope", "encode_batch", "decode_batch", "EnvelopeError"]

VERSION = 1
_HEAD = struct.Struct(">BBBQd")
_U8, _U16, _U32 = struct.Struct(">B"), struct.Struct(">H"), struct.Struct(">I")


class EnvelopeError(ValueError):
    """A batch that does not decode; the link that sent it is closed."""


class Envelope:
    __slots__ = ("msg", "dests", "hop_limit", "attempt")

    def __init__(self, msg: Message, dests: list[str], hop_limit: int, attempt: int = 0):
        self.msg = msg
        self.dests = dests
        self.hop_limit = hop_limit
        self.attempt = attempt

    def __repr__(self):
        return f"Envelope({self.msg!r}, dests={self.dests}, hops={self.hop_limit}, attempt={self.attempt})"


def encode_batch(envelopes: list[Envelope]) -> bytes:
    parts = [bytes((VERSION,)), _U32.pack(len(envelopes))]
    append = parts.append
    for env in envelopes:
        m = env.msg
        origin = m.origin.encode()
        publisher = m.publisher.encode()
        topic = m.topic_bytes
        append(_HEAD.pack(m.qos | (4 if m.retain else 0), env.hop_limit, env.attempt, m.seq, m.timestamp))
        append(bytes((len(origin),)))
        append(origin)
        append(_U16.pack(len(publisher)))
        append(publisher)
        append(_U16.pack(len(topic)))
        append(topic)
        append(_U32.pack(len(m.payload)))
        append(m.payload)
        append(_U16.pack(len(env.dests)))
        for d in env.dests:
            raw = d.encode()
            append(bytes((len(raw),)))
            append(raw)
    return b"".join(parts)


def decode_batch(data: bytes) -> list[Envelope]:
    try:
        if not data or data[0] != VERSION:
            raise EnvelopeError(f"unknown envelope batch version {data[:1]!r}")
        count = _U32.unpack_from(data, 1)[0]
        pos = 5
        out = []
        size = len(data)
        for _ in range(count):
            flags, hops, attempt, seq, ts = _HEAD.unpack_from(data, pos)
            pos += _HEAD.size
            n = data[pos]
            origin = data[pos + 1:pos + 1 + n].decode()
            pos += 1 + n
            n = _U16.unpack_from(data, pos)[0]
            publisher = data[pos + 2:pos + 2 + n].decode()
            pos += 2 + n
            n = _U16.unpack_from(data, pos)[0]
            topic = data[pos + 2:pos + 2 + n].decode()
            pos += 2 + n
            n = _U32.unpack_from(data, pos)[0]
            payload = data[pos + 4:pos + 4 + n]
            pos += 4 + n
            if pos > size:
                raise EnvelopeError("envelope overruns its batch")
            ndest = _U16.unpack_from(data, pos)[0]
            pos += 2
            dests = []
            for _ in range(ndest):
                n = data[pos]
                dests.append(data[pos + 1:pos + 1 + n].decode())
                pos += 1 + n
            if pos > size:
                raise EnvelopeError("destination list overruns its batch")
            qos = flags & 3
            if qos == 3 or not topic:
                raise EnvelopeError("invalid envelope flags or topic")
            msg = Message(topic, bytes(payload), qos, bool(flags & 4), origin, seq, publisher, ts)
            out.append(Envelope(msg, dests, hops, attempt))
        if pos != size:
            raise EnvelopeError(f"{size - pos} bytes after the last envelope")
        return out
    except (struct.error, IndexError, UnicodeDecodeError) as exc:
        raise EnvelopeError(f"malformed envelope batch: {exc}") from None
