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
from collections import OrderedDict

from ..mesh import engine as engine_module
from ..mesh.engine import MeshEngine, MeshProtocolError
from ..message import Message
from ..topics import SubscriptionTrie
from .checks import InvariantViolation, Violations, dijkstra, tree_edges
from .observe import MsgRecord, read_envelope_heads
from .scenario import Fault, Scenario, ScenarioError
from .topology import build_topology
from .workload import TopicSpace

__all__ = ["Simulator", "Episode"]

(ARRIVE, FLUSH, TICK, PING, DIAL, DETECT, FAULT, PUBLISH, CHURN, CHECK, MSGCHECK, START,
 DRAIN, END) = range(14)

CONTROL = ("lsa", "dbsum", "lsreq", "cost", "e2e", "uni")
PROPAGATING = ("lsa", "dbsum", "lsreq", "cost")  # routing control: what a round of advertisement is made of
# episodes whose control traffic is attributed (advertisements parsed); not the start, whose
# traffic is all of it, nor spontaneous re-costing
ATTRIBUTED = ("link_down", "link_up", "crash", "restart", "partition", "heal", "latency", "subscription")


class SharedDecoding:
    """The ``json`` the engines of one simulation use: a payload decoded once for all its receivers.

    A node floods the same advertisements to several neighbours, so the same bytes arrive at
    several engines, and the same decoded advertisement is then flooded on by each of them;
    in one process both need doing once. This is safe because the engine only reads what it
    decodes and passes the same objects on to be encoded, unchanged: the simulator checks this
    with checks.shared_decoding = false giving the very same run (tests/sim). Results are
    exactly those of the json module.
    """

    def __init__(self, size: int = 16384):
        self._decoded: OrderedDict[bytes, object] = OrderedDict()
        self._encoded: OrderedDict[int, tuple] = OrderedDict()   # id(obj) -> (obj, text)
        self.size = size
        self.hits = 0
        self.misses = 0

    def loads(self, payload):
        cache = self._decoded
        hit = cache.get(payload)
        if hit is not None:
            self.hits += 1
            return hit
        self.misses += 1
        value = json.loads(payload)
        if len(cache) >= self.size:
            cache.popitem(last=False)  # the oldest: copies of a flush arrive within milliseconds
        cache[payload] = value
        return value

    def dumps(self, obj):
        if type(obj) is not dict:
            return json.dumps(obj)
        cache = self._encoded
        hit = cache.get(id(obj))
        if hit is not None and hit[0] is obj:  # held in the cache, so its id cannot be reused
            return hit[1]
        text = json.dumps(obj)
        if len(cache) >= self.size:
            cache.popitem(last=False)
        cache[id(obj)] = (obj, text)
        return text


class Node:
    __slots__ = ("name", "up", "inc", "engine", "filters", "gen", "count", "flush_due", "depth_out",
                 "seen_inc", "seen_seq", "seen_links", "seen_interest", "seen_seq_i", "links", "restarted_at", "down_since",
                 "busy_until", "inbox", "drain_due")

    def __init__(self, name: str):
        self.name = name
        self.up = False
        self.inc = 0
        self.engine: MeshEngine | None = None
        self.filters: list[str] = []
        self.gen = 0                  # bumps at every start: events of an earlier life are ignored
        self.count = 0                # messages published in this life
        self.flush_due = False
        self.depth_out = 0            # advertisement round to stamp on what the next flush sends
        self.seen_inc = self.seen_seq = -1
        self.seen_links: dict | None = None
        self.links: list["Link"] = []
        self.restarted_at = -1.0
        self.down_since = -1.0
        self.seen_interest = None
        self.seen_seq_i = -1
        self.busy_until = 0.0         # simulated CPU: the node handles nothing else before then
        self.inbox: list = []         # what arrived while it was busy, in order
        self.drain_due = False


class Link:
    __slots__ = ("a", "b", "latency", "admin", "conn", "alive", "side", "dial_due", "arrive", "free",
                 "established_at", "broken_at")

    def __init__(self, a: str, b: str, latency: float):
        self.a, self.b, self.latency = a, b, latency   # a < b: a dials
        self.admin = True             # false while a link_down fault holds it
        self.conn = 0                 # connection number: what travelled on an older one is gone
        self.alive = False            # a connection exists (handshaking or established)
        self.side = {a: False, b: False}  # that side's engine has the link up
        self.dial_due = False
        self.arrive = [0.0, 0.0]      # FIFO: last arrival time per direction (a->b, b->a)
        self.free = [0.0, 0.0]        # serialisation: the direction is busy until then
        self.established_at = -1.0
        self.broken_at = -1.0

    def peer(self, n: str) -> str:
        return self.b if n == self.a else self.a


class Episode:
    """From a disturbance (fault, subscription change) to the moment every engine agrees with reality."""

    def __init__(self, ident: int, cause: str, start: float, kind: str):
        self.id = ident
        self.cause = cause
        self.kind = kind
        self.causes = [cause]
        self.start = start
        self.detected: float | None = None    # first engine event caused by it
        self.end: float | None = None
        self.rounds = 0
        self.control_msgs = 0
        self.control_bytes = 0
        self.attributed_msgs = 0              # advertisement copies caused by this episode
        self.attributed_bytes = 0
        self.changed: dict[tuple[str, str], tuple] = {}   # ("router"|"interest", node) -> first version
        self.new_links: set[tuple[str, str]] = set()
        self.needles: list[bytes] = []
        self.spf_runs0 = self.spf_seconds0 = 0.0
        self.spf_runs = 0
        self.spf_seconds = 0.0
        self.lost = 0
        self.duplicates = 0
        self.messages = 0

    def as_dict(self, nodes: int) -> dict:
        d = {k: getattr(self, k) for k in ("id", "cause", "kind", "causes", "start", "detected", "end", "rounds",
                                           "control_msgs", "control_bytes", "attributed_msgs",
                                           "attributed_bytes", "spf_runs", "spf_seconds", "lost",
                                           "duplicates", "messages")}
        d["converged_after"] = None if self.end is None else self.end - self.start
        d["after_detection"] = None if self.end is None or self.detected is None else self.end - self.detected
        d["control_bytes_per_node"] = self.control_bytes / nodes
        d["attributed_bytes_per_node"] = self.attributed_bytes / nodes
        d["spf_ms_per_run"] = 1000 * self.spf_seconds / self.spf_runs if self.spf_runs else None
        d["changed"] = sorted(f"{k[0]}:{k[1]}" for k in self.changed)
        return d


class Simulator:
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
        subs = self.space.subscriptions(self.rng_work, self.names)
        for n, fs in subs.items():
            self.nodes[n].filters = list(fs)
        self.truth = SubscriptionTrie()       # the simulated clients' real subscriptions
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
        self.sent_by_node = {n: [0, 0] for n in self.names}          # control [messages, bytes]
        self.lost_transmissions = 0
        self.retransmissions = 0
        self.dead_sends = 0           # sent on a connection that was already broken
        self.not_ready_drops = 0      # arrived before the receiving side finished its hello
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
        self.epoch_cost: dict[str, dict] = {}      # source -> (dist, parent, hops) on routing costs
        self.epoch_latency: dict[str, dict] = {}   # source -> dist on latencies
        self.adj_cost: dict[str, dict[str, int]] | None = None
        self.route_checks = 0
        self.msg_checks = 0
        self.results_steady: list[tuple] = []      # (copies0, optimum, dests, qos) of checked messages
        self.stretch: list[float] = []
        self.cost_stretch: list[float] = []
        self.flush_delay = sc.node.flush_delay_ms / 1000.0
        self.cpu_msg = sc.node.cpu_us_per_message / 1e6
        self.cpu_byte = sc.node.cpu_us_per_kb / 1e6 / 1024
        self.settle = sc.checks.settle or self._default_settle()
        self.bin = max(0.05, sc.duration / 400)
        self.timeline: dict[int, list[int]] = {}   # time bin -> [control bytes, data bytes]
        self.node_sends: dict[str, int] = {}       # copies each node sent for checked messages
        self.checked_by_origin: dict[str, int] = {}
        self.wall_start = time.perf_counter()
        self.decoding = SharedDecoding()

    # ------------------------------------------------------------------ event queue

    def _at(self, t: float, *event) -> None:
        self._seq += 1
        heapq.heappush(self.heap, (t, self._seq) + event)

    def run(self) -> "Simulator":
        sc = self.sc
        self.unstarted = len(self.names)   # the start cannot converge before every node is up
        self.subscribed = sc.workload.subscribe == "start"
        for n in self.names:
            self._at(self.rng_time.uniform(0, sc.node.start_spread), START, n)
        for i, fault in enumerate(sc.faults):
            self._at(fault.at, FAULT, i)
        w = sc.workload
        if w.publish_rate > 0:
            publishers = [n for n in self.names if self.rng_pub.random() < w.publishers]
            for n in publishers:
                self._at(w.start + self.rng_pub.expovariate(w.publish_rate), PUBLISH, n)
        if w.churn > 0:
            for n in self.names:
                self._at(w.start + self.rng_pub.expovariate(w.churn), CHURN, n)
        self._at(sc.duration, END)
        self._disturb("start", "start")
        handlers = {ARRIVE: self._on_arrive, FLUSH: self._on_flush, TICK: self._on_tick, PING: self._on_ping,
                    DIAL: self._on_dial, DETECT: self._on_detect, FAULT: self._on_fault,
                    PUBLISH: self._on_publish, CHURN: self._on_churn, CHECK: self._on_check,
                    MSGCHECK: self._on_msgcheck, START: self._on_start, DRAIN: self._on_drain}
        heap = self.heap
        next_report = time.perf_counter() + 5.0
        saved_json = engine_module.json
        if sc.checks.shared_decoding:
            engine_module.json = self.decoding
        # A thousand engines hold tens of millions of objects; Python's cyclic collector would
        # walk all of them again and again (more than half the run time at 1,000 nodes). What
        # the engines build is freed by reference counting, so the young generations are
        # collected now and then and whatever survived is frozen out of later walks.
        collecting = gc.isenabled()
        gc.disable()
        gc.freeze()
        try:
            while heap:
                ev = heapq.heappop(heap)
                self.now = ev[0]
                if ev[2] == END:
                    break
                self.events += 1
                handlers[ev[2]](*ev[3:])
                if not self.events & 0x3ffff:
                    gc.collect(1)
                    gc.freeze()
                if self.progress is not None and not self.events & 1023 and time.perf_counter() > next_report:
                    next_report = time.perf_counter() + 5.0
                    self.progress(self._progress_line())
        finally:
            engine_module.json = saved_json
            gc.unfreeze()
            if collecting:
                gc.enable()
        self._finish()
        return self

    def _progress_line(self) -> str:
        ep = self.episode
        state = f"converging ({ep.cause}) since {ep.start:.2f}s" if ep else "converged"
        return (f"  t={self.now:8.3f}s  events={self.events:,}  {state}  "
                f"wall={time.perf_counter() - self.wall_start:.0f}s")

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
        e = MeshEngine(node.name, node.inc, [f"{node.name}:1883"], self.settings)
        e.spf_timer = time.perf_counter
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
        self.phys_cache = None
        self.comp_dirty = True
        self.stale.pop(node.name, None)
        for s in self.stale.values():
            s.discard(node.name)

    def _want_flush(self, node: Node) -> None:
        if not node.flush_due:
            node.flush_due = True
            self._at(max(self.now, node.busy_until) + self.flush_delay, FLUSH, node.name, node.gen)

    def _on_flush(self, name: str, gen: int) -> None:
        node = self.nodes[name]
        if not node.up or node.gen != gen:
            return
        if node.busy_until > self.now:  # still reading: the loop flushes once it is idle
            self._at(node.busy_until, FLUSH, name, gen)
            return
        node.flush_due = False
        self._dispatch(node, node.engine.flush(self.now))
        self.dirty_interest.discard(name)
        self._observe_own(node)

    def _on_tick(self, name: str, gen: int) -> None:
        node = self.nodes[name]
        if not node.up or node.gen != gen:
            return
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

    # ------------------------------------------------------------------ links

    def _avail(self, link: Link) -> bool:
        """The path exists: both nodes up, no fault holds the link, same side of any partition."""
        if not link.admin or not self.nodes[link.a].up or not self.nodes[link.b].up:
            return False
        part = self.partition
        return not part or part.get(link.a, -1) == part.get(link.b, -1)

    def _link_check(self, link: Link, startup: bool = False, backoff: bool = True) -> None:
        """Schedule a dial when the path is there and both sides have let the old connection go."""
        if link.alive or link.dial_due or not self._avail(link):
            return
        if link.side[link.a] or link.side[link.b]:
            return  # one side has not noticed the old connection died yet
        link.dial_due = True
        if startup:
            delay = self.rng_time.uniform(0, 0.2)
        elif backoff:
            delay = self.rng_time.uniform(0, self.sc.node.redial_max)   # somewhere in the backoff
        else:
            delay = 0.05 + 0.1 * self.rng_time.random()  # Dialer: right after a connection ends
        self._at(self.now + delay, DIAL, link.a, link.b)

    def _on_dial(self, a: str, b: str) -> None:
        link = self.links[(a, b)]
        link.dial_due = False
        if link.alive or not self._avail(link) or link.side[a] or link.side[b]:
            return
        link.conn += 1
        link.alive = True
        link.arrive = [0.0, 0.0]
        link.free = [0.0, 0.0]
        # TCP, CONNECT/CONNACK, SUBSCRIBE/SUBACK, then the dialler's hello reaches the acceptor
        lat = link.latency
        t = self.now + 2 * lat * self.sc.node.handshake_rtts + lat
        link.arrive[0] = t
        self.sent["hello"][0] += 1
        self._at(t, ARRIVE, a, b, "hello", b"", link.conn, None)

    def _break(self, link: Link, detection: str) -> None:
        """The connection dies now; each live side notices later (reset: one latency; else keepalive)."""
        if not link.alive:
            return
        link.conn += 1
        link.alive = False
        link.broken_at = self.now
        ka = self.sc.node.keepalive
        for x in (link.a, link.b):
            if not link.side[x]:
                continue
            if not self.nodes[x].up:
                link.side[x] = False
                continue
            if detection == "reset":
                delay = link.latency + 0.001
            else:
                # silent for 3 x keepalive since the last packet heard, which was up to one
                # keepalive ago; noticed at the next tick (LinkClient.tick, server keepalive)
                delay = 3 * ka - self.rng_time.uniform(0, ka) + self.rng_time.uniform(0, self.sc.node.tick)
            self._at(self.now + delay, DETECT, x, link.a, link.b, link.conn)
        self.comp_dirty = True

    def _on_detect(self, x: str, a: str, b: str, conn: int) -> None:
        link = self.links[(a, b)]
        node = self.nodes[x]
        if not link.side[x] or link.conn != conn or not node.up:
            return
        link.side[x] = False
        self._note_detection()
        node.engine.link_down(link.peer(x), self.now)
        node.depth_out = max(node.depth_out, 1)
        self._observe_own(node)
        self._want_flush(node)
        self.comp_dirty = True
        self._link_check(link, backoff=not self._avail(link))

    def _note_detection(self) -> None:
        if self.episode is not None and self.episode.detected is None:
            self.episode.detected = self.now

    def _send(self, node: Node, peer: str, kind: str, payload: bytes, qos: int) -> None:
        name = node.name
        key = (name, peer) if name < peer else (peer, name)
        link = self.links[key]
        size = len(payload)
        slot = self.timeline.get(int(self.now / self.bin))
        if slot is None:
            slot = self.timeline[int(self.now / self.bin)] = [0, 0]
        slot[kind == "fwd"] += size
        counter = self.sent[kind]
        counter[0] += 1
        counter[1] += size
        heads = None
        if kind == "fwd":
            heads = read_envelope_heads(payload)
            for origin, seq, attempt, _hops, dests in heads:
                rec = self.msgs.get((origin, seq))
                if rec is not None:
                    rec.copies += 1
                    if attempt == 0:
                        if origin == name:
                            rec.engine_dests.update(dests)
        elif kind in PROPAGATING:  # routing control (end-to-end acks and unicasts are data plane)
            mine = self.sent_by_node[name]
            mine[0] += 1
            mine[1] += size
            ep = self.episode
            if ep is not None:
                ep.control_msgs += 1
                ep.control_bytes += size
                if ep.kind in ATTRIBUTED and self.sc.checks.attribute:
                    self._attribute(ep, link, kind, payload)
            else:
                self.steady_control_bytes += size
        if not link.alive or not link.side[name]:
            self.dead_sends += 1
            self._lost(heads)
            return
        d = 0 if name == link.a else 1
        start = self.now
        bw = self.sc.topology.bandwidth_mbps
        if bw > 0:
            start = max(start, link.free[d])
            link.free[d] = start + size * 8 / (bw * 1e6)
            start = link.free[d]
        arrival = max(start + link.latency, link.arrive[d])
        link.arrive[d] = arrival
        loss = self.sc.topology.loss
        if loss and self.rng_loss.random() < loss:
            self.lost_transmissions += 1
            if qos == 0:
                self._lost(heads)
                return
            # QoS 1 on the link: the sender's MQTT session sends it again until it gets through;
            # later messages are not held back behind it (see docs/simulation.md)
            tries = 1
            while tries < 100 and self.rng_loss.random() < loss:
                tries += 1
            self.retransmissions += tries
            arrival += tries * self.sc.topology.retransmit_ms / 1000.0
        meta = heads if heads is not None else (
            (self.episode.id, node.depth_out) if self.episode is not None and node.depth_out and
            kind in PROPAGATING else None)
        self._at(arrival, ARRIVE, name, peer, kind, payload, link.conn, meta)

    def _lost(self, heads) -> None:
        if heads:
            for origin, seq, _a, _h, _d in heads:
                rec = self.msgs.get((origin, seq))
                if rec is not None:
                    rec.lost_copies += 1

    def _attribute(self, ep: Episode, link: Link, kind: str, payload: bytes) -> None:
        """Count what this control message carries for the episode (not refreshes of unchanged state)."""
        if (link.a, link.b) in ep.new_links or kind != "lsa":
            ep.attributed_msgs += 1
            ep.attributed_bytes += len(payload)
            return
        if not ep.changed:
            return
        if len(ep.needles) != len(ep.changed):
            ep.needles = [f'"node": "{name}"'.encode() for _what, name in ep.changed]
        if len(ep.needles) <= 32:  # cheap test first: most advertisements are about someone else
            for needle in ep.needles:
                if needle in payload:
                    break
            else:
                return
        hit = False
        for lsa in json.loads(payload):
            t = lsa.get("t")
            first = ep.changed.get((t, lsa.get("node")))
            if first is None:
                continue
            version = (lsa.get("inc"), lsa.get("seq") if t == "router" else lsa.get("ver"))
            if version >= first:
                hit = True
                ep.attributed_bytes += len(json.dumps(lsa)) + 2
        if hit:
            ep.attributed_msgs += 1

    def _dispatch(self, node: Node, actions: list) -> None:
        cost = 0.0
        for action in actions:
            if action[0] == "send":
                self._send(node, action[1], action[2], action[3], action[4])
                cost += self.cpu_msg + len(action[3]) * self.cpu_byte
        node.depth_out = 0
        if cost:
            node.busy_until = max(node.busy_until, self.now) + cost

    def _on_arrive(self, src: str, dst: str, kind: str, payload: bytes, conn: int, meta) -> None:
        node = self.nodes[dst]
        if not node.up:
            return
        if node.busy_until > self.now or node.inbox:
            # the node is busy: the message waits in the socket, and the next loop iteration
            # reads everything that waits (a batch), then flushes once
            node.inbox.append((src, kind, payload, conn, meta))
            if not node.drain_due:
                node.drain_due = True
                self._at(node.busy_until, DRAIN, dst, node.gen)
            return
        self._process(node, src, kind, payload, conn, meta)

    def _on_drain(self, name: str, gen: int) -> None:
        node = self.nodes[name]
        if not node.up or node.gen != gen:
            return
        if node.busy_until > self.now:
            self._at(node.busy_until, DRAIN, name, gen)
            return
        node.drain_due = False
        inbox, node.inbox = node.inbox, []
        for src, kind, payload, conn, meta in inbox:
            if not node.up:
                break
            self._process(node, src, kind, payload, conn, meta)

    def _process(self, node: Node, src: str, kind: str, payload: bytes, conn: int, meta) -> None:
        dst = node.name
        key = (src, dst) if src < dst else (dst, src)
        link = self.links[key]
        if link.conn != conn:
            return
        node.busy_until = max(node.busy_until, self.now) + self.cpu_msg + len(payload) * self.cpu_byte
        if kind == "hello":
            self._hello(link, node, src)
            return
        if not link.side[dst]:
            self.not_ready_drops += 1  # mesh_node drops what comes before the hello completes
            return
        e = node.engine
        before = e.changes
        try:
            actions = e.receive(src, kind, payload, self.now)
        except MeshProtocolError as exc:
            self.violations.add("wire", f"t={self.now:.4f}s {dst} could not read a {kind!r} from {src}: {exc}")
            return
        if kind == "fwd":
            for origin, seq, attempt, _hops, dests in meta:
                rec = self.msgs.get((origin, seq))
                if rec is not None:
                    if rec.receipts is not None:
                        rec.receipts.append((dst, src, attempt, dests))
                    pred = rec.pred
                    for d in dests:  # per destination: one relay may get copies from two sides
                        if (dst, d) not in pred:
                            pred[(dst, d)] = src
        for action in actions:
            if action[0] == "deliver":
                self._deliver(node, action[1], action[2])
        if meta is not None and kind != "fwd":
            ep_id, depth = meta
            ep = self.episode
            if ep is not None and ep.id == ep_id:
                if e.changes != before:
                    ep.rounds = max(ep.rounds, depth)
                    node.depth_out = max(node.depth_out, depth + 1)
                elif kind in ("dbsum", "lsreq"):
                    node.depth_out = max(node.depth_out, depth + 1)  # it asks for an answer
        self._observe_own(node)
        self._want_flush(node)

    def _hello(self, link: Link, node: Node, src: str) -> None:
        name = node.name
        if link.side[name]:
            return
        link.side[name] = True
        node.engine.link_up(src, self.now)
        node.depth_out = max(node.depth_out, 1)
        if name == link.b:
            # the acceptor answers with its own hello, ahead of anything else on the connection
            t = max(self.now + link.latency, link.arrive[1])
            link.arrive[1] = t
            self.sent["hello"][0] += 1
            self._at(t, ARRIVE, name, src, "hello", b"", link.conn, None)
        else:
            link.established_at = self.now
            self._note_detection()
            if self.episode is not None:
                self.episode.new_links.add((link.a, link.b))
            self._at(self.now + self.sc.node.keepalive, PING, link.a, link.b, link.conn)
        self.comp_dirty = True
        self._observe_own(node)
        self._want_flush(node)

    def _on_ping(self, a: str, b: str, conn: int) -> None:
        """A PINGRESP came back: the dialling side gets an RTT sample, as LinkClient reports it."""
        link = self.links[(a, b)]
        if link.conn != conn or not link.side[a] or not link.side[b]:
            return
        node = self.nodes[a]
        rtt = 2 * link.latency
        jitter = self.sc.node.rtt_jitter
        if jitter:
            rtt *= 1 + jitter * self.rng_time.uniform(-1, 1)
        before = node.engine.routers[a].seq
        node.engine.link_rtt(b, rtt * 1e6, self.now)
        if node.engine.routers[a].seq != before:  # the cost moved enough to be re-advertised
            node.depth_out = max(node.depth_out, 1)
        self._observe_own(node)
        self._want_flush(node)
        self._at(self.now + self.sc.node.keepalive, PING, a, b, conn)

    # ------------------------------------------------------------------ clients

    def _deliver(self, node: Node, msg: Message, needs_ack: bool) -> None:
        rec = self.msgs.get((msg.origin, msg.seq))
        if rec is not None:
            name = node.name
            rec.delivered[name] = rec.delivered.get(name, 0) + 1
            if name not in rec.first_at:
                rec.first_at[name] = self.now
                if self.now > rec.t + self.settle:
                    rec.late += 1
        if needs_ack:
            node.engine.delivered(msg)  # the simulated store commits at once

    def _on_publish(self, name: str) -> None:
        node = self.nodes[name]
        w = self.sc.workload
        if self.now < self.sc.duration - self.sc.drain:
            self._at(self.now + self.rng_pub.expovariate(w.publish_rate), PUBLISH, name)
        if not node.up:
            return
        node.count += 1
        topic = self.space.topic(self.rng_pub, name)
        qos = self.space.qos(self.rng_pub)
        seq = (node.inc << 32) + node.count  # as server/node.py: unique across restarts
        msg = Message(topic, self.payload, qos, False, name, seq, f"c-{name}", self.now)
        wanted = self.truth.match(topic)
        reach = self._physical_component(name)
        expected = frozenset(n for n in wanted if n != name and n in reach)
        rec = MsgRecord(name, seq, topic, qos, self.now, expected, self.episode is None)
        if qos:
            # QoS 1/2: the origin keeps custody for subscribers it cannot reach now (the other side
            # of a partition, a crashed node whose sessions persist) and may deliver after the heal
            rec.dormant = frozenset(n for n in wanted if n != name and n not in reach) | \
                frozenset(self.dormant.match(topic))
        self.msgs[(name, seq)] = rec
        node.engine.route_local(msg, self.now)
        self._want_flush(node)
        self._at(self.now + self.settle, MSGCHECK, name, seq)

    def _on_churn(self, name: str) -> None:
        node = self.nodes[name]
        if self.now < self.sc.duration - self.sc.drain:
            self._at(self.now + self.rng_pub.expovariate(self.sc.workload.churn), CHURN, name)
        if not node.up:
            return
        if node.filters and self.rng_pub.random() < 0.5:
            self._unsubscribe(node, self.rng_pub.choice(node.filters), "churn")
        else:
            self._subscribe(node, self.space.topic_filter(self.rng_pub), "churn")

    def _subscribe(self, node: Node, topic_filter: str, cause: str) -> None:
        if topic_filter in node.filters:
            return
        self._disturb(cause, "subscription")
        node.filters.append(topic_filter)
        self.truth.add(topic_filter, node.name, 0)
        node.engine.local_filter_added(topic_filter)
        self._interest_changed(node)

    def _unsubscribe(self, node: Node, topic_filter: str, cause: str) -> None:
        if topic_filter not in node.filters:
            return
        self._disturb(cause, "subscription")
        node.filters.remove(topic_filter)
        self.truth.remove(topic_filter, node.name)
        node.engine.local_filter_removed(topic_filter)
        self._interest_changed(node)

    def _interest_changed(self, node: Node) -> None:
        self.dirty_interest.add(node.name)
        node.depth_out = max(node.depth_out, 1)
        self._note_detection()
        self._want_flush(node)

    # ------------------------------------------------------------------ faults

    def _on_fault(self, i: int) -> None:
        fault = self.sc.faults[i]
        label = fault.label or self._fault_label(fault)
        p = fault.params
        kind = fault.kind
        if kind == "link_down":
            link = self._pick_link(p.get("link", "random"), want_up=True, label=label)
            label = fault.label or f"link_down {link.a}-{link.b}"
            self._disturb(label, kind)
            link.admin = False
            self._break(link, "timeout")
        elif kind == "link_up":
            link = self._pick_link(p.get("link", "random"), want_up=False, label=label)
            label = fault.label or f"link_up {link.a}-{link.b}"
            self._disturb(label, kind)
            link.admin = True
            self._link_check(link)
        elif kind == "crash":
            node = self._pick_node(p.get("node", "random"), want_up=True, label=label)
            label = fault.label or f"crash {node.name} ({p.get('how', 'kill')})"
            self._disturb(label, kind)
            self._crash(node, p.get("how", "kill"))
        elif kind == "restart":
            node = self._pick_node(p.get("node", "last"), want_up=False, label=label)
            label = fault.label or f"restart {node.name}"
            self._disturb(label, kind)
            node.restarted_at = self.now
            resub = p.get("resubscribe", self.sc.workload.resubscribe)
            if not isinstance(resub, bool):
                raise ScenarioError(f"{label}: resubscribe must be true or false")
            self._start_node(node, resubscribe=resub)
        elif kind == "partition":
            groups = self._partition_groups(p, label)
            self._disturb(label, kind)
            self.partition = {n: gi for gi, g in enumerate(groups) for n in g}
            for link in self.links.values():
                if link.alive and not self._avail(link):
                    self._break(link, "timeout")
            self.phys_cache = None
        elif kind == "heal":
            self._disturb(label, kind)
            self.partition = {}
            for link in self.links.values():
                self._link_check(link)
            self.phys_cache = None
        elif kind == "latency":
            link = self._pick_link(p.get("link", "random"), want_up=None, label=label)
            label = fault.label or f"latency {link.a}-{link.b} {p['latency_ms']}ms"
            self._disturb(label, kind)
            link.latency = float(p["latency_ms"]) / 1000.0
        elif kind in ("subscribe", "unsubscribe"):
            node = self._pick_node(p.get("node", "random"), want_up=True, label=label)
            f = p.get("filter", "random")
            if kind == "subscribe":
                if f == "random":
                    for _ in range(100):
                        f = self.space.topic_filter(self.rng_fault)
                        if f not in node.filters:
                            break
                self._subscribe(node, f, fault.label or f"subscribe {node.name} {f}")
            else:
                if f == "random":
                    if not node.filters:
                        raise ScenarioError(f"{label}: {node.name} has no subscription to remove")
                    f = self.rng_fault.choice(node.filters)
                self._unsubscribe(node, f, fault.label or f"unsubscribe {node.name} {f}")
        self.phys_cache = None if kind in ("link_down", "link_up", "crash", "restart") else self.phys_cache

    @staticmethod
    def _fault_label(f: Fault) -> str:
        return f"{f.kind} " + " ".join(f"{k}={v}" for k, v in sorted(f.params.items()))

    def _pick_link(self, spec, want_up, label) -> Link:
        if spec != "random":
            a, b = sorted(spec)
            link = self.links.get((a, b))
            if link is None:
                raise ScenarioError(f"{label}: there is no link {a}-{b}")
            return link
        if want_up is False:
            down = [l for l in self.links.values() if not l.admin]
            if not down:
                raise ScenarioError(f"{label}: no link is down")
            return down[-1] if len(down) == 1 else self.rng_fault.choice(down)
        live = [l for l in self.links.values() if l.alive and l.side[l.a] and l.side[l.b]]
        if not live:
            raise ScenarioError(f"{label}: no live link")
        if want_up is None:
            return self.rng_fault.choice(live)
        # prefer a link whose loss leaves the mesh connected: a reroute, not a partition
        for _ in range(50):
            link = self.rng_fault.choice(live)
            if self._connected_without(link=link):
                return link
        return self.rng_fault.choice(live)

    def _pick_node(self, spec, want_up, label) -> Node:
        if spec == "last":
            down = sorted((n for n in self.nodes.values() if not n.up), key=lambda n: n.down_since)
            if not down:
                raise ScenarioError(f"{label}: no node is down")
            return down[-1]
        if spec != "random":
            node = self.nodes.get(spec)
            if node is None:
                raise ScenarioError(f"{label}: there is no node {spec!r}")
            if node.up != want_up:
                raise ScenarioError(f"{label}: {spec} is {'down' if want_up else 'up'} at {self.now}s")
            return node
        cands = [n for n in self.nodes.values() if n.up == want_up]
        if not cands:
            raise ScenarioError(f"{label}: no candidate node")
        for _ in range(50):
            node = self.rng_fault.choice(cands)
            if not want_up or self._connected_without(node=node):
                return node
        return self.rng_fault.choice(cands)

    def _connected_without(self, link: Link | None = None, node: Node | None = None) -> bool:
        alive = [n for n in self.names if self.nodes[n].up and (node is None or n != node.name)]
        if not alive:
            return False
        adj: dict[str, list[str]] = {n: [] for n in alive}
        for l in self.links.values():
            if l is link or not (l.alive and l.side[l.a] and l.side[l.b]):
                continue
            if l.a in adj and l.b in adj:
                adj[l.a].append(l.b)
                adj[l.b].append(l.a)
        seen = {alive[0]}
        stack = [alive[0]]
        while stack:
            for v in adj[stack.pop()]:
                if v not in seen:
                    seen.add(v)
                    stack.append(v)
        return len(seen) == len(alive)

    def _partition_groups(self, p: dict, label: str) -> list[list[str]]:
        if "groups" in p:
            groups = p["groups"]
            if not isinstance(groups, list) or not all(isinstance(g, list) for g in groups):
                raise ScenarioError(f"{label}: groups must be a list of lists of node names")
            listed = [n for g in groups for n in g]
            unknown = [n for n in listed if n not in self.nodes]
            if unknown:
                raise ScenarioError(f"{label}: unknown nodes {unknown}")
            rest = [n for n in self.names if n not in set(listed)]
            return [list(g) for g in groups] + ([rest] if rest else [])
        if "isolate" in p:
            iso = p["isolate"]
            if not isinstance(iso, list) or any(n not in self.nodes for n in iso):
                raise ScenarioError(f"{label}: isolate must be a list of node names")
            return [list(iso), [n for n in self.names if n not in set(iso)]]
        if "isolate_site" in p:
            site = p["isolate_site"]
            members = [n for n, s in self.graph.site_of.items() if s == site]
            if not members:
                raise ScenarioError(f"{label}: no site {site!r} (the topology has sites 0..{self.sc.topology.sites - 1})")
            return [members, [n for n in self.names if n not in set(members)]]
        # half: grow a connected half from a random node
        start = self.rng_fault.choice(self.names)
        half = {start}
        frontier = [start]
        while frontier and len(half) < len(self.names) // 2:
            u = frontier.pop(0)
            for l in self.nodes[u].links:
                v = l.peer(u)
                if v not in half and len(half) < len(self.names) // 2:
                    half.add(v)
                    frontier.append(v)
        return [sorted(half), [n for n in self.names if n not in half]]

    # ------------------------------------------------------------------ convergence

    def _disturb(self, cause: str, kind: str) -> None:
        self.last_disturbance = self.now
        ep = self.episode
        if ep is not None:
            if kind != "change" and cause not in ep.causes:
                ep.causes.append(cause)
                if ep.kind == "change":  # a fault explains what looked like a spontaneous change
                    ep.kind, ep.cause = kind, cause
            return
        if self.steady_since is not None:
            self.steady_time += self.now - self.steady_since
            self.steady_since = None
        ep = Episode(len(self.episodes) + 1, cause, self.now, kind)
        runs, secs = self._spf_totals()
        ep.spf_runs0, ep.spf_seconds0 = runs, secs
        self.episode = ep
        self.episodes.append(ep)
        self._at(self.now + self.sc.checks.resolution, CHECK)

    def _spf_totals(self) -> tuple[int, float]:
        runs, secs = self.dead_spf
        for node in self.nodes.values():
            if node.up:
                runs += node.engine.counters["spf_runs"]
                secs += node.engine.spf_seconds
        return runs, secs

    def _on_check(self) -> None:
        ep = self.episode
        if ep is None:
            return
        if not self._converged():
            self._at(self.now + self.sc.checks.resolution, CHECK)
            return
        ep.end = self.now
        runs, secs = self._spf_totals()
        ep.spf_runs, ep.spf_seconds = runs - ep.spf_runs0, secs - ep.spf_seconds0
        self.episode = None
        self.steady_since = self.now
        if not self.subscribed:
            self._clients_arrive()
        self.epoch_cost = {}
        self.epoch_latency = {}
        self.adj_cost = None
        self._check_routes(ep)
        if self.progress is not None and ep.kind != "change":
            self.progress(f"  t={self.now:8.3f}s  converged after {ep.cause}: {ep.end - ep.start:.3f}s, "
                          f"{ep.rounds} rounds")

    def _recompute_components(self) -> None:
        parent = {n: n for n in self.names if self.nodes[n].up}

        def find(x):
            while parent[x] != x:
                parent[x] = parent[parent[x]]
                x = parent[x]
            return x
        for link in self.links.values():
            if link.side[link.a] and link.side[link.b] and link.a in parent and link.b in parent:
                ra, rb = find(link.a), find(link.b)
                if ra != rb:
                    parent[ra] = rb
        comp = {n: find(n) for n in parent}
        members: dict[str, list[str]] = {}
        for n, r in comp.items():
            members.setdefault(r, []).append(n)
        self.comp, self.members = comp, members
        self.stale = {m: set(members[comp[m]]) - {m} for m in comp if len(members[comp[m]]) > 1}
        self.comp_dirty = False

    def _converged(self) -> bool:
        if self.dirty_interest or self.unstarted:
            return False
        last = self.last_unsettled
        if last is not None and not self._settled(last):
            return False
        for link in self.links.values():
            if not self._settled(link):
                self.last_unsettled = link
                return False
        self.last_unsettled = None
        if self.comp_dirty:
            self._recompute_components()
        nodes = self.nodes
        for m in list(self.stale):
            waiting = self.stale[m]
            for n in list(waiting):
                if not self._up_to_date(nodes[n].engine, m):
                    return False
                waiting.discard(n)
            del self.stale[m]
        return True

    def _up_to_date(self, e: MeshEngine, m: str) -> bool:
        """Does engine ``e`` route as if it knew ``m``'s current links and filters?"""
        r = e.routers.get(m)
        if r is None or (r.inc, r.seq) < self.ckey_r[m]:
            return False
        i = e.interests.get(m)
        if i is not None and (i.inc, i.ver) == self.ckey_i[m]:
            return True
        # another version (or none) of the same filters routes the same way
        mine = self.nodes[m].engine.interests[m].filters
        return (i.filters if i is not None else ()) == mine

    def _why_unconverged(self) -> str:
        """The first disagreement between an engine and reality, in words."""
        if self.dirty_interest or self.unstarted:
            return "local subscription changes not advertised yet"
        for link in self.links.values():
            if not self._settled(link):
                return (f"link {link.a}-{link.b} is {'available' if self._avail(link) else 'unavailable'} "
                        f"but its ends have it {'up' if link.side[link.a] else 'down'}/"
                        f"{'up' if link.side[link.b] else 'down'}")
        if self.comp_dirty:
            self._recompute_components()
        for m, waiting in self.stale.items():
            for n in sorted(waiting):
                e = self.nodes[n].engine
                r, i = e.routers.get(m), e.interests.get(m)
                have_r = (r.inc, r.seq) if r else None
                have_i = (i.inc, i.ver) if i else None
                if not self._up_to_date(e, m):
                    return (f"{n} holds {m}'s router advertisement {have_r} and interest {have_i}; "
                            f"{m} advertises router {self.ckey_r[m]} and interest {self.ckey_i[m]}")
        return "unknown"

    def _settled(self, link: Link) -> bool:
        established = link.side[link.a] and link.side[link.b]
        if self._avail(link):
            return established and link.alive
        return not link.side[link.a] and not link.side[link.b]

    def _routing_adj(self) -> dict[str, dict[str, int]]:
        """The real graph for routing: established links, each direction at the cost its origin advertises."""
        if self.adj_cost is None:
            adj: dict[str, dict[str, int]] = {n: {} for n in self.names if self.nodes[n].up}
            for link in self.links.values():
                if link.side[link.a] and link.side[link.b]:
                    for u, v in ((link.a, link.b), (link.b, link.a)):
                        cost = self.nodes[u].engine.routers[u].links.get(v)
                        if cost is None:
                            self.violations.add("routes", f"t={self.now:.4f}s {u} has the link to {v} up "
                                                          f"but does not advertise it")
                            continue
                        adj[u][v] = max(cost, 1)
            self.adj_cost = adj
        return self.adj_cost

    def _dist(self, source: str):
        hit = self.epoch_cost.get(source)
        if hit is None:
            hit = self.epoch_cost[source] = dijkstra(source, self._routing_adj())
        return hit

    def _latency_dist(self, source: str):
        hit = self.epoch_latency.get(source)
        if hit is None:
            adj: dict[str, dict[str, float]] = {n: {} for n in self.names if self.nodes[n].up}
            for link in self.links.values():
                if link.side[link.a] and link.side[link.b]:
                    adj[link.a][link.b] = link.latency
                    adj[link.b][link.a] = link.latency
            hit = self.epoch_latency[source] = dijkstra(source, adj)[0]
        return hit

    def _check_routes(self, ep: Episode) -> None:
        """Every engine's next hops against Dijkstra on the real graph (routes of a sample at scale)."""
        up = [n for n in self.names if self.nodes[n].up]
        sample = up
        if self.sc.checks.routes and self.sc.checks.routes < len(up):
            sample = sorted(random.Random(f"{self.sc.seed}/routes/{ep.id}").sample(up, self.sc.checks.routes))
        adj = self._routing_adj()
        hop_limit = self.settings.hop_limit
        v = self.violations
        for n in sample:
            self.route_checks += 1
            e = self.nodes[n].engine
            e.route_to(n)  # lets the engine run its (lazy) SPF now
            dist, _parent, hops = self._dist(n)
            reach = set(self.members[self.comp[n]]) - {n}
            got = set(e.next_hop)
            if got != reach:
                missing, extra = sorted(reach - got)[:5], sorted(got - reach)[:5]
                v.add("routes", f"t={self.now:.4f}s after '{ep.cause}': {n} routes to the wrong set of "
                                f"nodes (missing {missing}, unreachable but routed {extra})")
                continue
            for d in reach:
                if e.distance.get(d) != dist[d]:
                    v.add("routes", f"t={self.now:.4f}s after '{ep.cause}': {n} thinks {d} is at "
                                    f"{e.distance.get(d)}, the shortest path costs {dist[d]}")
                    break
                h = e.next_hop[d]
                if h not in adj[n] or adj[n][h] + self._dist(h)[0].get(d, float("inf")) != dist[d]:
                    v.add("routes", f"t={self.now:.4f}s after '{ep.cause}': {n} sends to {d} via {h}, "
                                    f"which is not on a shortest path")
                    break
                if hops[d] > hop_limit:
                    v.add("hop_limit", f"the shortest path {n} -> {d} has {hops[d]} hops, more than "
                                       f"hop_limit ({hop_limit}): raise [engine] hop_limit for this topology")
                    break

    # ------------------------------------------------------------------ message checks

    def _default_settle(self) -> float:
        """Long enough for any message to reach any node: twice a latency eccentricity, plus slack."""
        adj: dict[str, dict[str, float]] = {n: {} for n in self.names}
        for (a, b), lat in self.graph.latency.items():
            adj[a][b] = adj[b][a] = lat
        ecc = max(dijkstra(self.names[0], adj)[0].values())
        hops = max(dijkstra(self.names[0], {u: {v: 1 for v in vs} for u, vs in adj.items()})[0].values())
        settle = 0.2 + 4 * ecc + 2 * hops * self.sc.node.flush_delay_ms / 1000.0
        if self.sc.topology.loss:
            settle += 3 * self.sc.topology.retransmit_ms / 1000.0
        return settle

    def _on_msgcheck(self, origin: str, seq: int) -> None:
        rec = self.msgs[(origin, seq)]
        receipts, rec.receipts = rec.receipts, None
        # steady: converged when published and nothing disturbed the mesh since
        if not rec.steady or self.episode is not None or self.last_disturbance > rec.t:
            rec.steady = False
            return
        if not self.nodes[origin].up:
            rec.steady = False
            return
        rec.checked = True
        self.msg_checks += 1
        v = self.violations
        where = f"message {origin}:{seq & 0xffffffff} on {rec.topic!r} (QoS {rec.qos}, t={rec.t:.4f}s)"
        if rec.engine_dests != set(rec.expected):
            missing = sorted(set(rec.expected) - rec.engine_dests)[:5]
            extra = sorted(rec.engine_dests - set(rec.expected))[:5]
            v.add("interest", f"{where}: the origin chose the wrong destinations (missing {missing}, "
                              f"without a subscriber {extra})")
        adj = self._routing_adj()
        seen = set()
        copies0 = 0
        self.checked_by_origin[origin] = self.checked_by_origin.get(origin, 0) + 1
        sends = self.node_sends
        for to, frm, attempt, dests in receipts:
            if attempt == 0:
                copies0 += 1
                sends[frm] = sends.get(frm, 0) + 1
            extra = [d for d in dests if d not in rec.expected]
            if extra:
                v.add("no_interest", f"{where}: {to} received a copy for {extra[:5]}, which have no "
                                     f"subscriber for it")
            dist_frm = self._dist(frm)[0]
            dist_to = self._dist(to)[0]
            for d in dests:
                if (to, attempt, d) in seen:
                    v.add("loop", f"{where}: {to} received the copy for {d} twice (attempt {attempt})")
                seen.add((to, attempt, d))
                if adj[frm].get(to, float("inf")) + dist_to.get(d, float("inf")) != dist_frm.get(d):
                    v.add("path", f"{where}: {frm} sent the copy for {d} to {to}, which is not on a "
                                  f"shortest path")
        if rec.expected:
            _dist, parent, _hops = self._dist(origin)
            optimum = len(tree_edges(origin, parent, rec.expected))
            self.results_steady.append((copies0, optimum, len(rec.expected), rec.qos))
            lat = self._latency_dist(origin)
            for d in rec.expected:
                if (d, d) not in rec.pred:
                    continue
                total = 0.0
                node = d
                for _ in range(len(self.names)):
                    if node == origin:
                        break
                    prev = rec.pred.get((node, d))
                    if prev is None:
                        break
                    key = (prev, node) if prev < node else (node, prev)
                    total += self.links[key].latency
                    node = prev
                if node == origin and lat.get(d):
                    self.stretch.append(total / lat[d])

    # ------------------------------------------------------------------ the end

    def _physical_component(self, name: str) -> frozenset:
        if self.phys_cache is None:
            parent = {n: n for n in self.names if self.nodes[n].up}

            def find(x):
                while parent[x] != x:
                    parent[x] = parent[parent[x]]
                    x = parent[x]
                return x
            for link in self.links.values():
                if link.a in parent and link.b in parent and self._avail(link):
                    ra, rb = find(link.a), find(link.b)
                    if ra != rb:
                        parent[ra] = rb
            groups: dict[str, set] = {}
            for n in parent:
                groups.setdefault(find(n), set()).add(n)
            frozen = {r: frozenset(g) for r, g in groups.items()}
            self.phys_cache = {n: frozen[find(n)] for n in parent}
        return self.phys_cache.get(name, frozenset())

    def _finish(self) -> None:
        if self.steady_since is not None:
            self.steady_time += self.now - self.steady_since
        v = self.violations
        ep = self.episode
        if ep is not None and self.now - self.last_disturbance > self.sc.checks.max_convergence:
            v.add("convergence", f"still not converged at the end ({self.now:.1f}s), "
                                 f"{self.now - self.last_disturbance:.1f}s after the last disturbance "
                                 f"(episode '{ep.cause}' since {ep.start:.2f}s): {self._why_unconverged()}")
        episodes = self.episodes
        for rec in self.msgs.values():
            ep = self._episode_at(rec.t)
            dups = sum(c - 1 for c in rec.delivered.values() if c > 1)
            # a node that restarted (or is down) may legitimately have lost or repeated it
            live = {d for d in rec.expected if self.nodes[d].up and self.nodes[d].restarted_at < rec.t}
            lost = [d for d in live if d not in rec.delivered]
            if ep is not None:
                ep.messages += 1
                ep.lost += len(lost)
                ep.duplicates += dups
            restarted = {n for n in rec.delivered if self.nodes[n].restarted_at > rec.t}
            if dups and not restarted:
                twice = sorted(n for n, c in rec.delivered.items() if c > 1)[:5]
                v.add("exactly_once", f"message {rec.origin}:{rec.seq & 0xffffffff} on {rec.topic!r} was "
                                      f"delivered more than once at {twice}")
            if not rec.checked:
                continue
            unexpected = sorted(set(rec.delivered) - rec.expected - rec.dormant)[:5]
            if unexpected:
                v.add("no_interest", f"message {rec.origin}:{rec.seq & 0xffffffff} on {rec.topic!r} was "
                                     f"delivered at {unexpected}, which have no subscriber for it")
            if lost and not (rec.qos == 0 and rec.lost_copies):
                v.add("exactly_once", f"message {rec.origin}:{rec.seq & 0xffffffff} on {rec.topic!r} "
                                      f"(QoS {rec.qos}, published at {rec.t:.4f}s, converged) never "
                                      f"reached {sorted(lost)[:5]}")
        self.final_hop_drops = self.counter_total("hop_limit_drops")
        if self.final_hop_drops and not any(e.kind != "start" for e in episodes):
            v.add("hop_limit", f"{self.final_hop_drops} envelopes reached the hop limit in a mesh that "
                               f"never had a fault")

    def _episode_at(self, t: float) -> Episode | None:
        for ep in reversed(self.episodes):
            if ep.start <= t and (ep.end is None or t <= ep.end + self.settle):
                return ep
            if ep.end is not None and ep.end + self.settle < t:
                return None
        return None

    def counter_total(self, name: str) -> int:
        total = self.dead_counters.get(name, 0)
        for node in self.nodes.values():
            if node.up:
                total += node.engine.counters.get(name, 0)
        return total


def run_scenario(scenario: Scenario, progress=None) -> Simulator:
    """Run ``scenario`` to its end; InvariantViolation if an invariant fails (checks.fail)."""
    return Simulator(scenario, progress).run()


__all__ += ["run_scenario", "InvariantViolation"]
