"""The mesh at the I/O layer: sockets of peer links, dialling, timers, flush scheduling.

A peer link is an ordinary MQTT connection. The node that dials is a client
(``PeerClient`` around the pure ``mesh.client.LinkClient``): it publishes on
``$mesh/from/<self>/<kind>`` and receives on ``$mesh/to/<self>/<kind>``, which
it subscribes to. Before anything else both nodes prove they hold the cluster
secret, with a nonce of each side (mesh/link/peerauth.py, drawn here). The node that
accepts sees a Channel that becomes a peer once the dialler's proof checks out;
what it sends goes through that peer's ordinary Session (the in-flight window,
QoS 1 and retransmission of the normal client machinery).
Either side may dial; if both do, the link dialled by the smaller node id stays.
What is decided about links (hellos, which link is current, what arrives on them) is
mesh/link/links.py; what the local broker's publishers and subscribers mean for the mesh
is mesh/link/gateway.py. This module only moves bytes and keeps time for them.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import secrets
import time
from typing import TYPE_CHECKING

from ..assembly import MeshConfig
from ..config import Config, read_first_line
from ..mesh.cluster.cluster import Cluster, ClusterSettings
from ..mesh.link.client import AuthFailed, LinkClient, ProtocolError, Ready, Received, Refused, Rtt
from ..mesh.link.gateway import MeshGateway
from ..mesh.link.links import PeerLinks, refusal_reason
from ..mesh.link.peerauth import NONCE_BYTES
from ..mesh.routing.engine import MeshEngine, MeshSettings
from .metrics import RTT_BUCKETS, Histogram
from .tls import peer_certificate_required, peer_context

if TYPE_CHECKING:
    from ..broker import Broker

log = logging.getLogger("mqttmesh.mesh")

# the engine's counters of messages given up on or sent again (logged at a stop, if any)
_GIVEN_UP = (
    "unreachable_drops",
    "hop_limit_drops",
    "custody_expired",
    "custody_overflow",
    "reorder_timeouts",
    "reorder_overflow",
    "shared_unreachable",
    "shared_rerouted",
    "shared_hold_expired",
    "shared_parked_expired",
    "shared_parked_dropped",
)
# and the shared subscriptions' (shared.py SharedSubscriptions)
_SHARED_MOVED = ("dropped", "abandoned", "resent", "redispatched", "kept_once", "passed_over")


def read_secret(config: Config) -> bytes:
    path = config.get("mesh.secret_file")
    secret = read_first_line("mesh.secret_file", path) if path else config.get("mesh.cluster_secret")
    return secret.encode()


_LINK_QUEUE_HIGH = 1000  # QoS 1 batches waiting behind a dialled link's in-flight window
_LINK_QUEUE_LOW = 250


class PeerClient(asyncio.Protocol):
    """Our end of a link we dialled (a ports.PeerLink)."""

    answers_hello = False

    def __init__(self, mesh: MeshNode, dialler: Dialler):
        self.mesh = mesh
        self.dialler_obj = dialler
        self.dialler = mesh.node_id
        self.peer = ""
        self.address: str | None = dialler.address
        self.handshake_rtt: float | None = None  # measured before our hello
        self.client: LinkClient = dialler.client
        self.proved = ""  # the node id the listener proved the cluster secret for
        self.transport: asyncio.Transport | None = None
        self.loop = mesh.loop
        self.done = self.loop.create_future()
        self._topic_prefix = f"$mesh/from/{mesh.node_id}/"
        # flow control (flow.py) treats this link like a client channel: it can be paused
        # (a ports.Pausable) when what it brings cannot be delivered, and be congested when
        # the peer is slow
        self.state = "connecting"
        self.reading_paused = False
        self.written = 0  # bytes handed to the transport, ever

    def congestion_key(self):
        return self

    @property
    def acked(self) -> int:
        """Batches the peer acknowledged, ever (progress: Node._progress)."""
        return self.client.acked

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
        mesh = self.mesh
        congestion = mesh.broker.congestion
        congested: list = []  # the congested local sessions what this read brought reached
        for event in self.client.receive_data(data, now):
            if type(event) is Received:
                hits = mesh.peer_links.link_message(self, event.topic, event.payload, now)
                if hits:
                    congested += hits
            elif type(event) is Ready:
                self.state = "connected"
                self.proved = self.client.peer or ""
                self.handshake_rtt = event.rtt
                mesh.peer_links.dialled_ready(self)
            elif type(event) is Rtt:
                if self.peer:
                    mesh.peer_links.rtt(self, event.seconds, now)
                    rtt = mesh.rtt.get(self.peer)
                    if rtt is None:
                        rtt = mesh.rtt[self.peer] = Histogram(RTT_BUCKETS)
                    rtt.observe(event.seconds)
            elif type(event) is Refused:
                log.warning(
                    "peer %s refused our link: code 0x%02x (%s)",
                    self.address,
                    event.code,
                    refusal_reason(event.code),
                )
                self.transport.close()
            elif type(event) is AuthFailed:
                log.warning("peer %s failed the peer handshake, closing: %s", self.address, event.reason)
                self.transport.close()
            elif type(event) is ProtocolError:
                log.warning("peer %s: %s", self.address, event.reason)
                self.transport.close()
        if congested:
            # what this link brought reached a local client that cannot keep up: read it no
            # faster than that client drains, so the peer's sending backs up and paces its
            # publishers, for at most backpressure_timeout at a time (the link carries the
            # other sessions' messages and the cluster's too)
            congestion.hold(self, congested, now, bounded=True)
        if self in congestion.reasons:
            self._check_queue()
        # what this read calls for (the link PUBACKs of the batches it brought, and any
        # handshake step) goes out with what the engine answers them with (end-to-end
        # acknowledgements, within mesh.batch_delay): one write to the peer, not two
        if self.state == "connected":
            mesh.mark_dirty_later(self)
        else:
            self._write()

    def connection_lost(self, exc) -> None:
        self.state = "closed"
        congestion = self.mesh.broker.congestion
        congestion.forget(self)
        congestion.unpause(self)
        self.client.connection_lost()
        self.mesh.peer_links.closed(self, "connection closed", self.loop.time())
        if not self.done.done():
            self.done.set_result(None)

    def _write(self) -> None:
        data = self.client.data_to_send()
        if data and self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)
            self.written += len(data)  # (progress: Node._progress)

    # link side
    def send(self, kind: str, payload: bytes, qos: int) -> None:
        client = self.client
        client.publish(self._topic_prefix + kind, payload, qos)
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
            log.info("closing link to %s (%s): %s", self.peer or "?", self.address, reason)
            self.transport.close()

    def tick(self, now: float) -> None:
        if self.reading_paused:
            self.client.last_rx = now  # we are not reading (flow control): its silence is ours
        dead = self.client.tick(now)
        if dead:
            log.warning("link to %s (%s) is dead: %s", self.peer or "?", self.address, dead)
            self.transport.abort()
            return
        self._write()


class Dialler:
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
            active = self.mesh.peer_links.links.get(self.peer) if self.peer else None
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
    """The mesh's event-loop side (ports.MeshIO): timers, flush scheduling, link writes,
    custody restored from the store, and $SYS/mesh/*. The pure side (engine, gateway,
    cluster, links) is built with the rest of the core (assembly.build_core), with this
    object as its MeshIO; ``start`` takes it from the node's core."""

    def __init__(self, node, config: Config):
        self.node = node
        self.config = config
        self.loop = node.loop
        self.secret = read_secret(config)
        self.tls = peer_context(config)
        # mesh.tls_mutual: a peer CONNECT must come with a verified TLS client certificate
        self.peer_certificate_required = peer_certificate_required(config)
        self.engine: MeshEngine | None = None
        self.peer_links: PeerLinks | None = None
        self.gateway: MeshGateway | None = None
        self.cluster: Cluster | None = None
        self.broker: Broker | None = None  # the node's, from start() on (the links' flow control uses its congestion)
        self.diallers: dict[str, Dialler] = {}
        self.rtt: dict[str, Histogram] = {}  # peer -> round trips of the link we dialled (/metrics)
        self._dirty: set = set()
        self._flush_handle: asyncio.Handle | None = None  # the flush to come (_flush), if any
        self._flush_delayed = False  # it comes mesh.batch_delay after it was asked for
        self._flushing = False
        self._batch_delay: float = config.get("mesh.batch_delay")
        self._tick_handle = None
        self._status_at = 0.0
        self.node_id = ""
        self.incarnation = 0

    # -- life cycle -----------------------------------------------------------------

    def core_config(self, port: int) -> MeshConfig:
        """What assembly.build_core needs for the mesh, ``port``: the one peers dial."""
        cfg = self.config
        advertise = cfg.get("mesh.advertise") or f"{cfg.host}:{port}"
        settings = MeshSettings(
            hop_limit=cfg.get("mesh.hop_limit"),
            retransmit_after=cfg.get("mesh.retransmit_after"),
            custody_limit=cfg.get("mesh.custody_limit"),
            custody_timeout=cfg.get("mesh.custody_timeout"),
            reorder_wait=cfg.get("mesh.reorder_wait"),
            reorder_limit=cfg.get("mesh.reorder_limit"),
            dedup_window=cfg.get("mesh.dedup_window"),
            max_age=cfg.get("mesh.max_age"),
            shared_strategy=cfg.get("mqtt.shared_strategy"),
            shared_reroute=cfg.get("mesh.shared_reroute"),
        )
        cluster = ClusterSettings(
            replication=cfg.get("mesh.replication"),
            will_delay=cfg.get("mesh.will_delay"),
            claim_timeout=cfg.get("mesh.claim_timeout"),
            # (the timer runs every min(0.25, keepalive / 4) s; a link is dead after 3 x keepalive,
            # counted from what was last heard, at most a keepalive before a gap: a shorter gap
            # than 2 x keepalive, less a tick, cannot have cost a link; a longer one may have)
            stall=2 * cfg.get("mesh.keepalive") - min(0.25, cfg.get("mesh.keepalive") / 4),
            quorum_grace=3 * cfg.get("mesh.keepalive"),
            expect_peers=bool(cfg.get("mesh.peers")),
        )
        return MeshConfig(
            self.secret,
            [advertise],
            self,
            log,
            settings,
            cluster,
            certificate_required=self.peer_certificate_required,
            connect_all=cfg.get("mesh.connect") == "all",
        )

    async def start(self) -> None:
        node = self.node
        core = node.core
        self.node_id = node.node_id
        self.incarnation = node.incarnation
        self.engine, self.gateway, self.cluster, self.peer_links = core.engine, core.gateway, core.cluster, core.links
        self.broker = core.broker
        cfg = self.config
        if self.broker.journal.persistent:
            restored = node.store.load_custody()
            for msg, dests in restored:
                self.engine.restore_custody(msg, dests, self.loop.time())
            if restored:
                log.info("%d messages in custody restored; they are sent again", len(restored))
        for address in cfg.get("mesh.peers"):
            self.dial(address, configured=True)
        self.flush_soon()  # what the restored sessions' filters told the engine
        self._tick_handle = self.loop.call_later(0.05, self._tick)
        log.info(
            "mesh node %r (incarnation %d) advertising %s, %d configured peer(s), connect=%s",
            self.node_id,
            self.incarnation,
            self.engine.addresses[0],
            len(cfg.get("mesh.peers")),
            cfg.get("mesh.connect"),
        )

    def stop(self) -> None:
        if self._tick_handle is not None:
            self._tick_handle.cancel()
        for dialler in self.diallers.values():
            dialler.cancel()
        self._log_given_up()

    def _log_given_up(self) -> None:
        """At a stop, what this life of the node gave up on or sent again (the counters of
        docs/operations.md's metrics), when any: an operator, or the fault harness's
        ``--keep``, reads from the log where a message went without a metrics scrape."""
        counters = self.engine.counters
        parts = [f"{k}={counters[k]}" for k in _GIVEN_UP if counters.get(k)]
        if self.broker is not None:
            shared = self.broker.shared
            parts += [f"shared_{k}={getattr(shared, k)}" for k in _SHARED_MOVED if getattr(shared, k)]
        if self.cluster is not None:
            # QoS 2 messages a merge of session copies took for completed (snapshots.merged_away)
            away = self.cluster.counters.get("merged_away_in_flight", 0)
            if away:
                parts.append(f"merged_away_in_flight={away}")
        if parts:
            log.info("given up or sent again in this life: %s", ", ".join(parts))

    def dial(self, address: str, configured: bool = False) -> None:
        if address not in self.diallers:
            self.diallers[address] = Dialler(self, address, configured)

    # -- ports.MeshIO ------------------------------------------------------------------------

    def flush_soon(self) -> None:
        handle = self._flush_handle
        if handle is None:
            self._flush_handle = self.loop.call_soon(self._flush)
        elif self._flush_delayed and not self._flushing:
            handle.cancel()  # (what waited for mesh.batch_delay goes now, with this)
            self._flush_delayed = False
            self._flush_handle = self.loop.call_soon(self._flush)

    def flush_later(self) -> None:
        if self._flush_handle is None:
            if self._batch_delay:  # what comes meanwhile goes in the same writes
                self._flush_delayed = True
                self._flush_handle = self.loop.call_later(self._batch_delay, self._flush)
            else:
                self._flush_handle = self.loop.call_soon(self._flush)

    def flush_now(self) -> None:
        """Send what is routed so far without waiting for the end of this loop iteration
        (the scheduled _flush still comes; it finds little to do)."""
        self._send()
        self.node.flush_now()

    def write_clients_now(self) -> None:
        self.node.flush_now()

    def nonce(self) -> bytes:
        return secrets.token_bytes(NONCE_BYTES)

    def learned(self, address: str, node: str) -> None:
        known = self.diallers.get(address)
        if known is not None:
            known.peer = node

    def inquiry(self, frm: str, kind: str, payload: bytes) -> None:
        self.node.inquiries.receive(frm, kind, payload)

    # -- writing the links -----------------------------------------------------------------------

    def mark_dirty(self, link) -> None:
        if isinstance(link, PeerClient):
            self._dirty.add(link)
            self.flush_soon()

    def mark_dirty_later(self, link: PeerClient) -> None:
        """``link`` has only what can wait for mesh.batch_delay to write (acknowledgements)."""
        self._dirty.add(link)
        self.flush_later()

    def _flush(self) -> None:
        # (the handle stays while the links are handed what is queued: a link that this
        # marks dirty is written by this flush, not by another scheduled for nothing)
        self._flushing = True
        try:
            self._send()
        finally:
            self._flushing = False
            self._flush_delayed = False
            self._flush_handle = None

    def _send(self) -> None:
        """Hand what the engine and the cluster queued to the links, and write the links."""
        if self.peer_links is None:
            return  # asked while the store loads, before start(): start() asks again
        self.gateway.sent()
        self.peer_links.flush(self.loop.time())
        dirty, self._dirty = self._dirty, set()
        for link in dirty:
            link.flush()

    def _tick(self) -> None:
        now = self.loop.time()
        links = self.peer_links.links
        for link in list(links.values()):
            if isinstance(link, PeerClient):
                link.tick(now)
        for dialler in self.diallers.values():  # links still being set up ping too
            protocol = dialler.protocol
            if protocol is not None and protocol.peer not in links:
                protocol.tick(now)
        for node, address in self.peer_links.tick(now):  # mesh.connect = "all"
            if not any(d.peer == node for d in self.diallers.values()):
                self.dial(address)
        for link in list(self._dirty):
            link.flush()
        self._dirty.clear()
        if now - self._status_at >= self.config.get("mesh.status_interval"):
            self._status_at = now
            self.publish_status()
        self._tick_handle = self.loop.call_later(min(0.25, self.config.get("mesh.keepalive") / 4), self._tick)

    # -- status ----------------------------------------------------------------------------------

    def status(self) -> dict:
        status = self.peer_links.status()
        status["time"] = time.time()
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
