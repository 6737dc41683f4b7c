"""The MQTT 5 Will Delay Interval on one node (broker.py ``delay_will``, ``publish_due_wills``);
across the mesh: tests/mesh/test_mesh_will_delay_unit.py. Rule ids are MQTT 5.0's."""

from __future__ import annotations

from test_channel5_unit import answers, connect5, subscribe5

from mqttmesh import properties as P
from support import mqttraw5 as r5
from support.frames import Net as OneNode


def test_on_one_node_a_delayed_will_waits_and_a_reconnect_cancels_it():
    """[MQTT-3.1.2-8] [MQTT-3.1.3-9] on a node without a mesh: the Broker keeps the will until
    its delay passed (the node's once-a-second sweep publishes it)."""
    net = OneNode()
    sub, _ = connect5(net, "sub")
    subscribe5(sub, ("w/#", 1))
    keep = r5.props((P.SESSION_EXPIRY, r5.u32(600)))
    will = ("w/one", b"gone", 1, False, r5.props((P.WILL_DELAY, r5.u32(5))))
    c = net.channel(1.0)
    c.receive_data(r5.connect("c", clean=False, properties=keep, will=will), 1.0)
    c.connection_lost(2.0)
    assert net.broker.publish_due_wills(6.5) == 0 and answers(sub) == []
    assert net.broker.publish_due_wills(7.5) == 1
    [got] = answers(sub)
    assert (got.topic, got.payload) == ("w/one", b"gone")
    again = net.channel(8.0)
    again.receive_data(r5.connect("c", clean=False, properties=keep, will=will), 8.0)
    again.connection_lost(9.0)
    back = net.channel(10.0)
    back.receive_data(r5.connect("c", clean=False, properties=keep), 10.0)
    assert net.broker.publish_due_wills(100.0) == 0 and answers(sub) == []


def test_on_one_node_a_will_of_a_session_that_ends_goes_at_once():
    net = OneNode()
    sub, _ = connect5(net, "sub")
    subscribe5(sub, ("w/#", 1))
    c = net.channel(1.0)
    c.receive_data(r5.connect("c", will=("w/now", b"x", 0, False, r5.props((P.WILL_DELAY, r5.u32(60))))), 1.0)
    c.connection_lost(2.0)
    assert [p.topic for p in answers(sub)] == ["w/now"]


def test_on_one_node_a_will_is_due_when_its_session_ends_if_that_comes_first():
    """[MQTT-3.1.2-8]: the earlier of the Will Delay Interval and the Session Expiry Interval."""
    net = OneNode()
    sub, _ = connect5(net, "sub")
    subscribe5(sub, ("w/#", 1))
    c = net.channel(1.0)
    keep = r5.props((P.SESSION_EXPIRY, r5.u32(3)))
    c.receive_data(
        r5.connect(
            "c", clean=False, properties=keep, will=("w/e", b"x", 0, False, r5.props((P.WILL_DELAY, r5.u32(60))))
        ),
        1.0,
    )
    c.connection_lost(2.0)
    assert net.broker.publish_due_wills(4.9) == 0
    assert net.broker.publish_due_wills(5.0) == 1
    assert [p.topic for p in answers(sub)] == ["w/e"]
