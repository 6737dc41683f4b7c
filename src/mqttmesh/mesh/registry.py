"""The registrar side of mesh-wide ClientIds: claims, registrations, the backup, lost wills.

Pure. Each ClientId has a registrar (the top node of its ranking, membership.py) and a
backup (the second), which keep a Registration: the node and connection that hold the id,
the epoch handed out with it, and the client's will. A claim is granted with the next
epoch and the previous holder is kicked (fencing: the kick names the connection it is
for) [MQTT-3.1.4-2]. Nodes re-register their connections after a membership change; two
live registrations for one id (made on both sides of a split) keep the larger
(epoch, at, node) and kick the other. When the node holding a connection is found dead,
the registrar publishes the client's will, once [MQTT-3.1.2-8].
"""

from __future__ import annotations

import base64
import dataclasses
from typing import TYPE_CHECKING, Any

from ..message import Message
from .cluster_wire import RegClaim, RegCopy, RegGrant, Registration, RegKick, RegRegister, RegRelease, SendFn
from .membership import Membership

if TYPE_CHECKING:
    from ..broker import Broker

__all__ = ["Registry"]


class Registry:
    def __init__(
        self,
        node_id: str,
        membership: Membership,
        broker: Broker,
        send: SendFn,
        counters: dict[str, int],
        wall_offset: float,
    ):
        self.node_id = node_id
        self.membership = membership
        self.broker = broker
        self._send = send
        self.counters = counters
        self.wall_offset = wall_offset  # wall-clock seconds minus `now`
        self.entries: dict[str, Registration] = {}  # the ids we are registrar or backup of

    # -- handlers of the registrar's messages --------------------------------------------

    def on_claim(self, frm: str, m: RegClaim, now: float) -> None:
        cid = m.cid
        entry = self.entries.get(cid)
        epoch = (entry.epoch if entry else 0) + 1
        prev = entry.node if entry else None
        if entry and entry.connected and entry.conn != m.conn:
            members = self.membership
            if entry.node not in members.live or members.incs.get(entry.node) != entry.inc:
                # the old connection went with its node (no kick can reach it): its will is
                # due now, not after will_delay, for this claim replaces the registration
                self._publish_will(entry, now)
            else:
                self.counters["kicks"] += 1
                self._send(entry.node, RegKick(cid, entry.conn, epoch, m.node), now)
        self._store(Registration(cid, m.node, m.inc, m.conn, epoch, m.clean, m.will, True, m.at), now)
        kept = entry.epoch if entry and not entry.clean else 0
        self._send(m.node, RegGrant(cid, m.conn, epoch, prev, kept), now)

    def on_register(self, frm: str, m: RegRegister, now: float) -> None:
        """A holder of a connection says so (after membership changes, and periodically)."""
        cid = m.cid
        entry = self.entries.get(cid)
        live = self.membership.live
        if entry is None or entry.conn == m.conn or not entry.connected or entry.node not in live:
            if entry is None or m.epoch >= entry.epoch or not entry.connected or entry.node not in live:
                epoch = max(m.epoch, entry.epoch if entry else 0)
                self._store(_registration(m, epoch), now)
            return
        # two live connections for one ClientId (e.g. made on both sides of a split): one goes
        if (entry.epoch, entry.at, entry.node) >= (m.epoch, m.at, m.node):
            winner, loser_node, loser_conn = entry, m.node, m.conn
        else:
            winner, loser_node, loser_conn = _registration(m, m.epoch), entry.node, entry.conn
        self.counters["kicks"] += 1
        self._send(loser_node, RegKick(cid, loser_conn, winner.epoch, winner.node), now)
        self._store(dataclasses.replace(winner, connected=True), now)

    def on_release(self, frm: str, m: RegRelease, now: float) -> None:
        entry = self.entries.get(m.cid)
        if entry is not None and entry.conn == m.conn:
            self._store(dataclasses.replace(entry, connected=False, will=None), now)

    def on_copy(self, frm: str, m: RegCopy, now: float) -> None:
        """The registrar's copy, at its backup (or at a new registrar after a change)."""
        for entry in m.entries:
            have = self.entries.get(entry.cid)
            if have is None or (entry.epoch, not entry.connected) >= (have.epoch, not have.connected):
                self.entries[entry.cid] = entry

    # -- upkeep -----------------------------------------------------------------------------

    def _store(self, entry: Registration, now: float) -> None:
        self.entries[entry.cid] = entry
        for r in self.membership.registrars(entry.cid):
            if r != self.node_id:
                self._send(r, RegCopy([entry]), now)

    def rebalance(self, now: float) -> None:
        """The live nodes changed: entries go to their (new) registrars, and we keep ours."""
        for cid, entry in list(self.entries.items()):
            regs = self.membership.registrars(cid)
            for r in regs:
                if r != self.node_id:
                    self._send(r, RegCopy([entry]), now)
            if self.node_id not in regs:
                del self.entries[cid]

    def publish_lost_wills(self, now: float) -> None:
        """Clients of nodes found dead: their wills, published once, by their registrar."""
        membership = self.membership
        dead = membership.dead(now)
        if not dead:
            return
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
            self._store(dataclasses.replace(entry, connected=False, will=None), now)
            self._publish_will(entry, now)
        membership.restarts_settled()

    def _publish_will(self, entry: Registration, now: float) -> None:
        will = entry.will
        if will is not None:
            self.counters["wills_published"] += 1
            payload = base64.b64decode(will.payload_b64)
            wall = now + self.wall_offset
            seq = self.broker.next_seq()
            self.broker.publish(Message(will.topic, payload, will.qos, will.retain, self.node_id, seq, entry.cid, wall))

    def view(self) -> dict[str, dict[str, Any]]:
        """The ClientIds this node is the first registrar of (for $SYS/mesh/clients)."""
        return {
            cid: {"node": e.node, "epoch": e.epoch, "connected": e.connected}
            for cid, e in sorted(self.entries.items())
            if self.membership.registrars(cid)[0] == self.node_id
        }


def _registration(m: RegRegister, epoch: int) -> Registration:
    return Registration(m.cid, m.node, m.inc, m.conn, epoch, m.clean, m.will, True, m.at)
