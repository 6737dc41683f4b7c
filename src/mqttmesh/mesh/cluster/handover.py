"""The connecting side of mesh-wide ClientIds, and the holders of persistent sessions.

Pure. A client that connects here is *claimed* at its registrar (mesh/cluster/registry.py), which
answers with an epoch and the node that held the id before. A CleanSession=1 connect then
discards the session wherever it is [MQTT-3.1.2-6]; a CleanSession=0 one *gathers* it:
every holder (membership.py) sends its copy (``sess.fetch`` → ``sess.state``), stops
serving a client it still had, and forwards what still arrives for the id to us for
``redirect_grace`` (``sess.fwd``). The copies merge (mesh/cluster/replica.py: an id settled
anywhere is settled, the furthest state wins), the Channel gets its CONNACK with session
present = 1 [MQTT-3.2.2-2], and the holders get the merged copy back (``sess.copy``).
While the client stays, the holders queue what it is sent, and we tell them what is
settled (``sess.settle``) and subscribed (``sess.subs``).

Stages of a claim: CLAIM (waiting for the registrar), GATHER (waiting for holders), DONE.
Without an answer in ``claim_timeout`` (``gather_timeout``) the claim goes on without it.
"""

from __future__ import annotations

import base64
from collections import deque
from collections.abc import Iterator
from typing import TYPE_CHECKING

from ...broker import ClaimingChannel
from ...packets import UNAVAILABLE
from ...topics import filter_matches
from .cluster_values import Forwarded, LocalConnection
from .cluster_wire import (
    Outbox,
    RegClaim,
    RegGrant,
    RegKick,
    RegRegister,
    RegRelease,
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
    WireWill,
)
from .confirm import Confirmations
from .membership import Membership
from .replica import Redirect, Replication, _Replicated, install, merge_snapshots, replica_of, snapshot, unknown_to

if TYPE_CHECKING:
    from ...packets import Will
    from ...ports import UnicastPort
    from ...session_table import SessionTable
    from .cluster_values import ClusterSettings

__all__ = ["ClaimingChannel", "HandOver", "Claim", "LocalConnection", "Redirect", "CLAIM", "GATHER", "DONE"]

CLAIM, GATHER, DONE = "claim", "gather", "done"


class Claim:
    """A connect in progress here."""

    __slots__ = (
        "channel",
        "cid",
        "clean",
        "will",
        "conn",
        "started",
        "stage",
        "epoch",
        "prev",
        "waiting",
        "snaps",
        "deadline",
        "forwarded",
        "kept",
        "answered",
    )

    def __init__(self, channel: ClaimingChannel, cid: str, clean: bool, will: WireWill | None, conn: str, now: float):
        self.channel, self.cid, self.clean, self.will, self.conn = channel, cid, clean, will, conn
        self.started = now
        self.stage = CLAIM
        self.epoch = 0
        self.prev: str | None = None
        self.waiting: set[str] = set()  # nodes yet to answer
        self.snaps: list[Snapshot] = []
        self.deadline = 0.0
        self.forwarded: list[SessFwd] = []  # messages holders forwarded before the session is here
        self.kept = 0  # the registrar's word: the last claim kept a session at this epoch
        self.answered: set[str] = set()  # nodes that sent their copy (or said they have none)


def _wire_will(will: Will | None, seq: int = 0) -> WireWill | None:
    if will is None:
        return None
    return WireWill(will.topic, base64.b64encode(will.payload).decode(), will.qos, will.retain, seq)


class HandOver(Confirmations):
    def __init__(
        self,
        node_id: str,
        incarnation: int,
        membership: Membership,
        table: SessionTable,
        replication: Replication,
        outbox: Outbox,
        net: UnicastPort,
        settings: ClusterSettings,
        counters: dict[str, int],
        ids: Iterator[int],
        wall_offset: float,
    ):
        self.node_id = node_id
        self.incarnation = incarnation
        self.membership = membership
        self.table = table  # the node's sessions (session_table.py): the copies held here among them
        self.replication = replication
        self.out = outbox  # what it says to nodes (this one too): the Cluster sends it
        self._net = net  # asked who is reachable, never to send
        self.settings = settings
        self.counters = counters
        self._ids = ids  # connection ids
        self.wall_offset = wall_offset  # wall-clock seconds minus `now`
        self.local: dict[str, LocalConnection] = {}  # our connected clients
        # connections that ended here (their wills published or discarded here), told to
        # the registrar again with every registration round for a while: a release lost in
        # a partition would leave the registrar to publish the will a second time when it
        # finds this node gone (fuzzer seed 22). (cid, conn) -> (epoch, until)
        self.released: dict[tuple[str, str], tuple[int, float]] = {}
        self.claims: dict[str, Claim] = {}  # conn -> claim in progress
        self.last_register = 0.0
        # cid -> since when its settlements wait for a holder's sess.ack (copies re-sent after
        # settings.settle_retry)
        self.lagging: dict[str, float] = {}
        # answers (sess.ack) waiting for the store to commit what they vouch for, by journal
        # batch in the order they were made (batches only grow): sent by ``committed``
        self._acks_after: deque[tuple[int, str, SessAck]] = deque()

    # -- connecting -----------------------------------------------------------------------------

    def connect(
        self, channel: ClaimingChannel, cid: str, clean: bool, will: Will | None, now: float, will_seq: int = 0
    ) -> None:
        self.counters["claims"] += 1
        if not self.membership.routing_ready(now):
            # just started: the subscriptions of the other nodes are not known here yet, and
            # what the client publishes would reach none of them (membership.py)
            self.counters["refused_not_synced"] += 1
            channel.refused(UNAVAILABLE, "this node has not learned the mesh's subscriptions yet", now)
            return
        if not clean and not (self.membership.quorum(now) and self.membership.home_quorum(cid)):
            # at most one live copy of a persistent session: not on the minority side of a
            # partition, nor just after a pause or a start, nor without a majority of the
            # session's home in reach (membership.py)
            self.counters["refused_no_quorum"] += 1
            channel.refused(
                UNAVAILABLE, "this node does not see a majority of the mesh (or of the session's nodes) now", now
            )
            return
        conn = f"{self.node_id}/{self.incarnation}/{next(self._ids)}"
        claim = Claim(channel, cid, clean, _wire_will(will, will_seq), conn, now)
        claim.deadline = now + self.settings.claim_timeout
        self.claims[conn] = claim
        registrar = self.membership.registrars(cid)[0]
        claim.waiting = {registrar}
        if not self._reaches(registrar):
            self._ungranted(claim, now)
            return
        self.out.put(registrar, self._claim(claim, now))

    def _reaches(self, node: str) -> bool:
        """Can a message to ``node`` go now (this node: always, handled here)?"""
        return node == self.node_id or self._net.reachable(node)

    def _ungranted(self, claim: Claim, now: float) -> None:
        """The registrar is out of reach or did not answer: a clean session is served anyway
        (availability), a persistent one is not (one live copy): CONNACK 0x03."""
        if claim.clean:
            self._granted(claim, 0, None, now)
            return
        self._refuse(claim, "the ClientId's registrar did not answer", now)

    def _refuse(self, claim: Claim, why: str, now: float) -> None:  # (a claim of ours)
        self.claims.pop(claim.conn, None)
        # the registrar may hold it, granted or not yet answered: the connection is not
        # accepted, so its will must not be published for it (fuzzer seed 551)
        self._release(claim.cid, claim.conn, claim.epoch, now)
        claim.stage = DONE
        self.counters["claims_refused"] += 1
        claim.channel.refused(UNAVAILABLE, why, now)

    def _claim(self, claim: Claim, now: float) -> RegClaim:
        wall = now + self.wall_offset
        return RegClaim(claim.cid, self.node_id, self.incarnation, claim.conn, claim.clean, claim.will, wall)

    def retry_claims(self, now: float) -> None:
        """Claims and gathers waiting on nodes that just became unreachable move on."""
        live = set(self.membership.live)
        for claim in list(self.claims.values()):
            if claim.stage == CLAIM and claim.prev is None:
                registrar = self.membership.registrars(claim.cid)[0]
                if claim.waiting and not claim.waiting & live:
                    claim.waiting = {registrar}
                    if self._reaches(registrar):
                        self.out.put(registrar, self._claim(claim, now))
                    else:
                        self._ungranted(claim, now)
            elif claim.stage == GATHER:
                claim.waiting &= live
                if not claim.waiting:
                    self._finish(claim, now)

    def expire_claims(self, now: float) -> None:
        for claim in list(self.claims.values()):
            if now >= claim.deadline:
                if claim.stage == CLAIM:
                    self.counters["claim_timeouts"] += 1
                    self._ungranted(claim, now)
                elif claim.stage == GATHER:
                    if claim.waiting and not claim.clean:
                        # a live holder did not send its copy: it may have the latest state
                        self._refuse(claim, f"holders {sorted(claim.waiting)} did not answer", now)
                    else:
                        self._finish(claim, now)

    def on_grant(self, frm: str, m: RegGrant, now: float) -> None:
        claim = self.claims.get(m.conn)
        if claim is not None:
            claim.kept = m.kept
            self._granted(claim, m.epoch, m.prev, now)
            return
        local = self.local.get(m.cid)
        if local is None or local.conn != m.conn:
            # a grant for a claim that ended meanwhile (refused after claim_timeout, or its
            # client left): the registrar must not keep it, nor publish its will
            self._release(m.cid, m.conn, m.epoch, now)

    def _granted(self, claim: Claim, epoch: int, prev: str | None, now: float) -> None:
        if claim.stage != CLAIM:
            return
        claim.epoch = epoch
        claim.prev = prev
        holders = self.membership.holders(claim.cid, prev)
        if claim.clean:
            # a clean start discards the persistent session wherever it is [MQTT-3.1.2-6]
            for node in sorted(set(holders) - {self.node_id}):  # (sorted: the same order every run)
                self.out.put(node, SessDiscard(claim.cid, epoch))
            self._finish(claim, now)
            return
        targets = (set(holders) | ({prev} if prev else set())) - {self.node_id}
        targets &= set(self.membership.live)
        claim.stage = GATHER
        claim.waiting = set()
        for node in sorted(targets):
            if self._reaches(node):
                self.out.put(node, SessFetch(claim.cid, claim.conn, epoch, self.node_id))
                claim.waiting.add(node)
        claim.deadline = now + self.settings.gather_timeout
        if not claim.waiting:
            self._finish(claim, now)

    def _finish(self, claim: Claim, now: float) -> None:
        self.claims.pop(claim.conn, None)
        claim.stage = DONE
        channel = claim.channel
        if not channel.claiming:  # it closed meanwhile
            self._release(claim.cid, claim.conn, claim.epoch, now)
            return
        table = self.table
        merged = None
        if not claim.clean:
            # our own copy as it is now (it kept queueing while we gathered), and the others'
            own = table.sessions.get(claim.cid)
            snaps = list(claim.snaps)
            own_copy = replica_of(own)
            if own_copy is not None:
                snaps.append(snapshot(own_copy))
            home = self.membership.home(claim.cid)
            answered = sum(1 for n in home if n in claim.answered or n == self.node_id)
            if 2 * answered <= len(home):
                # a copy with the latest state is on a majority of the home: one must be here
                self._refuse(claim, f"too few of the session's nodes {home} answered", now)
                return
            if claim.kept and max((s.epoch for s in snaps), default=0) < claim.kept:
                if claim.prev != self.node_id and claim.prev not in claim.answered:
                    # no copy of the session as of its last claim is within reach (its node
                    # and the holders that had it are on the other side, or down): not served
                    self._refuse(claim, "no copy of the session's latest state is within reach", now)
                    return
            merged = merge_snapshots(snaps)
        session, present = table.open_session(channel, claim.cid, claim.clean)
        replica = replica_of(session)
        if not claim.clean and replica is not None:
            if merged is not None:
                self.counters["sessions_gathered"] += 1
                install(replica, merged)
                for f in list(replica.subscriptions):
                    if f not in merged.subs:
                        table.unsubscribe(replica, f)
                for f, q in merged.subs.items():
                    if replica.subscriptions.get(f) != q:
                        table.subscribe(replica, f, q)
                present = True
            replica.active_node = self.node_id
            # newer than every copy gathered, whatever the registrar granted: a registrar that
            # took over without the ClientId's entry grants from 1, and the copies of an earlier
            # claim with a larger epoch would win every later merge (stale ids, a second route)
            replica.epoch = max(replica.epoch + (merged is not None), claim.epoch)
            replica._stored_version()
            replica.holder_acks = {}  # (what holders said while another node had the client)
            replica.safe_version = 0
            for fwd in claim.forwarded:  # what holders forwarded while we gathered
                self._forwarded(fwd)
            if claim.forwarded:
                replica.queue_in_origin_order()  # (after the copies' messages: in their place)
        wall = now + self.wall_offset
        self.local[claim.cid] = LocalConnection(channel, claim.conn, claim.epoch, claim.will, claim.clean, wall)
        channel.claimed(session, present, now)
        if not claim.clean and replica is not None:
            self._copy_to_holders(replica, now)

    def _copy_to_holders(self, session: _Replicated, now: float, only: set[str] | None = None) -> None:
        snap = snapshot(session)
        for node in self.membership.holders(session.client_id, self.node_id):
            if node != self.node_id and (only is None or node in only):
                self.out.put(node, SessCopy(snap))
        self._advance(session, now)  # (no other live holder: nothing to wait for)

    def disconnected(self, channel: ClaimingChannel, now: float) -> None:
        cid = channel.client_id
        local = self.local.get(cid)
        if local is None or local.channel is not channel:
            return
        del self.local[cid]
        self._release(cid, local.conn, local.epoch, now)

    def _release(self, cid: str, conn: str, epoch: int, now: float) -> None:
        self.released[(cid, conn)] = (epoch, now + 6 * self.settings.register_interval)
        self.out.put(self.membership.registrars(cid)[0], RegRelease(cid, conn, epoch, self.node_id))

    def on_kick(self, frm: str, m: RegKick, now: float) -> None:
        self.counters["kicks"] += frm != self.node_id
        cid, conn = m.cid, m.conn
        local = self.local.get(cid)
        if local is not None and local.conn == conn:
            local.channel.kick(f"ClientId {cid!r} connected on node {m.by}")  # [MQTT-3.1.4-2]
            return
        claim = self.claims.get(conn)
        if claim is not None:
            claim.stage = DONE
            self.claims.pop(conn, None)
            claim.channel.close(f"ClientId {cid!r} connected on node {m.by} meanwhile")

    def register_local(self, now: float) -> None:
        """Tell the registrars which clients are here (after a change, and periodically)."""
        self.last_register = now
        for (cid, conn), (epoch, until) in list(self.released.items()):
            if now >= until:
                del self.released[(cid, conn)]
            else:  # (idempotent at the registrar: it drops a release of another connection)
                self.out.put(self.membership.registrars(cid)[0], RegRelease(cid, conn, epoch, self.node_id))
        # (a copy: a registration handled here may end a local connection, fuzzer seed 214)
        for cid, local in list(self.local.items()):
            if self.local.get(cid) is not local:
                continue  # ended by a registration handled above
            will, at = local.will, local.at
            body = RegRegister(cid, self.node_id, self.incarnation, local.conn, local.epoch, local.clean, will, at)
            self.out.put(self.membership.registrars(cid)[0], body)

    # -- holders of sessions ------------------------------------------------------------------

    def on_fetch(self, frm: str, m: SessFetch, now: float) -> None:
        cid = m.cid
        local = self.local.get(cid)
        if local is not None and local.conn != m.conn:
            local.channel.kick(f"ClientId {cid!r} taken over by node {frm}")  # stops delivery first
        session = self.table.sessions.get(cid)
        replica = replica_of(session)
        self.out.put(frm, SessState(cid, m.conn, snapshot(replica) if replica is not None else None))
        if frm != self.node_id:
            # (the Replication owns the redirects: Broker.dispatch reads them)
            self.replication.redirects[cid] = Redirect(frm, now + self.settings.redirect_grace)
            if replica is not None and replica.channel is None:
                # the session is claimed at frm: a copy here that is no holder's (the client was
                # here last) gets no settlements from now on, and would come back stale
                replica.active_node = frm
                self._let_go(replica, self.membership.holders(cid, frm), now)

    def on_state(self, frm: str, m: SessState, now: float) -> None:
        claim = self.claims.get(m.conn)
        if claim is None or claim.stage != GATHER:
            return
        if m.snap is not None:
            claim.snaps.append(m.snap)
        claim.answered.add(frm)
        claim.waiting.discard(frm)
        if not claim.waiting:
            self._finish(claim, now)

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
        session = self._offline_replica(frm, snap, take_over=True)
        if session is None or snap.epoch < session.epoch:
            self._cannot_take(frm, snap.cid, snap.epoch)
            return
        late = unknown_to(session, snap)
        install(session, snap)
        on_late, session.on_late = session.on_late, None  # (handed over here, once)
        try:
            for entry in late:
                # it reached this copy but not the node the client is on (routed before that
                # node wanted the topic, delivered here after the hand-over's redirect): that
                # node takes it, or answers "done" if it settled it; this copy keeps it meanwhile
                self.counters["late_forwarded"] += 1
                session.deliver(entry.msg, entry.qos)
                self.out.put(frm, SessFwd(snap.cid, Forwarded.of(entry.msg)))
        finally:
            session.on_late = on_late
        self._apply_subs(session, snap.subs)
        session.subs_version = snap.subs_version
        self._adopt(session, snap)
        self._ack_when_stored(frm, SessAck(snap.cid, session.epoch, session.version), journal.since(mark))

    def on_merge(self, frm: str, m: SessMerge, now: float) -> None:
        """A copy of an offline session nobody coordinates: pooled with ours."""
        session = self._offline_replica(frm, m.snap, take_over=False)
        if session is None:
            return
        merged = merge_snapshots([snapshot(session), m.snap])
        assert merged is not None  # (two snapshots in, one out)
        install(session, merged)
        self._apply_subs(session, merged.subs)
        self._adopt(session, m.snap)

    def _offline_replica(self, frm: str, snap: Snapshot, take_over: bool) -> _Replicated | None:
        """Our replica of ``snap``'s session (made if missing) while its client is not here.
        ``take_over``: a newer epoch elsewhere means our client is stale: drop it first."""
        cid = snap.cid
        session = self._replica(cid)
        if session is None:
            return None
        channel = session.channel
        if channel is not None:
            if not take_over or snap.epoch <= session.epoch:
                return None
            channel.kick(f"ClientId {cid!r} is active on node {frm}")
            session = self._replica(cid)
            if session is None or session.channel is not None:
                return None
        return session

    def _adopt(self, session: _Replicated, snap: Snapshot) -> None:
        session.active_node = snap.active
        session.epoch = max(session.epoch, snap.epoch)

    def on_settle(self, frm: str, m: SessSettle, now: float) -> None:
        session = self._replica(m.cid, create=False)
        if session is None or session.channel is not None or m.epoch < session.epoch:
            # no copy here, our own client, or a node serving an older epoch (its client has
            # moved on): the sender learns which from the answer
            self._cannot_take(frm, m.cid, m.epoch)
            return
        journal = self.table.journal
        mark = journal.mark()
        for origin, seq, state, pid, fwd in m.items:
            session.settle((origin, seq), state, pid, fwd.message() if fwd is not None else None)
        if m.epoch == session.epoch and m.version - len(m.items) == session.version:
            session.version = m.version
        else:
            # settlements were missed (a link dropped them) or a newer epoch's copy has not
            # come yet: this copy is not the latest for merges until the next copy, which the
            # sender sends when our answer stays behind (settle_retry)
            self.counters["settle_gaps"] += 1
        session._stored_version()
        self._ack_when_stored(frm, SessAck(m.cid, session.epoch, session.version), journal.since(mark))

    def _ack_when_stored(self, frm: str, ack: SessAck, batch: int) -> None:
        """Answer once what the answer vouches for is in this node's store (``batch``: 0, at
        once): the node the client is on counts on this copy to survive a kill -9 and restart,
        as a client counts on what a PUBACK vouches for."""
        if batch:
            self.counters["acks_after_commit"] += 1
        if batch > self.table.journal.committed:
            self._acks_after.append((batch, frm, ack))
        else:
            self.out.put(frm, ack)

    def committed(self, batch: int) -> None:
        """The store committed ``batch``: the answers that waited for it go."""
        waiting = self._acks_after
        while waiting and waiting[0][0] <= batch:
            _, frm, ack = waiting.popleft()
            self.out.put(frm, ack)

    def on_subs(self, frm: str, m: SessSubs, now: float) -> None:
        session = self._replica(m.cid)
        if session is None or session.channel is not None or m.version <= session.subs_version:
            return
        session.subs_version = m.version
        session.active_node = frm
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
                # nobody coordinates this offline session: holders pool what they have
                snap = snapshot(replica)
                for node in holders:
                    if node != self.node_id:
                        self.out.put(node, SessMerge(snap))
            if active != self.node_id:
                self._let_go(replica, holders, now)

    def _let_go(self, replica: _Replicated, holders: list[str], now: float) -> None:
        """A copy of a session whose client is not here, on a node that is none of its holders:
        the holders get it (pooled with theirs), this node keeps none."""
        if self.node_id not in holders and replica.channel is None:
            for node in holders:
                self.out.put(node, SessMerge(snapshot(replica)))
            self.table.discard_session(replica)

    # -- while the client is here ---------------------------------------------------------

    def flush(self, now: float) -> None:
        """Tell the holders what was settled since the last flush (they answer sess.ack)."""
        settles = self.replication.take_settles()
        if settles:
            for cid, items in settles.items():
                session = self.table.sessions.get(cid)
                replica = replica_of(session)
                epoch, version = (replica.epoch, replica.version) if replica is not None else (0, len(items))
                sent = False
                for node in self.membership.holders(cid, self.node_id):
                    if node != self.node_id:
                        self.out.put(node, SessSettle(cid, epoch, items, version))
                        sent = True
                if replica is not None:
                    if sent:
                        self.lagging.setdefault(cid, now)
                    else:
                        self._advance(replica, now)

    # -- redirects during a hand-over ---------------------------------------------------------

    def on_fwd(self, frm: str, m: SessFwd, now: float) -> None:
        self._forwarded(m)

    def _forwarded(self, m: SessFwd) -> None:
        session = self.table.sessions.get(m.cid)
        replica = replica_of(session)
        if replica is None:
            for claim in self.claims.values():
                if claim.cid == m.cid and claim.stage == GATHER:
                    claim.forwarded.append(m)  # the session is still being gathered: for _finish
            return
        fwd = m.msg
        granted = None
        for f, q in replica.subscriptions.items():
            if filter_matches(f, fwd.topic):
                granted = q if granted is None else max(granted, q)
        if granted is None:
            return
        msg = fwd.message()
        msg.retain = False
        key = (msg.origin, msg.seq)
        if key in replica.done and replica.channel is not None and replica.on_settled is not None:
            replica._report(key, "done", 0)  # (a holder kept it: it may drop it, we settled it)
            return
        mesh = self.table.mesh
        if mesh is not None and mesh.comes_later(msg):
            # it reached this node too and waits there for an earlier message of its origin:
            # it reaches the session then, in its origin's order (order.py), not before
            self.counters["forwarded_comes_later"] += 1
            return
        replica.deliver(msg, min(fwd.qos, granted))  # a duplicate by id is dropped there
