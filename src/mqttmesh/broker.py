"""The local broker: publish, delivery to the local sessions, retained messages.

Pure. It leaves to its caller the connections (Channels call in and receive
frames), the clock (times are passed in), randomness (``random_hex``), storage
(changes go to a Journal that the I/O layer commits), the archive (an ArchivePort,
archive/capture.py) and the mesh (a MeshPort told of filter changes and of each
message published here; in a mesh also a RetainedPort, a RedirectPort and the
mesh's SessionFactory; the cluster shares its SessionTable). Every port comes with the constructor (``BrokerPorts``):
assembly.build_core is where they are made.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from .auth import Auth
from .flow import Congestion
from .message import Message
from .ports import NO_HITS, ArchivePort, Batch, Hits, JournalPort, MeshPort, RandomHex
from .session import Attached, Limits, Session, SessionFactory
from .session_durable import Sessions
from .session_table import SessionTable
from .shared import is_resend_mark
from .store import NULL_JOURNAL
from .topics import RetainedTrie

__all__ = [
    "Broker",
    "BrokerPorts",
    "BrokerSettings",
    "Stats",
    "counting_hex",
    "ClaimingChannel",
    "HoldsAcks",
    "RetainedPort",
    "RedirectPort",
]


# -- the Broker's ports that name its sessions (the others are in ports.py) -----------------


class RetainedPort(Protocol):
    """Where the retained messages of non-$ topics live in a mesh (mesh/cluster/retained.py
    RetainedOwners: on the topic's owner nodes). None standalone: the Broker keeps them."""

    def retain(self, msg: Message) -> None:
        """A retained message, or an empty one (a deletion) [MQTT-3.3.1-5, -10]."""

    def send_retained(self, session: Session, topic_filter: str, granted: int, now: float) -> int:
        """Send a new subscription the retained messages matching it [MQTT-3.3.1-6]."""


class RedirectPort(Protocol):
    """Where the clients of sessions held here just went (mesh/cluster/replication.py
    Replication): a message for one of them is forwarded there too."""

    @property
    def redirects(self) -> Mapping[str, object]:
        """ClientId -> where its client just went: the hand-over's own dict (a plain
        attribute), nearly always empty, so Broker.dispatch pays one truth test per message."""

    def forward(self, session: Session, msg: Message) -> None:
        """A message reached a local session whose client is in ``redirects``."""


class ClaimingChannel(Attached, Protocol):
    """A client's Channel as the cluster answers it (channel.Channel): the session's
    connection to be, once claimed."""

    client_id: str

    @property
    def claiming(self) -> bool:
        """Still waiting for the claim (a channel that closed meanwhile is not)."""

    def claimed(self, session: Session, present: bool, now: float) -> None:
        """The ClientId is this connection's, mesh-wide, and ``session`` is ready."""

    def refused(self, rc: int, reason: str, now: float) -> None:
        """The claim failed: CONNACK ``rc`` (0x03, server unavailable) and close. A
        persistent session is not served where the node cannot tell it has its latest state
        (mesh/cluster/claimant.py)."""


class HoldsAcks(Protocol):
    """A Channel holding acknowledgements (or messages) back until a journal batch is
    durable (channel_held.py): released by whoever commits (``Broker.committed``)."""

    def release_acks(self, committed: int, now: float) -> None: ...


@dataclass
class BrokerSettings:
    node_id: str = "node"
    limits: Limits = field(default_factory=Limits)
    max_qos: int = 2
    retain_available: bool = True
    max_packet_size: int = 1_048_576
    max_client_id_length: int = 65535
    connect_timeout: float = 10.0
    slow_consumer_timeout: float = 5.0
    backpressure_timeout: float = 1.0
    max_connect_size: int = 65536
    max_keepalive: int = 0  # 0: any
    max_session_expiry: int = 0  # 0: any (MQTT 5's as asked; a 3.1.1 persistent session never ends)
    receive_maximum: int = 1000  # (MQTT 5)
    topic_alias_maximum: int = 64  # (MQTT 5, client to server)
    subscribe_denied_code: int = 0x80  # (MQTT 5)
    # "$share/{name}/{filter}" taken (shared.py; only outside a mesh for now), and how a
    # group picks the member of each message (shared.STRATEGIES)
    shared_subscriptions: bool = True
    shared_strategy: str = "local"
    response_information: str = "response/{client_id}/"  # (MQTT 5, on request)


class Stats:
    """Counters behind $SYS/broker/... and `mqttmesh status`."""

    __slots__ = (
        "received",
        "sent",
        "publish_dropped",
        "publish_denied",
        "bytes_received",
        "bytes_sent",
        "connections_total",
        "connections_refused",
        "protocol_errors",
        "slow_consumers",
        "wills_published",
        "outputs_blocked",
        "memory_pauses",
        "preauth_refused",
        "auth_failures",
        "auth_throttled",
        "auth_busy",
        "too_large",
        "expired",
    )
    # (annotations only: __init__ sets every slot to 0, the per-QoS ones to [0, 0, 0])
    received: list[int]  # PUBLISHes received from clients, by their QoS
    sent: list[int]  # messages handed to sessions, by the QoS they were published with
    publish_dropped: int
    publish_denied: int
    bytes_received: int
    bytes_sent: int
    connections_total: int
    connections_refused: int
    protocol_errors: int
    slow_consumers: int
    wills_published: int
    outputs_blocked: int
    memory_pauses: int
    preauth_refused: int
    auth_failures: int
    auth_throttled: int
    auth_busy: int
    too_large: int  # messages not sent to an MQTT 5 client: over its Maximum Packet Size
    # messages past their Message Expiry before they reached a session (retained, held, in
    # custody or in order between nodes); sessions count their own queues' (Session.expired)
    expired: int

    BY_QOS = ("received", "sent")

    def __init__(self) -> None:
        for name in self.__slots__:
            setattr(self, name, [0, 0, 0] if name in self.BY_QOS else 0)

    @property
    def messages_received(self) -> int:
        return sum(self.received)

    @property
    def messages_sent(self) -> int:
        return sum(self.sent)

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"messages_received": self.messages_received, "messages_sent": self.messages_sent}
        out.update((name, getattr(self, name)) for name in self.__slots__)
        return out


def counting_hex() -> RandomHex:
    """A deterministic stand-in for random bytes (the default for tests): 1, 2, 3... as hex."""
    counter = itertools.count(1)
    return lambda n: f"{next(counter):0{2 * n}x}"


@dataclass(frozen=True)
class BrokerPorts:
    """What a Broker calls, all given at construction (assembly.build_core makes them).

    None is the standalone node's: the Broker makes ``session_durable.Sessions`` over its journal
    and congestion, a Congestion of its settings, and counts for auto ClientIds
    (``counting_hex``; the server passes os.urandom's). ``mesh``, ``retained``,
    ``forwarding`` and ``archive`` stay None outside a mesh or without an archive, and
    each costs one ``is None`` test where it is called.
    """

    sessions: SessionFactory | None = None  # made with the same journal and congestion
    congestion: Congestion | None = None
    mesh: MeshPort | None = None  # mesh/link/gateway.py MeshGateway
    retained: RetainedPort | None = None  # mesh/cluster/retained.py RetainedOwners: non-$ retained topics
    forwarding: RedirectPort | None = None  # mesh/cluster/replication.py Replication: its redirects
    archive: ArchivePort | None = None  # archive/capture.py Capture
    random_hex: RandomHex | None = None  # auto ClientIds [MQTT-3.1.3-6]


_STANDALONE = BrokerPorts()


class Broker:
    def __init__(
        self,
        settings: BrokerSettings,
        auth: Auth | None = None,
        journal: JournalPort | None = None,
        ports: BrokerPorts = _STANDALONE,
        *,
        seq_base: int = 0,
        wall_offset: float = 0.0,
        retained_trie: RetainedTrie | None = None,
    ):
        self.settings = settings
        self.node_id = settings.node_id
        self.auth = auth or Auth()
        self.journal: JournalPort = journal if journal is not None else NULL_JOURNAL
        self.random_hex = ports.random_hex if ports.random_hex is not None else counting_hex()
        # this node's retained messages: all of them standalone, in a mesh those of the
        # topics it owns (shared with mesh/cluster/retained.py) and $SYS
        self.retained = retained_trie if retained_trie is not None else RetainedTrie()
        self.stats = Stats()
        # message numbers, (node, seq) unique mesh-wide; the I/O layer passes a base that
        # a later start of this node exceeds (its incarnation)
        self.seqs = itertools.count(seq_base + 1)
        self.wall_offset = wall_offset  # wall-clock time minus the caller's clock
        # channels waiting for a journal commit, in the order they began to wait: released in
        # that order (a set's order is its members' addresses, which made two runs of one
        # simulated scenario differ: docs/simulation.md, finding 39)
        self.held_ack_channels: dict[HoldsAcks, None] = {}
        if ports.congestion is not None:
            self.congestion = ports.congestion
        else:
            self.congestion = Congestion(settings.slow_consumer_timeout, settings.backpressure_timeout)
        # the archive (archive/capture.py): published(msg) for each message published here
        # that a Channel's read capture did not take (other_origin(msg) for one with another
        # node's id); its delivery log goes to the sessions
        archive = self.archive = ports.archive
        self.mesh = ports.mesh  # told of filter changes and of each message published here
        factory = ports.sessions
        if factory is None:
            on_sent = None if archive is None else archive.sent
            factory = Sessions(settings.limits, self.journal, self.congestion, on_sent=on_sent)
        # the sessions and their subscriptions (session_table.py): the Broker delivers through
        # the trie; in a mesh the cluster holds there the copies of other nodes' sessions too
        table = self.table = SessionTable(factory, self.journal, self.mesh, settings.shared_strategy)
        self.sessions = table.sessions  # (the table's: read here, changed only through it)
        self.trie = table.trie
        self.shared = table.shared  # the shared subscriptions' groups
        self.shared_groups = table.shared.groups  # (the same dict: one test per dispatch)
        self.shared_available = settings.shared_subscriptions
        # persistent sessions as members (in a mesh, of their home node's groups only:
        # session_table.py ``member_here``); a setting may refuse them (channel5.shared_for)
        self.shared_persistent = True
        if self.mesh is not None:
            # what a leaving member held, with no other member here: to another node's member
            self.shared.elsewhere = self.mesh.to_group
            # another node's message a member here took is acknowledged there once the member
            # acknowledged it (mesh/routing/custody.py hold)
            self.shared.hold = self.mesh.hold
            self.shared.settle = self.mesh.settle
            self.shared.online_elsewhere = self.mesh.online_elsewhere
        auth = self.auth  # (read at each delivery: a reload may set or change the ACL)
        self.shared.receives = lambda s, m: auth.acl is None or auth.can_receive(s.username, s.client_id, m.topic)
        self.session_factory = table.factory
        self.retained_port = ports.retained  # where non-$ retained messages go, in a mesh
        # ClientId -> (when, will message, its Message Expiry Interval): wills waiting for
        # their Will Delay Interval on this node (``delay_will``)
        self.delayed_wills: dict[str, tuple[float, Message, int | None]] = {}
        self.forwarding = ports.forwarding  # messages for the clients of local sessions that just moved

    def send_retained(self, session: Session, topic_filter: str, granted: int, now: float) -> int:
        """Send the retained messages matching a new subscription [MQTT-3.3.1-6]."""
        if self.retained_port is not None and not topic_filter.startswith("$"):  # $SYS stays per node
            return self.retained_port.send_retained(session, topic_filter, granted, now)  # from their owners
        if not self.retained:
            return 0  # (no retained message at all: no walk of the filter)
        sent = 0
        auth = self.auth
        for topic, msg in self.retained.match(topic_filter):
            if msg.expires is not None:
                msg = msg.at(now)
                if msg.ttl <= 0.0:  # never sent once expired [MQTT-3.3.2-5]
                    self.stats.expired += 1
                    continue
            if topic[0] == "$":
                if not auth.can_read_sys(session.username, session.client_id, topic):
                    continue
            elif auth.acl is not None and not auth.can_receive(session.username, session.client_id, topic):
                continue
            session.deliver(msg, min(msg.qos, granted), retain=True)  # [MQTT-3.3.1-8]
            sent += 1
        return sent

    # -- publish ----------------------------------------------------------------------------

    def next_seq(self) -> int:
        return next(self.seqs)

    def publish(self, msg: Message, captured: bool = False) -> tuple[Batch, Hits]:
        """Take ownership of a message published at this node; ``captured``: the archive
        has it already, from the bytes of the read it came in (archive/capture.py).

        Returns the journal batch the caller must wait for before acknowledging the
        message (0 when nothing it caused needs to become durable), and the congested
        sessions and peer links it reached, which its publisher owes (flow.py; mostly
        none).
        """
        journal = self.journal
        # journal.mark() and .since() spelled out, here and in deliver_remote: these run
        # once per message, and two attribute reads cost less than two calls
        before = journal.writes
        if msg.retain:
            self.set_retained(msg)
        mesh = self.mesh
        if mesh is None:
            hits = self.dispatch(msg)
        else:
            # routed first: the mesh says which of this node's shared groups serve it
            # (msg.shares, mesh/routing/shares.py), then delivered here
            links = mesh.published(msg)
            hits = self.dispatch(msg)
            if links:
                hits = [*hits, *links]
        if not captured and self.archive is not None:
            if msg.origin is self.node_id:  # (the Channel made it: the same string object)
                self.archive.published(msg)
            else:  # (rare: routed under another node's id, or restored from a store)
                self.archive.other_origin(msg)
        return journal.batch if journal.writes != before else 0, hits

    def dispatch(self, msg: Message) -> Hits:
        """Deliver to the matching local sessions; the congested ones among them (flow.py).
        A message that expired before it got here (``Message.at``) reaches none [MQTT-3.3.2-5]."""
        matches = self.trie.match(msg.topic)
        if not matches or (self.shared_groups and _group_only(msg)):
            return self._to_groups(msg, NO_HITS) if self.shared_groups else NO_HITS
        if msg.expires is not None and msg.ttl <= 0.0:
            self.stats.expired += 1
            return NO_HITS
        qos = msg.qos
        self.stats.sent[qos] += len(matches)
        hits = self.congestion.check(matches) if self.congestion.reasons else NO_HITS
        forwarding = self.forwarding
        if forwarding is not None and forwarding.redirects:
            targets = forwarding.redirects
            for session in matches:
                if session.client_id in targets:
                    forwarding.forward(session, msg)  # its client moved: forward it
        auth = self.auth
        if auth.acl is None:
            for session, granted in matches.items():
                session.deliver(msg, qos if qos < granted else granted)  # [MQTT-3.8.4-6]
        else:
            topic = msg.topic
            for session, granted in matches.items():
                if auth.can_receive(session.username, session.client_id, topic):
                    session.deliver(msg, qos if qos < granted else granted)
        if self.shared_groups:
            return self._to_groups(msg, hits)
        return hits

    def _to_groups(self, msg: Message, hits: Hits) -> Hits:
        """``msg`` to one member of each shared group its topic matches (shared.py); the
        congested sessions it reached, ``hits`` (the plain subscribers') and theirs."""
        shared = self.shared
        groups = shared.match(msg.topic)
        if not groups:
            return hits
        allowed = getattr(msg, "shares", None)  # (in a mesh: the groups it goes to here; None: every one)
        if allowed is not None:
            groups = {g: 0 for g in groups if g.share in allowed}
            if not groups:
                return hits
        if msg.expires is not None and msg.ttl <= 0.0:  # (only for groups alone: dispatch judged it)
            self.stats.expired += 1
            return hits
        sent = self.stats.sent
        chosen = []
        for group in groups:
            member = shared.deliver(group, msg)
            if member is not None:
                sent[msg.qos] += 1
                chosen.append(member)
        if self.congestion.reasons:
            more = self.congestion.check(chosen)
            if more:
                return [*hits, *more]
        return hits

    def delay_will(self, client_id: str, msg: Message, expiry: int | None, due: float) -> None:
        """A will that waits for its Will Delay Interval (MQTT 5; on one node: in a mesh the
        registrar keeps it): published at ``due`` by ``publish_due_wills`` unless a new
        connection for ``client_id`` comes first (``Channel``) [MQTT-3.1.3-9]; ``expiry``: its
        Message Expiry Interval, counted from then. The store keeps it (a restart publishes it
        when due: it is part of the session's state)."""
        self.delayed_wills[client_id] = (due, msg, expiry)
        self.journal.will_put(client_id, due, msg, expiry)

    def cancel_will(self, client_id: str) -> None:
        """A new connection for ``client_id`` came before its delayed will [MQTT-3.1.3-9]."""
        if self.delayed_wills.pop(client_id, None) is not None:
            self.journal.will_delete(client_id)

    def publish_due_wills(self, now: float) -> int:
        """The delayed wills whose time came [MQTT-3.1.2-8]; how many."""
        due = [cid for cid, (at, _, _) in self.delayed_wills.items() if at <= now]
        for cid in due:
            _, msg, expiry = self.delayed_wills.pop(cid)
            self.journal.will_delete(cid)
            msg.timestamp = now + self.wall_offset
            if expiry is not None:
                msg.expiring(expiry, now)
            self.stats.wills_published += 1
            self.publish(msg)
        return len(due)

    def publish_sys(self, msg: Message) -> None:
        """Retain and deliver a message about this node (``$SYS/...``): each receiver
        passes ``Auth.can_read_sys`` (the ACL, and no ClientIds for anonymous clients)."""
        self.retained.set(msg.topic, msg)  # in memory only: recomputed at every start
        matches = self.trie.match(msg.topic)
        auth = self.auth
        topic = msg.topic
        for session, granted in matches.items():
            if auth.can_read_sys(session.username, session.client_id, topic):
                self.stats.sent[msg.qos] += 1
                session.deliver(msg, min(msg.qos, granted))

    def set_retained(self, msg: Message) -> None:
        if not self.settings.retain_available:
            return
        if self.retained_port is not None and msg.topic[0] != "$":
            self.retained_port.retain(msg)  # stored by the topic's owner nodes
            return
        topic = msg.topic
        if not msg.payload:
            if self.retained.delete(topic):  # [MQTT-3.3.1-10]
                self.journal.retained_delete(topic)
            return
        stored = msg.copy(retain=True)  # [MQTT-3.3.1-5]
        self.retained.set(topic, stored)
        self.journal.retained_put(topic, stored)

    # -- durability ---------------------------------------------------------------------------

    def committed(self, batch: int) -> list[HoldsAcks]:
        """The I/O layer made ``batch`` durable: the channels holding acknowledgements (or
        messages) back for a commit, to be released (``Channel.release_acks``; those still
        waiting for a later batch hold theirs again). ``assembly.NodeCore.committed`` does it,
        and tells the mesh, which holds its own."""
        self.journal.mark_committed(batch)
        waiting = self.held_ack_channels
        if not waiting:
            return []
        self.held_ack_channels = {}
        return list(waiting)

    def deliver_remote(self, msg: Message) -> tuple[Batch, Hits]:
        """A message another node routed here: deliver it to local sessions only.

        Returns the journal batch to wait for before it may be acknowledged, and the
        congested sessions it reached (``publish``).
        """
        journal = self.journal
        before = journal.writes  # (mark and since spelled out: see publish)
        hits = self.dispatch(msg)  # (its shared groups here: as the mesh said, Message.shares)
        return journal.batch if journal.writes != before else 0, hits


def _group_only(msg: Message) -> bool:
    """A message for this node's shared groups only, not its other subscribers (a member
    elsewhere left holding it: mesh/link/gateway.py ``to_group``, mesh/routing/shares.py ``only``)."""
    shares: tuple[str, ...] | None = getattr(msg, "shares", None)
    return shares is not None and len(shares) > 0 and is_resend_mark(shares[0])
