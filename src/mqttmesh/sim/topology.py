"""Topologies: which nodes are linked, and each link's one-way latency.

Pure and deterministic from the ``random.Random`` it is given. Every graph is
connected (generators that could leave islands join them with the shortest
extra links), so that a scenario starts with one mesh and its faults decide
when there are two.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

from .checks import components
from .scenario import ScenarioError, Topology

__all__ = ["Graph", "build_topology", "node_names"]


@dataclass
class Graph:
    names: list[str]
    latency: dict[tuple[str, str], float]  # (a, b) with a < b -> one-way seconds
    site_of: dict[str, int] = field(default_factory=dict)

    @property
    def edges(self) -> list[tuple[str, str]]:
        return list(self.latency)


def node_names(n: int) -> list[str]:
    width = len(str(n - 1))
    return [f"n{i:0{width}d}" for i in range(n)]  # zero-padded: string order is numeric order


def _key(a: str, b: str) -> tuple[str, str]:
    return (a, b) if a < b else (b, a)


def _draw(rng: random.Random, bounds: tuple[float, float]) -> float:
    lo, hi = bounds
    return (lo if lo == hi else rng.uniform(lo, hi)) / 1000.0


def _edges_full(names, rng, t):
    return [(a, b) for i, a in enumerate(names) for b in names[i + 1 :]]


def _edges_ring(names, rng, t):
    n = len(names)
    if n == 2:
        return [(names[0], names[1])]
    return [(names[i], names[(i + 1) % n]) for i in range(n)]


def _edges_line(names, rng, t):
    return [(names[i], names[i + 1]) for i in range(len(names) - 1)]


def _edges_star(names, rng, t):
    return [(names[0], b) for b in names[1:]]


def _edges_random(names, rng, t):
    """A random spanning tree (each node joins a random earlier one), then random extra links."""
    n = len(names)
    edges = {_key(names[i], names[rng.randrange(i)]) for i in range(1, n)}
    want = max(n - 1, min(n * (n - 1) // 2, round(n * t.degree / 2)))
    for _ in range(50 * want):  # bounded: gives up on impossible degrees
        if len(edges) >= want:
            break
        a, b = rng.sample(names, 2)
        edges.add(_key(a, b))
    return sorted(edges)


def _edges_ba(names, rng, t):
    """Barabási–Albert: each new node links to m earlier ones, chosen by degree."""
    m = max(1, min(t.m, len(names) - 1))
    seed = names[: m + 1]
    edges = {_key(a, b) for i, a in enumerate(seed) for b in seed[i + 1 :]}
    targets = [x for e in sorted(edges) for x in e]  # a node appears once per link it has
    for new in names[m + 1 :]:
        chosen: set[str] = set()
        for _ in range(100 * m):
            if len(chosen) == m:
                break
            chosen.add(rng.choice(targets))
        for c in sorted(chosen):  # (a set's order would make the graph depend on the hash seed)
            edges.add(_key(new, c))
            targets += [new, c]
    return sorted(edges)


def _positions(names, rng):
    return {n: (rng.random(), rng.random()) for n in names}


def _edges_rgg(names, rng, t, pos=None):
    """Random geometric graph in the unit square: nodes closer than r are linked.

    r is chosen for the target average degree (r^2 pi n = degree); islands are
    joined to the rest by their shortest link.
    """
    pos = pos or _positions(names, rng)
    n = len(names)
    r = math.sqrt(t.degree / (math.pi * max(1, n - 1)))
    cell = {}
    for name, (x, y) in pos.items():
        cell.setdefault((int(x / r), int(y / r)), []).append(name)
    edges = set()
    for (cx, cy), members in cell.items():
        for dx in (-1, 0, 1):
            for dy in (-1, 0, 1):
                for b in cell.get((cx + dx, cy + dy), ()):
                    for a in members:
                        if a < b and math.dist(pos[a], pos[b]) <= r:
                            edges.add((a, b))
    return sorted(_connect(names, edges, lambda a, b: math.dist(pos[a], pos[b]))), pos


def _connect(names, edges, distance):
    """Join the components of ``edges`` by the shortest links between them."""
    comps: dict[str, list[str]] = {}
    for n, root in components(names, edges).items():
        comps.setdefault(root, []).append(n)
    if len(comps) == 1:
        return edges
    groups = sorted(comps.values(), key=len, reverse=True)
    main = list(groups[0])
    for g in groups[1:]:
        sample = main if len(main) <= 400 else main[:: len(main) // 400]
        a, b = min(((x, y) for x in g for y in sample), key=lambda p: distance(*p))
        edges.add(_key(a, b))
        main += g
    return edges


_SIMPLE = {
    "full": _edges_full,
    "ring": _edges_ring,
    "line": _edges_line,
    "star": _edges_star,
    "random": _edges_random,
    "ba": _edges_ba,
}


def build_topology(t: Topology, rng: random.Random) -> Graph:
    names = node_names(t.nodes)
    latency: dict[tuple[str, str], float] = {}
    site_of: dict[str, int] = {}
    if t.kind == "sites":
        per = [len(range(s, t.nodes, t.sites)) for s in range(t.sites)]
        start = 0
        sites = []
        for s, count in enumerate(per):
            members = names[start : start + count]
            start += count
            sites.append(members)
            for m in members:
                site_of[m] = s
            for a, b in _local_edges(t.site_kind, members, rng, t):
                latency[_key(a, b)] = _draw(rng, t.latency_ms)
        # neighbouring sites (a ring of sites) share long_links links between random members
        pairs = [(i, (i + 1) % t.sites) for i in range(t.sites)] if t.sites > 2 else ([(0, 1)] if t.sites == 2 else [])
        for i, j in pairs:
            for _ in range(max(1, t.long_links)):
                a, b = rng.choice(sites[i]), rng.choice(sites[j])
                latency[_key(a, b)] = _draw(rng, t.long_latency_ms)
        return Graph(names, dict(sorted(latency.items())), site_of)
    if t.kind == "rgg":
        edges, pos = _edges_rgg(names, rng, t)
        longest = max(math.dist(pos[a], pos[b]) for a, b in edges) or 1.0
        lo, hi = t.latency_ms
        for a, b in edges:  # latency grows with distance: near nodes are near on the network
            latency[(a, b)] = (lo + (hi - lo) * math.dist(pos[a], pos[b]) / longest) / 1000.0
        return Graph(names, latency, site_of)
    for a, b in _SIMPLE[t.kind](names, rng, t):
        latency[_key(a, b)] = _draw(rng, t.latency_ms)
    return Graph(names, dict(sorted(latency.items())), site_of)


def _local_edges(kind, members, rng, t):
    if len(members) < 2:
        return []
    if kind == "rgg":
        return _edges_rgg(members, rng, t)[0]
    if kind == "sites":
        raise ScenarioError("topology.site_kind cannot be sites")
    return _SIMPLE[kind](members, rng, t)
