"""An application message as the broker carries it, with its encoded frames cached.

Pure. One Message is shared by every subscriber it reaches; the PUBLISH frame
for QoS 0 is encoded once and reused, and the QoS 1/2 frames reuse the encoded
topic and only differ in the packet identifier.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, MutableSequence
from typing import Any, TypeVar

from .codec import encode_publish, encode_remaining_length

__all__ = ["Message", "Entry", "in_origin_order"]

_U16 = struct.Struct(">H")
T = TypeVar("T")
# the first byte of a PUBLISH at QoS 0, 1, 2 with DUP=0 and RETAIN=0 (the frames of live
# delivery), and a remaining length below 128 as its one byte: made once, not per frame
_FIRST = [bytes((0x30 | (qos << 1),)) for qos in range(3)]
_LENGTH1 = [bytes((n,)) for n in range(128)]


class Message:
    __slots__ = (
        "topic",
        "payload",
        "qos",
        "retain",
        "origin",
        "seq",
        "publisher",
        "timestamp",
        "ack_to",
        "retried",
        "props",
        "expires",
        "ttl",
        "_topic_bytes",
        "_frame0",
        "_head",
        "shares",
    )

    shares: tuple[str, ...] | None  # (see __init__: may be unset)

    def __init__(
        self,
        topic: str,
        payload: bytes,
        qos: int = 0,
        retain: bool = False,
        origin: str = "",
        seq: int = 0,
        publisher: str = "",
        timestamp: float = 0.0,
        props: bytes | None = None,
    ):
        self.topic = topic
        self.payload = payload
        self.qos = qos
        self.retain = retain
        self.origin = origin  # node that took the message from its publisher
        self.seq = seq  # per-origin sequence: (origin, seq) is mesh-wide unique
        self.publisher = publisher  # publishing ClientId
        self.timestamp = timestamp
        # "" or the node that routes this message again for its origin (a persistent
        # publisher's session moved, mesh/cluster/replica.py): the destinations acknowledge to it
        self.ack_to = ""
        # it reached this node in a retransmission from custody (mesh/routing/custody.py): late
        self.retried = False
        # (``shares``, the shared groups of this node it goes to (shared.py), is left unset
        # here, read with getattr: unset or None, every matching one (outside a mesh, and for
        # $ topics); in a mesh, the group filters ("$share/{g}/{f}") the mesh chose this node
        # for (mesh/routing/shares.py), () for none; set only on the per-message paths that
        # decide it, the envelope decoder's and the router's)
        # its MQTT 5 properties that travel with it unchanged (Payload Format Indicator, Content
        # Type, Response Topic, Correlation Data, User Properties: properties.FORWARDED), as
        # encoded, without their length; None when it has none (every 3.1.1 message)
        self.props = props
        # Message Expiry (MQTT 5): None, or when it expires on this node's clock (the ``now``
        # its callers pass); ``ttl``, its remaining life in seconds as of when it was handed to
        # the sessions it reaches (at its arrival here, or ``at`` a later time). Both travel
        # as the remaining time, never as an instant: each node counts on its own clock
        self.expires: float | None = None
        self.ttl = 0.0
        self._topic_bytes: bytes | None = None
        self._frame0: bytes | None = None
        self._head: bytes | None = None  # a QoS 1/2 frame's remaining length and topic

    def expiring(self, interval: float, now: float) -> Message:
        """This message, to expire ``interval`` seconds after ``now`` [MQTT-3.3.2-5]."""
        self.expires = now + interval
        self.ttl = interval
        return self

    def at(self, now: float) -> Message:
        """This message as it stands at ``now``: itself if it never expires, else a copy whose
        ``ttl`` is what is left of its life then (0 or less: expired, never to be delivered)."""
        expires = self.expires
        if expires is None:
            return self
        return self.copy(ttl=expires - now)

    @property
    def expired(self) -> bool:
        """Its life was over when it was last handed on (``at``)."""
        return self.expires is not None and self.ttl <= 0.0

    @property
    def msg_id(self) -> str:
        return f"{self.origin}:{self.seq}"

    @property
    def topic_bytes(self) -> bytes:
        tb = self._topic_bytes
        if tb is None:
            tb = self._topic_bytes = self.topic.encode("utf-8")
        return tb

    def frame_qos0(self) -> bytes:
        """The QoS 0, RETAIN=0 frame of live delivery [MQTT-3.3.1-9], built once."""
        frame = self._frame0
        if frame is None:
            tb = self._topic_bytes
            if tb is None:
                tb = self.topic_bytes
            payload = self.payload
            length = 2 + len(tb) + len(payload)
            if length < 128:  # (encode_publish, inlined: this runs once per message delivered)
                frame = b"".join((_FIRST[0], _LENGTH1[length], _U16.pack(len(tb)), tb, payload))
            else:
                frame = encode_publish(tb, payload)
            self._frame0 = frame
        return frame

    def frame(self, qos: int, packet_id: int | None, dup: bool = False, retain: bool = False) -> bytes:
        """The frame for one subscriber; QoS 1/2 frames share the encoded topic."""
        if qos == 0:
            if not retain:
                return self.frame_qos0()
            return encode_publish(self.topic_bytes, self.payload, 0, True)
        head = self._head
        if head is None:
            tb = self._topic_bytes
            if tb is None:
                tb = self.topic_bytes
            length = 4 + len(tb) + len(self.payload)
            rl = _LENGTH1[length] if length < 128 else encode_remaining_length(length)
            self._head = head = rl + _U16.pack(len(tb)) + tb
        if dup or retain:
            first = bytes((0x30 | (qos << 1) | (0x08 if dup else 0) | (0x01 if retain else 0),))
        else:
            first = _FIRST[qos]
        return b"".join((first, head, _U16.pack(packet_id), self.payload))

    def copy(self, **changes: Any) -> Message:
        m = Message(
            self.topic,
            self.payload,
            self.qos,
            self.retain,
            self.origin,
            self.seq,
            self.publisher,
            self.timestamp,
            self.props,
        )
        m.expires = self.expires
        m.ttl = self.ttl
        m.shares = getattr(self, "shares", None)
        for key, value in changes.items():
            setattr(m, key, value)
        return m

    def __repr__(self) -> str:
        return f"Message({self.topic!r}, {self.payload[:32]!r}, qos={self.qos}, retain={self.retain}, id={self.msg_id})"


class Entry:
    """One message on its way to one session: queued, or in flight with a packet id."""

    __slots__ = ("msg", "qos", "retain", "packet_id", "state", "key", "group", "ticket")

    def __init__(self, msg: Message, qos: int, retain: bool = False, key: int = 0, group: Any = None) -> None:
        self.msg = msg
        self.qos = qos
        self.retain = retain
        self.packet_id = 0
        self.state = 0
        self.key = key
        # the shared group (shared.py) it came through, if it did; restored from the store, its
        # share (a str) until the session is registered (shared.py ``rejoin_entries``)
        self.group = group
        # a replicated session's: the gate's ticket its PUBLISH waits for while the other
        # holders have not confirmed every step (mesh/cluster/replica.py ``_unreleased``), 0
        # once it may have left; a store keeps it as queued until then (store.py ``_snapshot``)
        self.ticket = 0

    def __repr__(self) -> str:
        return f"Entry({self.msg!r}, qos={self.qos}, pid={self.packet_id}, state={self.state})"


def in_origin_order(items: MutableSequence[T], ident: Callable[[T], tuple[str, int] | None]) -> None:
    """Put each origin's items in the order of their sequence numbers, in the places that
    origin's items hold (the others stay where they are); ``ident`` gives an item's (origin,
    seq), or None for one that stays put. What reached a session by two ways (a copy of it
    and the mesh, or two copies) leaves in the order its origin took it [MQTT-4.6.0-6]."""
    places: dict[str, list[tuple[int, int]]] = {}
    for i, item in enumerate(items):
        key = ident(item)
        if key is not None:
            places.setdefault(key[0], []).append((key[1], i))
    for at in places.values():
        if len(at) > 1 and any(at[k][0] > at[k + 1][0] for k in range(len(at) - 1)):
            moved = [items[i] for _, i in sorted(at)]
            for i, item in zip([i for _, i in at], moved, strict=True):  # (at: in index order)
                items[i] = item
