"""The session factory of a mesh node: persistent sessions replicated across the mesh
(mesh/cluster/replica.py), journaled when the node has a store, and the rows of a
replicated session restored from that store.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from ...message import Message
from ...session import Limits, Session
from ...session_durable import Sessions
from .replica import DurableMeshSession, LateHook, MeshSession, SettledHook, SubsHook, _Replicated, replica_of

if TYPE_CHECKING:
    from ...flow import Congestion
    from ...ports import JournalPort, SentHook

__all__ = ["ReplicaSessions"]


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
    ):
        super().__init__(limits, journal, congestion, on_sent)
        self.on_settled = on_settled
        self.on_late = on_late
        self.on_subs = on_subs
        self.on_shared = on_shared

    def restored(self, client_id: str) -> Session:
        hooks = (self.on_settled, self.on_sent, self.on_late, self.on_subs, self.on_shared)
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
