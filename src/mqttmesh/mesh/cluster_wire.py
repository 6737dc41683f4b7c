"""The cluster's messages (mesh/cluster.py) as types: one frozen dataclass per kind.

Pure. A cluster message travels as a mesh unicast: a kind (``reg.*``, ``sess.*``,
``ret.*``) and a JSON body. ``encode`` writes the bodies these nodes have always written,
key for key and in the same order (tests/mesh/test_cluster_unit.py pins the bytes of every
kind), so nodes of the previous release read them unchanged. ``decode`` checks a body once,
where it comes in, and raises ClusterWireError naming the kind and the key at fault, so the
handlers behind it read typed fields instead of dict keys and list positions.

Record types inside bodies: a NamedTuple where the wire has a JSON array (its fields in
array order: ``json.dumps`` writes a NamedTuple as the array), a dataclass where it has an
object.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple, Self

__all__ = [
    "ClusterWireError",
    "Wire",
    "SendFn",
    "SendOutFn",
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


class ClusterWireError(ValueError):
    """A cluster message body that is not what its kind says (or an unknown kind)."""


# --------------------------------------------------------------------------- checking JSON
# `where` names the kind and, inside a body, the record: "sess.copy entries[3]"


def _obj(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ClusterWireError(f"{where}: not a JSON object")
    return value


def _key(obj: dict[str, Any], key: str, where: str) -> Any:
    try:
        return obj[key]
    except KeyError:
        raise ClusterWireError(f"{where}: missing {key!r}") from None


def _str(value: Any, where: str, key: str) -> str:
    if not isinstance(value, str):
        raise ClusterWireError(f"{where}: {key!r} is not a string")
    return value


def _opt_str(value: Any, where: str, key: str) -> str | None:
    return None if value is None else _str(value, where, key)


def _int(value: Any, where: str, key: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise ClusterWireError(f"{where}: {key!r} is not an integer")
    return value


def _num(value: Any, where: str, key: str) -> float:
    # kept as it came (an int stays an int), so that a body re-sent is the same bytes
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise ClusterWireError(f"{where}: {key!r} is not a number")
    return value


def _bool(value: Any, where: str, key: str) -> bool:
    if not isinstance(value, bool):
        raise ClusterWireError(f"{where}: {key!r} is not true or false")
    return value


def _list(value: Any, where: str, key: str) -> list[Any]:
    if not isinstance(value, list):
        raise ClusterWireError(f"{where}: {key!r} is not a list")
    return value


def _array(value: Any, n: int, where: str) -> list[Any]:
    if not isinstance(value, list) or len(value) != n:
        raise ClusterWireError(f"{where}: not an array of {n}")
    return value


def _items(obj: dict[str, Any], key: str, where: str) -> list[tuple[str, Any]]:
    """The elements of list ``key`` of ``obj``, each with its place for messages."""
    return [(f"{where} {key}[{i}]", v) for i, v in enumerate(_list(_key(obj, key, where), where, key))]


# --------------------------------------------------------------------------- records


@dataclass(frozen=True, slots=True)
class WireWill:
    """A client's will as the registrar keeps it (payload in base64)."""

    topic: str
    payload_b64: str
    qos: int
    retain: bool

    def to_json(self) -> dict[str, Any]:
        return {"topic": self.topic, "payload": self.payload_b64, "qos": self.qos, "retain": self.retain}

    @classmethod
    def from_json(cls, value: Any, where: str) -> WireWill | None:
        if value is None:
            return None
        where = f"{where} will"
        o = _obj(value, where)
        return cls(
            _str(_key(o, "topic", where), where, "topic"),
            _str(_key(o, "payload", where), where, "payload"),
            _int(_key(o, "qos", where), where, "qos"),
            _bool(_key(o, "retain", where), where, "retain"),
        )


def _will_json(will: WireWill | None) -> dict[str, Any] | None:
    return None if will is None else will.to_json()


@dataclass(frozen=True, slots=True)
class Registration:
    """A registrar's entry for one ClientId: who holds it, since which epoch, its will."""

    cid: str
    node: str
    inc: int
    conn: str
    epoch: int
    clean: bool
    will: WireWill | None
    connected: bool
    at: float  # wall-clock seconds of the claim (the split-brain tie-break)

    def to_json(self) -> dict[str, Any]:
        return {
            "cid": self.cid,
            "node": self.node,
            "inc": self.inc,
            "conn": self.conn,
            "epoch": self.epoch,
            "clean": self.clean,
            "will": _will_json(self.will),
            "connected": self.connected,
            "at": self.at,
        }

    @classmethod
    def from_json(cls, value: Any, where: str) -> Registration:
        o = _obj(value, where)
        return cls(
            _str(_key(o, "cid", where), where, "cid"),
            _str(_key(o, "node", where), where, "node"),
            _int(_key(o, "inc", where), where, "inc"),
            _str(_key(o, "conn", where), where, "conn"),
            _int(_key(o, "epoch", where), where, "epoch"),
            _bool(_key(o, "clean", where), where, "clean"),
            WireWill.from_json(_key(o, "will", where), where),
            _bool(_key(o, "connected", where), where, "connected"),
            _num(_key(o, "at", where), where, "at"),
        )


class Settlement(NamedTuple):
    """What the holder a client is on did with one message: "sent", "rel" or "done"."""

    origin: str
    seq: int
    state: str
    pid: int

    @classmethod
    def from_json(cls, value: Any, where: str) -> Settlement:
        a = _array(value, 4, where)
        return cls(_str(a[0], where, "origin"), _int(a[1], where, "seq"), _str(a[2], where, "state"), _int(a[3], where, "pid"))


class RetainedItem(NamedTuple):
    """One retained message (an empty payload: a tombstone); newest (ts, origin, seq) wins."""

    topic: str
    payload_b64: str
    qos: int
    ts: float
    origin: str
    seq: int
    publisher: str

    @classmethod
    def from_json(cls, value: Any, where: str) -> RetainedItem:
        a = _array(value, 7, where)
        return cls(
            _str(a[0], where, "topic"),
            _str(a[1], where, "payload"),
            _int(a[2], where, "qos"),
            _num(a[3], where, "ts"),
            _str(a[4], where, "origin"),
            _int(a[5], where, "seq"),
            _str(a[6], where, "publisher"),
        )


class RetainedAck(NamedTuple):
    """An owner has this version of a retained topic."""

    topic: str
    ts: float
    origin: str
    seq: int

    @classmethod
    def from_json(cls, value: Any, where: str) -> RetainedAck:
        a = _array(value, 4, where)
        return cls(_str(a[0], where, "topic"), _num(a[1], where, "ts"), _str(a[2], where, "origin"), _int(a[3], where, "seq"))


class Forwarded(NamedTuple):
    """A message a holder forwards to the node its client moved to."""

    topic: str
    payload_b64: str
    qos: int
    retain: bool
    origin: str
    seq: int
    publisher: str
    ts: float

    @classmethod
    def from_json(cls, value: Any, where: str) -> Forwarded:
        a = _array(value, 8, where)
        return cls(
            _str(a[0], where, "topic"),
            _str(a[1], where, "payload"),
            _int(a[2], where, "qos"),
            _bool(a[3], where, "retain"),
            _str(a[4], where, "origin"),
            _int(a[5], where, "seq"),
            _str(a[6], where, "publisher"),
            _num(a[7], where, "ts"),
        )


class SnapshotEntry(NamedTuple):
    """One message of a session snapshot: queued (state 0) or in flight with its packet id."""

    origin: str
    seq: int
    topic: str
    payload_b64: str
    msg_qos: int
    qos: int  # as granted to this session
    pid: int
    state: int  # 0 queued, session.SENT_PUBLISH, session.SENT_PUBREL
    publisher: str
    ts: float

    @classmethod
    def from_json(cls, value: Any, where: str) -> SnapshotEntry:
        a = _array(value, 10, where)
        return cls(
            _str(a[0], where, "origin"),
            _int(a[1], where, "seq"),
            _str(a[2], where, "topic"),
            _str(a[3], where, "payload"),
            _int(a[4], where, "msg_qos"),
            _int(a[5], where, "qos"),
            _int(a[6], where, "pid"),
            _int(a[7], where, "state"),
            _str(a[8], where, "publisher"),
            _num(a[9], where, "ts"),
        )


@dataclass(frozen=True, slots=True)
class Snapshot:
    """A persistent session as one holder sends it to another (mesh/replica.py makes,
    merges and installs them)."""

    cid: str
    subs: dict[str, int]
    subs_version: int
    entries: list[SnapshotEntry]
    done: list[tuple[str, int]]  # settled message ids (origin, seq), oldest first
    rel: list[int]  # inbound QoS 2 packet ids between PUBREC and PUBREL
    active: str | None  # the node the client was last on
    epoch: int

    def to_json(self) -> dict[str, Any]:
        return {
            "cid": self.cid,
            "subs": self.subs,
            "subs_version": self.subs_version,
            "entries": self.entries,
            "done": self.done,
            "rel": self.rel,
            "active": self.active,
            "epoch": self.epoch,
        }

    @classmethod
    def from_json(cls, value: Any, where: str) -> Snapshot:
        o = _obj(value, where)
        subs = _obj(_key(o, "subs", where), f"{where} subs")
        for topic_filter, qos in subs.items():
            _int(qos, f"{where} subs", topic_filter)
        done = []
        for w, d in _items(o, "done", where):
            a = _array(d, 2, w)
            done.append((_str(a[0], w, "origin"), _int(a[1], w, "seq")))
        return cls(
            _str(_key(o, "cid", where), where, "cid"),
            subs,
            _int(_key(o, "subs_version", where), where, "subs_version"),
            [SnapshotEntry.from_json(e, w) for w, e in _items(o, "entries", where)],
            done,
            [_int(r, w, "rel") for w, r in _items(o, "rel", where)],
            _opt_str(_key(o, "active", where), where, "active"),
            _int(_key(o, "epoch", where), where, "epoch"),
        )


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


# (dest, message, now) -> reachable now; `dest` may be this node (handled at once, at `now`)
SendFn = Callable[[str, Wire, float], bool]
# (dest, message) -> reachable now; `dest` is never this node
SendOutFn = Callable[[str, Wire], bool]


# -- the registry (mesh/registry.py answers claims; mesh/handover.py makes them)


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

    def to_json(self) -> dict[str, Any]:
        return {
            "cid": self.cid,
            "node": self.node,
            "inc": self.inc,
            "conn": self.conn,
            "clean": self.clean,
            "will": _will_json(self.will),
            "at": self.at,
        }

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
        )


@dataclass(frozen=True, slots=True)
class RegGrant(Wire):
    KIND: ClassVar[str] = "reg.grant"
    cid: str
    conn: str
    epoch: int
    prev: str | None  # the node that held the ClientId before

    def to_json(self) -> dict[str, Any]:
        return {"cid": self.cid, "conn": self.conn, "epoch": self.epoch, "prev": self.prev}

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> Self:
        w = cls.KIND
        return cls(
            _str(_key(obj, "cid", w), w, "cid"),
            _str(_key(obj, "conn", w), w, "conn"),
            _int(_key(obj, "epoch", w), w, "epoch"),
            _opt_str(_key(obj, "prev", w), w, "prev"),
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

    def to_json(self) -> dict[str, Any]:
        return {"cid": self.cid, "conn": self.conn, "epoch": self.epoch, "node": self.node}

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> Self:
        w = cls.KIND
        return cls(
            _str(_key(obj, "cid", w), w, "cid"),
            _str(_key(obj, "conn", w), w, "conn"),
            _int(_key(obj, "epoch", w), w, "epoch"),
            _str(_key(obj, "node", w), w, "node"),
        )


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

    def to_json(self) -> dict[str, Any]:
        return {
            "cid": self.cid,
            "node": self.node,
            "inc": self.inc,
            "conn": self.conn,
            "epoch": self.epoch,
            "clean": self.clean,
            "will": _will_json(self.will),
            "at": self.at,
        }

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


# -- session holders (mesh/handover.py)


@dataclass(frozen=True, slots=True)
class SessFetch(Wire):
    KIND: ClassVar[str] = "sess.fetch"
    cid: str
    conn: str
    epoch: int
    to: str

    def to_json(self) -> dict[str, Any]:
        return {"cid": self.cid, "conn": self.conn, "epoch": self.epoch, "to": self.to}

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> Self:
        w = cls.KIND
        return cls(
            _str(_key(obj, "cid", w), w, "cid"),
            _str(_key(obj, "conn", w), w, "conn"),
            _int(_key(obj, "epoch", w), w, "epoch"),
            _str(_key(obj, "to", w), w, "to"),
        )


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


@dataclass(frozen=True, slots=True)
class SessSettle(Wire):
    KIND: ClassVar[str] = "sess.settle"
    cid: str
    epoch: int
    items: list[Settlement]

    def to_json(self) -> dict[str, Any]:
        return {"cid": self.cid, "epoch": self.epoch, "items": self.items}

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> Self:
        w = cls.KIND
        return cls(
            _str(_key(obj, "cid", w), w, "cid"),
            _int(_key(obj, "epoch", w), w, "epoch"),
            [Settlement.from_json(i, iw) for iw, i in _items(obj, "items", w)],
        )


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
class SessDiscard(Wire):
    KIND: ClassVar[str] = "sess.discard"
    cid: str
    epoch: int

    def to_json(self) -> dict[str, Any]:
        return {"cid": self.cid, "epoch": self.epoch}

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> Self:
        w = cls.KIND
        return cls(_str(_key(obj, "cid", w), w, "cid"), _int(_key(obj, "epoch", w), w, "epoch"))


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


# -- retained messages (mesh/retained.py)


@dataclass(frozen=True, slots=True)
class RetSet(Wire):
    KIND: ClassVar[str] = "ret.set"
    items: list[RetainedItem]

    def to_json(self) -> dict[str, Any]:
        return {"items": self.items}

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> Self:
        return cls([RetainedItem.from_json(i, w) for w, i in _items(obj, "items", cls.KIND)])


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
class RetQuery(Wire):
    KIND: ClassVar[str] = "ret.query"
    qid: int
    filter: str

    def to_json(self) -> dict[str, Any]:
        return {"qid": self.qid, "filter": self.filter}

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> Self:
        w = cls.KIND
        return cls(_int(_key(obj, "qid", w), w, "qid"), _str(_key(obj, "filter", w), w, "filter"))


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
        SessSubs,
        SessDiscard,
        SessFwd,
        RetSet,
        RetAck,
        RetQuery,
        RetReply,
    )
}


def decode(kind: str, payload: bytes) -> Wire:
    """The message of ``kind`` in ``payload``; ClusterWireError (a ValueError) if it is none."""
    cls = KINDS.get(kind)
    if cls is None:
        raise ClusterWireError(f"unknown cluster message kind {kind!r}")
    try:
        obj = json.loads(payload)
    except ValueError as exc:  # (bad UTF-8 as well as bad JSON)
        raise ClusterWireError(f"{kind}: not JSON ({exc})") from None
    return cls.from_json(_obj(obj, kind))
