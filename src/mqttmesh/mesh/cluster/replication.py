"""What the copies of a persistent session tell the other holders, and where moved clients went.

Pure. A replicated session (replica.py) reports through its hooks, which are this
``Replication``'s: each settlement (batched until the holders' flush, holders.py), each
change of its client's subscriptions, and a message a copy took late. The hand-over notes
here where a ClientId's client just went (``redirects``), and the Broker forwards what
still reaches the session's copy there (broker.RedirectPort). Built before the Broker and
the Cluster; it holds neither, only who the holders are (``membership``) and an outbox.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple

from .cluster_values import Forwarded, Settlement
from .cluster_wire import Outbox, SessFwd, SessSubs
from .replica import _Replicated, replica_of

if TYPE_CHECKING:
    from ...message import Message
    from ...ports import UnicastPort
    from ...session import Session
    from .membership import Membership

__all__ = ["Replication", "Redirect"]

LATER, SOON = 1, 2  # (the flush a Replication asked for: ``_ask``)


class Redirect(NamedTuple):
    """A holder's note that a ClientId's client moved to ``node``: forward until ``until``."""

    node: str
    until: float


class Replication:
    """What the Broker and the replicated sessions tell the other holders of a session
    (the Broker's broker.RedirectPort): settlements (batched until ``take_settles``), subscription
    changes, and messages for a client that just moved (``redirects``, written by the
    hand-over, holders.py ``on_fetch``). Built before the Broker and the Cluster; it holds
    neither, only who the holders are (``membership``) and a way to send."""

    def __init__(
        self,
        node_id: str,
        membership: Membership,
        outbox: Outbox,
        wake: Callable[[], None] = lambda: None,
        wake_later: Callable[[], None] | None = None,
        net: UnicastPort | None = None,
    ):
        self.node_id = node_id
        self.membership = membership
        self.out = outbox  # what it says to other holders (the Cluster sends it)
        # what it counts (Cluster.counters adds up every part's)
        self.counters = dict.fromkeys(("redirected", "redirect_routed", "late_forwarded", "shared_replicated"), 0)
        self._wake = wake  # asks the I/O layer for a flush this loop iteration (MeshIO.flush_soon)
        # ... or for one within mesh.batch_delay (MeshIO.flush_later)
        self._wake_later = wake if wake_later is None else wake_later
        self._net = net  # (whether the mesh takes a message published here to a node: ``forward``)
        # cid -> where its client went; read by Broker.dispatch for every message
        self.redirects: dict[str, Redirect] = {}
        self._settles: dict[str, list[Settlement]] = {}  # cid -> to tell its holders
        # the flush asked for since the last ``take_settles``: 0 none, LATER, SOON
        self._woken = 0

    def on_settled(
        self, session: _Replicated, key: tuple[str, int], state: str, pid: int, msg: Message | None = None
    ) -> None:
        """A replicated session settled a message (its hook). It goes to the other holders this
        loop iteration if a frame of the client waits for them to have it (``session.hurry``),
        else within mesh.batch_delay (holders.py ``flush``; ``hurry`` if a frame comes to wait)."""
        self._ask(session.hurry)
        fwd = Forwarded.of(msg) if msg is not None else None
        self._settles.setdefault(session.client_id, []).append(Settlement(key[0], key[1], state, pid, fwd))

    def hurry(self, session: _Replicated) -> None:
        """A frame of ``session``'s client waits for a settlement the other holders have not
        confirmed (its hook, ``_Replicated.wait``): what is gathered goes this loop iteration."""
        self._ask(True)

    def _ask(self, soon: bool) -> None:
        if soon:
            if self._woken != SOON:
                self._woken = SOON
                self._wake()  # (MeshIO.flush_soon: one asked for later comes now)
        elif not self._woken:
            self._woken = LATER
            self._wake_later()

    def take_settles(self) -> dict[str, list[Settlement]]:
        """The settlements since the last call, by ClientId (Cluster.flush sends them)."""
        self._woken = 0
        settles = self._settles
        if settles:
            self._settles = {}
        return settles

    def put_back(self, cid: str, items: list[Settlement]) -> None:
        """``cid``'s settlements wait for the holders' answer to its batch out (holders.py
        ``flush``): the next batch, before any made since."""
        later = self._settles.get(cid)
        self._settles[cid] = items + later if later else items

    def resume(self, cid: str, soon: bool) -> None:
        """The holders answered ``cid``'s batch: what gathered meanwhile goes at the next flush
        (this loop iteration if ``soon``: a frame waits for it)."""
        if cid in self._settles:
            self._ask(soon)

    def drop_settles(self, cid: str) -> None:
        """A copy of ``cid``'s session went to every holder: it says what they said."""
        self._settles.pop(cid, None)

    def subs_changed(self, session: Session) -> None:
        replica = replica_of(session)
        if replica is None:
            return
        replica.subs_version += 1
        body = SessSubs(replica.client_id, replica.subs_version, dict(replica.subscriptions))
        for node in self.membership.holders(replica.client_id, self.node_id):
            if node != self.node_id:
                self.out.put(node, body)

    def late(self, session: _Replicated, msg: Message) -> None:
        """A copy here of a session whose client is on another node took a message late
        (``_Replicated.deliver``): that node may never have had it, so it gets it, and takes
        it unless it has it or settled it (then it answers "done", which settles it here)."""
        active = session.active_node
        if active is None or active == self.node_id or active not in self.membership.live:
            return  # nobody else serves it now: the next claim gathers this copy
        self.counters["late_forwarded"] += 1
        self.out.put(active, SessFwd(session.client_id, Forwarded.of(msg)))

    def shared_taken(self, session: _Replicated, msg: Message) -> None:
        """The home of ``session`` took ``msg`` for it through a shared group (shared.py): the
        mesh brought it to this node alone, so the session's other holders get it from here
        (their copies queue it, a claim elsewhere finds it, with its packet id once sent)."""
        cid = session.client_id
        body = SessFwd(cid, Forwarded.of(msg))
        for node in self.membership.holders(cid, self.node_id):
            if node != self.node_id:
                self.counters["shared_replicated"] += 1
                self.out.put(node, body)

    def forward(self, session: Session, msg: Message) -> None:
        """A message reached a local replica whose client just moved elsewhere: it goes there
        too (within mesh.batch_delay: nothing waits for it; the node drops it if it has it),
        unless it was published here and the mesh routes it there already (the node's
        subscription is known here: its custody takes it there, and nothing else would)."""
        target = self.redirects.get(session.client_id)
        if target is None:
            return
        net = self._net
        if net is not None and msg.origin == self.node_id and net.routes_to(target.node, msg.topic):
            self.counters["redirect_routed"] += 1
            return
        self.counters["redirected"] += 1
        self.out.put(target.node, SessFwd(session.client_id, Forwarded.of(msg)), True)

    def expire(self, now: float) -> None:
        for cid, (_, until) in list(self.redirects.items()):
            if now >= until:
                del self.redirects[cid]
