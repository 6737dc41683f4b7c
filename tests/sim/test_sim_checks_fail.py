"""The simulator's invariant checks catch a broken engine: each test breaks one thing and expects the run to fail.

Without these, a checker that never fires would look exactly like a mesh that never fails.
"""

from __future__ import annotations

import pytest

import mqttmesh.mesh.routing.engine as engine_module
import mqttmesh.mesh.routing.routes as routes_module
from mqttmesh.mesh.routing.dedup import DeliveryFilter
from mqttmesh.mesh.routing.interest import InterestIndex
from mqttmesh.sim.checks import InvariantViolation
from mqttmesh.sim.core import Simulator
from mqttmesh.sim.scenario import load_scenario
from support.sim import SCENARIOS, run


def test_a_wrong_next_hop_fails_the_route_check(monkeypatch):
    real = routes_module.shortest_paths

    def lopsided(source, links):
        next_hop, dist, parent = real(source, links)
        if source == "n03" and "n06" in next_hop:
            next_hop = dict(next_hop, n06="n02")  # the long way round the ring: not a shortest path
        return next_hop, dist, parent

    monkeypatch.setattr(routes_module, "shortest_paths", lopsided)
    with pytest.raises(InvariantViolation, match=r"\[routes\] .*n03 sends to n06 via n02"):
        run("ring-12")


def test_sending_to_nodes_without_subscribers_fails(monkeypatch):
    real = InterestIndex.match

    def everyone(self, topic):  # a bridge that copies everything everywhere
        result = dict(real(self, topic))
        for holders in self._holders.values():
            for node in [holders] if isinstance(holders, str) else holders:
                result[node] = 0
        return result

    monkeypatch.setattr(InterestIndex, "match", everyone)
    with pytest.raises(InvariantViolation, match=r"\[(interest|no_interest)\]"):
        run("ring-12")


def test_a_duplicate_delivery_fails(monkeypatch):
    # without the delivery filter, an end-to-end retransmission (its acknowledgement was lost on
    # a lossy link) reaches the subscriber a second time
    monkeypatch.setattr(DeliveryFilter, "seen", lambda self, origin, seq, qos=1: False)
    with pytest.raises(InvariantViolation, match=r"\[exactly_once\] .*more than once"):
        run("lossy-30")


def test_a_mesh_that_never_converges_fails(monkeypatch):
    # relays install an interest advertisement but never pass it on: nodes two hops away from
    # a subscriber never learn its filters, so the mesh never agrees with reality
    real = engine_module.MeshEngine._install_interest

    def no_flood(self, peer, lsa):
        flood, self._flood = self._flood, lambda lsa, exclude: None
        try:
            return real(self, peer, lsa)
        finally:
            self._flood = flood

    monkeypatch.setattr(engine_module.MeshEngine, "_install_interest", no_flood)
    sc = load_scenario(SCENARIOS / "ring-12.toml")
    sc.checks.max_convergence = 3.0
    with pytest.raises(InvariantViolation, match=r"\[convergence\] still not converged"):
        Simulator(sc).run()
