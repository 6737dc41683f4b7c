"""The sessions of this node by ClientId, and their subscriptions as a topic trie.

Pure. One owner of both tables: a session is opened, restored, subscribed and discarded
here, so that the trie (what the Broker delivers through), the journal (a persistent
session's subscriptions) and the mesh's interest (a filter new to the node, or gone from
it) follow every change. The Broker delivers through ``trie``; in a mesh the cluster
(mesh/cluster/) holds here the copies of sessions whose clients are on other nodes: the
Broker makes the table, assembly.build_core gives it to the cluster.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from .session import KEPT, SUB_QOS
from .shared import (
    SHARE_PREFIX,
    SharedGroup,
    SharedSubscriptions,
    ShareError,
    rejoin_entries,
    settle_entries,
    split_share,
    take_entries,
)
from .topics import SubscriptionTrie

if TYPE_CHECKING:
    from .ports import JournalPort, MeshPort
    from .session import Attached, Session, SessionFactory

__all__ = ["SessionTable", "Ended"]


class Ended:
    """What the sessions discarded here had dropped (the node's ``$SYS`` drop counts add the
    live sessions' own)."""

    __slots__ = ("queue_full", "slow_qos0", "expired", "sessions_expired")

    def __init__(self) -> None:
        self.queue_full = 0  # messages their full queues dropped
        self.slow_qos0 = 0  # QoS 0 messages dropped for a slow consumer
        self.expired = 0  # messages their queues held past their Message Expiry
        self.sessions_expired = 0  # sessions ended by their Session Expiry Interval


def _resuming_none(client_id: str) -> bool:
    return False


def _always(session: Session) -> bool:
    return True


class SessionTable:
    def __init__(
        self,
        factory: SessionFactory,
        journal: JournalPort,
        mesh: MeshPort | None = None,
        shared_strategy: str = "local",
    ):
        self.factory = factory  # makes them (session_durable.Sessions; the mesh's ReplicaSessions)
        self.journal = journal
        self.mesh = mesh  # told when a filter is new to this node, or gone from it
        self.sessions: dict[str, Session] = {}
        self.trie = SubscriptionTrie()  # the local subscriptions (filters -> sessions), not the mesh's routes
        # the shared subscriptions' groups (shared.py): a session's "$share/{name}/{filter}"
        # makes it a member of one, not a subscriber in ``trie``
        self.shared = SharedSubscriptions(shared_strategy)
        self.ended = Ended()
        # sessions kept past their Session Expiry Interval for now (the cluster: a copy that a
        # claim in progress on this node may resume, claimant.py ``resuming``)
        self.resuming: Callable[[str], bool] = _resuming_none
        # is ``session`` a member of this node's shared groups (for its "$share/" filters)? In
        # a mesh, a persistent session is its home node's member only, where its client is or
        # was last (the cluster sets it: mesh/cluster/holders.py); its copies on other nodes
        # keep the subscription for when the client comes to them
        self.member_here: Callable[[Session], bool] = _always

    @property
    def connected_count(self) -> int:
        return sum(1 for s in self.sessions.values() if s.channel is not None)

    def open_session(
        self,
        channel: Attached,
        client_id: str,
        clean: bool,
        now: float,
        durable: bool = True,
        fresh: bool | None = None,
    ) -> tuple[Session, bool]:
        """Take over ``client_id`` for ``channel`` at ``now``; (session, session_present).

        ``clean``: the session ends with the connection; ``fresh``: the session held is
        discarded first (both are 3.1.1's CleanSession, which ``fresh`` follows when None;
        MQTT 5 gives them apart, channel.py). ``durable=False`` keeps even a CleanSession=0
        session in memory (peer links: what they carry is held end to end by its origin,
        see mesh/routing/engine.py).
        """
        if fresh is None:
            fresh = clean
        old = self.sessions.get(client_id)
        if old is not None and old.channel is not None and old.channel is not channel:
            old.channel.kick(f"ClientId {client_id!r} connected again from {channel.peer}", now)  # [MQTT-3.1.4-2]
        if old is not None and (fresh or old.clean):
            self.discard_session(old, now)  # [MQTT-3.1.2-6]
            old = None
        if old is not None:
            old.clean = clean  # (MQTT 5: resumed, and ending with this connection, or not)
            return old, True  # [MQTT-3.2.2-2]
        session = self.factory.new(client_id, clean, durable)
        self.sessions[client_id] = session
        return session, False

    def close_session(self, session: Session, now: float) -> None:
        """The connection of ``session`` ended at ``now``: clean sessions end with it
        [MQTT-3.1.2-6]; one with a Session Expiry Interval ends that long after
        [MQTT-3.1.2-23] [MQTT-4.1.0-2] (``expire_sessions``), unless a connection resumes it."""
        session.detach()
        if session.clean and self.sessions.get(session.client_id) is session:
            self.discard_session(session, now)
            return
        if self.shared.groups and self._is_member(session):
            # what waits for it goes to the members that are connected, here or on another
            # node, if there are any (it keeps it when there is none); the mesh hears of its
            # groups here with no connected member (QUEUED)
            shared = self.shared
            taken = take_entries(session, lambda group: shared.online_besides(session, group), shared=shared)
            shared.redispatch(session, taken, now)
            self._advertise_groups(session)
        if session.expiry != KEPT:
            session.expires_at = now + session.expiry
            if session.durable:
                session._stored_subscriptions()  # (a restart keeps counting: the store has it)

    def expire_sessions(self, now: float) -> int:
        """End the sessions without a client whose Session Expiry Interval passed; how many."""
        due = [
            s
            for s in self.sessions.values()
            if s.expires_at is not None and s.expires_at <= now and s.channel is None and not self.resuming(s.client_id)
        ]
        for session in due:
            self.discard_session(session, now)
        self.ended.sessions_expired += len(due)
        return len(due)

    def discard_session(self, session: Session, now: float | None = None) -> None:
        """``session`` ends here (``now``: when, if the caller knows: what it held for its
        shared groups is judged for expiry as of then)."""
        ended = self.ended
        ended.queue_full += session.dropped
        ended.slow_qos0 += session.dropped_qos0
        ended.expired += session.expired
        member = bool(self.shared.groups) and self._is_member(session)
        for topic_filter in session.unsubscribe_all():
            self._trie_remove(topic_filter, session)
        if member:
            # nothing it got through a group is lost with it: to the other members, but a
            # QoS 2 message in flight, which goes with it [MQTT-4.8.2-5]
            shared = self.shared
            shared.abandoned += sum(1 for e in session.inflight.values() if e.group is not None and e.qos == 2)
            shared.redispatch(session, take_entries(session), now)
        if session.inflight or session.queue:
            settle_entries(session)
        if self.sessions.get(session.client_id) is session:
            del self.sessions[session.client_id]
        session.discarded()

    def restore_session(self, session: Session) -> None:
        """Register a session made by ``factory.restored`` (filled from the store at start,
        or, in a mesh, a copy of a session whose client is elsewhere)."""
        self.sessions[session.client_id] = session
        for topic_filter, value in session.subscriptions.items():
            self._trie_add(topic_filter, session, value & SUB_QOS)
        if session.inflight or session.queue:
            # (what came through a group, restored from the store, is that group's again:
            # handed on, settled and dropped as it would have been before the restart)
            rejoin_entries(session, self.shared)

    # -- subscriptions ------------------------------------------------------------------

    def subscribe(self, session: Session, topic_filter: str, value: int) -> None:
        """``value``: the granted QoS, with an MQTT 5 subscription's options (session.SUB_QOS)."""
        session.subscribe(topic_filter, value)  # replaces an identical filter [MQTT-3.8.4-3]
        self._trie_add(topic_filter, session, value & SUB_QOS)

    def unsubscribe(self, session: Session, topic_filter: str, now: float | None = None) -> bool:
        if not session.unsubscribe(topic_filter):  # exact comparison [MQTT-3.10.4-1]
            return False
        group = self._trie_remove(topic_filter, session)
        if group is not None and group.members:
            # what waits for it from that group goes to the others (with none left, it keeps
            # it, as any unsubscribe leaves what was queued); what is in flight is completed
            # here [MQTT-3.10.4-3]: its PUBLISH was sent, or waits for the store or the
            # session's holders and leaves when they answer (handed on too, it reached two
            # members, and its packet id was free while the client held it: the simulator's
            # harsh scenario, seed 35, a message sent after it had expired)
            taken = take_entries(
                session, lambda g: (g.name, g.topic_filter) == (group.name, group.topic_filter), inflight=False
            )
            self.shared.redispatch(session, taken, now)
        return True

    def _is_member(self, session: Session) -> bool:
        return any(f.startswith(SHARE_PREFIX) for f in session.subscriptions)

    def _trie_add(self, topic_filter: str, session: Session, qos: int) -> None:
        if topic_filter.startswith(SHARE_PREFIX):
            try:
                share = split_share(topic_filter)
            except ShareError:
                return  # (a stored subscription of a form no longer taken: not served)
            if share is not None:
                # a group new to this node is advertised to the mesh as its "$share/..."
                # filter (mesh/routing/shares.py chooses the node of each message)
                if self.member_here(session):
                    self.shared.join(session, share[0], share[1], qos)
                    self.advertise(self.shared.groups[share])
                return
        if self.trie.add(topic_filter, session, qos) and self.mesh is not None:
            self.mesh.filter_added(topic_filter)

    def _trie_remove(self, topic_filter: str, session: Session) -> SharedGroup | None:
        """``session`` no longer subscribes to ``topic_filter``; the group it left, if a shared one."""
        if topic_filter.startswith(SHARE_PREFIX):
            try:
                share = split_share(topic_filter)
            except ShareError:
                return None
            if share is not None:
                group, _ = self.shared.leave(session, share[0], share[1])
                if group is not None:
                    self.advertise(group)
                return group
        if self.trie.remove(topic_filter, session) and self.mesh is not None:
            self.mesh.filter_removed(topic_filter)
        return None

    # -- shared groups in a mesh ------------------------------------------------------------

    def advertise(self, group: SharedGroup) -> None:
        """Tell the mesh what changed of ``group`` here: a member, or none any more, or none
        connected (``SharedSubscriptions.advertisement``): one interest change, and none while
        it stays the same (a member joining a group with a connected member costs nothing)."""
        now_as = self.shared.advertisement(group)
        was = group.advertised
        if now_as == was:
            return
        group.advertised = now_as
        mesh = self.mesh
        if mesh is None:
            return
        if was is not None:
            mesh.filter_removed(was)
        if now_as is not None:
            mesh.filter_added(now_as)

    def _advertise_groups(self, session: Session) -> None:
        groups = self.shared.groups
        for topic_filter in session.subscriptions:
            if topic_filter.startswith(SHARE_PREFIX):
                share = _share_of(topic_filter)
                group = groups.get(share) if share is not None else None
                if group is not None:
                    self.advertise(group)

    def attached(self, session: Session) -> None:
        """A client connected to ``session`` (Channel): a group of which it is the only
        connected member here is advertised as served again."""
        if self.shared.groups and self._is_member(session):
            self._advertise_groups(session)

    def regroup(self, session: Session) -> None:
        """``member_here`` may say otherwise of ``session`` now (its client came here, or
        went to another node): it joins, or leaves, this node's groups of its "$share/"
        filters. Leaving, what it had through them stays in it, untagged, and is waited for
        no more here: it goes with the session's copy to its new home."""
        here = self.member_here(session)
        shared = self.shared
        for topic_filter, value in session.subscriptions.items():
            share = _share_of(topic_filter)
            if share is None:
                continue
            group = shared.groups.get(share)
            inside = group is not None and session in group.members
            if here and not inside:
                shared.join(session, share[0], share[1], value & SUB_QOS)
                self.advertise(shared.groups[share])
            elif not here and inside:
                group, _ = shared.leave(session, share[0], share[1])
                if group is not None:
                    self.advertise(group)
        if not here and (session.inflight or session.queue):
            settle_entries(session, untag=True)


def _share_of(topic_filter: str) -> tuple[str, str] | None:
    try:
        return split_share(topic_filter)
    except ShareError:
        return None
