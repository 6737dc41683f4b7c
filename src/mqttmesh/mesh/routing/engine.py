"""The mesh routing engine: link-state with interest, like multicast OSPF.

Pure: events in, actions out. No sockets, no asyncio, no clock of its own;
every method that depends on time takes ``now``. The broker runs it over peer
links; the simulator runs the very same class over a simulated network. It
leaves to its caller the links themselves (which peers are up, how bytes reach
them), the clock, local delivery and when an end-to-end acknowledgement may
leave (after the store committed what the delivery changed). What it needs from
outside comes through its constructor: where custody is made durable
(``custody``), how JSON is read and written (``codec``), a clock to time SPF runs
with (``spf_timer``, the simulator's).

What travels between neighbours (``kind`` of a Send):

    hello   link-local: who I am (hello.py; sent and read by links.py, not here)
    cost    link-local: the measured cost of our link (the dialling side measures)
    dbsum   link-local, on link up: the versions of every advertisement I hold
    lsreq   link-local: send me these advertisements (I hold older ones)
    lsa     flooded: router and interest advertisements
    fwd     routed: a batch of envelopes (application messages)
    e2e     routed: end-to-end acknowledgements of QoS 1/2 messages, to their origin
    nack    routed: a destination asks an origin for a message another one waits for (order.py)
    skip    routed: the origin's answer when that message is not coming
    uni     routed: unicast messages between two nodes (session and registry protocols)

``receive`` returns what a message brought for this node, an ``Inbound``: the
deliveries (for each of QoS 1/2, call ``delivered(message)`` once the delivery is
safe) and the unicasts addressed here. Everything to send leaves at the next
``flush(now)`` as a list of ``Send`` (the broker calls it once per event-loop
iteration, so envelopes and advertisements are batched per neighbour); ``tick``
ends with a flush, and what its custody re-routed to this node's own members of a
shared group is the caller's to deliver after it (``served_here``, like ``receive``'s
deliveries). The types are in actions.py.

The engine is one object made of five parts (engine_base.py says why): the
advertisement database (lsdb.py), routes (routes.py), the data plane
(dataplane.py), custody (custody.py) and ordered delivery (order.py); the
binary formats are in wire.py and envelope.py.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Callable
from typing import Any

from ...message import Message
from ...topics import SubscriptionTrie
from .actions import NOTHING, Inbound, Send
from .custody import CustodyJournal, CustodyMixin
from .dataplane import DataPlaneMixin
from .dedup import DeliveryFilter, ForwardFilter
from .engine_base import JsonCodec, MeshSettings, PeerStats
from .envelope import EnvelopeError, decode_batch
from .interest import InterestIndex
from .lsdb import InterestState, LsdbMixin, RouterLsa
from .order import OrderMixin
from .routes import RoutesMixin
from .shares import SharesMixin
from .wire import MeshProtocolError

__all__ = ["MeshSettings", "MeshEngine", "PeerStats", "RouterLsa", "InterestState", "MeshProtocolError"]


class MeshEngine(LsdbMixin, RoutesMixin, DataPlaneMixin, CustodyMixin, OrderMixin, SharesMixin):
    def __init__(
        self,
        node_id: str,
        incarnation: int,
        addresses: list[str] | None = None,
        settings: MeshSettings | None = None,
        *,
        custody: CustodyJournal | None = None,
        codec: JsonCodec = json,
        spf_timer: Callable[[], float] | None = None,
        wall_offset: float = 0.0,
    ):
        self.node_id = node_id
        self.incarnation = incarnation
        self.addresses = list(addresses or [])
        self.settings = settings or MeshSettings()
        self.custody_journal = custody
        self.codec = codec
        self.spf_timer = spf_timer  # only measures: the engine has no clock
        self.wall_offset = wall_offset  # wall-clock seconds minus `now` (envelope.py ``sent``)
        self.spf_seconds = 0.0
        self.changes = 0
        # our own state
        self._seq = 0
        self._links = {}
        self._measured = {}
        self._local_filters = set()
        self._interest_ver = 0
        self._pending_add = set()
        self._pending_del = set()
        # what we know of everybody (including ourselves)
        self.routers = {}
        self.interests = {}
        self.synced = False
        self._shares_in = False  # (receive: an envelope of the batch named groups for this node)
        self._wanted = {}
        self.remote = InterestIndex()
        self.next_hop = {}
        self.distance = {}
        self.parent = {}
        self._spf_dirty = True
        self._route_cache = {}
        # data plane
        self._outbox = {}
        self._acks_out = {}
        self._acks_for = {}
        self._acks_relay = {}
        self._unicast_out = {}
        self.forward_filter = ForwardFilter(self.settings.dedup_window)
        self.delivery_filter = DeliveryFilter(self.settings.dedup_window)
        self.custody = {}
        self._acked_hi = {}
        self._heard = {}
        self._links_changed_at = 0.0
        # ordered delivery
        self._last_to = {}
        self._held = {}
        self._held_ids = set()
        self._order_out = {}
        self._order_relay = {}
        # shared groups (shares.py)
        self._share_nodes = {}
        self._share_trie = SubscriptionTrie()
        self._share_turn = {}
        self._share_last = {}
        self._holds = {}
        self._after = {}
        self._own_holds = {}
        self._parked = deque()
        self._here = []
        self.new_seq = None  # (assembly.build_core gives it the Broker's)
        self._flood_out = {}
        self._control_out = []
        self._last_refresh = 0.0
        self._next_refresh = 0.0
        self.peer_stats = {}
        self.counters = {
            "routed": 0,
            "delivered": 0,
            "duplicates": 0,
            "hop_limit_drops": 0,
            "unreachable_drops": 0,
            "custody_retransmits": 0,
            "custody_waited": 0,
            "custody_expired": 0,
            "custody_overflow": 0,
            "reorder_held": 0,
            "reorder_resent": 0,
            "reorder_skipped": 0,
            "reorder_timeouts": 0,
            "reorder_overflow": 0,
            "reorder_unordered": 0,
            "lsa_originated": 0,
            "interest_originated": 0,
            "lsa_received": 0,
            "lsa_flooded": 0,
            "spf_runs": 0,
            "shared_unreachable": 0,
            "shared_rerouted": 0,
            "shared_held": 0,
            "shared_held_here": 0,
            "shared_hold_expired": 0,
            "shared_parked": 0,
            "shared_parked_expired": 0,
            "shared_parked_dropped": 0,
            "shared_unparked_here": 0,
        }

    # ------------------------------------------------------------------ start

    def start(self, now: float) -> None:
        self._originate_router(now)
        self._originate_interest()

    # ------------------------------------------------------------------ links

    def link_up(self, peer: str, now: float, cost: int | None = None) -> None:
        if peer == self.node_id:
            return
        self._links[peer] = max(self.settings.min_cost, cost or self.settings.min_cost)
        if cost:
            self._measured[peer] = float(cost)  # the first sample of the smoothed rtt
        self._stats(peer)
        self._originate_router(now)
        self._spf_dirty = True
        self._send_control(peer, "dbsum", self._summary())  # database exchange
        self._retransmit_soon(now)

    def link_down(self, peer: str, now: float) -> None:
        if self._links.pop(peer, None) is None:
            return
        self._measured.pop(peer, None)
        self._wanted.pop(peer, None)  # (its answers will not come: another link's will)
        stranded = self._outbox.pop(peer, [])
        self._flood_out.pop(peer, None)
        self._acks_relay.pop(peer, None)
        self._unicast_out.pop(peer, None)
        self._originate_router(now)
        self._spf_dirty = True
        for env in stranded:  # queued for the dead link, not yet sent: take the new route
            self._send_envelope(env)
        self._retransmit_soon(now)

    def link_rtt(self, peer: str, rtt_us: float, now: float) -> None:
        """A round-trip sample on a link we dialled; may re-advertise its cost."""
        if peer not in self._links:
            return
        old = self._measured.get(peer)
        srtt = rtt_us if old is None else 0.875 * old + 0.125 * rtt_us
        self._measured[peer] = srtt
        if self._set_cost(peer, int(srtt), now):
            self._send_control(peer, "cost", {"cost": self._links[peer]})

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

    @property
    def neighbours(self) -> list[str]:
        return sorted(self._links)

    # ------------------------------------------------------------------ receiving from a neighbour

    def receive(self, peer: str, kind: str, payload: bytes, now: float) -> Inbound:
        """Something a neighbour sent on our link; returns what it brought for this node."""
        if kind != "fwd":
            return _RECEIVERS.get(kind, _receive_control)(self, peer, kind, payload, now)
        # a batch of envelopes (the data plane, dataplane.py), inline: this runs once per read of
        # application messages, and a call more would cost a read of one message 1.5 %
        stats = self._stats(peer)
        stats.batches_in += 1
        try:
            envelopes = decode_batch(payload, now, now + self.wall_offset)
        except EnvelopeError as exc:
            raise MeshProtocolError(str(exc)) from None
        stats.envelopes_in += len(envelopes)
        deliveries: list[Message] = []
        self._shares_in = False
        for env in envelopes:
            self._handle_envelope(peer, env, deliveries, now)
        self.counters["delivered"] += len(deliveries)  # (counted here, once per batch)
        if deliveries and (self._share_nodes or self._shares_in):
            # (a shared group anywhere, or one named by a message here though this node knows
            # of none: it restarted, and its groups went with its members; one served here?)
            self._served_elsewhere(deliveries, now)
        return _new_tuple(Inbound, (deliveries, ()))  # Inbound(deliveries, ()) at half the cost

    def _receive_cost(self, peer: str, body: Any, now: float) -> None:
        self._set_cost(peer, int(body["cost"]), now)

    # ------------------------------------------------------------------ time and output

    def flush(self, now: float) -> list[Send]:
        """Everything queued since the last flush (one batch per neighbour and kind)."""
        sends: list[Send] = []
        if self._pending_add or self._pending_del:
            self._originate_interest_delta()
        if self._control_out:
            self._flush_control(sends)
        if self._flood_out:
            self._flush_floods(sends)
        if self._outbox:
            self._flush_outbox(sends, now)
        if self._acks_out or self._acks_for:
            self._flush_acks()
        if self._unicast_out:
            self._flush_unicasts(sends, now)
        if self._acks_relay:
            self._flush_relayed_acks(sends)
        if self._order_out or self._order_relay:
            self._flush_order(sends)
        return sends

    def tick(self, now: float) -> list[Send]:
        """Periodic work: refresh our advertisement, age out the dead, retransmit."""
        if now >= self._next_refresh:
            self._originate_router(now)
        self._retransmit_due(now)
        if self._holds:
            self._expire_holds(now)
        if self._parked:
            self._unpark(now)
        self._age_out(now)
        return self.flush(now)

    # ------------------------------------------------------------------ introspection

    def status(self) -> dict[str, Any]:
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
            "held": len(self._held_ids),
            "shared_holds": len(self._holds),
            "counters": dict(self.counters),
        }


def _receive_control(engine: MeshEngine, peer: str, kind: str, payload: bytes, now: float) -> Inbound:
    """The JSON kinds (lsa, dbsum, lsreq, cost), and any kind we do not know."""
    engine._stats(peer).control_in += 1
    try:
        body = engine.codec.loads(payload)
    except ValueError as exc:
        raise MeshProtocolError(f"{kind}: invalid JSON ({exc})") from None
    try:
        handler = _CONTROL.get(kind)
        if handler is None:
            raise MeshProtocolError(f"unknown message kind {kind!r}")
        handler(engine, peer, body, now)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        if isinstance(exc, MeshProtocolError):
            raise
        raise MeshProtocolError(f"{kind}: malformed ({exc!r})") from None
    return NOTHING


_new_tuple = tuple.__new__  # builds a NamedTuple without its Python-level __new__

# receive, for every kind but fwd: kind -> handler(engine, peer, kind, payload, now). Functions,
# not bound methods: an engine holding its own bound methods would be a reference cycle, and the
# simulator frees crashed engines by reference counting alone
_RECEIVERS: dict[str, Callable[[MeshEngine, str, str, bytes, float], Inbound]] = {
    "uni": MeshEngine._receive_unicast,
    "e2e": MeshEngine._receive_e2e,
    "nack": MeshEngine._receive_order,
    "skip": MeshEngine._receive_order,
}
# the JSON kinds: kind -> handler(engine, peer, decoded body, now)
_CONTROL: dict[str, Callable[[MeshEngine, str, Any, float], None]] = {
    "lsa": MeshEngine._receive_lsas,
    "dbsum": MeshEngine._receive_dbsum,
    "lsreq": MeshEngine._receive_lsreq,
    "cost": MeshEngine._receive_cost,
}
