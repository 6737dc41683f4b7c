"""A client's PUBLISH into the broker, as part of the Channel: at once, or in order behind a
persistent publisher's QoS 2 message that waits for its session's other holders.

Pure. A message is numbered (origin, seq) and handed to the broker with its
acknowledgement (PUBACK, PUBREC) written once what it depends on is committed
(channel_held.py). In a mesh, a persistent session's QoS 2 message is routed only once the
session's other holders have it with its id, and under that id by whichever node the client
is on (mesh/cluster/replica.py): what the same client publishes meanwhile waits behind it, in order
[MQTT-4.6.0-6]. ``Publishing`` holds these steps for ``channel.Channel``, which inherits
them and keeps the state (``_held``, ``_deferred``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from . import codec
from . import properties as P
from .channel_held import PUBACK_FIRST, PUBCOMP_FIRST, PUBREC_FIRST, Pending, ProtocolViolation, Routing, ack_frame
from .channel_states import CONNECTED
from .message import Message

if TYPE_CHECKING:
    from collections import deque

    from .broker import Broker
    from .ports import Batch, PeerPort, ReadCapture
    from .session import Session

__all__ = ["Publishing", "will_delay"]


def will_delay(will: codec.Will | None, session: Session | None) -> int:
    """How long ``will`` waits after its connection ended (MQTT 5's Will Delay Interval): not
    at all when its session ends with the connection, at most until the session expires
    [MQTT-3.1.2-8]."""
    if will is None or not will.properties or session is None or session.clean:
        return 0
    delay: int = will.properties.get(P.WILL_DELAY, 0)
    return min(delay, session.expiry) if delay else 0


class Publishing:
    """The PUBLISH and PUBREL handlers of a Channel (a mixin: the Channel keeps the state)."""

    __slots__ = ()

    if TYPE_CHECKING:  # what the handlers use of the Channel
        broker: Broker
        session: Session | None
        state: str
        peer_node: str | None  # (None: a client; ``is_peer`` reads it)
        peers: PeerPort[Any] | None  # (PeerPort[Channel])
        username: str | None
        client_id: str
        last_rx: float
        _held: deque[tuple[int, int, bytes | Routing | Pending]]
        _deferred: deque[Routing]
        _read: ReadCapture | None

        def write(self, frame: bytes) -> None: ...

        def _send_after(self, frame: bytes, batch: Batch, ticket: int = 0) -> None: ...

        def _defer(self, msg: Message, ticket: int) -> None: ...

    def _on_publish(
        self, pkt: codec.Publish, now: float, props: bytes | None = None, expiry: int | None = None
    ) -> None:
        """``props``, ``expiry``: an MQTT 5 message's properties and its Message Expiry
        Interval (channel5.py ``_on_publish5``)."""
        qos = pkt.qos
        if self._deferred and self.peer_node is None:
            self._publish_in_order(pkt, now, False, props, expiry)  # an earlier message of this client waits
            return
        if qos == 0:
            self._publish(pkt.topic, pkt.payload, 0, pkt.retain, now, 0, props, expiry)
            return
        pid: int = pkt.packet_id  # type: ignore[assignment]  # (QoS 1 or 2: the decoder read an id)
        if qos == 1:
            batch = self._publish(pkt.topic, pkt.payload, 1, pkt.retain, now, 0, props, expiry)
            if not batch and not self._held:
                self.write(ack_frame(PUBACK_FIRST, pid))
            else:
                self._send_after(ack_frame(PUBACK_FIRST, pid), batch)
            return
        session: Session = self.session  # type: ignore[assignment]  # (CONNECTED: it has one)
        if self._qos2_seen(session, pid):
            return
        if session.routes_when_agreed:
            # a persistent session in a mesh: the message is routed once its holders have it
            # with its id, and under that id by whichever holder the client is on, so that a
            # re-send to another node after this one died is neither a second delivery nor a
            # loss (mesh/cluster/replica.py); the PUBREC waits for it too
            self._publish_in_order(pkt, now, True, props, expiry)
            return
        batch = self._publish(pkt.topic, pkt.payload, 2, pkt.retain, now, 0, props, expiry)
        # a durable session's id is journaled: the PUBREC waits for it, and for the message
        # (the id's batch is the current one, no older than the message's)
        self._send_after(ack_frame(PUBREC_FIRST, pid), session.awaiting_rel_add(pid) or batch, session.gate.ticket())

    def _qos2_seen(self, session: Session, pid: int) -> bool:
        """A re-sent QoS 2 PUBLISH is acknowledged again and delivered no more (True)
        [MQTT-4.3.3-2]; too many ids awaiting PUBREL is a protocol error."""
        awaiting = session.awaiting_rel
        if pid in awaiting:
            if self._read is not None:
                self._read.skip()
            self.write(ack_frame(PUBREC_FIRST, pid))  # (behind what is held)
            return True
        if len(awaiting) >= session.limits.max_awaiting_rel:
            raise ProtocolViolation("MQTT-4.8.0-2", "too many QoS 2 messages awaiting PUBREL (limits.max_awaiting_rel)")
        return False

    def _publish(
        self,
        topic: str,
        payload: bytes,
        qos: int,
        retain: bool,
        now: float,
        will_seq: int = 0,
        props: bytes | None = None,
        expiry: int | None = None,
    ) -> Batch:
        """Hand a message from this client (or its will, ``will_seq``: its reserved number) to
        the broker; the journal batch to wait for. (The Message is made whole once it is
        allowed: origin, number, publisher, timestamp.) ``props``: its MQTT 5 properties
        (message.Message.props), as channel5.py ``_on_publish5`` hands them to ``_on_publish``;
        ``expiry``: its Message Expiry Interval."""
        broker = self.broker
        broker.stats.received[qos] += 1
        auth = broker.auth
        # (a peer link, ``peer_node``, may publish $mesh/ topics; the client ACL is not about it)
        if (topic[0] == "$" and self.peer_node is None) or (
            auth.acl is not None
            and self.peer_node is None
            and not auth.can_publish(self.username, self.client_id, topic)
        ):
            # not authorized: acknowledged by the caller, not delivered [MQTT-3.3.5-2]
            broker.stats.publish_denied += 1
            if self._read is not None:
                self._read.skip()
            return 0
        seq = will_seq or next(broker.seqs)
        msg = Message(topic, payload, qos, retain, broker.node_id, seq, self.client_id, now + broker.wall_offset, props)
        if expiry is not None:
            msg.expiring(expiry, now)
        if will_seq and broker.mesh is not None:
            broker.mesh.first_here(msg)  # (here now: the registrar's copy of it is not delivered again)
        if self.peer_node is not None and topic.startswith("$mesh/"):
            batch, hits = self.peers.peer_input(self, msg, now)  # type: ignore[union-attr]  # (a peer has them)
            if hits:
                # a local client cannot keep up: read the link no faster than it drains, for
                # at most backpressure_timeout at a time (the link carries other sessions' too)
                me = self if self.state is CONNECTED else None
                broker.congestion.hold(me, hits, now, len(payload), bounded=True)  # type: ignore[arg-type]
            return batch
        if self._read is not None:
            # a message of the read being captured: the archive takes it from the read's bytes
            self._read.message(seq)
            batch, hits = broker.publish(msg, True)
        else:
            batch, hits = broker.publish(msg)
        if hits:
            # read this publisher no faster than the congested sessions it reached drain (flow.py)
            me = self if self.state is CONNECTED else None
            broker.congestion.hold(me, hits, now, len(topic) + len(payload))  # type: ignore[arg-type]
        return batch

    # -- the will --------------------------------------------------------------------------

    def _publish_will(self, will: codec.Will, delay: int, now: float) -> None:
        """The will of a connection that ended at ``now`` without deleting it [MQTT-3.1.2-8]:
        published now, or (``delay``, ``will_delay``) kept by the Broker until then, unless a
        new connection for the ClientId comes first [MQTT-3.1.3-9]. (In a mesh the registrar
        keeps a delayed will instead: the Channel does not call this for one.)"""
        broker = self.broker
        props = will.properties
        fwd, expiry = (P.forwarded(props), props.get(P.MESSAGE_EXPIRY)) if props else (None, None)
        if not delay:
            broker.stats.wills_published += 1  # [MQTT-3.1.2-16/17]
            self._publish(will.topic, will.payload, will.qos, will.retain, self.last_rx, will.seq, fwd, expiry)
            return
        msg = self._message(will.topic, will.payload, will.qos, will.retain, self.last_rx, fwd, None, will.seq)
        if msg is not None:
            broker.delay_will(self.client_id, msg, expiry, now + delay)

    # -- routed once replicated, in order ----------------------------------------------------

    def _publish_in_order(
        self,
        pkt: codec.Publish,
        now: float,
        seen: bool = False,
        props: bytes | None = None,
        expiry: int | None = None,
    ) -> None:
        """A PUBLISH routed behind what this client's session waits for (``_route_after``),
        and acknowledged after it; a QoS 2 one of a replicated session gets its agreed id.
        ``seen``: the caller checked it is not a re-send (``_qos2_seen``)."""
        qos = pkt.qos
        pid: int = pkt.packet_id  # type: ignore[assignment]  # (0 for QoS 0, unused)
        session: Session = self.session  # type: ignore[assignment]
        if qos == 2 and not seen and self._qos2_seen(session, pid):
            return
        msg = self._message(pkt.topic, pkt.payload, qos, pkt.retain, now, props, expiry)
        batch = ticket = 0
        if qos == 2:
            batch = session.awaiting_rel_add(pid) if msg is None else session.awaiting_rel_agreed(pid, msg)
            ticket = session.gate.ticket()
        if msg is not None:
            batch = max(batch, self._route_after(msg, ticket))
        if qos:
            self._send_after(ack_frame(PUBREC_FIRST if qos == 2 else PUBACK_FIRST, pid), batch, ticket)

    def _message(
        self,
        topic: str,
        payload: bytes,
        qos: int,
        retain: bool,
        now: float,
        props: bytes | None = None,
        expiry: int | None = None,
        seq: int = 0,
    ) -> Message | None:
        """A message from this client, numbered, to be routed later (``_route``); None if it
        may not be published (acknowledged all the same [MQTT-3.3.5-2]). ``_publish`` does
        the same inline, on the path every message takes. ``seq``: its number if reserved
        (a will's)."""
        broker = self.broker
        broker.stats.received[qos] += 1
        if self._read is not None:
            self._read.skip()  # (the archive takes it when it is routed: Broker.publish)
        auth = broker.auth
        if topic[0] == "$" or (auth.acl is not None and not auth.can_publish(self.username, self.client_id, topic)):
            broker.stats.publish_denied += 1
            return None
        seq = seq or next(broker.seqs)
        msg = Message(topic, payload, qos, retain, broker.node_id, seq, self.client_id, now + broker.wall_offset, props)
        return msg if expiry is None else msg.expiring(expiry, now)

    def _route_after(self, msg: Message, ticket: int) -> Batch:
        """Route ``msg`` once the session's gate passed ``ticket`` (and the tickets of what is
        held before it) and every message deferred before it was routed: now (the journal
        batch to wait for), or later (0; channel_held.py ``release_acks``)."""
        passed = self.session.gate.passed()  # type: ignore[union-attr]
        if not self._deferred and ticket <= passed and (not self._held or self._held[-1][1] <= passed):
            return self._route(msg)
        self._defer(msg, ticket)
        return 0

    def _route(self, msg: Message) -> Batch:
        """Route a message published by this client (``_message``); the batch to wait for.
        One whose id the session's holders agreed on may have been routed by another node
        already: its local subscribers had it then (the mesh's duplicate filters know)."""
        broker = self.broker
        session = self.session
        if msg.qos == 2 and session is not None and session.routes_when_agreed:
            if not session.route_here(msg):
                return 0  # (the client came back while it waited: routed by the new channel)
            mesh = broker.mesh
            if mesh is not None and not mesh.first_here(msg):
                mesh.published(msg)
                session.routed_in(msg, 0)  # (by the node it came from: in its custody)
                return 0
            batch, hits = broker.publish(msg)
            session.routed_in(msg, batch)
        else:
            batch, hits = broker.publish(msg)
        if hits:
            me = self if self.state is CONNECTED else None
            broker.congestion.hold(me, hits, self.last_rx, len(msg.topic) + len(msg.payload))  # type: ignore[arg-type]
        return batch

    def _route_unrouted(self, session: Session, now: float) -> None:
        """A persistent session just attached here: the QoS 2 messages it took that no node
        may have routed yet (its node died, or its client left, before they went out) are
        routed now, under their agreed ids (mesh/cluster/replica.py)."""
        for msg in session.unrouted():
            self._route_after(msg.at(now), session.gate.ticket())

    # -- PUBREL ------------------------------------------------------------------------------

    def _on_pubrel(self, pkt: codec.PubRel, now: float) -> None:
        session: Session = self.session  # type: ignore[assignment]
        batch = session.awaiting_rel_remove(pkt.packet_id)
        self._send_after(ack_frame(PUBCOMP_FIRST, pkt.packet_id), batch, session.gate.ticket())  # [MQTT-4.3.3-2]
