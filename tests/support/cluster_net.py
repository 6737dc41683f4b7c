"""The cluster protocols (mesh/cluster/cluster.py and its parts) on an instant in-memory network.

N Broker+Cluster pairs; a unicast is queued and handed over by ``pump`` in order; a
published message reaches every broker at once (the routing engine's job, tested in
test_engine.py), each node taking a message id once, as the engine's delivery filter does.
``FakeChannel`` stands for the Channel of one client connection (the ``ClaimingChannel``
the cluster answers); ``Net.client`` makes a real Channel. No process, no clock, no socket.
"""

from __future__ import annotations

from collections import deque

from mqttmesh.auth import Auth
from mqttmesh.broker import Broker, BrokerPorts, BrokerSettings
from mqttmesh.flow import Congestion
from mqttmesh.mesh.cluster.cluster import Cluster, ClusterSettings, cluster_parts
from mqttmesh.mesh.cluster.replica_sessions import ReplicaSessions
from mqttmesh.message import Message
from mqttmesh.packets import Will
from mqttmesh.store import NULL_JOURNAL
from mqttmesh.topics import RetainedTrie

__all__ = ["NAMES", "FakeChannel", "Net", "cid_with", "holder_of"]


NAMES = ["a", "b", "c"]


class FakeChannel:
    """One client connection, as the cluster sees it (channel.py's claiming part)."""

    def __init__(self, net: Net, node: str, cid: str, expiry: int = 0xFFFFFFFF):
        self.net, self.node, self.client_id = net, node, cid
        self.expiry = expiry  # its Session Expiry Interval (MQTT 5)
        self.state = "claiming"
        self.refused_rc: int | None = None
        self.session = None
        self.present: bool | None = None
        self.reason = ""
        self.frames: list[bytes] = []
        self.held: list[tuple[int, bytes]] = []  # (settlement version, frame) not written yet
        self.blocked = False
        self.peer = "fake"

    @property
    def claiming(self) -> bool:
        return self.state == "claiming"

    def claimed(self, session, present: bool, now: float) -> None:
        if self.state != "claiming":
            return
        self.state = "connected"
        self.session, self.present = session, present
        if not session.clean:
            session.expiry = self.expiry  # (as Channel._connected)
        session.attach(self, 0.0)

    def write(self, data: bytes) -> None:
        if self.held:
            self.held.append((self.held[-1][0], bytes(data)))  # (in order, as channel.py)
        else:
            self.frames.append(bytes(data))

    frame = staticmethod(Message.frame)
    frame0 = staticmethod(Message.frame_qos0)

    def write_expiring(self, msg, qos, packet_id, dup, retain, ticket=0) -> None:
        frame = self.frame(msg, qos, packet_id, dup, retain)
        self.write_gated(frame, ticket) if ticket else self.write(frame)

    def write_gated(self, data: bytes, ticket: int) -> None:
        """As channel.py: the frame waits until the session's gate passed ``ticket`` (the
        session's other holders have that settlement)."""
        gate = self.session.gate
        if self.held or ticket > gate.passed():
            ticket = max(ticket, self.held[-1][0] if self.held else 0)
            if ticket > gate.passed():
                gate.wait(ticket)
            self.held.append((ticket, bytes(data)))
        else:
            self.frames.append(bytes(data))

    def release_acks(self, committed: int, now: float) -> None:
        while self.held and self.held[0][0] <= self.session.gate.passed():
            self.frames.append(self.held.pop(0)[1])

    def waits_for_gate(self, passed: int) -> bool:
        return bool(self.held) and self.held[-1][0] > passed

    def refused(self, rc: int, reason: str, now: float) -> None:
        self.refused_rc = rc
        self.state, self.reason = "closed", reason

    def kick(self, reason: str, now: float) -> None:
        self.close(reason)

    def close(self, reason: str, delayed: bool = False) -> None:
        """As Channel._end: the session detaches, then the cluster hears of it (``delayed``:
        the connection ended with a will that waits for its Will Delay Interval)."""
        if self.state == "closed":
            return
        was_connected = self.state == "connected"
        self.state, self.reason = "closed", reason
        broker, cluster = self.net.brokers[self.node], self.net.clusters[self.node]
        if self.session is not None and self.session.channel is self:
            broker.table.close_session(self.session, self.net.t)
        if was_connected:
            cluster.disconnected(self, self.net.t, delayed)


class _Published:
    """A MeshPort that records the messages published at its node, and knows the message ids
    its node has taken (the engine's delivery filter)."""

    def __init__(self, out: list[Message], seen: set[tuple[str, int]]):
        self.published = out.append
        self.seen = seen

    def first_here(self, msg: Message) -> bool:
        key = (msg.origin, msg.seq)
        if key in self.seen:
            return False
        self.seen.add(key)
        return True

    def comes_later(self, msg: Message) -> bool:
        return False  # (this network delivers in order: nothing waits for an earlier message)

    def filter_added(self, topic_filter: str) -> None:
        pass

    def filter_removed(self, topic_filter: str) -> None:
        pass

    def hold(self, msg: Message) -> None:
        pass  # (no engine: nothing acknowledged end to end)

    def settle(self, msg: Message) -> None:
        pass

    def online_elsewhere(self, share: str) -> bool:
        return False

    def to_group(self, msg: Message, share: str, now: float) -> bool:
        return False  # (no engine: no other node's member is known)


class Net:
    def __init__(
        self,
        names=NAMES,
        settings: ClusterSettings | None = None,
        wall_offset: float = 1_000_000.0,
        journals: dict | None = None,
        archives: dict | None = None,
    ):
        self.t = 0.0
        self.journals = journals or {}  # node -> its store's Journal (else it keeps nothing)
        self.archives = archives or {}  # node -> its ports.ArchivePort (else no archive)
        self.names = list(names)
        self.up = set(names)  # nodes every other node can reach
        self.queue: deque[tuple[str, str, str, bytes]] = deque()
        self.sent: list[tuple[str, str, str, bytes]] = []  # every unicast, in order
        # the unicasts of ``sent`` that may wait for mesh.batch_delay (ports.UnicastPort ``soon``)
        self.later: list[tuple[str, str, str, bytes]] = []
        self.brokers: dict[str, Broker] = {}
        self.clusters: dict[str, Cluster] = {}
        self.incs = {n: 1 for n in names}
        self.published: dict[str, list[Message]] = {n: [] for n in names}
        self.seen: dict[str, set[tuple[str, int]]] = {}  # node -> message ids it took
        self.routed = {n: 0 for n in names}  # how many of ``published`` ``route`` handed on
        # (time jumps by whole seconds here: no stall makes the nodes distrust their view,
        # except in the tests of that, which pass their own settings)
        self.settings = settings or ClusterSettings(replication=2, stall=1e9)  # (2: these tests place ids on 2 of 3)
        self.wall_offset = wall_offset
        for n in names:
            self._build(n)
        self.membership()
        self.tick(0.0)  # (the nodes' first tick: their quorum needs one)

    def _build(self, n: str) -> None:
        # wired as assembly.build_core wires a mesh node, with an instant network for
        # the engine and a MeshPort that records what was published here
        send, inc, settings = self._sender(n), self.incs[n], self.settings
        trie, auth, bsettings = RetainedTrie(), Auth(), BrokerSettings(node_id=n)
        congestion = Congestion(bsettings.slow_consumer_timeout, bsettings.backpressure_timeout)
        journal = self.journals.get(n, NULL_JOURNAL)
        parts = cluster_parts(n, inc, send, trie, journal, auth, settings, self.wall_offset)
        replication = parts.replication
        archive = self.archives.get(n)
        sessions = ReplicaSessions(
            bsettings.limits,
            journal,
            congestion,
            replication.on_settled,
            on_sent=None if archive is None else archive.sent,
            on_late=replication.late,
            on_subs=replication.subs_changed,
            on_wait=replication.hurry,
        )
        self.seen[n] = set()  # (a restart forgets them)
        mesh = _Published(self.published[n], self.seen[n])
        ports = BrokerPorts(sessions, congestion, mesh, parts.retained, parts.replication, archive)
        broker = Broker(bsettings, auth, journal if n in self.journals else None, ports, retained_trie=trie)
        self.brokers[n] = broker
        self.clusters[n] = Cluster(n, inc, broker.table, broker, send, parts, settings, self.wall_offset)

    def restart(self, n: str) -> None:
        """``n`` is killed and comes back empty (no store) with a new incarnation."""
        self.incs[n] += 1
        self._build(n)
        self.membership()
        self.clusters[n].tick(self.t)  # (its first tick)
        self.pump()

    def _sender(self, frm: str) -> _InstantNet:
        return _InstantNet(self, frm)

    def membership(self) -> None:
        live = sorted(self.up)
        for n in live:
            self.clusters[n].membership(live, {m: self.incs[m] for m in live}, self.t)
        self.pump()

    def pump(self, limit: int = 100_000) -> None:
        self.pump_losing(_nothing_lost, limit)

    def pump_losing(self, lost, limit: int = 100_000) -> None:
        """``pump``, dropping the unicasts for which ``lost(frm, dest, kind)``: sent on a route
        a partition had cut before the sender knew (the cluster's messages are best effort)."""
        for _ in range(limit):
            for n in sorted(self.up):
                self.clusters[n].flush(self.t)
            if not self.queue:
                return
            frm, dest, kind, payload = self.queue.popleft()
            if dest in self.up and not lost(frm, dest, kind):
                self.clusters[dest].receive(frm, kind, payload, self.t)
        raise AssertionError("the cluster did not settle")

    def pump_holding(
        self, kind: str | tuple[str, ...], frm: str | None = None, limit: int = 10_000
    ) -> list[tuple[str, str, str, bytes]]:
        """``pump``, keeping back every unicast of ``kind`` (or of the kinds, a tuple; from
        ``frm`` only, if given): returned, not handed over."""
        kinds = (kind,) if isinstance(kind, str) else kind
        held = []
        for _ in range(limit):
            for n in sorted(self.up):
                self.clusters[n].flush(self.t)
            if not self.queue:
                return held
            item = self.queue.popleft()
            if item[2] in kinds and (frm is None or item[0] == frm):
                held.append(item)
            elif item[1] in self.up:
                self.clusters[item[1]].receive(item[0], item[2], item[3], self.t)
        raise AssertionError("the cluster did not settle")

    def committed(self, node: str, batch: int) -> None:
        """``node``'s store committed ``batch`` (as assembly.NodeCore.committed tells its parts)."""
        for channel in self.brokers[node].committed(batch):
            channel.release_acks(batch, self.t)
        self.clusters[node].committed(batch)

    def tick(self, dt: float) -> None:
        self.t += dt
        for n in sorted(self.up):
            self.clusters[n].tick(self.t)
        self.pump()

    def connect(
        self, node: str, cid: str, clean: bool, will: Will | None = None, pump: bool = True, expiry: int = 0xFFFFFFFF
    ) -> FakeChannel:
        ch = FakeChannel(self, node, cid, expiry)
        self.clusters[node].connect(ch, cid, clean, will, self.t, expiry=expiry)
        if pump:
            self.pump()
        return ch

    def publish(self, node: str, topic: str, payload: bytes, qos: int, retain: bool = False) -> Message:
        """A client published at ``node``; the routing engine brings it to every other node."""
        broker = self.brokers[node]
        msg = Message(topic, payload, qos, retain, node, broker.next_seq(), "pub", self.t + 1_000_000.0)
        broker.publish(msg)
        for n in sorted(self.up - {node}):
            self.brokers[n].deliver_remote(Message(topic, payload, qos, False, node, msg.seq, "pub", msg.timestamp))
        self.pump()
        return msg

    def route(self, node: str) -> list[Message]:
        """The engine's part for what ``node``'s clients published since the last call: every
        other node in reach takes each message id once (the delivery filter)."""
        new = self.published[node][self.routed[node] :]
        self.routed[node] = len(self.published[node])
        for msg in new:
            for n in sorted(self.up - {node}):
                key = (msg.origin, msg.seq)
                if key not in self.seen[n]:
                    self.seen[n].add(key)
                    copy = Message(msg.topic, msg.payload, msg.qos, False, msg.origin, msg.seq, msg.publisher)
                    self.brokers[n].deliver_remote(copy)
        return new

    def client(self, node: str):
        """A real Channel of ``node`` (channel.py), its client's bytes in and out by hand."""
        from mqttmesh.channel import Channel

        from .frames import Recorder

        return Channel(self.brokers[node], Recorder(), "client", self.t, claims=self.clusters[node])

    def kinds(self, since: int = 0) -> list[tuple[str, str, str]]:
        return [(frm, dest, kind) for frm, dest, kind, _ in self.sent[since:]]


def cid_with(net: Net, pred, prefix: str = "client") -> str:
    """The first ClientId whose placement (registrar, holders) satisfies ``pred``."""
    members = net.clusters[net.names[0]].members
    for i in range(10_000):
        cid = f"{prefix}-{i}"
        if pred(members.registrars(cid), members.holders(cid)):
            return cid
    raise AssertionError("no such ClientId")


def holder_of(net: Net, cid: str) -> list[str]:
    return [n for n in net.names if cid in net.brokers[n].sessions]


class _InstantNet:
    """Node ``frm``'s unicasts over the test's network (a ports.UnicastPort): queued for
    ``pump``, in order; a node that is not up neither sends nor is reached."""

    def __init__(self, net: Net, frm: str):
        self.net, self.frm = net, frm

    def reachable(self, dest: str) -> bool:
        return self.frm in self.net.up and dest in self.net.up

    def routes_to(self, dest: str, topic: str) -> bool:
        return False  # (no routing engine here: the redirects forward every message)

    def unicast(self, dest: str, kind: str, payload: bytes, soon: bool = True) -> bool:
        if not self.reachable(dest):
            return False
        self.net.queue.append((self.frm, dest, kind, payload))
        self.net.sent.append((self.frm, dest, kind, payload))
        if not soon:
            self.net.later.append((self.frm, dest, kind, payload))
        return True


def _nothing_lost(frm: str, dest: str, kind: str) -> bool:
    return False
