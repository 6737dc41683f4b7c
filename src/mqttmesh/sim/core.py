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

from ..mesh.actions import Send
from ..mesh.engine import MeshEngine, MeshProtocolError
from ..topics import SubscriptionTrie
from .checks import InvariantViolation, Violations
from .clients import ClientsMixin
from .convergence import ConvergenceMixin, Episode
from .faults import FaultsMixin
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
    MSGCHECK,
    PING,
    PUBLISH,
    START,
    TALLY,
    TICK,
    Link,
    Node,
    SharedDecoding,
)
from .observe import MsgRecord, read_envelope_heads
from .scenario import Scenario
from .topology import build_topology
from .verify import VerifyMixin
from .workload import TopicSpace

__all__ = ["Simulator", "Episode"]


CONTROL = ("lsa", "dbsum", "lsreq", "cost", "e2e", "uni")
PROPAGATING = ("lsa", "dbsum", "lsreq", "cost")  # routing control: what a round of advertisement is made of
# episodes whose control traffic is attributed (advertisements parsed); not the start, whose
# traffic is all of it, nor spontaneous re-costing
ATTRIBUTED = ("link_down", "link_up", "crash", "restart", "partition", "heal", "latency", "subscription")


class Simulator(ClientsMixin, FaultsMixin, ConvergenceMixin, VerifyMixin):
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
        subs = self.space.subscriptions(self.rng_work, self.names)
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
        self.cpu_msg = sc.node.cpu_us_per_message / 1e6
        self.cpu_byte = sc.node.cpu_us_per_kb / 1e6 / 1024
        self.settle = sc.checks.settle or self._default_settle()
        self.bin = max(0.05, sc.duration / 400)
        self.timeline: dict[int, list[int]] = {}  # time bin -> [control bytes, data bytes]
        self.node_sends: dict[str, int] = {}  # copies each node sent for checked messages
        self.checked_by_origin: dict[str, int] = {}
        self.wall_start = time.perf_counter()
        self.decoding = SharedDecoding()

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
        if w.publish_rate > 0:
            publishers = [n for n in self.names if self.rng_pub.random() < w.publishers]
            for n in publishers:
                self._at(w.start + self.rng_pub.expovariate(w.publish_rate), PUBLISH, n)
        if w.churn > 0:
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
        }
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
            delay = self.rng_time.uniform(0, self.sc.node.redial_max)  # somewhere in the backoff
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
        ep = self.episode
        if ep is not None:
            if ep.detected is None:
                ep.detected = self.now
            ep.last_detected = self.now

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
        meta = (
            heads
            if heads is not None
            else (
                (self.episode.id, node.depth_out)
                if self.episode is not None and node.depth_out and kind in PROPAGATING
                else None
            )
        )
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

    def _dispatch(self, node: Node, sends: list[Send]) -> None:
        cost = 0.0
        for peer, kind, payload, qos in sends:
            self._send(node, peer, kind, payload, qos)
            cost += self.cpu_msg + len(payload) * self.cpu_byte
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
            inbound = e.receive(src, kind, payload, self.now)
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
        for msg in inbound.deliveries:  # (the unicasts of the cluster protocols: not simulated here)
            self._deliver(node, msg)
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
        # as mesh_node does: the link's first cost is the dialler's SUBSCRIBE/SUBACK round
        # trip, carried to the acceptor in the dialler's hello
        node.engine.link_up(src, self.now, int(2 * link.latency * 1e6))
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


def run_scenario(scenario: Scenario, progress=None) -> Simulator:
    """Run ``scenario`` to its end; InvariantViolation if an invariant fails (checks.fail)."""
    return Simulator(scenario, progress).run()


__all__ += ["run_scenario", "InvariantViolation"]
