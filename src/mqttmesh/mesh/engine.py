"""The mesh routing engine: link-state with interest, like multicast OSPF.

Pure: events in, actions out. No sockets, no asyncio, no clock of its own;
every method that depends on time takes ``now``. The broker runs it over peer
links; the simulator runs the very same class over a simulated network. It
leaves to its caller the links themselves (which peers are up, how bytes reach
them), the clock, local delivery and when an end-to-end acknowledgement may
leave (after the store committed what the delivery changed).

What travels between neighbours (``kind`` of a Send action):

    hello   link-local: who I am (node id, incarnation, addresses)
    cost    link-local: the measured cost of our link (the dialling side measures)
    dbsum   link-local, on link up: the versions of every advertisement I hold
    lsreq   link-local: send me these advertisements (I hold older ones)
    lsa     flooded: router and interest advertisements
    fwd     routed: a batch of envelopes (application messages)
    e2e     routed: end-to-end acknowledgements of QoS 1/2 messages, to their origin
    uni     routed: unicast messages between two nodes (session and registry protocols)

Events return the local deliveries they cause; everything to send leaves at
the next ``flush(now)`` (the broker calls it once per event-loop iteration, so
envelopes and advertisements are batched per neighbour). Actions are tuples:

    ("send", peer, kind, payload: bytes, qos)      from flush() and tick()
    ("deliver", message, needs_ack)                from receive(): deliver locally;
                                                   if needs_ack, call delivered(message)
                                                   once the delivery is safe
    ("unicast", from_node, kind, payload: bytes)   from receive(): a unicast for this node
"""

from __future__ import annotations

import json
import struct
import sys
import zlib
from collections.abc import Callable
from dataclasses import dataclass

from ..message import Message
from .dedup import DeliveryFilter, ForwardFilter
from .envelope import Envelope, EnvelopeError, decode_batch, encode_batch
from .interest import InterestIndex
from .spf import shortest_paths

__all__ = ["MeshSettings", "MeshEngine", "RouterLsa", "InterestState", "MeshProtocolError"]


class MeshProtocolError(ValueError):
    """A neighbour sent something that does not parse; its link should be closed."""


@dataclass
class MeshSettings:
    hop_limit: int = 255  # a safety net: the duplicate filter is what stops loops
    refresh_interval: float = 30.0  # re-originate our router advertisement this often
    max_age: float = 3600.0  # forget an unreachable node's advertisements after this
    min_cost: int = 1000  # link cost floor, microseconds of round-trip time
    cost_change: float = 0.25  # re-advertise a link when its cost moves by this fraction
    dedup_window: int = 262144  # recent message ids remembered per origin
    custody_limit: int = 100_000  # QoS 1/2 messages held at their origin until acknowledged
    custody_timeout: float = 3600.0  # give up on a destination after this long
    retransmit_after: float = 2.0  # first end-to-end retransmission; doubles up to 30 s
    max_batch_bytes: int = 16 * 1024


@dataclass
class RouterLsa:
    node: str
    inc: int
    seq: int
    addresses: list[str]
    links: dict[str, int]
    received: float = 0.0

    def to_json(self) -> dict:
        return {
            "t": "router",
            "node": self.node,
            "inc": self.inc,
            "seq": self.seq,
            "addr": self.addresses,
            "links": self.links,
        }


@dataclass
class InterestState:
    node: str
    inc: int
    ver: int
    # a tuple of interned strings, in no particular order: every node holds every other
    # node's filters, and a tuple of shared strings costs a tenth of a set of copies; sorting
    # is left to the rare readers (docs/simulation.md, memory)
    filters: tuple[str, ...] = ()

    def full_json(self) -> dict:
        return {"t": "interest", "node": self.node, "inc": self.inc, "ver": self.ver, "full": sorted(self.filters)}


def _filter_tuple(filters) -> tuple[str, ...]:
    """Distinct interned filters; TypeError for anything that is not a string."""
    return tuple({sys.intern(f) for f in filters})


class _Custody:
    __slots__ = ("msg", "dests", "attempt", "due", "since")

    def __init__(self, msg: Message, dests: set[str], due: float, since: float):
        self.msg, self.dests, self.attempt, self.due, self.since = msg, dests, 0, due, since


class PeerStats:
    __slots__ = (
        "envelopes_out",
        "envelopes_in",
        "batches_out",
        "batches_in",
        "control_out",
        "control_in",
        "control_bytes_out",
    )
    # (annotations only: __init__ sets every slot to 0)
    envelopes_out: int
    envelopes_in: int
    batches_out: int
    batches_in: int
    control_out: int
    control_in: int
    control_bytes_out: int

    def __init__(self):
        for name in self.__slots__:
            setattr(self, name, 0)

    def as_dict(self):
        return {name: getattr(self, name) for name in self.__slots__}


_ACK_HEAD = struct.Struct(">I")


def _encode_acks(groups: list) -> bytes:
    """End-to-end acknowledgements: per group to:str8 from:str8 count:u32 seq:u64*count."""
    parts = []
    for to, frm, seqs in groups:
        t, f = to.encode(), frm.encode()
        parts.append(bytes((len(t),)) + t + bytes((len(f),)) + f + _ACK_HEAD.pack(len(seqs)))
        parts.append(struct.pack(f">{len(seqs)}Q", *seqs))
    return b"".join(parts)


def _decode_acks(payload: bytes) -> list:
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
            groups.append((to, frm, seqs))
    except (struct.error, IndexError, UnicodeDecodeError) as exc:
        raise MeshProtocolError(f"malformed e2e acknowledgements: {exc}") from None
    return groups


_UNI_HEAD = struct.Struct(">BI")


def _encode_unicast(dest: str, frm: str, hops: int, kind: str, body: bytes) -> bytes:
    """One unicast record: hops:u8 len:u32, then dest, from, kind (str8 each) and the body."""
    names = b"".join(bytes((len(x),)) + x for x in (dest.encode(), frm.encode(), kind.encode()))
    return _UNI_HEAD.pack(hops, len(names) + len(body)) + names + body


def _decode_unicasts(payload: bytes):
    pos, size = 0, len(payload)
    try:
        while pos < size:
            hops, length = _UNI_HEAD.unpack_from(payload, pos)
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
            yield fields[0], fields[1], hops, fields[2], bytes(payload[pos:end])
            pos = end
    except (struct.error, IndexError, UnicodeDecodeError) as exc:
        raise MeshProtocolError(f"malformed unicast: {exc}") from None


def _newest_only(lsas: list[dict]) -> list[dict]:
    """What of a neighbour's queue is worth sending: the newest router advertisement of each
    node, and of a node's interest the newest full one and the deltas after it.

    Several versions of one advertisement queued in the same flush (a burst of link events,
    teach-backs crossing each other) would otherwise each be sent, each cross the others and
    each be answered with the newer one: floods that feed themselves.
    """
    router: dict[str | None, tuple] = {}  # (node is None only in a malformed advertisement)
    full: dict[str | None, tuple] = {}
    for lsa in lsas:
        kind, node = lsa.get("t"), lsa.get("node")
        if kind == "router":
            key = (lsa["inc"], lsa["seq"])
            if router.get(node, key) <= key:
                router[node] = key
        elif "full" in lsa:
            key = (lsa["inc"], lsa["ver"])
            if full.get(node, key) <= key:
                full[node] = key
    out = []
    sent: set = set()
    for lsa in lsas:
        kind, node = lsa.get("t"), lsa.get("node")
        if kind == "router":
            if (lsa["inc"], lsa["seq"]) == router[node] and ("r", node) not in sent:
                sent.add(("r", node))
                out.append(lsa)
            continue
        newest = full.get(node)
        key = (lsa["inc"], lsa["ver"])
        if newest is None or key > newest:
            out.append(lsa)  # no full one queued, or a delta that follows it
        elif "full" in lsa and key == newest and ("i", node) not in sent:
            sent.add(("i", node))
            out.append(lsa)
    return out


class MeshEngine:
    def __init__(
        self, node_id: str, incarnation: int, addresses: list[str] | None = None, settings: MeshSettings | None = None
    ):
        self.node_id = node_id
        self.incarnation = incarnation
        self.addresses = list(addresses or [])
        self.settings = settings or MeshSettings()
        # our own state
        self._seq = 0  # router advertisement sequence
        self._links: dict[str, int] = {}  # live neighbours -> advertised cost
        self._measured: dict[str, float] = {}  # neighbour -> smoothed rtt (us)
        self._local_filters: set[str] = set()
        self._interest_ver = 0
        self._pending_add: set[str] = set()
        self._pending_del: set[str] = set()
        # what we know of everybody (including ourselves)
        self.routers: dict[str, RouterLsa] = {}
        self.interests: dict[str, InterestState] = {}
        self.remote = InterestIndex()  # filter -> {node: 0} of other nodes
        self.next_hop: dict[str, str] = {}
        self.distance: dict[str, int] = {}
        self.parent: dict[str, str] = {}
        self._spf_dirty = True
        self._route_cache: dict[str, tuple] = {}  # topic -> (next-hop groups, destinations)
        # data plane
        self._outbox: dict[str, list[Envelope]] = {}
        self._acks_out: dict[str, list[int]] = {}  # origin -> seqs delivered here
        self._acks_relay: dict[str, list] = {}  # next hop -> [[to, from, seqs], ...]
        self._unicast_out: dict[str, list[bytes]] = {}  # next hop -> encoded unicast records
        self.forward_filter = ForwardFilter(self.settings.dedup_window)
        self.delivery_filter = DeliveryFilter(self.settings.dedup_window)
        self.custody: dict[int, _Custody] = {}
        # where custody is recorded so a restart keeps it (the broker's store journal), or None
        self.custody_store = None
        self._flood_out: dict[str, list[dict]] = {}  # neighbour -> advertisements to send
        self._control_out: list[tuple] = []  # other link-local control messages
        self._last_refresh = 0.0
        self._next_refresh = 0.0
        self.peer_stats: dict[str, PeerStats] = {}
        self.counters = {
            "routed": 0,
            "delivered": 0,
            "duplicates": 0,
            "hop_limit_drops": 0,
            "unreachable_drops": 0,
            "custody_retransmits": 0,
            "custody_expired": 0,
            "custody_overflow": 0,
            "lsa_originated": 0,
            "interest_originated": 0,
            "lsa_received": 0,
            "lsa_flooded": 0,
            "spf_runs": 0,
        }
        # the engine has no clock: a caller that wants SPF timed (the simulator) sets spf_timer
        # to one (time.perf_counter) and reads spf_seconds
        self.spf_timer: Callable[[], float] | None = None
        self.spf_seconds = 0.0
        self.changes = 0  # bumps whenever the map or interest changes (status refresh)

    # ------------------------------------------------------------------ start and hello

    def start(self, now: float) -> list:
        self._originate_router(now)
        self._interest_ver = 1
        mine = InterestState(self.node_id, self.incarnation, 1, _filter_tuple(self._local_filters))
        self.interests[self.node_id] = mine
        return []

    def hello(self, rtt_us: float | None = None) -> bytes:
        """Our introduction on a new link; the dialler adds the round trip it measured."""
        hello = {"node": self.node_id, "inc": self.incarnation, "addr": self.addresses}
        if rtt_us is not None:
            hello["rtt"] = int(rtt_us)
        return json.dumps(hello).encode()

    @staticmethod
    def parse_hello(payload: bytes) -> dict:
        try:
            hello = json.loads(payload)
            if not isinstance(hello["node"], str) or not isinstance(hello["inc"], int):
                raise ValueError("bad hello fields")
            return hello
        except (ValueError, KeyError, TypeError) as exc:
            raise MeshProtocolError(f"invalid hello: {exc}") from None

    # ------------------------------------------------------------------ links

    def link_up(self, peer: str, now: float, cost: int | None = None) -> list:
        if peer == self.node_id:
            return []
        self._links[peer] = max(self.settings.min_cost, cost or self.settings.min_cost)
        if cost:
            self._measured[peer] = float(cost)  # the first sample of the smoothed rtt
        self._stats(peer)
        self._originate_router(now)
        self._spf_dirty = True
        # database exchange: tell the new neighbour what we hold (OSPF-style summary). A
        # node's router and interest advertisements travel independently, so we may hold
        # its interest before its router advertisement: it is summarised too ([-1, -1, ...]),
        # or it would never cross this link
        summary = {}
        interests = self.interests
        for node, r in self.routers.items():
            i = interests.get(node)
            summary[node] = [r.inc, r.seq, i.inc if i else -1, i.ver if i else -1]
        for node, i in interests.items():
            if node not in summary:
                summary[node] = [-1, -1, i.inc, i.ver]
        self._send_control(peer, "dbsum", summary)
        self._retransmit_soon(now)
        return []

    def link_down(self, peer: str, now: float) -> list:
        if self._links.pop(peer, None) is None:
            return []
        self._measured.pop(peer, None)
        stranded = self._outbox.pop(peer, [])
        self._flood_out.pop(peer, None)
        self._acks_relay.pop(peer, None)
        self._unicast_out.pop(peer, None)
        self._originate_router(now)
        self._spf_dirty = True
        for env in stranded:  # queued for the dead link, not yet sent: take the new route
            self._send_envelope(env)
        self._retransmit_soon(now)
        return []

    def link_rtt(self, peer: str, rtt_us: float, now: float) -> list:
        """A round-trip sample on a link we dialled; may re-advertise its cost."""
        if peer not in self._links:
            return []
        old = self._measured.get(peer)
        srtt = rtt_us if old is None else 0.875 * old + 0.125 * rtt_us
        self._measured[peer] = srtt
        if self._set_cost(peer, int(srtt), now):
            self._send_control(peer, "cost", {"cost": self._links[peer]})
        return []

    def _set_cost(self, peer: str, cost: int, now: float) -> bool:
        cost = max(self.settings.min_cost, cost)
        current = self._links.get(peer)
        if current is None:
            return False
        if abs(cost - current) <= self.settings.cost_change * current:
            return False
        self._links[peer] = cost
        self._originate_router(now)
        self._spf_dirty = True
        return True

    def _stats(self, peer: str) -> PeerStats:
        # not setdefault(peer, PeerStats()): that builds a PeerStats for every message
        stats = self.peer_stats.get(peer)
        if stats is None:
            stats = self.peer_stats[peer] = PeerStats()
        return stats

    @property
    def neighbours(self) -> list[str]:
        return sorted(self._links)

    # ------------------------------------------------------------------ local interest

    def local_filter_added(self, topic_filter: str) -> None:
        if topic_filter in self._local_filters:
            return
        self._local_filters.add(topic_filter)
        if topic_filter in self._pending_del:
            self._pending_del.discard(topic_filter)
        else:
            self._pending_add.add(topic_filter)

    def local_filter_removed(self, topic_filter: str) -> None:
        if topic_filter not in self._local_filters:
            return
        self._local_filters.discard(topic_filter)
        if topic_filter in self._pending_add:
            self._pending_add.discard(topic_filter)
        else:
            self._pending_del.add(topic_filter)

    # ------------------------------------------------------------------ advertisements

    def _originate_router(self, now: float) -> None:
        self._seq += 1
        lsa = RouterLsa(self.node_id, self.incarnation, self._seq, list(self.addresses), dict(self._links), now)
        self.routers[self.node_id] = lsa
        self._last_refresh = now
        # the next refresh, jittered (deterministically: the engine has no randomness of its
        # own) to 75-100 % of the interval, so refreshes that a mass event aligned (the mesh
        # forming, a heal) drift apart instead of flooding the mesh together every interval
        spread = zlib.crc32(f"{self.node_id}/{self.incarnation}/{self._seq}".encode()) / 2**32
        self._next_refresh = now + self.settings.refresh_interval * (1.0 - 0.25 * spread)
        self.counters["lsa_originated"] += 1
        self.changes += 1
        self._flood(lsa.to_json(), exclude=None)

    def _originate_interest_delta(self) -> None:
        if not self._pending_add and not self._pending_del:
            return
        mine = self.interests[self.node_id]
        base = self._interest_ver
        self._interest_ver += 1
        mine.ver = self._interest_ver
        mine.filters = _filter_tuple(self._local_filters)
        delta = {
            "t": "interest",
            "node": self.node_id,
            "inc": self.incarnation,
            "ver": self._interest_ver,
            "base": base,
            "add": sorted(self._pending_add),
            "del": sorted(self._pending_del),
        }
        self._pending_add.clear()
        self._pending_del.clear()
        self.counters["lsa_originated"] += 1
        self.counters["interest_originated"] += 1
        self.changes += 1
        self._flood(delta, exclude=None)

    def _flood(self, lsa: dict, exclude: str | None) -> None:
        for peer in self._links:
            if peer != exclude:
                self._flood_out.setdefault(peer, []).append(lsa)

    def _receive_lsas(self, peer: str, lsas: list, now: float) -> None:
        requests: list[list] = []
        for lsa in lsas:
            self.counters["lsa_received"] += 1
            kind = lsa.get("t")
            node = lsa.get("node")
            if not isinstance(node, str):
                raise MeshProtocolError("advertisement without node")
            if node == self.node_id:
                self._own_lsa_echo(lsa, now)
                continue
            if kind == "router":
                self._install_router(peer, lsa, now)
            elif kind == "interest":
                need = self._install_interest(peer, lsa)
                if need:
                    requests.append([node, "interest"])
            else:
                raise MeshProtocolError(f"unknown advertisement type {kind!r}")
        if requests:
            self._send_control(peer, "lsreq", requests)

    def _own_lsa_echo(self, lsa: dict, now: float) -> None:
        """An advertisement of ours from an earlier life: out-number it."""
        if lsa.get("t") == "router":
            inc, seq = lsa.get("inc", 0), lsa.get("seq", 0)
            if (inc, seq) > (self.incarnation, self._seq):
                if inc > self.incarnation:
                    self.incarnation = inc + 1  # cannot happen with a store; defensive
                self._seq = seq
                self._originate_router(now)
        elif lsa.get("t") == "interest":
            if (lsa.get("inc", 0), lsa.get("ver", 0)) > (self.incarnation, self._interest_ver):
                self._interest_ver = lsa["ver"] + 1
                mine = self.interests[self.node_id]
                mine.ver = self._interest_ver
                full = mine.full_json()
                self._flood(full, exclude=None)

    def _install_router(self, peer: str, lsa: dict, now: float) -> None:
        node = lsa["node"]
        key = (lsa["inc"], lsa["seq"])
        have = self.routers.get(node)
        if have is not None and (have.inc, have.seq) >= key:
            if (have.inc, have.seq) > key:
                self._send_control(peer, "lsa", [have.to_json()])  # teach the neighbour
            return
        links = {str(k): int(v) for k, v in lsa.get("links", {}).items()}
        self.routers[node] = RouterLsa(node, lsa["inc"], lsa["seq"], list(lsa.get("addr", [])), links, now)
        if have is None or have.links != links:
            # the shortest paths depend on the links alone: a refresh (every node re-originates
            # every refresh_interval) changes nothing, and at a thousand nodes recomputing for
            # each of them would cost a Dijkstra per node every few milliseconds
            self._spf_dirty = True
        if have is not None and have.inc != lsa["inc"]:
            # a new incarnation: what we knew of its interest is from its earlier life
            old = self.interests.get(node)
            if old is not None and old.inc < lsa["inc"]:
                self._set_interest(node, None)
            self.delivery_filter.forget_origin(node)
        self.changes += 1
        self.counters["lsa_flooded"] += 1
        self._flood(lsa, exclude=peer)

    def _install_interest(self, peer: str, lsa: dict) -> bool:
        """Apply a full or delta interest advertisement; True when we must ask for a full one."""
        node, inc, ver = lsa["node"], lsa["inc"], lsa["ver"]
        have = self.interests.get(node)
        if have is not None and (have.inc, have.ver) >= (inc, ver):
            return False
        if "full" in lsa:
            self._set_interest(node, InterestState(node, inc, ver, _filter_tuple(lsa["full"])))
        else:
            if have is None or have.inc != inc or have.ver != lsa.get("base"):
                return True  # a gap: we cannot apply this delta
            filters = set(have.filters)
            filters.difference_update(lsa.get("del", []))
            filters.update(lsa.get("add", []))
            self._set_interest(node, InterestState(node, inc, ver, _filter_tuple(filters)))
        self.counters["lsa_flooded"] += 1
        self._flood(lsa, exclude=peer)
        return False

    def _set_interest(self, node: str, state: InterestState | None) -> None:
        old = self.interests.get(node)
        old_filters = old.filters if old is not None else ()
        new_filters = state.filters if state is not None else ()
        remote = self.remote
        if not old_filters:
            remote.add_all(new_filters, node)
        elif not new_filters:
            for f in old_filters:
                remote.remove(f, node)
        else:
            old_set, new_set = set(old_filters), set(new_filters)
            for f in old_set - new_set:
                remote.remove(f, node)
            remote.add_all(new_set - old_set, node)
        if state is None:
            self.interests.pop(node, None)
        else:
            self.interests[node] = state
        self._route_cache.clear()
        self.changes += 1

    def _receive_dbsum(self, peer: str, summary: dict, now: float) -> None:
        requests = []
        push = []
        for node, versions in summary.items():
            if node == self.node_id:
                continue
            r_inc, r_seq, i_inc, i_ver = versions
            have_r = self.routers.get(node)
            if r_inc >= 0 and (have_r is None or (have_r.inc, have_r.seq) < (r_inc, r_seq)):
                requests.append([node, "router"])
            elif have_r is not None and (have_r.inc, have_r.seq) > (r_inc, r_seq):
                push.append(have_r.to_json())
            have_i = self.interests.get(node)
            if i_inc >= 0 and (have_i is None or (have_i.inc, have_i.ver) < (i_inc, i_ver)):
                requests.append([node, "interest"])
            elif have_i is not None and (have_i.inc, have_i.ver) > (i_inc, i_ver):
                push.append(have_i.full_json())
        for node, r in self.routers.items():
            if node not in summary:
                push.append(r.to_json())
        for node, i in self.interests.items():
            if node not in summary:
                push.append(i.full_json())
        if push:
            self._send_control(peer, "lsa", push)
        if requests:
            self._send_control(peer, "lsreq", requests)

    def _receive_lsreq(self, peer: str, requests: list) -> None:
        out = []
        for node, kind in requests:
            if kind == "router" and node in self.routers:
                out.append(self.routers[node].to_json())
            elif kind == "interest" and node in self.interests:
                out.append(self.interests[node].full_json())
        if out:
            self._send_control(peer, "lsa", out)

    def _send_control(self, peer: str, kind: str, body) -> None:
        if kind == "lsa":
            self._flood_out.setdefault(peer, []).extend(body)
        else:
            self._control_out.append((peer, kind, body))

    # ------------------------------------------------------------------ receiving from a neighbour

    def receive(self, peer: str, kind: str, payload: bytes, now: float) -> list:
        """Something a neighbour sent on our link; returns the local deliveries it causes."""
        stats = self._stats(peer)
        if kind == "uni":
            stats.control_in += 1
            return self._receive_unicast(payload)
        if kind == "e2e":
            stats.control_in += 1
            self._receive_acks(_decode_acks(payload))
            return []
        if kind == "fwd":
            stats.batches_in += 1
            try:
                envelopes = decode_batch(payload)
            except EnvelopeError as exc:
                raise MeshProtocolError(str(exc)) from None
            stats.envelopes_in += len(envelopes)
            actions: list = []
            for env in envelopes:
                self._handle_envelope(peer, env, actions)
            return actions
        stats.control_in += 1
        try:
            body = json.loads(payload)
        except ValueError as exc:
            raise MeshProtocolError(f"{kind}: invalid JSON ({exc})") from None
        try:
            if kind == "lsa":
                self._receive_lsas(peer, body, now)
            elif kind == "dbsum":
                self._receive_dbsum(peer, body, now)
            elif kind == "lsreq":
                self._receive_lsreq(peer, body)
            elif kind == "cost":
                self._set_cost(peer, int(body["cost"]), now)
            else:
                raise MeshProtocolError(f"unknown message kind {kind!r}")
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            if isinstance(exc, MeshProtocolError):
                raise
            raise MeshProtocolError(f"{kind}: malformed ({exc!r})") from None
        return []

    # ------------------------------------------------------------------ data plane

    def _ensure_spf(self) -> None:
        if self._spf_dirty:
            timer = self.spf_timer
            started = timer() if timer is not None else 0.0
            links = {node: r.links for node, r in self.routers.items()}
            links[self.node_id] = dict(self._links)
            self.next_hop, self.distance, self.parent = shortest_paths(self.node_id, links)
            self._spf_dirty = False
            self._route_cache.clear()
            self.counters["spf_runs"] += 1
            if timer is not None:
                self.spf_seconds += timer() - started

    def route_local(self, msg: Message, now: float) -> bool:
        """A message published at this node: forward it to the nodes that want it.

        The envelopes leave at the next ``flush``; QoS 1/2 messages stay in our
        custody until every destination acknowledged them end to end. True when
        the message goes to at least one other node.
        """
        if self._spf_dirty:
            self._ensure_spf()
        route = self._route_cache.get(msg.topic)
        if route is None:
            route = self._compute_route(msg.topic)
        groups, dests, unreachable = route
        if not dests:
            return False
        counters = self.counters
        counters["routed"] += 1
        if msg.qos:
            custody = self.custody
            if len(custody) >= self.settings.custody_limit:
                # full: give up on the oldest message (most likely waiting for a node that is
                # gone), not on the new one, whose destinations are probably alive
                counters["custody_overflow"] += 1
                oldest = next(iter(custody))
                del custody[oldest]
                if self.custody_store is not None:
                    self.custody_store.custody_remove(oldest)
            custody[msg.seq] = _Custody(msg, set(dests), now + self.settings.retransmit_after, now)
            if self.custody_store is not None:
                self.custody_store.custody_put(msg, dests)  # durable before the PUBACK
        if unreachable:
            counters["unreachable_drops"] += unreachable
        outbox = self._outbox
        hop_limit = self.settings.hop_limit
        for hop, hop_dests, key in groups:
            queue = outbox.get(hop)
            if queue is None:
                queue = outbox[hop] = []
            queue.append(Envelope(msg, hop_dests, hop_limit, 0, key))
        return bool(groups)

    def _compute_route(self, topic: str) -> tuple:
        """(groups of (next hop, destinations, their key), all destinations, unreachable count).

        Cached per topic until the interest or the shortest paths change: the
        per-message work is then one dictionary lookup and one envelope per next hop.
        """
        me = self.node_id
        dests = sorted(n for n in self.remote.match(topic) if n != me)
        by_hop: dict[str, list[str]] = {}
        unreachable = 0
        for d in dests:
            hop = self.next_hop.get(d)
            if hop is None:
                unreachable += 1
            else:
                by_hop.setdefault(hop, []).append(d)
        groups = [(hop, ds, "\0".join(ds)) for hop, ds in by_hop.items()]
        route = (groups, dests, unreachable)
        cache = self._route_cache
        if len(cache) >= 65536:
            cache.clear()
        cache[topic] = route
        return route

    def _send_envelope(self, env: Envelope) -> None:
        """Split the destinations by next hop and queue one envelope per next hop."""
        self._ensure_spf()
        next_hop = self.next_hop
        if len(env.dests) == 1:
            hop = next_hop.get(env.dests[0])
            if hop is None:
                self.counters["unreachable_drops"] += 1
                return
            self._outbox.setdefault(hop, []).append(env)
            return
        by_hop: dict[str, list[str]] = {}
        for d in env.dests:
            hop = next_hop.get(d)
            if hop is None:
                self.counters["unreachable_drops"] += 1
                continue
            by_hop.setdefault(hop, []).append(d)
        for hop, dests in by_hop.items():
            self._outbox.setdefault(hop, []).append(Envelope(env.msg, dests, env.hop_limit, env.attempt))

    def _handle_envelope(self, peer: str, env: Envelope, actions: list) -> None:
        msg = env.msg
        me = self.node_id
        if msg.origin == me:
            self.counters["duplicates"] += 1  # our own message came round: a transient loop
            return
        env_dests = env.dests
        if len(env_dests) == 1 and env_dests[0] == me:
            # the common case, a leaf: nothing to forward, the delivery filter alone decides
            if self.delivery_filter.seen(msg.origin, msg.seq, msg.qos):
                self.counters["duplicates"] += 1
                if msg.qos:
                    self._ack(msg)  # the origin did not hear our earlier acknowledgement
            else:
                self.counters["delivered"] += 1
                actions.append(("deliver", msg, msg.qos > 0))
            return
        dests = self.forward_filter.claim((msg.origin, msg.seq, env.attempt), env_dests)
        if len(dests) < len(env_dests):
            self.counters["duplicates"] += 1
        if not dests:
            return
        if me in dests:
            if msg.qos:
                if self.delivery_filter.seen(msg.origin, msg.seq, msg.qos):
                    self.counters["duplicates"] += 1
                    self._ack(msg)  # the origin did not hear our earlier acknowledgement
                else:
                    self.counters["delivered"] += 1
                    actions.append(("deliver", msg, True))
            elif not self.delivery_filter.seen(msg.origin, msg.seq, 0):
                self.counters["delivered"] += 1
                actions.append(("deliver", msg, False))
            if len(dests) == 1:
                return
            dests = [d for d in dests if d != me]
        if env.hop_limit <= 1:
            self.counters["hop_limit_drops"] += 1
            return
        self._send_envelope(Envelope(msg, dests, env.hop_limit - 1, env.attempt))

    # ------------------------------------------------------------------ end-to-end acknowledgements

    def delivered(self, msg: Message) -> None:
        """A QoS 1/2 message from another node is safely ours: acknowledge it to its origin."""
        self._ack(msg)

    def _ack(self, msg: Message) -> None:
        self._acks_out.setdefault(msg.origin, []).append(msg.seq)

    def _receive_acks(self, groups: list) -> None:
        for to, frm, seqs in groups:
            if to == self.node_id:
                custody = self.custody
                for seq in seqs:
                    c = custody.get(seq)
                    if c is not None:
                        c.dests.discard(frm)
                        if not c.dests:
                            del custody[seq]
                            if self.custody_store is not None:
                                self.custody_store.custody_remove(seq)
            else:
                self._relay_ack(to, frm, seqs)

    def _relay_ack(self, to: str, frm: str, seqs: list) -> None:
        self._ensure_spf()
        hop = self.next_hop.get(to)
        if hop is not None:
            self._acks_relay.setdefault(hop, []).append([to, frm, seqs])

    # ------------------------------------------------------------------ unicast between nodes

    def send_unicast(self, dest: str, kind: str, payload: bytes, hop_limit: int | None = None) -> bool:
        """Route ``payload`` to node ``dest`` (best effort: the protocols on top retry).

        False when ``dest`` is unreachable now.
        """
        if dest == self.node_id:
            return False
        self._ensure_spf()
        hop = self.next_hop.get(dest)
        if hop is None:
            return False
        record = _encode_unicast(dest, self.node_id, hop_limit or self.settings.hop_limit, kind, payload)
        self._unicast_out.setdefault(hop, []).append(record)
        return True

    def _receive_unicast(self, payload: bytes) -> list:
        actions = []
        for dest, frm, hops, kind, body in _decode_unicasts(payload):
            if dest == self.node_id:
                actions.append(("unicast", frm, kind, body))
            elif hops > 1:
                self._ensure_spf()
                hop = self.next_hop.get(dest)
                if hop is not None:
                    self._unicast_out.setdefault(hop, []).append(_encode_unicast(dest, frm, hops - 1, kind, body))
            else:
                self.counters["hop_limit_drops"] += 1
        return actions

    def restore_custody(self, msg: Message, dests: list[str], now: float) -> None:
        """A message held in custody before a restart: retransmit it soon."""
        self.custody[msg.seq] = _Custody(msg, set(dests), now, now)

    def _retransmit_soon(self, now: float) -> None:
        for c in self.custody.values():
            c.due = min(c.due, now)

    def _retransmit_due(self, now: float) -> None:
        if not self.custody:
            return
        settings = self.settings
        expired = []
        self._ensure_spf()
        for seq, c in self.custody.items():
            if c.due > now:
                continue
            if now - c.since > settings.custody_timeout:
                expired.append(seq)
                continue
            # every destination keeps it until it acknowledges: one whose subscriber left
            # acknowledges a message it delivers to nobody, and one across a partition is
            # waited for (its interest may not be known again yet when the split heals)
            reachable = [d for d in c.dests if d in self.next_hop]
            c.attempt = min(c.attempt + 1, 255)
            c.due = now + min(30.0, settings.retransmit_after * (2 ** min(c.attempt, 4)))
            if reachable:
                self.counters["custody_retransmits"] += 1
                self._send_envelope(Envelope(c.msg, reachable, settings.hop_limit, c.attempt))
        for seq in expired:
            c = self.custody.pop(seq)
            if self.custody_store is not None:
                self.custody_store.custody_remove(seq)
            if c.dests:
                self.counters["custody_expired"] += 1

    # ------------------------------------------------------------------ time and output

    def flush(self, now: float) -> list:
        """Everything queued since the last flush, as Send actions (one batch per neighbour)."""
        actions: list = []
        if self._pending_add or self._pending_del:
            self._originate_interest_delta()
        if self._control_out:
            control, self._control_out = self._control_out, []
            for peer, kind, body in control:
                if peer in self._links:
                    payload = json.dumps(body).encode()
                    stats = self._stats(peer)
                    stats.control_out += 1
                    stats.control_bytes_out += len(payload)
                    actions.append(("send", peer, kind, payload, 1))
        if self._flood_out:
            flood, self._flood_out = self._flood_out, {}
            # a flooded advertisement goes to every neighbour but one: encode it once.
            # The bytes are those of json.dumps(lsas), whose list separator is ", "
            encoded: dict[int, bytes] = {}
            for peer, lsas in flood.items():
                if peer in self._links:
                    if len(lsas) > 1:
                        lsas = _newest_only(lsas)
                    parts = []
                    for lsa in lsas:
                        raw = encoded.get(id(lsa))
                        if raw is None:
                            raw = encoded[id(lsa)] = json.dumps(lsa).encode()
                        parts.append(raw)
                    payload = b"[" + b", ".join(parts) + b"]"
                    stats = self._stats(peer)
                    stats.control_out += 1
                    stats.control_bytes_out += len(payload)
                    actions.append(("send", peer, "lsa", payload, 1))
        if self._outbox:
            outbox, self._outbox = self._outbox, {}
            limit = self.settings.max_batch_bytes
            for peer, envelopes in outbox.items():
                if peer not in self._links:
                    continue
                stats = self._stats(peer)
                stats.envelopes_out += len(envelopes)
                start = 0
                size = 0
                for i, env in enumerate(envelopes):
                    size += len(env.msg.payload) + 64
                    if size >= limit and i + 1 < len(envelopes):
                        actions.append(self._batch(peer, envelopes[start : i + 1], stats))
                        start, size = i + 1, 0
                actions.append(self._batch(peer, envelopes[start:], stats))
        if self._acks_out:
            acks, self._acks_out = self._acks_out, {}
            for origin, seqs in acks.items():
                self._relay_ack(origin, self.node_id, seqs)
        if self._unicast_out:
            unicast, self._unicast_out = self._unicast_out, {}
            for peer, records in unicast.items():
                if peer in self._links:
                    payload = b"".join(records)
                    stats = self._stats(peer)
                    stats.control_out += 1
                    stats.control_bytes_out += len(payload)
                    actions.append(("send", peer, "uni", payload, 1))
        if self._acks_relay:
            relay, self._acks_relay = self._acks_relay, {}
            for peer, groups in relay.items():
                if peer in self._links:
                    payload = _encode_acks(groups)
                    stats = self._stats(peer)
                    stats.control_out += 1
                    stats.control_bytes_out += len(payload)
                    actions.append(("send", peer, "e2e", payload, 0))
        return actions

    def _batch(self, peer: str, envelopes: list[Envelope], stats: PeerStats) -> tuple:
        stats.batches_out += 1
        qos = 1 if any(e.msg.qos for e in envelopes) else 0
        return ("send", peer, "fwd", encode_batch(envelopes), qos)

    def tick(self, now: float) -> list:
        """Periodic work: refresh our advertisement, age out the dead, retransmit."""
        if now >= self._next_refresh:
            self._originate_router(now)
        self._retransmit_due(now)
        self._age_out(now)
        return self.flush(now)

    def _age_out(self, now: float) -> None:
        self._ensure_spf()
        if len(self.next_hop) >= len(self.routers) - 1:
            return  # every node we know is reachable (the scan costs O(nodes) at every tick)
        for node in [
            n
            for n, r in self.routers.items()
            if n != self.node_id and n not in self.next_hop and now - r.received > self.settings.max_age
        ]:
            del self.routers[node]
            self._set_interest(node, None)
            self._spf_dirty = True
            self._release_custody(node)

    def _release_custody(self, node: str) -> None:
        """``node`` has aged out of the database: stop holding messages for it."""
        done = []
        for seq, c in self.custody.items():
            if node in c.dests:
                c.dests.discard(node)
                self.counters["custody_expired"] += 1
                if not c.dests:
                    done.append(seq)
        for seq in done:
            del self.custody[seq]
            if self.custody_store is not None:
                self.custody_store.custody_remove(seq)

    # ------------------------------------------------------------------ introspection

    def route_to(self, node: str) -> str | None:
        """The neighbour a message for ``node`` goes to next (None: unreachable)."""
        self._ensure_spf()
        return self.next_hop.get(node)

    def reachable(self) -> list[str]:
        self._ensure_spf()
        return sorted(self.next_hop)

    def nodes_wanting(self, topic: str) -> list[str]:
        return sorted(n for n in self.remote.match(topic) if n != self.node_id)

    def known_addresses(self) -> dict[str, list[str]]:
        return {n: r.addresses for n, r in self.routers.items() if n != self.node_id}

    def status(self) -> dict:
        self._ensure_spf()
        nodes = {}
        for node, r in sorted(self.routers.items()):
            i = self.interests.get(node)
            nodes[node] = {
                "incarnation": r.inc,
                "seq": r.seq,
                "addresses": r.addresses,
                "links": r.links,
                "reachable": node == self.node_id or node in self.next_hop,
                "distance": self.distance.get(node),
                "next_hop": self.next_hop.get(node),
                "parent": self.parent.get(node),
                "filters": sorted(i.filters) if i else [],
                "interest_version": i.ver if i else None,
            }
        return {
            "node": self.node_id,
            "incarnation": self.incarnation,
            "neighbours": {
                p: {
                    "cost": c,
                    "srtt_us": round(self._measured[p]) if p in self._measured else None,
                    **self.peer_stats.get(p, PeerStats()).as_dict(),
                }
                for p, c in sorted(self._links.items())
            },
            "nodes": nodes,
            "tree": {n: p for n, p in sorted(self.parent.items())},
            "custody": len(self.custody),
            "counters": dict(self.counters),
        }
