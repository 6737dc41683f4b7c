"""What the simulator watches on the wire: envelope headers, and one record per message.

Pure. The envelope header reader is written here from the formats documented in
mesh/routing/envelope.py (versions 1 to 6), independently of that module's decoder,
so that a bug mirrored in the engine's encoder and decoder would show up as a
mismatch.
"""

from __future__ import annotations

import struct

__all__ = ["read_envelope_heads", "MsgRecord"]

_HEAD = struct.Struct(">BBBQd")  # version 1: flags hop_limit attempt seq timestamp
_REC2 = struct.Struct(">BBBQdHHHHI")  # version 2: the same, then string-table indexes, payload length
_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")


def read_envelope_heads(batch: bytes) -> list[tuple[str, int, int, int, tuple[str, ...]]]:
    """(origin, seq, attempt, hop_limit, destinations) of every envelope of a ``fwd`` batch."""
    if not batch:
        raise ValueError("empty envelope batch")
    if batch[0] in (2, 3, 4, 5, 6):
        return _read_v2(batch)
    if batch[0] != 1:
        raise ValueError(f"envelope batch version {batch[0]}, expected 1 to 6")
    count = _U32.unpack_from(batch, 1)[0]
    pos = 5
    out = []
    for _ in range(count):
        _flags, hops, attempt, seq, _ts = _HEAD.unpack_from(batch, pos)
        pos += _HEAD.size
        n = batch[pos]
        origin = batch[pos + 1 : pos + 1 + n].decode()
        pos += 1 + n
        pos += 2 + _U16.unpack_from(batch, pos)[0]  # publisher
        pos += 2 + _U16.unpack_from(batch, pos)[0]  # topic
        pos += 4 + _U32.unpack_from(batch, pos)[0]  # payload
        ndest = _U16.unpack_from(batch, pos)[0]
        pos += 2
        dests = []
        for _ in range(ndest):
            n = batch[pos]
            dests.append(batch[pos + 1 : pos + 1 + n].decode())
            pos += 1 + n
        out.append((origin, seq, attempt, hops, tuple(dests)))
    if pos != len(batch):
        raise ValueError(f"{len(batch) - pos} bytes after the last envelope")
    return out


def _read_v2(batch: bytes) -> list[tuple[str, int, int, int, tuple[str, ...]]]:
    """Versions 2 to 6: a string table (origins, publishers, topics, NUL-joined destination
    lists) first; version 3 adds a predecessor to each record, and one per destination to
    an envelope to several (flag 16); version 4, the MQTT 5 properties (flag 32: their
    length, four bytes, and themselves); version 5, the remaining life of a message that
    expires (flag 64: four bytes, after the properties); version 6, the shared groups its
    destinations serve (flag 128: a string's index, two bytes, after the remaining life)."""
    count = _U32.unpack_from(batch, 1)[0]
    nstrings = _U16.unpack_from(batch, 5)[0]
    pos = 15 if batch[0] >= 5 else 7  # (version 5: the sender's wall clock, 8 bytes, first)
    strings = []
    for _ in range(nstrings):
        n = _U16.unpack_from(batch, pos)[0]
        strings.append(batch[pos + 2 : pos + 2 + n].decode())
        pos += 2 + n
    out = []
    for _ in range(count):
        flags, hops, attempt, seq, _ts, oi, _pi, _ti, di, plen = _REC2.unpack_from(batch, pos)
        dests = tuple(strings[di].split("\0"))
        pos += _REC2.size
        if batch[0] >= 3:
            pos += 4  # (the predecessor of an envelope to one destination)
            if flags & 16:
                pos += 4 * len(dests)  # (each destination's predecessor)
        if batch[0] >= 4 and flags & 32:
            pos += 4 + _U32.unpack_from(batch, pos)[0]  # (the properties, before the payload)
        if batch[0] >= 5 and flags & 64:
            pos += 4  # (the remaining life in milliseconds)
        if batch[0] >= 6 and flags & 128:
            pos += 2  # (the shared groups, in the string table)
        pos += plen
        out.append((strings[oi], seq, attempt, hops, dests))
    if pos != len(batch):
        raise ValueError(f"{len(batch) - pos} bytes after the last envelope")
    return out


class MsgRecord:
    """One published message: who should get it, who did, and every copy on the way."""

    __slots__ = (
        "origin",
        "seq",
        "topic",
        "qos",
        "t",
        "expected",
        "steady",
        "copies",
        "lost_copies",
        "delivered",
        "first_at",
        "receipts",
        "engine_dests",
        "pred",
        "checked",
        "late",
        "dormant",
    )

    def __init__(self, origin: str, seq: int, topic: str, qos: int, t: float, expected: frozenset, steady: bool):
        self.origin, self.seq, self.topic, self.qos, self.t = origin, seq, topic, qos, t
        self.expected = expected  # subscriber nodes reachable from the origin at publish time
        self.steady = steady  # published while the mesh was converged
        self.copies = 0  # envelope transmissions (any attempt, lost ones too)
        self.lost_copies = 0  # transmissions the network lost for good (QoS 0 batches)
        self.delivered: dict[str, int] = {}  # node -> deliveries
        self.first_at: dict[str, float] = {}  # node -> time of the first delivery
        self.receipts: list[tuple] = []  # (to, from, attempt, dests) of every envelope that arrived
        self.engine_dests: set[str] = set()  # destinations the origin's engine chose (attempt 0)
        self.pred: dict[tuple, str] = {}  # (node, destination) -> the neighbour that copy came from
        self.checked = False
        self.late = 0  # deliveries after the settle window
        self.dormant: frozenset = frozenset()  # subscribers on crashed nodes, for QoS 1/2 custody
