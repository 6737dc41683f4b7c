"""Message checks: what every message published in steady state must have done, and the end of a run.

Part of the Simulator (core.py), as a mixin. Everything is compared with truths
the simulator computes itself (checks.py), never with the engine's own view.
"""

from __future__ import annotations

from .checks import components, dijkstra, tree_edges
from .convergence import Episode
from .model import SimulatorPart

__all__ = ["VerifyMixin"]


class VerifyMixin(SimulatorPart):
    phys_cache: dict[str, frozenset[str]] | None  # (annotation only: set by the Simulator)

    # ------------------------------------------------------------------ message checks

    def _default_settle(self) -> float:
        """Long enough for any message to reach any node: twice a latency eccentricity, plus slack."""
        adj: dict[str, dict[str, float]] = {n: {} for n in self.names}
        for (a, b), lat in self.graph.latency.items():
            adj[a][b] = adj[b][a] = lat
        ecc = max(dijkstra(self.names[0], adj)[0].values())
        hops = max(dijkstra(self.names[0], {u: {v: 1 for v in vs} for u, vs in adj.items()})[0].values())
        settle = 0.2 + 4 * ecc + 2 * hops * self.sc.node.flush_delay_ms / 1000.0
        if self.sc.topology.loss:
            settle += 3 * self.sc.topology.retransmit_ms / 1000.0
        return settle

    def _on_msgcheck(self, origin: str, seq: int) -> None:
        rec = self.msgs[(origin, seq)]
        receipts, rec.receipts = rec.receipts, None
        # steady: converged when published and nothing disturbed the mesh since
        if not rec.steady or self.episode is not None or self.last_disturbance > rec.t:
            rec.steady = False
            return
        if not self.nodes[origin].up:
            rec.steady = False
            return
        rec.checked = True
        self.msg_checks += 1
        v = self.violations
        where = f"message {origin}:{seq & 0xFFFFFFFF} on {rec.topic!r} (QoS {rec.qos}, t={rec.t:.4f}s)"
        if rec.engine_dests != set(rec.expected):
            missing = sorted(set(rec.expected) - rec.engine_dests)[:5]
            extra = sorted(rec.engine_dests - set(rec.expected))[:5]
            v.add(
                "interest",
                f"{where}: the origin chose the wrong destinations (missing {missing}, without a subscriber {extra})",
            )
        adj = self._routing_adj()
        seen = set()
        copies0 = 0
        self.checked_by_origin[origin] = self.checked_by_origin.get(origin, 0) + 1
        sends = self.node_sends
        for to, frm, attempt, dests in receipts:
            if attempt == 0:
                copies0 += 1
                sends[frm] = sends.get(frm, 0) + 1
            extra = [d for d in dests if d not in rec.expected]
            if extra:
                v.add("no_interest", f"{where}: {to} received a copy for {extra[:5]}, which have no subscriber for it")
            dist_frm = self._dist(frm)[0]
            dist_to = self._dist(to)[0]
            for d in dests:
                if (to, attempt, d) in seen:
                    v.add("loop", f"{where}: {to} received the copy for {d} twice (attempt {attempt})")
                seen.add((to, attempt, d))
                if adj[frm].get(to, float("inf")) + dist_to.get(d, float("inf")) != dist_frm.get(d):
                    v.add("path", f"{where}: {frm} sent the copy for {d} to {to}, which is not on a shortest path")
        if rec.expected:
            _dist, parent, _hops = self._dist(origin)
            optimum = len(tree_edges(origin, parent, rec.expected))
            self.results_steady.append((copies0, optimum, len(rec.expected), rec.qos))
            lat = self._latency_dist(origin)
            for d in rec.expected:
                if (d, d) not in rec.pred:
                    continue
                total = 0.0
                node = d
                for _ in range(len(self.names)):
                    if node == origin:
                        break
                    prev = rec.pred.get((node, d))
                    if prev is None:
                        break
                    key = (prev, node) if prev < node else (node, prev)
                    total += self.links[key].latency
                    node = prev
                if node == origin and lat.get(d):
                    self.stretch.append(total / lat[d])

    # ------------------------------------------------------------------ the end

    def _physical_component(self, name: str) -> frozenset:
        if self.phys_cache is None:
            comp = components(
                (n for n in self.names if self.nodes[n].up),
                ((link.a, link.b) for link in self.links.values() if self._avail(link)),
            )
            groups: dict[str, set] = {}
            for n, root in comp.items():
                groups.setdefault(root, set()).add(n)
            frozen = {r: frozenset(g) for r, g in groups.items()}
            self.phys_cache = {n: frozen[root] for n, root in comp.items()}
        return self.phys_cache.get(name, frozenset())

    def _finish(self) -> None:
        if self.steady_since is not None:
            self.steady_time += self.now - self.steady_since
        v = self.violations
        ep = self.episode
        if ep is not None and self.now - self.last_disturbance > self.sc.checks.max_convergence:
            v.add(
                "convergence",
                f"still not converged at the end ({self.now:.1f}s), "
                f"{self.now - self.last_disturbance:.1f}s after the last disturbance "
                f"(episode '{ep.cause}' since {ep.start:.2f}s): {self._why_unconverged()}",
            )
        episodes = self.episodes
        for rec in self.msgs.values():
            ep = self._episode_at(rec.t)
            dups = sum(c - 1 for c in rec.delivered.values() if c > 1)
            # a node that restarted (or is down) may legitimately have lost or repeated it
            live = {d for d in rec.expected if self.nodes[d].up and self.nodes[d].restarted_at < rec.t}
            lost = [d for d in live if d not in rec.delivered]
            if ep is not None:
                ep.messages += 1
                ep.lost += len(lost)
                ep.duplicates += dups
            restarted = {n for n in rec.delivered if self.nodes[n].restarted_at > rec.t}
            if dups and not restarted:
                twice = sorted(n for n, c in rec.delivered.items() if c > 1)[:5]
                v.add(
                    "exactly_once",
                    f"message {rec.origin}:{rec.seq & 0xFFFFFFFF} on {rec.topic!r} was "
                    f"delivered more than once at {twice}",
                )
            if not rec.checked:
                continue
            unexpected = sorted(set(rec.delivered) - rec.expected - rec.dormant)[:5]
            if unexpected:
                v.add(
                    "no_interest",
                    f"message {rec.origin}:{rec.seq & 0xFFFFFFFF} on {rec.topic!r} was "
                    f"delivered at {unexpected}, which have no subscriber for it",
                )
            if lost and not (rec.qos == 0 and rec.lost_copies):
                v.add(
                    "exactly_once",
                    f"message {rec.origin}:{rec.seq & 0xFFFFFFFF} on {rec.topic!r} "
                    f"(QoS {rec.qos}, published at {rec.t:.4f}s, converged) never "
                    f"reached {sorted(lost)[:5]}",
                )
        self.final_hop_drops = self.counter_total("hop_limit_drops")
        faults = [e for e in episodes if e.kind not in ("start", "change", "subscribe_all", "subscription")]
        if self.final_hop_drops and not faults:
            v.add(
                "hop_limit", f"{self.final_hop_drops} envelopes reached the hop limit in a mesh that never had a fault"
            )

    def _episode_at(self, t: float) -> Episode | None:
        for ep in reversed(self.episodes):
            if ep.start <= t and (ep.end is None or t <= ep.end + self.settle):
                return ep
            if ep.end is not None and ep.end + self.settle < t:
                return None
        return None

    def counter_total(self, name: str) -> int:
        total = self.dead_counters.get(name, 0)
        for node in self.nodes.values():
            if node.up:
                total += node.engine.counters.get(name, 0)
        return total
