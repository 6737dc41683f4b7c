"""Regression scenarios of what the simulator's fuzzer found (scenarios/found/, issue 20):
each broke an invariant of the whole cluster on the code before its fix (docs/simulation.md,
section 8, findings 8 and 13 to 18); every invariant holds on each now, and each still drives
the cluster through the path its fix took."""

from __future__ import annotations

import pytest

from mqttmesh.sim.core import Simulator
from mqttmesh.sim.report import summarize
from mqttmesh.sim.scenario import load_scenario
from support.sim import SCENARIOS

pytestmark = pytest.mark.slow

FOUND = sorted((SCENARIOS / "found").glob("*.toml"))

# what each scenario must still exercise (cluster counters summed over the nodes), by name;
# a tuple: any of them
EXERCISES: dict[str, str | tuple[str, ...]] = {
    "finding-14-fuzz-65": "late_forwarded",  # a holder hands what it took late to the client's node
    "finding-14-fuzz-198": "late_forwarded",
    # a restarted node waits to learn the mesh: it refused such claims; since issue 22 they
    # wait for it (up to claim_timeout) and are served, or refused
    "finding-16-fuzz-281": ("refused_not_synced", "waited_not_synced"),
    "finding-16-fuzz-525": "refused_no_quorum",  # it counts the nodes it had seen before
    "finding-13-fuzz-551-refused-claim-will": "refused_no_quorum",
    "finding-24-fuzz-47-kicked-copy-from-last-read": "kicks",  # the registrar ends a quiet connection
    "finding-21-fuzz-37-fence-from-its-end": "fenced",  # a node without its majority closes its clients
    # the grant after a session that ended with its connection says expired: copies discarded
    "finding-22-fuzz-36-expiry-0-copy-resumed": "expired_copies_discarded",
    # claims refused on the majority side, whose end the heal keeps: the claim discards the copy
    "finding-23-fuzz-8-expiry-lost-at-heal": "expired_copies_discarded",
    # an old home the claim did not fetch is told, and hands what it took to the client's node
    "finding-33-fuzz-19-old-home-keeps-member": "old_homes_told",
    # a connection a later claim replaced (its kick lost across the cut) registers again: kicked
    "finding-37-fuzz-655-replaced-connection-registered-again": "kicked_again",
    # a stale pooled copy names this node, which keeps none, its client's: a home node has it
    "finding-38-harsh-14-stale-copy-makes-home": "stale_merges_ignored",
    # a node fenced off by a newer epoch pools its copy at once: told, it lets the session go
    "finding-41-heal-resets-fenced-home": "old_homes_told",
    # an old home's pooled copy lost with the links a heal reset goes again until answered
    "finding-42-heal-resets-offline-home": "pools_resent",
    # a holder re-pointed by a refused claim's fetch tells the old home when the next one ends
    "finding-42-heal-12-refused-claim-hides-old-home": "old_homes_told",
    # an old home out of reach when the claim ended (it never noticed the cut): told when back
    "finding-42-heal-31-old-home-never-noticed": "old_homes_told",
}
# the same, of the shared groups' counters (sim/members.py ``node_counters``)
SHARED_EXERCISES: dict[str, str | tuple[str, ...]] = {
    # a message handed on by a member that left is not given back to the one that gave it away;
    # since a QoS 2 one the gate held stays with its member (design.md 3.8), kept there
    "finding-40-harsh-35-handed-back-to-its-giver": ("passed_over", "kept_sent"),
}


def test_every_finding_has_its_scenario():
    names = {p.stem for p in FOUND}
    assert {"finding-8-fuzz-2", "finding-15-late-after-heal", "finding-17-fuzz-214"} <= names
    assert set(EXERCISES) <= names and set(SHARED_EXERCISES) <= names


@pytest.mark.parametrize("path", FOUND, ids=[p.stem for p in FOUND])
def test_a_found_scenario_holds_every_invariant(path) -> None:
    sc = load_scenario(path)
    sc.checks.fail = False
    print(f"{path.name}: seed {sc.seed}")
    sim = Simulator(sc).run()
    assert not sim.violations.items, sim.violations.items[:5]
    cl = summarize(sim)["cluster"]
    assert cl["handover_checked"] + cl["wills_checked"] + cl["sessions_resumed_checked"] > 0  # (something judged)
    counters = EXERCISES.get(path.stem)
    if counters is not None:
        names = (counters,) if isinstance(counters, str) else counters
        assert any(cl["cluster_counters"].get(name, 0) > 0 for name in names), names
    shared = SHARED_EXERCISES.get(path.stem)
    if shared is not None:
        names = (shared,) if isinstance(shared, str) else shared
        assert any(cl["shared"]["node_counters"].get(name, 0) > 0 for name in names), names
