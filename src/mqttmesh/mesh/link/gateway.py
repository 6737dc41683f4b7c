"""The mesh as the local broker sees it: what its subscribers want and what its publishers send.

Pure. The broker calls it (a ports.MeshPort, given to the Broker's constructor, so it
holds no Broker: it is built first, with the congestion and the wall offset the Broker
gets too): ``$`` filters and topics ($SYS,
$mesh) stay local to each node; everything else is routed by the engine, with the
publish time on the loop clock. Sends are batched per loop iteration (``MeshIO.flush_soon``)
but never more than FLUSH_EVERY messages, and a publisher whose messages go out over a
congested link is held like one whose local subscriber is slow (flow.py). The cluster
protocols send their unicasts through it too.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import TYPE_CHECKING

from ...message import Message
from ...ports import NO_HITS, Hits, MeshIO, PeerLink
from ..routing.engine import MeshEngine
from .links import FLUSH_EVERY, FLUSH_SOON_AT

if TYPE_CHECKING:
    from ...flow import Congestion

__all__ = ["MeshGateway", "FLUSH_EVERY"]


class MeshGateway:
    def __init__(
        self,
        engine: MeshEngine,
        congestion: Congestion,
        wall_offset: float,
        links: dict[str, PeerLink],
        io: MeshIO,
    ):
        self.engine = engine
        self.congestion = congestion  # the Broker's
        self.wall_offset = wall_offset  # the Broker's: message timestamps minus the loop clock
        self.links = links  # PeerLinks.links: the current link to each neighbour
        self.io = io
        self.routed = 0  # messages routed since the last send (the I/O resets it as it sends)

    def filter_added(self, topic_filter: str) -> None:
        """The first local subscription of ``topic_filter`` (a shared group's: its first
        member here, "$share/{g}/{f}")."""
        if not topic_filter.startswith("$") or topic_filter.startswith("$share/"):
            # ($SYS and $mesh stay local to each node)
            self.engine.local_filter_added(topic_filter)
            self.io.flush_soon()

    def filter_removed(self, topic_filter: str) -> None:
        if not topic_filter.startswith("$") or topic_filter.startswith("$share/"):
            self.engine.local_filter_removed(topic_filter)
            self.io.flush_soon()

    def published(self, msg: Message) -> Hits:
        """A message published at this node, after its local dispatch (the hot path); the
        congested links it goes out on, which its publisher owes (flow.py; mostly none)."""
        if msg.topic[0] != "$":
            # the publish time on our loop clock, without asking the loop for it again
            if self.engine.route_local(msg, msg.timestamp - self.wall_offset):
                routed = self.routed + 1
                self.routed = routed
                if routed == 1:
                    self.io.flush_later()  # (mesh.batch_delay: more may join it)
                elif routed == FLUSH_SOON_AT:
                    self.io.flush_soon()  # (busy: enough for a batch this turn)
                elif routed >= FLUSH_EVERY:
                    # one loop iteration can read hundreds of kilobytes from the publishers:
                    # held back until all of it is routed, the next node would wait idle, then
                    # work while this one waits; sending every FLUSH_EVERY keeps both busy
                    self.routed = 0
                    self.io.flush_now()
            congestion = self.congestion
            if congestion.reasons:
                return self._check_links(msg, congestion)
        return NO_HITS

    def to_group(self, msg: Message, share: str, now: float) -> bool:
        """A member here left holding ``msg`` and no other member here takes it: a new message
        of ours (a re-send: its id is ours, routing/custody.py ``_group_copy``) to a member of
        ``share`` on another node only; ``msg``'s wait here (``hold``) ends once the new one is
        acknowledged there. False: no node with a member is known."""
        engine = self.engine
        copy = engine._group_copy(msg, now)
        if copy is None:
            return False  # (its life ended: to nobody [MQTT-3.3.2-5])
        sent = engine.route_to_group(copy, share, now)
        if sent:
            self.io.flush_soon()
            if copy.qos:  # (in custody, or kept until a member's node is in reach)
                engine.hold_until_acked(copy.seq, msg)
                if engine._own_holds:
                    engine.settle_own(msg, share)  # (the copy is in the store in its place)
            else:
                self.settle(msg, share)
        return sent

    def hold(self, msg: Message, share: str, clean: bool) -> None:
        """A member of ``share`` here took ``msg``: if it came from another node, its
        acknowledgement there waits for the member's (routing/custody.py ``hold``); if it is
        ours and the member's session ends with this node, the store keeps a copy for the
        group until the member settles it (``hold_own``)."""
        engine = self.engine
        if not msg.qos:
            return
        if msg.origin != engine.node_id:
            if msg.ack_to != engine.node_id:
                engine.hold(msg, msg.timestamp - self.wall_offset)
        elif clean:
            engine.hold_own(msg, share, msg.timestamp - self.wall_offset)

    def settle(self, msg: Message, share: str) -> None:
        """A member of ``share`` that took ``msg`` acknowledged it (or it went on, or to nobody)."""
        engine = self.engine
        if engine._holds:
            engine.settle(msg)
            self.io.flush_soon()
        if engine._own_holds and msg.origin == engine.node_id:
            engine.settle_own(msg, share)

    def online_elsewhere(self, share: str) -> bool:
        """Has another node in reach a connected member of the shared group ``share``?"""
        return self.engine.shared_online_elsewhere(share)

    def first_here(self, msg: Message) -> bool:
        """Is ``msg`` new to this node's subscribers? A QoS 2 message whose id a persistent
        publisher's holders agreed on (mesh/cluster/replica.py) may be routed by two nodes, the one
        that took it and the one its client moved to: the second finds it seen here (it
        came through the mesh), and it is remembered either way."""
        return not self.engine.delivery_filter.seen(msg.origin, msg.seq, 2)

    def comes_later(self, msg: Message) -> bool:
        """Does the engine hold ``msg`` for an earlier message of its origin (order.py)?"""
        return (msg.origin, msg.seq) in self.engine._held_ids

    def unicast(self, dest: str, kind: str, payload: bytes, soon: bool = True) -> bool:
        """A cluster message for node ``dest`` (the Cluster's send); False: unreachable now.
        ``soon``: written this loop iteration; else within mesh.batch_delay (ports.UnicastPort)."""
        ok = self.engine.send_unicast(dest, kind, payload)
        if soon:
            self.io.flush_soon()
        else:
            self.io.flush_later()
        return ok

    def reachable(self, dest: str) -> bool:
        """Would a unicast to node ``dest`` be routed now (``unicast`` would return True)?"""
        return self.engine.reaches(dest)

    def routes_to(self, dest: str, topic: str) -> bool:
        """Would a message of ``topic`` published here be routed to node ``dest`` now?"""
        return topic[0] != "$" and self.engine.routes_to(dest, topic)

    def sent(self) -> None:
        """What was routed has been handed to the links: count from zero again."""
        self.routed = 0

    def _check_links(self, msg: Message, congestion: Congestion) -> Hits:
        """The congested links this message goes out over: its publisher waits (flow.py)."""
        engine = self.engine
        hits: list[Hashable] = []
        for node in engine.nodes_wanting(msg.topic):
            link = self.links.get(engine.route_to(node) or "")
            if link is not None:
                key = link.congestion_key()
                if key in congestion.reasons and key not in congestion.stalled:
                    hits.append(key)
        return hits
