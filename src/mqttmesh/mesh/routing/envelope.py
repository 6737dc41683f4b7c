"""Envelopes: application messages on their way between nodes, batched per PUBLISH.

Pure. One PUBLISH on a peer link (kind ``fwd``) carries a batch of envelopes;
each envelope is one message with its mesh-wide identity (origin, sequence),
its remaining destination nodes and its hop limit. The batch keeps the
strings that repeat (origins, publishers, topics, destination lists) once,
in a table, and each envelope as one fixed-size record plus its payload, so
encoding and decoding cost one struct call per message. The first byte is
the format version, so nodes of different versions can tell.

    batch    = version:u8=3  count:u32  nstrings:u16  (len:u16 utf8)*nstrings  envelope*count
    envelope = flags:u8 hop_limit:u8 attempt:u8 seq:u64 ts:f64
               origin:u16 publisher:u16 topic:u16 dests:u16 (indexes into the table)
               payload_len:u32 [back:u32 * len(dests), with bit 4] payload
    flags    = qos (bits 0-1) | retain (bit 2) | acknowledged to another node (bit 3)
               | ordered (bit 4);
               a destination list is its node ids joined by NUL; with bit 3 the origin
               string is the origin and the node to acknowledge to, joined by NUL

With bit 4, each destination has its predecessor: the sequence number of the origin's
previous QoS 1/2 message to that node, as ``seq - previous`` (0: none, deliver at once),
in the order of the destination list; the destination delivers the message after its
predecessor (order.py, docs/design.md 3.6). Version 3 added it.
"""

from __future__ import annotations

import struct

from ...message import Message

__all__ = ["VERSION", "Envelope", "encode_batch", "decode_batch", "EnvelopeError", "MAX_STRINGS"]

VERSION = 3
MAX_STRINGS = 65535
_HEAD = struct.Struct(">BIH")
_REC = struct.Struct(">BBBQdHHHHI")
_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")


class EnvelopeError(ValueError):
    """A batch that does not decode; the link that sent it is closed."""


class Envelope:
    __slots__ = ("msg", "dests", "hop_limit", "attempt", "dests_key", "prevs")

    def __init__(
        self,
        msg: Message,
        dests: list[str],
        hop_limit: int,
        attempt: int = 0,
        dests_key: str | None = None,
        prevs: list[int] | None = None,
    ):
        self.msg = msg
        self.dests = dests
        self.hop_limit = hop_limit
        self.attempt = attempt
        self.dests_key = dests_key  # "\0".join(dests), when the caller already has it
        # per destination, the origin's previous QoS 1/2 message to it (0: none); None: unordered
        self.prevs = prevs

    def __repr__(self) -> str:
        prevs = f", prevs={self.prevs}" if self.prevs is not None else ""
        return f"Envelope({self.msg!r}, dests={self.dests}, hops={self.hop_limit}, attempt={self.attempt}{prevs})"


def encode_batch(envelopes: list[Envelope]) -> bytes:
    if len(envelopes) * 4 > MAX_STRINGS:
        raise ValueError(f"{len(envelopes)} envelopes do not fit one batch; split it")
    table: dict[str, int] = {}
    strings: list[str] = []
    records: list[bytes] = []
    append = records.append
    pack = _REC.pack
    pack_u32 = _U32.pack
    get = table.get
    for env in envelopes:
        m = env.msg
        dk = env.dests_key
        if dk is None:
            dk = "\0".join(env.dests)
        # four table lookups, unrolled: this loop runs once per forwarded message
        origin = m.origin
        flags = m.qos | (4 if m.retain else 0)
        if m.ack_to:
            origin = origin + "\0" + m.ack_to
            flags |= 8
        o = get(origin)
        if o is None:
            o = table[origin] = len(strings)
            strings.append(origin)
        p = get(m.publisher)
        if p is None:
            p = table[m.publisher] = len(strings)
            strings.append(m.publisher)
        t = get(m.topic)
        if t is None:
            t = table[m.topic] = len(strings)
            strings.append(m.topic)
        d = get(dk)
        if d is None:
            d = table[dk] = len(strings)
            strings.append(dk)
        payload = m.payload
        prevs = env.prevs
        if prevs is None:
            append(pack(flags, env.hop_limit, env.attempt, m.seq, m.timestamp, o, p, t, d, len(payload)))
        else:
            seq = m.seq
            append(pack(flags | 16, env.hop_limit, env.attempt, seq, m.timestamp, o, p, t, d, len(payload)))
            # (a predecessor further back than 2**32 numbers is as good as none)
            if len(prevs) == 1:
                back = seq - prevs[0]
                append(pack_u32(back if prevs[0] and 0 < back < 4294967296 else 0))
            else:
                backs = [seq - b if b and 0 < seq - b < 4294967296 else 0 for b in prevs]
                append(struct.pack(f">{len(prevs)}I", *backs))
        append(payload)
    head = [_HEAD.pack(VERSION, len(envelopes), len(strings))]
    for text in strings:
        raw = text.encode()
        head.append(_U16.pack(len(raw)))
        head.append(raw)
    return b"".join(head) + b"".join(records)


def decode_batch(data: bytes) -> list[Envelope]:
    try:
        version, count, nstrings = _HEAD.unpack_from(data, 0)
        if version != VERSION:
            raise EnvelopeError(f"unknown envelope batch version {version}")
        pos = _HEAD.size
        raws = []
        for _ in range(nstrings):
            n = (data[pos] << 8) | data[pos + 1]
            raws.append(data[pos + 2 : pos + 2 + n])
            pos += 2 + n
        strings = [r.decode() for r in raws]
        dest_lists: dict[int, list[str]] = {}
        out = []
        unpack = _REC.unpack_from
        unpack_u32 = _U32.unpack_from
        size = _REC.size
        end = len(data)
        for _ in range(count):
            flags, hops, attempt, seq, ts, oi, pi, ti, di, plen = unpack(data, pos)
            pos += size
            dests = dest_lists.get(di)
            if dests is None:
                dests = dest_lists[di] = strings[di].split("\0")
            prevs = None
            if flags & 16:
                n = len(dests)
                if n == 1:
                    back = unpack_u32(data, pos)[0]
                    pos += 4
                    if back > seq:
                        raise EnvelopeError("a predecessor after its message")
                    prevs = [seq - back if back else 0]
                else:
                    prevs = [seq - back if back else 0 for back in struct.unpack_from(f">{n}I", data, pos)]
                    pos += 4 * n
                    if min(prevs) < 0:
                        raise EnvelopeError("a predecessor after its message")
            payload = data[pos : pos + plen]
            pos += plen
            topic = strings[ti]
            qos = flags & 3
            if qos == 3 or not topic:
                raise EnvelopeError("invalid envelope flags or topic")
            msg = Message(topic, payload, qos, flags & 4 == 4, strings[oi], seq, strings[pi], ts)
            msg._topic_bytes = raws[ti]  # saves re-encoding it for every subscriber frame
            if flags & 8:
                origin, sep, msg.ack_to = msg.origin.partition("\0")
                if not sep or not msg.ack_to:
                    raise EnvelopeError("an envelope to acknowledge elsewhere names no node")
                msg.origin = origin
            out.append(Envelope(msg, dests, hops, attempt, strings[di], prevs))
        if pos != end:
            raise EnvelopeError(
                f"{end - pos} bytes after the last envelope" if pos < end else "envelope overruns its batch"
            )
        return out
    except (struct.error, IndexError, UnicodeDecodeError) as exc:
        raise EnvelopeError(f"malformed envelope batch: {exc}") from None
