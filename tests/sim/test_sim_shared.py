"""Shared groups in the simulated whole cluster (issue 24; docs/simulation.md, "Shared groups"):
members joining and leaving while nodes fail, every invariant checked, and each shared check
made to fail by a node broken on purpose (without these, a check that never fires would look
exactly like a mesh that never fails)."""

from __future__ import annotations

import pytest

from mqttmesh.mesh.routing.shares import SharesMixin
from mqttmesh.session_table import SessionTable
from mqttmesh.shared import SharedGroup, SharedSubscriptions
from mqttmesh.sim.checks import InvariantViolation
from mqttmesh.sim.core import Simulator
from mqttmesh.sim.report import summarize
from mqttmesh.sim.scenario import load_scenario
from support.sim import SCENARIOS

pytestmark = pytest.mark.slow


def _run(name: str, fail: bool = True, **clients: object) -> Simulator:
    sc = load_scenario(SCENARIOS / f"{name}.toml")
    sc.checks.fail = fail
    for key, value in clients.items():
        setattr(sc.clients, key, value)
    return Simulator(sc).run()


def _shared(sim: Simulator) -> dict:
    return summarize(sim)["cluster"]["shared"]


def test_shared20_every_invariant_holds_while_members_and_nodes_come_and_go() -> None:
    sim = _run("shared-20")
    assert not sim.violations.items
    s = _shared(sim)
    # the run exercised what the checks are about: every way of leaving, a node's death
    assert all(n > 5 for n in s["member_leaves"].values()), s["member_leaves"]
    assert s["once_checked"] > 1000 and s["once_delivered"] > 0.98 * s["once_checked"]
    assert s["membership_changes"] > 100 and s["first_or_last"] > 0
    # a membership change that leaves its node's group and weight as they were costs nothing:
    # no more entries than the first joins, last leaves and powers of two need; each delta
    # crosses each link at most twice
    assert s["share_deltas"] <= s["first_or_last"]
    assert s["share_delta_worst_copies"] <= 2 * s["links"]


def test_shared_spread12_round_robin_stays_within_its_bounds() -> None:
    sim = _run("shared-spread-12")
    assert not sim.violations.items
    s = _shared(sim)
    assert s["spread_counted"] > 500 and s["once_delivered"] == s["once_checked"] > 500
    # 4 publishers on 4 nodes: each node with members within 4 of another; each member within
    # 1 of the other member of its node
    assert s["spread_worst_nodes"] <= 4 and s["spread_worst_members"] <= 1
    # 2 groups x 3 nodes, 2 members each: the first adds the group, the second makes it weigh 2
    assert s["membership_changes"] == 12 and s["share_deltas"] == s["first_or_last"] == 18


def test_a_message_given_to_two_members_fails_shared_once(monkeypatch: pytest.MonkeyPatch) -> None:
    real = SharedSubscriptions.deliver

    def twice(self, group, msg, but=None, moved=False):  # type: ignore[no-untyped-def]
        member = real(self, group, msg, but, moved)
        if member is not None and but is None:
            real(self, group, msg, member, True)  # and to another member of the node
        return member

    monkeypatch.setattr(SharedSubscriptions, "deliver", twice)
    with pytest.raises(InvariantViolation, match=r"\[shared\.once\] .*no receiver left, no fault between"):
        _run("shared-spread-12")


def test_a_group_message_dropped_fails_shared_lost(monkeypatch: pytest.MonkeyPatch) -> None:
    real = SharedSubscriptions.deliver

    def drops(self, group, msg, but=None, moved=False):  # type: ignore[no-untyped-def]
        if msg.qos and msg.topic.startswith("sh/p001/"):
            return None
        return real(self, group, msg, but, moved)

    monkeypatch.setattr(SharedSubscriptions, "deliver", drops)
    with pytest.raises(InvariantViolation, match=r"\[shared\.lost\] p001:.* a member on .* throughout"):
        _run("shared-spread-12")


def test_a_node_that_always_picks_one_member_fails_shared_spread(monkeypatch: pytest.MonkeyPatch) -> None:
    real = SharedGroup.choose

    def first(self, msg, receives=None, but=None):  # type: ignore[no-untyped-def]
        chosen = real(self, msg, receives, but)
        return next(iter(self.members)) if chosen is not None and but is None else chosen

    monkeypatch.setattr(SharedGroup, "choose", first)
    with pytest.raises(InvariantViolation, match=r"\[shared\.spread\] .*the members on n\d+ got"):
        _run("shared-spread-12")


def test_an_origin_that_always_picks_one_node_fails_shared_spread(monkeypatch: pytest.MonkeyPatch) -> None:
    real = SharesMixin._pick

    def nearest(self, share, msg, exclude=None):  # type: ignore[no-untyped-def]
        chosen = real(self, share, msg, exclude)
        nodes = sorted(self._share_nodes.get(share, ()))
        return nodes[0] if chosen is not None and exclude is None else chosen

    monkeypatch.setattr(SharesMixin, "_pick", nearest)
    with pytest.raises(InvariantViolation, match=r"\[shared\.spread\] .*the nodes got .* origins"):
        _run("shared-spread-12")


def test_a_node_that_advertises_every_join_fails_shared_control(monkeypatch: pytest.MonkeyPatch) -> None:
    # every join is told to the mesh, and a group the node has already is advertised afresh
    # (withdrawn and added again): a flood per member instead of per node
    real = SessionTable.advertise

    def always(self, group):  # type: ignore[no-untyped-def]
        was = group.advertised
        if was is not None and group.members and self.mesh is not None:
            engine = self.mesh.engine
            engine.local_filter_removed(was)
            engine._originate_interest_delta()
            group.advertised = None
        real(self, group)

    monkeypatch.setattr(SessionTable, "advertise", always)
    with pytest.raises(
        InvariantViolation, match=r"\[shared\.control\] n\d+ \$share/g\d/sh/#: \d+ interest changes for"
    ):
        _run("shared-20")


# finding 31 (fuzz seed 66, docs/simulation.md section 9): a message chosen for a node whose
# last member of the group left while the choice was on its way was dropped there; fixed (the
# node sends it on, mesh/routing/shares.py ``_served_elsewhere``): tests/sim/test_sim_found.py
# runs its scenario, and this one says what it exercises
FINDING_31 = "found/finding-31-fuzz-66-group-gone-at-chosen-node"


def test_finding31_a_group_message_reaches_a_member_when_its_chosen_node_lost_its_last() -> None:
    sim = _run(FINDING_31, fail=False)
    assert not sim.violations.items, sim.violations.items[:5]
    s = _shared(sim)
    assert s["once_checked"] >= 50 and s["membership_changes"] > 20
    assert sum(node.engine.counters["shared_rerouted"] for node in sim.nodes.values()) >= 1


# finding 34 (docs/simulation.md section 9): a node whose only member of a group, persistent and
# granted QoS 0, went away told the mesh QUEUED, and a QoS 1 message chosen for it went to
# nobody there; now such a node advertises the group as none and sends what comes for it on
FINDING_34 = "found/finding-34-fuzz-185-qos0-members-away-queued"


def test_finding34_a_message_chosen_for_a_node_whose_members_cannot_keep_it_goes_on() -> None:
    sim = _run(FINDING_34, fail=False)
    assert not sim.violations.items, sim.violations.items[:5]
    s = _shared(sim)
    assert s["persistent_members"] >= 1 and s["once_checked"] >= 20
    assert sum(node.engine.counters["shared_rerouted"] for node in sim.nodes.values()) >= 1
