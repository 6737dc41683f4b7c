"""Centralised truths the engines are checked against: Dijkstra on the real graph, and invariants.

Pure. Everything here is computed from the simulated network as it really is
(which links are up, what each end advertises as its cost, the real
latencies), with its own shortest-path code, never with the engine's.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping

__all__ = ["InvariantViolation", "components", "dijkstra", "tree_edges", "Violations"]


class InvariantViolation(AssertionError):
    """An invariant of the mesh does not hold; the message says which, where and when."""


def dijkstra(
    source: str, adj: Mapping[str, Mapping[str, float]]
) -> tuple[dict[str, float], dict[str, str], dict[str, int]]:
    """(distance, parent, hops) from ``source``; ties go to the smaller parent id (deterministic)."""
    dist: dict[str, float] = {source: 0}
    parent: dict[str, str] = {}
    hops = {source: 0}
    heap: list[tuple[float, str]] = [(0, source)]
    done = set()
    while heap:
        d, u = heapq.heappop(heap)
        if u in done:
            continue
        done.add(u)
        for v, c in adj.get(u, {}).items():
            if v in done:
                continue
            nd = d + c
            old = dist.get(v)
            if old is None or nd < old:
                dist[v] = nd
                parent[v] = u
                hops[v] = hops[u] + 1
                heapq.heappush(heap, (nd, v))
            elif nd == old and u < parent[v]:
                parent[v] = u
                hops[v] = hops[u] + 1
    return dist, parent, hops


def components(nodes, edges) -> dict[str, str]:
    """Connected components (union-find): each of ``nodes`` -> its component's root.

    ``edges`` are node pairs; a pair with an end outside ``nodes`` is ignored.
    """
    parent = {n: n for n in nodes}

    def find(x):
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for a, b in edges:
        if a in parent and b in parent:
            ra, rb = find(a), find(b)
            if ra != rb:
                parent[ra] = rb
    return {n: find(n) for n in parent}


def tree_edges(source: str, parent: dict[str, str], targets) -> set[tuple[str, str]]:
    """The links of the union of the tree paths from ``source`` to each target."""
    used = set()
    for t in targets:
        node = t
        for _ in range(len(parent) + 1):  # bounded by the tree's size
            if node == source or node not in parent:
                break
            edge = (parent[node], node)
            if edge in used:
                break  # the rest of the path is already in
            used.add(edge)
            node = parent[node]
    return used


class Violations:
    """Collects violated invariants; the run fails on the first one unless told to go on."""

    def __init__(self, fail: bool, limit: int = 50):
        self.fail = fail
        self.limit = limit
        self.items: list[str] = []
        self.count: dict[str, int] = {}

    def add(self, invariant: str, message: str) -> None:
        self.count[invariant] = self.count.get(invariant, 0) + 1
        text = f"[{invariant}] {message}"
        if len(self.items) < self.limit:
            self.items.append(text)
        if self.fail:
            raise InvariantViolation(text)
