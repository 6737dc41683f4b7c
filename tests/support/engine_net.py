"""Routing engines on an instant in-memory network (tests/mesh/test_engine.py, test_order.py).

Every Send is delivered at once, in order, unless a test holds the queue; the discrete-event
simulator (mqttmesh.sim) adds latency, loss and faults on top of the same engine.
"""

from __future__ import annotations

from collections import deque

from mqttmesh.mesh.routing.engine import MeshEngine, MeshSettings
from mqttmesh.message import Message

__all__ = ["Net"]


class Net:
    def __init__(self, names, edges, settings=None, custody=None):
        self.t = 0.0
        custody = custody or {}
        self.engines = {
            n: MeshEngine(n, 1, [f"{n}:1883"], settings or MeshSettings(), custody=custody.get(n)) for n in names
        }
        self.links = set()
        self.queue = deque()
        self.delivered = {n: [] for n in names}
        self.fwd_per_link = {}
        self.seq = {n: 0 for n in names}
        for e in self.engines.values():
            e.start(self.t)
        for a, b in edges:
            self.connect(a, b)
        self.settle()

    def connect(self, a, b):
        self.links.add(frozenset((a, b)))
        self.engines[a].link_up(b, self.t)
        self.engines[b].link_up(a, self.t)

    def cut(self, a, b):
        self.links.discard(frozenset((a, b)))
        self.engines[a].link_down(b, self.t)
        self.engines[b].link_down(a, self.t)

    def _pump(self, name, sends):
        for peer, kind, payload, _qos in sends:
            if frozenset((name, peer)) in self.links:
                self.queue.append((name, peer, kind, payload))

    def _take(self, name, inbound):
        for msg in inbound.deliveries:
            self.delivered[name].append((msg.origin, msg.seq, msg.topic))
            if msg.qos:  # QoS 1/2: acknowledged end to end, as the broker does once it is safe
                self.engines[name].delivered(msg)

    def settle(self, limit=100_000):
        steps = 0
        while True:
            for name, e in self.engines.items():
                self._pump(name, e.flush(self.t))
            if not self.queue:
                return steps
            while self.queue:
                frm, to, kind, payload = self.queue.popleft()
                if kind == "fwd":
                    self.fwd_per_link[(frm, to)] = self.fwd_per_link.get((frm, to), 0) + 1
                self._take(to, self.engines[to].receive(frm, kind, payload, self.t))
                steps += 1
                assert steps < limit, "the network does not settle: a loop?"

    def subscribe(self, node, topic_filter):
        self.engines[node].local_filter_added(topic_filter)
        self.settle()

    def publish(self, node, topic, qos=0):
        self.seq[node] += 1
        msg = Message(topic, b"x", qos, False, node, self.seq[node], "c", self.t)
        self.engines[node].route_local(msg, self.t)
        self.settle()
        return (node, self.seq[node], topic)
