"""What the local broker's subscribers and publishers mean for the mesh (mesh/link/gateway.py)."""

from __future__ import annotations

from mqttmesh.flow import Congestion
from mqttmesh.mesh.link.gateway import FLUSH_EVERY, MeshGateway
from mqttmesh.mesh.link.links import FLUSH_SOON_AT
from mqttmesh.message import Message


class Engine:
    def __init__(self, routes=True):
        self.added: list[str] = []
        self.removed: list[str] = []
        self.routed: list[tuple[str, float]] = []
        self.routes = routes
        self.wanting: dict[str, list[str]] = {}
        self.next_hop: dict[str, str] = {}
        self.unicasts: list[tuple[str, str, bytes]] = []

    def local_filter_added(self, f):
        self.added.append(f)

    def local_filter_removed(self, f):
        self.removed.append(f)

    def route_local(self, msg, now):
        self.routed.append((msg.topic, now))
        return self.routes

    def send_unicast(self, dest, kind, payload):
        self.unicasts.append((dest, kind, payload))
        return dest != "gone"

    def nodes_wanting(self, topic):
        return self.wanting.get(topic, [])

    def route_to(self, node):
        return self.next_hop.get(node)


class Broker:
    """What the gateway shares with the Broker, given to both at construction."""

    def __init__(self):
        self.wall_offset = 1_000.0
        self.congestion = Congestion()


class IO:
    def __init__(self):
        self.soon = 0  # at the end of the loop turn
        self.later = 0  # within mesh.batch_delay
        self.now = 0

    def flush_soon(self):
        self.soon += 1

    def flush_later(self):
        self.later += 1

    def flush_now(self):
        self.now += 1


class Link:
    def __init__(self, key):
        self.key = key

    def congestion_key(self):
        return self.key


def gateway(routes=True, links=None):
    engine, broker, io = Engine(routes), Broker(), IO()
    return MeshGateway(engine, broker.congestion, broker.wall_offset, links or {}, io), engine, broker, io


def msg(topic, timestamp=1_005.0):
    return Message(topic, b"x", 0, timestamp=timestamp)


def test_dollar_filters_stay_local():
    gw, engine, _, io = gateway()
    gw.filter_added("$SYS/#")
    gw.filter_removed("$mesh/to/a/#")
    assert engine.added == engine.removed == [] and io.soon == 0
    gw.filter_added("t/#")
    gw.filter_removed("t/#")
    assert engine.added == engine.removed == ["t/#"] and io.soon == 2


def test_dollar_topics_stay_local_and_others_route_at_their_publish_time():
    gw, engine, _, io = gateway()
    gw.published(msg("$SYS/broker/uptime"))
    assert engine.routed == []
    gw.published(msg("t/1", timestamp=1_005.5))
    assert engine.routed == [("t/1", 5.5)]  # the loop clock: the timestamp less the wall offset
    assert (io.later, io.soon) == (1, 0)  # (it may wait mesh.batch_delay for more)


def test_a_message_routed_nowhere_schedules_nothing():
    gw, engine, _, io = gateway(routes=False)
    gw.published(msg("t/1"))
    assert io.soon == 0 and io.later == 0 and io.now == 0


def test_every_flush_every_routed_messages_send_at_once():
    gw, _, _, io = gateway()
    for _ in range(FLUSH_EVERY - 1):
        gw.published(msg("t/1"))
    assert (io.later, io.soon, io.now) == (1, 1, 0)  # one flush asked for, then for this loop turn
    gw.published(msg("t/1"))  # the 256th
    assert io.now == 1
    for _ in range(FLUSH_EVERY):
        gw.published(msg("t/1"))
    assert io.now == 2


def test_the_count_starts_again_once_the_io_sent():
    gw, _, _, io = gateway()
    for _ in range(FLUSH_EVERY - 1):
        gw.published(msg("t/1"))
    gw.sent()  # the end of the loop iteration
    gw.published(msg("t/1"))
    assert (io.later, io.soon, io.now) == (2, 1, 0)


def test_a_busy_turn_sends_at_its_end_not_after_the_batch_delay():
    gw, _, _, io = gateway()
    for _ in range(FLUSH_SOON_AT - 1):
        gw.published(msg("t/1"))
    assert (io.later, io.soon) == (1, 0)
    gw.published(msg("t/1"))  # a batch's worth in one turn: its peer should not wait idle
    assert (io.later, io.soon, io.now) == (1, 1, 0)


def test_a_congested_link_holds_the_publisher():
    slow, fast = Link("slow"), Link("fast")
    gw, engine, broker, _ = gateway(links={"b": slow, "c": fast})
    engine.wanting["t/1"] = ["b", "c", "d"]
    engine.next_hop = {"b": "b", "c": "c"}  # d is unreachable
    congestion = broker.congestion
    assert gw.published(msg("t/1")) == ()  # nothing congested: not even looked at
    congestion.add("slow", "queue")
    assert gw.published(msg("t/1")) == ["slow"]


def test_a_stalled_link_does_not_hold_the_publisher():
    slow = Link("slow")
    gw, engine, broker, _ = gateway(links={"b": slow})
    engine.wanting["t/1"] = ["b"]
    engine.next_hop = {"b": "b"}
    broker.congestion.add("slow", "queue")
    broker.congestion.stalled.add("slow")
    assert not gw.published(msg("t/1"))


def test_a_unicast_goes_to_the_engine_and_is_sent_soon():
    gw, engine, _, io = gateway()
    assert gw.unicast("b", "reg.claim", b"{}") is True
    assert gw.unicast("gone", "reg.claim", b"{}") is False  # unreachable now: the cluster retries
    assert engine.unicasts == [("b", "reg.claim", b"{}"), ("gone", "reg.claim", b"{}")]
    assert io.soon == 2
