"""Confirmations: a persistent session's settlements reach its other holders before the
client sees what depends on them, and a node that cannot keep that promise stops serving.

Pure. ``Confirmations`` is mixed into ``holders.Holders`` (which keeps the state: the
sessions, the membership, ``lagging``). The node the client is on sends each settlement batch
(``Holders.flush``); every other live holder answers ``sess.ack`` with the session's version
it now has, or why it could not take them (no copy: -1, send one; it serves the client
itself: -2). ``_advance`` raises the session's safe version to what every live holder has
and releases the frames that waited for it (channel_held.py); a holder silent for
``settle_retry`` gets a copy of the whole session; a holder that knows a newer epoch fences
this node off (and so does losing the majority of the mesh or of the session's home:
claimant.py ``fence``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .cluster_wire import SessAck

if TYPE_CHECKING:
    from ...session_table import SessionTable
    from .cluster_values import ClusterSettings
    from .cluster_wire import Outbox
    from .membership import Membership
    from .pools import Pool
    from .replica import _Replicated
    from .replication import Replication

__all__ = ["Confirmations"]


class Confirmations:
    """The confirmation steps of the holders (a mixin: ``Holders`` keeps the state)."""

    if TYPE_CHECKING:  # what they use of the Holders
        node_id: str
        membership: Membership
        table: SessionTable
        settings: ClusterSettings
        counters: dict[str, int]
        lagging: dict[str, float]
        out: Outbox
        replication: Replication

        def _replica(self, cid: str, create: bool = True) -> _Replicated | None: ...

        def _copy_to_holders(self, session: _Replicated, now: float, only: set[str] | None = None) -> None: ...

        def pool(self, replica: _Replicated, holders: list[str], now: float) -> None: ...

        def pool_answered(self, frm: str, m: SessAck) -> None: ...

        pools: dict[str, Pool]

    def on_ack(self, frm: str, m: SessAck, now: float) -> None:
        """A holder has our settlements up to ``m.version`` (or could not take them)."""
        session = self._replica(m.cid, create=False)
        if session is not None and session.channel is None:
            if m.epoch > session.epoch and session.active_node == self.node_id and m.cid not in self.pools:
                # the answer to the copy an old home sent when its client left (a stall had hid
                # the claim elsewhere from it): a newer claim served the client, and this node,
                # still the session's home, a member of its groups, pools its copy; a holder that
                # knows the claim answers with its copy, and it lets go (simulator, finding 42)
                self.pool(session, self.membership.holders(m.cid, self.node_id), now)
            else:
                self.pool_answered(frm, m)  # (an answer to a copy we pooled, if any)
            return
        if session is None or session.channel is None or session.active_node != self.node_id:
            return
        if m.epoch > session.epoch or (m.version == -2 and m.epoch == session.epoch):
            # the holder knows a newer claim of the ClientId (or serves it at ours): the
            # client is not ours to serve any more [MQTT-3.1.4-2]
            self.counters["fenced"] += 1
            session.channel.kick(f"ClientId {m.cid!r} is active elsewhere (epoch {m.epoch})", now)
            if m.epoch > session.epoch and session.channel is None and session.active_node == self.node_id:
                # a newer claim elsewhere did not reach this node (its gather, or the copy after
                # its CONNACK, was cut off; a refused claim before it had named itself the
                # client's node at the holders, so that the next one's copies did not name
                # this one), which would stay the session's home, a member of its groups
                # queueing for a client that is not here: its copy is pooled with the holders
                # now, not at the next change of the live nodes, and one that knows the newer
                # claim answers with its copy (``on_merge``, ``on_copy``: it lets go; the
                # simulator's finding 41)
                self.pool(session, self.membership.holders(m.cid, self.node_id), now)
            return
        if m.version < 0 or m.epoch < session.epoch:
            self._copy_to_holders(session, now, only={frm})
            return
        if m.version > session.holder_acks.get(frm, -1):
            session.holder_acks[frm] = m.version
            self._advance(session, now)

    def _advance(self, session: _Replicated, now: float) -> None:
        """Raise the session's safe version to what every other live holder has; release the
        frames that waited for it."""
        if not (self.membership.quorum(now) and self.membership.home_quorum(session.client_id)):
            return  # (frames wait: the node closes its persistent clients, fenced)
        others = [n for n in self.membership.holders(session.client_id, self.node_id) if n != self.node_id]
        acked = session.holder_acks
        safe = min((acked.get(n, -1) for n in others), default=session.version)
        if safe >= session.sent_version:
            self.lagging.pop(session.client_id, None)
        if safe > session.safe_version:
            session.confirmed(safe)
            channel = session.channel
            if channel is not None:
                channel.release_acks(self.table.journal.committed, now)
                # (a frame still waiting keeps the settlements hurried: _Replicated.wait)
                session.hurry = channel.waits_for_gate(safe)
            if safe >= session.sent_version:
                # (the batch gathered meanwhile goes)
                self.replication.resume(session.client_id, session.hurry)

    def retry_lagging(self, now: float) -> None:
        """Holders that have not answered our settlements for settle_retry get a copy."""
        retry = self.settings.settle_retry
        for cid, since in list(self.lagging.items()):
            session = self._replica(cid, create=False)
            if session is None or session.channel is None:
                del self.lagging[cid]
                continue
            if now - since < retry:
                continue
            self.lagging[cid] = now
            self.counters["settle_retries"] += 1
            behind = {n for n, v in session.holder_acks.items() if v < session.sent_version}
            others = set(self.membership.holders(cid, self.node_id)) - {self.node_id}
            self._copy_to_holders(session, now, only=(others - set(session.holder_acks)) | behind)

    def _cannot_take(self, frm: str, cid: str, epoch: int) -> None:
        """We cannot take ``frm``'s copy or settlements of ``cid`` at ``epoch``: say why."""
        session = self._replica(cid, create=False)
        if session is None:
            self.out.put(frm, SessAck(cid, epoch, -1))  # (send us a copy)
        elif session.channel is not None:
            self.out.put(frm, SessAck(cid, session.epoch, -2))  # we serve the client
        else:
            self.out.put(frm, SessAck(cid, max(epoch, session.epoch), -1))
