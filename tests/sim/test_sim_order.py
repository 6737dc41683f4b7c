"""Ordered delivery in the whole cluster (mesh/routing/order.py, issue 20): fuzzer seeds whose
subscribers got a publisher's messages out of order on one connection before the engine
ordered each origin's messages; in order now, and out of order again when the engine's
ordering is taken away (so the check can fail)."""

from __future__ import annotations

import pytest

import mqttmesh.sim.fuzz as fuzz
from mqttmesh.mesh.routing.order import OrderMixin
from mqttmesh.sim.fuzz_run import fuzz_seed

pytestmark = pytest.mark.slow

# seed: reorders on one connection without the engine's ordering (each origin's order kept
# in merges of copies and in what holders forward, as since issue 20); 3 and 175 on the code
# of 4e7d7da, which ordered neither. (Seed 37, 42 of them before the cluster's parts put
# their messages in an outbox, runs another timeline since, without reorders: 35 took its
# place; the simulator is deterministic, so these numbers are exact. Since settle-batch, issue
# 26, 9 and 35 run other timelines: 9 without reorders, 35 with 2 (20 before), and 2, with 6,
# took 9's place; 22 and 37 reorder with the engine's ordering too, on the code before as well.)
SEEDS = {2: 6, 35: 2}


@pytest.fixture(autouse=True)
def _as_drawn_before_shared_groups(monkeypatch: pytest.MonkeyPatch) -> None:
    # (seed 35 draws shared groups since issue 24, which take most of its publications: the
    # seeds as they were, their shared part left out; sim/fuzz.py draws it last, from its own stream;
    # and both draw persistent publishers since, drawn last of all, from their own stream too)
    monkeypatch.setattr(fuzz, "_draw_shared", lambda rng, sc: None)
    monkeypatch.setattr(fuzz, "_draw_persistent_publishers", lambda rng, c: None)


@pytest.mark.parametrize("seed", sorted(SEEDS))
def test_one_connection_gets_each_publishers_messages_in_order(seed: int) -> None:
    """[MQTT-4.6.0-5, MQTT-4.6.0-6]: per publisher, topic and QoS, in publication order."""
    r = fuzz_seed(seed)
    print(f"fuzz seed {seed}: {r.nodes} nodes, {r.verdict.counts}")
    assert not r.verdict.violated
    assert r.verdict.counts["order_checked"] > 500
    assert r.verdict.counts["reorders_same_connection"] == 0


@pytest.mark.parametrize("seed", sorted(SEEDS))
def test_without_ordering_the_same_seeds_reorder(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    def unordered(self, msg, prev, attempt, now, out):  # deliver at once, as before issue 20
        self._deliver_one(msg, attempt, out)

    monkeypatch.setattr(OrderMixin, "_deliver_ordered", unordered)
    r = fuzz_seed(seed)
    assert r.verdict.counts["reorders_same_connection"] >= SEEDS[seed]
