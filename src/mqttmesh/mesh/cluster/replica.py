"""Persistent sessions that live on several nodes: message identity and settling.

Pure. In a mesh every persistent session is held by a few nodes (its holders):
all of them subscribe, so the mesh delivers each message to each holder, and
each queues it; only the node the client is connected to sends to the client.
That node tells the other holders which messages are settled. This module
gives the session what that needs: entries known by message id (origin, seq),
tombstones of settled ids and a hook for every settlement; its state as one copy
sends it to another is snapshots.py's. The protocol around it is in
claimant.py (gathering the copies for a client that connects) and holders.py (keeping
them); what a session reports goes through its hooks to replication.py.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING

from ...codec import PubRel, encode
from ...message import Message
from ...session import SENT_PUBLISH, SENT_PUBREL, Entry, Session
from ...shared import root_of

if TYPE_CHECKING:
    from ...ports import Batch

__all__ = [
    "SubsHook",
    "LateHook",
    "SettledHook",
    "WaitHook",
    "TOMBSTONES",
    "RELEASED",
    "released_id",
]

# settled message ids remembered per session (duplicates suppressed); past it the oldest are
# forgotten and the session's floor for their origin rises (``_Replicated.forgotten``)
TOMBSTONES = 50_000

# a released inbound QoS 2 message (its PUBREL came) is remembered among the settled ids under
# its origin with this mark, which no node id has (config.py: [A-Za-z0-9._:-]), so it is never
# taken for a message delivered to the session: a merge knows a copy that still has its packet
# id awaiting PUBREL for it is behind (snapshots.py merge_snapshots)
RELEASED = "rel/"


def released_id(key: tuple[str, int]) -> tuple[str, int]:
    """The settled id that says inbound QoS 2 message ``key`` (origin, seq) was released."""
    return (RELEASED + key[0], key[1])


# ``_Replicated.unreleased`` is pruned of what the gate passed when it reaches this size
UNRELEASED_PRUNE = 256

# a message given to another member of its shared group (``given_away``) is settled, and
# remembered under its root with this mark too: a re-send of it (shared.py ``resend_mark``)
# may come back to this session, which no longer has it (``had``)
GIVEN = "gave/"


def given_id(root: tuple[str, int]) -> tuple[str, int]:
    return (GIVEN + root[0], root[1])


# (session, message id, state, packet id, message) of a settlement: outbound "sent", "rel",
# "done"; inbound QoS 2 "in" (PUBREC is due: the id awaits its PUBREL) and "free" (PUBREL
# came). An "in" carries the message and the id it is routed under (its origin is the node
# that took it); "free", and an "in" without a message, have message id ("", 0)
SettledHook = Callable[["_Replicated", tuple[str, int], str, int, "Message | None"], None]
# (session, message): a copy whose client is on another node took a message that node may
# never have had (Replication.late hands it over)
LateHook = Callable[["_Replicated", "Message"], None]
# (session): the client changed its subscriptions here (Replication.subs_changed tells the holders)
SubsHook = Callable[["Session"], None]
# (session): a frame of its client waits for a settlement the holders have not confirmed
# (Replication.hurry: the settlements go this loop iteration, not within mesh.batch_delay)
WaitHook = Callable[["_Replicated"], None]


# _Replicated is mixed in before Session or DurableSession: a type checker sees it as a Session
# (at run time its base is object, so the MRO is MeshSession, _Replicated, Session as before)
if TYPE_CHECKING:
    _SessionPart = Session
else:
    _SessionPart = object


class _Replicated(_SessionPart):
    """Mixed in before Session/DurableSession: keeps every entry findable by message id."""

    def _init_replication(
        self,
        on_settled: SettledHook | None,
        on_late: LateHook | None = None,
        on_subs: SubsHook | None = None,
        on_shared: LateHook | None = None,
        on_wait: WaitHook | None = None,
    ) -> None:
        self.ids: dict[tuple[str, int], Entry] = {}  # (origin, seq) -> its entry
        self.done: OrderedDict[tuple[str, int], None] = OrderedDict()  # settled ids, oldest first
        # origin -> the highest sequence number whose settlement this copy forgot (``done``
        # keeps TOMBSTONES ids): an id at or below it that the copy neither holds nor
        # remembers cannot be told apart from a new one any more (``forgotten``)
        self.floors: dict[str, int] = {}
        self.forgotten_qos2 = 0  # QoS 2 messages taken as settled for being below the floor
        # every settlement, for the other holders (Replication.on_settled); None in tests
        self.on_settled = on_settled
        self.on_late = on_late
        self.on_subs = on_subs
        # (session, message): its home took a message for it through a shared group, which the
        # mesh brings to no other holder: Replication.shared_taken sends it to them
        self.on_shared = on_shared
        self.on_wait = on_wait
        self.gate = self  # (session.Gate: a frame after settlement n waits until the holders have n)
        # origin -> the highest sequence number this copy took from it: a message that comes
        # in below it came late (a retransmission after a partition, a crash, a pause)
        self.highest: dict[str, int] = {}
        self.active_node: str | None = None
        # the node the client was on before a claim (here: the gathered copies' ``active``;
        # at a holder: what the copy named when the claim's fetch re-pointed it), until the
        # claim served it: told then if no holder (holders.py ``_tell_old_home``)
        self.came_from: str | None = None
        # an old home a claim could not tell (out of reach): told when it is back (holders.py)
        self.old_home: str | None = None
        self.epoch = 0
        self.subs_version = 0
        # settlements made, ever, by the holders the client was on: the holder with the
        # highest (epoch, version) has the latest inbound QoS 2 state (merge_snapshots)
        self.version = 0
        # while the client is here: the version each other holder said it has (sess.ack), and
        # the lowest of them over the live holders (frames that need more wait, channel.py)
        self.holder_acks: dict[str, int] = {}
        self.safe_version = 0
        # while the client is here: the version of the last settlement batch sent to the other
        # holders; the next one gathers until they have it (holders.py ``flush``)
        self.sent_version = 0
        # while the client is here: a frame waits for a settlement not confirmed yet (``wait``):
        # settlements go, and are answered, at once; else within mesh.batch_delay, answered so
        # too (nothing waits: the QoS 1 PUBACKs of a subscriber's client). ``sent_later``: the
        # batch out went so (a hurried one goes beside it: holders.py ``flush``)
        self.hurry = False
        self.sent_later = False
        # message id -> (state, packet id) settled by the node the client is on before the
        # message itself reached this copy (the mesh brings it later): it takes that id then
        self.reserved: dict[tuple[str, int], tuple[int, int]] = {}
        # inbound QoS 2: packet id awaiting PUBREL -> its message, under the id the holders
        # agreed on ("in"): whichever holder the client is on routes it under that id, and
        # the duplicate filters keep it to one delivery (channel.py, mesh/routing/custody.py)
        self.inbound: dict[int, Message] = {}
        self.routed_here: set[tuple[str, int]] = set()  # ids of ``inbound`` this node routed
        # ids of ``inbound`` routed -> the journal batch keeping the route (0: routed by another
        # node, as a copy said); ``routed_ids`` names the committed ones (docs/design.md 3.8)
        self.routed_batch: dict[tuple[str, int], int] = {}
        # outbound QoS 2 (and QoS 1 framed behind an unconfirmed step): packet id -> the gate's
        # ticket its PUBLISH waits for, while the other holders had not confirmed every step
        # when it was framed (``_send_new``): if the client leaves before the gate passes it,
        # the client never had it (``detach``)
        self.unreleased: dict[int, int] = {}
        # QoS 2 messages queued again at ``detach`` whose "sent" step had gone to the holders
        # unconfirmed: one of them may serve it as in flight, so it stays this member's
        # (``keeps``: not handed to another member of its group)
        self.maybe_sent: set[tuple[str, int]] = set()

    def _report(self, key: tuple[str, int], state: str, pid: int, msg: Message | None = None) -> None:
        self.version += 1
        self._stored_version()
        self.on_settled(self, key, state, pid, msg)  # type: ignore[misc]  # (callers checked it is set)

    def ticket(self) -> int:
        return self.version

    def passed(self) -> int:
        return self.safe_version

    def wait(self, ticket: int) -> None:
        """A frame of the client waits for ``ticket`` (session.Gate): what the holders have
        not confirmed goes, and is answered, at once (``hurry``; confirm.py ``_advance`` ends it)."""
        if not self.hurry and ticket > self.safe_version:
            self.hurry = True
            if self.on_wait is not None:
                self.on_wait(self)

    def subscribe(self, topic_filter: str, qos: int) -> None:
        super().subscribe(topic_filter, qos)
        if self.channel is not None and self.on_subs is not None:
            self.on_subs(self)  # (the client's change: the holders' copies follow it)

    def unsubscribe(self, topic_filter: str) -> bool:
        if not super().unsubscribe(topic_filter):
            return False
        if self.channel is not None and self.on_subs is not None:
            self.on_subs(self)
        return True

    @property
    def routes_when_agreed(self) -> bool:
        return self.on_settled is not None

    def route_here(self, msg: Message) -> bool:
        key = (msg.origin, msg.seq)
        if key in self.routed_here:
            return False
        self.routed_here.add(key)
        return True

    def routed_in(self, msg: Message, batch: int) -> None:
        """This node routed ``msg`` (``route_here`` said so); ``batch``: the journal batch that
        keeps it (0: none to wait for)."""
        self.routed_batch[(msg.origin, msg.seq)] = batch

    def committed(self) -> int:
        """The last journal batch in this node's store (DurableMeshSession); in memory, every
        batch counts as committed."""
        return 1 << 62

    def routed_ids(self) -> list[tuple[str, int]]:
        """The ids of ``inbound`` some node routed, kept in its store by now."""
        batches = self.routed_batch
        if not batches:
            return []
        committed = self.committed()
        out = []
        for msg in self.inbound.values():
            batch = batches.get((msg.origin, msg.seq))
            if batch is not None and batch <= committed:
                out.append((msg.origin, msg.seq))
        return out

    def _stored_version(self) -> None:
        """(epoch, version) changed; a store keeps them (DurableMeshSession)."""

    tombstones_stored = 0  # settled ids put in a store, ever (its ring has TOMBSTONES slots)

    def _stored_done(self, key: tuple[str, int]) -> None:
        """This copy settled message ``key`` that it had (or was told of): a store keeps the
        id (DurableMeshSession), so that after a restart a copy that never heard of the
        settlement does not bring the message back through a merge."""

    def _settled_id(self, key: tuple[str, int]) -> None:
        """Message ``key`` is settled for this session: remembered, and stored."""
        self._remember_done(key)
        self._stored_done(key)

    def _remember_done(self, key: tuple[str, int]) -> None:
        done = self.done
        done[key] = None
        if len(done) > TOMBSTONES:
            old, _ = done.popitem(last=False)
            self._raise_floor(old[0], old[1])

    def _raise_floor(self, origin: str, seq: int) -> None:
        if seq > self.floors.get(origin, -1):
            self.floors[origin] = seq
            self._stored_floor(origin, seq)

    def _stored_floor(self, origin: str, seq: int) -> None:
        """The floor of ``origin`` rose; a store keeps it (DurableMeshSession)."""

    def forgotten(self, key: tuple[str, int], qos: int) -> bool:
        """A message at QoS 2 that this copy neither holds nor remembers, at or below the
        floor of its origin: it may have been settled and forgotten, so it is taken as
        settled (exactly once never becomes twice); at QoS 0/1 it is taken as new (at least
        once never becomes never). The node's delivery filter decides the same way
        (mesh/routing/dedup.py). Only a message that reached no copy of the session for as long as
        TOMBSTONES others were settled can be taken for settled wrongly."""
        if qos != 2:
            return False
        floor = self.floors.get(key[0])
        return floor is not None and key[1] <= floor and key not in self.ids

    def deliver(self, msg: Message, qos: int, retain: bool = False) -> None:
        if not retain:  # a retained copy is a re-send by design, never a duplicate
            key = (msg.origin, msg.seq)
            if key in self.ids or key in self.done:
                return  # already here: arrived by another path during a hand-over
            if self.floors and self.forgotten(key, qos):
                self.forgotten_qos2 += 1
                return
            highest = self.highest
            top = highest.get(key[0], -1)
            if key[1] > top:
                highest[key[0]] = key[1]
            if self.channel is None and qos and self.on_late is not None and (key[1] < top or msg.retried):
                # late: the node the client is on may have taken every message the mesh
                # brought it before this one reached the session's copies (it was no
                # destination of it for this session: the session was not there when it was
                # routed); it takes it, or answers "done" if it settled it
                self.on_late(self, msg)
            if qos == 0 and self.channel is not None:
                self._remember_done(key)
            if self.sharing is not None and self.on_shared is not None:
                self.on_shared(self, msg)  # (its copies queue it too: a claim elsewhere has it)
            if self.reserved and qos and key in self.reserved:
                self._deliver_reserved(msg, qos, key)
                return
        super().deliver(msg, qos, retain)

    def _deliver_reserved(self, msg: Message, qos: int, key: tuple[str, int]) -> None:
        """A message the client already had (under a packet id) reached this copy late: it
        keeps that id and state, and is re-sent as such (DUP=1 PUBLISH, or PUBREL)."""
        state, pid = self.reserved.pop(key)
        if pid in self.inflight:  # (the id is taken again: only a queued copy can be kept)
            super().deliver(msg, qos)
            return
        entry = self._new_entry(msg, qos, False)
        entry.packet_id, entry.state = pid, state
        self.in_flight()[pid] = entry
        self._stored_put(entry)
        channel = self.channel
        if channel is not None:
            if state == SENT_PUBREL:
                channel.write(encode(PubRel(pid)))
            else:
                channel.write(channel.frame(msg, qos, pid, True, False))

    stores = True  # (its ids: Session calls the hooks below only when this is set)

    def _stored_put(self, entry: Entry) -> None:
        super()._stored_put(entry)
        if not entry.retain:
            self.ids[(entry.msg.origin, entry.msg.seq)] = entry

    def _stored_remove(self, entry: Entry) -> None:
        super()._stored_remove(entry)
        key = (entry.msg.origin, entry.msg.seq)
        if self.maybe_sent:
            self.maybe_sent.discard(key)
        if self.ids.pop(key, None) is not None:
            self._settled_id(key)
            if self.on_settled is not None and self.channel is not None:
                self._report(key, "done", 0)

    def keeps(self, entry: Entry) -> bool:
        """A QoS 2 message whose "sent" step left for the holders unconfirmed when the client
        left (``detach``): a holder that had it may serve it to this member's client as in
        flight (a claim on its side of a partition), so it goes to no other member [MQTT-4.8.2-4]
        (fault harness, 7 nodes, 3.1.1, shared, seed 1: a node cut off from its majority
        handed such a message to a member beside it, and the claim across the cut served it)."""
        return bool(self.maybe_sent) and (entry.msg.origin, entry.msg.seq) in self.maybe_sent

    def given_away(self, entry: Entry) -> None:
        """To another member of its group (shared.py ``take_entries``), at its home: settled
        at the other holders too, whose copies may have it (a copy sent when its client came
        or left), client here or not; and so is its root's mark (``had``)."""
        key = (entry.msg.origin, entry.msg.seq)
        reported = self.channel is not None
        had = key in self.ids
        self._stored_remove(entry)
        if had and not reported and self.on_settled is not None:
            self._report(key, "done", 0)
        self._settle_mark(given_id(root_of(entry.msg)))

    def _settle_mark(self, key: tuple[str, int]) -> None:
        """``key`` (a root, or a mark on it) settled here and, told, at the other holders."""
        if key in self.done:
            return
        self._settled_id(key)
        if self.on_settled is not None:
            self._report(key, "done", 0)

    def had(self, root: tuple[str, int]) -> bool:
        if root in self.ids:
            return True
        done = self.done
        if root not in done:
            return False
        if given_id(root) not in done:
            return True
        # (given away, and maybe back since as a re-send it still has: rare, a scan)
        return any(root_of(e.msg) == root for e in self.ids.values())

    def refuses(self, key: tuple[str, int], qos: int) -> bool:
        if key in self.ids:
            return False
        return key in self.done or bool(self.floors) and self.forgotten(key, qos)

    def took_resend(self, root: tuple[str, int]) -> None:
        if root not in self.ids:
            self._settle_mark(root)  # (the root itself, should it come: a duplicate)

    def detach(self) -> None:
        """The client left. A QoS 2 PUBLISH that still waited for the gate (its "sent" not
        confirmed by every live holder: a partition, a node cut off from its session's other
        holders) was never written, nor was a QoS 1 PUBLISH written after a step the gate
        still held (behind it, in order; taken as held while any step was unconfirmed when it
        was framed: a QoS 1 message may then come twice, never not at all): its entry is
        queued again, not in flight, so that a claim
        elsewhere that never heard of it does not take it for completed (snapshots.py
        ``merge_snapshots`` drops what an older claim had in flight and a newer one has not;
        fault harness, 7 nodes, seed 2: 20 QoS 2 messages a member's node took while cut off
        from its holders). A shared group's member hands a QoS 1 one on like anything queued,
        not a QoS 2 one: a holder may have its "sent" (``keeps``)."""
        self._passed(self.safe_version)  # (what the gate let out stays in flight)
        unreleased, self.unreleased = self.unreleased, {}
        back = []
        for pid, ticket in sorted(unreleased.items(), key=lambda item: item[1]):
            entry = self.inflight.get(pid)
            if entry is not None and entry.ticket == ticket:
                entry.ticket = 0
                if entry.state == SENT_PUBLISH:
                    back.append(self.inflight.pop(pid))
                else:
                    self._stored_put(entry)  # (PUBREC'd: the client had it)
        for entry in reversed(back):
            entry.packet_id, entry.state = 0, 0
            if entry.qos == 2:
                self.maybe_sent.add((entry.msg.origin, entry.msg.seq))
            self.queued().appendleft(entry)
            if self.stores:
                self._stored_put(entry)
        self.hurry = self.sent_later = False
        super().detach()

    def restore_entry(self, entry: Entry) -> None:
        super().restore_entry(entry)
        self.ids[(entry.msg.origin, entry.msg.seq)] = entry  # found by id, as _stored_put does

    def _unreleased(self, entry: Entry) -> None:
        """The frame of ``entry`` waits for the gate's current ticket (``detach``); a store
        keeps the entry as queued until the gate passes it (store.py ``_snapshot``): a copy
        restarted after a kill -9 must not have it in flight, which a merge with a newer claim
        takes for completed (docs/design.md 3.4)."""
        unreleased = self.unreleased
        if len(unreleased) >= UNRELEASED_PRUNE:
            self._passed(self.safe_version)
            unreleased = self.unreleased
        unreleased[entry.packet_id] = entry.ticket = self.version

    def confirmed(self, safe: int) -> None:
        """Every other live holder has the settlements up to ``safe``: the gate lets out the
        frames that waited for them (mesh/cluster/confirm.py)."""
        self.safe_version = safe
        if self.unreleased:
            self._passed(safe)

    def _passed(self, safe: int) -> None:
        """The frames of tickets up to ``safe`` may have left: their entries are stored as
        in flight again."""
        inflight = self.inflight
        keep = {}
        for pid, ticket in self.unreleased.items():
            if ticket > safe:
                keep[pid] = ticket
                continue
            entry = inflight.get(pid)
            if entry is not None and entry.ticket == ticket:
                entry.ticket = 0
                self._stored_put(entry)
        self.unreleased = keep

    def _send_new(self, entry: Entry) -> None:
        if entry.qos != 2 or entry.retain or self.on_settled is None:
            super()._send_new(entry)
            if entry.qos == 1 and not entry.retain and self.on_settled is not None and self.version > self.safe_version:
                # (a QoS 1 PUBLISH is written behind the frames the gate holds, in order: it
                # waits as long as they do; fault harness, 7 nodes, seed 9: one lost so)
                self._unreleased(entry)  # (the store reads the entry when it commits: queued)
            return
        # (Session._send_new, with the settlement before the write) a holder taking over must
        # re-send it with this id (DUP=1), not as a new message: the other holders have the
        # id before the client has the PUBLISH [MQTT-4.3.3-1]
        pid = self._alloc_pid()
        entry.packet_id = pid
        entry.state = SENT_PUBLISH
        self.in_flight()[pid] = entry
        self._report((entry.msg.origin, entry.msg.seq), "sent", pid)
        if self.version > self.safe_version:
            self._unreleased(entry)
        self._stored_put(entry)
        channel = self.channel
        if entry.msg.expires is None:
            channel.write_gated(channel.frame(entry.msg, 2, pid, False, False), self.version)  # type: ignore[union-attr]  # (sent only while attached)
        else:  # (framed when the gate lets it go: what is left of its life then)
            channel.write_expiring(entry.msg, 2, pid, False, False, self.version)  # type: ignore[union-attr]
        if self.on_sent is not None:
            self.on_sent(self, entry.msg, 2, False)

    def on_pubrec(self, pid: int) -> bool:
        entry = self.inflight.get(pid)
        if entry is not None:
            entry.ticket = 0  # (the client had it: stored as it is)
        ok = super().on_pubrec(pid)
        if ok and entry is not None and self.on_settled is not None and not entry.retain:
            self._report((entry.msg.origin, entry.msg.seq), "rel", pid)
        return ok

    # inbound QoS 2: the other holders follow the ids awaiting PUBREL exactly, so that a
    # holder the client moves to neither delivers a re-sent PUBLISH again nor takes a new
    # PUBLISH that reuses a released id for a re-send [MQTT-4.3.3-2]

    def awaiting_rel_add(self, packet_id: int) -> Batch:
        batch = super().awaiting_rel_add(packet_id)
        self._forget_inbound(packet_id)
        if self.on_settled is not None and self.channel is not None:
            self._report(("", 0), "in", packet_id)
        return batch

    def awaiting_rel_agreed(self, packet_id: int, msg: Message) -> Batch:
        """A new QoS 2 PUBLISH: its id awaits PUBREL, and its message is routed under the id
        (origin, seq) the other holders are told with it, once they have it (channel.py)."""
        batch = super().awaiting_rel_add(packet_id)
        self._forget_inbound(packet_id)
        self.inbound[packet_id] = msg
        self._stored_inbound(packet_id, msg)
        self._report((msg.origin, msg.seq), "in", packet_id, msg)
        return batch

    def unrouted(self) -> list[Message]:
        """The inbound messages awaiting PUBREL that this node has not routed (oldest first):
        the node the client is on routes them, under their agreed ids."""
        routed = self.routed_here
        return [m for m in self.inbound.values() if (m.origin, m.seq) not in routed]

    def _forget_inbound(self, packet_id: int) -> None:
        msg = self.inbound.pop(packet_id, None)
        if msg is not None:
            key = (msg.origin, msg.seq)
            self.routed_here.discard(key)
            self.routed_batch.pop(key, None)
            self._stored_inbound(packet_id, None)

    def awaiting_rel_remove(self, packet_id: int) -> Batch:
        awaited = packet_id in self.awaiting_rel
        msg = self.inbound.get(packet_id)
        batch = super().awaiting_rel_remove(packet_id)
        self._forget_inbound(packet_id)
        key = ("", 0) if msg is None else (msg.origin, msg.seq)
        if awaited and msg is not None:
            self._settled_id(released_id(key))
        if awaited and self.on_settled is not None and self.channel is not None:
            self._report(key, "free", packet_id)  # (the holders remember the release too)
        return batch

    # -- what other holders tell us ----------------------------------------------

    def settle(self, key: tuple[str, int], state: str, pid: int, msg: Message | None = None) -> None:
        """Another holder (the one the client is on) settled a message."""
        if state == "in":
            super().awaiting_rel_add(pid)  # (journaled by a DurableMeshSession; no settlement)
            self._forget_inbound(pid)
            if msg is not None:
                self.inbound[pid] = msg
                self._stored_inbound(pid, msg)
            return
        if state == "free":
            # the message released: named by the node the client is on (("", 0) from a node
            # of before), or the one this copy has for the id; one this copy has that differs
            # was released before, unseen here (the client reuses an id only after PUBCOMP)
            had = self.inbound.get(pid)
            super().awaiting_rel_remove(pid)
            self._forget_inbound(pid)
            if had is not None and (had.origin, had.seq) != key:
                self._settled_id(released_id((had.origin, had.seq)))
            if key[0]:
                self._settled_id(released_id(key))
            return
        entry = self.ids.get(key)
        if state == "done":
            if entry is not None:
                self._drop_entry(entry)
            else:
                self.reserved.pop(key, None)
                self._settled_id(key)
            return
        if entry is None:
            if key not in self.done:
                rank = SENT_PUBREL if state == "rel" else SENT_PUBLISH
                if self.reserved.get(key, (0, 0))[0] <= rank:
                    self.reserved[key] = (rank, pid)
            return
        if entry in self.queue:
            self.queue.remove(entry)
        if entry.packet_id and self.inflight.get(entry.packet_id) is entry:
            del self.inflight[entry.packet_id]
        entry.packet_id = pid
        entry.state = SENT_PUBREL if state == "rel" else SENT_PUBLISH
        self.in_flight()[pid] = entry
        super()._stored_put(entry)

    def _drop_entry(self, entry: Entry) -> None:
        if entry.packet_id and self.inflight.get(entry.packet_id) is entry:
            del self.inflight[entry.packet_id]
        elif self.queue:
            try:
                self.queue.remove(entry)
            except ValueError:
                pass
        key = (entry.msg.origin, entry.msg.seq)
        self.ids.pop(key, None)
        self._settled_id(key)
        super()._stored_remove(entry)


def replica_of(session: Session | None) -> _Replicated | None:
    """``session`` as one copy of a session replicated across the mesh, or None."""
    return session if isinstance(session, _Replicated) else None
