"""The holders of persistent sessions: the copies of a session on the nodes that hold it.

Pure. Every persistent session is held by a few nodes (membership.py ``holders``); each
keeps a copy (mesh/cluster/replica.py) in the node's session table (session_table.py), which
subscribes like any session, so the mesh brings every message to every holder. The holder
the client is on (where its claim ended, claimant.py) serves it and tells the others:
what is settled (``sess.settle``, batched per flush, answered ``sess.ack``:
confirm.py), what it subscribes (``sess.subs``), and its whole copy when one is missing or
behind (``sess.copy``). A claim elsewhere fetches the copies (``sess.fetch`` →
``sess.state``) and makes the holders forward what still arrives for the ClientId
(``sess.fwd``, the Replication's redirects). When the live nodes change, copies move to
the new holders, and copies nobody serves are pooled (``sess.merge``).
"""

from __future__ import annotations

from collections import deque
from dataclasses import replace
from typing import TYPE_CHECKING

from ...session import KEPT, SUB_QOS
from ...shared import SHARE_PREFIX, ShareError, split_share
from ...topics import filter_matches
from .cluster_values import Forwarded
from .cluster_wire import (
    Outbox,
    SessAck,
    SessCopy,
    SessDiscard,
    SessFetch,
    SessFwd,
    SessMerge,
    SessSettle,
    SessState,
    SessSubs,
    Snapshot,
)
from .confirm import Confirmations
from .membership import Membership
from .pools import Pool, Pools
from .replica import _Replicated, replica_of
from .replication import Redirect, Replication
from .snapshots import install, merge_snapshots, merged_away, snapshot, unknown_to

if TYPE_CHECKING:
    from ...broker import ClaimingChannel
    from ...session import Session
    from ...session_table import SessionTable
    from .cluster_values import ClusterSettings

__all__ = ["Holders"]


class Holders(Confirmations, Pools):
    """This node's part in holding persistent sessions: the copies it keeps for clients on
    other nodes, and, for its own clients, the copies the other holders keep."""

    def __init__(
        self,
        node_id: str,
        membership: Membership,
        table: SessionTable,
        replication: Replication,
        outbox: Outbox,
        settings: ClusterSettings,
    ):
        self.node_id = node_id
        self.membership = membership
        self.table = table  # the node's sessions (session_table.py): the copies held here among them
        self.replication = replication
        self.out = outbox  # what it says to nodes (this one too): the Cluster sends it
        self.settings = settings
        # what it counts (Cluster.counters adds up every part's)
        self.counters = dict.fromkeys(
            (
                "sessions_gathered",
                "settle_gaps",
                "settle_retries",
                "acks_after_commit",
                "late_forwarded",
                "forwarded_comes_later",
                "fenced",
                "old_homes_told",
                "stale_merges_ignored",
                "merged_away_in_flight",
                "pools_resent",
            ),
            0,
        )
        # cid -> since when its settlements wait for a holder's sess.ack (copies re-sent after
        # settings.settle_retry)
        self.lagging: dict[str, float] = {}
        # cid -> the pooled copy of an offline session this node sent that some holders have
        # not answered yet: re-sent until they do (pools.py)
        self.pools: dict[str, Pool] = {}
        # answers (sess.ack) waiting for the store to commit what they vouch for, by journal
        # batch in the order they were made (batches only grow): sent by ``committed``
        self._acks_after: deque[tuple[int, str, SessAck, bool]] = deque()
        # a persistent session is a member of this node's shared groups while it is at home
        # here: its client is here, or was here last (session_table.py ``member_here``)
        table.member_here = self._at_home

    def _at_home(self, session: Session) -> bool:
        replica = replica_of(session)
        return replica is None or replica.active_node == self.node_id

    # -- the session of a client that connects here ----------------------------------------

    def own_copy(self, cid: str, now: float) -> Snapshot | None:
        """Our copy of ``cid``'s session as it is now (it kept queueing during the claim)."""
        replica = replica_of(self.table.sessions.get(cid))
        return snapshot(replica, now) if replica is not None else None

    def serve(
        self,
        channel: ClaimingChannel,
        cid: str,
        clean: bool,
        merged: Snapshot | None,
        epoch: int,
        forwarded: list[tuple[SessFwd, float]],
        now: float,
        fresh: bool | None = None,
    ) -> tuple[Session, bool]:
        """The session of a claim that ended here, for ``channel``: (session, present). A
        persistent one is the ``merged`` copies gathered, at a claim ``epoch`` newer than all
        of them, with what the holders ``forwarded`` meanwhile."""
        fresh = clean if fresh is None else fresh
        # a session resumed to end with this connection is a replica while it is served (the
        # copies gathered go into it), and ends with the connection all the same
        session, present = self.table.open_session(channel, cid, clean and fresh, now, fresh=fresh)
        replica = replica_of(session)
        if (clean and fresh) or replica is None:
            return session, present
        session.clean = clean
        if merged is not None:
            self.counters["sessions_gathered"] += 1
            install(replica, merged, now)
            self._apply_subs(replica, merged.subs)
            present = True
            # the node the copies say the client was on: told in ``served`` if no holder (a
            # copy of ours that a refused claim's fetch re-pointed here keeps the one before)
            if merged.active not in (None, self.node_id) or replica.came_from is None:
                replica.came_from = merged.active
        replica.active_node = self.node_id
        self.table.regroup(replica)  # (at home here now: a member of the groups of its "$share/" filters)
        # newer than every copy gathered, whatever the registrar granted: a registrar that
        # took over without the ClientId's entry grants from 1, and the copies of an earlier
        # claim with a larger epoch would win every later merge (stale ids, a second route)
        replica.epoch = max(replica.epoch + (merged is not None), epoch)
        replica._stored_version()
        replica.holder_acks = {}  # (what holders said while another node had the client)
        replica.safe_version = replica.sent_version = 0
        replica.hurry = replica.sent_later = False
        for fwd, arrived in forwarded:  # what holders forwarded while we gathered
            self.forwarded(fwd, now, arrived)
        if forwarded:
            replica.queue_in_origin_order()  # (after the copies' messages: in their place)
        return session, present

    def left(self, replica: _Replicated, now: float) -> None:
        """The client of ``replica`` left and its Session Expiry Interval runs: the holders
        get a copy that says when it ends, so that it ends at one time on every node [MQTT-4.1.0-2]."""
        self._copy_to_holders(replica, now)

    def served(self, session: Session, now: float) -> None:
        """The client of ``session`` has its CONNACK: the other holders get its copy, and so
        does the node it was on before if that is none of them: a claim gathers from the
        holders, and an old home it did not fetch (cut off, or no holder any more) kept the
        session at home, a member of its shared groups, taking their messages for a client
        that is not there (simulator, finding 33). The copy makes it let go (``on_copy``):
        it hands what it took to this node and leaves the groups. An old home out of reach is
        told when it is back (``rebalance``)."""
        replica = replica_of(session)
        if replica is not None and not session.clean:
            self._copy_to_holders(replica, now)
            self._tell_old_home(replica, snapshot(replica, now))

    # -- holding copies ------------------------------------------------------------------------

    def on_fetch(self, frm: str, m: SessFetch, now: float, ended: bool = False) -> None:
        """A claim at ``frm`` gathers the session: our copy goes to it (None: we have none),
        and what still arrives here for the ClientId follows it for ``redirect_grace``.
        (The Claimant stopped a client of ours first: claimant.py ``on_fetch``.)"""
        cid = m.cid
        session = self.table.sessions.get(cid)
        replica = replica_of(session)
        self.out.put(frm, SessState(cid, m.conn, snapshot(replica, now) if replica is not None else None, ended))
        if frm != self.node_id:
            # (the Replication owns the redirects: Broker.dispatch reads them)
            self.replication.redirects[cid] = Redirect(frm, now + self.settings.redirect_grace)
            if replica is not None and replica.channel is None:
                # the session is claimed at frm: a copy here that is no holder's (the client was
                # here last) gets no settlements from now on, and would come back stale. The
                # node the copy named is remembered until the claim's copy comes (``on_copy``
                # tells it then): a claim refused after this fetch leaves the copies naming
                # its node, so the next claim's would not name the old home (finding 42)
                if replica.came_from is None and replica.active_node not in (None, frm):
                    replica.came_from = replica.active_node
                replica.active_node = frm
                self.table.regroup(replica)  # (what it had through groups goes with the copy)
                self._let_go(replica, self.membership.holders(cid, frm), now)

    def _replica(self, cid: str, create: bool = True) -> _Replicated | None:
        session = self.table.sessions.get(cid)
        if session is not None:
            return replica_of(session)
        if not create:
            return None
        restored = self.table.factory.restored(cid)
        # in the store from now on, subscriptions or not: a restart must find the copy of a
        # publisher's session too (its inbound QoS 2 ids and messages, its version)
        restored._stored_subscriptions()
        self.table.restore_session(restored)
        return replica_of(restored)

    def _apply_subs(self, session: _Replicated, subs: dict[str, int]) -> None:
        table = self.table
        for f in list(session.subscriptions):
            if f not in subs:
                table.unsubscribe(session, f)
        for f, q in subs.items():
            if session.subscriptions.get(f) != q:
                table.subscribe(session, f, q)

    def on_copy(self, frm: str, m: SessCopy, now: float) -> None:
        """The holder the client is on sends its session: ours is replaced."""
        snap = m.snap
        journal = self.table.journal
        mark = journal.mark()
        if self.table.sessions.get(snap.cid) is None and self.node_id not in self.membership.holders(
            snap.cid, snap.active
        ):
            return  # (an old home that let go of it since: nothing to hand over)
        session = self._offline_replica(frm, snap, now, take_over=True)
        if session is None or snap.epoch < session.epoch:
            self._cannot_take(frm, snap.cid, snap.epoch)
            return
        # what this copy took that the client's node lacks goes there: the sender is that node,
        # or (an old home told by a holder, ``on_merge``) a holder that knows it
        to = snap.active if snap.active is not None and snap.active != self.node_id else frm
        late = unknown_to(session, snap)
        install(session, snap, now)
        on_late, session.on_late = session.on_late, None  # (handed over here, once)
        try:
            for entry in late:
                # it reached this copy but not the node the client is on (routed before that
                # node wanted the topic, delivered here after the hand-over's redirect): that
                # node takes it, or answers "done" if it settled it; this copy keeps it meanwhile
                msg = entry.msg.at(now)
                if msg.expired:
                    session.expired += 1  # (it waited here past its life: never sent [MQTT-3.3.2-5])
                    continue
                self.counters["late_forwarded"] += 1
                session.deliver(msg, entry.qos)
                self.out.put(to, SessFwd(snap.cid, Forwarded.of(msg)))
        finally:
            session.on_late = on_late
        self._apply_subs(session, snap.subs)
        session.subs_version = snap.subs_version
        self._adopt(session, snap)
        self._ack_when_stored(frm, SessAck(snap.cid, session.epoch, session.version), journal.since(mark))
        self._tell_old_home(session, snap)

    def _tell_old_home(self, session: _Replicated, snap: Snapshot) -> None:
        """A claim served the client (at this node: ``served``; elsewhere: its copy came,
        ``on_copy``): the node the session's copy named before the claim (``came_from``), if
        no holder now, gets ``snap`` and lets go. The claim's node knows it from the copies
        it gathered; a holder whose copy the claim's fetch re-pointed remembers it too (a
        claim refused in between had re-pointed the copies to its node: the next claim's
        named no old home; simulator, finding 42, seed 12). One out of reach is told when it
        is back (``old_home``, ``rebalance``): a node that did not notice the cut (its links
        stayed up from its side) lost its client during it and never pooled its copy (seed 31)."""
        before, session.came_from = session.came_from, None
        if before is None or before in (snap.active, self.node_id) or self._holds(before, snap):
            return  # (the client's node, or a holder: it gets the claim's copy)
        if before not in self.membership.live:
            session.old_home = before  # (told when it is back)
            return
        self.counters["old_homes_told"] += 1
        self.out.put(before, SessCopy(snap))

    def _holds(self, node: str, snap: Snapshot) -> bool:
        return node in self.membership.holders(snap.cid, snap.active)

    def on_merge(self, frm: str, m: SessMerge, now: float) -> None:
        """A copy of an offline session nobody coordinates: pooled with ours. A copy from a
        node that still takes itself for the session's home, while ours knows a newer claim
        (the client is here, or our copy's epoch is newer), is an old home the claim did not
        fetch: it gets our copy back, which makes it hand what it took to the client's node
        and leave the session's groups (``on_copy``; simulator, finding 33)."""
        snap = m.snap
        mine = replica_of(self.table.sessions.get(snap.cid))
        if mine is None and self._stale_last_node(snap.cid):
            self.counters["stale_merges_ignored"] += 1
            self._answer_pool(frm, snap.cid, snap.epoch, 0)
            return
        if mine is not None and frm != self.node_id:
            here = mine.channel is not None and mine.active_node == self.node_id
            if here or (mine.epoch > snap.epoch and mine.active_node != frm):
                if snap.active != self.node_id:
                    self.counters["old_homes_told"] += 1
                self.out.put(frm, SessCopy(snapshot(mine, now)))
                if here:
                    # (answered after the copy, which the sender installs first: its pooled
                    # copy stops going again; unanswered, it went on every 8 s while the
                    # client stayed here)
                    self._answer_pool(frm, snap.cid, mine.epoch, mine.version)
                    return
        session = self._offline_replica(frm, snap, now, take_over=False)
        if session is None:
            return  # (a claim of ours in progress: its copy comes when it ends)
        stale = session.epoch > snap.epoch
        snaps = [snapshot(session, now), replace(snap, taken_at=now)]
        merged = merge_snapshots(snaps)
        assert merged is not None  # (two snapshots in, one out)
        self.counters["merged_away_in_flight"] += merged_away(snaps, merged)
        install(session, merged, now)
        self._apply_subs(session, merged.subs)
        if not stale:
            self._adopt(session, snap)  # (an older claim's copy names no newer home)
        self._answer_pool(frm, snap.cid, session.epoch, session.version)

    def _stale_last_node(self, cid: str) -> bool:
        """A pooled copy reached this node, which keeps none and is not in the session's home:
        it is a holder only as the node the copy names its client's (a copy older than the
        let-go that took this node's own). A live node of the home got the same copy; taking it
        here would make this node a home again, a group member queueing for the session, until
        a newer copy came (simulator, finding 38). With no node of the home live this node is
        the one holder left and keeps it."""
        live = self.membership.live
        home = self.membership.home(cid)
        return self.node_id not in home and any(n in live for n in home)

    def _offline_replica(self, frm: str, snap: Snapshot, now: float, take_over: bool) -> _Replicated | None:
        """Our replica of ``snap``'s session (made if missing) while its client is not here.
        ``take_over``: a newer epoch elsewhere means our client is stale: its connection
        ends first, at ``now``."""
        cid = snap.cid
        session = self._replica(cid)
        if session is None:
            return None
        channel = session.channel
        if channel is not None:
            if not take_over or snap.epoch <= session.epoch:
                return None
            channel.kick(f"ClientId {cid!r} is active on node {frm}", now)
            session = self._replica(cid)
            if session is None or session.channel is not None:
                return None
        return session

    def _adopt(self, session: _Replicated, snap: Snapshot) -> None:
        session.active_node = snap.active
        session.epoch = max(session.epoch, snap.epoch)
        self.table.regroup(session)

    def on_settle(self, frm: str, m: SessSettle, now: float) -> None:
        session = self._replica(m.cid, create=False)
        if session is None or session.channel is not None or m.epoch < session.epoch:
            # no copy here, our own client, or a node serving an older epoch (its client has
            # moved on): the sender learns which from the answer
            self._cannot_take(frm, m.cid, m.epoch)
            return
        journal = self.table.journal
        mark = journal.mark()
        items = m.items
        start = m.version - len(items)  # (the version the batch follows)
        follows = m.epoch == session.epoch and start <= session.version
        if follows and start < session.version:
            # a copy sent while the batch gathered (a retry, a holder that came back, the copy
            # of a client that left) has its first settlements: this copy follows on from it
            # (not a gap: no copy again at settle_retry), and does not play them again on a
            # state that moved on without settlements since (detach queues again a PUBLISH the
            # gate held: a "sent" played again would put it in flight under an id the client
            # never had, which the node the client is on gives to another message)
            items = items[session.version - start :]
        for origin, seq, state, pid, fwd in items:
            session.settle((origin, seq), state, pid, fwd.message(now) if fwd is not None else None)
        if follows:
            session.version = max(session.version, m.version)
        else:
            # settlements were missed (a link dropped them) or a newer epoch's copy has not
            # come yet: this copy is not the latest for merges until the next copy, which the
            # sender sends when our answer stays behind (settle_retry)
            self.counters["settle_gaps"] += 1
        session._stored_version()
        ack = SessAck(m.cid, session.epoch, session.version)
        self._ack_when_stored(frm, ack, journal.since(mark), m.later)

    def _ack_when_stored(self, frm: str, ack: SessAck, batch: int, later: bool = False) -> None:
        """Answer once what the answer vouches for is in this node's store (``batch``: 0, at
        once): the node the client is on counts on this copy to survive a kill -9 and restart,
        as a client counts on what a PUBACK vouches for. ``later``: nothing waits for the
        answer there (a batch sent so: ``flush``); it goes within mesh.batch_delay."""
        if batch:
            self.counters["acks_after_commit"] += 1
        if batch > self.table.journal.committed:
            self._acks_after.append((batch, frm, ack, later))
        else:
            self.out.put(frm, ack, later)

    def committed(self, batch: int) -> None:
        """The store committed ``batch``: the answers that waited for it go."""
        waiting = self._acks_after
        while waiting and waiting[0][0] <= batch:
            _, frm, ack, later = waiting.popleft()
            self.out.put(frm, ack, later)

    def on_subs(self, frm: str, m: SessSubs, now: float) -> None:
        session = self._replica(m.cid)
        if session is None or session.channel is not None or m.version <= session.subs_version:
            return
        session.subs_version = m.version
        session.active_node = frm
        self.table.regroup(session)
        self._apply_subs(session, m.subs)

    def on_discard(self, frm: str, m: SessDiscard, now: float) -> None:
        session = replica_of(self.table.sessions.get(m.cid))
        if session is not None and session.channel is None:
            self.table.discard_session(session)

    def rebalance(self, old_live: set[str], now: float) -> None:
        """The live nodes changed: sessions reach their (new) holders; we keep only ours."""
        live = set(self.membership.live)
        for cid, session in list(self.table.sessions.items()):
            replica = replica_of(session)
            if replica is None:
                continue
            old_home = replica.old_home
            if old_home is not None and old_home in live and old_home not in old_live:
                # an old home the claim could not tell is back (``_tell_old_home``)
                replica.old_home = None
                snap = snapshot(replica, now)
                if snap.active not in (None, old_home) and not self._holds(old_home, snap):
                    self.counters["old_homes_told"] += 1
                    self.out.put(old_home, SessCopy(snap))
            active = replica.active_node
            holders = self.membership.holders(cid, active)
            if replica.channel is not None:
                # the client is here: every holder that has not acknowledged a copy (a new
                # holder, or one that was away: it may have restarted) gets one, and frames
                # that waited for a holder that left go out
                others = set(holders) - {self.node_id}
                fresh = (others - set(replica.holder_acks)) | (others - old_live)
                for node in fresh:
                    replica.holder_acks.pop(node, None)
                if fresh:
                    self._copy_to_holders(replica, now, only=fresh)
                else:
                    self._advance(replica, now)
            elif active is None or active not in live or active == self.node_id:
                if active is not None and active not in live:
                    self._client_gone(replica, now)
                # nobody coordinates this offline session: holders pool what they have
                self.pool(replica, holders, now)
            if active != self.node_id:
                self._let_go(replica, holders, now)

    def _client_gone(self, replica: _Replicated, now: float) -> None:
        """The node the client of ``replica`` was on left the mesh (with the client, as far as
        anyone can tell): the session's Session Expiry Interval runs from now on this copy, as
        it does at the registrar (registry.py), unless it ran already [MQTT-4.1.0-2]."""
        if replica.expires_at is None and replica.expiry != KEPT:
            replica.expires_at = now + replica.expiry
            if replica.durable:
                replica._stored_subscriptions()

    def _let_go(self, replica: _Replicated, holders: list[str], now: float) -> None:
        """A copy of a session whose client is not here, on a node that is none of its holders:
        the holders get it (pooled with theirs), this node keeps none."""
        if self.node_id not in holders and replica.channel is None:
            for node in holders:
                self.out.put(node, SessMerge(snapshot(replica, now)))
            self.table.discard_session(replica)

    # -- while the client is here ---------------------------------------------------------

    def flush(self, now: float) -> None:
        """Tell the holders what was settled since the last batch (they answer sess.ack). One
        batch of a session's is out at a time: while its client is here and the holders have
        not answered the last, the next gathers (``_advance`` asks for a flush once they have:
        a round of messages and store commits per answer, not per loop iteration; the frames
        that wait for the gathered settlements wait as they did for the answer). A batch no
        frame waits for (``hurry`` unset: the QoS 1 PUBACKs a subscriber sends) goes, and is
        answered, within mesh.batch_delay, with what else goes then; a hurried one goes beside
        such a batch out, not behind it."""
        settles = self.replication.take_settles()
        if settles:
            for cid, items in settles.items():
                session = self.table.sessions.get(cid)
                replica = replica_of(session)
                later = replica is not None and not replica.hurry
                if (
                    replica is not None
                    and replica.channel is not None
                    and replica.sent_version > replica.safe_version
                    and (later or not replica.sent_later)
                ):
                    self.replication.put_back(cid, items)
                    continue
                epoch, version = (replica.epoch, replica.version) if replica is not None else (0, len(items))
                sent = False
                for node in self.membership.holders(cid, self.node_id):
                    if node != self.node_id:
                        self.out.put(node, SessSettle(cid, epoch, items, version, later), later)
                        sent = True
                if replica is not None:
                    if sent:
                        replica.sent_version = version
                        replica.sent_later = later
                        self.lagging.setdefault(cid, now)
                    else:
                        self._advance(replica, now)

    def _copy_to_holders(self, session: _Replicated, now: float, only: set[str] | None = None) -> None:
        snap = snapshot(session, now)
        for node in self.membership.holders(session.client_id, self.node_id):
            if node != self.node_id and (only is None or node in only):
                self.out.put(node, SessCopy(snap))
        if only is None:
            # the copy has every settlement gathered for the next batch: sent after it, they
            # would be played again on a copy that has them (and what came since)
            self.replication.drop_settles(session.client_id)
            session.sent_version = session.version
        self._advance(session, now)  # (no other live holder: nothing to wait for)

    # -- redirects during a hand-over ---------------------------------------------------------

    def forwarded(self, m: SessFwd, now: float, arrived: float | None = None) -> bool:
        """A message for a session whose client is (or is coming) here, from a holder that
        got it after the hand-over (or took it late): False if no copy of it is here yet
        (a claim still gathering it keeps it: claimant.py). ``arrived``: when it came, if
        before ``now``; one whose life ended meanwhile is not delivered [MQTT-3.3.2-5]."""
        session = self.table.sessions.get(m.cid)
        replica = replica_of(session)
        if replica is None:
            return False
        fwd = m.msg
        granted = None
        for f, value in replica.subscriptions.items():
            if f.startswith(SHARE_PREFIX):  # (what its home took through a group: shared_taken)
                try:
                    share = split_share(f)
                except ShareError:
                    continue
                f = share[1] if share is not None else f
            if filter_matches(f, fwd.topic):
                q = value & SUB_QOS
                granted = q if granted is None else max(granted, q)
        if granted is None:
            return True
        msg = fwd.message(now if arrived is None else arrived).at(now)
        if msg.expired:
            replica.expired += 1
            return True
        msg.retain = False
        key = (msg.origin, msg.seq)
        if key in replica.done and replica.channel is not None and replica.on_settled is not None:
            replica._report(key, "done", 0)  # (a holder kept it: it may drop it, we settled it)
            return True
        mesh = self.table.mesh
        if mesh is not None and mesh.comes_later(msg):
            # it reached this node too and waits there for an earlier message of its origin:
            # it reaches the session then, in its origin's order (order.py), not before
            self.counters["forwarded_comes_later"] += 1
            return True
        replica.deliver(msg, min(fwd.qos, granted))  # a duplicate by id is dropped there
        return True
