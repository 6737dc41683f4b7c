"""Pooling the copies of an offline session nobody coordinates (``sess.merge``), until answered.

Pure. ``Pools`` is mixed into ``holders.Holders`` (which keeps the state: the sessions, the
membership, ``pools``). When no node serves a persistent session's client (it left, or its
node is gone), its holders pool what each has (holders.py ``rebalance``, ``on_merge``); a node
that still takes itself for the session's home after a claim elsewhere pools its copy so that
a holder that knows the claim answers with its copy and it lets go (confirm.py ``on_ack``).
A unicast between nodes is lost with the link it was on, so a pooled copy goes again until
each live holder has answered it (simulator, finding 42).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .cluster_wire import SessAck, SessMerge
from .replica import replica_of
from .snapshots import snapshot

if TYPE_CHECKING:
    from ...session_table import SessionTable
    from .cluster_values import ClusterSettings
    from .cluster_wire import Outbox
    from .membership import Membership
    from .replica import _Replicated

__all__ = ["Pool", "Pools"]


class Pool:
    """A copy of an offline session pooled with its holders, not yet answered by all."""

    __slots__ = ("active", "waiting", "due", "tries")

    def __init__(self, active: str | None, waiting: set[str], due: float, tries: int):
        self.active = active  # the node the copy named its client's when pooled
        self.waiting = waiting  # the holders that have not answered
        self.due = due  # when it goes to them again
        self.tries = tries


class Pools:
    """The pooling steps of the holders (a mixin: ``Holders`` keeps the state)."""

    if TYPE_CHECKING:  # what they use of the Holders
        node_id: str
        membership: Membership
        table: SessionTable
        settings: ClusterSettings
        counters: dict[str, int]
        out: Outbox
        pools: dict[str, Pool]

    def pool(self, replica: _Replicated, holders: list[str], now: float) -> None:
        """Pool our copy of an offline session nobody coordinates with its other ``holders``
        (``sess.merge``), again until each answers (``on_merge``: ``sess.ack`` at an epoch
        not newer than ours; one that knows a newer claim answers with its copy instead,
        which makes this node let go). A unicast is lost with the link it was on: the fault
        harness's heals reset every link across the cut at once, and a home whose copy
        reached none of the holders that knew a claim elsewhere stayed the session's home,
        a member of its groups queueing for a client on another node (simulator, finding 42)."""
        others = {n for n in holders if n != self.node_id}
        if not others:
            self.pools.pop(replica.client_id, None)
            return
        snap = snapshot(replica, now)
        for node in sorted(others, key=holders.index):
            self.out.put(node, SessMerge(snap))
        self.pools[replica.client_id] = Pool(replica.active_node, others, now + self.settings.settle_retry, 1)

    def _answer_pool(self, frm: str, cid: str, epoch: int, version: int) -> None:
        if frm != self.node_id:
            self.out.put(frm, SessAck(cid, epoch, version))

    def pool_answered(self, frm: str, m: SessAck) -> None:
        """A holder's ``sess.ack`` for a copy we pooled: it has it, unless it knows a newer
        claim (then its copy comes, and we keep sending ours until it has come)."""
        replica = replica_of(self.table.sessions.get(m.cid))
        pool = self.pools.get(m.cid)
        if pool is None or replica is None or m.version < 0 or m.epoch > replica.epoch:
            return
        pool.waiting.discard(frm)
        if not pool.waiting:
            del self.pools[m.cid]

    def retry_pools(self, now: float) -> None:
        """Pooled copies some live holder has not answered go to it again, at settle_retry
        doubling up to 16 times that (a node of an older version never answers)."""
        live = self.membership.live
        for cid, pool in list(self.pools.items()):
            replica = replica_of(self.table.sessions.get(cid))
            if replica is None or replica.channel is not None or replica.active_node != pool.active:
                del self.pools[cid]  # (served again, let go of, or handed to a newer claim)
                continue
            waiting = {n for n in pool.waiting if n in live}
            if not waiting:
                del self.pools[cid]
                continue
            if now < pool.due:
                continue
            self.counters["pools_resent"] += 1
            snap = snapshot(replica, now)
            for node in sorted(waiting):
                self.out.put(node, SessMerge(snap))
            pool.waiting = waiting
            pool.tries += 1
            pool.due = now + self.settings.settle_retry * min(2 ** (pool.tries - 1), 16)
