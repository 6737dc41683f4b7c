"""The simulator as a fuzzer of the whole cluster (issue 20): the scenario generator, the TOML
it writes, the stall fault, the shrinker, the session-present check, and a sweep of seeds.

The generator's tests run in `make check`; the runs of the simulator are marked slow. The
sweep asserts every invariant on every seed; an invariant today's cluster breaks on some of
them is a known finding (docs/simulation.md, section 8), asserted apart in a test marked
xfail(strict=True) that names it, as tests/sim/test_sim_cluster.py does.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import tomllib

import pytest

from mqttmesh.broker import Broker
from mqttmesh.sim.core import Simulator
from mqttmesh.sim.fuzz import FAULT_EPISODES, TAIL, draw_scenario, scenario_graph
from mqttmesh.sim.fuzz_run import SeedResult, fuzz_seed, judge, still_fails
from mqttmesh.sim.history import History, check_sessions_resumed
from mqttmesh.sim.scenario import Fault, ScenarioError, parse_scenario
from mqttmesh.sim.scenario_dump import dump_scenario, dump_toml
from mqttmesh.sim.shrink import fault_groups, shrink
from support.sim import SCENARIOS

SEEDS = range(1, 201)  # the generator's tests (no run)
SWEEP = range(1, 51)  # the seeds the sweep runs


def _equal(a, b) -> bool:
    a.source = b.source = ""
    return a == b


# ---------------------------------------------------------------- the generator


def test_a_seed_draws_the_same_scenario_every_time() -> None:
    for seed in (1, 2, 77, 1000):
        assert dump_scenario(draw_scenario(seed)) == dump_scenario(draw_scenario(seed))
    assert len({dump_scenario(draw_scenario(s)) for s in range(1, 21)}) == 20


def test_drawn_scenarios_stay_within_their_ranges() -> None:
    nodes, kinds, episodes = [], set(), set()
    for seed in SEEDS:
        sc = draw_scenario(seed)
        t, c = sc.topology, sc.clients
        assert sc.mode == "cluster" and sc.seed == seed
        # 24-40 s of moving clients, then a quiet end longer than custody's retransmission interval
        assert 5 <= t.nodes <= 50 and 24 <= sc.duration - TAIL <= 40 and 6 <= sc.drain - TAIL <= 8
        assert t.kind != "full" or t.nodes <= 16
        assert 4 <= c.persistent <= 20 and 1 <= c.publishers <= 6 and 1 <= c.publish_rate <= 5
        assert sum(c.move_how) > 0 and c.move_every[1] > c.move_every[0] > 0
        graph = scenario_graph(sc)
        down: dict[str, float] = {}
        for f in sc.faults:
            # every fault is over 6 s before the drain: the end of the run is quiet
            assert 4.0 <= f.at <= sc.duration - sc.drain - 6.0, (seed, f)
            p = f.params
            if "link" in p:
                assert tuple(p["link"]) in graph.latency, (seed, f)
            if f.kind == "crash":
                assert p["node"] not in down and p["how"] in ("kill", "power")
                down[p["node"]] = f.at
            elif f.kind == "restart":
                assert down.pop(p["node"]) < f.at  # the node that crashed, later
            elif f.kind == "stall":
                assert p["node"] not in down and 0 < p["seconds"] <= 8
        assert not down, seed  # every crashed node restarts
        crashes = sum(f.kind == "crash" for f in sc.faults)
        assert 2 * crashes < t.nodes or crashes <= 1  # never most of the cluster at once
        nodes.append(t.nodes)
        kinds.add(t.kind)
        episodes |= {"flap" if f.kind == "link_down" else f.kind for f in sc.faults}
    assert sum(n <= 10 for n in nodes) > len(nodes) / 2 and sum(n > 20 for n in nodes) >= 10  # mostly small
    assert kinds == {"full", "ring", "line", "star", "random", "rgg", "ba", "sites"}
    assert set(FAULT_EPISODES) <= episodes


def test_a_share_of_the_seeds_draws_shared_groups_from_their_own_stream(monkeypatch: pytest.MonkeyPatch) -> None:
    import mqttmesh.sim.fuzz as fuzz

    drawn = {s: draw_scenario(s) for s in SEEDS}
    with_groups = [s for s, sc in drawn.items() if sc.clients.groups]
    assert 0.2 * len(SEEDS) < len(with_groups) < 0.4 * len(SEEDS)
    strategies = set()
    for seed in with_groups:
        c = drawn[seed].clients
        assert 1 <= c.groups <= 4 and 2 <= c.members <= 8 and 0 <= c.member_nodes <= 4
        assert c.member_churn == (0.0, 0.0) or 2 <= c.member_churn[0] < c.member_churn[1] <= 10
        assert sum(c.member_leave) > 0 and sum(c.member_qos) > 0 and 0.3 <= c.to_groups <= 0.8
        assert c.member_persistent == 0 or 0.3 <= c.member_persistent <= 1.0
        strategies.add(drawn[seed].engine["shared_strategy"])
    assert strategies == set(fuzz.STRATEGIES)
    # persistent members in about half of them, drawn last: without them, the groups drawn before
    persistent = [s for s in with_groups if drawn[s].clients.member_persistent]
    assert 0.3 * len(with_groups) < len(persistent) < 0.7 * len(with_groups)
    monkeypatch.setattr(fuzz, "PERSISTENT_MEMBERS", 0.0)
    for seed in with_groups:
        sc = draw_scenario(seed)
        sc.clients.member_persistent = drawn[seed].clients.member_persistent
        sc.description = drawn[seed].description
        assert dump_scenario(sc) == dump_scenario(drawn[seed]), seed
    monkeypatch.undo()
    # without them a seed is the scenario it was: only the shared keys, the strategy and the
    # description differ
    monkeypatch.setattr(fuzz, "_draw_shared", lambda rng, sc: None)
    keys = (
        "groups",
        "members",
        "member_nodes",
        "member_qos",
        "member_churn",
        "member_leave",
        "member_away",
        "member_persistent",
    )
    for seed, sc in drawn.items():
        plain = draw_scenario(seed)
        if not sc.clients.groups:
            assert dump_scenario(plain) == dump_scenario(sc), seed
            continue
        assert sc.faults == plain.faults and sc.topology == plain.topology and not plain.engine, seed
        for key in (*keys, "to_groups"):
            setattr(sc.clients, key, getattr(plain.clients, key))
        assert sc.clients == plain.clients, seed


def test_a_share_of_the_seeds_draws_persistent_publishers_from_their_own_stream(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import mqttmesh.sim.fuzz as fuzz

    drawn = {s: draw_scenario(s) for s in SEEDS}
    with_them = [s for s, sc in drawn.items() if sc.clients.publisher_persistent]
    assert 0.2 * len(SEEDS) < len(with_them) < 0.4 * len(SEEDS)
    assert all(0.3 <= drawn[s].clients.publisher_persistent <= 1.0 for s in with_them)
    assert all("of them persistent, moving" in drawn[s].description for s in with_them)
    # without them a seed is the scenario it was: only the key and the description differ
    monkeypatch.setattr(fuzz, "_draw_persistent_publishers", lambda rng, c: None)
    for seed, sc in drawn.items():
        plain = draw_scenario(seed)
        if not sc.clients.publisher_persistent:
            assert dump_scenario(plain) == dump_scenario(sc), seed
            continue
        sc.clients.publisher_persistent = 0.0
        sc.description = plain.description
        assert dump_scenario(plain) == dump_scenario(sc), seed


def test_a_drawn_scenario_is_written_as_toml_that_reads_back_equal() -> None:
    for seed in SEEDS:
        sc = draw_scenario(seed)
        assert _equal(parse_scenario(tomllib.loads(dump_scenario(sc))), sc), seed
    for path in sorted(SCENARIOS.glob("*.toml")):  # the hand-written ones too
        sc = parse_scenario(tomllib.loads(path.read_text()))
        assert _equal(parse_scenario(tomllib.loads(dump_scenario(sc))), sc), path


def test_the_toml_written_is_the_expected_text() -> None:
    doc = {
        "name": 'a "quoted"\nname',
        "seed": 3,
        "duration": 12.5,
        "mode": "cluster",
        "topology": {"nodes": 4, "latency_ms": [1.0, 2.5]},
        "faults": [{"at": 1.0, "kind": "stall", "node": "n1", "seconds": 2.0}, {"at": 2.0, "kind": "heal"}],
    }
    assert dump_toml(doc) == (
        'name = "a \\"quoted\\"\\nname"\nseed = 3\nduration = 12.5\nmode = "cluster"\n'
        "\n[topology]\nnodes = 4\nlatency_ms = [1.0, 2.5]\n"
        '\n[[faults]]\nat = 1.0\nkind = "stall"\nnode = "n1"\nseconds = 2.0\n'
        '\n[[faults]]\nat = 2.0\nkind = "heal"\n'
    )


@pytest.mark.parametrize(
    "fault,message",
    [
        ({"at": 1.0, "kind": "stall", "node": "n1"}, "stall needs seconds"),
        ({"at": 1.0, "kind": "stall", "seconds": -1}, "stall needs seconds"),
        ({"at": 1.0, "kind": "stall", "seconds": 1, "how": "kill"}, "stall takes no 'how'"),
    ],
)
def test_a_stall_needs_its_seconds(fault: dict, message: str) -> None:
    with pytest.raises(ScenarioError, match=message):
        parse_scenario({"faults": [fault]})


def test_faults_are_shrunk_in_the_groups_that_belong_together() -> None:
    faults = [
        Fault(1.0, "crash", {"node": "n1"}),
        Fault(2.0, "stall", {"node": "n2", "seconds": 1.0}),
        Fault(3.0, "link_down", {"link": ["n0", "n1"]}),
        Fault(4.0, "partition", {"half": True}),
        Fault(5.0, "restart", {"node": "n1"}),
        Fault(6.0, "link_up", {"link": ["n0", "n1"]}),
        Fault(7.0, "heal", {}),
        Fault(8.0, "link_down", {"link": ["n0", "n1"]}),
        Fault(9.0, "link_up", {"link": ["n0", "n1"]}),
    ]
    assert fault_groups(faults) == [[0, 4], [1], [2, 5], [3, 6], [7, 8]]


def test_the_shrinker_keeps_what_the_failure_needs() -> None:
    # a predicate without the simulator: "fails" while a stall and two subscribers remain
    sc = next(s for s in map(draw_scenario, SEEDS) if len(fault_groups(s.faults)) >= 3 and "stall" in str(s.faults))
    tried: list[str] = []

    def fails(variant) -> bool:
        tried.append(dump_scenario(variant))
        return any(f.kind == "stall" for f in variant.faults) and variant.clients.persistent >= 2

    out = shrink(sc, fails, max_runs=100)
    small = out.scenario
    assert [f.kind for f in small.faults] == ["stall"]
    # as few nodes as keep the stalled one (node i keeps its number), no publisher, 2 subscribers
    assert small.topology.nodes == max(3, int(small.faults[0].params["node"][1:]) + 1)
    assert small.clients.persistent == 2 and small.clients.publishers == 0 and small.duration <= sc.duration
    assert fails(out.scenario) and out.runs == len(tried) - 1 < 100
    again = shrink(sc, fails, max_runs=100)  # deterministic
    assert dump_scenario(again.scenario) == dump_scenario(out.scenario) and again.steps == out.steps


def test_a_session_found_again_is_said_present() -> None:
    h = History()
    h.connect(1.0, "s1", "ok", "s1#1", "n0", False)  # a new session: present 0 is right
    h.connect(2.0, "s1", "fail", "s1#2", "n1", 3)  # refused (0x03): not an answer about the session
    h.connect(3.0, "s1", "ok", "s1#3", "n1", True)
    h.connect(4.0, "s1", "ok", "s1#4", "n2", False)  # accepted before, its session gone: a violation
    h.connect(5.0, "p1", "ok", "p1#1", "n0", False)
    h.connect(6.0, "p1", "ok", "p1#2", "n0", False)  # CleanSession=1: never present
    assert check_sessions_resumed(h, {"s1"}) == [(4.0, "s1", "s1#4", "n2")]


# ---------------------------------------------------------------- the stall fault


def _stalled_run(monkeypatch: pytest.MonkeyPatch, seconds: float) -> tuple[Simulator, list[tuple[float, str]]]:
    sc = parse_scenario(
        {
            "mode": "cluster",
            "seed": 3,
            "duration": 26.0,
            "drain": 6.0,
            "topology": {"kind": "full", "nodes": 5, "latency_ms": [1, 4]},
            "clients": {"persistent": 6, "publishers": 2, "publish_rate": 4.0},
            "checks": {"fail": False},
            "faults": [{"at": 8.0, "kind": "stall", "node": "n1", "seconds": seconds}],
        }
    )
    sent: list[tuple[float, str]] = []
    original = Simulator._send

    def send(self: Simulator, node, peer, kind, payload, qos, conn=-1):
        sent.append((self.now, node.name))
        original(self, node, peer, kind, payload, qos, conn)

    monkeypatch.setattr(Simulator, "_send", send)
    return Simulator(sc).run(), sent


@pytest.mark.slow
def test_a_stalled_node_is_silent_then_catches_up(monkeypatch: pytest.MonkeyPatch) -> None:
    sim, sent = _stalled_run(monkeypatch, 5.0)
    by_n1 = [t for t, n in sent if n == "n1"]
    assert not [t for t in by_n1 if 8.0 < t < 13.0]  # its loop ran nothing: it sent nothing
    assert [t for t in by_n1 if 7.0 < t <= 8.0] and [t for t in by_n1 if 13.0 <= t < 14.0]
    assert [t for t, n in sent if n != "n1" and 8.0 < t < 13.0]  # the others went on
    # its 4 peers heard nothing for 3 keepalives and closed their links; it read that at 13 s
    assert sim.stall_counts["silenced"] == 4 and sim.stall_counts["held"] > 20
    # its ticks came late: the node saw the gap and distrusts its view for 3 keepalives
    members = sim.nodes["n1"].core.cluster.members
    assert 13.0 < members.distrust_until <= 16.5
    assert sim.episode is None and not sim.violations.count  # converged; every invariant held
    refused = [op for op in sim.history.ops if op[3] == "connect" and op[2] == "fail" and op[5] == "n1"]
    assert refused  # a CONNECT read right after the pause is refused (0x03), not served stale


@pytest.mark.slow
def test_a_short_stall_keeps_the_links(monkeypatch: pytest.MonkeyPatch) -> None:
    sim, sent = _stalled_run(monkeypatch, 1.5)
    assert not [t for t, n in sent if n == "n1" and 8.0 < t < 9.5]
    assert sim.stall_counts["silenced"] == 0 and sim.stall_counts["held"] > 10
    assert not sim.violations.count


@pytest.mark.slow
def test_a_stall_in_an_engine_scenario() -> None:
    sc = parse_scenario(tomllib.loads((SCENARIOS / "ring-12.toml").read_text()))
    sc.checks.fail = False
    sc.faults.append(Fault(12.0, "stall", {"node": "n03", "seconds": 4.0}))
    sc.faults.sort(key=lambda f: f.at)
    sim = Simulator(sc).run()
    assert sim.stall_counts["silenced"] == 2 and not sim.violations.count


# ---------------------------------------------------------------- the shrinker on a real failure


@pytest.mark.slow
def test_the_shrinker_finds_a_smaller_scenario_that_still_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    # a broker that drops what the mesh routes to a subscriber's own topic (as in
    # test_sim_cluster.py): the hand-over check fails, and keeps failing as the scenario shrinks
    original = Broker.deliver_remote

    def lossy(self: Broker, msg):
        return (0, ()) if msg.topic.startswith("c/") else original(self, msg)

    monkeypatch.setattr(Broker, "deliver_remote", lossy)
    sc = draw_scenario(16)  # 16 nodes, a crash
    assert "cluster.handover_loss" in judge(sc).violated
    out = shrink(sc, still_fails("cluster.handover_loss"), max_runs=10)
    small = out.scenario
    assert out.steps and out.runs <= 10
    assert small.topology.nodes < sc.topology.nodes and small.clients.persistent < sc.clients.persistent
    assert "cluster.handover_loss" in judge(parse_scenario(tomllib.loads(dump_scenario(small)))).violated


# ---------------------------------------------------------------- the sweep

# invariants a known finding breaks, and on which seeds (docs/simulation.md, section 8): none
# of 3.1.1 since issue 20 fixed findings 13-17 and decided finding 8 (a will across a partition:
# at most once per side); of the MQTT 5 clients (issue 23): none since findings 21 to 24 were
# fixed (seeds 37, 36, 8 and 47); of the persistent members of groups (issue 24): none since
# seed 19's shared.control, an old home cut off from its member's new node that lets the
# session go only once told, is in the bound (section 9). A finding found and not fixed yet
# names its invariant and seeds here, with a test marked xfail(strict=True) asserting they
# are gone.
KNOWN: dict[str, set[int]] = {}


@pytest.fixture(scope="module")
def sweep() -> list[SeedResult]:
    started = time.perf_counter()
    results = [fuzz_seed(seed) for seed in SWEEP]
    wall = time.perf_counter() - started
    failing = {r.seed: sorted(r.verdict.violated) for r in results if r.verdict.violated}
    print(f"sweep of seeds {SWEEP.start}..{SWEEP.stop - 1}: {wall:.0f}s of wall time; failing: {failing}")
    return results


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_sweep_every_other_invariant_holds_on_every_seed(sweep: list[SeedResult]) -> None:
    broken = {
        r.seed: {k: r.verdict.first[k] for k in r.verdict.violated if r.seed not in KNOWN.get(k, set())} for r in sweep
    }
    assert not {seed: v for seed, v in broken.items() if v}
    # the runs gave the invariants something to judge
    total = {k: sum(r.verdict.counts.get(k, 0) for r in sweep) for k in sweep[0].verdict.counts}
    assert total["handover_checked"] > 5000 and total["wills_checked"] > 1000 and total["moves"] > 2000
    assert total["registration_checks"] > 200 and total["sessions_resumed_checked"] > 1000
    assert total["stalls"] > 10 and total["silenced"] > 10


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_sweep_no_will_of_a_live_client(sweep: list[SeedResult]) -> None:
    # finding 8, decided (docs/design.md 3.3): a registrar that cannot reach a node (a cut, a
    # crash that splits the graph, a stalled node in the middle) publishes the wills of its
    # clients, at most once per side; anything beyond that, or on the same side, breaks it
    assert not [r.seed for r in sweep if r.verdict.counts["wills_twice"] + r.verdict.counts["wills_unwanted"]]


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_sweep_no_will_lost(sweep: list[SeedResult]) -> None:
    # finding 13, fixed: a claim that kicks a connection on a node that died unnoticed keeps
    # its registration among the kicked, and publishes its will once the node is found gone
    assert not [r.seed for r in sweep if r.verdict.counts["wills_missing"]]


@pytest.mark.slow
def test_a_seed_runs_the_same_every_time(sweep: list[SeedResult]) -> None:
    again = fuzz_seed(SWEEP.start)
    assert again.verdict.digest == sweep[0].verdict.digest and again.verdict.violated == sweep[0].verdict.violated


@pytest.mark.slow
@pytest.mark.process
def test_a_seed_runs_the_same_under_any_hash_seed() -> None:
    # sets iterate in hash order: nothing drawn or decided may depend on it (a Barabasi-Albert
    # graph did, through a set of its first links, until the fuzzer's sweep showed it).
    # Seeds 10 and 13: ba graphs with m = 3; 14: rgg with a power loss; 22: sites, every fault kind
    code = (
        "from mqttmesh.sim.fuzz_run import fuzz_seed\nfor s in (10, 13, 14, 22): print(s, fuzz_seed(s).verdict.digest)"
    )
    outputs = []
    for hash_seed in ("1", "2"):
        env = dict(os.environ, PYTHONHASHSEED=hash_seed)
        p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, p.stderr
        outputs.append(p.stdout)
    assert outputs[0] == outputs[1] and len(outputs[0].split()) == 8
