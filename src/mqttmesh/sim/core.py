"""The discrete-event simulator: many unmodified MeshEngines over a simulated network.

Pure: no sockets, no asyncio, no wall clock in what it decides (only in what it
measures: the CPU time of shortest-path runs). Time is a number that jumps from
event to event; everything random comes from ``random.Random`` streams seeded
from the scenario, so a run is reproducible bit for bit.

It drives each engine exactly as server/mesh_node.py does: ``link_up`` when the
hello exchange of a new connection completes on that side, ``link_down`` when
that side notices the connection is dead, ``link_rtt`` from a PINGREQ every
keepalive on the dialling side, ``receive`` for what arrives, ``flush`` once per
event-loop iteration after activity, ``tick`` every 0.25 s, ``route_local`` for
what local clients publish, ``local_filter_added``/``removed`` for their
subscriptions. Only the network, the clock and the clients are simulated; the
network model (latency, loss, connection life) is documented in
docs/simulation.md.
"""

from __future__ import annotations

import gc
import heapq
import json
import random
import time
from collections.abc import Callable

from ..mesh.routing.engine import MeshEngine
from ..topics import SubscriptionTrie
from .checks import InvariantViolation, Violations
from .clients import ClientsMixin
from .cluster_checks import ClusterChecksMixin
from .convergence import ConvergenceMixin, Episode
from .faults import FaultsMixin
from .members import MembersMixin
from .model import (
    ARRIVE,
    CHECK,
    CHURN,
    DETECT,
    DIAL,
    DRAIN,
    END,
    FAULT,
    FLUSH,
    LINK_READY,
    MSGCHECK,
    PING,
    PUBLISH,
    SILENT,
    STALL_END,
    START,
    TALLY,
    TICK,
    Link,
    Node,
    SharedDecoding,
)
from .network import ATTRIBUTED, CONTROL, PROPAGATING, NetworkMixin
from .observe import MsgRecord
from .scenario import Scenario
from .sessions import ClusterMixin
from .stall import StallMixin
from .topology import build_topology
from .verify import VerifyMixin
from .workload import TopicSpace

__all__ = ["Simulator", "Episode", "ATTRIBUTED", "CONTROL", "PROPAGATING"]


class Simulator(
    ClusterMixin,
    ClusterChecksMixin,
    MembersMixin,
    NetworkMixin,
    ClientsMixin,
    StallMixin,
    FaultsMixin,
    ConvergenceMixin,
    VerifyMixin,
):
    """N engines, the links between them, their clients, a fault schedule; run() plays it out."""

    def __init__(self, scenario: Scenario, progress=None):
        self.sc = sc = scenario
        self.progress = progress
        seed = sc.seed
        self.rng_topology = random.Random(f"{seed}/topology")
        self.rng_work = random.Random(f"{seed}/workload")
        self.rng_pub = random.Random(f"{seed}/publish")
        self.rng_loss = random.Random(f"{seed}/loss")
        self.rng_time = random.Random(f"{seed}/timing")
        self.rng_fault = random.Random(f"{seed}/faults")
        self.settings = sc.settings()
        self.graph = build_topology(sc.topology, self.rng_topology)
        self.names = self.graph.names
        self.nodes = {n: Node(n) for n in self.names}
        self.links: dict[tuple[str, str], Link] = {}
        for (a, b), lat in self.graph.latency.items():
            link = Link(a, b, lat)
            self.links[(a, b)] = link
            self.nodes[a].links.append(link)
            self.nodes[b].links.append(link)
        self.space = TopicSpace(sc.workload, self.names)
        self.cluster_mode = sc.mode == "cluster"  # whole nodes and MQTT clients (sessions.py)
        subs = {} if self.cluster_mode else self.space.subscriptions(self.rng_work, self.names)
        for n, fs in subs.items():
            self.nodes[n].filters = list(fs)
        self.initial_distinct = len({f for fs in subs.values() for f in fs})
        self.truth = SubscriptionTrie()  # the simulated clients' real subscriptions
        # subscriptions of crashed nodes: their persistent sessions may come back, and the origin's
        # custody then delivers QoS 1/2 messages published meanwhile (allowed, counted apart)
        self.dormant = SubscriptionTrie()
        self.partition: dict[str, int] = {}
        self.payload = b"x" * sc.workload.payload_bytes
        self.now = 0.0
        self.heap: list = []
        self._seq = 0
        self.end = sc.duration
        self.violations = Violations(sc.checks.fail)
        # what was seen
        self.msgs: dict[tuple[str, int], MsgRecord] = {}
        self.sent = {k: [0, 0] for k in CONTROL + ("fwd", "hello")}  # kind -> [messages, bytes]
        self.sent_by_node = {n: [0, 0] for n in self.names}  # control [messages, bytes]
        self.lost_transmissions = 0
        self.retransmissions = 0
        self.dead_sends = 0  # sent on a connection that was already broken
        self.not_ready_drops = 0  # arrived before the receiving side finished its hello
        self.events = 0
        self.dead_counters: dict[str, int] = {}
        self.dead_spf = [0, 0.0]
        # convergence tracking
        self.ckey_r: dict[str, tuple] = {}
        self.ckey_i: dict[str, tuple] = {}
        self.stale: dict[str, set[str]] = {}
        self.comp: dict[str, str] = {}
        self.members: dict[str, list[str]] = {}
        self.comp_dirty = True
        self.phys_cache: dict[str, frozenset] | None = None
        self.dirty_interest: set[str] = set()
        self.episode: Episode | None = None
        self.episodes: list[Episode] = []
        self.last_unsettled: Link | None = None
        self.last_disturbance = 0.0
        self.steady_time = 0.0
        self.steady_control_bytes = 0
        self.steady_since: float | None = None
        self.epoch_cost = {}  # source -> (dist, parent, hops) on routing costs (typed in ConvergenceMixin)
        self.epoch_latency: dict[str, dict] = {}  # source -> dist on latencies
        self.adj_cost: dict[str, dict[str, int]] | None = None
        self.route_checks = 0
        self.msg_checks = 0
        self.results_steady: list[tuple] = []  # (copies0, optimum, dests, qos) of checked messages
        self.stretch: list[float] = []
        self.cost_stretch: list[float] = []
        self.flush_delay = sc.node.flush_delay_ms / 1000.0
        self.batch_delay = sc.node.batch_delay_ms / 1000.0
        self.cpu_msg = sc.node.cpu_us_per_message / 1e6
        self.cpu_byte = sc.node.cpu_us_per_kb / 1e6 / 1024
        self.settle = sc.checks.settle or self._default_settle()
        self.bin = max(0.05, sc.duration / 400)
        self.timeline: dict[int, list[int]] = {}  # time bin -> [control bytes, data bytes]
        self.node_sends: dict[str, int] = {}  # copies each node sent for checked messages
        self.checked_by_origin: dict[str, int] = {}
        self.wall_start = time.perf_counter()
        self.decoding = SharedDecoding()
        self._init_stalls()
        self.share_watch = sc.mode == "cluster" and sc.clients.groups > 0  # (members.py reads interest deltas)
        if self.cluster_mode:
            self._init_cluster()

    # ------------------------------------------------------------------ event queue

    def _at(self, t: float, *event) -> None:
        self._seq += 1
        heapq.heappush(self.heap, (t, self._seq) + event)

    def run(self) -> Simulator:
        sc = self.sc
        self.unstarted = len(self.names)  # the start cannot converge before every node is up
        self.subscribed = sc.workload.subscribe == "start"
        for n in self.names:
            self._at(self.rng_time.uniform(0, sc.node.start_spread), START, n)
        for i, fault in enumerate(sc.faults):
            self._at(fault.at, FAULT, i)
        w = sc.workload
        if self.cluster_mode:
            self._start_clients()
        elif w.publish_rate > 0:
            publishers = [n for n in self.names if self.rng_pub.random() < w.publishers]
            for n in publishers:
                self._at(w.start + self.rng_pub.expovariate(w.publish_rate), PUBLISH, n)
        if w.churn > 0 and not self.cluster_mode:
            for n in self.names:
                self._at(w.start + self.rng_pub.expovariate(w.churn), CHURN, n)
        self._at(sc.duration, END)
        self._disturb("start", "start")
        handlers: dict[int, Callable[..., None]] = {
            ARRIVE: self._on_arrive,
            FLUSH: self._on_flush,
            TICK: self._on_tick,
            PING: self._on_ping,
            DIAL: self._on_dial,
            DETECT: self._on_detect,
            FAULT: self._on_fault,
            PUBLISH: self._on_publish,
            CHURN: self._on_churn,
            CHECK: self._on_check,
            MSGCHECK: self._on_msgcheck,
            START: self._on_start,
            DRAIN: self._on_drain,
            TALLY: self._on_tally,
            STALL_END: self._on_stall_end,
            SILENT: self._on_silent,
        }
        if self.cluster_mode:
            handlers.update(self._cluster_handlers())
            handlers[LINK_READY] = self._on_link_ready
        heap = self.heap
        next_report = time.perf_counter() + 5.0
        # A thousand engines hold tens of millions of objects; Python's cyclic collector would
        # walk all of them again and again (more than half the run time at 1,000 nodes). What
        # the engines build is freed by reference counting, so the young generations are
        # collected now and then and whatever survived is frozen out of later walks.
        collecting = gc.isenabled()
        gc.disable()
        gc.freeze()
        same_time, last_time = 0, -1.0
        stalled = self.stalled  # (sim/stall.py: a stalled node's events wait for its loop)
        try:
            while heap:
                ev = heapq.heappop(heap)
                if ev[0] == last_time:
                    same_time += 1
                    if same_time > 10_000_000:  # time must move on: a zero-delay cycle is a bug here
                        raise RuntimeError(f"the simulation makes no progress at t={last_time}s")
                else:
                    same_time, last_time = 0, ev[0]
                self.now = ev[0]
                if ev[2] == END:
                    break
                if stalled and self._hold(ev):
                    continue
                self.events += 1
                handlers[ev[2]](*ev[3:])
                if not self.events & 0x3FFFF:
                    gc.collect(1)
                    gc.freeze()
                if self.progress is not None and not self.events & 1023 and time.perf_counter() > next_report:
                    next_report = time.perf_counter() + 5.0
                    self.progress(self._progress_line())
        finally:
            gc.unfreeze()
            if collecting:
                gc.enable()
        if self.cluster_mode:
            self._finish_cluster()
        self._finish()
        return self

    def _progress_line(self) -> str:
        ep = self.episode
        state = f"converging ({ep.cause}) since {ep.start:.2f}s" if ep else "converged"
        return (
            f"  t={self.now:8.3f}s  events={self.events:,}  {state}  wall={time.perf_counter() - self.wall_start:.0f}s"
        )

    # ------------------------------------------------------------------ nodes

    def _on_start(self, name: str) -> None:
        self.unstarted -= 1
        self._start_node(self.nodes[name], resubscribe=True)

    def _start_node(self, node: Node, resubscribe: bool) -> None:
        node.inc += 1
        node.gen += 1
        node.count = 0
        node.up = True
        node.flush_due = False
        node.depth_out = 0
        node.seen_inc = node.seen_seq = -1
        node.busy_until = self.now
        node.inbox = []
        node.drain_due = False
        node.seen_links = None
        if self.cluster_mode:
            node.core = self._build_core(node)  # the whole node, its engine started (cluster.py)
            e = node.engine = node.core.engine
        else:
            e = MeshEngine(
                node.name,
                node.inc,
                [f"{node.name}:1883"],
                self.settings,
                codec=self.decoding if self.sc.checks.shared_decoding else json,
                spf_timer=time.perf_counter,
            )
            node.engine = e
            e.start(self.now)
        for f in node.filters:
            self.dormant.remove(f, node.name)
        if not resubscribe:
            node.filters = []
        if node.inc > 1 or self.sc.workload.subscribe == "start":
            self._add_filters(node)
        self._want_flush(node)
        self._observe_own(node)
        self._at(self.now + self.rng_time.uniform(0, self.sc.node.tick), TICK, node.name, node.gen)
        self.phys_cache = None
        self.comp_dirty = True
        for link in node.links:
            self._link_check(link, startup=node.inc == 1)

    def _add_filters(self, node: Node) -> None:
        for f in node.filters:  # restored sessions come back after start, as in mesh_node
            node.engine.local_filter_added(f)
            self.truth.add(f, node.name, 0)
        if node.filters:
            self.dirty_interest.add(node.name)
            self._want_flush(node)

    def _clients_arrive(self) -> None:
        """workload.subscribe = "converged": every node's clients subscribe now."""
        self.subscribed = True
        self._disturb("initial subscriptions", "subscribe_all")
        for node in self.nodes.values():
            if node.up and node.inc == 1:
                node.depth_out = max(node.depth_out, 1)
                self._add_filters(node)

    def _crash(self, node: Node, how: str) -> None:
        self._unstall(node)
        if node.core is not None:
            self._cluster_crash(node, how)
        e = node.engine
        for k, v in e.counters.items():
            self.dead_counters[k] = self.dead_counters.get(k, 0) + v
        self.dead_spf[0] += e.counters["spf_runs"]
        self.dead_spf[1] += e.spf_seconds
        node.up = False
        node.engine = None
        node.down_since = self.now
        node.gen += 1
        self.dirty_interest.discard(node.name)
        for f in node.filters:
            self.truth.remove(f, node.name)
            self.dormant.add(f, node.name, 0)
        for link in node.links:
            self._break(link, "reset" if how == "kill" else "timeout")
            # (a link that broke before, whose end this node had not noticed yet: it never will,
            # and the link must be dialled again when the node restarts)
            link.side[node.name] = False
        self.phys_cache = None
        self.comp_dirty = True
        self.stale.pop(node.name, None)
        for s in self.stale.values():
            s.discard(node.name)

    def _want_flush(self, node: Node, later: bool = False) -> None:
        """A FLUSH of ``node`` at the end of this loop iteration, or (``later``) within
        mesh.batch_delay; a sooner one than the one due takes its place."""
        at = max(self.now, node.busy_until) + self.flush_delay + (self.batch_delay if later else 0.0)
        if node.flush_due and node.flush_at <= at:
            return
        node.flush_due = True
        node.flush_at = at
        self._at(at, FLUSH, node.name, node.gen)

    def _on_flush(self, name: str, gen: int) -> None:
        node = self.nodes[name]
        if not node.up or node.gen != gen:
            return
        if not node.flush_due or self.now < node.flush_at:
            return  # (one due later than another that came first: nothing left to wait for)
        if node.busy_until > self.now:  # still reading: the loop flushes once it is idle
            node.flush_at = node.busy_until
            self._at(node.busy_until, FLUSH, name, gen)
            return
        node.flush_due = False
        core = node.core
        if core is not None:
            core.flush(self.now)  # PeerLinks hands the sends to its SimLinks (sim/cluster.py)
            node.depth_out = 0
        else:
            self._dispatch(node, node.engine.flush(self.now))
        self.dirty_interest.discard(name)
        self._observe_own(node)

    def _on_tick(self, name: str, gen: int) -> None:
        node = self.nodes[name]
        if not node.up or node.gen != gen:
            return
        core = node.core
        if core is not None:
            self._cluster_tick(node)
            core.tick(self.now)
            node.depth_out = 0
        else:
            for msg in node.engine.release_held(self.now):  # (as PeerLinks.tick does)
                self._deliver(node, msg)
            self._dispatch(node, node.engine.tick(self.now))
        self._observe_own(node)
        self._at(self.now + self.sc.node.tick, TICK, name, gen)

    def _observe_own(self, node: Node) -> None:
        """Has this node's own advertised state changed in substance (not a mere refresh)?"""
        e = node.engine
        name = node.name
        r = e.routers[name]
        if r.seq != node.seen_seq or r.inc != node.seen_inc:
            if r.inc != node.seen_inc or r.links != node.seen_links:
                node.seen_links = dict(r.links)
                self.ckey_r[name] = (r.inc, r.seq)
                self._content_changed(name, "router", (r.inc, r.seq))
            node.seen_inc, node.seen_seq = r.inc, r.seq
        i = e.interests[name]
        if i is not node.seen_interest or i.ver != node.seen_seq_i:
            node.seen_interest, node.seen_seq_i = i, i.ver
            key = (i.inc, i.ver)
            if self.ckey_i.get(name) != key:
                self.ckey_i[name] = key
                self._content_changed(name, "interest", key)

    def _content_changed(self, name: str, what: str, version: tuple) -> None:
        self._disturb(f"{what} change at {name}", "change")
        self.episode.changed.setdefault((what, name), version)
        if not self.comp_dirty and name in self.comp:
            self.stale[name] = set(self.members[self.comp[name]]) - {name}


def run_scenario(scenario: Scenario, progress=None) -> Simulator:
    """Run ``scenario`` to its end; InvariantViolation if an invariant fails (checks.fail)."""
    return Simulator(scenario, progress).run()


__all__ += ["run_scenario", "InvariantViolation"]
