"""Engine behaviour the simulator found, reduced to a few engines on an instant network.

Each test states what the design promises; each failed with the engine as the simulator
found it (marked xfail, strict) and passes since the fix.
docs/simulation.md ("Findings") tells how each was found and what the fix is.
"""

from __future__ import annotations

import json
from collections import deque

import pytest

from mqttmesh.mesh.routing.engine import MeshEngine
from support.sim import run

pytestmark = pytest.mark.slow


class Wire:
    """Engines joined by links that deliver every send at once, in order."""

    def __init__(self, names):
        self.engines = {n: MeshEngine(n, 1, [f"{n}:1883"]) for n in names}
        self.links: set[frozenset] = set()
        self.queue: deque = deque()
        for e in self.engines.values():
            e.start(0.0)

    def connect(self, a, b):
        self.links.add(frozenset((a, b)))
        self.engines[a].link_up(b, 0.0)
        self.engines[b].link_up(a, 0.0)

    def settle(self):
        for _ in range(10_000):
            for name, e in self.engines.items():
                for peer, kind, payload, _qos in e.flush(0.0):
                    if frozenset((name, peer)) in self.links:
                        self.queue.append((name, peer, kind, payload))
            if not self.queue:
                return
            while self.queue:
                frm, to, kind, payload = self.queue.popleft()
                self.engines[to].receive(frm, kind, payload, 0.0)
        raise AssertionError("the network does not settle")


def test_interest_that_arrived_before_its_router_crosses_a_new_link():
    # Seen at 120 nodes (scenarios/finding-interest-before-router.toml): the interest and the router
    # advertisement of node x reach node a by different paths, the interest first, and a's link to
    # b comes up in between. Here p stands for a's other neighbour, which relays x's advertisements.
    w = Wire(["a", "b", "p"])
    w.connect("a", "p")
    w.settle()
    interest = {"t": "interest", "node": "x", "inc": 1, "ver": 2, "full": ["sensors/#"]}
    w.engines["a"].receive("p", "lsa", json.dumps([interest]).encode(), 0.0)
    w.settle()
    w.connect("a", "b")  # the database exchange happens now
    w.settle()
    router = {"t": "router", "node": "x", "inc": 1, "seq": 1, "addr": [], "links": {"p": 1000}}
    w.engines["a"].receive("p", "lsa", json.dumps([router]).encode(), 0.0)  # x's router, late
    w.settle()
    assert w.engines["b"].routers["x"].seq == 1  # b learnt x's router from a ...
    assert w.engines["b"].interests.get("x") is not None, "... but never x's filters"


def test_120_nodes_starting_with_their_subscriptions_converge():
    # finding 1 at the size it was found: 120 nodes start together with their persistent
    # sessions' filters; before the fix some node never learnt some other node's filters and
    # the run failed its convergence check
    sim = run("finding-interest-before-router")  # raises InvariantViolation when an invariant breaks
    assert sim.route_checks >= 120
