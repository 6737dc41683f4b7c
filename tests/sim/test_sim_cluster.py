"""The simulator driving the whole cluster (mode = "cluster"): persistent clients moving between
whole nodes, the cluster invariants checked on every run, and what today's code breaks.

Runs of the scenarios in scenarios/move-*.toml; each prints its seed. A finding (an invariant
today's cluster breaks under partitions or crashes) is a test marked xfail(strict=True) naming
the invariant and the seed, as docs/simulation.md ("The whole cluster") describes; a fix turns
it into a regression guard.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from mqttmesh.broker import Broker
from mqttmesh.sim.checks import InvariantViolation
from mqttmesh.sim.core import Simulator
from mqttmesh.sim.scenario import load_scenario, parse_scenario
from support.sim import SCENARIOS

pytestmark = pytest.mark.slow

STRICT = ("cluster.single_registration", "cluster.handover_loss", "cluster.wills_once", "cluster.error")


def _run(name: str, seed: int | None = None, checks_fail: bool = True, **changes) -> Simulator:
    sc = load_scenario(SCENARIOS / f"{name}.toml")
    sc.checks.fail = checks_fail
    if seed is not None:
        sc.seed = seed
    for key, value in changes.items():
        setattr(sc, key, value)
    print(f"{name}: seed {sc.seed}")
    return Simulator(sc).run()


def _cluster(sim: Simulator) -> dict:
    from mqttmesh.sim.report import summarize

    return summarize(sim)["cluster"]


@pytest.fixture(scope="module")
def move10() -> Simulator:
    return _run("move-10")  # checks.fail: the first violated invariant raises


def test_move10_every_invariant_holds_while_clients_move(move10: Simulator) -> None:
    cl = _cluster(move10)
    assert not move10.violations.items
    # the run exercised what the invariants are about
    moves = cl["moves"]
    assert all(moves[k] > 10 for k in ("clean", "abrupt", "takeover")), moves
    assert moves["away"] == 0, moves  # (its move_how has three shares: no away move, an MQTT 5 fuzz kind)
    assert cl["handover_checked"] > 1000 and cl["handover_lost"] == 0 and cl["qos2_twice"] == 0
    assert cl["acknowledged"] == cl["published"] > 500
    assert cl["wills_published"] == cl["moves"]["abrupt"] + cl["moves"]["takeover"]  # one per unclean end
    assert cl["wills_missing"] == cl["wills_twice"] == cl["wills_unwanted"] == 0
    assert cl["registration_checks"] > 10
    assert cl["sessions_not_present"] == 0  # every reconnection found its session [MQTT-3.2.2-2]
    counters = cl["cluster_counters"]
    assert counters["sessions_gathered"] > 50 and counters["kicks"] > 10


@pytest.mark.parametrize("seed", [2])
def test_move10_other_seeds(seed: int) -> None:
    sim = _run("move-10", seed=seed)
    assert not sim.violations.items


def test_move_flap30_holds_while_a_link_flaps() -> None:
    sim = _run("move-flap-30")
    assert not sim.violations.items
    assert _cluster(sim)["handover_checked"] > 1000


def test_journal_commits_hold_acknowledgements(move10: Simulator) -> None:
    # the node's Journal is on an in-memory disk whose commits are events: PUBACKs waited
    # for them, and the disks hold what the sessions hold
    disks = [move10.nodes[n].store for n in move10.names]
    assert sum(d.batches for d in disks) > 100
    assert sum(len(d.sessions) for d in disks) >= 30  # every persistent session is on some disk


def test_crash_drops_what_was_not_committed() -> None:
    sc = parse_scenario(
        {
            "mode": "cluster",
            "duration": 12.0,
            "drain": 4.0,
            "seed": 11,
            "topology": {"kind": "full", "nodes": 4},
            "clients": {"persistent": 4, "publishers": 2, "move_every": [0.0, 0.0], "commit_ms": 50.0},
            "checks": {"fail": False},
            "faults": [{"at": 6.0, "kind": "crash", "node": "n1"}, {"at": 7.0, "kind": "restart"}],
        }
    )
    sim = Simulator(sc)
    crashes: list[tuple[int, int, int, int]] = []
    original = Simulator._cluster_crash

    def crash(self: Simulator, node, how: str) -> None:
        pending = len(node.core.journal)  # ops recorded, not yet on the disk
        batches, messages = node.store.batches, dict(node.store.messages)
        original(self, node, how)
        # the crash wrote nothing: the disk is what the last commit left
        crashes.append((pending, batches, node.store.batches, int(node.store.messages == messages)))

    sim._cluster_crash = crash.__get__(sim)  # type: ignore[method-assign]
    sim.run()
    assert sim.nodes["n1"].inc == 2 and sim.nodes["n1"].up
    assert len(crashes) == 1
    pending, before, after, disk_unchanged = crashes[0]
    assert pending > 0  # (commit_ms 50: the kill came with changes not yet committed) ...
    assert before > 0 and after == before and disk_unchanged  # ... and they were lost with it
    # ... and yet nothing acknowledged was lost: every PUBACK and PUBREC waited for its commit
    assert not sim.violations.items
    assert _cluster(sim)["handover_lost"] == 0 and _cluster(sim)["acknowledged"] > 0


def test_checks_fail_when_a_hand_over_loses_messages(monkeypatch: pytest.MonkeyPatch) -> None:
    # the hand-over check is not vacuous: a broker that drops what the mesh routes to a
    # persistent subscriber's topic loses messages across moves
    original = Broker.deliver_remote

    def lossy(self: Broker, msg):
        if msg.topic.startswith("c/"):
            return 0, ()
        return original(self, msg)

    monkeypatch.setattr(Broker, "deliver_remote", lossy)
    with pytest.raises(InvariantViolation, match="cluster.handover_loss"):
        _run("move-10", duration=16.0, drain=6.0)


def test_checks_fail_when_wills_go_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    original = Broker.publish

    def no_wills(self: Broker, msg, captured: bool = False):
        if msg.topic.startswith("will/"):
            return 0, ()
        return original(self, msg, captured)

    monkeypatch.setattr(Broker, "publish", no_wills)
    with pytest.raises(InvariantViolation, match="cluster.wills_once"):
        _run("move-10", duration=16.0, drain=6.0)


@pytest.mark.process
@pytest.mark.parametrize("name", ["move-partition-24"])
def test_cluster_runs_are_the_same_across_hash_seeds(tmp_path, name: str) -> None:
    # sets iterate in hash order: nothing the simulator or the node decides may depend on it;
    # move-partition-24 holds custody across a cut (finding 11: custody's retransmissions
    # listed their destinations in a set's order until c539698), and moves clients as move-10
    # does (move-10 passes too; left out of the suite for its time budget)
    outputs = []
    for seed in ("1", "2"):
        out = tmp_path / f"s{seed}.json"
        env = dict(os.environ, PYTHONHASHSEED=seed)
        p = subprocess.run(
            [sys.executable, "-m", "mqttmesh.sim", str(SCENARIOS / f"{name}.toml"), "-q", "--keep-going"]
            + ["--json", str(out)],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        # 1: an invariant broke (move-partition-24: findings 8 and 9), the same in both runs
        assert p.returncode in (0, 1) and "Traceback" not in p.stderr, p.stderr
        s = json.loads(out.read_text())
        # ("memory": the sizes of sets and dicts depend on where deleted entries fell, which
        # follows the hashes; issue 15's refusals and fencing churn the subscriptions more)
        for key in ("run", "spf", "memory"):
            s.pop(key)
        for e in s["convergence"]:
            e.pop("spf_seconds"), e.pop("spf_ms_per_run")
        outputs.append(s)
    assert outputs[0]["cluster"]["history_digest"] == outputs[1]["cluster"]["history_digest"]
    assert outputs[0] == outputs[1]


# ---------------------------------------------------------------- findings (docs/simulation.md)


@pytest.fixture(scope="module")
def partition24() -> Simulator:
    return _run("move-partition-24", checks_fail=False)


@pytest.fixture(scope="module")
def crash20() -> Simulator:
    return _run("move-crash-20", checks_fail=False)


def _violations(sim: Simulator, invariant: str) -> list[str]:
    return [v for v in sim.violations.items if v.startswith(f"[{invariant}]")]


def test_partition24_every_invariant_holds(partition24: Simulator) -> None:
    assert not partition24.violations.items
    assert _cluster(partition24)["handover_lost"] == 0  # no acknowledged message lost


def test_partition24_wills_once(partition24: Simulator) -> None:
    # finding 8, decided (docs/design.md 3.3): the registrar across the split publishes the
    # will of a client it cannot reach, and the node holding it publishes it when the
    # connection really ends: at most once per side, which the check allows (and no more)
    assert not _violations(partition24, "cluster.wills_once")


def test_partition24_qos2_once(partition24: Simulator) -> None:
    # finding 9, fixed by issue 15 (a regression guard now): settlements reach the other
    # holders before the client sees the frame that depends on them, and a node without a
    # majority of the mesh serves no persistent session
    assert not _violations(partition24, "cluster.handover_loss")


def test_crash20_every_invariant_holds(crash20: Simulator) -> None:
    # finding 9's QoS 2 message delivered twice (seed 4) is gone since issue 15; each
    # invariant on its own, so that a regression names the one that broke
    for invariant in STRICT:
        assert not _violations(crash20, invariant), invariant
    cl = _cluster(crash20)
    assert cl["handover_lost"] == 0 and cl["qos2_twice"] == 0 and cl["handover_checked"] > 500


def test_crash20_wills_once(crash20: Simulator) -> None:
    # finding 10, fixed in c860ed1 (a regression guard now): a restarted node stayed suspect
    # at the registrars until the next membership change, so the wills of clients connected
    # to it were published, and again every register_interval
    assert not _violations(crash20, "cluster.wills_once")


# ---------------------------------------------------------------- 200 nodes


@pytest.fixture(scope="module")
def move200() -> tuple[Simulator, float]:
    started = time.perf_counter()
    sim = _run("move-200", checks_fail=False)
    wall = time.perf_counter() - started
    print(f"move-200: {wall:.1f}s of wall time, {sim.events:,} events")
    return sim, wall


@pytest.mark.timeout(600)
def test_move200_runs_and_checks(move200: tuple[Simulator, float]) -> None:
    sim, _wall = move200
    cl = _cluster(sim)
    assert len(sim.names) == 200 and cl["clients"] == 132
    # (pairs judged: 764 before issue 15, 351 since; persistent clients are refused (0x03)
    # while a majority of their session's nodes is out of reach, so fewer reconnect in time)
    assert sum(cl["moves"].values()) > 100 and cl["handover_checked"] > 300 and cl["wills_checked"] > 200
    assert set(sim.violations.count) <= {"cluster.wills_once", "cluster.handover_loss"}
    assert "convergence" not in sim.violations.count
    assert _cluster(sim)["registration_checks"] > 0  # the quiet end of the run is checked


# each invariant on its own: a regression in one cannot hide behind another


@pytest.mark.timeout(600)
@pytest.mark.parametrize("invariant", [k for k in STRICT if k != "cluster.wills_once"])
def test_move200_invariant_holds(move200: tuple[Simulator, float], invariant: str) -> None:
    # findings 9 and 12 (handover_loss) fixed by issue 15
    sim, _wall = move200
    assert not _violations(sim, invariant)


@pytest.mark.timeout(600)
def test_move200_wills_once(move200: tuple[Simulator, float]) -> None:
    # finding 8, decided: at most once per side of the cut-off region
    sim, _wall = move200
    assert not _violations(sim, "cluster.wills_once")
