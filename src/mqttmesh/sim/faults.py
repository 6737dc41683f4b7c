"""The fault schedule: link down/up, crash/restart, partition/heal, latency, subscription changes.

Part of the Simulator (core.py), as a mixin. Random targets come from the
scenario's fault stream, so a schedule is the same at every run.
"""

from __future__ import annotations

from .model import Link, Node, SimulatorPart
from .scenario import Fault, ScenarioError

__all__ = ["FaultsMixin"]


class FaultsMixin(SimulatorPart):
    phys_cache: dict[str, frozenset[str]] | None  # (annotation only: set by the Simulator)

    # ------------------------------------------------------------------ faults

    def _on_fault(self, i: int) -> None:
        fault = self.sc.faults[i]
        label = fault.label or self._fault_label(fault)
        p = fault.params
        kind = fault.kind
        if kind == "link_down":
            link = self._pick_link(p.get("link", "random"), want_up=True, label=label)
            label = fault.label or f"link_down {link.a}-{link.b}"
            self._disturb(label, kind)
            link.admin = False
            self._break(link, "timeout")
        elif kind == "link_up":
            link = self._pick_link(p.get("link", "random"), want_up=False, label=label)
            label = fault.label or f"link_up {link.a}-{link.b}"
            self._disturb(label, kind)
            link.admin = True
            self._link_check(link)
        elif kind == "crash":
            node = self._pick_node(p.get("node", "random"), want_up=True, label=label)
            label = fault.label or f"crash {node.name} ({p.get('how', 'kill')})"
            self._disturb(label, kind)
            self._crash(node, p.get("how", "kill"))
        elif kind == "restart":
            node = self._pick_node(p.get("node", "last"), want_up=False, label=label)
            label = fault.label or f"restart {node.name}"
            self._disturb(label, kind)
            node.restarted_at = self.now
            resub = p.get("resubscribe", self.sc.workload.resubscribe)
            if not isinstance(resub, bool):
                raise ScenarioError(f"{label}: resubscribe must be true or false")
            self._start_node(node, resubscribe=resub)
        elif kind == "partition":
            groups = self._partition_groups(p, label)
            self._disturb(label, kind)
            self.partition = {n: gi for gi, g in enumerate(groups) for n in g}
            for link in self.links.values():
                if link.alive and not self._avail(link):
                    self._break(link, "timeout")
            self.phys_cache = None
        elif kind == "heal":
            self._disturb(label, kind)
            self.partition = {}
            for link in self.links.values():
                self._link_check(link)
            self.phys_cache = None
        elif kind == "latency":
            link = self._pick_link(p.get("link", "random"), want_up=None, label=label)
            label = fault.label or f"latency {link.a}-{link.b} {p['latency_ms']}ms"
            self._disturb(label, kind)
            link.latency = float(p["latency_ms"]) / 1000.0
        elif kind == "stall":
            node = self._pick_node(p.get("node", "random"), want_up=True, label=label)
            label = fault.label or f"stall {node.name} {p['seconds']}s"
            self._disturb(label, kind)
            self._stall(node, float(p["seconds"]))  # (stall.py)
        elif kind in ("subscribe", "unsubscribe"):
            node = self._pick_node(p.get("node", "random"), want_up=True, label=label)
            f = p.get("filter", "random")
            if kind == "subscribe":
                if f == "random":
                    for _ in range(100):
                        f = self.space.topic_filter(self.rng_fault)
                        if f not in node.filters:
                            break
                self._subscribe(node, f, fault.label or f"subscribe {node.name} {f}")
            else:
                if f == "random":
                    if not node.filters:
                        raise ScenarioError(f"{label}: {node.name} has no subscription to remove")
                    f = self.rng_fault.choice(node.filters)
                self._unsubscribe(node, f, fault.label or f"unsubscribe {node.name} {f}")
        self.phys_cache = None if kind in ("link_down", "link_up", "crash", "restart") else self.phys_cache

    @staticmethod
    def _fault_label(f: Fault) -> str:
        return f"{f.kind} " + " ".join(f"{k}={v}" for k, v in sorted(f.params.items()))

    def _pick_link(self, spec, want_up, label) -> Link:
        if spec != "random":
            a, b = sorted(spec)
            link = self.links.get((a, b))
            if link is None:
                raise ScenarioError(f"{label}: there is no link {a}-{b}")
            return link
        if want_up is False:
            down = [lk for lk in self.links.values() if not lk.admin]
            if not down:
                raise ScenarioError(f"{label}: no link is down")
            return down[-1] if len(down) == 1 else self.rng_fault.choice(down)
        live = [lk for lk in self.links.values() if lk.alive and lk.side[lk.a] and lk.side[lk.b]]
        if not live:
            raise ScenarioError(f"{label}: no live link")
        if want_up is None:
            return self.rng_fault.choice(live)
        # prefer a link whose loss leaves the mesh connected: a reroute, not a partition
        for _ in range(50):
            link = self.rng_fault.choice(live)
            if self._connected_without(link=link):
                return link
        return self.rng_fault.choice(live)

    def _pick_node(self, spec, want_up, label) -> Node:
        if spec == "last":
            down = sorted((n for n in self.nodes.values() if not n.up), key=lambda n: n.down_since)
            if not down:
                raise ScenarioError(f"{label}: no node is down")
            return down[-1]
        if spec != "random":
            node = self.nodes.get(spec)
            if node is None:
                raise ScenarioError(f"{label}: there is no node {spec!r}")
            if node.up != want_up:
                raise ScenarioError(f"{label}: {spec} is {'down' if want_up else 'up'} at {self.now}s")
            return node
        cands = [n for n in self.nodes.values() if n.up == want_up]
        if not cands:
            raise ScenarioError(f"{label}: no candidate node")
        for _ in range(50):
            node = self.rng_fault.choice(cands)
            if not want_up or self._connected_without(node=node):
                return node
        return self.rng_fault.choice(cands)

    def _connected_without(self, link: Link | None = None, node: Node | None = None) -> bool:
        alive = [n for n in self.names if self.nodes[n].up and (node is None or n != node.name)]
        if not alive:
            return False
        adj: dict[str, list[str]] = {n: [] for n in alive}
        for lk in self.links.values():
            if lk is link or not (lk.alive and lk.side[lk.a] and lk.side[lk.b]):
                continue
            if lk.a in adj and lk.b in adj:
                adj[lk.a].append(lk.b)
                adj[lk.b].append(lk.a)
        seen = {alive[0]}
        stack = [alive[0]]
        while stack:
            for v in adj[stack.pop()]:
                if v not in seen:
                    seen.add(v)
                    stack.append(v)
        return len(seen) == len(alive)

    def _partition_groups(self, p: dict, label: str) -> list[list[str]]:
        if "groups" in p:
            groups = p["groups"]
            if not isinstance(groups, list) or not all(isinstance(g, list) for g in groups):
                raise ScenarioError(f"{label}: groups must be a list of lists of node names")
            listed = [n for g in groups for n in g]
            unknown = [n for n in listed if n not in self.nodes]
            if unknown:
                raise ScenarioError(f"{label}: unknown nodes {unknown}")
            rest = [n for n in self.names if n not in set(listed)]
            return [list(g) for g in groups] + ([rest] if rest else [])
        if "isolate" in p:
            iso = p["isolate"]
            if not isinstance(iso, list) or any(n not in self.nodes for n in iso):
                raise ScenarioError(f"{label}: isolate must be a list of node names")
            return [list(iso), [n for n in self.names if n not in set(iso)]]
        if "isolate_site" in p:
            site = p["isolate_site"]
            members = [n for n, s in self.graph.site_of.items() if s == site]
            if not members:
                raise ScenarioError(
                    f"{label}: no site {site!r} (the topology has sites 0..{self.sc.topology.sites - 1})"
                )
            return [members, [n for n in self.names if n not in set(members)]]
        # half, or grow = N: a connected group grown breadth-first from a random node (a region)
        size = len(self.names) // 2 if "half" in p else p["grow"]
        if not isinstance(size, int) or isinstance(size, bool) or not 0 < size < len(self.names):
            raise ScenarioError(f"{label}: grow must be a number of nodes between 1 and {len(self.names) - 1}")
        start = self.rng_fault.choice(self.names)
        group = {start}
        frontier = [start]
        while frontier and len(group) < size:
            u = frontier.pop(0)
            for lk in self.nodes[u].links:
                v = lk.peer(u)
                if v not in group and len(group) < size:
                    group.add(v)
                    frontier.append(v)
        return [sorted(group), [n for n in self.names if n not in group]]
