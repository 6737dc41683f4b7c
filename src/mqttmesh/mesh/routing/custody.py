"""Custody: QoS 1/2 messages held at their origin until every destination acknowledged them.

(Or at the node that routes a message again for its origin, under the origin's id: a
persistent publisher's QoS 2 message whose id its session's holders agreed on, when the
session moved before the message was known to be out, mesh/cluster/replica.py. The destinations'
duplicate filters drop a second copy; their acknowledgements go to that node, named in the
envelope, as "node NUL origin" in the ack's sender field. That node journals it too, keyed
by (origin, seq): once the publisher is done with it, it may be the only copy.)

Pure. A part of ``MeshEngine`` (engine.py, a mixin over engine_base.EngineState):
end-to-end acknowledgements out (after a delivery is safe), in (releasing custody)
and relayed towards their origin; retransmission with backoff; giving up after
``custody_timeout``, on overflow, or when a destination ages out of the database.
It leaves durability to a ``CustodyJournal`` given to the engine's constructor
(the broker's store journal), or to nobody: custody is then in memory only.
"""

from __future__ import annotations

from collections.abc import Sequence

from ...message import Message
from ...shared import is_resend_mark, resend_mark, root_of
from .actions import NOTHING, Inbound, Send
from .engine_base import EngineState
from .envelope import for_dests
from .records import Custody, CustodyJournal, Hold
from .shares import only, share_entries, split_entries
from .wire import AckGroup, decode_acks, encode_acks

__all__ = ["Custody", "CustodyJournal", "CustodyMixin"]


class CustodyMixin(EngineState):
    # ------------------------------------------------------------------ acknowledgements out

    def _ack(self, msg: Message) -> None:
        if self._holds and self._holding(msg):
            return  # members of this node's shared groups have it and have not acknowledged it
        to = msg.ack_to
        if to:  # routed again by another node for its origin: that node holds it in custody
            self._acks_for.setdefault((to, msg.origin), []).append(msg.seq)
            return
        # (not setdefault: that would make a list for every message; this runs once per one)
        seqs = self._acks_out.get(msg.origin)
        if seqs is None:
            seqs = self._acks_out[msg.origin] = []
        seqs.append(msg.seq)

    # A QoS 1/2 message from another node is safely ours: acknowledge it to its origin (one
    # name for the caller, no call more: it runs once per message)
    delivered = _ack

    def _reack(self, msg: Message) -> None:
        """A copy of ``msg`` came again (the origin did not hear our acknowledgement): say it
        again, unless members here still hold it (then it is said when they settle)."""
        if self._holds and (msg.origin, msg.seq) in self._holds:
            return
        self._ack(msg)

    # ------------------------------------------------------------------ shared groups' holds

    def hold(self, msg: Message, now: float) -> None:
        """A member of a shared group here took ``msg``, another node's QoS 1/2 message: its
        acknowledgement to the origin waits for the member's (``settle``) as well as for the
        node's own (``delivered``), so that the origin keeps it in custody while the member
        has not acknowledged it, and sends it to another node's member should this node die
        meanwhile (``_lost_shares``)."""
        key = (msg.origin, msg.seq)
        held = self._holds.get(key)
        if held is None:
            held = self._holds[key] = Hold(msg, now)
            self.counters["shared_held"] += 1
        held.count += 1

    def settle(self, msg: Message) -> None:
        """A member that took ``msg`` (``hold``) acknowledged it, or it went to another
        member here, or another node, or to nobody (shared.py): one wait fewer."""
        if self._holds and (msg.origin, msg.seq) in self._holds:
            self._ack(msg)

    def hold_own(self, msg: Message, share: str, now: float) -> None:
        """A clean member of ``share`` here took ``msg``, our own QoS 1/2 message, and its
        publisher has (or will have) our acknowledgement: no other node has it, and the
        member's session ends with this node. Until the member settles it (``settle_own``),
        the store keeps a copy of it for the group alone, as a message kept for a group out of
        reach is kept (``_park``'s entry), so that a node killed with kill -9 and started again
        sends it to a member (a re-send, named by its root: a member that had it is not given
        it twice). Without a store there is nothing a restart could keep: nothing to do."""
        journal = self.custody_journal
        if journal is None or self.new_seq is None:
            return
        copy = self._group_copy(msg, now)
        if copy is None:
            return
        self._own_holds[(msg.seq, share)] = copy.seq
        self.counters["shared_held_here"] += 1
        journal.custody_put(copy, share_entries({"": only(copy, share)}))

    def settle_own(self, msg: Message, share: str) -> None:
        """The member that took ``msg`` for ``share`` (``hold_own``) acknowledged it, or it went
        on to another member (who holds it now), or to nobody: the stored copy goes."""
        seq = self._own_holds.pop((msg.seq, share), None)
        if seq is not None and self.custody_journal is not None:
            self.custody_journal.custody_remove(seq)

    def _holding(self, msg: Message) -> bool:
        """One of ``msg``'s waits ended: True while others remain (not acknowledged yet)."""
        key = (msg.origin, msg.seq)
        held = self._holds.get(key)
        if held is None:
            return False
        held.count -= 1
        if held.count > 0:
            return True
        del self._holds[key]
        return False

    def _expire_holds(self, now: float) -> None:
        """A wait longer than the origin's custody lasts is of no use: acknowledged (the member
        keeps the message; a hold that nothing settled, should a path forget one, ends too)."""
        holds = self._holds
        limit = now - self.settings.custody_timeout
        while holds:
            key, held = next(iter(holds.items()))
            if held.since > limit:
                break
            del holds[key]
            self.counters["shared_hold_expired"] += 1
            self._ack(held.msg)

    def _relay_ack(self, to: str, frm: str, seqs: Sequence[int]) -> None:
        self._ensure_spf()
        hop = self.next_hop.get(to)
        if hop is not None:
            self._acks_relay.setdefault(hop, []).append(AckGroup(to, frm, seqs))

    # ------------------------------------------------------------------ acknowledgements in

    def _receive_e2e(self, peer: str, kind: str, payload: bytes, now: float) -> Inbound:
        """``e2e``: acknowledgements, for our messages or to pass on towards their origin."""
        self._stats(peer).control_in += 1
        self._receive_acks(decode_acks(payload), now)
        return NOTHING

    def _receive_acks(self, groups: list[AckGroup], now: float) -> None:
        for to, frm, seqs in groups:
            if to == self.node_id:
                custody = self.custody
                keys: Sequence[int | tuple[str, int]] = seqs
                if "\0" in frm:  # messages of another origin we routed: frm is "node NUL origin"
                    frm, _, origin = frm.partition("\0")
                    keys = [(origin, seq) for seq in seqs]
                elif seqs:
                    # what ``frm`` has taken of ours, and when it last said so (_retransmit_due)
                    self._heard[frm] = now
                    top = max(seqs)
                    if top > self._acked_hi.get(frm, 0):
                        self._acked_hi[frm] = top
                for key in keys:
                    c = custody.get(key)
                    if c is not None:
                        c.dests.discard(frm)
                        if not c.dests:
                            del custody[key]
                            self._unjournal(key)
            else:
                self._relay_ack(to, frm, seqs)

    # ------------------------------------------------------------------ retransmission and release

    def restore_custody(self, msg: Message, dests: list[str], now: float) -> None:
        """A message held in custody before a restart: retransmit it soon, to the groups each
        destination served it for (shares.py ``share_entries``); one kept for a group whose
        nodes were out of reach (``_park``): kept again. Another origin's, which this node
        routed again (``route_local``): acknowledged to this node again."""
        plain, shares = split_entries(dests)
        kept = shares.pop("", None)
        if msg.origin != self.node_id:
            msg.ack_to = self.node_id
            key = (msg.origin, msg.seq)
            self.custody[key] = Custody(msg, set(plain) | shares.keys(), now, now, None, shares or None)
            return
        if kept:
            if len(kept) > 1:
                msg.shares = kept[:1]  # (a re-send's root, shares.py ``only``)
            self._parked.append((msg, kept[-1], now))
            return
        self.custody[msg.seq] = Custody(msg, set(plain) | shares.keys(), now, now, None, shares or None)

    def _retransmit_soon(self, now: float) -> None:
        """A link came up or went down: what it carried may be lost, send everything due again."""
        self._links_changed_at = now
        for c in self.custody.values():
            c.due = min(c.due, now)

    def _retransmit_due(self, now: float) -> None:
        if not self.custody:
            return
        settings = self.settings
        expired = []
        rerouted: list[tuple[Message, str]] = []
        self._ensure_spf()
        for key, c in self.custody.items():
            if c.due > now:
                continue
            if now - c.since > settings.custody_timeout:
                expired.append(key)
                continue
            if c.shares and self.new_seq is not None:
                rerouted += self._lost_shares(c, now)
                if not c.dests:
                    expired.append(key)
                    continue
            # every destination keeps it until it acknowledges: one whose subscriber left
            # acknowledges a message it delivers to nobody, and one across a partition is
            # waited for (its interest may not be known again yet when the split heals)
            # (sorted: a set's order would make the envelope depend on the hash seed)
            reachable = [d for d in sorted(c.dests) if d in self.next_hop]
            if reachable and type(key) is int and c.due > self._links_changed_at:
                # our own message, not made due by a link's change: a destination that has
                # acknowledged none of our later messages but is heard from (within the
                # timer) is taking what we sent in order and has not got this far: it is in
                # the pipe, not lost (resending it would double a loaded link's work); one
                # that took a later message lost it, one gone quiet may have (issue 20)
                seq = key
                acked_hi, heard, wait = self._acked_hi, self._heard, settings.retransmit_after
                lost = [d for d in reachable if acked_hi.get(d, 0) > seq or now - heard.get(d, -wait) >= wait]
                if len(lost) < len(reachable):
                    self.counters["custody_waited"] += 1
                    reachable = lost
                    if not reachable:
                        c.due = now + wait  # (no attempt: nothing was sent)
                        continue
            if not reachable:
                # nobody to send it to: no attempt, and no longer wait for the next one (the
                # route's return also makes it due: routes.py); fuzzer finding 15: a heal
                # found messages whose next try was 30 s away
                c.due = now + settings.retransmit_after
                continue
            c.attempt = min(c.attempt + 1, 255)
            c.due = now + min(30.0, settings.retransmit_after * (2 ** min(c.attempt, 4)))
            if reachable:
                self.counters["custody_retransmits"] += 1
                self._send_envelope(
                    for_dests(c.msg, reachable, settings.hop_limit, c.attempt, c.predecessors(), c.shares)
                )
        for key in expired:
            c = self.custody.pop(key)
            self._unjournal(key)
            if c.dests:
                self.counters["custody_expired"] += 1
        for msg, share in rerouted:
            # (to any node with a member in reach, this one too: finding 36, an origin whose
            # own members were the only ones left kept the copy for nodes that were gone)
            self._to_group_again(msg, share, now, here=True)

    def _lost_shares(self, c: Custody, now: float) -> list[tuple[Message, str]]:
        """The shared groups ``c``'s message was chosen to be served for on a node out of
        reach for ``shared_reroute`` seconds (its members most likely gone with it): taken off
        that node (it is still waited for if it has other subscribers; one that was there for
        its groups only is not), to be chosen again elsewhere. (message, group) each."""
        shares = c.shares
        assert shares is not None
        heard, wait = self._heard, self.settings.shared_reroute
        out: list[tuple[Message, str]] = []
        plain = None
        for d in [d for d in shares if d in c.dests and d not in self.next_hop]:
            if now - heard.get(d, c.since) < wait:
                continue
            groups = shares.pop(d)
            if plain is None:
                plain = self.remote.match(c.msg.topic)
            msg = c.msg
            if groups and is_resend_mark(groups[0]):
                c.dests.discard(d)  # (a destination for its groups alone)
                # a re-send: the next one names its root too (``_group_copy``), which the
                # message in custody no longer says (routing left it this node's groups, none:
                # dataplane.py ``_route_with_shares``; a restart's has none). Named after the
                # re-send itself, it went to a member that had the root (simulator, finding
                # 42's scenario, seed 62 with settle-batch: a QoS 2 message twice to a session)
                msg = msg.copy(shares=groups[:1])
            elif d not in plain:
                c.dests.discard(d)  # (a destination for its groups alone)
            out += [(msg, g) for g in groups if not is_resend_mark(g)]
        return out

    def _to_group_again(self, msg: Message, share: str, now: float, held: bool = False, here: bool = False) -> None:
        """``msg`` once more for ``share``, a new message of ours (a re-send: counted) to a
        member on another node in reach (``here``: or of this node, ``route_to_group``; for
        custody's re-route). ``held``: ``msg`` is another node's QoS 1/2 message
        delivered here, whose acknowledgement to its origin then waits (``hold``) until the
        new one leaves our custody, settled there (or given up), so that its origin still
        has it should this node die before (issue 24, simulator finding 35)."""
        copy = self._group_copy(msg, now)
        if copy is None:
            return
        self.counters["shared_rerouted"] += 1
        if not (held and copy.qos):
            self.route_to_group(copy, share, now, here)
            return
        self.hold(msg, now)
        seq = copy.seq
        self._after[seq] = msg
        self.route_to_group(copy, share, now, here)
        parked = self._parked
        if seq not in self.custody and not (parked and parked[-1][0] is copy):
            self._settle_after(seq)  # (it went nowhere: nothing to wait for)

    def _group_copy(self, msg: Message, now: float) -> Message | None:
        """``msg`` as a new message of ours (for one shared group: ``route_to_group``), with
        what is left of its life; None once it expired [MQTT-3.3.2-5]."""
        assert self.new_seq is not None
        stamp = now + self.wall_offset
        copy = Message(msg.topic, msg.payload, msg.qos, False, self.node_id, self.new_seq(), msg.publisher, stamp)
        copy.props = msg.props
        copy.shares = (resend_mark(root_of(msg)),)  # (what it re-sends: shares.py ``only``)
        if msg.expires is not None:
            left = msg.expires - now
            if left <= 0.0:
                return None
            copy.expiring(left, now)
        return copy

    def _release_custody(self, node: str) -> None:
        """``node`` has aged out of the database: stop holding messages for it."""
        done = []
        for key, c in self.custody.items():
            if node in c.dests:
                c.dests.discard(node)
                self.counters["custody_expired"] += 1
                if not c.dests:
                    done.append(key)
        for key in done:
            del self.custody[key]
            self._unjournal(key)

    def _unjournal(self, key: int | tuple[str, int]) -> None:
        """A message left custody: out of the journal too (our own by its number, another
        origin's that we routed again by its id)."""
        journal = self.custody_journal
        if journal is not None:
            if type(key) is int:
                journal.custody_remove(key)
            else:
                journal.rerouted_remove(*key)  # type: ignore[misc]  # (origin, seq)
        if self._after:
            self._settle_after(key)

    def hold_until_acked(self, seq: int, msg: Message) -> None:
        """``msg``, another node's message a member here held (``hold``), went on as our
        message ``seq`` to a member of another node (shares.py ``route_to_group``): its wait
        here ends once ``seq`` leaves our custody, acknowledged there (or given up), so that
        its origin still has it should this node die before."""
        self._after[seq] = msg

    def _settle_after(self, key: int | tuple[str, int]) -> None:
        if type(key) is int:  # (our own: the only ones that went on for a held message)
            msg = self._after.pop(key, None)
            if msg is not None:
                self.settle(msg)

    # ------------------------------------------------------------------ output (engine.flush)

    def _flush_acks(self) -> None:
        """Our own acknowledgements join the relayed ones, per next hop towards each origin."""
        acks, self._acks_out = self._acks_out, {}
        for origin, seqs in acks.items():
            self._relay_ack(origin, self.node_id, seqs)
        if self._acks_for:
            acks_for, self._acks_for = self._acks_for, {}
            for (to, origin), seqs in acks_for.items():
                self._relay_ack(to, self.node_id + "\0" + origin, seqs)

    def _flush_relayed_acks(self, sends: list[Send]) -> None:
        relay, self._acks_relay = self._acks_relay, {}
        for peer, groups in relay.items():
            if peer in self._links:
                payload = encode_acks(groups)
                stats = self._stats(peer)
                stats.control_out += 1
                stats.control_bytes_out += len(payload)
                sends.append(Send(peer, "e2e", payload, 0))
