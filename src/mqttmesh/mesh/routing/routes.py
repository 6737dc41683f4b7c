"""Routes: shortest paths over the advertised links, and where the messages of a topic go.

Pure. A part of ``MeshEngine`` (engine.py, a mixin over engine_base.EngineState).
Shortest paths are recomputed lazily, when the links changed since the last run;
the next hops per topic are cached until the interest or the paths change. It
leaves the clock to its caller: ``spf_timer``, when given, only measures.
"""

from __future__ import annotations

from .engine_base import EngineState
from .records import HopGroup, Route
from .spf import shortest_paths

__all__ = ["HopGroup", "Route", "RoutesMixin"]

ROUTE_CACHE_LIMIT = 65536  # topics; the cache starts again when full


class RoutesMixin(EngineState):
    def _ensure_spf(self) -> None:
        if self._spf_dirty:
            timer = self.spf_timer
            started = timer() if timer is not None else 0.0
            before = self.next_hop
            self.next_hop, self.distance, self.parent = shortest_paths(self.node_id, self._link_map())
            if self.custody and self.next_hop.keys() - before.keys():
                # nodes in reach again (a heal, a restart): what waits in custody for them goes
                # now, not at a retransmission time doubled while they were out of reach
                for c in self.custody.values():
                    c.due = min(c.due, 0.0)
            self._spf_dirty = False
            self._route_cache.clear()
            self.counters["spf_runs"] += 1
            if timer is not None:
                self.spf_seconds += timer() - started

    def _link_map(self) -> dict[str, dict[str, int]]:
        """Every node's advertised links, ours as they are now."""
        links = {node: r.links for node, r in self.routers.items()}
        links[self.node_id] = dict(self._links)
        return links

    def _compute_route(self, topic: str) -> Route:
        """Where the messages of ``topic`` go, cached until the interest or the paths change:
        the per-message work is then one dictionary lookup and one envelope per next hop."""
        me = self.node_id
        dests = sorted(n for n in self.remote.match(topic) if n != me)
        by_hop: dict[str, list[str]] = {}
        unreachable = 0
        for d in dests:
            hop = self.next_hop.get(d)
            if hop is None:
                unreachable += 1
            else:
                by_hop.setdefault(hop, []).append(d)
        groups = [(hop, ds, "\0".join(ds)) for hop, ds in by_hop.items()]
        route = (groups, dests, unreachable)
        cache = self._route_cache
        if len(cache) >= ROUTE_CACHE_LIMIT:
            cache.clear()
        cache[topic] = route
        return route

    # ------------------------------------------------------------------ introspection

    def routes_to(self, node: str, topic: str) -> bool:
        """Does a message of ``topic`` published here go to ``node`` (a plain subscription of
        it, in reach), as ``route_local`` would route it now?"""
        if self._spf_dirty:
            self._ensure_spf()
        route = self._route_cache.get(topic)
        if route is None:
            route = self._compute_route(topic)
        return node in route[1] and node in self.next_hop

    def route_to(self, node: str) -> str | None:
        """The neighbour a message for ``node`` goes to next (None: unreachable)."""
        self._ensure_spf()
        return self.next_hop.get(node)

    def reachable(self) -> list[str]:
        self._ensure_spf()
        return sorted(self.next_hop)

    def nodes_wanting(self, topic: str) -> list[str]:
        return sorted(n for n in self.remote.match(topic) if n != self.node_id)

    def known_addresses(self) -> dict[str, list[str]]:
        return {n: r.addresses for n, r in self.routers.items() if n != self.node_id}
