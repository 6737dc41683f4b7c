"""mode = "cluster": MQTT clients of whole nodes, moving between them: the workload.

Part of the Simulator (core.py), as a mixin. Every node is a whole node
(sim/cluster.py: the NodeCore of assembly.build_core, as the server builds it);
its clients are ``sim/mqttclient.py`` clients over simulated connections, each
connection a ``SimConnection`` (the Channel's ``ports.Owner``). Persistent
subscribers (CleanSession=0, with a will) move between nodes: cleanly (DISCONNECT,
then a new connection), abruptly (the connection drops), or by a takeover (a new
connection elsewhere while the old one lives on until the server ends it).
Publishers publish QoS 0-2 to the subscribers' topics; a share of them
(``clients.publisher_persistent``, each drawn from its own stream ``{seed}/publisher/{name}``)
connect with CleanSession=0, move between nodes the three ways the subscribers do (and
"away") and, on each reconnection, send again each PUBLISH not acknowledged (DUP=1) and each
PUBREL not completed [MQTT-4.4.0-1], recorded as the history's ``resend``; their messages
are acknowledged by the PUBACK or PUBREC on whichever connection it comes. Every client writes a history
(sim/history.py); the cluster invariants that judge it, and the nodes' state while the
run goes, are sim/cluster_checks.py's.

A share of the clients (``clients.mqtt5``) speak MQTT 5, each drawn from its own stream so
that the others' draws stay as they were: a subscriber asks for a Session Expiry Interval
(with Clean Start 0, or 1 for a share of them), gives each connection's will a Will Delay
Interval, and takes its subscriptions again when a CONNACK says its session is gone; a
publisher gives a share of its messages a Message Expiry Interval. An "away" move (the 4th
share of ``move_how``) leaves a subscriber without a connection for seconds, long enough
for its session, its messages or its will's delay to run out.
"""

from __future__ import annotations

import random
from typing import Any

from .. import properties as P
from ..codec import Will
from ..mesh.cluster.cluster import ClusterSettings
from ..message import Message
from .cluster import SimLink, SimNode, SimStore, build_node
from .history import History
from .model import CCHECK, CLIENT, COMMIT, TO_CLIENT, TO_NODE, Node, SimulatorPart
from .simclient import Mqtt5, SimClient, SimConnection

__all__ = ["ClusterMixin", "SimConnection", "SimClient"]


class ClusterMixin(SimulatorPart):
    def _init_cluster(self) -> None:
        sc = self.sc
        c = sc.clients
        self.cluster_settings = ClusterSettings(
            replication=c.replication,
            claim_timeout=c.claim_timeout,
            gather_timeout=c.gather_timeout,
            will_delay=c.will_delay,
            redirect_grace=c.redirect_grace,
            register_interval=c.register_interval,
            stall=2 * sc.node.keepalive - sc.node.tick,  # (as server/mesh_node.py)
        )
        self.rng_clients = random.Random(f"{sc.seed}/clients")
        self.moves = {"clean": 0, "abrupt": 0, "takeover": 0, "away": 0}
        self.published_ids: dict[str, tuple[str, int]] = {}
        self.history = History()
        self.sconns: dict[str, SimConnection] = {}
        self.woken: list[SimConnection] = []  # connections with bytes for their client, this instant
        self.clients: dict[str, SimClient] = {}
        self.cluster_errors = 0
        self.client_stop = sc.duration - sc.drain  # no moves, no publications after this
        self.node_io = {n: _NodeIO(self, self.nodes[n]) for n in self.names}
        for n in self.names:
            self.nodes[n].store = SimStore()
        names = self.names
        for i in range(c.persistent):
            name = f"s{i:03d}"
            self.clients[name] = SimClient(name, True, c.keepalive, names[i % len(names)], self._mqtt5(name, True))
        self.publisher_moves = 0
        self.publisher_resends = 0  # PUBLISH (DUP=1) and PUBREL sent again by persistent publishers
        for i in range(c.publishers):
            home = names[(i * 7 + len(names) // 2) % len(names)]
            name = f"p{i:03d}"
            persistent = bool(c.publisher_persistent) and _draw_publisher(sc.seed, name) < c.publisher_persistent
            v5 = self._mqtt5(name, False, persistent)
            self.clients[name] = SimClient(name, persistent, c.keepalive, home, v5, publisher=True)
        self._init_members()  # (members.py: shared groups, if the scenario has any)
        # (the persistent members of groups are no subscribers of c/<name>: members.py; nor
        # are the persistent publishers)
        self.subscribers = [
            cl.name for cl in self.clients.values() if cl.persistent and cl.share is None and not cl.publisher
        ]
        self._init_cluster_checks()  # (cluster_checks.py)

    def _mqtt5(self, name: str, subscriber: bool, persistent_publisher: bool = False) -> Mqtt5 | None:
        """Whether client ``name`` speaks MQTT 5, and what it asks for: from its own stream,
        so the other clients' draws (rng_clients) are those of a run without MQTT 5, and a
        shrunk scenario's remaining clients keep theirs. A persistent publisher asks for Clean
        Start 0 and the longest of ``session_expiry`` (no draw: its stream stays its messages'),
        so that its session outlives its moves (one that expired would make what it had not
        had acknowledged new messages, which no check could tell from a second routing)."""
        c = self.sc.clients
        if not c.mqtt5:
            return None
        rng = random.Random(f"{self.sc.seed}/mqtt5/{name}")
        if rng.random() >= c.mqtt5:
            return None
        v5 = Mqtt5(rng)
        if subscriber:
            v5.clean_start = rng.random() < c.clean_start
            v5.expiry = int(rng.choice(c.session_expiry))
        elif persistent_publisher:
            v5.expiry = int(max(c.session_expiry)) or 600
        return v5

    def _start_clients(self) -> None:
        c = self.sc.clients
        for cl in self.clients.values():
            self._at(c.start + self.rng_clients.random(), CLIENT, "connect", cl.name)
            self._at(c.start + c.keepalive * (1 + self.rng_clients.random()), CLIENT, "ping", cl.name)
        self._at(c.start, CCHECK)

    def _cluster_handlers(self) -> dict[int, Any]:
        return {
            TO_NODE: self._on_to_node,
            TO_CLIENT: self._on_to_client,
            COMMIT: self._on_commit,
            CLIENT: self._on_client,
            CCHECK: self._on_ccheck,
        }

    # ------------------------------------------------------------------ nodes

    def _build_core(self, node: Node) -> SimNode:
        node.conns = {}
        node.commit_due = False
        node.plinks = {}
        return build_node(
            node.name,
            node.inc,
            self.now,
            self.settings,
            self.cluster_settings,
            node.store,
            self.node_io[node.name],
            seed=self.sc.seed,
        )

    def _cluster_crash(self, node: Node, how: str) -> None:
        """Every client connection of the node dies with it; uncommitted journal ops are lost."""
        c = self.sc.clients
        for conn in list(node.conns.values()):
            self._ended(conn, False, f"node {node.name} crashed")
            delay = conn.latency if how == "kill" else 1.5 * c.keepalive
            self._send_client(conn, None, f"node {node.name} crashed", self.now + delay)
        node.conns = {}
        node.plinks = {}
        node.core = None

    def _on_commit(self, name: str, gen: int) -> None:
        node = self.nodes[name]
        if not node.up or node.gen != gen:
            return  # the node crashed first: that batch never reached the disk
        node.commit_due = False
        core = node.core
        if not len(core.journal):
            return
        batch, ops = core.journal.take()
        node.store.write(ops)
        core.committed(batch, self.now)
        self._want_flush(node)

    def _commit_soon(self, node: Node) -> None:
        if not node.commit_due:
            node.commit_due = True
            self._at(self.now + self.sc.clients.commit_ms / 1000.0, COMMIT, node.name, node.gen)

    def _cluster_tick(self, node: Node) -> None:
        for conn in list(node.conns.values()):
            deadline = conn.channel.deadline()
            if deadline is not None and self.now >= deadline:
                conn.channel.tick(self.now)  # keepalive [MQTT-3.1.2-24]

    # ------------------------------------------------------------------ connections

    def _open(self, client: SimClient, node: Node) -> None:
        c = self.sc.clients
        client.k += 1
        conn_id = f"{client.name}#{client.k}"
        latency = self.rng_clients.uniform(*c.latency_ms) / 1000.0
        conn = SimConnection(self, conn_id, client, node, latency, self.now)
        node.conns[conn_id] = conn
        self.sconns[conn_id] = conn
        client.conn = conn
        client.home = node.name
        # (a persistent member of a group, or a persistent publisher, has none: the wills are
        # the subscribers')
        subscriber = client.persistent and client.share is None and not client.publisher
        will = Will(f"will/{client.name}", conn_id.encode(), 1) if subscriber else None
        v5 = client.v5
        info = None
        if v5 is not None:
            delay = int(v5.rng.choice(self.sc.clients.will_delay_interval)) if will is not None else 0
            if will is not None and delay:
                will.properties = {P.WILL_DELAY: delay}
            info = v5.info(delay)
        client.mqtt.connect(will)
        self.history.connect(self.now, client.name, "invoke", conn_id, node.name, "will" if will else None, info)
        self._client_send(client)

    def _client_send(self, client: SimClient, data: bytes | None = b"") -> None:
        """What the client wrote goes to its node (``None``: the connection drops, a reset)."""
        conn = client.conn
        if conn is None:
            return
        if data is not None:
            data = client.mqtt.data_to_send()
            if not data:
                return
        t = max(self.now + conn.latency, conn.to_node)
        conn.to_node = t
        self._at(t, TO_NODE, conn.id, data)

    def _on_to_node(self, conn_id: str, data: bytes | None) -> None:
        conn = self.sconns[conn_id]
        node = self.nodes[conn.node]
        if not conn.server_open or not node.up or node.gen != conn.gen:
            return
        if conn.paused:
            conn.held.append(data)
            return
        self._to_node_now(conn, data)

    def _to_node_now(self, conn: SimConnection, data: bytes | None) -> None:
        if not conn.server_open:
            return
        node = self.nodes[conn.node]
        if data is None:
            conn.channel.connection_lost(self.now)  # the will goes out here [MQTT-3.1.2-8]
            self._ended(conn, conn.channel.clean_disconnect, "connection reset by the client")
            node.conns.pop(conn.id, None)
        else:
            conn.channel.receive_data(data, self.now)
        self._want_flush(node)

    def _server_closed(self, conn: SimConnection, reason: str) -> None:
        """The node ended the connection (kick, keepalive, DISCONNECT, protocol error)."""
        if not conn.server_open:
            return
        self._ended(conn, conn.channel.clean_disconnect, reason)
        node = self.nodes[conn.node]
        node.conns.pop(conn.id, None)
        self._send_client(conn, conn.channel.data_to_send(), reason, self.now + conn.latency)

    def _woken(self, conn: SimConnection) -> None:
        """A Channel has bytes for its client: they leave at the end of this instant."""
        if not self.woken:
            self._at(self.now, CLIENT, "flush", "")
        self.woken.append(conn)

    def _ended(self, conn: SimConnection, clean: bool, reason: str) -> None:
        if conn.server_open:
            conn.server_open = False
            self.history.closed(self.now, conn.client.name, conn.id, clean, reason)

    def _send_client(self, conn: SimConnection, data: bytes | None, closed: str | None, at: float) -> None:
        t = max(at, conn.to_client)
        conn.to_client = t
        self._at(t, TO_CLIENT, conn.id, data, closed)

    def _on_client(self, action: str, arg: str) -> None:
        if action == "flush":
            # in the order of the connection ids, whatever order the broker woke them in (it
            # woke them in a set's order, their addresses', until finding 39)
            woken, self.woken = self.woken, []
            for conn in sorted(woken, key=_conn_order):
                conn.flush_due = False
                if conn.server_open:
                    data = conn.channel.data_to_send()
                    if data:
                        self._send_client(conn, data, None, self.now + conn.latency)
            return
        if action == "mping":
            self._member_ping(arg)  # (members.py)
            return
        client = self.clients[arg]
        if action == "connect":
            client.connect_due = False
            if client.conn is None:
                node = self._pick_client_node(client.home)
                if node is None:
                    self._reconnect(client)
                else:
                    self._open(client, node)
        elif action == "move":
            if self.now == client.move_at:
                self._move(client)
        elif action == "publish":
            self._publish_next(client)
        elif action in ("leave", "rejoin"):
            self._member_action(action, client)
        elif action == "ping":
            if client.conn is not None and client.mqtt.connected:
                client.mqtt.ping()
                self._client_send(client)
            if self.now < self.end:
                self._at(self.now + client.mqtt.keepalive, CLIENT, "ping", client.name)

    def _on_to_client(self, conn_id: str, data: bytes | None, closed: str | None) -> None:
        conn = self.sconns[conn_id]
        client = conn.client
        if client.conn is not conn:
            return  # a connection the client abandoned (takeover) or already lost
        if data:
            for event in client.mqtt.receive_data(data):
                self._client_event(client, conn, event)
            self._client_send(client)
        if closed is not None and client.conn is conn:
            self._client_lost(client)

    def _client_event(self, client: SimClient, conn: SimConnection, event: tuple[Any, ...]) -> None:
        kind = event[0]
        h = self.history
        if client.share is not None and kind != "message":
            self._member_event(client, conn, event)  # (members.py)
            return
        if kind == "message":
            topic, payload, qos, dup = event[1:5]
            # (MQTT 5: the Message Expiry Interval the PUBLISH said is left, or None)
            expiry = event[6] if len(event) > 6 else None
            # (a persistent member's packet id: sim/shared_checks.py tells a re-send from a new message)
            pid = event[5] if client.persistent and client.share is not None else 0
            h.received(self.now, client.name, payload.decode(), topic, qos, dup, conn.id, pid, expiry)
        elif kind == "acked":
            msg_id = client.pending.pop(event[1], None)
            if msg_id is not None:
                topic_qos = self.published_ids[msg_id]
                h.publish(self.now, client.name, "ok", msg_id, topic_qos[0], topic_qos[1])
        elif kind == "connack":
            rc, present = event[1], event[2]
            if rc:
                h.connect(self.now, client.name, "fail", conn.id, conn.node, rc)
                return
            h.connect(self.now, client.name, "ok", conn.id, conn.node, present)
            if client.publisher and client.persistent:
                self._publisher_connected(client)
                return
            if client.v5 is not None and not present:
                client.subscribed = False  # (a new session: its subscriptions are to be made again)
            if client.persistent and not client.subscribed:
                client.mqtt.subscribe([(f"c/{client.name}", 2), ("all", 1)])
            elif client.persistent:
                self._schedule_move(client)
            elif not client.persistent and not client.n:
                self._at(
                    self.now + self.rng_clients.expovariate(self.sc.clients.publish_rate),
                    CLIENT,
                    "publish",
                    client.name,
                )
        elif kind == "suback":
            client.subscribed = True
            h.subscribed(self.now, client.name, [(f"c/{client.name}", 2), ("all", 1)])
            self._schedule_move(client)
        elif kind == "closed":
            self._client_lost(client)

    def _publisher_connected(self, client: SimClient) -> None:
        """A persistent publisher's connection was accepted: what its client sends again (it
        queued those frames on the CONNACK, sim/mqttclient.py) is recorded, in order, as
        ``resend`` ops; its publications start with its first connection, and it moves."""
        for out in client.mqtt.outgoing.values():
            msg_id = out.payload.decode()
            self.history.publish(self.now, client.name, "resend", msg_id, out.topic, out.qos)
            self.publisher_resends += 1
        if not client.publishing:
            client.publishing = True
            rate = self.sc.clients.publish_rate
            self._at(self.now + self.rng_clients.expovariate(rate), CLIENT, "publish", client.name)
        self._schedule_move(client)

    def _client_lost(self, client: SimClient) -> None:
        """The client's connection is gone (seen from the client): it connects again."""
        client.mqtt.connection_lost()
        client.conn = None
        client.member = False
        self._forget_pending(client)
        self._reconnect(client)

    def _forget_pending(self, client: SimClient) -> None:
        if client.mqtt.clean:  # its session ended: what was not acknowledged is in doubt
            for msg_id in client.pending.values():
                topic, qos = self.published_ids[msg_id]
                self.history.publish(self.now, client.name, "info", msg_id, topic, qos)
            client.pending.clear()

    def _reconnect(self, client: SimClient) -> None:
        if not client.connect_due and self.now < self.end:
            client.connect_due = True
            delay = self.rng_clients.uniform(*self.sc.clients.reconnect_delay)
            self._at(self.now + delay, CLIENT, "connect", client.name)

    def _pick_client_node(self, preferred: str) -> Node | None:
        node = self.nodes[preferred]
        if node.up and node.core is not None:
            return node
        up = [n for n in self.names if self.nodes[n].up]
        return self.nodes[self.rng_clients.choice(up)] if up else None

    # ------------------------------------------------------------------ moves and publications

    def _schedule_move(self, client: SimClient) -> None:
        lo, hi = self.sc.clients.move_every
        if hi <= 0:
            return
        t = self.now + self.rng_clients.uniform(lo, hi)
        if t < self.client_stop:
            client.move_at = t
            self._at(t, CLIENT, "move", client.name)

    def _move(self, client: SimClient) -> None:
        conn = client.conn
        if conn is None or not client.mqtt.connected or self.now >= self.client_stop:
            return  # it is between connections anyway; the next CONNACK schedules a move
        target = self._move_target(conn.node)
        if target is None:
            self._schedule_move(client)
            return
        shares = self.sc.clients.move_how
        how = self.rng_clients.choices(("clean", "abrupt", "takeover", "away")[: len(shares)], shares)[0]
        self.moves[how] += 1
        self.publisher_moves += client.publisher
        client.home = target.name
        if how == "away":
            # gone for seconds (cleanly or not): its session, its queued messages and its
            # will's delay may run out meanwhile
            if self.rng_clients.random() < 0.5:
                client.mqtt.disconnect()
                self._client_send(client)
            else:
                self._client_send(client, None)
                client.mqtt.connection_lost()
            client.conn = None
            client.connect_due = True
            self._at(self.now + self.rng_clients.uniform(*self.sc.clients.away), CLIENT, "connect", client.name)
        elif how == "clean":
            client.mqtt.disconnect()
            self._client_send(client)
            client.conn = None
            self._reconnect(client)
        elif how == "abrupt":
            self._client_send(client, None)
            client.conn = None
            client.mqtt.connection_lost()
            self._reconnect(client)
        else:  # takeover: the old connection is left as it is; the server ends it
            client.mqtt.connection_lost()
            client.conn = None
            self._open(client, target)

    def _move_target(self, current: str) -> Node | None:
        up = [n for n in self.names if n != current and self.nodes[n].up]
        if self.sc.clients.targets == "far" and self.partition:
            side = self.partition.get(current, -1)
            far = [n for n in up if self.partition.get(n, -1) != side]
            up = far or up
        return self.nodes[self.rng_clients.choice(up)] if up else None

    def _publish_next(self, client: SimClient) -> None:
        c = self.sc.clients
        if self.now >= self.client_stop:
            return
        conn = client.conn
        if conn is not None and client.mqtt.connected:
            client.n += 1
            msg_id = f"{client.name}:{client.n}"
            qos = self.rng_clients.choices((0, 1, 2), c.qos)[0]
            if c.groups and self.rng_shared.random() < c.to_groups:
                topic = f"sh/{client.name}/{client.n % 4}"  # (members.py: the groups' filter is sh/#)
            elif self.subscribers and self.rng_clients.random() >= c.shared:
                topic = f"c/{self.rng_clients.choice(self.subscribers)}"
            else:
                topic = "all"
            self.published_ids[msg_id] = (topic, qos)
            expiry = None
            if client.v5 is not None and client.v5.rng.random() < c.expiring:
                expiry = int(client.v5.rng.choice(c.message_expiry))  # (MQTT 5: Message Expiry Interval)
            self.history.publish(self.now, client.name, "invoke", msg_id, topic, qos, expiry)
            pid = client.mqtt.publish(topic, msg_id.encode(), qos, expiry)
            if qos:
                client.pending[pid] = msg_id
            self._client_send(client)
        self._at(self.now + self.rng_clients.expovariate(c.publish_rate), CLIENT, "publish", client.name)


def _draw_publisher(seed: int, name: str) -> float:
    """Publisher ``name``'s own draw: whether it is persistent, whatever the others' are."""
    return random.Random(f"{seed}/publisher/{name}").random()


def _conn_order(conn: SimConnection) -> tuple[str, int]:
    name, _, k = conn.id.partition("#")
    return name, int(k)


class _NodeIO:
    """sim/cluster.py's NodeIO for one node: the simulator's events."""

    def __init__(self, sim: Any, node: Node):
        self.sim = sim
        self.node = node

    def flush_soon(self) -> None:
        self.sim._want_flush(self.node)

    def flush_later(self) -> None:
        self.sim._want_flush(self.node, later=True)

    def flush_now(self) -> None:
        node = self.node
        if node.core is not None:  # (not while the core is being built: start() flushes)
            node.core.flush(self.sim.now)

    def link_send(self, link: SimLink, kind: str, payload: bytes, qos: int) -> None:
        self.sim._link_send(link, kind, payload, qos)

    def link_close(self, link: SimLink, reason: str) -> None:
        self.sim._link_close(link, reason)

    def commit_soon(self) -> None:
        self.sim._commit_soon(self.node)

    def published(self, msg: Message) -> None:
        self.sim._published(self.node, msg)

    def error(self, what: str) -> None:
        self.sim.cluster_errors += 1
        self.sim.violations.add("cluster.error", f"t={self.sim.now:.3f}s {self.node.name}: {what}")
