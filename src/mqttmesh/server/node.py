"""A broker node: listener, connections, write batching, group commit, $SYS.

This is the I/O layer. It builds the pure core (assembly.build_core) once the node's
id, incarnation and wall offset are known, accepts connections, and performs what the
cores ask for: writes (batched per loop iteration), closes, password checks on a
thread, store commits.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import platform
import time
from collections import deque
from collections.abc import Callable

from .. import __version__
from ..assembly import MeshConfig, NodeCore, build_core
from ..auth import Acl, Auth, ConfigError, PasswordFile
from ..broker import Broker, BrokerSettings
from ..config import Config
from ..message import Message
from ..session import Limits
from ..store import NULL_JOURNAL, Journal, clock_incarnation
from .connection import PAUSE_MEMORY, Connection
from .deadlines import Deadlines
from .listeners import Listeners, http_tokens
from .logins import Logins
from .metrics import COMMIT_BUCKETS, Histogram
from .ops import Inquiries
from .sqlite_store import SqliteStore

GC_THRESHOLD = 20_000  # allocations between two collections of the youngest generation

log = logging.getLogger("mqttmesh.node")


def build_auth(config: Config) -> Auth:
    passwords = PasswordFile.load(config.get("auth.password_file")) if config.get("auth.password_file") else None
    acl = Acl.load(config.get("auth.acl_file")) if config.get("auth.acl_file") else None
    return Auth(config.get("auth.allow_anonymous"), passwords, acl, config.get("auth.cache_size"))


def _random_hex(n: int) -> str:
    """The broker's randomness (auto ClientIds): the operating system's."""
    return os.urandom(n).hex()


class Node:
    def __init__(self, config: Config, loop: asyncio.AbstractEventLoop | None = None):
        self.config = config
        self.loop = loop or asyncio.get_event_loop()
        host, port = config.host, config.port
        self.node_id = config.node_id or f"{host}-{port}"
        limits = Limits(
            max_inflight=config.get("limits.max_inflight"),
            max_queued=config.get("limits.max_queued"),
            queue_qos0=config.get("limits.queue_qos0"),
            drop_policy=config.get("limits.drop_policy"),
            max_awaiting_rel=config.get("limits.max_awaiting_rel"),
        )
        self.settings = BrokerSettings(
            node_id=self.node_id,
            limits=limits,
            max_qos=config.get("limits.max_qos"),
            max_packet_size=config.get("limits.max_packet_size"),
            max_client_id_length=config.get("limits.max_client_id_length"),
            connect_timeout=config.get("limits.connect_timeout"),
            slow_consumer_timeout=config.get("limits.slow_consumer_timeout"),
            backpressure_timeout=config.get("limits.backpressure_timeout"),
            max_connect_size=config.get("limits.max_connect_size"),
            max_keepalive=config.get("mqtt.max_keepalive"),
            max_session_expiry=config.get("mqtt.max_session_expiry"),
            receive_maximum=config.get("mqtt.receive_maximum"),
            topic_alias_maximum=config.get("mqtt.topic_alias_maximum"),
            subscribe_denied_code=config.get("mqtt.subscribe_denied_code"),
            response_information=config.get("mqtt.response_information"),
            shared_subscriptions=config.get("mqtt.shared_subscriptions"),
            shared_strategy=config.get("mqtt.shared_strategy"),
        )
        self.store: SqliteStore | None = None
        self.journal: Journal | None = None  # with a store: what the broker records for it
        if config.data_dir:
            self.store = SqliteStore(config.data_dir, config.get("store.synchronous"))
            self.journal = Journal(on_dirty=self._schedule_commit)
        self.archive = None
        if config.get("archive.enabled"):
            from .archive import ArchiveService

            self.archive = ArchiveService(self, config)  # its port goes into the Broker
        self.auth = build_auth(config)  # (a bad password or ACL file stops the node here)
        # the pure core, built by start() once the node id, incarnation and wall offset are known
        self.core: NodeCore
        self.broker: Broker
        self.logins: Logins | None = None  # (start(): it counts in the Broker's stats)
        self.max_write_buffer = config.get("limits.max_write_buffer")
        # memory of all connections' buffers (connection.py keeps the counts): above
        # buffer_high reading from clients stops until they are below buffer_low
        self.buffer_high = config.get("limits.buffer_memory")
        self.buffer_low = self.buffer_high * 3 // 4
        self.buffered = 0
        self.buffering: set[Connection] = set()  # with bytes the kernel has not taken yet
        # output over max_write_buffer: since when (loop clock)
        self.blocked: dict[Connection, float] = {}
        self.reading_paused = False
        self.preauth_memory = config.get("limits.preauth_memory")
        self.preauth_bytes = 0  # held by connections before CONNACK
        self.max_connections = config.get("limits.max_connections")
        self.connection_rate = config.get("limits.connection_rate")
        self._tokens = max(1.0, self.connection_rate)
        self._tokens_at = 0.0
        self.connections: set[Connection] = set()
        # clients' input handled per turn of the event loop (limits.read_slice): the node's
        # timers (link keepalives, the cluster's clock, which takes a long gap between its
        # ticks for a pause) run between turns however many publishers flood it
        self.read_slice = config.get("limits.read_slice")
        self._turn_started: float | None = None  # when this turn handled its first read
        self._turn_waiting: deque[Connection] = deque()  # with reads for a later turn, in order
        self.reads_waited = 0  # client reads handled at a later turn than the one they came in
        self._dirty: list[Connection] = []
        # every connection's connect timeout, then keepalive, on one timer of the loop
        self.deadlines = Deadlines(self.loop)
        self._flush_scheduled = False
        self._commit_scheduled = False
        self._commit_in_flight = False
        self._server: asyncio.base_events.Server | None = None
        # TLS, WebSocket and HTTP (listeners.py); their ports are 0 while off
        self.listeners = Listeners(self, config)
        self.http_tokens = http_tokens(config)
        # the questions the admin API asks the other nodes (ops.py)
        self.inquiries = Inquiries(self, config.get("http.mesh_timeout"))
        # re-reads the configuration and reloads (cli.py sets it: SIGHUP, POST /api/v1/reload);
        # returns what was kept after an error, or raises ConfigError for the config file
        self.reread: Callable[[], list[str]] | None = None
        self.version = __version__
        self.commit_latency = Histogram(COMMIT_BUCKETS)  # seconds per group commit (/metrics)
        self._commit_started = 0.0
        self.commit_interval = config.get("store.commit_interval")  # (a floor between commits' starts)
        self._sys_task: asyncio.Task | None = None
        self.started_at = time.time()
        self.port = port
        self.incarnation = 0
        self.mesh = None
        if config.get("mesh.cluster_secret") or config.get("mesh.secret_file"):
            from .mesh_node import MeshNode

            self.mesh = MeshNode(self, config)
        elif config.get("mesh.peers"):
            raise ConfigError("mesh.peers: a mesh needs mesh.cluster_secret or mesh.secret_file")

    # -- life cycle -----------------------------------------------------------------------

    async def start(self) -> None:
        # bind first (the port may be 0 and names the node), serve only once state is loaded
        self._server = await self.loop.create_server(
            lambda: Connection(self),
            self.config.host,
            self.config.port,
            backlog=1024,
            reuse_address=True,
            start_serving=False,
        )
        sock = self._server.sockets[0]
        self.port = sock.getsockname()[1]
        await self.listeners.bind()
        if not self.config.node_id:  # host-port, with the port actually bound
            self.node_id = self.settings.node_id = f"{self.config.host}-{self.port}"
        if self.store is not None:
            self.incarnation = self.store.next_incarnation()
        else:
            self.incarnation = clock_incarnation(time.time())
        wall_offset = time.time() - self.loop.time()  # message timestamps: the loop clock plus this
        mesh: MeshConfig | None = None
        if self.mesh is not None:
            tls_port = self.listeners.tls_port
            port = tls_port if self.mesh.tls is not None and tls_port else self.port
            mesh = self.mesh.core_config(port)
        self.core = build_core(
            self.settings,
            incarnation=self.incarnation,
            now=self.loop.time(),
            wall_offset=wall_offset,
            auth=self.auth,
            journal=self.journal if self.journal is not None else NULL_JOURNAL,
            archive=None if self.archive is None else self.archive.capture,
            random_hex=_random_hex,
            mesh=mesh,  # (sessions restored below are the mesh's replicated kind)
        )
        broker = self.broker = self.core.broker
        self.logins = Logins(self, self.config)
        if self.store is not None:
            sessions, retained = self.store.load(broker)
            if self.core.cluster is not None:
                self.core.cluster.remember(self.store.load_nodes(), self.loop.time())
            self.store.start(self._committed_on_thread)
            log.info(
                "store %s: %d persistent sessions, %d retained messages restored", self.store.path, sessions, retained
            )
        else:
            log.warning(
                "no data directory: running in memory; persistent sessions and retained "
                "messages are lost when this node stops (set --data-dir)"
            )
        if self.archive is not None:
            await self.archive.start()  # files are named by node id and incarnation, known by now
        self._housekeeping = self.loop.call_later(1.0, self._sweep)
        self._flow_period = min(0.1, max(0.01, broker.settings.backpressure_timeout / 4))
        self._flow_timer = self.loop.call_later(self._flow_period, self._flow_tick)
        # The hot path allocates a few short-lived objects per message (and an archive
        # with topic filters a record tuple): with the default threshold (700) the youngest
        # generation is collected every few hundred messages. Collect it every 20,000
        # allocations, and
        # move what start-up built (restored sessions, retained messages, the modules) out
        # of the collector's sight: full collections then walk only what came later.
        gc.set_threshold(GC_THRESHOLD, 20, 20)
        gc.freeze()
        await self._server.start_serving()
        await self.listeners.serve()
        if self.config.port_file:
            tmp = self.config.port_file + ".tmp"
            with open(tmp, "w") as fh:
                fh.write(f"{self.port}\n")
            os.replace(tmp, self.config.port_file)
        if self.mesh is not None:
            await self.mesh.start()
        if self.config.get("sys.interval") > 0:
            self._sys_task = self.loop.create_task(self._sys_loop())
        log.info(
            "mqttmesh %s node %r listening on %s:%d (pid %d)",
            __version__,
            self.node_id,
            self.config.host,
            self.port,
            os.getpid(),
        )

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        self.listeners.stop()
        if self.mesh is not None:
            self.mesh.stop()
        if self._sys_task is not None:
            self._sys_task.cancel()
        self._housekeeping.cancel()
        self._flow_timer.cancel()
        if self.logins is not None:
            self.logins.stop()
        for conn in list(self.connections):
            if conn.transport is not None:
                conn.flush()
                conn.transport.close()
        # let connection_lost run for each, so what it changes is in the last commit
        deadline = self.loop.time() + 2.0
        while self.connections and self.loop.time() < deadline:
            await asyncio.sleep(0.01)
        self.deadlines.close()  # (after the connections, as their own timers were)
        if self._server is not None:
            try:
                await asyncio.wait_for(self._server.wait_closed(), 2)
            except (TimeoutError, Exception):
                pass
        if self.archive is not None:
            await self.archive.stop()  # after the clients, so their last deliveries are logged
        if self.store is not None:
            self.store.stop_writer()  # the writer finishes what it has been given
            journal = self.journal
            if journal is not None and len(journal):  # (a store comes with a journal)
                _, ops = journal.take()
                self.store.write(ops)
            self.store.close()
        log.info("node %r stopped", self.node_id)

    def _sweep(self) -> None:
        """Once a second: drop consumers that stayed congested past the timeout."""
        now = self.loop.time()
        congestion = self.broker.congestion
        if congestion.reasons:
            log.debug(
                "congested: %s; paused publishers: %d",
                {getattr(s, "client_id", None) or repr(s): sorted(r) for s, r in congestion.reasons.items()},
                len(congestion.paused),
            )
        for session in congestion.sweep(now, self._progress):
            channel = getattr(session, "channel", None)
            if channel is not None and not channel.is_peer:
                # (a peer link is judged by its keepalive, not by this timeout: it waits
                # for its own slow clients on the other side)
                self.broker.stats.slow_consumers += 1
                channel.owner.reset(f"slow consumer: could not take messages for {congestion.timeout:g}s")
        for conn, blocked_at in list(self.blocked.items()):
            if now - blocked_at >= congestion.timeout and conn.channel is not None:
                self.broker.stats.slow_consumers += 1
                conn.reset(f"slow consumer: more than {self.max_write_buffer} bytes unsent for {congestion.timeout:g}s")
        self.broker.publish_due_wills(now)
        self.broker.table.expire_sessions(now)  # (MQTT 5 Session Expiry; in a mesh, this node's copies)
        self._housekeeping = self.loop.call_later(1.0, self._sweep)

    def _flow_tick(self) -> None:
        """Often: the back-pressure time bound, and the memory all buffers hold."""
        now = self.loop.time()
        congestion = self.broker.congestion
        if congestion.reasons:
            congestion.expire(now, self._progress)
        if self.buffering:
            self._refresh_buffers()
        if self.reading_paused and self.buffered <= self.buffer_low:
            self.reading_paused = False
            log.warning("buffers down to %d bytes: reading from clients again", self.buffered)
            for conn in list(self.connections):
                conn.resume(PAUSE_MEMORY)
        self._flow_timer = self.loop.call_later(self._flow_period, self._flow_tick)

    def _refresh_buffers(self) -> None:
        """Output buffers drain without telling us: look at those that held bytes."""
        for conn in list(self.buffering):
            transport = conn.transport
            size = transport.get_write_buffer_size() if not transport.is_closing() else 0
            self.buffered += size - conn.out_bytes
            conn.out_bytes = size
            if not size:
                self.buffering.discard(conn)
            if conn in self.blocked and size <= self.max_write_buffer // 4:
                conn.unblock()  # (resume_writing does it too; this covers a missed one)

    def memory_pressure(self) -> None:
        """The buffers went over limits.buffer_memory: stop reading from every client."""
        if self.reading_paused:
            return
        self._refresh_buffers()
        if self.buffered <= self.buffer_high:
            return
        self.reading_paused = True
        self.broker.stats.memory_pauses += 1
        log.warning(
            "buffers hold %d bytes, over limits.buffer_memory (%d): reading from clients "
            "paused until they are below %d",
            self.buffered,
            self.buffer_high,
            self.buffer_low,
        )
        for conn in self.connections:
            channel = conn.channel
            # (peer links are not paused: their keepalive would declare them dead; the mesh
            # has its own flow control)
            if conn.announced and channel is not None and not channel.is_peer:
                conn.pause(PAUSE_MEMORY)

    @staticmethod
    def _progress(session):
        """Changes when the client takes messages: acknowledges them, or reads bytes."""
        channel = getattr(session, "channel", None)
        conn = channel.owner if channel is not None else session  # a session, or a peer link
        transport = getattr(conn, "transport", None)
        buffered = transport.get_write_buffer_size() if transport is not None else 0
        # bytes the kernel took from the buffer: a buffer that grows is no progress
        drained = getattr(conn, "written", 0) - buffered
        return getattr(session, "acked", 0), drained

    # -- admission ------------------------------------------------------------------------

    def admit(self, conn: Connection) -> str | None:
        if self.max_connections and len(self.connections) >= self.max_connections:
            return f"limits.max_connections ({self.max_connections}) reached"
        rate = self.connection_rate
        if rate:
            now = self.loop.time()
            self._tokens = min(rate, self._tokens + (now - self._tokens_at) * rate)
            self._tokens_at = now
            if self._tokens < 1:
                return f"limits.connection_rate ({rate:g}/s) exceeded"
            self._tokens -= 1
        self.connections.add(conn)
        return None

    # -- turns of the loop ----------------------------------------------------------------------

    def turn_spent(self) -> bool:
        """Has this turn of the loop handled its share of clients' input (limits.read_slice)?
        The first read of a turn starts its clock, and the next turn (``next_turn``)."""
        started = self._turn_started
        if started is None:
            self._turn_started = time.perf_counter()
            self.loop.call_soon(self.next_turn)
            return False
        return time.perf_counter() - started > self.read_slice

    def wait_turn(self, conn: Connection) -> None:
        """``conn`` has a read to be handled at a later turn (Connection.waiting)."""
        self._turn_waiting.append(conn)

    def next_turn(self) -> None:
        """A new turn: the reads that waited go first, a read per connection in turn, for
        as long as the turn's share lasts; the rest wait again (reading them stays paused)."""
        self._turn_started = None
        waiting = self._turn_waiting
        while waiting and not self.turn_spent():
            conn = waiting.popleft()
            conn.handle_waiting()
            if conn.waiting:
                waiting.append(conn)

    def forget(self, conn: Connection) -> None:
        if self.logins is not None:
            self.logins.left(conn)
        self.connections.discard(conn)
        self.buffering.discard(conn)
        self.blocked.pop(conn, None)

    # -- batched writes -------------------------------------------------------------------

    def mark_dirty(self, conn: Connection) -> None:
        self._dirty.append(conn)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self.loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        self.flush_now()

    def flush_now(self) -> None:
        """Write what the dirty connections hold now (the scheduled flush still runs)."""
        dirty = self._dirty
        self._dirty = []
        for conn in dirty:
            try:
                conn.flush()
            except Exception as exc:  # one connection's failure is its own: the others go on
                self._flush_failed(conn, exc)

    def _flush_failed(self, conn: Connection, exc: Exception) -> None:
        # (a client gone away is no exception here, Connection.flush checks for it: this is a
        # bug of ours, and it must not take the other connections' writes with it)
        log.exception("writing to %s failed (%s): resetting it", conn.peer, exc)
        try:
            conn.reset(f"write failed: {exc}")
        except Exception:
            log.exception("resetting %s after a failed write failed", conn.peer)

    # -- password checks off the loop ----------------------------------------------------

    def authenticate(self, conn: Connection, username: str, password: bytes | None) -> None:
        self.logins.authenticate(conn, username, password)  # throttled, on a thread (logins.py)

    # -- group commit -----------------------------------------------------------------------

    def _schedule_commit(self) -> None:
        if not self._commit_scheduled and not self._commit_in_flight:
            self._commit_scheduled = True
            wait = self._commit_started + self.commit_interval - time.perf_counter()
            if wait > 0.0:
                self.loop.call_later(wait, self._start_commit)
            else:
                self.loop.call_soon(self._start_commit)

    def _start_commit(self) -> None:
        self._commit_scheduled = False
        journal = self.journal
        if self._commit_in_flight or journal is None or not len(journal):  # (a store comes with a journal)
            return
        batch, ops = journal.take()
        self._commit_in_flight = True
        self._pending_ops = ops
        self._commit_started = time.perf_counter()
        self.store.submit(batch, ops)

    def _committed_on_thread(self, batch: int, error) -> None:
        self.loop.call_soon_threadsafe(self._committed, batch, error)

    def _committed(self, batch: int, error) -> None:
        if error is not None:
            # keep the acknowledgements held and try the same batch again shortly
            self.loop.call_later(1.0, self.store.submit, batch, self._pending_ops)
            return
        self._commit_in_flight = False
        self.commit_latency.observe(time.perf_counter() - self._commit_started)
        self._pending_ops = []  # (only a failed commit, retried, reads it)
        self.core.committed(batch, self.loop.time())
        if len(self.broker.journal):
            self._schedule_commit()

    # -- $SYS ---------------------------------------------------------------------------------

    async def _sys_loop(self) -> None:
        interval = self.config.get("sys.interval")
        self.publish_sys("$SYS/broker/version", f"mqttmesh {__version__}")
        self.publish_sys("$SYS/broker/node", self.node_id)
        while True:
            self.publish_sys_stats()
            await asyncio.sleep(interval)

    def publish_sys_stats(self) -> None:
        b = self.broker
        s = b.stats
        ended = b.table.ended
        queue_full = ended.queue_full + sum(x.dropped for x in b.sessions.values())
        slow_qos0 = ended.slow_qos0 + sum(x.dropped_qos0 for x in b.sessions.values())
        values = {
            "uptime": f"{int(time.time() - self.started_at)} seconds",
            "clients/connected": b.table.connected_count,
            "clients/total": len(b.sessions),
            "messages/received": s.messages_received,
            "messages/sent": s.messages_sent,
            "publish/messages/dropped": s.publish_dropped + queue_full + slow_qos0,
            "publish/dropped/queue_full": queue_full,
            "publish/dropped/slow_qos0": slow_qos0,
            "load/bytes/received": s.bytes_received,
            "load/bytes/sent": s.bytes_sent,
            "retained messages/count": len(b.retained),
            "subscriptions/count": len(b.trie),
            "connections/refused": s.connections_refused,
            "connections/slow_consumers": s.slow_consumers,
            "connections/preauth_refused": s.preauth_refused,
            "clients/outputs_blocked": s.outputs_blocked,
            "clients/publishers_paused": b.congestion.pauses,
            "clients/publishers_paced": b.congestion.paced,
            "clients/publishers_released": b.congestion.released,
            "load/buffered": self.buffered,
            "load/reads_waited": self.reads_waited,
            "load/memory_pauses": s.memory_pauses,
            "connections/auth_failures": s.auth_failures,
            "connections/auth_throttled": s.auth_throttled,
            "connections/auth_busy": s.auth_busy,
        }
        for key, value in values.items():
            self.publish_sys(f"$SYS/broker/{key}", str(value))

    def reload(self, fresh: Config) -> list[str]:
        """SIGHUP (or ``mqttmesh ctl reload``): the password file, the ACL file, the TLS
        certificate and key, and the log level, from ``fresh`` (the configuration read again).
        Each file is read whole first: one with an error is not applied, the one in force
        stays, and the error is logged with the file and line. New rules apply to the next
        login and to every live session's next delivery; other settings need a restart."""
        auth = self.auth
        passwords, acl = auth.passwords, auth.acl
        kept = []
        path = fresh.get("auth.password_file")
        try:
            passwords = PasswordFile.load(path) if path else None
        except ConfigError as exc:
            log.error("reload: %s; the password file in force is kept", exc)
            kept.append("password file")
        path = fresh.get("auth.acl_file")
        try:
            acl = Acl.load(path) if path else None
        except ConfigError as exc:
            log.error("reload: %s; the ACL in force is kept", exc)
            kept.append("ACL")
        auth.reload(passwords, acl)
        error = self.listeners.reload_tls(fresh)
        if error is not None:
            log.error("reload: %s; the TLS certificate in force is kept", error)
            kept.append("TLS certificate")
        logging.getLogger().setLevel(fresh.log_level.upper())
        log.warning(
            "reloaded: password file %s (%d users), ACL %s, TLS %s, log level %s%s",
            fresh.get("auth.password_file") or "none",
            len(passwords.users) if passwords is not None else 0,
            fresh.get("auth.acl_file") or "none",
            "yes" if self.listeners.tls is not None else "off",
            fresh.log_level,
            f"; kept after an error: {', '.join(kept)}" if kept else "",
        )
        return kept

    def uptime(self) -> float:
        return time.time() - self.started_at

    def http_status(self) -> dict:
        """The node as /api/v1/status shows it: its counters, and the mesh as it sees it."""
        broker = self.broker
        status: dict = {
            "node": self.node_id,
            "version": self.version,
            "uptime_s": round(self.uptime(), 3),
            "clients_connected": broker.table.connected_count,
            "sessions": len(broker.sessions),
            "stats": broker.stats.as_dict(),
        }
        if self.mesh is not None:
            status["mesh"] = self.mesh.status()
        return status

    def publish_sys(self, topic: str, value: str) -> None:
        # $SYS values are retained in memory only: they are recomputed at every start
        msg = Message(topic, value.encode(), 0, True, self.node_id, 0, "$SYS", time.time())
        self.broker.publish_sys(msg)


def python_info() -> str:
    return f"{platform.python_implementation()} {platform.python_version()}"
