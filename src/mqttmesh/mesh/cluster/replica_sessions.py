"""The session factory of a mesh node: persistent sessions replicated across the mesh
(mesh/cluster/replica.py's copy, made a Session here, and journaled when the node has a
store), and the rows of a replicated session restored from that store.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from ...message import Message
from ...session import Limits, Session
from ...session_durable import DurableSession, Sessions
from .replica import TOMBSTONES, LateHook, SettledHook, SubsHook, WaitHook, _Replicated, replica_of

if TYPE_CHECKING:
    from ...flow import Congestion
    from ...ports import JournalPort, SentHook

__all__ = ["ReplicaSessions", "MeshSession", "DurableMeshSession"]


class MeshSession(_Replicated, Session):
    def __init__(
        self,
        client_id: str,
        limits: Limits,
        congestion: Congestion | None = None,
        on_settled: SettledHook | None = None,
        on_sent: SentHook | None = None,
        on_late: LateHook | None = None,
        on_subs: SubsHook | None = None,
        on_shared: LateHook | None = None,
        on_wait: WaitHook | None = None,
    ):
        Session.__init__(self, client_id, False, limits, congestion, on_sent)
        self._init_replication(on_settled, on_late, on_subs, on_shared, on_wait)


class DurableMeshSession(_Replicated, DurableSession):
    def __init__(
        self,
        client_id: str,
        limits: Limits,
        journal: JournalPort,
        congestion: Congestion | None = None,
        on_settled: SettledHook | None = None,
        on_sent: SentHook | None = None,
        on_late: LateHook | None = None,
        on_subs: SubsHook | None = None,
        on_shared: LateHook | None = None,
        on_wait: WaitHook | None = None,
    ):
        DurableSession.__init__(self, client_id, limits, journal, congestion, on_sent)
        self._init_replication(on_settled, on_late, on_subs, on_shared, on_wait)

    def _stored_version(self) -> None:
        self.journal.version_put(self.client_id, self.epoch, self.version)

    def committed(self) -> int:
        return self.journal.committed

    def _stored_floor(self, origin: str, seq: int) -> None:
        self.journal.floor_put(self.client_id, origin, seq)

    def _stored_done(self, key: tuple[str, int]) -> None:
        n = self.tombstones_stored = self.tombstones_stored + 1
        self.journal.done_put(self.client_id, n % TOMBSTONES, n, key[0], key[1])


class ReplicaSessions(Sessions):
    """The SessionFactory of a mesh node: its persistent sessions are replicated (journaled
    too when the node has a store), and report every settlement to ``on_settled``."""

    def __init__(
        self,
        limits: Limits,
        journal: JournalPort,
        congestion: Congestion | None,
        on_settled: SettledHook,
        on_sent: SentHook | None = None,
        on_late: LateHook | None = None,
        on_subs: SubsHook | None = None,
        on_shared: LateHook | None = None,
        on_wait: WaitHook | None = None,
    ):
        super().__init__(limits, journal, congestion, on_sent)
        self.on_settled = on_settled
        self.on_late = on_late
        self.on_subs = on_subs
        self.on_shared = on_shared
        self.on_wait = on_wait

    def restored(self, client_id: str) -> Session:
        hooks = (self.on_settled, self.on_sent, self.on_late, self.on_subs, self.on_shared, self.on_wait)
        if self.journal.persistent:
            return DurableMeshSession(client_id, self.limits, self.journal, self.congestion, *hooks)
        return MeshSession(client_id, self.limits, self.congestion, *hooks)

    def restore_replicated(
        self,
        restored: Mapping[str, Session],
        inbound: Iterable[tuple[Any, ...]],
        versions: Iterable[tuple[str, int, int]],
        tombstones: Iterable[tuple[str, int, str, int]],
        floors: Iterable[tuple[str, str, int]],
    ) -> None:
        """The rows of a replicated session (store.restore_sessions): its inbound QoS 2
        messages, (epoch, version), settled ids and floors."""

        def replica(client_id: str) -> _Replicated | None:
            session = restored.get(client_id)
            return replica_of(session)

        for client_id, pid, topic, payload, retain, origin, seq, publisher, ts, props, expires in inbound:
            r = replica(client_id)
            if r is not None and pid in r.awaiting_rel:
                props = bytes(props) if props is not None else None
                msg = Message(topic, bytes(payload), 2, bool(retain), origin, seq, publisher, ts, props)
                msg.expires = expires  # (routed as it stands then: Channel._route_unrouted)
                r.inbound[pid] = msg
        for client_id, epoch, version in versions:
            r = replica(client_id)
            if r is not None:
                r.epoch, r.version = epoch, version
        for client_id, number, origin, seq in tombstones:
            r = replica(client_id)
            if r is not None:
                r._remember_done((origin, seq))
                r.tombstones_stored = max(r.tombstones_stored, number)
        for client_id, origin, seq in floors:
            r = replica(client_id)
            if r is not None and seq > r.floors.get(origin, -1):
                r.floors[origin] = seq  # (as stored: no need to store it again)
