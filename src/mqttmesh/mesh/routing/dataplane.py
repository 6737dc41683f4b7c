"""The data plane: application messages and unicasts, hop by hop.

Pure. A part of ``MeshEngine`` (engine.py, a mixin over engine_base.EngineState):
a message published here goes out as one envelope per next hop (``route_local``);
an envelope from a neighbour is delivered here, passed on, or both, with the
duplicate filters deciding (``fwd``); unicasts between two nodes are routed the
same way (``uni``). It leaves local delivery, the links and the clock to its caller.
This is the per-message path: keep the work per message as it is, or cheaper.
"""

from __future__ import annotations

from ...message import Message
from .actions import NOTHING, Inbound, Send, Unicast
from .custody import Custody
from .dedup import SEEN
from .engine_base import EngineState, PeerStats
from .envelope import Envelope, Shares, encode_batch, for_dests
from .records import Route
from .shares import only, share_entries
from .wire import decode_unicasts, encode_unicast, encode_unicasts

__all__ = ["DataPlaneMixin"]

# builds a NamedTuple without its Python-level __new__: for what the data plane makes once per
# batch (Send of a fwd batch), where Send(...) would add 10 % to the flush of a one-message batch
_new_tuple = tuple.__new__


class DataPlaneMixin(EngineState):
    def route_to_group(self, msg: Message, share: str, now: float, here: bool = False) -> bool:
        """``msg``, a new message of this node, to one node (not this one) with members of the
        shared group ``share``, for that group only (shares.py ``only``): what a member here
        held when it left, with no other member here. ``here``: this node may be the one
        (custody's re-route of what a node out of reach was chosen for: its members here are
        as good as another node's; finding 36): then ``msg`` is this node's broker's to serve,
        handed over by ``served_here``. False: no such node known (QoS 1/2 for nodes all out
        of reach now: kept until one is, shares.py ``_park``)."""
        me = self.node_id
        node = self._pick(share, msg, exclude=None if here else me)
        if node == me:
            msg.shares = only(msg, share)  # (its group here alone: broker.py ``_group_only``)
            self._here.append(msg)
            return True
        if node is None:
            if msg.qos and (not self.synced or self._share_nodes.get(share, {}).keys() - {me}):
                # its nodes are out of reach now, or not yet known (a node that just started):
                # kept for them
                self._park(msg, share, now)
                return True
            self.counters["shared_unreachable"] += 1
            return False
        return self.route_local(msg, now, {node: only(msg, share)})

    def served_here(self) -> list[Message]:
        """Messages of ours that the timer (``tick``: custody's re-route) chose this node's
        own members of a group for (``route_to_group``), since the last call: deliver them
        like ``receive``'s deliveries (each names its group alone, ``Message.shares``; its
        acknowledgement, ``delivered``, is ours and goes nowhere). The caller takes them
        after each ``tick`` (mesh/link/links.py ``PeerLinks.tick``)."""
        out = self._here
        if out:
            self._here = []
        return out

    def route_local(self, msg: Message, now: float, only: Shares | None = None) -> bool:
        """A message published at this node: forward it to the nodes that want it.

        The envelopes leave at the next ``flush``; QoS 1/2 messages stay in our
        custody until every destination acknowledged them end to end. True when
        the message goes to at least one other node.
        """
        if self._spf_dirty:
            self._ensure_spf()
        if only is None:
            route = self._route_cache.get(msg.topic)
            if route is None:
                route = self._compute_route(msg.topic)
            smap = None
            if self._share_nodes:  # (a shared group anywhere: the node of each is chosen per message)
                smap = self._choose_shares(msg, now)
                if smap is not None:
                    route, smap = self._route_with_shares(msg, route, smap)
        else:  # (to those nodes' groups only: route_to_group)
            route, smap = self._route_with_shares(msg, ([], [], 0), dict(only))
        groups, dests, unreachable = route
        if not dests:
            return False
        counters = self.counters
        counters["routed"] += 1
        if unreachable:
            counters["unreachable_drops"] += unreachable
        settings = self.settings
        prev = 0  # the predecessor at a lone destination (order.py); 0: none
        pmap: dict[str, int] | None = None  # several destinations: each one's predecessor
        if msg.qos:
            custody = self.custody
            if len(custody) >= settings.custody_limit:
                # full: give up on the oldest message (most likely waiting for a node that is
                # gone), not on the new one, whose destinations are probably alive
                counters["custody_overflow"] += 1
                oldest = next(iter(custody))
                del custody[oldest]
                self._unjournal(oldest)
            if msg.origin != self.node_id:
                # another node took it from its publisher and may have routed it already
                # (custody.py): same id, acknowledged to us. Journaled as our own are: once
                # its publisher is done with it (PUBREL), or its session names it routed
                # here, this custody is the only copy for a destination out of reach, and a
                # kill -9 lost it (the fault harness, 7 nodes, MQTT 5, seed 13)
                msg.ack_to = self.node_id
                due = now + settings.retransmit_after
                custody[(msg.origin, msg.seq)] = Custody(msg, set(dests), due, now, None, smap)
                journal = self.custody_journal
                if journal is not None:
                    journal.rerouted_put(msg, dests if smap is None else [*dests, *share_entries(smap)])
            else:
                # each destination's predecessor: it delivers this message after that one
                last_to = self._last_to
                seq = msg.seq
                if len(dests) == 1:  # (one destination: the common case)
                    d = dests[0]
                    prev = last_to.get(d, 0)
                    last_to[d] = seq
                    if not prev:  # (the first to d: its silence counts from now, custody.py)
                        self._heard.setdefault(d, now)
                    custody[seq] = Custody(msg, {d}, now + settings.retransmit_after, now, prev, smap)
                else:
                    pmap = {d: last_to.get(d, 0) for d in dests}
                    for d in dests:
                        if not pmap[d]:
                            self._heard.setdefault(d, now)
                        last_to[d] = seq
                    custody[seq] = Custody(msg, set(dests), now + settings.retransmit_after, now, pmap, smap)
                journal = self.custody_journal
                if journal is not None:
                    # durable before the PUBACK, with the groups each node serves it for
                    journal.custody_put(msg, dests if smap is None else [*dests, *share_entries(smap)])
        outbox = self._outbox
        hop_limit = settings.hop_limit
        for hop, hop_dests, key in groups:
            queue = outbox.get(hop)
            if queue is None:
                queue = outbox[hop] = []
            if smap is not None:
                if pmap is None and prev:
                    pmap = {hop_dests[0]: prev}
                queue.append(for_dests(msg, hop_dests, hop_limit, 0, pmap, smap))
            elif pmap is None:
                queue.append(Envelope(msg, hop_dests, hop_limit, 0, key, prev))
            else:
                queue.append(for_dests(msg, hop_dests, hop_limit, 0, pmap))
        return bool(groups)

    def _route_with_shares(self, msg: Message, route: Route, smap: Shares) -> tuple[Route, Shares | None]:
        """The route of ``msg`` with the nodes chosen to serve its shared groups (``smap``,
        this node's taken out: ``msg.shares``), and what the envelopes say of them."""
        me = self.node_id
        msg.shares = smap.pop(me, ())
        if not smap:
            return route, None
        groups, dests, unreachable = route
        extra = [n for n in smap if n not in dests]
        if not extra:
            return route, smap
        all_dests = sorted([*dests, *extra])
        by_hop: dict[str, list[str]] = {}
        for d in all_dests:
            hop = self.next_hop.get(d)
            if hop is not None:  # (a chosen node is in reach: shares.py)
                by_hop.setdefault(hop, []).append(d)
        return ([(hop, ds, "\0".join(ds)) for hop, ds in by_hop.items()], all_dests, unreachable), smap

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
        pmap = env.predecessors()
        smap = env.shares
        for hop, dests in by_hop.items():
            self._outbox.setdefault(hop, []).append(for_dests(env.msg, dests, env.hop_limit, env.attempt, pmap, smap))

    # ------------------------------------------------------------------ from a neighbour

    def _handle_envelope(self, peer: str, env: Envelope, deliveries: list[Message], now: float) -> None:
        """One envelope of a ``fwd`` batch (MeshEngine.receive): deliver here, pass on, or both.
        A QoS 1/2 message with a predecessor here is delivered after it (order.py). What it
        adds to ``deliveries`` its caller counts ("delivered")."""
        msg = env.msg
        me = self.node_id
        if msg.origin == me or msg.ack_to:
            ack_to = msg.ack_to
            if ack_to == me or not ack_to:
                self.counters["duplicates"] += 1  # our own message came round: a transient loop
                return
        env_dests = env.dests
        shares = env.shares
        if shares is not None:  # the shared groups it goes to here, as it says (shares.py)
            msg.shares = shares.get(me, ())
            self._shares_in = True
        if len(env_dests) == 1 and env_dests[0] == me:
            # the common case, a leaf: nothing to forward, the delivery filter alone decides
            prev: int = env.prev  # type: ignore[assignment]  # (one destination: a number)
            if prev:
                # its predecessor here delivered, nothing held: one filter call (order.py)
                if self._held:
                    self._deliver_ordered(msg, prev, env.attempt, now, deliveries)
                    return
                verdict = self.delivery_filter.seen_after(msg.origin, msg.seq, prev, msg.qos)
                if not verdict:  # (NEW)
                    if env.attempt:
                        msg.retried = True
                    deliveries.append(msg)
                elif verdict == SEEN:
                    self.counters["duplicates"] += 1
                    self._reack(msg)  # the origin did not hear our earlier acknowledgement
                else:
                    self._deliver_ordered(msg, prev, env.attempt, now, deliveries)
            elif self.delivery_filter.seen(msg.origin, msg.seq, msg.qos):
                self.counters["duplicates"] += 1
                if msg.qos:
                    self._reack(msg)  # the origin did not hear our earlier acknowledgement
            else:
                if env.attempt:
                    msg.retried = True  # (a retransmission from custody: late, replica.py)
                deliveries.append(msg)
                if msg.qos and self._held:  # (a predecessor sent unordered: restored custody)
                    self._release_after(msg.origin, msg.seq, deliveries)
            return
        dests = self.forward_filter.claim((msg.origin, msg.seq, env.attempt), env_dests)
        if len(dests) < len(env_dests):
            self.counters["duplicates"] += 1
        if not dests:
            return
        pmap = env.predecessors()
        if me in dests:
            if msg.qos:
                prev = pmap.get(me, 0) if pmap is not None else 0
                if prev:
                    self._deliver_ordered(msg, prev, env.attempt, now, deliveries)
                else:
                    self._deliver_one(msg, env.attempt, deliveries)
            elif not self.delivery_filter.seen(msg.origin, msg.seq, 0):
                deliveries.append(msg)
            if len(dests) == 1:
                return
            dests = [d for d in dests if d != me]
        if env.hop_limit <= 1:
            self.counters["hop_limit_drops"] += 1
            return
        self._send_envelope(for_dests(msg, dests, env.hop_limit - 1, env.attempt, pmap, shares))

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
        record = encode_unicast(dest, self.node_id, hop_limit or self.settings.hop_limit, kind, payload)
        self._unicast_out.setdefault(hop, []).append(record)
        return True

    def reaches(self, dest: str) -> bool:
        """Is there a route to node ``dest`` (another node) now (``send_unicast`` would send)?"""
        if dest == self.node_id:
            return False
        self._ensure_spf()
        return dest in self.next_hop

    def _receive_unicast(self, peer: str, kind: str, payload: bytes, now: float) -> Inbound:
        """``uni``: unicast records, for this node or to pass on."""
        self._stats(peer).control_in += 1
        unicasts = []
        for dest, frm, hops, uni_kind, body, age in decode_unicasts(payload, now + self.wall_offset):
            if dest == self.node_id:
                unicasts.append(Unicast(frm, uni_kind, body, age / 1000.0))
            elif hops > 1:
                self._ensure_spf()
                hop = self.next_hop.get(dest)
                if hop is not None:
                    record = encode_unicast(dest, frm, hops - 1, uni_kind, body, age)
                    self._unicast_out.setdefault(hop, []).append(record)
            else:
                self.counters["hop_limit_drops"] += 1
        return Inbound((), unicasts) if unicasts else NOTHING

    # ------------------------------------------------------------------ output (engine.flush)

    def _flush_outbox(self, sends: list[Send], now: float) -> None:
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
                    sends.append(self._batch(peer, envelopes[start : i + 1], stats, now))
                    start, size = i + 1, 0
            sends.append(self._batch(peer, envelopes[start:], stats, now))

    def _batch(self, peer: str, envelopes: list[Envelope], stats: PeerStats, now: float) -> Send:
        stats.batches_out += 1
        qos = 1 if any(e.msg.qos for e in envelopes) else 0
        return _new_tuple(
            Send, (peer, "fwd", encode_batch(envelopes, now, now + self.wall_offset), qos)
        )  # Send(...) at half the cost

    def _flush_unicasts(self, sends: list[Send], now: float) -> None:
        unicast, self._unicast_out = self._unicast_out, {}
        for peer, records in unicast.items():
            if peer in self._links:
                payload = encode_unicasts(records, now + self.wall_offset)
                stats = self._stats(peer)
                stats.control_out += 1
                stats.control_bytes_out += len(payload)
                sends.append(Send(peer, "uni", payload, 1))
