"""The simulator as a fuzzer of the whole cluster: random cluster scenarios, one per seed.

Pure and deterministic: ``draw_scenario(seed)`` is the same Scenario for the same seed,
every choice from ``random.Random(f"fuzz/{seed}")``. What it draws (docs/simulation.md,
section 8, "The fuzzer"): 5 to 50 whole nodes (mostly under 20) on a random topology kind
and latencies; moving persistent subscribers (clean, abrupt and takeover moves) and
publishers; and a fault schedule: kill -9 and power-loss crashes with their restarts,
partitions (halves, isolated nodes, grown regions, sites, random groups) and their heals,
flapping links, slowed links, and stalled nodes (sim/stall.py). Every fault ends before
the drain, so the run ends quiet. Faults name their nodes and links, so that removing one
(sim/shrink.py) leaves the others as they were. Running, judging and shrinking are
sim/fuzz_run.py's.

In a share of the seeds (``MQTT5_SEEDS``) some clients speak MQTT 5 (issue 23): sessions with
a Session Expiry Interval (some short enough to end during the run, some Clean Start 1),
messages with a Message Expiry Interval (some short enough to end in custody or in a queue),
wills with a Will Delay Interval, and "away" moves long enough for them to run out. That
part is drawn from its own stream, ``random.Random(f"fuzz5/{seed}")``, after the rest: a
seed without it draws the very scenario it drew before MQTT 5 was drawn at all.

In another share (``SHARED_SEEDS``) the cluster has shared groups (issue 24, sim/members.py):
members joining and leaving, a strategy, and in half of those seeds (``PERSISTENT_MEMBERS``)
members with CleanSession=0; drawn from ``random.Random(f"fuzzsh/{seed}")``, after the rest,
so a seed without them is the scenario it was (and the persistent members last of all: a
seed whose groups have none draws the groups it drew before they were drawn at all).

In a third share (``PERSISTENT_PUBLISHER_SEEDS``) a share of the publishers connect with
CleanSession=0, move between nodes and send again what was not acknowledged on each new
connection (sim/sessions.py); drawn from ``random.Random(f"fuzzpp/{seed}")`` after
everything else, faults included, so a seed without them is the scenario it was.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from .scenario import Clients, Fault, Scenario, Topology, parse_scenario
from .scenario_dump import scenario_dict
from .topology import Graph, build_topology

__all__ = ["draw_scenario", "FAULT_EPISODES", "scenario_graph", "describe"]

# what one drawn fault is (each is one or more [[faults]] entries), and how often
FAULT_EPISODES = {"stall": 0.3, "crash": 0.25, "partition": 0.2, "flap": 0.17, "latency": 0.08}
# a quiet end longer than custody's longest retransmission interval (30 s, mesh/routing/custody.py):
# a message held across a fault may arrive that late, and the hand-over check counts to the end
TAIL = 30
MQTT5_SEEDS = 0.4  # the share of seeds whose clients speak MQTT 5 (some of them)
SHARED_SEEDS = 0.3  # the share of seeds with shared groups (issue 24)
PERSISTENT_MEMBERS = 0.5  # the share of those whose members are CleanSession=0 (some of them)
PERSISTENT_PUBLISHER_SEEDS = 0.3  # the share of seeds with CleanSession=0 publishers (some of them)
STRATEGIES = ("local", "round_robin", "hash_topic", "hash_clientid", "sticky")  # (shared.STRATEGIES)
_KINDS = {"full": 2, "ring": 1, "line": 0.5, "star": 0.5, "random": 3, "rgg": 2, "ba": 1.5, "sites": 2}


def scenario_graph(sc: Scenario) -> Graph:
    """The graph the Simulator builds for ``sc`` (the same stream: core.py)."""
    return build_topology(sc.topology, random.Random(f"{sc.seed}/topology"))


def draw_scenario(seed: int) -> Scenario:
    """The cluster scenario of fuzz seed ``seed``."""
    rng = random.Random(f"fuzz/{seed}")
    topology = _draw_topology(rng)
    active, drain = rng.randint(24, 40), rng.randint(6, 8)  # clients move and publish, then drain
    sc = Scenario(
        name=f"fuzz-{seed}",
        seed=seed,
        duration=float(active + TAIL),
        drain=float(drain + TAIL),
        mode="cluster",
        topology=topology,
        clients=_draw_clients(rng, topology.nodes),
    )
    _draw_mqtt5(random.Random(f"fuzz5/{seed}"), sc.clients)
    _draw_shared(random.Random(f"fuzzsh/{seed}"), sc)
    sc.faults = _Schedule(rng, sc, scenario_graph(sc)).draw()
    if any(f.kind == "partition" for f in sc.faults) and rng.random() < 0.4:
        sc.clients.targets = "far"
    _draw_persistent_publishers(random.Random(f"fuzzpp/{seed}"), sc.clients)
    sc.description = describe(sc)
    return parse_scenario(scenario_dict(sc), f"fuzz seed {seed}")


def _r(x: float, digits: int = 2) -> float:
    return round(x, digits)


def _draw_topology(rng: random.Random) -> Topology:
    roll = rng.random()
    n = rng.randint(5, 10) if roll < 0.6 else rng.randint(11, 20) if roll < 0.88 else rng.randint(21, 50)
    kinds = [k for k in _KINDS if not (k == "full" and n > 16) and not (k == "sites" and n < 6)]
    kind = rng.choices(kinds, [_KINDS[k] for k in kinds])[0]
    lo = _r(rng.uniform(0.5, 5), 1)
    t = Topology(kind=kind, nodes=n, latency_ms=(lo, _r(lo + rng.uniform(0, 20), 1)))
    if kind in ("random", "rgg"):
        t.degree = _r(rng.uniform(2.5, 5), 1)
    elif kind == "ba":
        t.m = rng.randint(1, 3)
    elif kind == "sites":
        t.sites = rng.randint(2, min(4, n // 3))
        t.site_kind = rng.choice(["full", "ring", "random"])
        t.long_links = rng.randint(1, 2)
        long_lo = float(rng.randint(15, 40))
        t.long_latency_ms = (long_lo, long_lo + rng.randint(0, 40))
    return t


def _draw_clients(rng: random.Random, nodes: int) -> Clients:
    move_lo = _r(rng.uniform(1, 4), 1)
    how = [rng.randint(0, 3) for _ in range(3)]
    if not any(how):
        how[rng.randrange(3)] = 1
    qos = [_r(rng.uniform(0, 0.3)), _r(rng.uniform(0, 1)), _r(rng.uniform(0.1, 1))]
    lat_lo = _r(rng.uniform(0.3, 2), 1)
    return Clients(
        persistent=rng.randint(4, 20),
        publishers=rng.randint(1, 6),
        publish_rate=_r(rng.uniform(1, 5), 1),
        qos=qos,
        shared=_r(rng.uniform(0, 0.5)),
        move_every=(move_lo, _r(move_lo + rng.uniform(0.5, 4), 1)),
        move_how=[float(x) for x in how],
        keepalive=rng.choice([2, 3, 4]),
        latency_ms=(lat_lo, _r(lat_lo + rng.uniform(0, 3), 1)),
        commit_ms=float(rng.choice([1, 2, 5])),
        replication=rng.choice([2, 3, 3]),
        register_interval=float(rng.choice([3, 5])),
    )


def _draw_mqtt5(rng: random.Random, c: Clients) -> None:
    """The MQTT 5 part of a seed's clients, if it has one (sim/sessions.py: each client speaks
    MQTT 5 or not from its own stream). Sessions: a short interval (it ends during an away
    move), a middle one, a long or endless one, sometimes 0 (it ends with its connection);
    messages: a short Message Expiry Interval (it ends in custody across a cut, or in a
    queue), a middle one, and one longer than the run (it must arrive)."""
    if rng.random() >= MQTT5_SEEDS:
        return
    c.mqtt5 = _r(rng.uniform(0.3, 1.0))
    c.clean_start = rng.choice([0.0, 0.15, 0.3])
    expiry = [rng.choice([1, 2, 3, 5, 8]), rng.choice([10, 15, 30]), rng.choice([120, 600, 0xFFFFFFFF])]
    if rng.random() < 0.3:
        expiry.append(0)
    c.session_expiry = [float(x) for x in sorted(set(expiry))]
    c.will_delay_interval = [0.0, float(rng.choice([1, 2, 3])), float(rng.choice([5, 10, 30]))]
    c.expiring = _r(rng.uniform(0.3, 0.9))
    c.message_expiry = [float(rng.choice([1, 2, 3])), float(rng.choice([5, 10])), float(rng.choice([120, 600]))]
    away_lo = _r(rng.uniform(1, 4), 1)
    c.away = (away_lo, _r(away_lo + rng.uniform(3, 12), 1))
    c.move_how = [*c.move_how, float(rng.randint(1, 3))]


def _draw_shared(rng: random.Random, sc: Scenario) -> None:
    """The shared groups of a seed, if it has them (sim/members.py), from their own stream
    and after the rest: a seed without them is the scenario it was. 1-4 groups of 2-8
    members, on 1-4 nodes per group or spread over all; members leaving every 2-10 s (a
    quarter of the seeds: never), by shares of the four ways; a strategy; in half of them
    30-100 % of the members CleanSession=0 (drawn last: the rest is as it was without)."""
    if rng.random() >= SHARED_SEEDS:
        return
    c = sc.clients
    c.groups = rng.randint(1, 4)
    c.members = rng.randint(2, 8)
    c.member_nodes = rng.choice([0, 0, 1, 2, 3, 4])
    c.member_qos = [_r(rng.uniform(0, 0.5)), _r(rng.uniform(0, 1)), _r(rng.uniform(0, 1))]
    if sum(c.member_qos) <= 0:
        c.member_qos = [0.0, 1.0, 0.0]
    if rng.random() >= 0.25:
        lo = _r(rng.uniform(2, 6), 1)
        c.member_churn = (lo, _r(lo + rng.uniform(1, 4), 1))
    leave = [float(rng.randint(0, 3)) for _ in range(4)]
    if not any(leave):
        leave[rng.randrange(4)] = 1.0
    c.member_leave = leave
    away_lo = _r(rng.uniform(0.2, 2), 1)
    c.member_away = (away_lo, _r(away_lo + rng.uniform(0, 4), 1))
    c.to_groups = _r(rng.uniform(0.3, 0.8))
    sc.engine = {**sc.engine, "shared_strategy": rng.choice(STRATEGIES)}
    if rng.random() < PERSISTENT_MEMBERS:
        c.member_persistent = _r(rng.uniform(0.3, 1.0))


def _draw_persistent_publishers(rng: random.Random, c: Clients) -> None:
    """Whether a seed's publishers are CleanSession=0 (some of them: 30-100 %, each publisher
    drawn from its own stream, sim/sessions.py), from their own stream and last of all: a seed
    without them is the scenario it was. They move as the seed's subscribers do."""
    if rng.random() < PERSISTENT_PUBLISHER_SEEDS:
        c.publisher_persistent = _r(rng.uniform(0.3, 1.0))


@dataclass
class _Schedule:
    """Draws fault episodes that fit together: a node is crashed at most once at a time and
    never stalled while down, partitions do not overlap, a link flaps once at a time."""

    rng: random.Random
    sc: Scenario
    graph: Graph
    faults: list[Any] = field(default_factory=list)  # [[faults]] tables
    down: dict[str, list[tuple[float, float]]] = field(default_factory=dict)  # node -> crash windows
    cut: list[tuple[float, float]] = field(default_factory=list)  # partition windows
    busy_links: dict[tuple[str, str], list[tuple[float, float]]] = field(default_factory=dict)
    stalls: dict[str, list[tuple[float, float]]] = field(default_factory=dict)  # node -> stall starts
    first: float = 4.0  # faults start once every client has connected
    last: float = 0.0  # and are over by then

    def __post_init__(self) -> None:
        # 6 s before the drain: the last moves happen in a quiet cluster (the single-registration
        # check needs register_interval + claim + gather timeouts of quiet)
        self.last = self.sc.duration - self.sc.drain - 6.0

    def draw(self) -> list[Fault]:
        rng = self.rng
        count = rng.choices(range(6), [1, 3, 3, 2, 1.5, 1])[0]
        for _ in range(count):
            kind = rng.choices(list(FAULT_EPISODES), list(FAULT_EPISODES.values()))[0]
            t0 = _r(rng.uniform(self.first, self.last - 1))
            getattr(self, f"_{kind}")(t0)
        tables = sorted(self.faults, key=lambda f: f["at"])
        return [Fault(f["at"], f["kind"], {k: v for k, v in f.items() if k not in ("at", "kind")}) for f in tables]

    def _free(self, windows: list[tuple[float, float]], t0: float, t1: float) -> bool:
        return all(t1 < a - 0.05 or t0 > b + 0.05 for a, b in windows)

    def _crash(self, t0: float) -> None:
        rng, names = self.rng, self.graph.names
        t1 = _r(min(self.last, t0 + rng.uniform(0.5, 6)))
        if t1 <= t0:
            return
        ok = [n for n in names if self._free(self.down.get(n, []) + self.stalls.get(n, []), t0, t1)]
        at_once = sum(1 for ws in self.down.values() for a, b in ws if a <= t1 and b >= t0)
        if not ok or 2 * (at_once + 1) >= len(names):
            return
        node = rng.choice(ok)
        self.down.setdefault(node, []).append((t0, t1))
        how = rng.choice(["kill", "kill", "power"])
        self.faults += [
            {"at": t0, "kind": "crash", "node": node, "how": how},
            {"at": t1, "kind": "restart", "node": node},
        ]

    def _stall(self, t0: float) -> None:
        rng = self.rng
        roll = rng.random()
        seconds = rng.uniform(0.2, 1.5) if roll < 0.4 else rng.uniform(1.5, 3.5) if roll < 0.7 else rng.uniform(3.5, 8)
        seconds = _r(min(seconds, self.last - t0))
        ok = [n for n in self.graph.names if self._free(self.down.get(n, []), t0, t0)]
        if seconds <= 0 or not ok:
            return
        node = rng.choice(ok)
        self.stalls.setdefault(node, []).append((t0, t0))  # (a crash may come during it, not before)
        self.faults.append({"at": t0, "kind": "stall", "node": node, "seconds": seconds})

    def _partition(self, t0: float) -> None:
        rng, names = self.rng, self.graph.names
        t1 = _r(min(self.last, t0 + rng.uniform(1, 10)))
        if t1 <= t0 or not self._free(self.cut, t0, t1):
            return
        shapes = ["half", "isolate", "grow", "groups"] + (["isolate_site"] if self.graph.site_of else [])
        shape = rng.choice(shapes)
        how: dict[str, Any]
        if shape == "half":
            how = {"half": True}
        elif shape == "isolate":
            how = {"isolate": sorted(rng.sample(names, rng.randint(1, min(3, len(names) // 2))))}
        elif shape == "grow":
            how = {"grow": rng.randint(2, len(names) // 2)}
        elif shape == "isolate_site":
            how = {"isolate_site": rng.randrange(self.sc.topology.sites)}
        else:
            shuffled = rng.sample(names, len(names))
            cuts = sorted(rng.sample(range(1, len(names)), rng.randint(1, 2)))
            how = {"groups": [sorted(g) for g in _split(shuffled, cuts)]}
        self.cut.append((t0, t1))
        self.faults += [{"at": t0, "kind": "partition", **how}, {"at": t1, "kind": "heal"}]

    def _flap(self, t0: float) -> None:
        rng = self.rng
        a, b = rng.choice(self.graph.edges)
        t = t0
        entries: list[dict[str, Any]] = []
        for _ in range(rng.randint(1, 4)):
            up = _r(t + rng.uniform(0.3, 3))
            if up > self.last:
                break
            entries += [{"at": t, "kind": "link_down", "link": [a, b]}, {"at": up, "kind": "link_up", "link": [a, b]}]
            t = _r(up + rng.uniform(0.3, 3))
        windows = self.busy_links.setdefault((a, b), [])
        if entries and self._free(windows, t0, entries[-1]["at"]):
            windows.append((t0, entries[-1]["at"]))
            self.faults += entries

    def _latency(self, t0: float) -> None:
        rng = self.rng
        a, b = rng.choice(self.graph.edges)
        t1 = _r(min(self.last, t0 + rng.uniform(1, 8)))
        windows = self.busy_links.setdefault((a, b), [])
        if t1 <= t0 or not self._free(windows, t0, t1):
            return
        windows.append((t0, t1))
        slow = _r(rng.uniform(20, 300), 1)
        normal = _r(self.graph.latency[(a, b)] * 1000, 4)
        self.faults += [
            {"at": t0, "kind": "latency", "link": [a, b], "latency_ms": slow},
            {"at": t1, "kind": "latency", "link": [a, b], "latency_ms": normal},
        ]


def _split(items: list[str], cuts: list[int]) -> list[list[str]]:
    bounds = [0] + cuts + [len(items)]
    return [items[bounds[i] : bounds[i + 1]] for i in range(len(bounds) - 1)]


def describe(sc: Scenario) -> str:
    """One paragraph: what a (drawn or shrunk) scenario holds."""
    t, c = sc.topology, sc.clients
    kinds: dict[str, int] = {}
    for f in sc.faults:
        if f.kind not in ("restart", "heal", "link_up"):
            kinds[f.kind] = kinds.get(f.kind, 0) + 1
    faults = ", ".join(f"{n} {k}" for k, n in sorted(kinds.items())) or "no fault"
    v5 = ""
    if c.mqtt5:
        v5 = (
            f"; {c.mqtt5:.0%} of the clients speak MQTT 5 (sessions of {_seconds(c.session_expiry)} s, "
            f"messages expiring after {_seconds(c.message_expiry)} s, "
            f"wills delayed {_seconds(c.will_delay_interval)} s)"
        )
    if c.groups:
        churn = f"leaving every {c.member_churn[0]:g}-{c.member_churn[1]:g} s" if c.member_churn[1] else "staying"
        persistent = f", {c.member_persistent:.0%} of them persistent" if c.member_persistent else ""
        v5 += (
            f"; {c.groups} shared group{'s' if c.groups != 1 else ''} of {c.members} members{persistent} "
            f"({sc.engine.get('shared_strategy', 'local')}, {churn})"
        )
    pp = f" ({c.publisher_persistent:.0%} of them persistent, moving)" if c.publisher_persistent else ""
    return (
        f"Drawn by the fuzzer (mqttmesh simulate --fuzz, seed {sc.seed}): {t.nodes} whole nodes ({t.kind}), "
        f"{c.persistent} moving persistent subscriber{'s' if c.persistent != 1 else ''}, "
        f"{c.publishers} publisher{'s' if c.publishers != 1 else ''}{pp} at {c.publish_rate}/s{v5}; {faults}. "
        f"Replay: mqttmesh simulate FILE --keep-going"
    )


def _seconds(values: list[float]) -> str:
    return "/".join("forever" if v == 0xFFFFFFFF else f"{v:g}" for v in values)
