"""The values inside cluster messages (mesh/cluster/cluster_wire.py), and the checks that read them.
The registry's records (a will, a registration) are with its messages, in mesh/cluster/registry_wire.py.

Pure. Record types inside bodies: a NamedTuple where the wire has a JSON array (its fields
in array order: ``json.dumps`` writes a NamedTuple as the array), a dataclass where it has
an object. Each ``from_json`` checks what it reads and raises ClusterWireError naming the
kind and the key (or the record: "sess.copy entries[3]") at fault.
"""

from __future__ import annotations

import base64
import math
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

from ...message import Message
from ...shared import resend_mark, root_of

__all__ = [
    "ClusterSettings",
    "ClusterWireError",
    "Settlement",
    "RetainedItem",
    "RetainedAck",
    "Forwarded",
    "SnapshotEntry",
    "Snapshot",
    "pack_ids",
    "unpack_ids",
    "resent_root",
    "with_root",
]


@dataclass
class ClusterSettings:
    replication: int = 3  # a persistent session's home (membership.py), a retained topic's owners
    claim_timeout: float = 1.0  # without an answer from the registrar, connect anyway
    gather_timeout: float = 2.0  # wait this long for the other holders of a session
    will_delay: float = 0.5  # a node unreachable this long has lost its clients
    redirect_grace: float = 10.0  # holders forward late arrivals to a new node this long
    lookup_timeout: float = 1.0  # retained lookups wait this long for every answer
    tombstone_ttl: float = 3600.0  # deleted retained topics are remembered this long
    register_interval: float = 5.0  # local connections re-register with their registrar
    settle_retry: float = 0.5  # a holder that has not acknowledged settlements this long gets a copy
    # a gap this long between ticks: the node was not running, or so busy that a peer may
    # have given its links up (membership.py): a peer closes a link silent for 3 keepalives,
    # and heard from us at most a keepalive before the gap began, so a gap shorter than 2
    # keepalives (less a tick, for the peer's timer) leaves every link as it was
    stall: float = 1.75
    quorum_grace: float = 3.0  # after a start or a pause, the links' dead time (3 x mesh.keepalive)
    # peers to dial (mesh.peers): at a start, no client is taken before the mesh's
    # subscriptions are learned (membership.py routing_ready); a first node alone need not wait
    expect_peers: bool = True


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


def props_b64(props: bytes | None) -> str | None:
    """A message's MQTT 5 properties as the cluster's JSON carries them."""
    return base64.b64encode(props).decode() if props is not None else None


def props_of(text: str | None) -> bytes | None:
    return base64.b64decode(text) if text is not None else None


def _props_json(value: Any, where: str) -> str | None:
    if value is None:
        return None
    text = _str(value, where, "props")
    try:
        base64.b64decode(text, validate=True)
    except ValueError:
        raise ClusterWireError(f"{where}: props is not base64") from None
    return text


def ttl_ms(left: float) -> int:
    """What is left of an expiring message's life, as the cluster's JSON carries it: whole
    milliseconds, rounded up (0: expired); each node counts it from when it arrives."""
    return math.ceil(left * 1000.0) if left > 0.0 else 0


def _ttl_json(value: Any, where: str) -> int | None:
    if value is None:
        return None
    ttl = _int(value, where, "ttl")
    if ttl < 0:
        raise ClusterWireError(f"{where}: 'ttl' is negative")
    return ttl


def expiring(msg: Message, ttl: int | None, now: float) -> Message:
    """``msg`` to expire ``ttl`` milliseconds after ``now`` (None: never)."""
    return msg if ttl is None else msg.expiring(ttl / 1000.0, now)


def aged_ttl(ttl: int | None, ms: int) -> int | None:
    """A remaining life of ``ttl`` milliseconds after ``ms`` more on the way (None: never ends)."""
    return None if ttl is None else max(0, ttl - ms)


def _array(value: Any, n: int, where: str) -> list[Any]:
    if not isinstance(value, list) or len(value) != n:
        raise ClusterWireError(f"{where}: not an array of {n}")
    return value


# --------------------------------------------------------------------------- a re-send's root
# a shared group's re-send of a message (a new message id: custody.py ``_group_copy``) names
# the id it re-sends, its root, in ``Message.shares`` (shared.py ``resend_mark``); a copy of
# it sent to another node names it too, so that a session there that has the root, or another
# re-send of it, is not given it again (shared.py ``had``, snapshots.py ``merge_snapshots``).
# Peer protocol 13: a node of 12 sent neither (its arrays one shorter), and is refused at the
# handshake; no store keeps these arrays (a stored entry's root: store.py)


def resent_root(msg: Message) -> tuple[str, int] | None:
    """The root ``msg`` re-sends; None for a message that is no re-send."""
    root = root_of(msg)
    return None if root == (msg.origin, msg.seq) else root


def with_root(msg: Message, root: tuple[str, int] | None) -> Message:
    """``msg``, made from a copy sent between nodes, naming the root it re-sends (if any) as
    the re-send did; to no shared group or plain subscriber of a node it is dispatched on
    (broker.py ``_group_only``): it is a session's message, not routed again."""
    if root is not None:
        msg.shares = (resend_mark(root),)
    return msg


def _root_json(value: Any, where: str) -> tuple[str, int] | None:
    if value is None:
        return None
    if not isinstance(value, list) or len(value) != 2:
        raise ClusterWireError(f"{where}: 'root' is not an array of 2")
    return (_str(value[0], where, "root"), _int(value[1], where, "root"))


def _items(obj: dict[str, Any], key: str, where: str) -> list[tuple[str, Any]]:
    """The elements of list ``key`` of ``obj``, each with its place for messages."""
    return [(f"{where} {key}[{i}]", v) for i, v in enumerate(_list(_key(obj, key, where), where, key))]


# --------------------------------------------------------------------------- message ids, packed

MAX_PACKED_IDS = 1_000_000  # ids one packed list may hold (a session remembers far fewer)


def pack_ids(ids: list[tuple[str, int]]) -> dict[str, str]:
    """Message ids (origin, seq) as ``{origin: base64 of the sorted sequence numbers as
    LEB128 varints of their differences}``: about two bytes an id where a JSON pair takes
    twenty, so a snapshot carries every settled id its copy remembers."""
    by_origin: dict[str, list[int]] = {}
    for origin, seq in ids:
        by_origin.setdefault(origin, []).append(seq)
    out: dict[str, str] = {}
    for origin in sorted(by_origin):
        buf = bytearray()
        prev = 0
        for seq in sorted(set(by_origin[origin])):
            delta = seq - prev
            prev = seq
            while delta >= 0x80:
                buf.append((delta & 0x7F) | 0x80)
                delta >>= 7
            buf.append(delta)
        out[origin] = base64.b64encode(bytes(buf)).decode()
    return out


def unpack_ids(value: Any, where: str) -> list[tuple[str, int]]:
    """The ids of ``pack_ids``; a malformed list is a ClusterWireError naming the origin."""
    packed = _obj(value, where)
    ids: list[tuple[str, int]] = []
    for origin, text in packed.items():
        _str(text, where, origin)
        try:
            raw = base64.b64decode(text, validate=True)
        except (ValueError, TypeError):
            raise ClusterWireError(f"{where}: {origin!r} is not base64") from None
        seq = shift = delta = 0
        for byte in raw:
            delta |= (byte & 0x7F) << shift
            if byte & 0x80:
                shift += 7
                if shift > 63:
                    raise ClusterWireError(f"{where}: {origin!r} holds a number of more than 64 bits")
                continue
            seq += delta
            ids.append((origin, seq))
            shift = delta = 0
            if len(ids) > MAX_PACKED_IDS:
                raise ClusterWireError(f"{where}: more than {MAX_PACKED_IDS} ids")
        if shift:
            raise ClusterWireError(f"{where}: {origin!r} ends inside a number")
    return ids


# --------------------------------------------------------------------------- records


class Settlement(NamedTuple):
    """What the holder a client is on did with one message: "sent", "rel" or "done"; or with
    an inbound QoS 2 packet id: "in" (awaits PUBREL; with the message and the id it is
    routed under, or origin "" and seq 0 when there is none) or "free" (the message released,
    which the holders remember as released: replica.released_id; origin "", seq 0 from a node
    of before, or when there is none)."""

    origin: str
    seq: int
    state: str
    pid: int
    msg: Forwarded | None = None  # "in": the message, routed once every holder has it

    @classmethod
    def from_json(cls, value: Any, where: str) -> Settlement:
        if not isinstance(value, list) or len(value) not in (4, 5):
            raise ClusterWireError(f"{where}: not an array of 4 or 5")
        a = value
        msg = Forwarded.from_json(a[4], f"{where} msg") if len(a) == 5 and a[4] is not None else None
        return cls(
            _str(a[0], where, "origin"),
            _int(a[1], where, "seq"),
            _str(a[2], where, "state"),
            _int(a[3], where, "pid"),
            msg,
        )

    def aged(self, ms: int) -> Settlement:
        """As it stands after ``ms`` milliseconds more on the way (wire.py ``age``)."""
        return self if self.msg is None else self._replace(msg=self.msg.aged(ms))


class RetainedItem(NamedTuple):
    """One retained message (an empty payload: a tombstone); newest (ts, origin, seq) wins."""

    topic: str
    payload_b64: str
    qos: int
    ts: float
    origin: str
    seq: int
    publisher: str
    props_b64: str | None = None  # its MQTT 5 properties (message.Message.props)
    ttl_ms: int | None = None  # what is left of its life when sent (``ttl_ms``), if it expires

    @classmethod
    def from_json(cls, value: Any, where: str) -> RetainedItem:
        a = _array(value, 9, where)
        return cls(
            _str(a[0], where, "topic"),
            _str(a[1], where, "payload"),
            _int(a[2], where, "qos"),
            _num(a[3], where, "ts"),
            _str(a[4], where, "origin"),
            _int(a[5], where, "seq"),
            _str(a[6], where, "publisher"),
            _props_json(a[7], where),
            _ttl_json(a[8], where),
        )

    def aged(self, ms: int) -> RetainedItem:
        """As it stands after ``ms`` milliseconds more on the way (wire.py ``age``)."""
        return self if self.ttl_ms is None else self._replace(ttl_ms=aged_ttl(self.ttl_ms, ms))


class RetainedAck(NamedTuple):
    """An owner has this version of a retained topic."""

    topic: str
    ts: float
    origin: str
    seq: int

    @classmethod
    def from_json(cls, value: Any, where: str) -> RetainedAck:
        a = _array(value, 4, where)
        return cls(
            _str(a[0], where, "topic"), _num(a[1], where, "ts"), _str(a[2], where, "origin"), _int(a[3], where, "seq")
        )


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
    props_b64: str | None = None  # its MQTT 5 properties (message.Message.props)
    ttl_ms: int | None = None  # what is left of its life when sent (``ttl_ms``), if it expires
    root: tuple[str, int] | None = None  # a shared group's re-send: the id it re-sends (``resent_root``)

    @classmethod
    def of(cls, msg: Message, now: float | None = None) -> Forwarded:
        """``msg`` as it stands at ``now`` (None: as it was last handed on, ``Message.ttl``)."""
        payload = base64.b64encode(msg.payload).decode()
        props = props_b64(msg.props)
        ttl = None
        if msg.expires is not None:
            ttl = ttl_ms(msg.ttl if now is None else msg.expires - now)
        return cls(
            msg.topic,
            payload,
            msg.qos,
            msg.retain,
            msg.origin,
            msg.seq,
            msg.publisher,
            msg.timestamp,
            props,
            ttl,
            resent_root(msg),
        )

    def message(self, now: float) -> Message:
        """The message, arrived at ``now``."""
        msg = Message(
            self.topic,
            base64.b64decode(self.payload_b64),
            self.qos,
            self.retain,
            self.origin,
            self.seq,
            self.publisher,
            self.ts,
            props_of(self.props_b64),
        )
        return expiring(with_root(msg, self.root), self.ttl_ms, now)

    @classmethod
    def from_json(cls, value: Any, where: str) -> Forwarded:
        a = _array(value, 11, where)
        return cls(
            _str(a[0], where, "topic"),
            _str(a[1], where, "payload"),
            _int(a[2], where, "qos"),
            _bool(a[3], where, "retain"),
            _str(a[4], where, "origin"),
            _int(a[5], where, "seq"),
            _str(a[6], where, "publisher"),
            _num(a[7], where, "ts"),
            _props_json(a[8], where),
            _ttl_json(a[9], where),
            _root_json(a[10], where),
        )

    def aged(self, ms: int) -> Forwarded:
        """As it stands after ``ms`` milliseconds more on the way (wire.py ``age``)."""
        return self if self.ttl_ms is None else self._replace(ttl_ms=aged_ttl(self.ttl_ms, ms))


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
    props_b64: str | None = None  # its MQTT 5 properties (message.Message.props)
    ttl_ms: int | None = None  # what is left of its life when sent (``ttl_ms``), if it expires
    root: tuple[str, int] | None = None  # a shared group's re-send: the id it re-sends (``resent_root``)

    @classmethod
    def from_json(cls, value: Any, where: str) -> SnapshotEntry:
        a = _array(value, 13, where)
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
            _props_json(a[10], where),
            _ttl_json(a[11], where),
            _root_json(a[12], where),
        )

    def aged(self, ms: int) -> SnapshotEntry:
        """As it stands after ``ms`` milliseconds more on the way (wire.py ``age``)."""
        return self if self.ttl_ms is None else self._replace(ttl_ms=aged_ttl(self.ttl_ms, ms))


@dataclass(frozen=True, slots=True)
class Snapshot:
    """A persistent session as one holder sends it to another (mesh/cluster/replica.py makes,
    merges and installs them)."""

    cid: str
    subs: dict[str, int]
    subs_version: int
    entries: list[SnapshotEntry]
    done: list[tuple[str, int]]  # settled message ids (origin, seq) the copy remembers
    rel: list[int]  # inbound QoS 2 packet ids between PUBREC and PUBREL
    active: str | None  # the node the client was last on
    epoch: int
    version: int  # settlements made by the holders the client was on (replica.py)
    # (origin, seq, state, packet id): ids settled for messages this copy did not have yet
    reserved: list[tuple[str, int, int, int]] = field(default_factory=list)
    # inbound QoS 2 packet ids awaiting PUBREL with their messages (those of ``rel`` that have one)
    inbound: list[tuple[int, Forwarded]] = field(default_factory=list)
    # origin -> the highest sequence number whose settlement the copy no longer remembers
    # (its floor, mesh/cluster/replica.py): an id at or below it that the copy neither holds nor
    # remembers cannot be told apart any more
    floors: dict[str, int] = field(default_factory=dict)
    # when, on this node's clock, its entries' ``ttl_ms`` count from: when it was taken
    # here, or arrived (never on the wire; None: when it is used)
    taken_at: float | None = field(default=None, compare=False)
    # MQTT 5 Session Expiry: its interval (session.KEPT: never), and while no client is
    # attached what is left of it when taken, in milliseconds (``ttl_ms``; None: not running)
    expiry: int = 0xFFFFFFFF
    expires_ms: int | None = None
    # ids (origin, seq) of ``inbound`` messages a node routed and keeps in custody: the node
    # the client comes to does not route them again (replica.py ``routed_ids``)
    routed: list[tuple[str, int]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        out = {
            "cid": self.cid,
            "subs": self.subs,
            "subs_version": self.subs_version,
            "entries": self.entries,
            "done": pack_ids(self.done),
            "floors": self.floors,
            "rel": self.rel,
            "active": self.active,
            "epoch": self.epoch,
            "version": self.version,
            "reserved": self.reserved,
            "inbound": self.inbound,
        }
        if self.expiry != 0xFFFFFFFF or self.expires_ms is not None:  # (else the JSON of before)
            out["expiry"] = self.expiry
            out["expires"] = self.expires_ms
        if self.routed:  # (else the JSON of before)
            out["routed"] = self.routed
        return out

    @classmethod
    def from_json(cls, value: Any, where: str) -> Snapshot:
        o = _obj(value, where)
        subs = _obj(_key(o, "subs", where), f"{where} subs")
        for topic_filter, qos in subs.items():
            _int(qos, f"{where} subs", topic_filter)
        done = unpack_ids(_key(o, "done", where), f"{where} done")
        floors = _obj(_key(o, "floors", where), f"{where} floors")
        for origin, seq in floors.items():
            _int(seq, f"{where} floors", origin)
        reserved = []
        for w, r in _items(o, "reserved", where):
            a = _array(r, 4, w)
            reserved.append(
                (_str(a[0], w, "origin"), _int(a[1], w, "seq"), _int(a[2], w, "state"), _int(a[3], w, "pid"))
            )
        inbound = []
        for w, r in _items(o, "inbound", where):
            a = _array(r, 2, w)
            inbound.append((_int(a[0], w, "pid"), Forwarded.from_json(a[1], f"{w} msg")))
        return cls(
            _str(_key(o, "cid", where), where, "cid"),
            subs,
            _int(_key(o, "subs_version", where), where, "subs_version"),
            [SnapshotEntry.from_json(e, w) for w, e in _items(o, "entries", where)],
            done,
            [_int(r, w, "rel") for w, r in _items(o, "rel", where)],
            _opt_str(_key(o, "active", where), where, "active"),
            _int(_key(o, "epoch", where), where, "epoch"),
            _int(_key(o, "version", where), where, "version"),
            reserved,
            inbound,
            floors,
            None,
            _int(o.get("expiry", 0xFFFFFFFF), where, "expiry"),
            _ttl_json(o.get("expires"), where),
            [
                (_str(a[0], w, "origin"), _int(a[1], w, "seq"))
                for w, r in (_items(o, "routed", where) if "routed" in o else [])
                for a in (_array(r, 2, w),)
            ],
        )

    def aged(self, ms: int) -> Snapshot:
        """As it stands after ``ms`` milliseconds more on the way (wire.py ``age``): what is
        left of its messages' lives and of its Session Expiry Interval."""
        return replace(
            self,
            entries=[e.aged(ms) for e in self.entries],
            inbound=[(pid, f.aged(ms)) for pid, f in self.inbound],
            expires_ms=aged_ttl(self.expires_ms, ms),
        )
