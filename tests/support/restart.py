"""A node's store written, and a node restarted from it (pure Broker, a mesh's session factory):
what a copy of a replicated session is after a kill -9 and a restart (tests/unit)."""

from __future__ import annotations

from typing import Any

from mqttmesh.broker import Broker, BrokerPorts, BrokerSettings
from mqttmesh.flow import Congestion
from mqttmesh.mesh.cluster.replica_sessions import ReplicaSessions
from mqttmesh.server.sqlite_store import SqliteStore
from mqttmesh.session import Limits
from mqttmesh.store import Journal


def write_store(directory: Any, ops: list[tuple[Any, ...]]) -> None:
    """Commit ``ops`` (a journal batch, ``Journal.take``) to the SQLite store in ``directory``."""
    store = SqliteStore(str(directory))
    store.write(ops)
    store.db.close()


def restarted_session(directory: Any, client_id: str) -> Any:
    """The session ``client_id`` as a node restarted from the store in ``directory`` has it."""
    factory = ReplicaSessions(Limits(), Journal(), Congestion(), lambda *a: None)
    broker = Broker(BrokerSettings(node_id="n1"), None, None, BrokerPorts(sessions=factory))
    again = SqliteStore(str(directory))
    again.load(broker)
    again.db.close()
    return broker.sessions[client_id]
