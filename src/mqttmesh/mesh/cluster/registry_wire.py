"""The registry's wire: the messages of a ClientId's claim, grant and release (``reg.*``),
and the records they carry, a client's will and a registrar's entry.

Pure. mesh/cluster/registry.py answers the claims and keeps the entries, mesh/cluster/claimant.py
makes the claims. The messages are read and written as the others are (mesh/cluster/cluster_wire.py,
which decodes every kind and hands these names on), with the checks of mesh/cluster/cluster_values.py.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, ClassVar, Self

from .cluster_values import _bool, _int, _items, _key, _num, _obj, _opt_str, _props_json, _str, _ttl_json
from .wire_base import Wire

__all__ = [
    "WireWill",
    "Registration",
    "RegClaim",
    "RegGrant",
    "RegKick",
    "RegRelease",
    "RegRegister",
    "RegCopy",
]


# --------------------------------------------------------------------------- records


@dataclass(frozen=True, slots=True)
class WireWill:
    """A client's will as the registrar keeps it (payload in base64)."""

    topic: str
    payload_b64: str
    qos: int
    retain: bool
    # the sequence number of the will's message at the connection's node (0: none reserved):
    # whoever publishes it publishes that one message, taken once by the duplicate filters
    seq: int = 0
    props_b64: str | None = None  # the will's MQTT 5 properties, as its message carries them
    # its Message Expiry Interval (seconds, counted from when it is published), if it has one
    expiry: int | None = None
    # its Will Delay Interval (seconds) when its session outlives the connection (MQTT 5)
    delay: int = 0

    def to_json(self) -> dict[str, Any]:
        out = {"topic": self.topic, "payload": self.payload_b64, "qos": self.qos, "retain": self.retain}
        if self.seq:
            out["seq"] = self.seq
        if self.props_b64 is not None:
            out["props"] = self.props_b64
        if self.expiry is not None:
            out["expiry"] = self.expiry
        if self.delay:
            out["delay"] = self.delay
        return out

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
            _int(o.get("seq", 0), where, "seq"),
            _props_json(o.get("props"), where),
            _ttl_json(o.get("expiry"), where),
            _ttl_json(o.get("delay", 0), where) or 0,
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
    # wall-clock seconds when the will of a connection that ended is due (its Will Delay
    # Interval after the end): published then unless a new connection for the ClientId came
    will_due: float | None = None
    # wall-clock seconds when the session of a connection that ended expires (MQTT 5 Session
    # Expiry Interval): from then on no session is kept for the ClientId. While connected: when
    # the session the claim found ends, should the claim never be accepted (registry.py)
    session_due: float | None = None
    expiry: int = 0xFFFFFFFF  # its session's Session Expiry Interval (RegClaim's)
    # a claim never accepted (reg.release refused): it resumed nothing and says nothing of the
    # session but the end it found, which may be none (a registrar that restarted in a split)
    refused: bool = False

    def to_json(self) -> dict[str, Any]:
        out = {
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
        if self.will_due is not None:
            out["will_due"] = self.will_due
        if self.session_due is not None:
            out["session_due"] = self.session_due
        if self.expiry != 0xFFFFFFFF:
            out["expiry"] = self.expiry
        if self.refused:
            out["refused"] = True
        return out

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
            None if o.get("will_due") is None else _num(o["will_due"], where, "will_due"),
            None if o.get("session_due") is None else _num(o["session_due"], where, "session_due"),
            _int(o.get("expiry", 0xFFFFFFFF), where, "expiry"),
            _bool(o.get("refused", False), where, "refused"),
        )


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
