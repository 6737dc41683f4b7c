"""The peer links of a mesh node: which link to which peer is the current one, and what arrives on it.

Pure: events in (a link's messages, its round trips, its end), calls out to the
routing engine, the local broker, the cluster protocols and the I/O layer's ``MeshIO``
(flush soon or now, fresh nonces, addresses learned). The sockets, the timers and the
dialling stay in server/mesh_node.py; the simulator and the tests drive this class over
links of their own (ports.PeerLink).

A link is an ordinary MQTT connection, in one of two roles:
- a node that dialled us is a Channel of our broker; what it publishes on
  ``$mesh/from/<it>/<kind>`` comes in through ``peer_input``, and what we send goes out
  through its ordinary Session (``AcceptedLink``);
- a node we dialled answers our LinkClient; what it publishes on ``$mesh/to/<us>/<kind>``
  comes in through ``link_message``.
Both reach the one ``receive`` path. Each side introduces itself with a hello
(mesh/link/hello.py; the listener answers the dialler's); the hello's node must be the one the
handshake proved. If both nodes dial each other, the link dialled by the smaller node id
stays, whichever of the two came up first.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ...message import Message
from ...ports import NO_HITS, Batch, Hits, Log, MeshIO, PeerLink, PeerRefused
from ..routing.actions import Unicast
from ..routing.engine import MeshEngine
from ..routing.wire import MeshProtocolError
from .hello import Hello, HelloVersionError, encode_hello, parse_hello
from .peerauth import PEER_PROTOCOL, ListenerAuth, listen

if TYPE_CHECKING:
    from collections.abc import Hashable

    from ...broker import Broker
    from ...channel import Channel
    from ..cluster.cluster import Cluster

__all__ = ["FLUSH_EVERY", "AcceptedLink", "PeerLinks", "refusal_reason"]

FLUSH_EVERY = 256  # routed messages after which the mesh sends without waiting for the loop
# routed messages after which they go at the end of the loop turn, not mesh.batch_delay later:
# a node that routes this many in a turn is busy enough to fill its batches without waiting,
# and its peers should not sit idle for the delay
FLUSH_SOON_AT = 32

# what a listener's refusal of our CONNECT most likely means (channel.py _on_peer_connect)
_REFUSALS = {
    0x02: "our ClientId $mesh-<node> was rejected",
    0x04: f"our mesh protocol {PEER_PROTOCOL} credentials were refused: it may be a node of "
    f"another protocol version (its log names both)",
    0x05: "it is not a mesh node, or it wants a TLS client certificate (mesh.tls_mutual)",
    0x80: "it refused our SUBSCRIBE",
}


def refusal_reason(code: int) -> str:
    """What a listener's CONNACK (or SUBACK 0x80) refusing our link most likely means."""
    return _REFUSALS.get(code, "see its log")


class AcceptedLink:
    """A link a peer dialled: a Channel of our broker that proved the cluster secret."""

    answers_hello = True
    handshake_rtt: float | None = None  # the dialler measured it, and says it in its hello

    def __init__(self, channel: Channel):
        self.channel = channel
        self.proved: str = channel.peer_node or ""
        self.dialler = self.proved
        self.peer = ""
        self.address: str | None = channel.peer

    def congestion_key(self) -> Hashable:
        return self.channel.session  # the peer's ordinary session: its queue and socket

    def send(self, kind: str, payload: bytes, qos: int) -> None:
        channel = self.channel
        session = channel.session
        if session is None or session.channel is not channel:
            return
        # delivered on the subscription $mesh/to/<peer>/# the peer made [MQTT-3.3.2-3]
        session.deliver(Message(f"$mesh/to/{self.proved}/{kind}", payload, qos), qos)

    def close(self, reason: str) -> None:
        self.channel.close(reason)


class PeerLinks:
    """The link table and everything decided about links (implements ports.PeerPort)."""

    def __init__(
        self,
        node_id: str,
        incarnation: int,
        secret: bytes,
        engine: MeshEngine,
        links: dict[str, PeerLink],
        broker: Broker,
        cluster: Cluster,
        io: MeshIO,
        log: Log,
        *,
        certificate_required: bool = False,
        connect_all: bool = False,
    ):
        self.node_id = node_id
        self.incarnation = incarnation
        self.secret = secret
        self.engine = engine
        self.broker = broker
        self.cluster = cluster
        self.io = io
        self.log = log
        self.certificate_required = certificate_required
        self.connect_all = connect_all  # mesh.connect = "all": dial every node we learn of
        self.links = links  # peer node -> its current link (shared with the MeshGateway)
        self._inbound: dict[Channel, AcceptedLink] = {}  # peer channels that published
        # messages from other nodes whose end-to-end acknowledgement waits for the store to
        # commit what they queued here (the journal batch, in the order they came: batches
        # only grow): sent by ``committed``
        self._acks_after: deque[tuple[Batch, Message]] = deque()
        self._to_me = f"$mesh/to/{node_id}/"
        self._membership: tuple[tuple[str, ...], tuple[tuple[str, int], ...], bool] | None = None
        self._seen_changes = -1

    # -- a node that dialled us (the Channel's side) -----------------------------------------

    def listen(self, client_id: str, password: bytes | None, certified: bool) -> ListenerAuth | PeerRefused:
        """A CONNECT with the peer user name (channel_peer.py): our half of the handshake, with
        a nonce fresh for it, or why it is refused (peerauth.listen)."""
        me = (self.secret, self.node_id, self.incarnation)
        return listen(*me, self.io.nonce, client_id, password, certified, self.certificate_required)

    def peer_input(self, channel: Channel, msg: Message, now: float) -> tuple[Batch, Hits]:
        """A PUBLISH from a peer that dialled us; the batch its PUBACK waits for and the
        congested local sessions it reached (``receive``)."""
        prefix = f"$mesh/from/{channel.peer_node}/"
        if not msg.topic.startswith(prefix):
            channel.close(f"peer {channel.peer_node} published on {msg.topic!r}")
            return 0, NO_HITS
        link = self._inbound.get(channel)
        if link is None:
            link = self._inbound[channel] = AcceptedLink(channel)
        return self.receive(link, msg.topic[len(prefix) :], msg.payload, now)

    def peer_closed(self, channel: Channel, now: float) -> None:
        link = self._inbound.pop(channel, None)
        if link is not None:
            self.closed(link, channel.close_reason or "closed", now)

    # -- a node we dialled (the I/O layer's LinkClient) ----------------------------------------

    def dialled_ready(self, link: PeerLink) -> None:
        """The listener of a link we dialled proved the secret (ours is on its way): introduce
        ourselves, with the round trip we measured; the peer answers with its own hello."""
        link.send("hello", self.hello(link.handshake_rtt), 1)

    def link_message(self, link: PeerLink, topic: str, payload: bytes, now: float) -> Hits:
        """A PUBLISH on our subscription; its PUBACK has gone already (custody at the origin
        holds the guarantee), so the batch is not waited for; the congested local sessions
        it reached (``receive``)."""
        if topic.startswith(self._to_me):
            return self.receive(link, topic[len(self._to_me) :], payload, now)[1]
        return NO_HITS

    # -- either side ---------------------------------------------------------------------------

    def receive(self, link: PeerLink, kind: str, payload: bytes, now: float) -> tuple[Batch, Hits]:
        """The one receive path: a message of ``kind`` on ``link``; the journal batch an
        acknowledgement of it must wait for, and the congested local sessions what it
        brought reached: the link owes them (flow.py)."""
        if kind == "hello":
            self._hello(link, payload, now)
            return 0, NO_HITS
        if self.links.get(link.peer) is not link:
            return 0, NO_HITS  # not introduced yet, or a duplicate link we are closing
        return self._inbound_messages(link, kind, payload, now)

    def rtt(self, link: PeerLink, seconds: float, now: float) -> None:
        if self.links.get(link.peer) is link:
            self.engine.link_rtt(link.peer, seconds * 1e6, now)
            self.io.flush_soon()

    def closed(self, link: PeerLink, reason: str, now: float) -> None:
        """A link ended; only the current link's end takes the peer down."""
        if link.peer and self.links.get(link.peer) is link:
            del self.links[link.peer]
            self.log.warning("link to %s down: %s", link.peer, reason)
            self.engine.link_down(link.peer, now)
            self.io.flush_soon()

    def hello(self, rtt: float | None = None) -> bytes:
        """Our hello; the dialler adds the round trip it measured (seconds)."""
        rtt_us = rtt * 1e6 if rtt is not None else None
        return encode_hello(Hello(self.node_id, self.incarnation, self.engine.addresses, rtt_us))

    def _hello(self, link: PeerLink, payload: bytes, now: float) -> None:
        try:
            hello = parse_hello(payload)
        except HelloVersionError as exc:
            self.log.warning("peer %s: %s", link.address, exc)
            link.close(str(exc))
            return
        except MeshProtocolError as exc:
            link.close(str(exc))
            return
        if hello.node != link.proved:
            reason = f"hello from {hello.node!r} on a link authenticated as {link.proved!r}"
            self.log.warning("peer %s: %s", link.address, reason)
            link.close(reason)
            return
        if link.answers_hello:
            link.send("hello", self.hello(), 1)
        elif link.address:
            self.io.learned(link.address, hello.node)
        self._ready(link, hello, now)

    def _ready(self, link: PeerLink, hello: Hello, now: float) -> None:
        peer = hello.node
        if peer == self.node_id:
            link.close("that is this node itself")
            return
        link.peer = peer
        current = self.links.get(peer)
        if current is link:
            return
        if current is not None:
            # two links between the same pair: keep the one dialled by the smaller id
            if link.dialler != current.dialler and link.dialler > current.dialler:
                link.close(f"duplicate link to {peer}")
                return
            self.links[peer] = link
            current.close(f"replaced by a link dialled by {link.dialler}")
            self.log.info("link to %s switched to the one dialled by %s", peer, link.dialler)
            return
        self.links[peer] = link
        self.log.info("link to %s up (dialled by %s)", peer, link.dialler)
        # the first cost: the dialler's SUBSCRIBE/SUBACK round trip (it measured it before its
        # hello, and says it in there), so a new link is not advertised at the floor cost and
        # again a keepalive later when the first PINGRESP says what it really costs
        rtt = link.handshake_rtt
        rtt_us = rtt * 1e6 if rtt is not None else hello.rtt_us
        cost = int(rtt_us) if rtt_us is not None and rtt_us > 0 else None
        self.engine.link_up(peer, now, cost)
        for address in hello.addresses:
            self.io.learned(address, peer)
        self.io.flush_soon()

    # -- what the engine hands us ----------------------------------------------------------------

    def _inbound_messages(self, link: PeerLink, kind: str, payload: bytes, now: float) -> tuple[Batch, Hits]:
        engine = self.engine
        try:
            deliveries, unicasts = engine.receive(link.peer, kind, payload, now)
        except MeshProtocolError as exc:
            self.log.warning("peer %s sent something invalid: %s", link.peer, exc)
            link.close(f"mesh protocol error: {exc}")
            return 0, NO_HITS
        # (a fwd batch brings deliveries only, a uni message unicasts only: no order to keep)
        for unicast in unicasts:
            self._unicast(unicast, now)
        return self._deliver(deliveries, now, len(unicasts))

    def _deliver(self, deliveries: Sequence[Message], now: float, unicasts: int = 0) -> tuple[Batch, Hits]:
        """Messages from other nodes to this node's sessions; each QoS 1/2 one acknowledged to
        its origin once the store has it (an expired one too: it is not delivered, but it
        arrived). Returns the journal batch to wait for and the congested sessions they
        reached."""
        engine = self.engine
        broker = self.broker
        congested: list[Hashable] = []
        if not broker.journal.persistent:
            dispatch = broker.dispatch
            for msg in deliveries:
                if msg.expires is not None:
                    msg = msg.at(now)  # (it may have waited for its predecessor: order.py)
                hits = dispatch(msg)  # in memory: nothing to wait for before acknowledging
                if hits:
                    congested += hits
                if msg.qos:  # QoS 1/2: acknowledged end to end to the origin's custody
                    engine.delivered(msg)
            self.io.flush_later()  # (the acknowledgements: nobody waits on them at once)
            if len(deliveries) + unicasts >= FLUSH_EVERY // 4:
                # a read from the link holds up to 16 batches: pass each on as it comes (as
                # the publishers' side does every FLUSH_EVERY messages)
                self.io.write_clients_now()
            return 0, congested or NO_HITS
        batch = 0
        committed = broker.journal.committed
        for msg in deliveries:
            if msg.expires is not None:
                msg = msg.at(now)
            wrote, hits = broker.deliver_remote(msg)
            if hits:
                congested += hits
            if msg.qos:
                if wrote > committed:
                    self._acks_after.append((wrote, msg))
                else:
                    engine.delivered(msg)
            batch = max(batch, wrote)
        self.io.flush_later()
        return batch, congested or NO_HITS

    def _unicast(self, unicast: Unicast, now: float) -> None:
        frm, kind, body, age = unicast
        if kind.startswith("ops."):
            self.io.inquiry(frm, kind, body)  # an operator's question (server/ops.py)
            return
        try:
            self.cluster.receive(frm, kind, body, now, age)
        except (ValueError, KeyError, TypeError, IndexError) as exc:
            self.log.warning("node %s sent an invalid %s: %r", frm, kind, exc)
        except Exception:  # a bug of ours must not take the link's other messages with it
            self.log.exception("handling %s from node %s failed", kind, frm)

    def committed(self, batch: Batch) -> None:
        """The store committed ``batch``: the messages it queued here are acknowledged to
        their origins' custody now."""
        waiting = self._acks_after
        if not waiting or waiting[0][0] > batch:
            return
        engine = self.engine
        while waiting and waiting[0][0] <= batch:
            engine.delivered(waiting.popleft()[1])
        self.io.flush_later()

    def _check_membership(self, now: float) -> None:
        """Tell the cluster when the reachable set or an incarnation changed (not on a refresh)."""
        engine = self.engine
        if engine.changes == self._seen_changes:
            return
        self._seen_changes = engine.changes
        live = engine.reachable()
        # every node of the database, reachable or not: a node that just started learns
        # from its neighbours of the nodes across a partition, and counts them in its quorum
        # and in each session's home (membership.py), as the nodes that saw them do
        incs = {n: r.inc for n, r in engine.routers.items()}
        key = (tuple(live), tuple(sorted(incs.items())), engine.synced)
        if key != self._membership:
            self._membership = key
            self.cluster.membership(live, incs, now, engine.synced)

    # -- once per loop iteration, and on the timer --------------------------------------------------

    def flush(self, now: float) -> None:
        """Hand what the cluster and the engine queued to the links (the I/O writes them)."""
        self._check_membership(now)
        self.cluster.flush(now)
        links = self.links
        for peer, kind, payload, qos in self.engine.flush(now):
            link = links.get(peer)
            if link is not None:
                link.send(kind, payload, qos)

    def tick(self, now: float) -> list[tuple[str, str]]:
        """The timers of the cluster and the engine; (node, address) pairs to dial when
        ``connect_all`` (nodes with a larger id that we have no link to: they do not dial us)."""
        self._check_membership(now)
        self.cluster.tick(now)
        self.cluster.flush(now)
        late = self.engine.release_held(now)  # (waited for a predecessor too long: order.py)
        if late:
            self._deliver(late, now)  # (their links were read long ago: no one to hold back)
        links = self.links
        for peer, kind, payload, qos in self.engine.tick(now):
            link = links.get(peer)
            if link is not None:
                link.send(kind, payload, qos)
        here = self.engine.served_here()  # (custody re-routed to members here: finding 36)
        if here:
            self._deliver(here, now)
        if not self.connect_all:
            return []
        return [
            (node, addresses[0])
            for node, addresses in self.engine.known_addresses().items()
            if node > self.node_id and node not in links and addresses
        ]

    def status(self) -> dict[str, object]:
        """The engine's status, the links and the cluster's (the caller adds the time)."""
        status: dict[str, object] = self.engine.status()
        status["links"] = {
            peer: {"dialled_by": link.dialler, "address": link.address} for peer, link in sorted(self.links.items())
        }
        status["cluster"] = self.cluster.status()
        return status
