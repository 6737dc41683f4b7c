"""One simulated whole node (sim/cluster.py build_node: assembly.build_core and the simulator's
ports) and its disk, without the simulator: milliseconds, no processes."""

from __future__ import annotations

from mqttmesh.channel import Channel
from mqttmesh.mesh.cluster.cluster import ClusterSettings
from mqttmesh.mesh.routing.engine import MeshSettings
from mqttmesh.message import Message
from mqttmesh.sim.cluster import SimLink, SimNode, SimStore, build_node
from mqttmesh.sim.mqttclient import MqttClient


class _IO:
    def __init__(self) -> None:
        self.flushes = 0
        self.commits = 0
        self.seen: list[Message] = []
        self.errors: list[str] = []

    def flush_soon(self) -> None:
        self.flushes += 1

    def flush_later(self) -> None:
        self.flushes += 1

    def flush_now(self) -> None:
        self.flushes += 1

    def link_send(self, link: SimLink, kind: str, payload: bytes, qos: int) -> None:
        raise AssertionError("a node alone has no link")

    def link_close(self, link: SimLink, reason: str) -> None:
        raise AssertionError("a node alone has no link")

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


def _node(store: SimStore, inc: int = 1) -> tuple[SimNode, _IO]:
    io = _IO()
    core = build_node("n1", inc, 0.0, MeshSettings(), ClusterSettings(quorum_grace=0.0), store, io, seed=1)
    core.tick(0.0)  # (a node's first tick: its quorum needs one, issue 15)
    return core, io


def _pump(client: MqttClient, channel: Channel, core: SimNode, now: float) -> list:
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


def _commit(core: SimNode, store: SimStore) -> None:
    batch, ops = core.journal.take()
    store.write(ops)
    core.committed(batch, 0.0)


def test_a_persistent_session_survives_a_restart_once_committed() -> None:
    store = SimStore()
    core, io = _node(store)
    client = MqttClient("c1", clean=False)
    channel = core.channel(_Owner(), "sim", 0.0)
    client.connect()
    events = _pump(client, channel, core, 0.0)
    assert ("connack", 0, False) in events
    client.subscribe([("t/#", 1)])
    events = _pump(client, channel, core, 0.1)
    assert not any(e[0] == "suback" for e in events)  # the SUBACK waits for the commit
    assert io.commits >= 1
    _commit(core, store)
    assert [e[0] for e in client.receive_data(channel.data_to_send())] == ["suback"]
    assert store.sessions == {"c1": ({"t/#": 1}, None)}
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
    channel = core.channel(_Owner(), "sim", 0.0)
    client.connect(Will("will/c2", b"c2#1", 1))
    _pump(client, channel, core, 0.0)
    channel.connection_lost(1.0)  # no DISCONNECT: the will goes out [MQTT-3.1.2-8]
    assert [(m.topic, m.payload) for m in io.seen] == [("will/c2", b"c2#1")]
    assert not io.errors


class _Wire(_IO):
    """One node's side of an instant, in-order network between two nodes' SimLinks."""

    def __init__(self, queue: list, closed: list) -> None:
        super().__init__()
        self.queue, self.closed = queue, closed

    def link_send(self, link: SimLink, kind: str, payload: bytes, qos: int) -> None:
        self.queue.append((link.proved, link.node, kind, payload))

    def link_close(self, link: SimLink, reason: str) -> None:
        self.closed.append(reason)


def test_two_nodes_meet_through_their_peer_links_and_route_a_publish() -> None:
    # the simulator's SimLinks under the real PeerLinks: the dialler's hello is answered,
    # both sides make the link current, and a message published at one node reaches a
    # subscriber of the other (the end-to-end acknowledgement after the receiver's commit)
    queue: list = []
    closed: list = []
    stores = {n: SimStore() for n in ("n1", "n2")}
    wires = {n: _Wire(queue, closed) for n in ("n1", "n2")}
    nodes = {n: build_node(n, 1, 0.0, MeshSettings(), ClusterSettings(), stores[n], wires[n], seed=1) for n in wires}
    sides = {
        ("n1", "n2"): SimLink(wires["n1"], "n1", "n2", "n1", 1, 0.002),  # the dialler
        ("n2", "n1"): SimLink(wires["n2"], "n2", "n1", "n1", 1, None),
    }
    nodes["n1"].links.dialled_ready(sides[("n1", "n2")])
    sub, pub = MqttClient("s", clean=True), MqttClient("p", clean=True)
    channels = {"s": nodes["n2"].channel(_Owner(), "sim", 0.0), "p": nodes["n1"].channel(_Owner(), "sim", 0.0)}
    received: list = []

    def pump(now: float) -> None:
        for _ in range(40):
            moved = False
            for client, name in ((sub, "s"), (pub, "p")):
                data = client.data_to_send()
                if data:
                    channels[name].receive_data(data, now)
                back = channels[name].data_to_send()
                if back:
                    events = client.receive_data(back)
                    if name == "s":
                        received.extend(e for e in events if e[0] == "message")
                moved = moved or bool(data or back)
            for name, node in nodes.items():
                if len(node.journal):
                    _commit(node, stores[name])
                node.flush(now)
            while queue:
                dst, src, kind, payload = queue.pop(0)
                nodes[dst].links.receive(sides[(dst, src)], kind, payload, now)
                moved = True
            if not moved:
                return

    pump(0.0)
    assert nodes["n1"].links.links["n2"] is sides[("n1", "n2")]
    assert nodes["n2"].links.links["n1"] is sides[("n2", "n1")]
    assert nodes["n1"].engine.reachable() == ["n2"] and nodes["n2"].engine.reachable() == ["n1"]
    sub.connect()
    pub.connect()
    pump(0.1)
    sub.subscribe([("t/#", 1)])
    pump(0.2)
    nodes["n1"].tick(0.3)  # (the engines' timers, the cluster's)
    nodes["n2"].tick(0.3)
    pump(0.3)
    pub.publish("t/x", b"hello", 1)
    pump(0.4)
    assert [(e[1], e[2]) for e in received] == [("t/x", b"hello")]
    assert not closed
    assert not nodes["n1"].engine.custody  # the receiver's commit acknowledged it end to end
