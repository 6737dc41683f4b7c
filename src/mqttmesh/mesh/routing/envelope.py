"""Envelopes: application messages on their way between nodes, batched per PUBLISH.

Pure. One PUBLISH on a peer link (kind ``fwd``) carries a batch of envelopes;
each envelope is one message with its mesh-wide identity (origin, sequence),
its remaining destination nodes and its hop limit. The batch keeps the
strings that repeat (origins, publishers, topics, destination lists) once,
in a table, and each envelope as one fixed-size record plus its payload, so
encoding and decoding cost one struct call per message. The first byte is
the format version, so nodes of different versions can tell. ``sent`` is the sender's wall
clock when it made the batch: a receiver takes what its own wall clock says passed since off
an expiring message's remaining life (the time the batch spent on the way, in its socket, or
waiting for a paused or busy receiver to read it), never adds to it (clocks that disagree
only shorten a life, by as much as they disagree).

    batch    = version:u8=6  count:u32  nstrings:u16  sent:f64  (len:u16 utf8)*nstrings  envelope*count
    envelope = flags:u8 hop_limit:u8 attempt:u8 seq:u64 ts:f64
               origin:u16 publisher:u16 topic:u16 dests:u16 (indexes into the table)
               payload_len:u32 back:u32 [back:u32 * len(dests), with bit 4]
               [props_len:u32 props, with bit 5] [ttl_ms:u32, with bit 6]
               [shares:u16, with bit 7: index into the table] payload
    flags    = qos (bits 0-1) | retain (bit 2) | acknowledged to another node (bit 3)
               | one predecessor per destination follows (bit 4)
               | MQTT 5 properties follow (bit 5: message.Message.props, as encoded)
               | the message expires (bit 6: ttl_ms, what is left of its life when
               the batch was made, in milliseconds: each node counts it on its own clock)
               | shared groups follow (bit 7: which of the destinations serve which shared
               groups, mesh/routing/shares.py);
               a destination list is its node ids joined by NUL; with bit 3 the origin
               string is the origin and the node to acknowledge to, joined by NUL; a shares
               string is, for each destination that serves groups, its node id, the number
               of its groups and their filters ("$share/{g}/{f}"), all joined by NUL

A QoS 1/2 message's predecessor at a destination is the origin's previous QoS 1/2 message
to that node, given as ``back = seq - previous`` (0: none, deliver at once); the
destination delivers the message after its predecessor (order.py, docs/design.md 3.6). An
envelope to one destination carries it in its record (``back``, 0 for any other envelope);
one to several carries bit 4 and one ``back`` per destination, in the order of the list.
Version 3 added them; version 4, the properties; version 5, the remaining life and ``sent``;
version 6, the shared groups.
"""

from __future__ import annotations

import math
import struct

from ...message import Message

__all__ = [
    "VERSION",
    "Envelope",
    "Shares",
    "for_dests",
    "encode_batch",
    "decode_batch",
    "EnvelopeError",
    "MAX_STRINGS",
    "shares_text",
    "parse_shares",
]

VERSION = 6
MAX_STRINGS = 65535
_HEAD = struct.Struct(">BIHd")
_REC = struct.Struct(">BBBQdHHHHII")
_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")


class EnvelopeError(ValueError):
    """A batch that does not decode; the link that sent it is closed."""


class Envelope:
    """One message on its way, for ``dests``, with its predecessors there (order.py): ``prev``
    is one number for an envelope to one destination (0: none), a list of one per destination
    for an envelope to several (0 for all: none)."""

    __slots__ = ("msg", "dests", "hop_limit", "attempt", "dests_key", "prev", "shares")

    def __init__(
        self,
        msg: Message,
        dests: list[str],
        hop_limit: int,
        attempt: int = 0,
        dests_key: str | None = None,
        prev: int | list[int] = 0,
        shares: Shares | None = None,
    ):
        self.msg = msg
        self.dests = dests
        self.hop_limit = hop_limit
        self.attempt = attempt
        self.dests_key = dests_key  # "\0".join(dests), when the caller already has it
        self.prev = prev
        # the shared groups each destination serves (only those that serve one), or None
        self.shares = shares

    def predecessors(self) -> dict[str, int] | None:
        """Destination -> its predecessor, or None when no destination has one."""
        prev = self.prev
        if isinstance(prev, list):
            return dict(zip(self.dests, prev, strict=True))
        if prev and len(self.dests) == 1:
            return {self.dests[0]: prev}
        return None

    def __repr__(self) -> str:
        prevs = f", prevs={self.predecessors()}" if self.prev else ""
        return f"Envelope({self.msg!r}, dests={self.dests}, hops={self.hop_limit}, attempt={self.attempt}{prevs})"


# destination -> the shared groups ("$share/{g}/{f}") it delivers the message to
Shares = dict[str, tuple[str, ...]]


def for_dests(
    msg: Message,
    dests: list[str],
    hop_limit: int,
    attempt: int,
    pmap: dict[str, int] | None,
    smap: Shares | None = None,
) -> Envelope:
    """An envelope for ``dests`` with their predecessors from ``pmap`` (None: none) and their
    shared groups from ``smap`` (None: none)."""
    shares = None
    if smap is not None:
        shares = {d: smap[d] for d in dests if d in smap} or None
    if pmap is None:
        return Envelope(msg, dests, hop_limit, attempt, None, 0, shares)
    if len(dests) == 1:
        return Envelope(msg, dests, hop_limit, attempt, None, pmap.get(dests[0], 0), shares)
    return Envelope(msg, dests, hop_limit, attempt, None, [pmap.get(d, 0) for d in dests], shares)


def shares_text(shares: Shares) -> str:
    """The table string of ``shares`` (sorted: one string for one assignment)."""
    parts: list[str] = []
    for dest in sorted(shares):
        groups = shares[dest]
        parts.append(dest)
        parts.append(str(len(groups)))
        parts.extend(groups)
    return "\0".join(parts)


def parse_shares(text: str) -> Shares:
    """The inverse of ``shares_text``; EnvelopeError for one that does not parse."""
    fields = text.split("\0")
    out: Shares = {}
    i = 0
    try:
        while i < len(fields):
            dest, n = fields[i], int(fields[i + 1])
            groups = tuple(fields[i + 2 : i + 2 + n])
            if n < 1 or len(groups) != n or not all(g.startswith("$share/") for g in groups):
                raise ValueError
            out[dest] = groups
            i += 2 + n
    except (ValueError, IndexError):
        raise EnvelopeError(f"malformed shared groups {text[:80]!r}") from None
    return out


def encode_batch(envelopes: list[Envelope], now: float, wall: float = 0.0) -> bytes:
    """The batch of ``envelopes`` as it goes out at ``now`` (what is left of an expiring
    message's life is counted then), ``wall`` on the wall clock."""
    if len(envelopes) * 5 > MAX_STRINGS:
        raise ValueError(f"{len(envelopes)} envelopes do not fit one batch; split it")
    table: dict[str, int] = {}
    strings: list[str] = []
    records: list[bytes] = []
    append = records.append
    pack = _REC.pack
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
        props = m.props
        if props is not None:
            flags |= 32
        expires = m.expires
        if expires is not None:
            flags |= 64
        if env.shares:
            flags |= 128
        prev = env.prev
        if not prev:  # (no predecessor: every QoS 0 envelope)
            append(pack(flags, env.hop_limit, env.attempt, m.seq, m.timestamp, o, p, t, d, len(payload), 0))
        else:
            try:
                back = m.seq - prev  # type: ignore[operator]  # (a list raises TypeError: below)
                append(pack(flags, env.hop_limit, env.attempt, m.seq, m.timestamp, o, p, t, d, len(payload), back))
            except TypeError:  # (a list, one predecessor per destination: seq - list)
                seq = m.seq
                append(pack(flags | 16, env.hop_limit, env.attempt, seq, m.timestamp, o, p, t, d, len(payload), 0))
                backs = [seq - b if b and 0 < seq - b < 4294967296 else 0 for b in prev]  # type: ignore[union-attr]
                append(struct.pack(f">{len(backs)}I", *backs))
            except struct.error:  # (a predecessor further back than 2**32 numbers is as good as none)
                append(pack(flags, env.hop_limit, env.attempt, m.seq, m.timestamp, o, p, t, d, len(payload), 0))
        if props is not None:
            append(_U32.pack(len(props)))  # (the properties go before the payload)
            append(props)
        if expires is not None:  # (rounded up: a message with 0.2 ms left is not expired yet)
            left = expires - now
            append(_U32.pack(min(math.ceil(left * 1000.0), 0xFFFFFFFF) if left > 0.0 else 0))
        if env.shares:
            text = shares_text(env.shares)
            si = get(text)
            if si is None:
                si = table[text] = len(strings)
                strings.append(text)
            append(_U16.pack(si))
        append(payload)
    head = [_HEAD.pack(VERSION, len(envelopes), len(strings), wall)]
    for text in strings:
        raw = text.encode()
        head.append(_U16.pack(len(raw)))
        head.append(raw)
    return b"".join(head) + b"".join(records)


def decode_batch(data: bytes, now: float, wall: float = 0.0) -> list[Envelope]:
    """The envelopes of a batch read at ``now`` (``wall`` on the wall clock): an expiring
    message's remaining life counts from then, less what passed since the batch was made."""
    try:
        version, count, nstrings, sent = _HEAD.unpack_from(data, 0)
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
        share_maps: dict[int, Shares] = {}
        out = []
        unpack = _REC.unpack_from
        size = _REC.size
        end = len(data)
        for _ in range(count):
            flags, hops, attempt, seq, ts, oi, pi, ti, di, plen, back = unpack(data, pos)
            pos += size
            dests = dest_lists.get(di)
            if dests is None:
                dests = dest_lists[di] = strings[di].split("\0")
            if back:
                if back > seq:
                    raise EnvelopeError("a predecessor after its message")
                back = seq - back  # (on an envelope to several, it is ignored: predecessors())
            props = None
            ttl = -1
            shares = None
            if flags & 240:  # (one test on the path of every envelope: bits 4 to 7 are rare)
                if flags & 16:
                    n = len(dests)
                    back = [seq - b if b else 0 for b in struct.unpack_from(f">{n}I", data, pos)]
                    pos += 4 * n
                    if n < 2 or min(back) < 0:
                        raise EnvelopeError("a predecessor after its message, or a list for one destination")
                if flags & 32:
                    n = _U32.unpack_from(data, pos)[0]
                    props = data[pos + 4 : pos + 4 + n]
                    pos += 4 + n
                if flags & 64:
                    ttl = _U32.unpack_from(data, pos)[0]
                    pos += 4
                if flags & 128:
                    si = _U16.unpack_from(data, pos)[0]
                    pos += 2
                    shares = share_maps.get(si)
                    if shares is None:
                        shares = share_maps[si] = parse_shares(strings[si])
            payload = data[pos : pos + plen]
            pos += plen
            topic = strings[ti]
            qos = flags & 3
            if qos == 3 or not topic:
                raise EnvelopeError("invalid envelope flags or topic")
            msg = Message(topic, payload, qos, flags & 4 == 4, strings[oi], seq, strings[pi], ts, props)
            msg._topic_bytes = raws[ti]  # saves re-encoding it for every subscriber frame
            msg.shares = ()  # (another node's message: to no shared group here unless it says so)
            if ttl >= 0:
                msg.expiring(ttl / 1000.0 - (wall - sent if wall > sent else 0.0), now)
            if flags & 8:
                origin, sep, msg.ack_to = msg.origin.partition("\0")
                if not sep or not msg.ack_to:
                    raise EnvelopeError("an envelope to acknowledge elsewhere names no node")
                msg.origin = origin
            out.append(Envelope(msg, dests, hops, attempt, strings[di], back, shares))
        if pos != end:
            raise EnvelopeError(
                f"{end - pos} bytes after the last envelope" if pos < end else "envelope overruns its batch"
            )
        return out
    except (struct.error, IndexError, UnicodeDecodeError) as exc:
        raise EnvelopeError(f"malformed envelope batch: {exc}") from None
