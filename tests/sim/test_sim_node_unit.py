"""One simulated whole node (sim/cluster.py build_node) and its disk, without the simulator:
milliseconds, no processes."""

from __future__ import annotations

from mqttmesh.channel import Channel
from mqttmesh.mesh.cluster import ClusterSettings
from mqttmesh.mesh.engine import MeshSettings
from mqttmesh.message import Message
from mqttmesh.sim.cluster import SimCore, SimStore, build_node
from mqttmesh.sim.mqttclient import MqttClient


class _IO:
    def __init__(self) -> None:
        self.flushes = 0
        self.commits = 0
        self.seen: list[Message] = []
        self.errors: list[str] = []

    def flush_soon(self) -> None:
        self.flushes += 1

    def commit_soon(self) -> None:
        self.commits += 1

    def published(self, msg: Message) -> None:
        self.seen.append(msg)

    def error(self, what: str) -> None:
        self.errors.append(what)


class _Owner:
    def wake(self, channel: Channel) -> None:
        pass

    def close(self, channel: Channel, reason: str) -> None:
        pass

    def authenticate(self, channel: Channel, username: str | None, password: bytes | None) -> None:
        channel.authenticated(0, 0.0)

    def connected(self, channel: Channel) -> None:
        pass

    def pause_reading(self, channel: Channel) -> None:
        pass

    def resume_reading(self, channel: Channel) -> None:
        pass


def _node(store: SimStore, inc: int = 1) -> tuple[SimCore, _IO]:
    io = _IO()
    core = build_node("n1", inc, 0.0, MeshSettings(), ClusterSettings(), store, io, seed=1)
    return core, io


def _pump(client: MqttClient, channel: Channel, core: SimCore, now: float) -> list:
    events = []
    for _ in range(6):
        data = client.data_to_send()
        if data:
            channel.receive_data(data, now)
        core.flush(now)  # the cluster's unicasts to itself, claims included
        core.tick(now)
        back = channel.data_to_send()
        if back:
            events += client.receive_data(back)
        if not data and not back:
            break
    return events


def _commit(core: SimCore, store: SimStore) -> None:
    batch, ops = core.journal.take()
    store.write(ops)
    core.committed(batch)


def test_a_persistent_session_survives_a_restart_once_committed() -> None:
    store = SimStore()
    core, io = _node(store)
    client = MqttClient("c1", clean=False)
    channel = Channel(core.broker, _Owner(), "sim", 0.0)
    client.connect()
    events = _pump(client, channel, core, 0.0)
    assert ("connack", 0, False) in events
    client.subscribe([("t/#", 1)])
    events = _pump(client, channel, core, 0.1)
    assert not any(e[0] == "suback" for e in events)  # the SUBACK waits for the commit
    assert io.commits >= 1
    _commit(core, store)
    assert [e[0] for e in client.receive_data(channel.data_to_send())] == ["suback"]
    assert store.sessions == {"c1": {"t/#": 1}}
    # a message queued for the session after the last commit is lost with the node (kill -9)
    channel.connection_lost(0.2)
    core.broker.publish(Message("t/x", b"late", 1, False, "n1", 1, "p", 0.2))
    assert len(core.journal)
    again, _ = _node(store, inc=2)
    session = again.broker.sessions["c1"]
    assert session.subscriptions == {"t/#": 1} and not session.queue and not session.inflight
    again.flush(0.3)
    assert "t/#" in again.engine.interests["n1"].filters  # restored sessions re-add their filters


def test_wills_are_seen_where_they_are_published() -> None:
    store = SimStore()
    core, io = _node(store)
    from mqttmesh.codec import Will

    client = MqttClient("c2", clean=False, keepalive=0)
    channel = Channel(core.broker, _Owner(), "sim", 0.0)
    client.connect(Will("will/c2", b"c2#1", 1))
    _pump(client, channel, core, 0.0)
    channel.connection_lost(1.0)  # no DISCONNECT: the will goes out [MQTT-3.1.2-8]
    assert [(m.topic, m.payload) for m in io.seen] == [("will/c2", b"c2#1")]
    assert not io.errors
