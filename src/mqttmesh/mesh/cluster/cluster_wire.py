"""The cluster's messages (mesh/cluster/cluster.py) as types: one frozen dataclass per kind.

Pure. A cluster message travels as a mesh unicast: a kind (``reg.*``, ``sess.*``,
``ret.*``) and a JSON body. ``encode`` writes the bodies these nodes have always written,
key for key and in the same order (tests/mesh/test_cluster_unit.py pins the bytes of every
kind), so nodes of the previous release read them unchanged. ``decode`` checks a body once,
where it comes in, and raises ClusterWireError naming the kind and the key at fault, so the
handlers behind it read typed fields instead of dict keys and list positions. The values
inside bodies (registrations, snapshots, retained items...) are in mesh/cluster/cluster_values.py.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import MISSING, dataclass, fields, replace
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple, Self

from .cluster_values import (
    ClusterWireError,
    Forwarded,
    Registration,
    RetainedAck,
    RetainedItem,
    Settlement,
    Snapshot,
    SnapshotEntry,
    WireWill,
    _bool,
    _int,
    _items,
    _key,
    _num,
    _obj,
    _opt_str,
    _str,
    _will_json,
)

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


class Wire:
    """A cluster message: ``KIND`` names it on the wire."""

    __slots__ = ()
    KIND: ClassVar[str]

    def to_json(self) -> dict[str, Any]:
        raise NotImplementedError

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> Self:
        raise NotImplementedError

    def encode(self) -> bytes:
        return json.dumps(self.to_json()).encode()

    def aged(self, ms: int) -> Self:
        """As it stands after ``ms`` milliseconds on the way (routing/wire.py ``age``): the
        remaining lives it carries (Message Expiry, Session Expiry) less that. Most carry none."""
        return self


class _Flat(Wire):
    """A message whose fields are strings, integers and booleans, under their own names in
    field order on the wire (the JSON of before, key for key); a field with a default is
    left out at its default, and read as it when absent."""

    __slots__ = ()

    def to_json(self) -> dict[str, Any]:
        out = {}
        for f in fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            if f.default is MISSING or value != f.default:
                out[f.name] = value
        return out

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> Self:
        w = cls.KIND
        values = []
        for f in fields(cls):  # type: ignore[arg-type]
            raw = _key(obj, f.name, w) if f.default is MISSING else obj.get(f.name, f.default)
            values.append(_READ[str(f.type)](raw, w, f.name))
        return cls(*values)


_READ = {"str": _str, "int": _int, "bool": _bool}


class ToNode(NamedTuple):
    """An answer of a cluster protocol: ``msg`` for node ``dest`` (this node included: the
    Cluster hands it back to itself, after the call that made it)."""

    dest: str
    msg: Wire


class Outbox:
    """What the cluster's parts (hand-over, replication, retained owners) have to say to
    other nodes, or to this one, in the order they said it: data, which the Cluster takes and
    sends after each of its calls and at every flush (``Cluster.send_out``). The first message
    after a take asks the I/O layer for a flush this loop iteration (``wake``, MeshIO.flush_soon),
    for what the parts say outside the Cluster's calls (a session's subscriptions, a redirect)."""

    __slots__ = ("items", "_wake")

    def __init__(self, wake: Callable[[], None] = lambda: None):
        self.items: list[ToNode] = []
        self._wake = wake

    def put(self, dest: str, msg: Wire) -> None:
        if not self.items:
            self._wake()
        self.items.append(ToNode(dest, msg))

    def take(self) -> list[ToNode]:
        items = self.items
        if items:
            self.items = []
        return items


class WillDue(NamedTuple):
    """An answer of the registrar: publish this will here. ``msg.seq`` 0: a will registered
    before its number was reserved, numbered by this node as it publishes it."""

    msg: Message


# -- the registry (mesh/cluster/registry.py answers claims; mesh/cluster/claimant.py makes them)


@dataclass(frozen=True, slots=True)
class RegClaim(Wire):
    KIND: ClassVar[str] = "reg.claim"
    cid: str
    node: str
    inc: int
    conn: str
    clean: bool
    will: WireWill | None
    at: float
    # its session's Session Expiry Interval (0xFFFFFFFF: never): the registrar ends the
    # session that long after the connection ends, also when the connection's node dies
    expiry: int = 0xFFFFFFFF

    def to_json(self) -> dict[str, Any]:
        out = {
            "cid": self.cid,
            "node": self.node,
            "inc": self.inc,
            "conn": self.conn,
            "clean": self.clean,
            "will": _will_json(self.will),
            "at": self.at,
        }
        if self.expiry != 0xFFFFFFFF:
            out["expiry"] = self.expiry
        return out

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> Self:
        w = cls.KIND
        return cls(
            _str(_key(obj, "cid", w), w, "cid"),
            _str(_key(obj, "node", w), w, "node"),
            _int(_key(obj, "inc", w), w, "inc"),
            _str(_key(obj, "conn", w), w, "conn"),
            _bool(_key(obj, "clean", w), w, "clean"),
            WireWill.from_json(_key(obj, "will", w), w),
            _num(_key(obj, "at", w), w, "at"),
            _int(obj.get("expiry", 0xFFFFFFFF), w, "expiry"),
        )


@dataclass(frozen=True, slots=True)
class RegGrant(Wire):
    KIND: ClassVar[str] = "reg.grant"
    cid: str
    conn: str
    epoch: int
    prev: str | None  # the node that held the ClientId before
    kept: int = 0  # the epoch of that claim if it kept a session (CleanSession=0), else 0
    # the session the ClientId had expired (MQTT 5 Session Expiry Interval): a copy found
    # anywhere is a leftover (of a node that did not hear of it in time) and is discarded
    expired: bool = False

    def to_json(self) -> dict[str, Any]:
        out = {"cid": self.cid, "conn": self.conn, "epoch": self.epoch, "prev": self.prev, "kept": self.kept}
        if self.expired:
            out["expired"] = True
        return out

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> Self:
        w = cls.KIND
        return cls(
            _str(_key(obj, "cid", w), w, "cid"),
            _str(_key(obj, "conn", w), w, "conn"),
            _int(_key(obj, "epoch", w), w, "epoch"),
            _opt_str(_key(obj, "prev", w), w, "prev"),
            _int(_key(obj, "kept", w), w, "kept"),
            _bool(obj.get("expired", False), w, "expired"),
        )


@dataclass(frozen=True, slots=True)
class RegKick(Wire):
    KIND: ClassVar[str] = "reg.kick"
    cid: str
    conn: str
    epoch: int
    by: str | None  # the node that took the ClientId (only for the log line: may be absent)

    def to_json(self) -> dict[str, Any]:
        return {"cid": self.cid, "conn": self.conn, "epoch": self.epoch, "by": self.by}

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> Self:
        w = cls.KIND
        return cls(
            _str(_key(obj, "cid", w), w, "cid"),
            _str(_key(obj, "conn", w), w, "conn"),
            _int(_key(obj, "epoch", w), w, "epoch"),
            _opt_str(obj.get("by"), w, "by"),
        )


@dataclass(frozen=True, slots=True)
class RegRelease(Wire):
    KIND: ClassVar[str] = "reg.release"
    cid: str
    conn: str
    epoch: int
    node: str
    # the connection ended without a DISCONNECT that deletes the will, whose Will Delay
    # Interval defers it: the registrar publishes it when due (registry.py)
    delayed: bool
    # the session's Session Expiry Interval (session.KEPT: never): the registrar keeps no
    # session for the ClientId once it passed, and publishes a delayed will by then
    expiry: int
    # the claim was never accepted (CONNACK 0x03, or its client left before it): it resumed
    # nothing, and the session ends as the claim found it (peer protocol 10; absent: False)
    refused: bool = False
    # how long ago the connection ended, in ms, as it arrives (the sender's time since the
    # end plus the way, ``aged``): a release re-sent after a partition or a link down says
    # when the session's interval and the will's delay began, not when it came (peer
    # protocol 11; absent: 0, it ended as it was sent)
    ago: int = 0
    # the delayed will itself: a registrar that holds no entry for the ClientId (the one on
    # this side of a partition, which never had a copy) keeps it and publishes it when due
    # (peer protocol 11; absent: none)
    will: WireWill | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "cid": self.cid,
            "conn": self.conn,
            "epoch": self.epoch,
            "node": self.node,
            "delayed": self.delayed,
            "expiry": self.expiry,
        }
        if self.refused:
            out["refused"] = True
        if self.ago:
            out["ago"] = self.ago
        if self.will is not None:
            out["will"] = self.will.to_json()
        return out

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> Self:
        w = cls.KIND
        return cls(
            _str(_key(obj, "cid", w), w, "cid"),
            _str(_key(obj, "conn", w), w, "conn"),
            _int(_key(obj, "epoch", w), w, "epoch"),
            _str(_key(obj, "node", w), w, "node"),
            _bool(_key(obj, "delayed", w), w, "delayed"),
            _int(_key(obj, "expiry", w), w, "expiry"),
            _bool(obj.get("refused", False), w, "refused"),
            _int(obj.get("ago", 0), w, "ago"),
            WireWill.from_json(obj.get("will"), w),
        )

    def aged(self, ms: int) -> Self:
        return replace(self, ago=self.ago + ms)


@dataclass(frozen=True, slots=True)
class RegRegister(Wire):
    KIND: ClassVar[str] = "reg.register"
    cid: str
    node: str
    inc: int
    conn: str
    epoch: int
    clean: bool
    will: WireWill | None
    at: float
    # its session's Session Expiry Interval (0xFFFFFFFF: never): the registrar ends the
    # session that long after the connection ends, also when the connection's node dies
    expiry: int = 0xFFFFFFFF

    def to_json(self) -> dict[str, Any]:
        out = {
            "cid": self.cid,
            "node": self.node,
            "inc": self.inc,
            "conn": self.conn,
            "epoch": self.epoch,
            "clean": self.clean,
            "will": _will_json(self.will),
            "at": self.at,
        }
        if self.expiry != 0xFFFFFFFF:
            out["expiry"] = self.expiry
        return out

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> Self:
        w = cls.KIND
        return cls(
            _str(_key(obj, "cid", w), w, "cid"),
            _str(_key(obj, "node", w), w, "node"),
            _int(_key(obj, "inc", w), w, "inc"),
            _str(_key(obj, "conn", w), w, "conn"),
            _int(_key(obj, "epoch", w), w, "epoch"),
            _bool(_key(obj, "clean", w), w, "clean"),
            WireWill.from_json(_key(obj, "will", w), w),
            _num(_key(obj, "at", w), w, "at"),
            _int(obj.get("expiry", 0xFFFFFFFF), w, "expiry"),
        )


@dataclass(frozen=True, slots=True)
class RegCopy(Wire):
    KIND: ClassVar[str] = "reg.copy"
    entries: list[Registration]

    def to_json(self) -> dict[str, Any]:
        return {"entries": [e.to_json() for e in self.entries]}

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> Self:
        return cls([Registration.from_json(e, w) for w, e in _items(obj, "entries", cls.KIND)])


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

    def to_json(self) -> dict[str, Any]:
        return {"cid": self.cid, "conn": self.conn, "snap": None if self.snap is None else self.snap.to_json()}

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> Self:
        w = cls.KIND
        snap = _key(obj, "snap", w)
        return cls(
            _str(_key(obj, "cid", w), w, "cid"),
            _str(_key(obj, "conn", w), w, "conn"),
            None if snap is None else Snapshot.from_json(snap, f"{w} snap"),
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

    def to_json(self) -> dict[str, Any]:
        items = [i if i.msg is not None else i[:4] for i in self.items]  # (four fields but an "in")
        return {"cid": self.cid, "epoch": self.epoch, "items": items, "version": self.version}

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> Self:
        w = cls.KIND
        return cls(
            _str(_key(obj, "cid", w), w, "cid"),
            _int(_key(obj, "epoch", w), w, "epoch"),
            [Settlement.from_json(i, iw) for iw, i in _items(obj, "items", w)],
            _int(_key(obj, "version", w), w, "version"),
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
