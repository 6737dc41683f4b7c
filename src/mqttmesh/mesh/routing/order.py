"""Ordered delivery: each origin's QoS 1/2 messages reach this node's subscribers in the order
the origin routed them [MQTT-4.6.0-5, MQTT-4.6.0-6], whatever path or retransmission brought them.

Pure. A part of ``MeshEngine`` (engine.py, a mixin over engine_base.EngineState). The origin
gives every QoS 1/2 message, per destination, its predecessor: the previous QoS 1/2 message
it routed to that node (``_last_to``; envelope.py carries it). A destination delivers a
message once its predecessor was delivered here (the delivery filter knows) and otherwise
holds it (``_held``) and asks the origin for the predecessor (``nack``). The origin
retransmits it at once if that destination has not acknowledged it yet, and otherwise
answers ``skip`` (it was delivered before this node restarted, or custody gave up on it):
the held message goes out then. Delivering a message releases what waited for it. Nothing
is ever dropped for the sake of order: a message waits at most ``reorder_wait`` (the origin
out of reach, say) and ``reorder_limit`` messages at most wait on a node; a held message is
not acknowledged, so its origin keeps it in custody meanwhile.

    nack   routed to the origin:       to=origin  from=destination  seqs=predecessors wanted
    skip   routed to the destination:  to=destination  from=origin  seqs=predecessors not coming

Both use the ``e2e`` acknowledgement format (wire.py). What it leaves to its caller: as for
every delivery, the dispatch to sessions and ``delivered(msg)`` once it is safe; and calling
``release_held(now)`` on its timer, which hands back what waited too long.
"""

from __future__ import annotations

from collections.abc import Sequence

from ...message import Message
from .actions import NOTHING, Inbound, Send
from .engine_base import EngineState
from .envelope import for_dests
from .records import Held
from .wire import AckGroup, decode_acks, encode_acks

__all__ = ["Held", "OrderMixin"]


class OrderMixin(EngineState):
    # ------------------------------------------------------------------ at the destination

    def _deliver_ordered(self, msg: Message, prev: int, attempt: int, now: float, out: list[Message]) -> None:
        """A QoS 1/2 message for this node whose predecessor from its origin is ``prev``."""
        origin = msg.origin
        df = self.delivery_filter
        if (origin, msg.seq) in self._held_ids:
            self.counters["duplicates"] += 1  # a retransmission of a message already waiting
            return
        if df.has(origin, prev):
            self._deliver_one(msg, attempt, out)
            return
        if df.has(origin, msg.seq):
            # delivered already (its predecessor was skipped, or waited too long): a late copy
            self.counters["duplicates"] += 1
            self._reack(msg)
            return
        held = self._held.get(origin)
        if held is None:
            held = self._held[origin] = {}
        elif prev in held:
            # two messages after one predecessor: the origin's chain restarted (not ours to
            # untangle); deliver this one now rather than lose track of it
            self.counters["reorder_unordered"] += 1
            self._deliver_one(msg, attempt, out)
            return
        held[prev] = Held(msg, attempt, now)
        self._held_ids.add((origin, msg.seq))
        self.counters["reorder_held"] += 1
        if (origin, prev) not in self._held_ids:  # (the predecessor is here, waiting itself)
            self._order_out.setdefault(("nack", origin), []).append(prev)
        if len(self._held_ids) > self.settings.reorder_limit:
            self.counters["reorder_overflow"] += 1
            first = next(iter(held))
            self._release(origin, held, first, out)

    def _deliver_one(self, msg: Message, attempt: int, out: list[Message]) -> None:
        """Deliver ``msg`` unless it was delivered before, then what waited for it."""
        if self.delivery_filter.seen(msg.origin, msg.seq, msg.qos):
            self.counters["duplicates"] += 1
            self._reack(msg)  # the origin did not hear our earlier acknowledgement
            return
        msg.retried = attempt > 0  # (a retransmission from custody: late, replica.py)
        out.append(msg)
        if self._held:
            self._release_after(msg.origin, msg.seq, out)

    def _release_after(self, origin: str, seq: int, out: list[Message]) -> None:
        """``seq`` of ``origin`` was just delivered: deliver the chain that waited for it."""
        held = self._held.get(origin)
        while held:
            h = held.pop(seq, None)
            if h is None:
                break
            m = h.msg
            self._held_ids.discard((origin, m.seq))
            seq = m.seq
            if self.delivery_filter.seen(origin, seq, m.qos):
                self.counters["duplicates"] += 1
                self._reack(m)
                continue
            m.retried = h.attempt > 0
            out.append(m)
        if held is not None and not held:
            del self._held[origin]

    def _release(self, origin: str, held: dict[int, Held], prev: int, out: list[Message]) -> None:
        """Stop waiting for ``prev``: deliver what waited for it, then its chain."""
        h = held.pop(prev)
        self._held_ids.discard((origin, h.msg.seq))
        if not held:
            del self._held[origin]
        self._deliver_one(h.msg, h.attempt, out)

    def release_held(self, now: float) -> list[Message]:
        """On the timer: what waited ``reorder_wait`` goes out (deliver it like ``receive``'s
        deliveries); the origins of the rest are asked again every ``retransmit_after``."""
        out: list[Message] = []
        if not self._held:
            return out
        wait = self.settings.reorder_wait
        again = self.settings.retransmit_after
        for origin in sorted(self._held):
            held = self._held.get(origin)
            if not held:
                continue
            # oldest first: a release delivers the chain behind it, in order
            for prev in sorted(held, key=lambda p: held[p].msg.seq):  # noqa: B023 (sorted at once)
                h = held.get(prev)
                if h is None:
                    continue  # (delivered by the chain of one released before it)
                if now - h.since >= wait:
                    self.counters["reorder_timeouts"] += 1
                    self._release(origin, held, prev, out)
                elif now - h.asked >= again and (origin, prev) not in self._held_ids:
                    h.asked = now
                    self._order_out.setdefault(("nack", origin), []).append(prev)
        self.counters["delivered"] += len(out)
        self._released_shares(out, now)
        return out

    def _released_shares(self, out: list[Message], now: float) -> None:
        """Messages that waited for their predecessor go out now: one chosen to serve a group
        here that has no member here any more goes on, as from ``receive``."""
        if out and (self._share_nodes or any(getattr(m, "shares", None) for m in out)):
            self._served_elsewhere(out, now)

    # ------------------------------------------------------------------ nack and skip

    def _receive_order(self, peer: str, kind: str, payload: bytes, now: float) -> Inbound:
        """``nack`` (at the origin: send a predecessor again, or say it is not coming) and
        ``skip`` (at the destination: stop waiting for it), or either to pass on."""
        self._stats(peer).control_in += 1
        me = self.node_id
        out: list[Message] = []
        for to, frm, seqs in decode_acks(payload):
            if to != me:
                self._ensure_spf()
                hop = self.next_hop.get(to)
                if hop is not None:
                    self._order_relay.setdefault((kind, hop), []).append(AckGroup(to, frm, seqs))
            elif kind == "nack":
                self._answer_nack(frm, seqs)
            else:
                held = self._held.get(frm)
                for prev in seqs:
                    if held and prev in held:
                        self.counters["reorder_skipped"] += 1
                        self._release(frm, held, prev, out)
                        held = self._held.get(frm)
        if not out:
            return NOTHING
        self.counters["delivered"] += len(out)
        self._released_shares(out, now)
        return Inbound(out, ())

    def _answer_nack(self, dest: str, seqs: Sequence[int]) -> None:
        """``dest`` waits for these messages of ours: send each again to it alone, or say skip."""
        skip = []
        for seq in seqs:
            c = self.custody.get(seq)
            if c is not None and dest in c.dests:
                c.attempt = min(c.attempt + 1, 255)  # (a new attempt: the relays' forward filters)
                self.counters["reorder_resent"] += 1
                self._send_envelope(
                    for_dests(c.msg, [dest], self.settings.hop_limit, c.attempt, c.predecessors(), c.shares)
                )
            else:
                skip.append(seq)
        if skip:
            self._order_out.setdefault(("skip", dest), []).extend(skip)

    # ------------------------------------------------------------------ output (engine.flush)

    def _flush_order(self, sends: list[Send]) -> None:
        if self._order_out:
            out, self._order_out = self._order_out, {}
            self._ensure_spf()
            me = self.node_id
            for (kind, to), seqs in out.items():
                hop = self.next_hop.get(to)
                if hop is not None:  # (out of reach: a nack is asked again, a skip asked for again)
                    self._order_relay.setdefault((kind, hop), []).append(AckGroup(to, me, seqs))
        relay, self._order_relay = self._order_relay, {}
        for (kind, peer), groups in relay.items():
            if peer in self._links:
                payload = encode_acks(groups)
                stats = self._stats(peer)
                stats.control_out += 1
                stats.control_bytes_out += len(payload)
                sends.append(Send(peer, kind, payload, 0))
