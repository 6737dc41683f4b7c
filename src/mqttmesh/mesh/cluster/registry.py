"""The registrar side of mesh-wide ClientIds: claims, registrations, the backup, lost wills.

Pure. Each ClientId has a registrar (the top node of its ranking, membership.py) and a
backup (the second), which keep a Registration: the node and connection that hold the id,
the epoch handed out with it, and the client's will. A claim is granted with the next
epoch and the previous holder is kicked (fencing: the kick names the connection it is
for) [MQTT-3.1.4-2]. Nodes re-register their connections after a membership change; two
live registrations for one id (made on both sides of a split) keep the larger
(epoch, at, node) and kick the other. When the node holding a connection is found dead,
the registrar publishes the client's will, once [MQTT-3.1.2-8].

It answers with data: every handler takes ``(from, message, now)`` (the upkeep, ``now``)
and returns what to do, in order: ``ToNode`` messages for other nodes (or this one) and
``WillDue`` wills to publish here; the Cluster does it. It holds no broker and no send.
"""

from __future__ import annotations

import base64
import dataclasses
from typing import Any

from ...message import Message
from ...session import KEPT
from .cluster_values import props_of
from .cluster_wire import (
    RegClaim,
    RegCopy,
    RegGrant,
    Registration,
    RegKick,
    RegRegister,
    RegRelease,
    ToNode,
    WillDue,
)
from .membership import Membership

__all__ = ["Registry", "RegistryOut"]

# what the registry answers: messages for nodes and wills to publish here, in order
RegistryOut = list[ToNode | WillDue]


class Registry:
    def __init__(
        self,
        node_id: str,
        membership: Membership,
        wall_offset: float,
        kick_wait: float = 10.0,
    ):
        self.node_id = node_id
        self.membership = membership
        # what it counts (Cluster.counters adds up every part's)
        # (kicked_again: a connection a later claim replaced registered again once that claim's
        # connection had ended or gone out of sight: its kick was lost)
        self.counters = dict.fromkeys(("kicks", "kicked_again", "wills_published"), 0)
        self.wall_offset = wall_offset  # wall-clock seconds minus `now`
        self.entries: dict[str, Registration] = {}  # the ids we are registrar or backup of
        # (cid, conn) -> (the registration a claim replaced, when): a connection kicked on a
        # node we believed alive. Its node publishes its will as it closes it and tells us
        # (RegRelease); if that node turns out dead (or restarted) first, we publish it. Kept
        # ``kick_wait`` at most while the node stays alive (it got the kick, or it would
        # still register the connection and be kicked again).
        self.kicked: dict[tuple[str, str], tuple[Registration, float]] = {}
        self.kick_wait = kick_wait

    # -- handlers of the registrar's messages --------------------------------------------

    def on_claim(self, frm: str, m: RegClaim, now: float) -> RegistryOut:
        out: RegistryOut = []
        cid = m.cid
        entry = self.entries.get(cid)
        epoch = (entry.epoch if entry else 0) + 1
        prev = entry.node if entry else None
        if entry and entry.connected and entry.conn != m.conn:
            members = self.membership
            if entry.node not in members.live or members.incs.get(entry.node) != entry.inc:
                # the old connection went with its node (no kick can reach it): its will is
                # due now, not after will_delay, for this claim replaces the registration
                # (one with a Will Delay Interval never: a new connection came first
                # [MQTT-3.1.3-9])
                if not _delays(entry):
                    self._publish_will(entry, now, out)
            else:
                self.counters["kicks"] += 1
                self.kicked[(cid, entry.conn)] = (entry, now)
                out.append(ToNode(entry.node, RegKick(cid, entry.conn, epoch, m.node)))
        wall = now + self.wall_offset
        # (the session's end as this claim finds it, kept while it is connected: if the claim
        # is never accepted, the session is as it was, on_release)
        found = _found_end(entry, m.conn, wall)
        registration = Registration(
            cid, m.node, m.inc, m.conn, epoch, m.clean, m.will, True, m.at, session_due=found, expiry=m.expiry
        )
        self._store(registration, out)
        kept = entry.epoch if entry and not entry.clean else 0
        # (an entry still connected is a claim in progress or a connection: nothing expired)
        due = entry.session_due if entry is not None and not entry.connected else None
        expired = due is not None and due <= wall
        out.append(ToNode(m.node, RegGrant(cid, m.conn, epoch, prev, kept, expired)))
        return out

    def on_register(self, frm: str, m: RegRegister, now: float) -> RegistryOut:
        """A holder of a connection says so (after membership changes, and periodically)."""
        out: RegistryOut = []
        cid = m.cid
        entry = self.entries.get(cid)
        live = self.membership.live
        if entry is None or entry.conn == m.conn or not entry.connected or entry.node not in live:
            if entry is not None and _replaced_by(entry, m):
                # a connection a later claim replaced, whose kick never reached it (sent on a
                # route a partition had cut), and that claim's connection ended since (or its
                # node is out of sight): it is kicked again, as it is while that one is live
                # below [MQTT-3.1.4-3]. Taken back, it came with the later epoch and its will,
                # published at its end though a new connection of the ClientId had come first
                # [MQTT-3.1.3-9] (fuzzer seed 655, finding 37 of docs/simulation.md). Kept
                # among the kicked, as a claim's kick is.
                self.counters["kicks"] += 1
                self.counters["kicked_again"] += 1
                self.kicked[(cid, m.conn)] = (_registration(m, m.epoch), now)
                out.append(ToNode(m.node, RegKick(cid, m.conn, entry.epoch, entry.node)))
                return out
            if entry is None or m.epoch >= entry.epoch or not entry.connected or entry.node not in live:
                epoch = max(m.epoch, entry.epoch if entry else 0)
                if entry is not None and entry.conn != m.conn:
                    self._replaced(entry, now, out)
                self._store(_registration(m, epoch), out)
            return out
        # two live connections for one ClientId (e.g. made on both sides of a split): one goes
        if (entry.epoch, entry.at, entry.node) >= (m.epoch, m.at, m.node):
            winner, loser_node, loser_conn = entry, m.node, m.conn
        else:
            winner, loser_node, loser_conn = _registration(m, m.epoch), entry.node, entry.conn
        self.counters["kicks"] += 1
        out.append(ToNode(loser_node, RegKick(cid, loser_conn, winner.epoch, winner.node)))
        self._store(dataclasses.replace(winner, connected=True), out)
        return out

    def on_release(self, frm: str, m: RegRelease, now: float) -> RegistryOut:
        out: RegistryOut = []
        kicked = self.kicked.pop((m.cid, m.conn), None)  # (its node closed it: its will is out there)
        regs = self.membership.registrars(m.cid)
        if frm not in regs:
            # the backup may keep the connection among its kicked too (a registrar's copy
            # replaced it there): it hears of the release as well (fuzzer seed 94)
            for r in regs:
                if r != self.node_id:
                    out.append(ToNode(r, m))
        entry = self.entries.get(m.cid)
        wall = now + self.wall_offset - m.ago / 1000  # (when the connection ended)
        if entry is not None and entry.conn == m.conn and entry.connected and m.refused:
            # a claim never accepted (0x03, or its client left first) resumed nothing: the
            # session ends when it would have without it, as the claim found it (a release that
            # said "never" forgot an end known, and at a heal the other side's, finding 23)
            self._store(dataclasses.replace(entry, connected=False, will=None, will_due=None, refused=True), out)
        elif entry is not None and entry.conn == m.conn and entry.connected:  # (one sent again: done)
            session_due = _session_due(entry, m.expiry, wall)
            if m.delayed and _delays(entry):
                # due after its delay, or when the session ends if that comes first [MQTT-3.1.2-8]
                delay: int = entry.will.delay  # type: ignore[union-attr]
                if session_due is not None:
                    delay = min(delay, m.expiry)
                entry = dataclasses.replace(entry, connected=False, will_due=wall + delay, session_due=session_due)
            else:
                entry = dataclasses.replace(entry, connected=False, will=None, will_due=None, session_due=session_due)
            self._store(entry, out)
        elif kicked is not None and entry is not None and (entry.connected or entry.refused) and not m.refused:
            # the connection a claim (still on, or refused since) replaced has ended: the
            # session the claim found ends its interval from that end (it counted from the
            # claim, before the kick arrived)
            self._store(dataclasses.replace(entry, session_due=_session_due(kicked[0], m.expiry, wall)), out)
        elif entry is not None and entry.conn == m.conn and entry.epoch == m.epoch and not m.refused:
            # its end, known here first by finding its node gone (a partition): the release,
            # re-sent since, says when it really ended, and what became of its will
            self._told_end(entry, m, wall, out)
        elif (entry is None or (entry.epoch < m.epoch and not entry.connected)) and not m.refused:
            # a connection this registrar never had a copy of (its claim was granted across a
            # partition, by the registrar of the other side): its end, its session's end and
            # its delayed will are known here from now on, as the release says (also where the
            # sender took this node for the registrar before it did: it will, once it finds
            # the others gone, and the entry is then its, rebalance)
            self._store(_ended(m, self.membership.incs.get(m.node, 0), wall), out)
        return out

    def _told_end(self, entry: Registration, m: RegRelease, ended: float, out: RegistryOut) -> None:
        """``entry``'s connection was taken for ended with its node, which now says it ended
        at ``ended`` (wall clock): the session ends its interval from then, if that is earlier
        than counted from the loss of sight [MQTT-4.1.0-2]; a will still waiting is dropped
        if the node took care of it (a DISCONNECT deleted it [MQTT-3.1.2-10], or it had no
        delay and the node published it), else due its delay from then [MQTT-3.1.2-8] (never
        before it: the end is the node's own). Finding 26 of docs/simulation.md."""
        due = _session_due(entry, m.expiry, ended)
        if due is not None and (entry.session_due is None or due < entry.session_due):
            entry = dataclasses.replace(entry, session_due=due)
        will, kept_due = entry.will, entry.will_due
        if will is not None and kept_due is not None:
            if not m.delayed:
                entry = dataclasses.replace(entry, will=None, will_due=None)
            elif ended + min(will.delay, m.expiry) < kept_due:
                entry = dataclasses.replace(entry, will_due=ended + min(will.delay, m.expiry))
        if entry != self.entries.get(entry.cid):
            self._store(entry, out)

    def on_copy(self, frm: str, m: RegCopy, now: float) -> RegistryOut:
        """The registrar's copy, at its backup (or at a new registrar after a change)."""
        out: RegistryOut = []
        mine = self.membership.incs.get(self.node_id)
        for entry in m.entries:
            have = self.entries.get(entry.cid)
            if not entry.connected:
                kicked = self.kicked.pop((entry.cid, entry.conn), None)  # (its node released it)
                if kicked is not None and have is not None and _ends_earlier(entry, have):
                    # the copy of the connection a claim here replaced says when it ended (its
                    # release went to another registrar, in a view of the mesh that left us
                    # out): the session the claim found ends then, as on_release would have it
                    # (fuzzer seed 498, finding 27 of docs/simulation.md)
                    self._store(dataclasses.replace(have, session_due=entry.session_due), out)
                    have = self.entries[entry.cid]
                if have is not None and _will_settled(have, entry):
                    # the end of one connection known two ways (a heal): here its will was
                    # published, or dropped by its DISCONNECT [MQTT-3.1.2-10]; the copy of a
                    # side that took its node for gone, the will still waiting for its delay,
                    # does not bring it back (fuzzer seed 59)
                    entry = dataclasses.replace(entry, will=None, will_due=None)
            if have is None or _supersedes(entry, have):
                if have is not None and have.conn != entry.conn:
                    # (two registrars of one id across a split may hand out the same epoch:
                    # the connection this copy replaces still has its will, fuzzer seed 12)
                    self._replaced(have, now, out)
                self.entries[entry.cid] = entry
                if entry.connected and entry.node == self.node_id and entry.inc != mine:
                    # a connection of this node's earlier life, handed back by the backup that
                    # kept it while we were down: it is gone, its will is due (fuzzer seed 12)
                    if self.membership.registrars(entry.cid)[0] == self.node_id:
                        self._store(dataclasses.replace(entry, connected=False, will=None), out)
                        self._publish_will(entry, now, out)
        return out

    def _replaced(self, entry: Registration, now: float, out: RegistryOut) -> None:
        """The registration of another connection replaces ``entry``: if that connection was
        open with a will on a node that is gone (or restarted), its will is due now, and
        nobody else knows of it any more (published by the registrar). On a node believed
        alive, that node publishes it when the connection ends; it is kept among the kicked
        in case the node turns out dead first."""
        if not entry.connected or entry.will is None or _delays(entry):
            return  # (a will with a delay: a new connection came first [MQTT-3.1.3-9])
        members = self.membership
        if entry.node in members.live and members.incs.get(entry.node) == entry.inc:
            # (believed alive: kept until its node closes it, or is found dead or restarted:
            # the news of a restart may come after the entry was replaced, fuzzer seed 12)
            self.kicked.setdefault((entry.cid, entry.conn), (entry, now))
        elif self._may_publish(entry):
            self._publish_will(entry, now, out)

    def _may_publish(self, entry: Registration) -> bool:
        """A will with its own message id (reserved at CONNECT) is one message whoever
        publishes it: any holder of the registration may; one without (a registration of
        before) only the registrar, lest it be two messages."""
        return bool(entry.will and entry.will.seq) or self.membership.registrars(entry.cid)[0] == self.node_id

    # -- upkeep -----------------------------------------------------------------------------

    def _store(self, entry: Registration, out: RegistryOut) -> None:
        self.entries[entry.cid] = entry
        for r in self.membership.keepers(entry.cid, entry.node):
            if r != self.node_id:
                out.append(ToNode(r, RegCopy([entry])))

    def rebalance(self, now: float) -> RegistryOut:
        """The live nodes changed: entries go to their (new) keepers, and we keep ours."""
        out: RegistryOut = []
        for cid, entry in list(self.entries.items()):
            keep = self.membership.keepers(cid, entry.node)
            for r in keep:
                if r != self.node_id:
                    out.append(ToNode(r, RegCopy([entry])))
            if self.node_id not in keep:
                del self.entries[cid]
        return out

    def publish_lost_wills(self, now: float) -> RegistryOut:
        """Clients of nodes found dead: their wills, published once, by their registrar."""
        out: RegistryOut = []
        membership = self.membership
        dead = membership.dead(now)
        for key, (entry, at) in list(self.kicked.items()):
            if entry.node in membership.live and membership.incs.get(entry.node) == entry.inc:
                if now - at >= self.kick_wait:
                    del self.kicked[key]  # its node is alive and had time to close it
                continue
            if entry.node in membership.live or entry.node in dead:
                # kicked on a node that died (or restarted) before it closed the connection:
                # its will is due, and nobody else will publish it (fuzzer seed 551); whoever
                # holds it publishes it (a registrar, its backup, one that was registrar when
                # it kept it, seed 17): one message by its id, taken once everywhere
                del self.kicked[key]
                if self._may_publish(entry) and not _delays(entry):
                    self._publish_will(entry, now, out)
        self._publish_due_wills(now, out)
        if not dead:
            return out
        for cid, entry in list(self.entries.items()):
            if not entry.connected:
                continue
            if entry.node in membership.live:
                # reachable: only a connection of an earlier incarnation is gone (a restart)
                node_dead = membership.incs.get(entry.node) != entry.inc
            else:
                node_dead = entry.node in dead
            if not node_dead or membership.registrars(cid)[0] != self.node_id:
                continue
            # the connection ended with its node: its session ends its interval later, its
            # will after its delay (or with the session)
            wall = now + self.wall_offset
            session_due = _session_due(entry, entry.expiry, wall)
            if _delays(entry):
                delay: int = entry.will.delay  # type: ignore[union-attr]
                if session_due is not None:
                    delay = min(delay, entry.expiry)
                gone = dataclasses.replace(entry, connected=False, will_due=wall + delay, session_due=session_due)
                self._store(gone, out)
                continue
            self._store(dataclasses.replace(entry, connected=False, will=None, session_due=session_due), out)
            self._publish_will(entry, now, out)
        membership.restarts_settled()
        return out

    def _publish_due_wills(self, now: float, out: RegistryOut) -> None:
        """Wills whose Will Delay Interval passed with no new connection for their ClientId
        (a claim or a registration replaces the entry, and the will with it [MQTT-3.1.3-9]):
        published by the registrar, once [MQTT-3.1.2-8]."""
        wall = now + self.wall_offset
        for cid, entry in list(self.entries.items()):
            if entry.connected or self.membership.registrars(cid)[0] != self.node_id:
                continue
            due = entry.will_due
            if due is not None and due <= wall:
                self._store(dataclasses.replace(entry, will=None, will_due=None), out)
                self._publish_will(entry, now, out)
                entry = self.entries[cid]
            if entry.session_due is not None and entry.session_due <= wall and not entry.clean:
                # the session expired: none is kept for the ClientId from now on (a claim
                # that finds no copy is not refused for it, and one that finds a copy that
                # missed the end discards it: RegGrant.expired) [MQTT-4.1.0-2]
                self._store(dataclasses.replace(entry, clean=True), out)

    def _publish_will(self, entry: Registration, now: float, out: RegistryOut) -> None:
        will = entry.will
        if will is None:
            return
        self.counters["wills_published"] += 1
        payload = base64.b64decode(will.payload_b64)
        wall = now + self.wall_offset
        if not will.seq:  # (a registration of before the will's number was reserved)
            msg = Message(will.topic, payload, will.qos, will.retain, self.node_id, 0, entry.cid, wall)
            msg.props = props_of(will.props_b64)
            if will.expiry is not None:
                msg.expiring(will.expiry, now)  # (counted from its publication)
            out.append(WillDue(msg))
            return
        # the message the connection's node would have published, under its id: if that node
        # (or another registrar, across a split) published it too, every node's duplicate
        # filter and every persistent session take it once
        msg = Message(will.topic, payload, will.qos, will.retain, entry.node, will.seq, entry.cid, wall)
        msg.props = props_of(will.props_b64)
        if will.expiry is not None:
            msg.expiring(will.expiry, now)
        if entry.node != self.node_id:
            msg.ack_to = self.node_id  # (the destinations acknowledge to us: custody is ours)
        out.append(WillDue(msg))

    def view(self) -> dict[str, dict[str, Any]]:
        """The ClientIds this node is the first registrar of (for $SYS/mesh/clients)."""
        return {
            cid: {"node": e.node, "epoch": e.epoch, "connected": e.connected}
            for cid, e in sorted(self.entries.items())
            if self.membership.registrars(cid)[0] == self.node_id
        }


def _delays(entry: Registration) -> bool:
    """Its connection's will waits for a Will Delay Interval (MQTT 5, a session that outlives
    the connection)."""
    return entry.will is not None and entry.will.delay > 0


def _supersedes(copy: Registration, have: Registration) -> bool:
    """A registrar's ``copy`` replaces the entry ``have``: a larger epoch; for one connection
    at one epoch, its end (a copy says it ended); for two connections at one epoch (two
    registrars across a split handed it out twice), a claim that was accepted over one never
    accepted (which knows nothing of the session but what its registrar found, nothing after
    a restart, fuzzer seed 133), else the later claim, as ``on_register`` decides (an ended
    connection's copy took the place of a live one's claimed later, with its will and its
    session's end, fuzzer seed 141). Finding 26 of docs/simulation.md."""
    if copy.epoch != have.epoch:
        return copy.epoch > have.epoch
    if copy.conn == have.conn:
        return not copy.connected or have.connected
    if copy.refused != have.refused:
        return have.refused
    return (copy.at, copy.node) >= (have.at, have.node)


def _replaced_by(entry: Registration, m: RegRegister) -> bool:
    """Is ``m`` the registration of a connection that ``entry``'s claim replaced: another
    connection, of an earlier epoch and claimed earlier, and ``entry``'s claim not refused (its
    client got 0x03, and the connection it would have replaced goes on)? Both tests, for two
    registrars across a split hand out epochs apart: a smaller epoch claimed later may be the
    client's newer connection, kept if the entry's has ended (two live ones: the larger
    (epoch, at, node) stays)."""
    return entry.conn != m.conn and m.epoch < entry.epoch and m.at < entry.at and not entry.refused


def _ends_earlier(copy: Registration, have: Registration) -> bool:
    """``copy`` is a connection that ended, of an epoch before ``have``'s claim (on, or
    refused), and ends the session earlier than the claim counted."""
    return (
        copy.epoch < have.epoch
        and copy.conn != have.conn
        and (have.connected or have.refused)
        and copy.session_due is not None
        and (have.session_due is None or copy.session_due < have.session_due)
    )


def _will_settled(have: Registration, copy: Registration) -> bool:
    """``have`` and ``copy`` are the same ended connection (its epoch) and ``have`` no longer
    holds the will ``copy`` still does: it went (published, or deleted by a DISCONNECT)."""
    return (
        have.conn == copy.conn
        and have.epoch == copy.epoch
        and not have.connected
        and have.will is None
        and copy.will is not None
    )


def _session_due(entry: Registration, expiry: int, wall: float) -> float | None:
    """When the session of ``entry``'s connection, which ended at ``wall``, ends: its Session
    Expiry Interval later (None: never), or at once for a session that ends with its
    connection (CleanSession 1; MQTT 5 Session Expiry 0), so that a later claim's grant says
    ``expired`` and a copy that missed the end's discards is not resumed (finding 22 of
    docs/simulation.md) [MQTT-3.1.2-23] [MQTT-4.1.0-2]."""
    if entry.clean:
        return wall
    return wall + expiry if expiry != KEPT else None


def _found_end(entry: Registration | None, conn: str, wall: float) -> float | None:
    """When the session a claim of ``conn`` finds at ``wall`` ends if the claim resumes nothing:
    as the entry says (None: never), or, for a connection still on that the claim replaces,
    its interval from now (the kick ends it)."""
    if entry is None:
        return None
    if not entry.connected or entry.conn == conn:  # (the same claim again: what it found first)
        return entry.session_due
    return _session_due(entry, entry.expiry, wall)


def _ended(m: RegRelease, inc: int, ended: float) -> Registration:
    """The entry of a connection known only by its release, which ended at ``ended``."""
    will = m.will if m.delayed else None
    entry = Registration(m.cid, m.node, inc, m.conn, m.epoch, m.expiry == 0, will, False, ended, expiry=m.expiry)
    due = _session_due(entry, m.expiry, ended)
    will_due = None if will is None else ended + min(will.delay, m.expiry)
    return dataclasses.replace(entry, session_due=due, will_due=will_due)


def _registration(m: RegRegister, epoch: int) -> Registration:
    return Registration(m.cid, m.node, m.inc, m.conn, epoch, m.clean, m.will, True, m.at, expiry=m.expiry)
