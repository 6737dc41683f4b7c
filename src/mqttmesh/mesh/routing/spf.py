"""Shortest paths over the advertised link map (Dijkstra), with a two-way check.

Pure. A link u-v is used only when both u and v advertise it, so a link that
one side has already seen die is not used for routing.
"""

from __future__ import annotations

import heapq

__all__ = ["shortest_paths"]


def shortest_paths(
    source: str, links: dict[str, dict[str, int]]
) -> tuple[dict[str, str], dict[str, int], dict[str, str]]:
    """(next_hop, distance, parent) for every node reachable from ``source``.

    ``links[u]`` is u's advertised neighbours with their cost. Among equal-cost
    paths the parent with the smallest id wins, so the tree is deterministic.
    """
    dist = {source: 0}
    parent: dict[str, str] = {}
    next_hop: dict[str, str] = {}
    heap = [(0, source)]
    done = set()
    while heap:
        d, u = heapq.heappop(heap)
        if u in done:
            continue
        done.add(u)
        if u != source:
            # every candidate parent of u is closer, so parent[u] is final here
            p = parent[u]
            next_hop[u] = u if p == source else next_hop[p]
        for v, cost in links.get(u, {}).items():
            if v in done:
                continue
            back = links.get(v)
            if back is None or u not in back:  # two-way check
                continue
            nd = d + (cost if cost > 0 else 1)
            old = dist.get(v)
            if old is None or nd < old:
                dist[v] = nd
                parent[v] = u
                heapq.heappush(heap, (nd, v))
            elif nd == old and u < parent[v]:
                parent[v] = u
    return next_hop, dist, parent
