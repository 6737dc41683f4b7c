"""The connecting side of mesh-wide ClientIds: a client's claim, from CONNECT to CONNACK.

Pure. A client that connects here is *claimed* at its registrar (mesh/cluster/registry.py), which
answers with an epoch and the node that held the id before. A CleanSession=1 connect then
discards the session wherever it is [MQTT-3.1.2-6]; a CleanSession=0 one *gathers* it:
every holder (membership.py) sends its copy (``sess.fetch`` → ``sess.state``), stops
serving a client it still had, and forwards what still arrives for the id to us for
``redirect_grace`` (``sess.fwd``). The copies merge (mesh/cluster/replica.py: an id settled
anywhere is settled, the furthest state wins), the Channel gets its CONNACK with session
present = 1 [MQTT-3.2.2-2], and the holders get the merged copy back (``sess.copy``):
from then on the session is the holders' business (holders.py). The claimant keeps the
clients connected here (``local``), tells their registrars (``reg.register``, and
``reg.release`` when they leave), and closes its persistent clients when this node loses
its majority (``fence``).

Stages of a claim: WAIT (the node is still forming its links: it waits for them, up to
``claim_timeout``), CLAIM (waiting for the registrar), GATHER (waiting for holders), DONE.
Without an answer in ``claim_timeout`` (``gather_timeout``) the claim goes on without it.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from dataclasses import replace
from typing import TYPE_CHECKING

from ...broker import ClaimingChannel
from ...packets import UNAVAILABLE
from ...properties import MESSAGE_EXPIRY, WILL_DELAY, forwarded
from ...session import KEPT
from .cluster_values import props_b64
from .cluster_wire import (
    Outbox,
    RegClaim,
    RegGrant,
    RegKick,
    RegRegister,
    RegRelease,
    SessDiscard,
    SessFetch,
    SessFwd,
    SessState,
    Snapshot,
    WireWill,
)
from .holders import Holders
from .membership import Membership
from .snapshots import merge_snapshots, merged_away

if TYPE_CHECKING:
    from ...packets import Will
    from ...ports import UnicastPort
    from .cluster_values import ClusterSettings

__all__ = ["ClaimingChannel", "Claimant", "Claim", "LocalConnection", "WAIT", "CLAIM", "GATHER", "DONE"]

WAIT, CLAIM, GATHER, DONE = "wait", "claim", "gather", "done"


class LocalConnection:
    """A client connected here, as registered at its registrar."""

    __slots__ = ("channel", "conn", "epoch", "will", "clean", "at", "expiry")

    def __init__(
        self,
        channel: ClaimingChannel,
        conn: str,
        epoch: int,
        will: WireWill | None,
        clean: bool,
        at: float,
        expiry: int = 0xFFFFFFFF,
    ):
        self.channel, self.conn, self.epoch, self.will, self.clean, self.at = channel, conn, epoch, will, clean, at
        self.expiry = expiry  # its session's Session Expiry Interval


class Claim:
    """A connect in progress here."""

    __slots__ = (
        "channel",
        "cid",
        "clean",
        "fresh",
        "expiry",
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
        "ended",
    )

    def __init__(
        self,
        channel: ClaimingChannel,
        cid: str,
        clean: bool,
        will: WireWill | None,
        conn: str,
        now: float,
        fresh: bool | None = None,
        expiry: int = KEPT,
    ):
        """``clean``: the session ends with the connection; ``fresh``: the session held is
        discarded, not gathered (3.1.1's CleanSession is both; MQTT 5 asks them apart);
        ``expiry``: its Session Expiry Interval otherwise."""
        self.channel, self.cid, self.clean, self.will, self.conn = channel, cid, clean, will, conn
        self.fresh = clean if fresh is None else fresh
        self.expiry = expiry
        self.started = now
        self.stage = CLAIM
        self.epoch = 0
        self.prev: str | None = None
        self.waiting: set[str] = set()  # nodes yet to answer
        self.snaps: list[Snapshot] = []
        self.deadline = 0.0
        # messages holders forwarded before the session is here, with when each arrived
        self.forwarded: list[tuple[SessFwd, float]] = []
        self.kept = 0  # the registrar's word: the last claim kept a session at this epoch
        self.answered: set[str] = set()  # nodes that sent their copy (or said they have none)
        # the node of the connection this claim replaces says that connection's session has
        # ended (its release may not have reached the registrar): copies are not resumed
        self.ended = False


def _wire_will(will: Will | None, seq: int = 0, clean: bool = True) -> WireWill | None:
    """The will as the registrar keeps it; its delay only when the session outlives the
    connection (a session that ends with it ends the delay too [MQTT-3.1.2-8])."""
    if will is None:
        return None
    props = props_b64(forwarded(will.properties))
    expiry = will.properties.get(MESSAGE_EXPIRY) if will.properties else None
    delay = 0 if clean or not will.properties else will.properties.get(WILL_DELAY, 0)
    payload = base64.b64encode(will.payload).decode()
    return WireWill(will.topic, payload, will.qos, will.retain, seq, props, expiry, delay)


class Claimant:
    """The claims in progress here and the clients they connected."""

    def __init__(
        self,
        node_id: str,
        incarnation: int,
        membership: Membership,
        holders: Holders,
        outbox: Outbox,
        net: UnicastPort,
        settings: ClusterSettings,
        ids: Iterator[int],
        wall_offset: float,
    ):
        self.node_id = node_id
        self.incarnation = incarnation
        self.membership = membership
        self.holders = holders  # where a claim's session is gathered and served from
        self.out = outbox  # what it says to nodes (this one too): the Cluster sends it
        self._net = net  # asked who is reachable, never to send
        self.settings = settings
        # what it counts (Cluster.counters adds up every part's)
        self.counters = dict.fromkeys(
            (
                "claims",
                "waited_not_synced",
                "waited_no_quorum",
                "kicks",
                "claim_timeouts",
                "fenced",
                "refused_no_quorum",
                "claims_refused",
                "refused_not_synced",
                "expired_copies_discarded",
                "merged_away_in_flight",
            ),
            0,
        )
        self._ids = ids  # connection ids
        self.wall_offset = wall_offset  # wall-clock seconds minus `now`
        self.local: dict[str, LocalConnection] = {}  # our connected clients
        # connections that ended here (their wills published or discarded here), told to
        # the registrar again with every registration round for a while: a release lost in
        # a partition would leave the registrar to publish the will a second time when it
        # finds this node gone (fuzzer seed 22). (cid, conn) -> (when it ended, the release)
        self.released: dict[tuple[str, str], tuple[float, RegRelease]] = {}
        # (cid, conn) -> the epoch of the claim a kick of ours ended it for (a take-over: the
        # session goes on with that claim, session_ended), kept as long as its release
        self.taken_over: dict[tuple[str, str], int] = {}
        self.claims: dict[str, Claim] = {}  # conn -> claim in progress
        # ClientId -> epoch: sessions resumed here to end with their connection (discarded
        # at every holder when it ends)
        self.ending: dict[str, int] = {}
        self.last_register = 0.0

    # -- connecting -----------------------------------------------------------------------------

    def connect(
        self,
        channel: ClaimingChannel,
        cid: str,
        clean: bool,
        will: Will | None,
        now: float,
        will_seq: int = 0,
        fresh: bool | None = None,
        expiry: int = KEPT,
    ) -> None:
        self.counters["claims"] += 1
        fresh = clean if fresh is None else fresh
        why = self._not_ready(cid, clean and fresh, now)
        if why is not None and not self.membership.forming(now):
            self._refuse_unready(channel, why, now)
            return
        conn = f"{self.node_id}/{self.incarnation}/{next(self._ids)}"
        claim = Claim(channel, cid, clean, _wire_will(will, will_seq, clean), conn, now, fresh, expiry)
        claim.deadline = now + self.settings.claim_timeout
        self.claims[conn] = claim
        if why is not None:
            # the node is still forming its links (just started, or resumed after a pause):
            # the claim waits for them, up to claim_timeout, rather than turning away a
            # client of a healthy mesh that connected a moment too early (issue 22)
            claim.stage = WAIT
            self.counters["waited_" + why.removeprefix("refused_")] += 1  # waited_not_synced, waited_no_quorum
            return
        self._to_registrar(claim, now)

    def _not_ready(self, cid: str, clean: bool, now: float) -> str | None:
        """Why this node may not take a claim of ``cid`` now (None: it may); ``clean``: a
        clean session that starts afresh (no copy to gather, none to make)."""
        members = self.membership
        if not members.routing_ready(now):
            # just started: the subscriptions of the other nodes are not known here yet, and
            # what the client publishes would reach none of them (membership.py)
            return "refused_not_synced"
        if not clean and not (members.quorum(now) and members.home_quorum(cid)):
            # at most one live copy of a persistent session: not on the minority side of a
            # partition, nor just after a pause or a start, nor without a majority of the
            # session's home in reach (membership.py)
            return "refused_no_quorum"
        return None

    def _refuse_unready(self, channel: ClaimingChannel, why: str, now: float) -> None:
        self.counters[why] += 1
        if why == "refused_not_synced":
            channel.refused(UNAVAILABLE, "this node has not learned the mesh's subscriptions yet", now)
        else:
            channel.refused(
                UNAVAILABLE, "this node does not see a majority of the mesh (or of the session's nodes) now", now
            )

    def _waited(self, claim: Claim, now: float) -> None:
        """A claim that waited for the mesh to form goes on if the node may take it now, and
        is refused as it would have been at once if the wait is over (claim_timeout)."""
        why = self._not_ready(claim.cid, claim.clean and claim.fresh, now)
        if why is None or now >= claim.deadline:
            del self.claims[claim.conn]  # (nothing was said to a registrar yet)
            claim.stage = DONE
            if not claim.channel.claiming:
                return  # it closed meanwhile
            if why is not None:
                self._refuse_unready(claim.channel, why, now)
                return
            claim.stage = CLAIM
            claim.deadline = now + self.settings.claim_timeout
            self.claims[claim.conn] = claim
            self._to_registrar(claim, now)

    def _to_registrar(self, claim: Claim, now: float) -> None:
        registrar = self.membership.registrars(claim.cid)[0]
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
        (availability), a persistent one is not (one live copy), nor a clean one that resumes
        a session: CONNACK 0x03."""
        if claim.clean and claim.fresh:
            self._granted(claim, 0, None, now)
            return
        self._refuse(claim, "the ClientId's registrar did not answer", now)

    def _refuse(self, claim: Claim, why: str, now: float) -> None:  # (a claim of ours)
        self.claims.pop(claim.conn, None)
        # the registrar may hold it, granted or not yet answered: the connection is not
        # accepted, so its will must not be published for it (fuzzer seed 551), and the
        # session is as the claim found it (finding 23)
        self._release(claim.cid, claim.conn, claim.epoch, now, refused=True)
        claim.stage = DONE
        self.counters["claims_refused"] += 1
        claim.channel.refused(UNAVAILABLE, why, now)

    def _claim(self, claim: Claim, now: float) -> RegClaim:
        wall = now + self.wall_offset
        return RegClaim(
            claim.cid, self.node_id, self.incarnation, claim.conn, claim.clean, claim.will, wall, claim.expiry
        )

    def retry_claims(self, now: float) -> None:
        """Claims and gathers waiting on nodes that just became unreachable move on, and
        claims that waited for the mesh to form go on if it has."""
        live = set(self.membership.live)
        for claim in list(self.claims.values()):
            if claim.stage == WAIT:
                self._waited(claim, now)
            elif claim.stage == CLAIM and claim.prev is None:
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
            if claim.stage == WAIT:
                self._waited(claim, now)  # (the mesh formed between two membership changes, or the wait is over)
            elif now >= claim.deadline:
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
            if m.expired and not claim.fresh:
                # the session ended by its expiry: what a copy still holds is not resumed
                # [MQTT-4.1.0-2], it is discarded as a clean start discards it
                self.counters["expired_copies_discarded"] += 1
                claim.fresh = True
            self._granted(claim, m.epoch, m.prev, now)
            return
        local = self.local.get(m.cid)
        if local is None or local.conn != m.conn:
            # a grant for a claim that ended meanwhile (refused after claim_timeout, or its
            # client left): the registrar must not keep it, nor publish its will
            self._release(m.cid, m.conn, m.epoch, now, refused=True)

    def _granted(self, claim: Claim, epoch: int, prev: str | None, now: float) -> None:
        if claim.stage != CLAIM:
            return
        claim.epoch = epoch
        claim.prev = prev
        holders = self.membership.holders(claim.cid, prev)
        if claim.fresh:
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
            self._release(claim.cid, claim.conn, claim.epoch, now, refused=True)
            return
        holders = self.holders
        merged = None
        if claim.ended and not claim.fresh:
            # the session ended with (or its interval after) the connection this claim replaces,
            # as its node says: what a holder that missed the end keeps is not resumed
            # [MQTT-4.1.0-2] [MQTT-3.1.2-23] but discarded, as a clean start discards it
            self.counters["expired_copies_discarded"] += 1
            claim.fresh = True
            for node in sorted(set(self.membership.holders(claim.cid, claim.prev)) - {self.node_id}):
                self.out.put(node, SessDiscard(claim.cid, claim.epoch))
        if not claim.fresh:
            # our own copy as it is now (it kept queueing while we gathered), and the others'
            snaps = list(claim.snaps)
            own_copy = holders.own_copy(claim.cid, now)
            if own_copy is not None:
                snaps.append(own_copy)
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
            if merged is not None:
                self.counters["merged_away_in_flight"] += merged_away(snaps, merged)
        session, present = holders.serve(
            channel, claim.cid, claim.clean, merged, claim.epoch, claim.forwarded, now, claim.fresh
        )
        if claim.clean and not claim.fresh:
            # a session resumed to end with this connection (MQTT 5: Clean Start 0, Session
            # Expiry 0) lives here only from now on: the holders' copies go now, and again
            # when the connection ends (a copy pooled from its last node while the claim
            # gathered may reach a holder after the first discard)
            self._discard_copies(claim.cid, claim.epoch, claim.prev)
            self.ending[claim.cid] = claim.epoch
        wall = now + self.wall_offset
        local = LocalConnection(channel, claim.conn, claim.epoch, claim.will, claim.clean, wall, claim.expiry)
        self.local[claim.cid] = local
        channel.claimed(session, present, now)
        holders.served(session, now)

    def disconnected(self, channel: ClaimingChannel, now: float, delayed: bool = False, expiry: int = KEPT) -> None:
        """``channel``'s connection ended; ``delayed``: its will is due after its Will Delay
        Interval (the registrar publishes it then, unless the client connects again);
        ``expiry``: its session's Session Expiry Interval."""
        cid = channel.client_id
        local = self.local.get(cid)
        if local is None or local.channel is not channel:
            return
        del self.local[cid]
        if self.ending.get(cid) == local.epoch:
            del self.ending[cid]
            self._discard_copies(cid, local.epoch, self.node_id)
        if local.clean:
            expiry = 0  # (the session ended with it: a registrar that knew nothing of it learns so)
        self._release(cid, local.conn, local.epoch, now, delayed, expiry, will=local.will if delayed else None)

    def _discard_copies(self, cid: str, epoch: int, active: str | None) -> None:
        for node in sorted(set(self.membership.holders(cid, active)) - {self.node_id}):
            self.out.put(node, SessDiscard(cid, epoch))

    def _release(
        self,
        cid: str,
        conn: str,
        epoch: int,
        now: float,
        delayed: bool = False,
        expiry: int = KEPT,
        refused: bool = False,
        will: WireWill | None = None,
    ) -> None:
        """Tell the registrar a connection ended (``refused``: a claim never accepted;
        ``will``: its will, which waits for its delay)."""
        body = RegRelease(cid, conn, epoch, self.node_id, delayed, expiry, refused, 0, will)
        self.released[(cid, conn)] = (now, body)
        self.out.put(self.membership.registrars(cid)[0], body)

    def on_kick(self, frm: str, m: RegKick, now: float) -> None:
        self.counters["kicks"] += frm != self.node_id
        cid, conn = m.cid, m.conn
        local = self.local.get(cid)
        if local is not None and local.conn == conn:
            self.taken_over[(cid, conn)] = m.epoch  # (its session goes on with that claim)
            local.channel.kick(f"ClientId {cid!r} connected on node {m.by}", now)  # [MQTT-3.1.4-2]
            return
        claim = self.claims.get(conn)
        if claim is not None:
            claim.stage = DONE
            self.claims.pop(conn, None)
            claim.channel.close(f"ClientId {cid!r} connected on node {m.by} meanwhile")

    def register_local(self, now: float) -> None:
        """Tell the registrars which clients are here (after a change, and periodically)."""
        self.last_register = now
        for (cid, conn), (ended, release) in list(self.released.items()):
            if now >= ended + 6 * self.settings.register_interval:
                del self.released[(cid, conn)]
                self.taken_over.pop((cid, conn), None)
            else:  # (idempotent at the registrar: it drops a release of another connection)
                ago = round((now - ended) * 1000)  # (when the session's interval began)
                self.out.put(self.membership.registrars(cid)[0], replace(release, ago=ago))
        # (a copy: a registration handled here may end a local connection, fuzzer seed 214)
        for cid, local in list(self.local.items()):
            if self.local.get(cid) is not local:
                continue  # ended by a registration handled above
            will, at = local.will, local.at
            body = RegRegister(
                cid, self.node_id, self.incarnation, local.conn, local.epoch, local.clean, will, at, local.expiry
            )
            self.out.put(self.membership.registrars(cid)[0], body)

    def on_state(self, frm: str, m: SessState, now: float) -> None:
        claim = self.claims.get(m.conn)
        if claim is None or claim.stage != GATHER:
            return
        if m.snap is not None:
            claim.snaps.append(replace(m.snap, taken_at=now))  # (its messages' lives count from now)
        if m.ended and frm == claim.prev:
            claim.ended = True
        claim.answered.add(frm)
        claim.waiting.discard(frm)
        if not claim.waiting:
            self._finish(claim, now)

    def session_ended(self, cid: str, epoch: int, now: float) -> bool:
        """Has the session of this node's last connection of ``cid`` (before the claim of
        ``epoch``) ended by ``now``: no connection of it here, and that one released here at
        its end, a session ending with it or its Session Expiry Interval since passed? (What
        a claim that replaces it learns from this node's answer, ``SessState.ended``, should
        the release have been lost on the way to the registrar: fuzzer seed 501, finding 28
        of docs/simulation.md.)"""
        if cid in self.local:
            return False
        last: tuple[float, RegRelease] | None = None
        for (c, _conn), (ended, release) in self.released.items():
            if c == cid and not release.refused and release.epoch < epoch:
                if last is None or release.epoch > last[1].epoch:
                    last = (ended, release)
        if last is None or last[1].expiry == KEPT:
            return False
        if self.taken_over.get((cid, last[1].conn)) == epoch:
            return False  # (this very claim took it over: the session goes on with it, seed 939)
        return last[0] + last[1].expiry <= now

    def resuming(self, cid: str) -> bool:
        """Is a claim of ``cid`` in progress here? Our copy of its session then outlives its
        Session Expiry Interval until the claim ends (SessionTable ``expire_sessions``): the
        connection that resumes the session began before the end as far as this node knows,
        and the registrar's grant says whether the session ended (``RegGrant.expired``: the
        claim discards the copies then; a refused claim lets our copy expire). Meanwhile the
        copy takes what the mesh brings and the holders forward for the session, after the
        copies the claim gathered were taken: expired, it took such a message with it, which
        the client never got (fuzzer seed 621, finding 29 of docs/simulation.md)."""
        return any(claim.cid == cid for claim in self.claims.values())

    def on_fetch(self, frm: str, m: SessFetch, now: float) -> None:
        """A claim of ``m.cid`` at ``frm`` gathers its session: a client of ours with another
        connection stops first (its copy goes to ``frm``: holders.py ``on_fetch``)."""
        local = self.local.get(m.cid)
        if local is not None and local.conn != m.conn:
            local.channel.kick(f"ClientId {m.cid!r} taken over by node {frm}", now)  # stops delivery first

    def gathering(self, m: SessFwd, now: float) -> None:
        """A message a holder forwarded for a session not here yet: a claim still gathering
        it keeps it for ``_finish`` (holders.py ``serve``)."""
        for claim in self.claims.values():
            if claim.cid == m.cid and claim.stage == GATHER:
                claim.forwarded.append((m, now))

    def fence(self, now: float, sessions: bool = True) -> None:
        """Without a quorum (membership.py) this node stops serving persistent sessions: their
        clients are closed and reconnect elsewhere (where the majority is). ``sessions``: also
        each session's home (which changes only with the membership)."""
        members = self.membership
        quorum = members.quorum(now)
        if quorum and not sessions:
            return
        for cid, local in list(self.local.items()):
            if not local.clean and not (quorum and members.home_quorum(cid)):
                self.counters["fenced"] += 1
                local.channel.kick(f"ClientId {cid!r}: this node does not see a majority of the mesh now", now)
