"""Convergence: episodes from a disturbance until every engine agrees with reality; route checks.

Part of the Simulator (core.py), as a mixin: it reads the engines' link-state
databases and compares them with the simulated network, and compares every
engine's next hops with Dijkstra on the real graph (checks.py).
"""

from __future__ import annotations

import random

from ..mesh.routing.engine import MeshEngine
from .checks import components, dijkstra
from .model import CHECK, TALLY, Link, SimulatorPart

__all__ = ["Episode", "ConvergenceMixin"]


class Episode:
    """From a disturbance (fault, subscription change) to the moment every engine agrees with reality."""

    def __init__(self, ident: int, cause: str, start: float, kind: str):
        self.id = ident
        self.cause = cause
        self.kind = kind
        self.causes = [cause]
        self.start = start
        self.detected: float | None = None  # first engine event caused by it
        self.last_detected: float | None = None  # last one (e.g. the second end of a dead link)
        self.end: float | None = None
        self.rounds = 0
        self.control_msgs = 0
        self.control_bytes = 0
        self.attributed_msgs = 0  # advertisement copies caused by this episode
        self.attributed_bytes = 0
        self.changed: dict[tuple[str, str], tuple] = {}  # ("router"|"interest", node) -> first version
        self.new_links: set[tuple[str, str]] = set()
        self.needles: list[bytes] = []
        self.spf_runs0 = self.spf_seconds0 = 0.0
        self.spf_runs = 0
        self.spf_seconds = 0.0
        self.lost = 0
        self.duplicates = 0
        self.messages = 0

    def as_dict(self, nodes: int) -> dict:
        d = {
            k: getattr(self, k)
            for k in (
                "id",
                "cause",
                "kind",
                "causes",
                "start",
                "detected",
                "end",
                "rounds",
                "control_msgs",
                "control_bytes",
                "attributed_msgs",
                "attributed_bytes",
                "spf_runs",
                "spf_seconds",
                "lost",
                "duplicates",
                "messages",
            )
        }
        d["converged_after"] = None if self.end is None else self.end - self.start
        d["after_detection"] = None if self.end is None or self.detected is None else self.end - self.detected
        # pure propagation: from the last engine event the fault caused (the last end to notice)
        d["after_last_detection"] = (
            None if self.end is None or self.last_detected is None else self.end - self.last_detected
        )
        d["control_bytes_per_node"] = self.control_bytes / nodes
        d["attributed_bytes_per_node"] = self.attributed_bytes / nodes
        d["spf_ms_per_run"] = 1000 * self.spf_seconds / self.spf_runs if self.spf_runs else None
        d["changed"] = sorted(f"{k[0]}:{k[1]}" for k in self.changed)
        return d


class ConvergenceMixin(SimulatorPart):
    # (annotations only: the Simulator sets these in its __init__)
    episode: Episode | None
    steady_since: float | None
    epoch_cost: dict[str, tuple[dict[str, float], dict[str, str], dict[str, int]]]
    epoch_latency: dict[str, dict[str, float]]
    adj_cost: dict[str, dict[str, int]] | None
    last_unsettled: Link | None

    # ------------------------------------------------------------------ convergence

    def _disturb(self, cause: str, kind: str) -> None:
        self.last_disturbance = self.now
        ep = self.episode
        if ep is not None:
            if kind != "change" and cause not in ep.causes:
                ep.causes.append(cause)
                if ep.kind == "change":  # a fault explains what looked like a spontaneous change
                    ep.kind, ep.cause = kind, cause
            return
        if self.steady_since is not None:
            self.steady_time += self.now - self.steady_since
            self.steady_since = None
        ep = Episode(len(self.episodes) + 1, cause, self.now, kind)
        runs, secs = self._spf_totals()
        ep.spf_runs0, ep.spf_seconds0 = runs, secs
        self.episode = ep
        self.episodes.append(ep)
        self._at(self.now + self.sc.checks.resolution, CHECK)

    def _spf_totals(self) -> tuple[int, float]:
        runs, secs = self.dead_spf
        for node in self.nodes.values():
            if node.up:
                runs += node.engine.counters["spf_runs"]
                secs += node.engine.spf_seconds
        return runs, secs

    def _on_check(self) -> None:
        ep = self.episode
        if ep is None:
            return
        if not self._converged():
            self._at(self.now + self.sc.checks.resolution, CHECK)
            return
        ep.end = self.now
        # the engines run SPF lazily (at their next tick or message): count it two ticks on
        self._at(self.now + 2 * self.sc.node.tick, TALLY, ep.id)
        self.episode = None
        self.steady_since = self.now
        if not self.subscribed:
            self._clients_arrive()
        self.epoch_cost = {}
        self.epoch_latency = {}
        self.adj_cost = None
        self._check_routes(ep)
        if self.progress is not None and ep.kind != "change":
            self.progress(
                f"  t={self.now:8.3f}s  converged after {ep.cause}: {ep.end - ep.start:.3f}s, {ep.rounds} rounds"
            )

    def _on_tally(self, ident: int) -> None:
        ep = self.episodes[ident - 1]
        runs, secs = self._spf_totals()
        ep.spf_runs, ep.spf_seconds = runs - ep.spf_runs0, secs - ep.spf_seconds0

    def _recompute_components(self) -> None:
        comp = components(
            (n for n in self.names if self.nodes[n].up),
            ((link.a, link.b) for link in self.links.values() if link.side[link.a] and link.side[link.b]),
        )
        members: dict[str, list[str]] = {}
        for n, r in comp.items():
            members.setdefault(r, []).append(n)
        self.comp, self.members = comp, members
        self.stale = {m: set(members[comp[m]]) - {m} for m in comp if len(members[comp[m]]) > 1}
        self.comp_dirty = False

    def _converged(self) -> bool:
        if self.dirty_interest or self.unstarted or self.stalled:
            return False  # (a stalled node, sim/stall.py, has not yet done what it was told)
        last = self.last_unsettled
        if last is not None and not self._settled(last):
            return False
        for link in self.links.values():
            if not self._settled(link):
                self.last_unsettled = link
                return False
        self.last_unsettled = None
        if self.comp_dirty:
            self._recompute_components()
        nodes = self.nodes
        for m in list(self.stale):
            waiting = self.stale[m]
            for n in list(waiting):
                if not self._up_to_date(nodes[n].engine, m):
                    return False
                waiting.discard(n)
            del self.stale[m]
        return True

    def _up_to_date(self, e: MeshEngine, m: str) -> bool:
        """Does engine ``e`` route as if it knew ``m``'s current links and filters?"""
        r = e.routers.get(m)
        if r is None or (r.inc, r.seq) < self.ckey_r[m]:
            return False
        i = e.interests.get(m)
        if i is not None and (i.inc, i.ver) == self.ckey_i[m]:
            return True
        # another version (or none) of the same filters routes the same way
        mine = self.nodes[m].engine.interests[m].filters
        theirs = i.filters if i is not None else ()
        return len(theirs) == len(mine) and set(theirs) == set(mine)

    def _why_unconverged(self) -> str:
        """The first disagreement between an engine and reality, in words."""
        if self.stalled:
            return f"{', '.join(sorted(self.stalled))} stalled"
        if self.dirty_interest or self.unstarted:
            return "local subscription changes not advertised yet"
        for link in self.links.values():
            if not self._settled(link):
                return (
                    f"link {link.a}-{link.b} is {'available' if self._avail(link) else 'unavailable'} "
                    f"but its ends have it {'up' if link.side[link.a] else 'down'}/"
                    f"{'up' if link.side[link.b] else 'down'}"
                )
        if self.comp_dirty:
            self._recompute_components()
        for m, waiting in self.stale.items():
            for n in sorted(waiting):
                e = self.nodes[n].engine
                r, i = e.routers.get(m), e.interests.get(m)
                have_r = (r.inc, r.seq) if r else None
                have_i = (i.inc, i.ver) if i else None
                if not self._up_to_date(e, m):
                    return (
                        f"{n} holds {m}'s router advertisement {have_r} and interest {have_i}; "
                        f"{m} advertises router {self.ckey_r[m]} and interest {self.ckey_i[m]}"
                    )
        return "unknown"

    def _settled(self, link: Link) -> bool:
        if self._avail(link):
            return link.alive and self._established(link)
        return not link.side[link.a] and not link.side[link.b]

    def _established(self, link: Link) -> bool:
        """Both ends have the link up. (A whole node's side is open from the dialler's
        LINK_READY, before the hello exchange that brings the link up in its engine: until the
        answer comes back, its PeerLinks has not made it the current link.)"""
        if not (link.side[link.a] and link.side[link.b]):
            return False
        if not self.cluster_mode:
            return True
        for x in (link.a, link.b):
            node, peer = self.nodes[x], link.peer(x)
            sim_link = node.plinks.get(peer)
            if sim_link is None or sim_link.conn != link.conn or node.core.links.links.get(peer) is not sim_link:
                return False
        return True

    def _routing_adj(self) -> dict[str, dict[str, int]]:
        """The real graph for routing: established links, each direction at the cost its origin advertises."""
        if self.adj_cost is None:
            adj: dict[str, dict[str, int]] = {n: {} for n in self.names if self.nodes[n].up}
            for link in self.links.values():
                if link.side[link.a] and link.side[link.b]:
                    for u, v in ((link.a, link.b), (link.b, link.a)):
                        cost = self.nodes[u].engine.routers[u].links.get(v)
                        if cost is None:
                            self.violations.add(
                                "routes", f"t={self.now:.4f}s {u} has the link to {v} up but does not advertise it"
                            )
                            continue
                        adj[u][v] = max(cost, 1)
            self.adj_cost = adj
        return self.adj_cost

    def _dist(self, source: str):
        hit = self.epoch_cost.get(source)
        if hit is None:
            hit = self.epoch_cost[source] = dijkstra(source, self._routing_adj())
        return hit

    def _latency_dist(self, source: str):
        hit = self.epoch_latency.get(source)
        if hit is None:
            adj: dict[str, dict[str, float]] = {n: {} for n in self.names if self.nodes[n].up}
            for link in self.links.values():
                if link.side[link.a] and link.side[link.b]:
                    adj[link.a][link.b] = link.latency
                    adj[link.b][link.a] = link.latency
            hit = self.epoch_latency[source] = dijkstra(source, adj)[0]
        return hit

    def _check_routes(self, ep: Episode) -> None:
        """Every engine's next hops against Dijkstra on the real graph (routes of a sample at scale)."""
        up = [n for n in self.names if self.nodes[n].up]
        sample = up
        if self.sc.checks.routes and self.sc.checks.routes < len(up):
            sample = sorted(random.Random(f"{self.sc.seed}/routes/{ep.id}").sample(up, self.sc.checks.routes))
        adj = self._routing_adj()
        hop_limit = self.settings.hop_limit
        v = self.violations
        for n in sample:
            self.route_checks += 1
            e = self.nodes[n].engine
            e.route_to(n)  # lets the engine run its (lazy) SPF now
            dist, _parent, hops = self._dist(n)
            reach = set(self.members[self.comp[n]]) - {n}
            got = set(e.next_hop)
            if got != reach:
                missing, extra = sorted(reach - got)[:5], sorted(got - reach)[:5]
                v.add(
                    "routes",
                    f"t={self.now:.4f}s after '{ep.cause}': {n} routes to the wrong set of "
                    f"nodes (missing {missing}, unreachable but routed {extra})",
                )
                continue
            for d in reach:
                if e.distance.get(d) != dist[d]:
                    v.add(
                        "routes",
                        f"t={self.now:.4f}s after '{ep.cause}': {n} thinks {d} is at "
                        f"{e.distance.get(d)}, the shortest path costs {dist[d]}",
                    )
                    break
                h = e.next_hop[d]
                if h not in adj[n] or adj[n][h] + self._dist(h)[0].get(d, float("inf")) != dist[d]:
                    v.add(
                        "routes",
                        f"t={self.now:.4f}s after '{ep.cause}': {n} sends to {d} via {h}, "
                        f"which is not on a shortest path",
                    )
                    break
                if hops[d] > hop_limit:
                    v.add(
                        "hop_limit",
                        f"the shortest path {n} -> {d} has {hops[d]} hops, more than "
                        f"hop_limit ({hop_limit}): raise [engine] hop_limit for this topology",
                    )
                    break
