"""The simulated clients: subscriptions, publications, deliveries.

Part of the Simulator (core.py), as a mixin. A node's clients are its filters
(each a subscription) and a Poisson publisher; the broker's local delivery is
counted per node, the engine's delivery filter making it once per message.
"""

from __future__ import annotations

from ..message import Message
from .model import CHURN, MSGCHECK, PUBLISH, Node, SimulatorPart
from .observe import MsgRecord

__all__ = ["ClientsMixin"]


class ClientsMixin(SimulatorPart):
    # ------------------------------------------------------------------ clients

    def _deliver(self, node: Node, msg: Message) -> None:
        rec = self.msgs.get((msg.origin, msg.seq))
        if rec is not None:
            name = node.name
            rec.delivered[name] = rec.delivered.get(name, 0) + 1
            if name not in rec.first_at:
                rec.first_at[name] = self.now
                if self.now > rec.t + self.settle:
                    rec.late += 1
        if msg.qos:  # QoS 1/2: acknowledged end to end to the origin's custody
            node.engine.delivered(msg)  # type: ignore[union-attr]  # (the node is up); the simulated store commits at once

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
            rec.dormant = frozenset(n for n in wanted if n != name and n not in reach) | frozenset(
                self.dormant.match(topic)
            )
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
        node.engine.local_filter_added(topic_filter)  # type: ignore[union-attr]  # (the node is up)
        self._interest_changed(node)

    def _unsubscribe(self, node: Node, topic_filter: str, cause: str) -> None:
        if topic_filter not in node.filters:
            return
        self._disturb(cause, "subscription")
        node.filters.remove(topic_filter)
        self.truth.remove(topic_filter, node.name)
        node.engine.local_filter_removed(topic_filter)  # type: ignore[union-attr]  # (the node is up)
        self._interest_changed(node)

    def _interest_changed(self, node: Node) -> None:
        self.dirty_interest.add(node.name)
        node.depth_out = max(node.depth_out, 1)
        self._note_detection()
        self._want_flush(node)
