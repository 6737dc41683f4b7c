"""The simulated network: link life (dial, hello, break, detection), sends, arrivals.

Part of the Simulator (core.py), as a mixin: how a message crosses a link (latency,
loss, bandwidth, FIFO per direction, the connection it belongs to), how each side of
a connection learns that it came up or died, and how a node reads what arrives (one
message at a time, a batch when busy) and hands it to its engine. The model is the one
docs/simulation.md describes; this module only moved out of core.py (issue 14, S8).
"""

from __future__ import annotations

import json

from ..mesh.routing.actions import Send
from ..mesh.routing.engine import MeshProtocolError
from .cluster import SimLink
from .convergence import Episode
from .model import ARRIVE, DETECT, DIAL, DRAIN, LINK_READY, PING, Link, Node, SimulatorPart
from .observe import read_envelope_heads

__all__ = ["NetworkMixin", "CONTROL", "PROPAGATING", "ATTRIBUTED"]


CONTROL = ("lsa", "dbsum", "lsreq", "cost", "e2e", "nack", "skip", "uni")
PROPAGATING = ("lsa", "dbsum", "lsreq", "cost")  # routing control: what a round of advertisement is made of
# episodes whose control traffic is attributed (advertisements parsed); not the start, whose
# traffic is all of it, nor spontaneous re-costing
ATTRIBUTED = ("link_down", "link_up", "crash", "restart", "partition", "heal", "latency", "subscription")


class NetworkMixin(SimulatorPart):
    """Links between the nodes: their connections, sends and arrivals (see the module doc)."""

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
            delay = 0.05 + 0.1 * self.rng_time.random()  # Dialler: right after a connection ends
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
        if self.cluster_mode:  # the whole node's PeerLinks sends its hello (_on_link_ready)
            self._at(self.now + 2 * lat * self.sc.node.handshake_rtts, LINK_READY, a, b, link.conn)
            return
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
        if node.core is not None:
            sim_link = node.plinks.pop(link.peer(x), None)
            if sim_link is not None:
                node.core.links.closed(sim_link, "connection lost", self.now)
        else:
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

    def _send(self, node: Node, peer: str, kind: str, payload: bytes, qos: int, conn: int = -1) -> None:
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
            if self.share_watch and kind == "lsa":
                self._share_lsa(payload)  # (members.py: what a membership change costs)
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
        if not link.alive or not link.side[name] or (conn >= 0 and conn != link.conn):
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
        if node.core is not None:
            self._process_whole(node, link, src, kind, payload, meta)
            return
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
        self._receipts(node, src, kind, meta)
        for msg in inbound.deliveries:  # (engine mode: the cluster's unicasts are not simulated)
            self._deliver(node, msg)
        self._rounds(node, kind, meta, before)
        self._observe_own(node)
        self._want_flush(node)

    def _process_whole(self, node: Node, link: Link, src: str, kind: str, payload: bytes, meta) -> None:
        """mode = "cluster": what arrives goes to the node's PeerLinks, which decides what it
        is (a hello, a message of the current link, or one to drop) and hands it on."""
        dst = node.name
        if kind == "hello" and dst == link.b and not link.side[dst]:
            # the acceptor: a dialler's hello on a new connection (the handshake before it is
            # taken as done), so the connection is open on this side now
            link.side[dst] = True
            node.plinks[src] = SimLink(self.node_io[dst], dst, src, link.a, link.conn, None)
        sim_link = node.plinks.get(src)
        if sim_link is None or sim_link.conn != link.conn:
            self.not_ready_drops += 1
            return
        links = node.core.links
        if kind == "hello":
            was = links.links.get(src)
            links.receive(sim_link, kind, payload, self.now)
            if links.links.get(src) is sim_link and was is not sim_link:
                self._link_up_seen(link, node)
            return
        before = node.engine.changes
        links.receive(sim_link, kind, payload, self.now)
        self._receipts(node, src, kind, meta)
        self._rounds(node, kind, meta, before)
        self._observe_own(node)
        self._want_flush(node)

    def _on_link_ready(self, a: str, b: str, conn: int) -> None:
        """mode = "cluster": the dialler's handshake is done (LinkClient's Ready): its PeerLinks
        introduces it with a hello, which the acceptor's PeerLinks answers."""
        link = self.links[(a, b)]
        node = self.nodes[a]
        if link.conn != conn or not link.alive or not node.up or node.core is None:
            return
        link.side[a] = True  # open on this side: its end is noticed (DETECT) from now on
        sim_link = node.plinks[b] = SimLink(self.node_io[a], a, b, a, conn, 2 * link.latency)
        node.core.links.dialled_ready(sim_link)

    def _link_send(self, sim_link: SimLink, kind: str, payload: bytes, qos: int) -> None:
        """A SimLink's send: onto the network, at the node's CPU cost (as _dispatch)."""
        node = self.nodes[sim_link.node]
        self._send(node, sim_link.proved, kind, payload, qos, sim_link.conn)
        node.busy_until = max(node.busy_until, self.now) + self.cpu_msg + len(payload) * self.cpu_byte

    def _link_close(self, sim_link: SimLink, reason: str) -> None:
        """The node closed a peer link (a bad hello, a message it could not read): with one
        connection per pair and every node of one version, that is a fault of the run."""
        self.violations.add("wire", f"t={self.now:.4f}s {sim_link.node} closed its link to {sim_link.proved}: {reason}")
        a, b = sorted((sim_link.node, sim_link.proved))
        link = self.links[(a, b)]
        if link.conn == sim_link.conn:
            self._break(link, "reset")

    def _receipts(self, node: Node, src: str, kind: str, meta) -> None:
        """Where the copies of checked messages went (an arrival the engine read)."""
        dst = node.name
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

    def _rounds(self, node: Node, kind: str, meta, before: int) -> None:
        """The advertisement round an arrival belongs to, if it changed the engine's state."""
        e = node.engine
        if meta is not None and kind != "fwd":
            ep_id, depth = meta
            ep = self.episode
            if ep is not None and ep.id == ep_id:
                if e.changes != before:
                    ep.rounds = max(ep.rounds, depth)
                    node.depth_out = max(node.depth_out, depth + 1)
                elif kind in ("dbsum", "lsreq"):
                    node.depth_out = max(node.depth_out, depth + 1)  # it asks for an answer

    def _hello(self, link: Link, node: Node, src: str) -> None:
        name = node.name
        if link.side[name]:
            return
        link.side[name] = True
        # as mesh_node does: the link's first cost is the dialler's SUBSCRIBE/SUBACK round
        # trip, carried to the acceptor in the dialler's hello
        node.engine.link_up(src, self.now, int(2 * link.latency * 1e6))
        if name == link.b:
            # the acceptor answers with its own hello, ahead of anything else on the connection
            t = max(self.now + link.latency, link.arrive[1])
            link.arrive[1] = t
            self.sent["hello"][0] += 1
            self._at(t, ARRIVE, name, src, "hello", b"", link.conn, None)
        self._link_up_seen(link, node)

    def _link_up_seen(self, link: Link, node: Node) -> None:
        """One side's engine has the link up: the bookkeeping of episodes and round trips."""
        node.depth_out = max(node.depth_out, 1)
        if node.name == link.a:
            link.established_at = self.now
            self._note_detection()
            if self.episode is not None:
                self.episode.new_links.add((link.a, link.b))
            t = self.now + self.sc.node.keepalive
            self._at(t, PING, link.a, link.b, link.conn, t)
        self.comp_dirty = True
        self._observe_own(node)
        self._want_flush(node)

    def _on_ping(self, a: str, b: str, conn: int, due: float) -> None:
        """A PINGRESP came back: the dialling side gets an RTT sample, as LinkClient reports it
        (``due``: when it would have, had neither end been stalled; sim/stall.py)."""
        link = self.links[(a, b)]
        if link.conn != conn or not link.side[a] or not link.side[b]:
            return
        node = self.nodes[a]
        rtt = 2 * link.latency
        jitter = self.sc.node.rtt_jitter
        if jitter:
            rtt *= 1 + jitter * self.rng_time.uniform(-1, 1)
        rtt += self.now - due  # a stalled end answered, or read the answer, late
        before = node.engine.routers[a].seq
        if node.core is not None:
            sim_link = node.plinks.get(b)
            if sim_link is not None:
                node.core.links.rtt(sim_link, rtt, self.now)
        else:
            node.engine.link_rtt(b, rtt * 1e6, self.now)
        if node.engine.routers[a].seq != before:  # the cost moved enough to be re-advertised
            node.depth_out = max(node.depth_out, 1)
        self._observe_own(node)
        self._want_flush(node)
        t = self.now + self.sc.node.keepalive
        self._at(t, PING, a, b, conn, t)
