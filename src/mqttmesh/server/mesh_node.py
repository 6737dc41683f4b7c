"""The mesh at the I/O layer: peer links, dialling, and the routing engine's actions.

A peer link is an ordinary MQTT connection. The node that dials is a client
(``PeerClient`` around the pure ``mesh.client.LinkClient``): it publishes on
``$mesh/from/<self>/<kind>`` and receives on ``$mesh/to/<self>/<kind>``, which
it subscribes to. Before anything else both nodes prove they hold the cluster
secret, with a nonce of each side (mesh/peerauth.py, drawn here). The node that
accepts sees a Channel that becomes a peer once the dialler's proof checks out;
what it sends goes through that peer's ordinary Session (the in-flight window,
QoS 1 and retransmission of the normal client machinery).
Either side may dial; if both do, the link dialled by the smaller node id stays.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import secrets
import time

from ..config import Config
from ..mesh.actions import Unicast
from ..mesh.client import LinkClient
from ..mesh.cluster import Cluster, ClusterSettings
from ..mesh.engine import MeshEngine, MeshProtocolError, MeshSettings
from ..mesh.peerauth import NONCE_BYTES, PEER_PROTOCOL, ListenerAuth, PeerConnect
from ..message import Message
from .tls import peer_certificate_required, peer_context

log = logging.getLogger("mqttmesh.mesh")


def read_secret(config: Config) -> bytes:
    secret = config.get("mesh.cluster_secret")
    path = config.get("mesh.secret_file")
    if path:
        from ..auth import ConfigError

        try:
            with open(path, encoding="utf-8") as fh:
                secret = fh.readline().strip()
        except OSError as exc:
            raise ConfigError(f"mesh.secret_file: cannot read {path}: {exc.strerror}") from None
        if not secret:
            raise ConfigError(f"mesh.secret_file: {path} is empty")
    return secret.encode()


FLUSH_EVERY = 256  # routed messages after which the mesh sends without waiting for the loop
_LINK_QUEUE_HIGH = 1000  # QoS 1 batches waiting behind a dialled link's in-flight window
_LINK_QUEUE_LOW = 250
# what a listener's refusal of our CONNECT most likely means (channel.py _on_peer_connect)
_REFUSALS = {
    0x02: "our ClientId $mesh-<node> was rejected",
    0x04: f"our mesh protocol {PEER_PROTOCOL} credentials were refused: it may be a node of "
    f"another protocol version (its log names both)",
    0x05: "it is not a mesh node, or it wants a TLS client certificate (mesh.tls_mutual)",
    0x80: "it refused our SUBSCRIBE",
}


class _Link:
    """An established link to one peer node, whichever side dialled."""

    dialer: str = ""
    peer: str = ""
    handshake_rtt: float | None = None  # measured by the dialling side before its hello

    def congestion_key(self):
        """What flow control knows this link by when it is congested."""
        return self

    def send(self, kind: str, payload: bytes, qos: int) -> None:
        raise NotImplementedError

    def close(self, reason: str) -> None:
        raise NotImplementedError


class InboundLink(_Link):
    def __init__(self, mesh: MeshNode, channel, peer: str):
        self.mesh = mesh
        self.channel = channel
        self.peer = peer
        self.dialer = peer

    def congestion_key(self):
        return self.channel.session  # the peer's ordinary session: its queue and socket

    def send(self, kind: str, payload: bytes, qos: int) -> None:
        session = self.channel.session
        if session is None or session.channel is not self.channel:
            return
        # delivered on the subscription $mesh/to/<peer>/# the peer made [MQTT-3.3.2-3]
        session.deliver(Message(f"$mesh/to/{self.peer}/{kind}", payload, qos), qos)

    def close(self, reason: str) -> None:
        self.channel.close(reason)


class PeerClient(asyncio.Protocol, _Link):
    """Our end of a link we dialled."""

    def __init__(self, mesh: MeshNode, dialer: Dialer):
        self.mesh = mesh
        self.dialer_obj = dialer
        self.dialer = mesh.node_id
        self.client: LinkClient = dialer.client
        self.proved: str | None = ""  # the node id the listener proved the cluster secret for
        self.transport: asyncio.Transport | None = None
        self.loop = mesh.loop
        self.done = self.loop.create_future()
        self._topic_prefix = f"$mesh/from/{mesh.node_id}/".encode()
        # flow control (flow.py) treats this link like a client channel: it can be paused
        # (a ports.Pausable) when what it brings cannot be delivered, and be congested when
        # the peer is slow
        self.state = "connecting"
        self.reading_paused = False

    # flow control ---------------------------------------------------------------------
    def pause_reading(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.reading_paused = True
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self.state != "connected":
            return  # closed meanwhile
        if self.transport is not None and not self.transport.is_closing() and self.reading_paused:
            self.reading_paused = False
            self.transport.resume_reading()

    def pause_writing(self) -> None:
        self.mesh.broker.congestion.add(self, "socket")  # the peer reads slower than we send

    def resume_writing(self) -> None:
        self.mesh.broker.congestion.remove(self, "socket")

    # asyncio side
    def connection_made(self, transport) -> None:
        self.transport = transport
        # a fresh nonce per connection: the listener must prove the secret for this one
        self.client.connection_made(self.loop.time(), secrets.token_bytes(NONCE_BYTES))
        self._write()

    def data_received(self, data: bytes) -> None:
        now = self.loop.time()
        congestion = self.mesh.broker.congestion
        congestion.hit = False  # only what this read reaches counts
        events = self.client.receive_data(data, now)
        for event in events:
            kind = event[0]
            if kind == "message":
                self.mesh.link_message(self, event[1], event[2], now)
            elif kind == "ready":
                # the listener proved the secret (our proof is on its way): introduce
                # ourselves; the peer answers with its own hello
                self.state = "connected"
                self.proved = self.client.peer
                self.handshake_rtt = event[1]
                self.send("hello", self.mesh.engine.hello(rtt_us=event[1] * 1e6), 1)
            elif kind == "rtt":
                if self.peer:
                    self.mesh.link_rtt(self, event[1], now)
            elif kind == "refused":
                log.warning(
                    "peer %s refused our link: code 0x%02x (%s)",
                    self.dialer_obj.address,
                    event[1],
                    _REFUSALS.get(event[1], "see its log"),
                )
                self.transport.close()
            elif kind == "auth_failed":
                log.warning("peer %s failed the peer handshake, closing: %s", self.dialer_obj.address, event[1])
                self.transport.close()
            elif kind == "protocol_error":
                log.warning("peer %s: %s", self.dialer_obj.address, event[1])
                self.transport.close()
        if congestion.hit:
            # what this link brought reached a local client that cannot keep up: read no
            # more from it, so the peer's sending backs up and pauses its publishers
            congestion.pause(self, now)
        if self in congestion.reasons:
            self._check_queue()
        self._write()

    def connection_lost(self, exc) -> None:
        self.state = "closed"
        congestion = self.mesh.broker.congestion
        congestion.forget(self)
        congestion.unpause(self)
        self.client.connection_lost()
        self.mesh.link_closed(self)
        if not self.done.done():
            self.done.set_result(None)

    def _write(self) -> None:
        data = self.client.data_to_send()
        if data and self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    # link side
    def send(self, kind: str, payload: bytes, qos: int) -> None:
        client = self.client
        client.publish(self._topic_prefix + kind.encode(), payload, qos)
        if len(client.queue) >= _LINK_QUEUE_HIGH:
            self.mesh.broker.congestion.add(self, "queue")  # the peer acknowledges slower than we send
        self.mesh.mark_dirty(self)

    def _check_queue(self) -> None:
        if len(self.client.queue) <= _LINK_QUEUE_LOW:
            self.mesh.broker.congestion.remove(self, "queue")

    def flush(self) -> None:
        self._write()

    def close(self, reason: str) -> None:
        if self.transport is not None and not self.transport.is_closing():
            log.info("closing link to %s (%s): %s", self.peer or "?", self.dialer_obj.address, reason)
            self.transport.close()

    def tick(self, now: float) -> None:
        if self.reading_paused:
            self.client.last_rx = now  # we are not reading (flow control): its silence is ours
        dead = self.client.tick(now)
        if dead:
            log.warning("link to %s (%s) is dead: %s", self.peer or "?", self.dialer_obj.address, dead)
            self.transport.abort()
            return
        self._write()


class Dialer:
    """Keeps one peer address dialled: reconnects with backoff, yields to a link the other way."""

    def __init__(self, mesh: MeshNode, address: str, configured: bool):
        self.mesh = mesh
        self.address = address
        self.configured = configured
        self.peer: str | None = None  # learned from the hello
        host, _, port = address.rpartition(":")
        self.host, self.port = host or "127.0.0.1", int(port)
        cfg = mesh.config
        self.client = LinkClient(
            mesh.node_id,
            mesh.incarnation,
            mesh.secret,
            cfg.get("mesh.keepalive"),
            cfg.get("limits.connect_timeout"),
            max_inflight=cfg.get("limits.max_inflight"),
        )
        self.protocol: PeerClient | None = None
        self.task = mesh.loop.create_task(self._run())
        self.attempts = 0

    async def _run(self) -> None:
        loop = self.mesh.loop
        backoff = 0.1
        while True:
            active = self.mesh.links.get(self.peer) if self.peer else None
            if active is not None and active is not self.protocol:
                await asyncio.sleep(1.0)  # linked the other way round: nothing to do
                continue
            self.attempts += 1
            try:
                _, protocol = await asyncio.wait_for(
                    loop.create_connection(
                        lambda: PeerClient(self.mesh, self),
                        self.host,
                        self.port,
                        ssl=self.mesh.tls,
                        server_hostname=self.host if self.mesh.tls else None,
                    ),
                    timeout=max(1.0, 3 * self.mesh.config.get("mesh.keepalive")),
                )
            except (TimeoutError, OSError) as exc:
                if self.attempts == 1 or self.attempts % 50 == 0:
                    log.info("cannot reach peer %s yet: %s", self.address, exc)
                await asyncio.sleep(backoff * (0.5 + random.random()))
                backoff = min(backoff * 2, 2.0)
                continue
            self.protocol = protocol
            await protocol.done
            self.protocol = None
            backoff = 0.1
            await asyncio.sleep(0.05 + 0.1 * random.random())

    def cancel(self) -> None:
        self.task.cancel()
        if self.protocol is not None and self.protocol.transport is not None:
            self.protocol.transport.abort()


class MeshNode:
    def __init__(self, node, config: Config):
        self.node = node
        self.config = config
        self.loop = node.loop
        self.broker = node.broker
        self.secret = read_secret(config)
        self.tls = peer_context(config)
        # mesh.tls_mutual: a peer CONNECT must come with a verified TLS client certificate
        self.peer_certificate_required = peer_certificate_required(config)
        self.engine: MeshEngine | None = None
        self.links: dict[str, _Link] = {}
        self.dialers: dict[str, Dialer] = {}
        self._dirty: set = set()
        self._flush_scheduled = False
        self._routed = 0  # messages routed since the last flush
        self._tick_handle = None
        self._status_at = 0.0
        self._status_changes = -1
        self.node_id = ""
        self.incarnation = 0
        self.cluster: Cluster | None = None
        self._membership: tuple | None = None
        self._seen_changes = -1
        self.broker.mesh = self

    # -- life cycle -----------------------------------------------------------------

    def prepare(self) -> None:
        """Before the store loads: the cluster decides what kind of session persists."""
        node = self.node
        self.node_id = node.node_id
        self.incarnation = node.incarnation
        cfg = self.config
        settings = ClusterSettings(
            replication=cfg.get("mesh.replication"),
            will_delay=cfg.get("mesh.will_delay"),
            claim_timeout=cfg.get("mesh.claim_timeout"),
        )
        self.cluster = Cluster(
            self.node_id, self.incarnation, self.broker, self._unicast, settings, wall_offset=self.broker.wall_offset
        )

    def _unicast(self, dest: str, kind: str, payload: bytes) -> bool:
        ok = self.engine.send_unicast(dest, kind, payload)
        self._schedule_flush()
        return ok

    async def start(self) -> None:
        node = self.node
        if self.cluster is None:
            self.prepare()
        port = node.tls_port if self.tls is not None and node.tls_port else node.port
        advertise = self.config.get("mesh.advertise") or f"{self.config.host}:{port}"
        cfg = self.config
        settings = MeshSettings(
            hop_limit=cfg.get("mesh.hop_limit"),
            retransmit_after=cfg.get("mesh.retransmit_after"),
            custody_limit=cfg.get("mesh.custody_limit"),
            custody_timeout=cfg.get("mesh.custody_timeout"),
            dedup_window=cfg.get("mesh.dedup_window"),
            max_age=cfg.get("mesh.max_age"),
        )
        # with a store, QoS 1/2 messages held for other nodes survive a crash of this one
        journal = self.broker.journal
        self.engine = MeshEngine(
            self.node_id, self.incarnation, [advertise], settings, custody=journal if journal.persistent else None
        )
        self.engine.start(self.loop.time())
        if self.broker.journal.persistent:
            restored = self.node.store.load_custody()
            for msg, dests in restored:
                self.engine.restore_custody(msg, dests, self.loop.time())
            if restored:
                log.info("%d messages in custody restored; they are sent again", len(restored))
        broker = self.broker
        for topic_filter in broker.router.filters():  # restored persistent sessions
            self._filter_added(topic_filter)
        broker.on_filter_added.append(self._filter_added)
        broker.on_filter_removed.append(self._filter_removed)
        broker.on_publish.append(self._local_publish)
        for address in cfg.get("mesh.peers"):
            self.dial(address, configured=True)
        self._tick_handle = self.loop.call_later(0.05, self._tick)
        log.info(
            "mesh node %r (incarnation %d) advertising %s, %d configured peer(s), connect=%s",
            self.node_id,
            self.incarnation,
            advertise,
            len(cfg.get("mesh.peers")),
            cfg.get("mesh.connect"),
        )

    def stop(self) -> None:
        if self._tick_handle is not None:
            self._tick_handle.cancel()
        for dialer in self.dialers.values():
            dialer.cancel()

    def dial(self, address: str, configured: bool = False) -> None:
        if address not in self.dialers:
            self.dialers[address] = Dialer(self, address, configured)

    # -- the broker's hooks -------------------------------------------------------------

    def peer_handshake(self, peer: PeerConnect) -> ListenerAuth:
        """Our half of the handshake with a dialling peer, with a nonce fresh for it (channel.py)."""
        return ListenerAuth(self.secret, self.node_id, self.incarnation, secrets.token_bytes(NONCE_BYTES), peer)

    def _filter_added(self, topic_filter: str) -> None:
        if not topic_filter.startswith("$"):  # $SYS and $mesh stay local to each node
            self.engine.local_filter_added(topic_filter)
            self._schedule_flush()

    def _filter_removed(self, topic_filter: str) -> None:
        if not topic_filter.startswith("$"):
            self.engine.local_filter_removed(topic_filter)
            self._schedule_flush()

    def _local_publish(self, msg: Message) -> None:
        if msg.topic[0] != "$":
            broker = self.broker
            # the publish time on our loop clock, without asking the loop for it again
            if self.engine.route_local(msg, msg.timestamp - broker.wall_offset):
                if not self._flush_scheduled:
                    self._flush_scheduled = True
                    self._routed = 0
                    self.loop.call_soon(self._flush)
                self._routed += 1
                if self._routed >= FLUSH_EVERY:
                    self._flush_now()
            if broker.congestion.reasons:
                self._check_links(msg, broker.congestion)

    def _check_links(self, msg: Message, congestion) -> None:
        """Does this message go out over a congested link? Then its publisher waits (flow.py)."""
        engine = self.engine
        for node in engine.nodes_wanting(msg.topic):
            link = self.links.get(engine.route_to(node) or "")
            if link is not None:
                key = link.congestion_key()
                if key in congestion.reasons and key not in congestion.overrun:
                    congestion.note(key)

    def peer_input(self, channel, msg: Message, now: float) -> int:
        """A PUBLISH from a peer that dialled us; the batch its PUBACK waits for."""
        prefix = f"$mesh/from/{channel.peer_node}/"
        if not msg.topic.startswith(prefix):
            channel.close(f"peer {channel.peer_node} published on {msg.topic!r}")
            return 0
        kind = msg.topic[len(prefix) :]
        link = self.links.get(channel.peer_node)
        if kind == "hello":
            try:
                hello = MeshEngine.parse_hello(msg.payload)
            except MeshProtocolError as exc:
                channel.close(str(exc))
                return 0
            if hello["node"] != channel.peer_node:
                channel.close(f"hello from {hello['node']!r} on a link authenticated as {channel.peer_node!r}")
                return 0
            inbound = (
                link
                if isinstance(link, InboundLink) and link.channel is channel
                else InboundLink(self, channel, channel.peer_node)
            )
            inbound.send("hello", self.engine.hello(), 1)
            self._link_ready(inbound, hello)
            return 0
        if link is None or getattr(link, "channel", None) is not channel:
            return 0  # a duplicate link we are about to close, or not introduced yet
        return self._receive(link, kind, msg.payload, now)

    def peer_closed(self, channel) -> None:
        link = self.links.get(channel.peer_node)
        if isinstance(link, InboundLink) and link.channel is channel:
            self._link_down(link, channel.close_reason or "closed")

    # -- links coming and going -----------------------------------------------------------

    def link_message(self, link: PeerClient, topic: str, payload: bytes, now: float) -> None:
        prefix = f"$mesh/to/{self.node_id}/"
        if not topic.startswith(prefix):
            return
        kind = topic[len(prefix) :]
        if kind == "hello":
            try:
                hello = MeshEngine.parse_hello(payload)
            except MeshProtocolError as exc:
                link.close(str(exc))
                return
            if hello["node"] != link.proved:
                log.warning(
                    "peer %s: hello from %r on a link authenticated as %r",
                    link.dialer_obj.address,
                    hello["node"],
                    link.proved,
                )
                link.close(f"hello from {hello['node']!r} on a link authenticated as {link.proved!r}")
                return
            link.dialer_obj.peer = hello["node"]
            self._link_ready(link, hello)
            return
        if self.links.get(link.peer) is link:
            self._receive(link, kind, payload, now)

    def _link_ready(self, link: _Link, hello: dict) -> None:
        peer = hello["node"]
        if peer == self.node_id:
            link.close("that is this node itself")
            return
        link.peer = peer
        current = self.links.get(peer)
        if current is link:
            return
        if current is not None:
            # two links between the same pair: keep the one dialled by the smaller id
            keep_new = link.dialer < current.dialer if link.dialer != current.dialer else True
            if not keep_new:
                link.close(f"duplicate link to {peer}")
                return
            self.links[peer] = link
            current.close(f"replaced by a link dialled by {link.dialer}")
            log.info("link to %s switched to the one dialled by %s", peer, link.dialer)
            return
        self.links[peer] = link
        log.info("link to %s up (dialled by %s)", peer, link.dialer)
        # the first cost: the dialler's SUBSCRIBE/SUBACK round trip (it measured it before its
        # hello, and says it in there), so a new link is not advertised at the floor cost and
        # again a keepalive later when the first PINGRESP says what it really costs
        rtt = link.handshake_rtt
        rtt_us = rtt * 1e6 if rtt is not None else hello.get("rtt")
        cost = int(rtt_us) if isinstance(rtt_us, (int, float)) and rtt_us > 0 else None
        self.engine.link_up(peer, self.loop.time(), cost)
        for address in hello.get("addr", []):
            known = self.dialers.get(address)
            if known is not None:
                known.peer = peer
        self._schedule_flush()

    def link_closed(self, link: PeerClient) -> None:
        if link.peer and self.links.get(link.peer) is link:
            self._link_down(link, "connection closed")

    def _link_down(self, link: _Link, reason: str) -> None:
        del self.links[link.peer]
        log.warning("link to %s down: %s", link.peer, reason)
        self.engine.link_down(link.peer, self.loop.time())
        self._schedule_flush()

    def link_rtt(self, link: PeerClient, seconds: float, now: float) -> None:
        if self.links.get(link.peer) is link:
            self.engine.link_rtt(link.peer, seconds * 1e6, now)
            self._schedule_flush()

    # -- the engine's actions -----------------------------------------------------------------

    def _receive(self, link: _Link, kind: str, payload: bytes, now: float) -> int:
        try:
            deliveries, unicasts = self.engine.receive(link.peer, kind, payload, now)
        except MeshProtocolError as exc:
            log.warning("peer %s sent something invalid: %s", link.peer, exc)
            link.close(f"mesh protocol error: {exc}")
            return 0
        # (a fwd batch brings deliveries only, a uni message unicasts only: no order to keep)
        for unicast in unicasts:
            self._unicast_action(unicast, now)
        batch = 0
        broker = self.broker
        if not broker.journal.persistent:
            dispatch = broker.dispatch
            for msg in deliveries:
                dispatch(msg)  # in memory: nothing to wait for before acknowledging
                if msg.qos:  # QoS 1/2: acknowledged end to end to the origin's custody
                    self.engine.delivered(msg)
            self._schedule_flush()
            if len(deliveries) + len(unicasts) >= FLUSH_EVERY // 4:
                # a read from the link holds up to 16 batches: pass each on as it comes (as
                # _flush_now does for the publishers' side)
                self.node.flush_now()
            return 0
        for msg in deliveries:
            wrote = broker.deliver_remote(msg)
            if msg.qos:
                broker.after_commit(wrote, lambda m=msg: self._delivered(m))
            batch = max(batch, wrote)
        self._schedule_flush()
        return batch

    def _unicast_action(self, unicast: Unicast, now: float) -> None:
        frm, kind, body = unicast
        try:
            self.cluster.receive(frm, kind, body, now)
        except (ValueError, KeyError, TypeError, IndexError) as exc:
            log.warning("node %s sent an invalid %s: %r", frm, kind, exc)
        except Exception:  # a bug of ours must not take the link's other messages with it
            log.exception("handling %s from node %s failed", kind, frm)

    def _delivered(self, msg: Message) -> None:
        self.engine.delivered(msg)
        self._schedule_flush()

    def mark_dirty(self, link) -> None:
        if isinstance(link, PeerClient):
            self._dirty.add(link)
            self._schedule_flush()

    def _schedule_flush(self) -> None:
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self.loop.call_soon(self._flush)

    def _check_membership(self, now: float) -> None:
        engine = self.engine
        if engine.changes == self._seen_changes:
            return
        self._seen_changes = engine.changes
        live = engine.reachable()
        incs = {n: engine.routers[n].inc for n in live if n in engine.routers}
        key = (tuple(live), tuple(sorted(incs.items())))
        if key != self._membership:
            self._membership = key
            self.cluster.membership(live, incs, now)

    def _flush_now(self) -> None:
        """Send what is routed so far without waiting for the end of this loop iteration.

        One iteration can read hundreds of kilobytes from the publishers' sockets: held
        back until all of it is routed, the next node would wait idle, then work while
        this one waits for the publishers. Sending every FLUSH_EVERY messages keeps both
        busy at once (mesh2 fanin QoS 0 in the benchmark harness).
        """
        self._routed = 0
        self._send()  # the scheduled _flush still comes; it finds little to do
        self.node.flush_now()

    def _flush(self) -> None:
        self._flush_scheduled = False
        self._send()

    def _send(self) -> None:
        """Hand what the engine and the cluster queued to the links, and write the links."""
        now = self.loop.time()
        self._check_membership(now)
        self.cluster.flush()
        for peer, kind, payload, qos in self.engine.flush(now):
            link = self.links.get(peer)
            if link is not None:
                link.send(kind, payload, qos)
        dirty, self._dirty = self._dirty, set()
        for link in dirty:
            link.flush()

    def _tick(self) -> None:
        now = self.loop.time()
        link: _Link | None
        for link in list(self.links.values()):
            if isinstance(link, PeerClient):
                link.tick(now)
        for dialer in self.dialers.values():  # links still being set up ping too
            protocol = dialer.protocol
            if protocol is not None and protocol.peer not in self.links:
                protocol.tick(now)
        self._check_membership(now)
        self.cluster.tick(now)
        self.cluster.flush()
        for peer, kind, payload, qos in self.engine.tick(now):
            link = self.links.get(peer)
            if link is not None:
                link.send(kind, payload, qos)
        if self.config.get("mesh.connect") == "all":
            for node, addresses in self.engine.known_addresses().items():
                if node > self.node_id and node not in self.links and addresses:
                    if not any(d.peer == node for d in self.dialers.values()):
                        self.dial(addresses[0])
        for link in list(self._dirty):
            link.flush()
        self._dirty.clear()
        if now - self._status_at >= self.config.get("mesh.status_interval"):
            self._status_at = now
            self.publish_status()
        self._tick_handle = self.loop.call_later(min(0.25, self.config.get("mesh.keepalive") / 4), self._tick)

    # -- status ----------------------------------------------------------------------------------

    def status(self) -> dict:
        status = self.engine.status()
        status["links"] = {
            peer: {
                "dialled_by": link.dialer,
                "address": getattr(getattr(link, "dialer_obj", None), "address", None)
                or getattr(getattr(link, "channel", None), "peer", None),
            }
            for peer, link in sorted(self.links.items())
        }
        status["time"] = time.time()
        status["cluster"] = self.cluster.status()
        return status

    def publish_status(self) -> None:
        node = self.node
        # ClientIds have a topic of their own, which anonymous clients never receive
        # (Auth.can_read_sys); published first, so that whoever receives both has the
        # clients document that goes with the status by the time the status arrives
        node.publish_sys("$SYS/mesh/clients", json.dumps(self.cluster.clients(), sort_keys=True))
        status = self.status()
        node.publish_sys("$SYS/mesh/status", json.dumps(status, sort_keys=True))
        node.publish_sys("$SYS/mesh/nodes", json.dumps(sorted(status["nodes"])))
        node.publish_sys("$SYS/mesh/neighbours", json.dumps(status["neighbours"], sort_keys=True))
        node.publish_sys("$SYS/mesh/tree", json.dumps(status["tree"], sort_keys=True))
        node.publish_sys("$SYS/mesh/counters", json.dumps(status["counters"], sort_keys=True))
