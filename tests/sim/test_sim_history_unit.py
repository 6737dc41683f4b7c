"""The simulator's MQTT client (sim/mqttclient.py) against a real Broker and Channel, and the
history checks (sim/history.py) on histories written by hand. No processes, milliseconds."""

from __future__ import annotations

from mqttmesh.broker import Broker, BrokerSettings
from mqttmesh.channel import Channel
from mqttmesh.codec import Will
from mqttmesh.sim.history import History, check_handover, check_order, check_wills
from mqttmesh.sim.mqttclient import MqttClient


class _Owner:
    """The smallest ports.Owner: the test moves the bytes itself."""

    def __init__(self) -> None:
        self.closed: str | None = None

    def wake(self, channel: Channel) -> None:
        pass

    def close(self, channel: Channel, reason: str) -> None:
        self.closed = reason

    def authenticate(self, channel: Channel, username: str | None, password: bytes | None) -> None:
        channel.authenticated(0, 0.0)

    def connected(self, channel: Channel) -> None:
        pass

    def pause_reading(self, channel: Channel) -> None:
        pass

    def resume_reading(self, channel: Channel) -> None:
        pass


def _pump(client: MqttClient, channel: Channel, now: float = 0.0, rounds: int = 4) -> list:
    events = []
    for _ in range(rounds):
        data = client.data_to_send()
        if data:
            channel.receive_data(data, now)
        back = channel.data_to_send()
        if back:
            events += client.receive_data(back)
        if not data and not back:
            break
    return events


def _connect(broker: Broker, client: MqttClient, will: Will | None = None) -> tuple[Channel, list]:
    channel = Channel(broker, _Owner(), "sim", 0.0)
    client.connect(will)
    return channel, _pump(client, channel)


def test_publish_qos1_and_qos2_are_acknowledged_and_delivered() -> None:
    broker = Broker(BrokerSettings())
    sub = MqttClient("sub", clean=False)
    sch, events = _connect(broker, sub)
    assert ("connack", 0, False) in events
    sub.subscribe([("t/#", 2)])
    assert _pump(sub, sch)[0][0] == "suback"
    pub = MqttClient("pub", clean=True)
    pch, _ = _connect(broker, pub)
    pub.publish("t/1", b"a", 1)
    pub.publish("t/2", b"b", 2)
    acks = _pump(pub, pch)
    assert [e[0] for e in acks] == ["acked", "acked", "completed"]
    got = _pump(sub, sch)
    assert [(e[1], e[2], e[3]) for e in got if e[0] == "message"] == [("t/1", b"a", 1), ("t/2", b"b", 2)]
    assert not pub.outgoing and not sub.awaiting_rel


def test_unacknowledged_publish_is_sent_again_with_dup_on_a_resumed_session() -> None:
    # [MQTT-4.4.0-1]: on reconnection with CleanSession=0 the client re-sends unacknowledged
    # PUBLISH packets (DUP=1) and PUBRELs
    broker = Broker(BrokerSettings())
    client = MqttClient("c", clean=False)
    _connect(broker, client)
    client.publish("t", b"one", 1)
    client.publish("t", b"two", 2)
    client.data_to_send()  # lost with the connection
    client.connection_lost()
    assert len(client.outgoing) == 2
    client.connect()
    connect = client.data_to_send()
    channel = Channel(broker, _Owner(), "sim", 0.0)
    channel.receive_data(connect, 0.0)
    events = client.receive_data(channel.data_to_send())
    assert events[0][0] == "connack"
    resent = client.data_to_send()
    assert resent[0] & 0x08 and resent[0] >> 4 == 3  # a PUBLISH with DUP set
    channel.receive_data(resent, 0.0)
    events = client.receive_data(channel.data_to_send())
    assert [e[0] for e in events] == ["acked", "acked"]
    # the QoS 2 message is at PUBREL now; a reconnection sends the PUBREL again
    client.data_to_send()
    client.connection_lost()
    client.connect()
    channel = Channel(broker, _Owner(), "sim", 0.0)
    channel.receive_data(client.data_to_send(), 0.0)
    client.receive_data(channel.data_to_send())
    assert client.data_to_send() == bytes((0x62, 2, 0, 2))  # PUBREL for packet id 2


def test_a_clean_client_forgets_what_was_unacknowledged() -> None:
    client = MqttClient("c", clean=True)
    client.connect()
    client.publish("t", b"x", 1)
    client.connection_lost()
    assert not client.outgoing


def test_a_repeated_qos2_publish_is_reported_once() -> None:
    broker = Broker(BrokerSettings())
    sub = MqttClient("s", clean=False)
    ch, _ = _connect(broker, sub)
    frame = bytes((0x34, 7, 0, 1, 0x74, 0, 9)) + b"xy"  # PUBLISH QoS 2 "t" id 9
    first = sub.receive_data(frame)
    again = sub.receive_data(bytes((0x3C,)) + frame[1:])  # the same, DUP=1
    assert [e[0] for e in first] == ["message"] and again == []


def _history_move() -> History:
    h = History()
    h.connect(0.0, "s", "ok", "n1/1/1", "n1", False)
    h.subscribed(0.1, "s", [("c/s", 1)])
    h.publish(5.0, "p", "invoke", "p:1", "c/s", 1)
    h.publish(5.1, "p", "ok", "p:1", "c/s", 1)
    h.publish(5.2, "p", "invoke", "p:2", "c/s", 2)
    h.publish(5.3, "p", "ok", "p:2", "c/s", 2)
    h.closed(6.0, "s", "n1/1/1", False, "dropped")
    h.connect(7.0, "s", "ok", "n2/1/1", "n2", True)
    return h


def test_handover_check_finds_a_lost_message_and_a_qos2_duplicate() -> None:
    h = _history_move()
    h.received(7.1, "s", "p:2", "c/s", 2, False, "n2/1/1")
    h.received(7.2, "s", "p:2", "c/s", 2, False, "n2/1/1")
    result = check_handover(h, settle=2.0)
    assert result.checked == 2
    assert result.lost == [("p:1", "s", 5.1)]
    assert result.qos2_twice == [("p:2", "s")]


def test_handover_check_passes_when_all_arrive() -> None:
    h = _history_move()
    h.received(5.2, "s", "p:1", "c/s", 1, False, "n1/1/1")
    h.received(7.1, "s", "p:1", "c/s", 1, True, "n2/1/1")  # QoS 1 again: allowed
    h.received(7.1, "s", "p:2", "c/s", 2, False, "n2/1/1")
    result = check_handover(h, settle=2.0)
    assert result.checked == 2 and not result.lost and not result.qos2_twice and result.qos1_again == 1


def test_will_check() -> None:
    h = History()
    for conn in ("a", "b", "c", "d"):
        h.connect(0.0, "x", "invoke", conn, "n1", "will")
        h.connect(0.0, "x", "ok", conn, "n1", False)
    h.connect(0.0, "y", "invoke", "e", "n1")  # no will: nothing to check
    h.connect(0.0, "y", "ok", "e", "n1", False)
    h.closed(1.0, "y", "e", False, "dropped")
    h.closed(1.0, "x", "a", False, "dropped")  # needs one will
    h.closed(1.0, "x", "b", True, "DISCONNECT")  # needs none
    h.closed(1.0, "x", "c", False, "dropped")  # published twice
    # d: still open at the end, needs none
    result = check_wills(h, {"a": 1, "b": 1, "c": 2, "d": 1})
    assert result.checked == 4 and not result.missing
    assert result.twice == [("c", 2)]
    assert [conn for conn, _ in result.unwanted] == ["b", "d"]
    assert check_wills(h, {"c": 1}).missing == ["a"]


def test_order_is_per_publisher_topic_and_qos_and_a_moved_session_counts_apart():
    """[MQTT-4.6.0-6]: a first delivery below one already delivered on its stream is a reorder;
    repeats of an id are not deliveries; the earlier delivery on another connection counts
    apart (the subscriber's session moved between nodes)."""
    h = History()
    h.received(1.0, "s", "p:1", "t/a", 1, False, "s#1", 1)
    h.received(1.1, "s", "p:3", "t/a", 1, False, "s#1", 2)
    h.received(1.2, "s", "p:2", "t/a", 1, False, "s#1", 3)  # after 3, same connection
    h.received(1.3, "s", "p:2", "t/a", 1, True, "s#1", 3)  # a repeat: not counted again
    h.received(1.4, "s", "p:0", "t/b", 1, False, "s#1", 4)  # another topic: its own order
    h.received(1.5, "s", "p:5", "t/a", 2, False, "s#1", 5)  # another QoS: its own order
    h.received(1.6, "s", "q:9", "t/a", 1, False, "s#1", 6)  # another publisher
    h.received(2.0, "s", "p:4", "t/a", 2, False, "s#2", 1)  # after 5, on the next connection
    h.received(2.1, "s", "x", "t/a", 1, False, "s#2", 2)  # not "publisher:n": not judged
    r = check_order(h)
    assert r.checked == 7
    assert r.same_connection == [("s", "p:2", "p:3")]
    assert r.across_connections == [("s", "p:4", "p:5")]
    assert r.by_stream == {"p t/a 1": 1, "p t/a 2": 1} and r.reorders == 2
