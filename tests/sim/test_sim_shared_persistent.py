"""Persistent (CleanSession=0) members of shared groups (issue 24; docs/simulation.md section 9,
"Persistent members"): the checks on hand-written histories, each failing a history that breaks
its promise, then a seeded run of scenarios/shared-persistent-16.toml and that run with the node
broken on purpose two ways (a QoS 2 message twice to a session, an old home that keeps a
session that moved as a member), each caught."""

from __future__ import annotations

import copy

import pytest

from mqttmesh.session_table import SessionTable
from mqttmesh.shared import SharedSubscriptions
from mqttmesh.sim.checks import InvariantViolation
from mqttmesh.sim.core import Simulator
from mqttmesh.sim.history import History
from mqttmesh.sim.report import summarize
from mqttmesh.sim.scenario import ScenarioError, load_scenario, parse_scenario
from mqttmesh.sim.shared_checks import check_once, check_sessions_once, memberships
from mqttmesh.sim.shared_spread import check_control
from support.sim import SCENARIOS, run

G = "$share/g0/sh/#"
T = "sh/p000/0"


def _connect(h: History, t: float, client: str, node: str, k: int, present: bool) -> str:
    conn = f"{client}#{k}"
    h.connect(t - 0.02, client, "invoke", conn, node)
    h.connect(t, client, "ok", conn, node, present)
    return conn


def _subscribed(h: History, t: float, client: str, node: str, qos: int = 2, k: int = 1) -> str:
    """A persistent member's first connection: CONNECT, SUBSCRIBE, SUBACK."""
    conn = _connect(h, t - 0.01, client, node, k, False)
    h.joined(t, client, conn, node, G, -1, t, "invoke", True)
    h.joined(t + 0.002, client, conn, node, G, qos, -1.0, "ok")
    return conn


def _away(h: History, t: float, client: str, conn: str, node: str, how: str = "drop") -> None:
    h.left(t, client, conn, node, G, how, t + 0.001)
    h.closed(t + 0.001, client, conn, how == "disconnect", "gone")


def _back(h: History, t: float, client: str, node: str, k: int, qos: int = 2) -> str:
    """A reconnection that finds the session present, a member again without a SUBSCRIBE."""
    conn = _connect(h, t, client, node, k, True)
    h.joined(t, client, conn, node, G, qos, t - 0.001, "resume", True)
    return conn


def _publish(h: History, t: float, msg_id: str, qos: int = 2) -> None:
    h.publish(t, "p000", "invoke", msg_id, T, qos)
    h.publish(t + 0.005, "p000", "ok", msg_id, T, qos)


def _once(h: History, faults: list[tuple[float, float]] | None = None, end: float = 60.0):
    return check_once(h, faults or [], settle=2.0, window=2.0, margin=5.0, end=end)


# ---------------------------------------------------------------- memberships


def test_a_persistent_member_has_a_membership_per_connection_resumed_without_a_subscribe() -> None:
    h = History()
    a = _subscribed(h, 1.0, "g0m0", "n1")
    _away(h, 4.0, "g0m0", a, "n1")
    _back(h, 6.0, "g0m0", "n2", 2)
    ms = memberships(h)
    assert [(m.conn, m.node, m.qos, m.begin, m.how, m.persistent) for m in ms] == [
        ("g0m0#1", "n1", 2, 1.0, "drop", True),
        ("g0m0#2", "n2", 2, 5.999, "", True),
    ]
    assert ms[0].end == 4.001


# ---------------------------------------------------------------- shared.qos2_once


def test_a_qos2_message_twice_to_one_persistent_members_session_fails() -> None:
    h = History()
    a = _subscribed(h, 1.0, "g0m0", "n1")
    _publish(h, 5.0, "p000:1")
    h.received(5.02, "g0m0", "p000:1", T, 2, False, a, 7)
    _away(h, 5.03, "g0m0", a, "n1")
    b = _back(h, 6.0, "g0m0", "n2", 2)
    # a new PUBLISH of the message (another packet id): a second message to the session
    h.received(6.01, "g0m0", "p000:1", T, 2, False, b, 3)
    r = check_sessions_once(h)
    assert r.checked == 1 and [(m, c) for m, c, _why in r.twice] == [("p000:1", "g0m0")]
    assert "2 times" in r.twice[0][2] and "packet id 3" in r.twice[0][2]


def test_a_dup_resend_of_the_same_packet_id_after_a_reconnect_is_no_new_message() -> None:
    h = History()
    a = _subscribed(h, 1.0, "g0m0", "n1")
    _publish(h, 5.0, "p000:1")
    h.received(5.02, "g0m0", "p000:1", T, 2, False, a, 7)
    _away(h, 5.03, "g0m0", a, "n1")  # (its PUBREC lost with the connection)
    b = _back(h, 6.0, "g0m0", "n2", 2)
    h.repeated(6.01, "g0m0", "p000:1", T, 2, True, b, 7)  # (id 7 awaits PUBREL: acknowledged again)
    r = check_sessions_once(h)
    assert (r.checked, r.repeats, r.twice) == (1, 1, [])
    # nor a copy at QoS 1 (a member granted QoS 1: at least once), nor one to another member
    h.received(6.02, "g0m0", "p000:1", T, 1, True, b, 8)
    h2 = History()
    c = _subscribed(h2, 1.0, "g0m1", "n3")
    h2.received(5.03, "g0m1", "p000:1", T, 2, False, c, 1)
    assert check_sessions_once(h).twice == [] and check_sessions_once(h2).twice == []


def test_a_session_found_gone_begins_another() -> None:
    # (a CONNACK without the session: cluster.session_present's to judge, not this check)
    h = History()
    a = _subscribed(h, 1.0, "g0m0", "n1")
    h.received(5.02, "g0m0", "p000:1", T, 2, False, a, 7)
    _away(h, 5.03, "g0m0", a, "n1")
    b = _connect(h, 6.0, "g0m0", "n2", 2, False)
    h.received(6.5, "g0m0", "p000:1", T, 2, False, b, 1)
    assert check_sessions_once(h).twice == []


def test_a_clean_members_session_is_its_connection() -> None:
    h = History()
    conn = _connect(h, 0.99, "g0m1", "n1", 1, False)
    h.joined(1.0, "g0m1", conn, "n1", G, -1, 1.0)
    h.joined(1.002, "g0m1", conn, "n1", G, 2, -1.0, "ok")
    h.received(5.02, "g0m1", "p000:1", T, 2, False, conn, 1)
    h.received(5.05, "g0m1", "p000:1", T, 2, False, conn, 2)
    assert len(check_sessions_once(h).twice) == 1


# ---------------------------------------------------------------- shared.once, shared.lost


def test_a_message_queued_for_an_away_persistent_member_and_never_delivered_fails() -> None:
    h = History()
    a = _subscribed(h, 1.0, "g0m0", "n1")  # the group's only member
    _away(h, 4.0, "g0m0", a, "n1", "disconnect")
    _publish(h, 6.0, "p000:1", qos=1)  # (queued for it at n1)
    _back(h, 10.0, "g0m0", "n2", 2)
    r = _once(h)
    assert [(m, s) for m, s, _why in r.lost] == [("p000:1", G)]
    assert "g0m0's session a member throughout (away 4.001-9.999s, queueing on n1)" in r.lost[0][2]


def test_a_message_queued_for_an_away_member_is_judged_only_when_it_could_be() -> None:
    def history(qos: int = 1, granted: int = 2, back: float | None = 10.0) -> History:
        h = History()
        a = _subscribed(h, 1.0, "g0m0", "n1", granted)
        _away(h, 4.0, "g0m0", a, "n1")
        _publish(h, 6.0, "p000:1", qos=qos)
        if back is not None:
            _back(h, back, "g0m0", "n2", 2, granted)
        return h

    assert len(_once(history()).lost) == 1
    # not a QoS 0 one, nor one for a member granted QoS 0 (no queue takes it for an absent client)
    assert _once(history(qos=0)).lost == [] and _once(history(granted=0)).lost == []
    # not if its client is not back by the end, or back too late to get it
    assert _once(history(back=None)).lost == [] and _once(history(), end=11.0).lost == []
    # not with a fault during its absence (its node may have restored it as a member of no group)
    assert _once(history(), [(5.0, 5.5)]).lost == [] and _once(history(), [(5.0, 5.5)]).unreachable == 1
    # nor when it left by UNSUBSCRIBE: its session is no member any more
    h = History()
    a = _subscribed(h, 1.0, "g0m0", "n1")
    h.left(4.0, "g0m0", a, "n1", G, "unsubscribe", 4.001)
    _publish(h, 6.0, "p000:1", qos=1)
    assert _once(h).lost == [] and _once(h).unreachable == 1


def test_a_message_with_an_expiry_interval_may_expire_on_its_way_or_in_a_queue() -> None:
    """Fuzz seed 153: a QoS 1 message with a Message Expiry Interval of 1 s, routed to a node
    cut off unnoticed and retransmitted at the heal 1.2 s later, expired there
    [MQTT-3.3.2-5]: no loss, though a member elsewhere was connected throughout and in reach
    of its origin (the rule that makes a fault no excuse in persistent-member runs)."""

    def expiring(h: History, t: float, expiry: int | None) -> None:
        h.publish(t, "p000", "invoke", "p000:1", T, 1, expiry)
        h.publish(t + 0.005, "p000", "ok", "p000:1", T, 1)

    def cut_off(expiry: int | None) -> History:
        h = History()
        h.connect(0.5, "p000", "ok", "p000#1", "n3", False)  # (the origin)
        _subscribed(h, 1.0, "g0m0", "n0", 1)  # connected throughout, in reach of n3
        b = _subscribed(h, 1.0, "g0m1", "n6", 1)  # on the node cut off
        expiring(h, 15.0, expiry)
        _away(h, 16.0, "g0m1", b, "n6")
        _back(h, 16.4, "g0m1", "n6", 2, 1)
        return h

    def apart(a: str, b: str) -> list[tuple[float, float]]:
        return [(13.4, 16.0)] if "n6" in (a, b) else []

    def judged(h: History, faults: list[tuple[float, float]]):
        return check_once(h, faults, settle=2.0, window=2.0, margin=5.0, lost_margin=5.0, end=60.0, apart=apart)

    fault = [(13.4, 16.0)]
    assert len(judged(cut_off(None), fault).lost) == 1  # (without an expiry: it must arrive)
    r = judged(cut_off(1), fault)
    assert (r.lost, r.may_expire) == ([], 1)
    # queued for an away member whose client is back after its expiry: no loss either
    h = History()
    a = _subscribed(h, 1.0, "g0m0", "n1")
    _away(h, 4.0, "g0m0", a, "n1")
    expiring(h, 6.0, 1)
    _back(h, 10.0, "g0m0", "n2", 2)
    assert (_once(h).lost, _once(h).may_expire) == ([], 1)
    # a member connected throughout with no fault near had it in time: its loss still fails
    h = History()
    _subscribed(h, 1.0, "g0m0", "n1")
    expiring(h, 6.0, 1)
    assert len(_once(h).lost) == 1 and _once(h).may_expire == 0
    # and one whose expiry comes after the end of the run is judged as any other
    h = History()
    a = _subscribed(h, 1.0, "g0m0", "n1")
    _away(h, 4.0, "g0m0", a, "n1")
    expiring(h, 6.0, 600)
    _back(h, 10.0, "g0m0", "n2", 2)
    assert len(_once(h).lost) == 1


def test_a_message_delivered_when_its_member_returns_is_counted_as_reached_while_queueing() -> None:
    h = History()
    a = _subscribed(h, 1.0, "g0m0", "n1")
    _away(h, 4.0, "g0m0", a, "n1")
    _publish(h, 6.0, "p000:1", qos=1)
    b = _back(h, 10.0, "g0m0", "n2", 2)
    h.received(10.01, "g0m0", "p000:1", T, 1, False, b, 1)
    r = _once(h)
    assert (r.checked, r.delivered, r.queued, r.lost, r.twice) == (1, 1, 1, [], [])


def test_a_persistent_member_leaving_with_a_qos2_message_keeps_it() -> None:
    # [MQTT-4.8.2-4]: its session lives on, the message is completed when the client returns;
    # a CleanSession=1 member's would go with its session [MQTT-4.8.2-5] (test_sim_shared_unit)
    h = History()
    a = _subscribed(h, 1.0, "g0m0", "n1")
    _publish(h, 5.0, "p000:1", qos=2)
    _away(h, 5.01, "g0m0", a, "n1")
    _back(h, 8.0, "g0m0", "n2", 2)
    assert len(_once(h).lost) == 1


def test_a_second_copy_to_the_same_persistent_member_is_no_second_member() -> None:
    h = History()
    a = _subscribed(h, 1.0, "g0m0", "n1", 1)
    _publish(h, 5.0, "p000:1", qos=1)
    h.received(5.02, "g0m0", "p000:1", T, 1, False, a, 4)
    _away(h, 5.03, "g0m0", a, "n1")  # (its PUBACK lost with the connection)
    b = _back(h, 9.0, "g0m0", "n2", 2, 1)
    h.received(9.01, "g0m0", "p000:1", T, 1, True, b, 4)  # [MQTT-4.4.0-1]
    r = _once(h)
    assert (r.delivered, r.again, r.twice) == (1, 1, [])
    # a second member's copy, with no leave or fault between, still fails
    h2 = History()
    a = _subscribed(h2, 1.0, "g0m0", "n1", 1)
    c = _subscribed(h2, 2.0, "g0m1", "n3", 1)
    _publish(h2, 5.0, "p000:1", qos=1)
    h2.received(5.02, "g0m0", "p000:1", T, 1, False, a, 4)
    h2.received(5.5, "g0m0", "p000:1", T, 1, True, a, 4)
    h2.received(5.6, "g0m1", "p000:1", T, 1, False, c, 1)
    r = _once(h2)
    assert r.again == 1 and [(m, s) for m, s, _why in r.twice] == [("p000:1", G)]


# ---------------------------------------------------------------- shared.control


def test_a_persistent_members_node_tells_the_mesh_it_queues_and_its_new_home_takes_it() -> None:
    """Away: its node's entry becomes QUEUED (one entry for the other); back on another node:
    the old home removes it, the new one adds it queueing (the claim) and then served (the
    client attached): 2 + 1 + 1 + 2 changes."""
    h = History()
    a = _subscribed(h, 1.0, "g0m0", "n1")
    _away(h, 4.0, "g0m0", a, "n1")
    _back(h, 6.0, "g0m0", "n2", 2)
    deltas = {
        ("n1", 1, 2): ([f"+{G}"], 7),
        ("n1", 1, 3): ([f"-{G}", f"+{G}\0q"], 7),
        ("n1", 1, 4): ([f"-{G}\0q"], 7),
        ("n2", 1, 2): ([f"+{G}\0q"], 7),
        ("n2", 1, 3): ([f"-{G}\0q", f"+{G}"], 7),
    }
    r = check_control(h, deltas, links=4)
    assert (r.changes, r.needed, r.deltas, r.extra) == (3, 7, 7, [])
    # one more change at n1 than that: too many
    deltas[("n1", 1, 5)] = ([f"+{G}\0q"], 7)
    assert [(n, s) for n, s, _what in check_control(h, deltas, links=4).extra] == [("n1", G)]


def test_a_persistent_member_granted_qos0_away_leaves_its_node_with_no_entry() -> None:
    """Finding 34: its session keeps nothing for its absent client, so its node, with no other
    member, tells the mesh it has none (not QUEUED): 1 change away, 1 back on another node."""
    h = History()
    a = _subscribed(h, 1.0, "g0m0", "n1", 0)
    _away(h, 4.0, "g0m0", a, "n1")
    _back(h, 6.0, "g0m0", "n2", 2, 0)
    deltas = {
        ("n1", 1, 2): ([f"+{G}"], 7),
        ("n1", 1, 3): ([f"-{G}"], 7),
        ("n2", 1, 2): ([f"+{G}"], 7),
    }
    r = check_control(h, deltas, links=4)
    assert (r.needed, r.extra) == (3, [])
    # the node that still says QUEUED for it: one change too many
    deltas[("n1", 1, 3)] = ([f"-{G}", f"+{G}\0q"], 7)
    deltas[("n1", 1, 4)] = ([f"-{G}\0q"], 7)
    assert [(n, s) for n, s, _what in check_control(h, deltas, links=4).extra] == [("n1", G)]


def test_an_old_home_cut_off_from_its_members_new_node_keeps_the_session_until_told() -> None:
    """Fuzz seed 19: a persistent member away from n1 (queueing there) comes back on n2 while
    the two have no path between them; n1 keeps its session a member, queueing, until it is
    told, after the path is back (holders.py ``on_merge``), so another member's leave there
    leaves the entry QUEUED, not gone: 2 changes for the 1 the return at once would need, and
    1 more when n1 lets go. The bound places that loss anywhere up to ``detect`` after the
    path returns, and still fails a change beyond it."""
    h = History()
    a = _subscribed(h, 1.0, "g0m0", "n1")
    _away(h, 4.0, "g0m0", a, "n1")  # n1: QUEUED
    c = "g0m1#1"
    h.connect(4.99, "g0m1", "ok", c, "n1", False)  # a CleanSession=1 member on n1
    h.joined(5.0, "g0m1", c, "n1", G, -1, 5.0)
    h.joined(5.002, "g0m1", c, "n1", G, 1, -1.0, "ok")
    _back(h, 6.0, "g0m0", "n2", 2)  # (n1 and n2 apart from 3 s to 10 s)
    h.left(8.0, "g0m1", c, "n1", G, "disconnect", 8.0)  # n1: QUEUED again (g0m0 still there)
    h.closed(8.0, "g0m1", c, True, "gone")
    deltas = {
        ("n1", 1, 2): ([f"+{G}"], 7),
        ("n1", 1, 3): ([f"-{G}", f"+{G}\0q"], 7),
        ("n1", 1, 4): ([f"-{G}\0q", f"+{G}"], 7),
        ("n1", 1, 5): ([f"-{G}", f"+{G}\0q"], 7),
        ("n1", 1, 6): ([f"-{G}\0q"], 7),  # (told at 12 s)
        ("n2", 1, 2): ([f"+{G}\0q"], 7),
        ("n2", 1, 3): ([f"-{G}\0q", f"+{G}"], 7),
    }

    def apart(x: str, y: str) -> list[tuple[float, float]]:
        return [(3.0, 10.0)] if {x, y} == {"n1", "n2"} else []

    # the old home's loss taken at the return: 6 changes needed at n1, 8 seen
    assert [(n, s) for n, s, _what in check_control(h, deltas, links=4).extra] == [("n1", G)]
    r = check_control(h, deltas, links=4, apart=apart, detect=5.0)
    assert (r.deltas, r.needed, r.extra) == (11, 11, [])
    # in reach at the return: told at once, the bound as before
    assert check_control(h, deltas, links=4, apart=lambda x, y: [(3.0, 5.0)], detect=0.5).extra
    # one change more at n1 than the worst-placed loss: too many
    deltas[("n1", 1, 7)] = ([f"+{G}\0q"], 7)
    assert [(n, s) for n, s, _what in check_control(h, deltas, links=4, apart=apart, detect=5.0).extra] == [("n1", G)]


# ---------------------------------------------------------------- the setting


def test_member_persistent_is_a_share() -> None:
    with pytest.raises(ScenarioError, match="clients.member_persistent: a share"):
        parse_scenario({"mode": "cluster", "clients": {"groups": 1, "member_persistent": 1.5}})
    assert parse_scenario({"clients": {"member_persistent": 0.25}}).clients.member_persistent == 0.25


# ---------------------------------------------------------------- runs


def _run(seed: int = 1, fail: bool = True) -> Simulator:
    return run("shared-persistent-16", fail, seed=seed)


@pytest.mark.slow
def test_shared_persistent16_every_invariant_holds() -> None:
    sim = _run()
    assert not sim.violations.items
    s = summarize(sim)["cluster"]["shared"]
    assert s["persistent_members"] >= 10 and all(n > 5 for n in s["member_leaves"].values()), s
    # persistent members came back to their sessions, messages waited for them, QoS 2 was judged
    assert s["once_checked"] > 1000 and s["reached_while_queueing"] > 20 and s["qos2_checked"] > 200
    assert summarize(sim)["cluster"]["sessions_resumed_checked"] > 40


@pytest.mark.slow
def test_a_qos2_message_given_twice_to_a_persistent_session_fails_shared_qos2_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = SharedSubscriptions.deliver

    def twice(self, group, msg, but=None, moved=False):  # type: ignore[no-untyped-def]
        member = real(self, group, msg, but, moved)
        if member is not None and member.stores and msg.qos == 2 and group.members[member] == 2:
            twin = copy.copy(msg)  # (another id, or the session would take it for the same message)
            twin.seq += 1 << 40
            member.deliver(twin, 2)  # (again, under another packet id)
        return member

    monkeypatch.setattr(SharedSubscriptions, "deliver", twice)
    with pytest.raises(InvariantViolation, match=r"\[shared\.qos2_once\] .*reached g\dm\d's session 2 times"):
        _run()


@pytest.mark.slow
def test_an_old_home_that_keeps_a_moved_session_as_a_member_fails_shared_home(monkeypatch: pytest.MonkeyPatch) -> None:
    real = SessionTable.regroup

    def keeps(self, session):  # type: ignore[no-untyped-def]
        if self.member_here(session):  # (it joins at its new home; its old home never lets it go)
            real(self, session)

    monkeypatch.setattr(SessionTable, "regroup", keeps)
    sim = _run(fail=False)
    homes = [v for v in sim.violations.items if v.startswith("[shared.home]")]
    assert homes and all("while its client is on n" in v for v in homes), sim.violations.items[:5]


@pytest.mark.parametrize("seed", [1, 22])
def test_a_message_published_as_its_origin_stalls_is_judged_from_when_the_origin_took_it(seed) -> None:
    """Finding 36's three nodes (n1 stalled 6.0-7.5 s, killed at 7.51 s) on seeds 1 and 22: a
    client of n1 sent a QoS 1 message at 5.999 s; n1 took, acknowledged and routed it at 7.5 s
    and died 10 ms later with the member it chose. ``shared.lost`` judged it from its send,
    when a member on n1 was in reach; from when n1 took it no member was (counted, not lost)."""
    sc = load_scenario(SCENARIOS / "found" / "finding-36-origin-reroute-excludes-own-members.toml")
    sc.seed, sc.checks.fail = seed, False
    sim = Simulator(sc).run()
    assert not sim.violations.items, sim.violations.items[:5]
    assert sim.stall_log["n1"] == [(6.0, 7.5)] and sim.shared_results["once"].unreachable >= 1


def test_a_connack_sent_as_its_node_fenced_the_connection_brings_the_session_there() -> None:
    """A harsher run of shared-persistent-publishers-7 (seed 14, shrunk): a node cut off into a
    minority sent a persistent member's CONNACK (session present) in the instant it found itself
    without a majority and closed the connection; the client read the CONNACK after the end.
    The session was at that node all the same (its home, queueing for its client), and the node
    said so (QUEUED, then none when the client came back elsewhere): 2 changes the model missed
    when it dropped a ``resume`` on a connection already closed."""
    h = History()
    a = _subscribed(h, 1.0, "g0m0", "n1")
    _away(h, 4.0, "g0m0", a, "n1")
    h.connect(5.99, "g0m0", "invoke", "g0m0#2", "n2")
    h.closed(6.0, "g0m0", "g0m0#2", False, "ClientId 'g0m0': this node does not see a majority of the mesh now")
    h.connect(6.001, "g0m0", "ok", "g0m0#2", "n2", True)
    h.joined(6.001, "g0m0", "g0m0#2", "n2", G, 2, 6.0, "resume", True)
    _back(h, 9.0, "g0m0", "n3", 3)
    ms = memberships(h)
    assert [(m.conn, m.node, m.begin, m.end, m.how, m.persistent) for m in ms[1:2]] == [
        ("g0m0#2", "n2", 6.0, 6.0, "close", True)
    ]
    deltas = {
        ("n1", 1, 2): ([f"+{G}"], 7),
        ("n1", 1, 3): ([f"-{G}", f"+{G}\0q"], 7),
        ("n1", 1, 4): ([f"-{G}\0q"], 7),
        ("n2", 1, 2): ([f"+{G}\0q"], 7),
        ("n2", 1, 3): ([f"-{G}\0q"], 7),
        ("n3", 1, 2): ([f"+{G}\0q"], 7),
        ("n3", 1, 3): ([f"-{G}\0q", f"+{G}"], 7),
    }
    assert check_control(h, deltas, links=4).extra == []
    # (a SUBSCRIBE written on a connection its node had closed is still no membership)
    h.joined(6.002, "g0m0", "g0m0#2", "n2", G, -1, 6.003, "invoke", True)
    assert len(memberships(h)) == 3
