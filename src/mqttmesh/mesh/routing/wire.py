"""The mesh's two hand-written binary formats: end-to-end acknowledgements and unicast records.

Pure: bytes in, records out (and back). Leaves to its caller which link the bytes
came on and what to do with a record; a payload that does not parse raises
``MeshProtocolError``, and the caller closes the link that sent it.

    e2e   per group:  to:str8 from:str8 count:u32 seq:u64 * count
    uni   sent:f64, then per record: hops:u8 age:u32 length:u32, then dest:str8 from:str8
          kind:str8 body (length counts the three names and the body)

``sent`` is the sending node's wall clock (Unix seconds) when it sent the message, and a
record's ``age`` the milliseconds it had spent on the way before that hop (0 from its
origin). A node that reads a record adds what its own wall clock says passed since
``sent`` (never less than nothing), so a record knows how long it was on the way, time
unread in a paused node's socket included: the cluster's messages carry the remaining
life of messages (Message Expiry) and of sessions (Session Expiry), and take that off
(mesh/cluster/cluster_wire.py ``decode``). As for envelope batches (envelope.py), two
clocks that disagree age a record by their difference when the receiver's is ahead.

``str8`` is one length byte and that many bytes of UTF-8. Application messages
travel in envelope batches (envelope.py); advertisements and link control are JSON.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Sequence
from typing import NamedTuple

__all__ = [
    "MeshProtocolError",
    "AckGroup",
    "UnicastRecord",
    "encode_acks",
    "decode_acks",
    "encode_unicast",
    "encode_unicasts",
    "decode_unicasts",
]


class MeshProtocolError(ValueError):
    """A neighbour sent something that does not parse; its link should be closed."""


class AckGroup(NamedTuple):
    """Sequence numbers of ``to``'s messages that node ``frm`` acknowledges end to end."""

    to: str
    frm: str
    seqs: Sequence[int]


class UnicastRecord(NamedTuple):
    dest: str
    frm: str
    hops: int  # hops left: a relay passes the record on with one fewer
    kind: str
    body: bytes
    age_ms: int = 0  # milliseconds on the way so far (at decode: up to the reader's wall clock)


_ACK_HEAD = struct.Struct(">I")


def encode_acks(groups: Sequence[AckGroup]) -> bytes:
    parts = []
    for to, frm, seqs in groups:
        t, f = to.encode(), frm.encode()
        parts.append(bytes((len(t),)) + t + bytes((len(f),)) + f + _ACK_HEAD.pack(len(seqs)))
        parts.append(struct.pack(f">{len(seqs)}Q", *seqs))
    return b"".join(parts)


def decode_acks(payload: bytes) -> list[AckGroup]:
    groups = []
    pos, size = 0, len(payload)
    try:
        while pos < size:
            n = payload[pos]
            to = payload[pos + 1 : pos + 1 + n].decode()
            pos += 1 + n
            n = payload[pos]
            frm = payload[pos + 1 : pos + 1 + n].decode()
            pos += 1 + n
            count = _ACK_HEAD.unpack_from(payload, pos)[0]
            pos += 4
            seqs = struct.unpack_from(f">{count}Q", payload, pos)
            pos += 8 * count
            groups.append(AckGroup(to, frm, seqs))
    except (struct.error, IndexError, UnicodeDecodeError) as exc:
        raise MeshProtocolError(f"malformed e2e acknowledgements: {exc}") from None
    return groups


_UNI_SENT = struct.Struct(">d")
_UNI_HEAD = struct.Struct(">BII")
_AGE_MAX = 0xFFFFFFFF


def encode_unicast(dest: str, frm: str, hops: int, kind: str, body: bytes, age_ms: int = 0) -> bytes:
    """One record (``encode_unicasts`` puts records in a message)."""
    names = b"".join(bytes((len(x),)) + x for x in (dest.encode(), frm.encode(), kind.encode()))
    return _UNI_HEAD.pack(hops, min(age_ms, _AGE_MAX), len(names) + len(body)) + names + body


def encode_unicasts(records: Sequence[bytes], sent: float) -> bytes:
    """A ``uni`` message of encoded ``records``, sent at ``sent`` on the wall clock."""
    return _UNI_SENT.pack(sent) + b"".join(records)


def decode_unicasts(payload: bytes, wall: float) -> Iterator[UnicastRecord]:
    """The records of a ``uni`` message read at ``wall`` (the wall clock), one by one: a
    malformed record raises when reached, after the records before it were yielded (and
    relayed: each is independent)."""
    pos, size = _UNI_SENT.size, len(payload)
    try:
        (sent,) = _UNI_SENT.unpack_from(payload, 0)
        transit = int((wall - sent) * 1000.0) if wall > sent else 0  # (NaN: 0)
        while pos < size:
            hops, age, length = _UNI_HEAD.unpack_from(payload, pos)
            pos += _UNI_HEAD.size
            end = pos + length
            if end > size:
                raise MeshProtocolError("unicast record overruns its message")
            fields = []
            for _ in range(3):
                n = payload[pos]
                fields.append(payload[pos + 1 : pos + 1 + n].decode())
                pos += 1 + n
            if pos > end:
                raise MeshProtocolError("unicast header overruns its record")
            yield UnicastRecord(fields[0], fields[1], hops, fields[2], bytes(payload[pos:end]), age + transit)
            pos = end
    except (struct.error, IndexError, UnicodeDecodeError, OverflowError) as exc:
        raise MeshProtocolError(f"malformed unicast: {exc}") from None
