"""Slow nodes: a node whose event loop stalls (``kind = "stall"``), what overload looks like to its peers.

Part of the Simulator (core.py), as a mixin. For ``seconds`` the stalled node runs
nothing: every event its loop would have handled (what arrives from its peers and its
clients, its ticks, its flushes, its journal commits, its dials, its PINGRESPs) waits, in
order, and is handled when the stall ends: what was read first (I/O), then the timers
that fell due, as asyncio's ``_run_once`` orders them; its ticks resume from then on.
Nothing the node does is simulated differently: its code simply runs late, and sees the
gap between two ticks (mesh/cluster/membership.py). Its peers hear nothing from it: a peer that
heard nothing on a link for 3 keepalives closes the link (docs/simulation.md, section 1),
which the stalled node reads when it runs again. Its clients' connections stay open
(the simulated MQTT client does not time out a silent server).
"""

from __future__ import annotations

import random
from typing import Any

from .model import (
    ARRIVE,
    CHURN,
    COMMIT,
    DETECT,
    DIAL,
    DRAIN,
    FLUSH,
    LINK_READY,
    PING,
    PUBLISH,
    SILENT,
    STALL_END,
    TICK,
    TO_NODE,
    Node,
    SimulatorPart,
)

__all__ = ["StallMixin"]

# events whose first argument is the node that handles them
_OWN = frozenset((FLUSH, TICK, DRAIN, COMMIT, DETECT, DIAL, PUBLISH, CHURN))
# what the loop reads from sockets; handled before the timers when a stall ends
_IO = frozenset((ARRIVE, DRAIN, TO_NODE, DETECT, PING, LINK_READY, PUBLISH, CHURN))


class StallMixin(SimulatorPart):
    def _init_stalls(self) -> None:
        self.stalled: set[str] = set()  # nodes whose loop is stalled now
        self.rng_stall = random.Random(f"{self.sc.seed}/stall")
        self.stall_counts = {"stalls": 0, "held": 0, "silenced": 0}
        self.stall_log: dict[str, list[tuple[float, float]]] = {}  # node -> its stalls (from, until)

    def _stall(self, node: Node, seconds: float) -> None:
        """The node's loop runs nothing for ``seconds`` (a longer stall wins over a shorter one)."""
        until = self.now + seconds
        if not node.up or until <= node.stalled_until:
            return
        node.stalled_until = until
        self.stalled.add(node.name)
        self.stall_log.setdefault(node.name, []).append((self.now, until))
        self.stall_counts["stalls"] += 1
        self._at(until, STALL_END, node.name, node.gen)
        ka = self.sc.node.keepalive
        for link in node.links:
            if link.alive:
                # the peer heard from the node up to a keepalive ago; it notices 3 keepalives
                # of silence at one of its ticks (as network.py's silent deaths)
                t = self.now + 3 * ka - self.rng_stall.uniform(0, ka) + self.rng_stall.uniform(0, self.sc.node.tick)
                if t < until:
                    self._at(t, SILENT, node.name, link.a, link.b, link.conn)

    def _unstall(self, node: Node) -> None:
        """The node crashed: what it held is gone with it."""
        self.stalled.discard(node.name)
        node.stalled_until = 0.0
        node.held = []

    def _hold(self, ev: tuple[Any, ...]) -> bool:
        """If a stalled node would handle ``ev``, keep it for when the stall ends."""
        kind = ev[2]
        if kind in _OWN:
            owners: tuple[str, ...] = (ev[3],)
        elif kind == ARRIVE:
            owners = (ev[4],)
        elif kind in (PING, LINK_READY):  # the acceptor answers, then the dialler reads it
            owners = (ev[4], ev[3])
        elif kind == TO_NODE:
            conn = self.sconns.get(ev[3])
            owners = (conn.node,) if conn is not None else ()
        else:
            return False
        for name in owners:
            if name in self.stalled:
                self.nodes[name].held.append(ev)
                self.stall_counts["held"] += 1
                return True
        return False

    def _on_stall_end(self, name: str, gen: int) -> None:
        node = self.nodes[name]
        if node.gen != gen or name not in self.stalled or self.now < node.stalled_until:
            return  # it crashed meanwhile, or a longer stall followed
        self.stalled.discard(name)
        held, node.held = node.held, []
        self._disturb(f"stall of {name} ends", "stall")
        if self.cluster_mode:
            self.last_fault_at = self.now  # the single-registration check's quiet time starts now
        for ev in [ev for ev in held if ev[2] in _IO] + [ev for ev in held if ev[2] not in _IO]:
            self._at(self.now, *ev[2:])

    def _on_silent(self, name: str, a: str, b: str, conn: int) -> None:
        """A peer of the stalled ``name`` heard nothing on their link for 3 keepalives: it closes it."""
        link = self.links[(a, b)]
        if name not in self.stalled or link.conn != conn or not link.alive:
            return
        self.stall_counts["silenced"] += 1
        self._disturb(f"{link.peer(name)} closes its silent link to stalled {name}", "stall")
        self._break(link, "reset")
