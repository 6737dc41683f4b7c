"""One MQTT service across the mesh: ClientId registry, sessions, wills, retained messages.

Pure: no sockets, no asyncio, no clock (every entry point takes ``now``; wall-clock
seconds, for the timestamps other nodes compare, are ``now + wall_offset``). It leaves to
its caller how unicasts reach other nodes (a ``ports.UnicastPort``, over the routing
engine) and which nodes are alive (it is told with ``membership``). Its parts answer with
data: the registry returns what to do, the hand-over, the replication and the retained
owners put what they have to say in one ``Outbox``; the Cluster alone sends.

The pieces, all keyed by rendezvous hashing over the live nodes (membership.py):

* **Registry** (registry.py). Each ClientId has a registrar (the top node of its
  ranking) and a backup (the second). Connecting anywhere *claims* the id at the
  registrar, which hands out an increasing epoch and tells the previous holder to drop
  its connection (fencing: a kick names the connection it is for). The registrar also
  keeps the client's will: when the node holding the connection is found dead, the
  registrar publishes it, once.
* **Sessions** (claimant.py, holders.py, replica.py, replication.py). A persistent session is held by its holders:
  the top ``replication`` nodes of the ClientId's ranking plus the node the client was
  last connected to. All holders subscribe, so each gets every message; the node the
  client is on delivers and tells the others what is settled. A client connecting
  elsewhere gathers the holders' copies (a union by message id) before its CONNACK, and
  the holders forward what still arrives for a while (redirect), the new node dropping
  what it already has.
* **Retained messages** (retained.py). Each retained topic lives on the top
  ``replication`` nodes of the topic's ranking, newest version winning; a subscription
  asks those owners (exact filter) or every node (wildcards).

This module is the coordinator: it builds the registry and the hand-over, decodes every
message once at the door (cluster_wire.py), hands it to its handler (``HANDLERS``) and
does what the parts answered: messages to nodes (the outbox) and wills to publish (through
a ``WillPort``). None of them holds the Broker: the hand-over keeps its copies of sessions
in the node's session table (session_table.py), which the Broker delivers through.
What the Broker calls (the replicated sessions' Replication, the RetainedOwners) and who
is alive (Membership) are built before the Broker, by ``cluster_parts``, and given to it.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, TypeVar, cast

from ...session import KEPT
from .claimant import Claimant
from .cluster_values import ClusterSettings
from .cluster_wire import (
    Outbox,
    RegClaim,
    RegCopy,
    RegGrant,
    RegKick,
    RegRegister,
    RegRelease,
    RetAck,
    RetQuery,
    RetReply,
    RetSet,
    SessAck,
    SessCopy,
    SessDiscard,
    SessFetch,
    SessFwd,
    SessMerge,
    SessSettle,
    SessState,
    SessSubs,
    ToNode,
    Wire,
    decode,
)
from .holders import Holders
from .membership import Membership
from .registry import Registry, RegistryOut
from .replica import replica_of
from .replication import Replication
from .retained import RetainedOwners

if TYPE_CHECKING:
    from ...auth import Auth
    from ...broker import ClaimingChannel
    from ...message import Message
    from ...packets import Will
    from ...ports import Batch, Hits, JournalPort, UnicastPort
    from ...session_table import SessionTable
    from ...topics import RetainedTrie

__all__ = ["ClusterSettings", "ClusterParts", "Cluster", "WillPort", "HANDLERS", "cluster_parts"]


class WillPort(Protocol):
    """Where the Cluster publishes the wills its registry found due (the Broker)."""

    def publish(self, msg: Message, captured: bool = False) -> tuple[Batch, Hits]: ...

    def next_seq(self) -> int: ...


class ClusterParts(NamedTuple):
    """What the Cluster shares with the Broker, built before either (assembly.build_core)."""

    membership: Membership
    replication: Replication  # the Broker's RedirectPort; the hooks of ReplicaSessions
    retained: RetainedOwners  # the Broker's RetainedPort
    outbox: Outbox  # what the parts have to say to nodes, in order (the Cluster sends it)
    ids: Iterator[int]  # one counter for connection ids and retained query ids


def cluster_parts(
    node_id: str,
    incarnation: int,
    net: UnicastPort,
    retained_trie: RetainedTrie,
    journal: JournalPort,
    auth: Auth,
    settings: ClusterSettings,
    wall_offset: float,
    wake: Callable[[], None] = lambda: None,
    wake_later: Callable[[], None] | None = None,
) -> ClusterParts:
    membership = Membership(
        node_id,
        incarnation,
        settings.replication,
        settings.will_delay,
        settings.stall,
        settings.quorum_grace,
        settings.expect_peers,
    )
    ids = itertools.count(1)
    outbox = Outbox(wake, wake_later)
    replication = Replication(node_id, membership, outbox, wake, wake_later, net)
    retained = RetainedOwners(
        node_id, membership, retained_trie, journal, auth, outbox, net, settings, ids, wall_offset
    )
    return ClusterParts(membership, replication, retained, outbox, ids)


class Cluster:
    """The mesh-wide ClientIds and sessions (a ports.ClaimPort for the Channels)."""

    def __init__(
        self,
        node_id: str,
        incarnation: int,
        table: SessionTable,
        wills: WillPort,
        net: UnicastPort,
        parts: ClusterParts,
        settings: ClusterSettings,
        wall_offset: float = 0.0,
    ):
        self.node_id = node_id
        self.incarnation = incarnation
        self.table = table  # the node's sessions, the copies held for other nodes' clients too
        self.wills = wills
        self._net = net
        self.outbox = parts.outbox
        self.settings = settings
        self.wall_offset = wall_offset  # wall-clock seconds minus `now`
        self.members = parts.membership
        self.replication = parts.replication
        self.retained = parts.retained
        self.registry = Registry(node_id, self.members, wall_offset, 2 * settings.register_interval)
        # the copies of persistent sessions held here, and the claims of clients connecting here
        self.holders = Holders(node_id, self.members, table, parts.replication, parts.outbox, settings)
        self.claimant = Claimant(
            node_id,
            incarnation,
            self.members,
            self.holders,
            parts.outbox,
            net,
            settings,
            parts.ids,
            wall_offset,
        )
        table.resuming = self.claimant.resuming  # (our copy of a session a claim here gathers)

    # ------------------------------------------------------------------ plumbing

    def _send(self, dest: str, msg: Wire, now: float, later: bool = False) -> None:
        """To another node, or to this one (handled at once, through the same decoding);
        ``later``: within mesh.batch_delay (ports.UnicastPort ``soon``)."""
        if dest == self.node_id:
            self.receive(self.node_id, msg.KIND, msg.encode(), now)
            return
        self._net.unicast(dest, msg.KIND, msg.encode(), not later)

    def send_out(self, now: float) -> None:
        """Send what the parts put in the outbox, in order (after each call into the
        Cluster, and at every flush: what they said outside its calls)."""
        outbox = self.outbox
        while outbox.items:
            for dest, msg, later in outbox.take():
                self._send(dest, msg, now, later)

    def do(self, out: RegistryOut, now: float) -> None:
        """What a protocol answered, in order: messages to nodes (this one's handled here,
        now), after what the parts said before them, and wills to publish here."""
        outbox = self.outbox
        for action in out:
            if isinstance(action, ToNode):
                outbox.items.append(action)  # (items: a new list after each take)
            else:
                self.send_out(now)
                self._publish_will(action.msg)
        self.send_out(now)

    def _publish_will(self, msg: Message) -> None:
        """A will the registrar found due: one message by its id wherever it is published
        (a node that had it already only routes it on), or numbered here (``seq`` 0)."""
        wills = self.wills
        if not msg.seq:
            wills.publish(msg.copy(seq=wills.next_seq()))
            return
        mesh = self.table.mesh
        if mesh is None or mesh.first_here(msg):
            wills.publish(msg)
        else:
            mesh.published(msg)  # (delivered here already: only routed)

    @property
    def counters(self) -> dict[str, int]:
        """Every part's counters, added up (a part counts what it does, in a dict of its own)."""
        total: dict[str, int] = {}
        for part in (self.claimant, self.holders, self.registry, self.replication, self.retained):
            for name, n in part.counters.items():
                total[name] = total.get(name, 0) + n
        return total

    @property
    def live(self) -> list[str]:
        return self.members.live

    # ------------------------------------------------------------------ membership

    def membership(self, live: list[str], incs: dict[str, int], now: float, synced: bool = True) -> None:
        """The reachable nodes (with incarnations) changed; ``synced``: the routing engine holds
        a neighbour's whole database (the mesh's subscriptions are known here)."""
        members = self.members
        before = len(members.known)
        old_live = members.update(live, incs, now, synced)
        if len(members.known) > before:
            journal = self.table.journal
            for node in members.known:
                if node != self.node_id:
                    journal.node_seen(node)  # (stored once: the store ignores a repeat)
        self.do(self.registry.rebalance(now), now)
        self.claimant.register_local(now)
        self.send_out(now)  # (each step's messages before the next step: as they were said)
        self.holders.rebalance(old_live, now)
        self.retained.rebalance(now)
        self.send_out(now)
        self.claimant.retry_claims(now)
        self.send_out(now)
        self.claimant.fence(now)
        self.send_out(now)

    def remember(self, nodes: list[str], now: float) -> None:
        """The nodes this node had seen before it stopped (its store): they count in its
        quorum and in every session's home from the start, reachable or not."""
        self.members.remember(nodes)

    # ------------------------------------------------------------------ the Channel's side

    def connect(
        self,
        channel: ClaimingChannel,
        cid: str,
        clean: bool,
        will: Will | None,
        now: float,
        will_seq: int = 0,
        fresh: bool | None = None,
        expiry: int = KEPT,
    ) -> None:
        """A client passed authentication; finish with ``channel.claimed(session, present, now)``."""
        self.claimant.connect(channel, cid, clean, will, now, will_seq, fresh, expiry)
        self.send_out(now)

    def disconnected(self, channel: ClaimingChannel, now: float, delayed: bool = False) -> None:
        """A local connection ended; its will, if due now, was published here by the Channel;
        ``delayed``: it is due after its Will Delay Interval, the registrar's to publish. A
        session that now runs out its Session Expiry Interval tells its holders when it ends
        (a copy: holders.py ``left``) and its registrar (the release)."""
        replica = replica_of(self.table.sessions.get(channel.client_id))
        expiry = KEPT
        if replica is not None:
            # (what gathered goes: no answer waited for now)
            self.replication.resume(replica.client_id, True)
        if replica is not None and replica.channel is None and not replica.clean:
            expiry = replica.expiry
            if replica.expires_at is not None:
                self.holders.left(replica, now)
        self.claimant.disconnected(channel, now, delayed, expiry)
        self.send_out(now)

    # ------------------------------------------------------------------ input and time

    def receive(self, frm: str, kind: str, payload: bytes, now: float, age: float = 0.0) -> None:
        """A unicast from node ``frm`` (kinds ``reg.*``, ``sess.*``, ``ret.*``), ``age``
        seconds on the way (routing/wire.py); a body that is not its kind's, or an unknown
        kind, raises ClusterWireError (a ValueError)."""
        msg = decode(kind, payload, int(age * 1000.0))
        HANDLERS[kind][1](self, frm, msg, now)
        self.send_out(now)

    def tick(self, now: float) -> None:
        self.members.ticked(now)
        self.table.expire_sessions(now)  # (copies whose Session Expiry Interval passed)
        self.claimant.fence(now, sessions=False)
        self.send_out(now)
        self.claimant.expire_claims(now)
        self.send_out(now)
        self.retained.expire_lookups(now)
        self.replication.expire(now)
        self.holders.retry_lagging(now)
        self.holders.retry_pools(now)
        self.send_out(now)
        self.do(self.registry.publish_lost_wills(now), now)
        if now - self.claimant.last_register >= self.settings.register_interval:
            self.claimant.register_local(now)
            self.send_out(now)
        self.retained.expire_tombstones(now)

    def committed(self, batch: int) -> None:
        """The store committed ``batch`` (``assembly.NodeCore.committed``): the answers that
        waited for it go at the next flush, which the outbox asks for."""
        self.holders.committed(batch)

    def flush(self, now: float) -> None:
        """Send what accumulated: settlements to holders, retained sets to owners, and what
        the parts said outside the Cluster's calls."""
        self.send_out(now)
        self.holders.flush(now)
        self.retained.flush()
        self.send_out(now)

    # ------------------------------------------------------------------ status

    def status(self) -> dict[str, Any]:
        """Counters and live nodes: nothing that names a client."""
        counters = self.counters
        # QoS 2 messages the sessions here took for settled and forgotten (replica.forgotten)
        counters["forgotten_qos2"] = sum(
            r.forgotten_qos2 for r in map(replica_of, self.table.sessions.values()) if r is not None
        )
        return {"counters": counters, "live": self.members.live}

    def clients(self) -> dict[str, Any]:
        """The ClientIds this node registers (as their first registrar) and serves."""
        return {"registrations": self.registry.view(), "local_clients": sorted(self.claimant.local)}


# --------------------------------------------------------------------------- dispatch

W = TypeVar("W", bound=Wire)
Handler = Callable[[Cluster, str, Wire, float], None]


def _on(kind: type[W], handler: Callable[[Cluster, str, W, float], None]) -> tuple[str, tuple[type[Wire], Handler]]:
    """A table row; the handler is typed for the message ``decode`` makes of ``kind``."""
    return kind.KIND, (kind, cast(Handler, handler))


def _reg_claim(c: Cluster, frm: str, m: RegClaim, now: float) -> None:
    c.do(c.registry.on_claim(frm, m, now), now)


def _reg_grant(c: Cluster, frm: str, m: RegGrant, now: float) -> None:
    c.claimant.on_grant(frm, m, now)


def _reg_kick(c: Cluster, frm: str, m: RegKick, now: float) -> None:
    c.claimant.on_kick(frm, m, now)


def _reg_release(c: Cluster, frm: str, m: RegRelease, now: float) -> None:
    c.do(c.registry.on_release(frm, m, now), now)


def _reg_register(c: Cluster, frm: str, m: RegRegister, now: float) -> None:
    c.do(c.registry.on_register(frm, m, now), now)


def _reg_copy(c: Cluster, frm: str, m: RegCopy, now: float) -> None:
    c.do(c.registry.on_copy(frm, m, now), now)


def _sess_fetch(c: Cluster, frm: str, m: SessFetch, now: float) -> None:
    # (judged before a client of ours stops for the claim: a take-over resumes the session of
    # the connection it ends, fuzzer seed 939)
    ended = c.claimant.session_ended(m.cid, m.epoch, now)
    c.claimant.on_fetch(frm, m, now)  # (a client of ours with another connection stops first)
    c.holders.on_fetch(frm, m, now, ended)


def _sess_state(c: Cluster, frm: str, m: SessState, now: float) -> None:
    c.claimant.on_state(frm, m, now)


def _sess_copy(c: Cluster, frm: str, m: SessCopy, now: float) -> None:
    c.holders.on_copy(frm, m, now)


def _sess_merge(c: Cluster, frm: str, m: SessMerge, now: float) -> None:
    c.holders.on_merge(frm, m, now)


def _sess_settle(c: Cluster, frm: str, m: SessSettle, now: float) -> None:
    c.holders.on_settle(frm, m, now)


def _sess_ack(c: Cluster, frm: str, m: SessAck, now: float) -> None:
    c.holders.on_ack(frm, m, now)


def _sess_subs(c: Cluster, frm: str, m: SessSubs, now: float) -> None:
    c.holders.on_subs(frm, m, now)


def _sess_discard(c: Cluster, frm: str, m: SessDiscard, now: float) -> None:
    c.holders.on_discard(frm, m, now)


def _sess_fwd(c: Cluster, frm: str, m: SessFwd, now: float) -> None:
    if not c.holders.forwarded(m, now):
        c.claimant.gathering(m, now)  # (no copy here yet: a claim may be gathering it)


def _ret_set(c: Cluster, frm: str, m: RetSet, now: float) -> None:
    c.retained.on_set(frm, m, now)


def _ret_ack(c: Cluster, frm: str, m: RetAck, now: float) -> None:
    c.retained.on_ack(frm, m, now)


def _ret_query(c: Cluster, frm: str, m: RetQuery, now: float) -> None:
    c.retained.on_query(frm, m, now)


def _ret_reply(c: Cluster, frm: str, m: RetReply, now: float) -> None:
    c.retained.on_reply(frm, m, now)


# kind -> (the message type decode() makes of it, its handler)
HANDLERS: dict[str, tuple[type[Wire], Handler]] = dict(
    [
        _on(RegClaim, _reg_claim),
        _on(RegGrant, _reg_grant),
        _on(RegKick, _reg_kick),
        _on(RegRelease, _reg_release),
        _on(RegRegister, _reg_register),
        _on(RegCopy, _reg_copy),
        _on(SessFetch, _sess_fetch),
        _on(SessState, _sess_state),
        _on(SessCopy, _sess_copy),
        _on(SessMerge, _sess_merge),
        _on(SessSettle, _sess_settle),
        _on(SessAck, _sess_ack),
        _on(SessSubs, _sess_subs),
        _on(SessDiscard, _sess_discard),
        _on(SessFwd, _sess_fwd),
        _on(RetSet, _ret_set),
        _on(RetAck, _ret_ack),
        _on(RetQuery, _ret_query),
        _on(RetReply, _ret_reply),
    ]
)
