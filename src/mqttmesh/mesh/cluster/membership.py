"""Who is alive in the cluster, and who holds what: rendezvous hashing over the live nodes.

Pure. The routing engine tells the cluster which nodes it can reach and their incarnations
(``update``); everything keyed by a ClientId or a topic is then placed by hrw.owners over
that list, so every node that sees the same live set places it the same way.
"""

from __future__ import annotations

from .hrw import owners, rank

__all__ = ["Membership"]

RANKS_KEPT = 65_536  # rankings remembered per node set (then forgotten at once, and made again)


class _Rankings:
    """Key -> its ranking (hrw) over one list of nodes, the first ``count`` of it (None: all),
    valid while that list is the same object: Membership replaces its lists of nodes when they
    change, never changes one in place."""

    __slots__ = ("of", "ranks")

    def __init__(self, nodes: list[str]):
        self.of = nodes
        self.ranks: dict[str, list[str]] = {}

    def get(self, key: str, nodes: list[str], count: int | None) -> list[str]:
        ranks = self.ranks
        if self.of is not nodes:
            ranks.clear()
            self.of = nodes
        ranked = ranks.get(key)
        if ranked is None:
            if len(ranks) >= RANKS_KEPT:
                ranks.clear()
            ranked = ranks[key] = rank(key, nodes) if count is None else owners(key, nodes, count)
        return ranked


class Membership:
    def __init__(
        self,
        node_id: str,
        incarnation: int,
        replication: int,
        will_delay: float,
        stall: float = 1.0,
        grace: float = 3.0,
        expect_peers: bool = True,
    ):
        self.node_id = node_id
        self.replication = replication  # holders of a session, owners of a retained topic
        self.will_delay = will_delay  # a node unreachable this long has lost its clients
        self.live: list[str] = [node_id]  # sorted; always holds this node
        self.incs: dict[str, int] = {node_id: incarnation}
        self.known: list[str] = [node_id]  # every node ever seen, sorted (incs, and remembered)
        self.remembered: set[str] = set()  # seen before this node's restart (its store)
        self.suspect: dict[str, float] = {}  # unreachable (or restarted) node -> since
        # -- quorum (issue 15): may this node serve persistent sessions now?
        self.stall = stall  # a gap this long between ticks: the process was not running
        self.grace = grace  # the links' dead time: after a start or a stall, the live set settles
        self.last_tick: float | None = None
        self.alone_until = 0.0  # just started: no peer known yet, and maybe they come
        self.distrust_until = 0.0  # resumed after a pause: what we know is stale
        # the routing engine holds a neighbour's whole database: the subscriptions of the
        # mesh are known here, so what a client publishes reaches them (``routing_ready``)
        self.synced = False
        self.expect_peers = expect_peers  # it has peers to dial (else a first node, alone)
        # key -> its ranking over ``live`` (registrars, keepers) and over ``known`` (homes),
        # each valid while that list is the same object: both are replaced, never changed in
        # place, when the nodes change (``update``, ``remember``), and asked for several times
        # per message (a session's holders at each flush, a ClientId's registrar)
        self._ranks_live = _Rankings(self.live)
        self._homes = _Rankings(self.known)

    def ticked(self, now: float) -> None:
        """The cluster's timer ran (at least every stall / 4 while the process runs)."""
        last = self.last_tick
        if last is None:
            self.alone_until = now + self.grace
        elif now - last > self.stall:
            # resumed after a pause (SIGSTOP, a swapped-out process): links that look alive
            # may be dead, and other nodes may have taken our clients over meanwhile
            self.distrust_until = now + self.grace
        self.last_tick = now

    def quorum(self, now: float) -> bool:
        """This node sees a majority of the nodes it has ever seen, and its view is fresh:
        it may serve persistent sessions now (a minority side of a partition may not)."""
        last = self.last_tick
        known = len(self.known)
        if last is None:
            # just started, no tick yet: what it knows is fresh, but it must know someone
            return known > 1 and 2 * len(self.live) > known
        if now - last > self.stall or now < self.distrust_until:
            return False  # (a CONNECT read before the first tick after a pause, or soon after)
        if known == 1 and now < self.alone_until:
            return False  # just started: the peers, if any, have not been heard of yet
        return 2 * len(self.live) > known

    def forming(self, now: float) -> bool:
        """This node's view of the mesh is still forming: it has just started (its links come
        up within ``grace``, its routing within twice that) or resumed after a pause. A claim
        the node may not take yet then waits a moment rather than being refused (claimant.py);
        a node that is past this and still cut off refuses at once."""
        last = self.last_tick
        if last is None:
            return True
        return now < self.alone_until + self.grace or now < self.distrust_until or now - last > self.stall

    def routing_ready(self, now: float) -> bool:
        """May this node take clients' messages? Only once it knows where they go: it holds a
        neighbour's database, or it has been alone for ``grace`` (a mesh of one). A node just
        started knows no subscription of another node yet: a QoS 1/2 message it acknowledged
        then would reach none of them (issue 20, found by the simulator's fuzzer)."""
        if self.synced or not (self.expect_peers or self.remembered):
            return True  # (a node with no peer to dial and none seen before starts a mesh)
        if self.last_tick is None:
            return False
        # alone past the grace (a mesh of one), or, whatever holds the exchange up, twice it
        return now >= self.alone_until + (0 if len(self.live) == 1 else self.grace)

    def update(self, live: list[str], incs: dict[str, int], now: float, synced: bool = True) -> set[str]:
        """The reachable nodes, or the incarnations of the nodes known (reachable or not),
        changed; the live set before. ``synced``: the routing engine holds a neighbour's
        whole database."""
        self.synced = self.synced or synced
        old_live = set(self.live)
        restarted = {n for n, inc in incs.items() if n in self.incs and self.incs[n] != inc}
        self.live = sorted(set(live) | {self.node_id})
        if incs.keys() - self.incs.keys():
            self.known = sorted(self.incs.keys() | incs.keys() | self.remembered)
        self.incs.update(incs)
        for node in self.live:
            self.suspect.pop(node, None)
        for node in old_live - set(self.live):
            self.suspect.setdefault(node, now)
        for node in restarted:
            self.suspect[node] = now - self.will_delay  # its old connections are gone
        return old_live

    def remember(self, nodes: list[str]) -> None:
        """Nodes seen before a restart (the store): counted in the quorum and the homes as
        nodes out of reach until they are heard of, so that a node restarted where it
        reaches none of them does not take itself for a mesh of one (fuzzer seed 525: it
        served a persistent session as new while the session's copies were elsewhere)."""
        self.remembered.update(nodes)
        self.known = sorted(set(self.known) | self.remembered)

    def restarts_settled(self) -> None:
        """The registrations of restarted nodes were checked (their old connections' wills
        are out): a node that is reachable is suspect no more. Without this, a restarted
        node stayed suspect until the next membership change."""
        live = self.live
        for node in [n for n in self.suspect if n in live]:
            del self.suspect[node]

    def dead(self, now: float) -> set[str]:
        """Nodes unreachable for ``will_delay`` or more (or restarted): their clients are gone."""
        return {n for n, since in self.suspect.items() if now - since >= self.will_delay}

    def _ranked_live(self, key: str) -> list[str]:
        """``key``'s ranking over the live nodes (hrw.rank), remembered while they stay."""
        return self._ranks_live.get(key, self.live, None)

    def registrars(self, cid: str) -> list[str]:
        """The registrar of a ClientId, then its backup."""
        return self._ranked_live(cid)[:2]

    def keepers(self, cid: str, node: str) -> list[str]:
        """Where the registration of a connection on ``node`` is kept: the registrar and its
        backup, and the next node of the ranking when one of them is ``node`` itself, which
        goes down with the connection: so two nodes besides it keep the client's will, and
        its will outlives the loss of its node and one other (fuzzer seeds 176, 693)."""
        keep = self._ranked_live(cid)[:3]
        return keep if node in keep[:2] else keep[:2]

    def home(self, cid: str) -> list[str]:
        """A persistent session's home: the top ``replication`` of its ranking over every
        node ever seen, so the same list on both sides of a partition (issue 15). A change of
        the session is confirmed by every live node of it before the client sees the change,
        and a client is served only where a majority of it is live: so any node that serves
        the session next can reach a node that has its latest state."""
        return self._homes.get(cid, self.known, self.replication)

    def home_quorum(self, cid: str) -> bool:
        """A majority of the session's home is live (this node counted if it is one)."""
        live = self.live
        return 2 * sum(1 for n in self.home(cid) if n in live) > min(self.replication, len(self.known))

    def holders(self, cid: str, last: str | None = None) -> list[str]:
        """The nodes that keep a copy of a persistent session now: the live nodes of its
        home, and ``last`` (the node its client was last on) if alive."""
        live = self.live
        h = [n for n in self.home(cid) if n in live]
        if last and last in live and last not in h:
            h.append(last)
        return h

    def owners(self, topic: str) -> list[str]:
        """The nodes that keep a retained topic."""
        return owners(topic, self.live, self.replication)
