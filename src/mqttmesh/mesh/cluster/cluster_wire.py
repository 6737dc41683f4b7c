"""The cluster's messages (mesh/cluster/cluster.py) as types: one frozen dataclass per kind.

Pure. A cluster message travels as a mesh unicast: a kind (``reg.*``, ``sess.*``,
``ret.*``) and a JSON body. ``encode`` writes the bodies these nodes have always written,
key for key and in the same order (tests/mesh/test_cluster_unit.py pins the bytes of every
kind), so nodes of the previous release read them unchanged. ``decode`` checks a body once,
where it comes in, and raises ClusterWireError naming the kind and the key at fault, so the
handlers behind it read typed fields instead of dict keys and list positions. The values
inside bodies (snapshots, retained items...) are in mesh/cluster/cluster_values.py, the base
class of every kind in mesh/cluster/wire_base.py, and the registry's messages with their
records (wills, registrations) in mesh/cluster/registry_wire.py; every name of those two is
importable from here as well.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple, Self

from .cluster_values import (
    ClusterWireError,
    Forwarded,
    RetainedAck,
    RetainedItem,
    Settlement,
    Snapshot,
    SnapshotEntry,
    _bool,
    _int,
    _items,
    _key,
    _obj,
    _str,
)
from .registry_wire import (
    RegClaim,
    RegCopy,
    RegGrant,
    Registration,
    RegKick,
    RegRegister,
    RegRelease,
    WireWill,
)
from .wire_base import Wire, _Flat

if TYPE_CHECKING:
    from ...message import Message

__all__ = [
    "ClusterWireError",
    "Wire",
    "Outbox",
    "ToNode",
    "WillDue",
    "WireWill",
    "Registration",
    "Settlement",
    "RetainedItem",
    "RetainedAck",
    "Forwarded",
    "SnapshotEntry",
    "Snapshot",
    "RegClaim",
    "RegGrant",
    "RegKick",
    "RegRelease",
    "RegRegister",
    "RegCopy",
    "SessFetch",
    "SessState",
    "SessCopy",
    "SessMerge",
    "SessSettle",
    "SessAck",
    "SessSubs",
    "SessDiscard",
    "SessFwd",
    "RetSet",
    "RetAck",
    "RetQuery",
    "RetReply",
    "KINDS",
    "decode",
]


# --------------------------------------------------------------------------- messages


class ToNode(NamedTuple):
    """An answer of a cluster protocol: ``msg`` for node ``dest`` (this node included: the
    Cluster hands it back to itself, after the call that made it)."""

    dest: str
    msg: Wire
    later: bool = False  # (nobody waits on it: it goes within mesh.batch_delay, ports.UnicastPort)


class Outbox:
    """What the cluster's parts (hand-over, replication, retained owners) have to say to
    other nodes, or to this one, in the order they said it: data, which the Cluster takes and
    sends after each of its calls and at every flush (``Cluster.send_out``). The first message
    after a take asks the I/O layer for a flush this loop iteration (``wake``, MeshIO.flush_soon),
    for what the parts say outside the Cluster's calls (a session's subscriptions, a redirect);
    a message put ``later`` (an answer nobody waits on) asks for one within mesh.batch_delay
    (``wake_later``, MeshIO.flush_later) unless one was asked for this iteration."""

    __slots__ = ("items", "_wake", "_wake_later", "_soon")

    def __init__(self, wake: Callable[[], None] = lambda: None, wake_later: Callable[[], None] | None = None):
        self.items: list[ToNode] = []
        self._wake = wake
        self._wake_later = wake if wake_later is None else wake_later
        self._soon = False  # (a flush this iteration was asked for since the last take)

    def put(self, dest: str, msg: Wire, later: bool = False) -> None:
        if later:
            if not self.items:
                self._wake_later()
            self.items.append(ToNode(dest, msg, True))
            return
        if not self._soon:
            self._soon = True
            self._wake()
        self.items.append(ToNode(dest, msg))

    def take(self) -> list[ToNode]:
        items = self.items
        if items:
            self.items = []
        self._soon = False
        return items


class WillDue(NamedTuple):
    """An answer of the registrar: publish this will here. ``msg.seq`` 0: a will registered
    before its number was reserved, numbered by this node as it publishes it."""

    msg: Message


# -- session holders (mesh/cluster/claimant.py gathers, mesh/cluster/holders.py keeps)


@dataclass(frozen=True, slots=True)
class SessFetch(_Flat):
    KIND: ClassVar[str] = "sess.fetch"
    cid: str
    conn: str
    epoch: int
    to: str


@dataclass(frozen=True, slots=True)
class SessState(Wire):
    KIND: ClassVar[str] = "sess.state"
    cid: str
    conn: str
    snap: Snapshot | None  # None: this holder has no replicated session of that ClientId
    # this node's last connection of the ClientId ended here and its session with it (or its
    # interval since): Claimant.session_ended (peer protocol 11; absent: False)
    ended: bool = False

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"cid": self.cid, "conn": self.conn}
        out["snap"] = None if self.snap is None else self.snap.to_json()
        if self.ended:
            out["ended"] = True
        return out

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> Self:
        w = cls.KIND
        snap = _key(obj, "snap", w)
        return cls(
            _str(_key(obj, "cid", w), w, "cid"),
            _str(_key(obj, "conn", w), w, "conn"),
            None if snap is None else Snapshot.from_json(snap, f"{w} snap"),
            _bool(obj.get("ended", False), w, "ended"),
        )

    def aged(self, ms: int) -> Self:
        return self if self.snap is None else replace(self, snap=self.snap.aged(ms))


@dataclass(frozen=True, slots=True)
class SessCopy(Wire):
    """The session of a client connected at the sender: replace yours (the body is the snapshot)."""

    KIND: ClassVar[str] = "sess.copy"
    snap: Snapshot

    def to_json(self) -> dict[str, Any]:
        return self.snap.to_json()

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> Self:
        return cls(Snapshot.from_json(obj, cls.KIND))

    def aged(self, ms: int) -> Self:
        return replace(self, snap=self.snap.aged(ms))


@dataclass(frozen=True, slots=True)
class SessMerge(Wire):
    """An offline session nobody coordinates: merge it with yours (the body is the snapshot)."""

    KIND: ClassVar[str] = "sess.merge"
    snap: Snapshot

    def to_json(self) -> dict[str, Any]:
        return self.snap.to_json()

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> Self:
        return cls(Snapshot.from_json(obj, cls.KIND))

    def aged(self, ms: int) -> Self:
        return replace(self, snap=self.snap.aged(ms))


@dataclass(frozen=True, slots=True)
class SessSettle(Wire):
    KIND: ClassVar[str] = "sess.settle"
    cid: str
    epoch: int
    items: list[Settlement]
    version: int  # the session's settlement count after ``items`` (replica.py)
    # no frame waits for these: answer within mesh.batch_delay (holders.py ``flush``); absent
    # (a node of before 2026-12-01), at once
    later: bool = False

    def to_json(self) -> dict[str, Any]:
        items = [i if i.msg is not None else i[:4] for i in self.items]  # (four fields but an "in")
        body = {"cid": self.cid, "epoch": self.epoch, "items": items, "version": self.version}
        if self.later:
            body["later"] = True
        return body

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> Self:
        w = cls.KIND
        return cls(
            _str(_key(obj, "cid", w), w, "cid"),
            _int(_key(obj, "epoch", w), w, "epoch"),
            [Settlement.from_json(i, iw) for iw, i in _items(obj, "items", w)],
            _int(_key(obj, "version", w), w, "version"),
            _bool(obj.get("later", False), w, "later"),
        )

    def aged(self, ms: int) -> Self:
        return replace(self, items=[i.aged(ms) for i in self.items])


@dataclass(frozen=True, slots=True)
class SessAck(_Flat):
    """A holder's answer to a settlement batch or a copy: the session's (epoch, version) it
    now holds. ``version`` -1: it could not apply them (no copy, or an older epoch), send a
    copy; -2: it serves the client itself at ``epoch``."""

    KIND: ClassVar[str] = "sess.ack"
    cid: str
    epoch: int
    version: int


@dataclass(frozen=True, slots=True)
class SessSubs(Wire):
    KIND: ClassVar[str] = "sess.subs"
    cid: str
    version: int
    subs: dict[str, int]

    def to_json(self) -> dict[str, Any]:
        return {"cid": self.cid, "version": self.version, "subs": self.subs}

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> Self:
        w = cls.KIND
        subs = _obj(_key(obj, "subs", w), f"{w} subs")
        for topic_filter, qos in subs.items():
            _int(qos, f"{w} subs", topic_filter)
        return cls(_str(_key(obj, "cid", w), w, "cid"), _int(_key(obj, "version", w), w, "version"), subs)


@dataclass(frozen=True, slots=True)
class SessDiscard(_Flat):
    KIND: ClassVar[str] = "sess.discard"
    cid: str
    epoch: int


@dataclass(frozen=True, slots=True)
class SessFwd(Wire):
    KIND: ClassVar[str] = "sess.fwd"
    cid: str
    msg: Forwarded

    def to_json(self) -> dict[str, Any]:
        return {"cid": self.cid, "msg": self.msg}

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> Self:
        w = cls.KIND
        return cls(_str(_key(obj, "cid", w), w, "cid"), Forwarded.from_json(_key(obj, "msg", w), f"{w} msg"))

    def aged(self, ms: int) -> Self:
        return replace(self, msg=self.msg.aged(ms))


# -- retained messages (mesh/cluster/retained.py)


@dataclass(frozen=True, slots=True)
class RetSet(Wire):
    KIND: ClassVar[str] = "ret.set"
    items: list[RetainedItem]

    def to_json(self) -> dict[str, Any]:
        return {"items": self.items}

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> Self:
        return cls([RetainedItem.from_json(i, w) for w, i in _items(obj, "items", cls.KIND)])

    def aged(self, ms: int) -> Self:
        return replace(self, items=[i.aged(ms) for i in self.items])


@dataclass(frozen=True, slots=True)
class RetAck(Wire):
    KIND: ClassVar[str] = "ret.ack"
    items: list[RetainedAck]

    def to_json(self) -> dict[str, Any]:
        return {"items": self.items}

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> Self:
        return cls([RetainedAck.from_json(i, w) for w, i in _items(obj, "items", cls.KIND)])


@dataclass(frozen=True, slots=True)
class RetQuery(_Flat):
    KIND: ClassVar[str] = "ret.query"
    qid: int
    filter: str


@dataclass(frozen=True, slots=True)
class RetReply(Wire):
    KIND: ClassVar[str] = "ret.reply"
    qid: int
    items: list[RetainedItem]

    def to_json(self) -> dict[str, Any]:
        return {"qid": self.qid, "items": self.items}

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> Self:
        w = cls.KIND
        return cls(
            _int(_key(obj, "qid", w), w, "qid"),
            [RetainedItem.from_json(i, iw) for iw, i in _items(obj, "items", w)],
        )

    def aged(self, ms: int) -> Self:
        return replace(self, items=[i.aged(ms) for i in self.items])


KINDS: dict[str, type[Wire]] = {
    cls.KIND: cls
    for cls in (
        RegClaim,
        RegGrant,
        RegKick,
        RegRelease,
        RegRegister,
        RegCopy,
        SessFetch,
        SessState,
        SessCopy,
        SessMerge,
        SessSettle,
        SessAck,
        SessSubs,
        SessDiscard,
        SessFwd,
        RetSet,
        RetAck,
        RetQuery,
        RetReply,
    )
}


def decode(kind: str, payload: bytes, age_ms: int = 0) -> Wire:
    """The message of ``kind`` in ``payload``, ``age_ms`` milliseconds on the way (the
    remaining lives it carries are that much shorter); ClusterWireError (a ValueError) if
    it is none."""
    cls = KINDS.get(kind)
    if cls is None:
        raise ClusterWireError(f"unknown cluster message kind {kind!r}")
    try:
        obj = json.loads(payload)
    except ValueError as exc:  # (bad UTF-8 as well as bad JSON)
        raise ClusterWireError(f"{kind}: not JSON ({exc})") from None
    msg = cls.from_json(_obj(obj, kind))
    return msg.aged(age_ms) if age_ms > 0 else msg
