"""The store's sessions: ``DurableSession`` journals every change of a CleanSession=0
session, and ``Sessions`` is the Broker's SessionFactory outside a mesh (mesh/cluster/replica.py
has the mesh's).

Pure: the journal is an in-memory list of operations (store.py), committed by the I/O layer.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from .message import Entry
from .session import Limits, Session

if TYPE_CHECKING:
    from .flow import Congestion
    from .message import Message
    from .ports import Batch, JournalPort, SentHook

__all__ = ["DurableSession", "Sessions"]


class DurableSession(Session):
    """A CleanSession=0 session whose every change is journaled for the store.

    The journal is an in-memory list of operations; the I/O layer commits it in
    groups and only then releases the acknowledgements that depend on it.
    """

    stores = True

    durable = True

    def __init__(
        self,
        client_id: str,
        limits: Limits,
        journal: JournalPort,
        congestion: Congestion | None = None,
        on_sent: SentHook | None = None,
    ):
        super().__init__(client_id, False, limits, congestion, on_sent)
        self.journal = journal
        self._next_key = 1

    def _new_entry(self, msg: Message, qos: int, retain: bool) -> Entry:
        entry = Entry(msg, qos, retain, self._next_key, self.sharing)
        self._next_key += 1
        return entry

    def _stored_put(self, entry: Entry) -> None:
        self.journal.message_put(self.client_id, entry)

    def _stored_remove(self, entry: Entry) -> None:
        self.journal.message_remove(self.client_id, entry.key)

    def _stored_subscriptions(self) -> None:
        self.journal.session_put(self.client_id, self.subscriptions, self.expires_at)

    def awaiting_rel_add(self, packet_id: int) -> Batch:
        self._awaiting().add(packet_id)
        self.journal.awaiting_rel_put(self.client_id, packet_id)
        return self.journal.batch

    def awaiting_rel_remove(self, packet_id: int) -> Batch:
        if packet_id not in self.awaiting_rel:
            return 0
        self.awaiting_rel.discard(packet_id)
        # the id must not come back after a crash once PUBCOMP said it is free
        self.journal.awaiting_rel_remove(self.client_id, packet_id)
        return self.journal.batch

    def _stored_inbound(self, packet_id: int, msg: Message | None) -> None:
        if msg is None:
            self.journal.inbound_remove(self.client_id, packet_id)
        else:
            self.journal.inbound_put(self.client_id, packet_id, msg)

    def restore_entry(self, entry: Entry) -> None:
        super().restore_entry(entry)
        self._next_key = max(self._next_key, entry.key + 1)

    def discarded(self) -> None:
        self.journal.session_delete(self.client_id)


class Sessions:
    """The Broker's SessionFactory outside a mesh: a clean session, or a connection that
    keeps its session in memory (peer links), gets a ``Session``; a persistent one a
    ``DurableSession`` when the journal is persistent (a node with a store). Every
    session gets ``on_sent``: the archive's delivery log, or None."""

    def __init__(
        self,
        limits: Limits,
        journal: JournalPort,
        congestion: Congestion | None = None,
        on_sent: SentHook | None = None,
    ):
        self.limits = limits
        self.journal = journal
        self.congestion = congestion
        self.on_sent = on_sent

    def new(self, client_id: str, clean: bool, durable: bool) -> Session:
        if clean or not durable:
            return Session(client_id, clean, self.limits, self.congestion, self.on_sent)
        session = self.restored(client_id)
        session._stored_subscriptions()  # the session itself is durable before CONNACK [MQTT-3.1.2-4]
        return session

    def restored(self, client_id: str) -> Session:
        if self.journal.persistent:
            return DurableSession(client_id, self.limits, self.journal, self.congestion, self.on_sent)
        return Session(client_id, False, self.limits, self.congestion, self.on_sent)

    def restore_replicated(
        self,
        restored: Mapping[str, Session],
        inbound: Iterable[tuple[Any, ...]],
        versions: Iterable[tuple[str, int, int]],
        tombstones: Iterable[tuple[str, int, str, int]],
        floors: Iterable[tuple[str, str, int]],
    ) -> None:
        """What only a session replicated in a mesh keeps (mesh/cluster/replica.py
        ReplicaSessions); a store of a node that left its mesh may still hold such rows."""
