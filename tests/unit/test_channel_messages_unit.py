"""mqttmesh.channel.Channel with mqttmesh.broker.Broker: PUBLISH in and out, acknowledgements,
SUBSCRIBE/UNSUBSCRIBE, retained messages, access control and group commit.
"""

from __future__ import annotations

import pytest

from mqttmesh.auth import Acl, Auth
from mqttmesh.channel import CLOSED, CONNECTED
from mqttmesh.message import Message
from mqttmesh.session import Limits
from mqttmesh.store import Journal
from support import mqttraw
from support.frames import Net, out, publishes


def h(text: str) -> bytes:
    return bytes.fromhex(text)


@pytest.fixture
def net():
    return Net()


# --------------------------------------------------------------------------- PUBLISH from a client


def test_qos0_publish_is_delivered_without_ack(net):
    sub = net.subscriber("s", ("a/b", 2))
    pub = net.connect("p")
    pub.receive_data(mqttraw.publish("a/b", b"hi"), 1.0)
    assert pub.data_to_send() == b""
    assert sub.data_to_send() == h("30 07 00 03 61 2f 62 68 69")


def test_qos1_publish_gets_puback(net):
    """[MQTT-4.3.2-2] PUBACK with the packet id; a repeat is a new publication."""
    sub = net.subscriber("s", ("a", 1))
    pub = net.connect("p")
    pub.receive_data(mqttraw.publish("a", b"x", qos=1, pid=0x1234), 1.0)
    assert pub.data_to_send() == h("40 02 12 34")
    pub.receive_data(mqttraw.publish("a", b"x", qos=1, pid=0x1234, dup=True), 1.0)
    assert pub.data_to_send() == h("40 02 12 34")
    assert publishes(sub) == [("a", b"x", 1, False, False, 1), ("a", b"x", 1, False, False, 2)]


def test_qos2_duplicate_before_pubrel_is_not_delivered_again(net):
    """[MQTT-4.3.3-2] PUBREC again, no second delivery; PUBREL -> PUBCOMP; then the id is new."""
    sub = net.subscriber("s", ("a", 2))
    pub = net.connect("p")
    pub.receive_data(mqttraw.publish("a", b"x", qos=2, pid=7), 1.0)
    assert pub.data_to_send() == h("50 02 00 07")
    assert publishes(sub) == [("a", b"x", 2, False, False, 1)]
    pub.receive_data(mqttraw.publish("a", b"x", qos=2, pid=7, dup=True), 2.0)
    assert pub.data_to_send() == h("50 02 00 07")
    pub.receive_data(mqttraw.publish("a", b"x", qos=2, pid=7), 2.5)  # DUP=0 changes nothing
    assert pub.data_to_send() == h("50 02 00 07")
    assert publishes(sub) == []
    pub.receive_data(mqttraw.pubrel(7), 3.0)
    assert pub.data_to_send() == h("70 02 00 07")
    pub.receive_data(mqttraw.publish("a", b"y", qos=2, pid=7), 4.0)
    assert pub.data_to_send() == h("50 02 00 07")
    assert publishes(sub) == [("a", b"y", 2, False, False, 2)]


def test_pubrel_for_an_unknown_id_gets_pubcomp(net):
    pub = net.connect("p")
    pub.receive_data(mqttraw.pubrel(99), 1.0)
    assert pub.data_to_send() == h("70 02 00 63")
    assert pub.state == CONNECTED


def test_qos2_ids_awaiting_pubrel_are_kept_across_reconnect(net):
    sub = net.subscriber("s", ("a", 2))
    pub = net.connect("p", clean=False)
    pub.receive_data(mqttraw.publish("a", b"x", qos=2, pid=5), 1.0)
    pub.connection_lost(2.0)
    pub = net.connect("p", clean=False, expect=h("20 02 01 00"))
    pub.receive_data(mqttraw.publish("a", b"x", qos=2, pid=5, dup=True), 3.0)
    assert pub.data_to_send() == h("50 02 00 05")
    assert publishes(sub) == [("a", b"x", 2, False, False, 1)]


def test_too_many_qos2_awaiting_pubrel_closes_without_delivering():
    net = Net(limits=Limits(max_awaiting_rel=1))
    sub = net.subscriber("s", ("a", 2))
    pub = net.connect("p")
    pub.receive_data(mqttraw.publish("a", b"1", qos=2, pid=1), 1.0)
    pub.receive_data(mqttraw.publish("a", b"2", qos=2, pid=2), 1.0)
    assert pub.state == CLOSED
    assert pub.data_to_send() == h("50 02 00 01")
    # not acknowledged, so the client will send it again: delivering it now would duplicate it
    assert publishes(sub) == [("a", b"1", 2, False, False, 1)]


def test_dup_is_not_propagated(net):
    """[MQTT-3.3.1-3]"""
    sub = net.subscriber("s", ("a", 1))
    pub = net.connect("p")
    pub.receive_data(mqttraw.publish("a", b"x", qos=1, pid=3, dup=True), 1.0)
    assert publishes(sub) == [("a", b"x", 1, False, False, 1)]


@pytest.mark.parametrize(
    "sub_qos, pub_qos, delivered",
    [(0, 0, 0), (0, 1, 0), (0, 2, 0), (1, 0, 0), (1, 1, 1), (1, 2, 1), (2, 0, 0), (2, 1, 1), (2, 2, 2)],
)
def test_delivery_qos_is_the_minimum(net, sub_qos, pub_qos, delivered):
    """[MQTT-3.8.4-6]"""
    sub = net.subscriber("s", ("a", sub_qos))
    pub = net.connect("p")
    pub.receive_data(mqttraw.publish("a", b"x", qos=pub_qos, pid=1), 1.0)
    assert publishes(sub) == [("a", b"x", delivered, False, False, 1 if delivered else None)]


def test_overlapping_subscriptions_one_copy_at_the_highest_qos(net):
    """[MQTT-3.3.5-1]"""
    sub = net.subscriber("s", ("a/#", 0), ("a/+", 2), ("+/b", 1))
    pub = net.connect("p")
    pub.receive_data(mqttraw.publish("a/b", b"x", qos=2, pid=1), 1.0)
    assert publishes(sub) == [("a/b", b"x", 2, False, False, 1)]


def test_messages_to_one_subscriber_keep_publish_order(net):
    """[MQTT-4.6.0-6]"""
    sub = net.subscriber("s", ("a", 1))
    pub = net.connect("p")
    pub.receive_data(b"".join(mqttraw.publish("a", str(i), qos=1, pid=i + 1) for i in range(5)), 1.0)
    assert [p[1] for p in publishes(sub)] == [b"0", b"1", b"2", b"3", b"4"]


def test_dollar_topic_publish_is_acknowledged_not_delivered(net):
    """A client may not publish to $-topics: acknowledged [MQTT-3.3.5-2], not delivered nor retained."""
    sub = net.subscriber("s", ("$SYS/#", 1), ("$x", 1))
    pub = net.connect("p")
    pub.receive_data(
        mqttraw.publish("$SYS/x", b"1", qos=1, pid=1) + mqttraw.publish("$x", b"2", qos=2, pid=2, retain=True), 1.0
    )
    assert pub.data_to_send() == h("40 02 00 01 50 02 00 02")
    assert publishes(sub) == []
    assert len(net.broker.retained) == 0
    assert pub.state == CONNECTED


# --------------------------------------------------------------------------- PUBLISH to a client


def test_outbound_qos1_flow(net):
    sub = net.subscriber("s", ("a", 1))
    pub = net.connect("p")
    pub.receive_data(mqttraw.publish("a", b"x", qos=1, pid=9), 1.0)
    assert sub.data_to_send() == h("32 06 00 01 61 00 01 78")
    session = net.broker.sessions["s"]
    assert list(session.inflight) == [1]
    sub.receive_data(mqttraw.puback(1), 2.0)
    assert session.inflight == {}
    assert sub.data_to_send() == b""


def test_outbound_qos2_flow(net):
    """[MQTT-4.3.3-1] PUBREL on PUBREC, released on PUBCOMP."""
    sub = net.subscriber("s", ("a", 2))
    pub = net.connect("p")
    pub.receive_data(mqttraw.publish("a", b"x", qos=2, pid=9), 1.0)
    assert sub.data_to_send() == h("34 06 00 01 61 00 01 78")
    sub.receive_data(mqttraw.pubrec(1), 2.0)
    assert sub.data_to_send() == h("62 02 00 01")
    sub.receive_data(mqttraw.pubcomp(1), 3.0)
    assert net.broker.sessions["s"].inflight == {}
    assert sub.data_to_send() == b""


# --------------------------------------------------------------------------- SUBSCRIBE / UNSUBSCRIBE


def test_suback_codes_in_order(net):
    """[MQTT-3.8.4-1/2/5] [MQTT-3.9.3-1]"""
    ch = net.connect("c")
    ch.receive_data(mqttraw.subscribe(0x0102, ("a", 0), ("b", 1), ("c", 2)), 1.0)
    assert ch.data_to_send() == h("90 05 01 02 00 01 02")


def test_suback_grants_at_most_max_qos():
    net = Net(max_qos=1)
    ch = net.connect("c")
    ch.receive_data(mqttraw.subscribe(1, ("a", 0), ("b", 1), ("c", 2)), 1.0)
    assert ch.data_to_send() == h("90 05 00 01 00 01 01")
    pub = net.connect("p")
    pub.receive_data(mqttraw.publish("c", b"x", qos=2, pid=1), 1.0)
    assert publishes(ch) == [("c", b"x", 1, False, False, 1)]


def test_suback_0x80_for_mesh_filters(net):
    ch = net.connect("c")
    ch.receive_data(mqttraw.subscribe(1, ("$mesh/x", 1), ("a", 1), ("$mesh/#", 0)), 1.0)
    assert ch.data_to_send() == h("90 05 00 01 80 01 80")
    assert net.broker.sessions["c"].subscriptions == {"a": 1}


def test_suback_0x80_from_the_acl():
    acl = Acl.parse("topic readwrite a/#\ntopic deny a/secret/#\ntopic write w/#\n")
    net = Net(auth=Auth(acl=acl))
    ch = net.connect("c")
    ch.receive_data(mqttraw.subscribe(1, ("a/x", 1), ("b", 1), ("a/secret/y", 0), ("a/#", 2), ("w/1", 0)), 1.0)
    # a/# only overlaps the denied a/secret/#: granted, the denied topics filtered at delivery
    assert ch.data_to_send() == h("90 07 00 01 01 80 80 02 80")


def test_acl_filters_delivery_and_publish():
    acl = Acl.parse("topic readwrite a/#\ntopic deny a/secret/#\n")
    net = Net(auth=Auth(acl=acl))
    sub = net.subscriber("s", ("a/+/x", 1))
    pub = net.connect("p")
    pub.receive_data(
        mqttraw.publish("a/secret/x", b"no", qos=1, pid=1)
        + mqttraw.publish("a/open/x", b"yes", qos=1, pid=2)
        + mqttraw.publish("b", b"denied", qos=1, pid=3),
        1.0,
    )
    assert pub.data_to_send() == h("40 02 00 01 40 02 00 02 40 02 00 03")  # [MQTT-3.3.5-2]
    assert publishes(sub) == [("a/open/x", b"yes", 1, False, False, 1)]


def test_resubscribe_replaces_the_subscription(net):
    """[MQTT-3.8.4-3]"""
    sub = net.subscriber("s", ("a", 2))
    sub.receive_data(mqttraw.subscribe(2, ("a", 0)), 1.0)
    assert sub.data_to_send() == h("90 03 00 02 00")
    assert net.broker.sessions["s"].subscriptions == {"a": 0}
    pub = net.connect("p")
    pub.receive_data(mqttraw.publish("a", b"x", qos=2, pid=1), 1.0)
    assert publishes(sub) == [("a", b"x", 0, False, False, None)]


def test_unsubscribe_compares_filters_exactly(net):
    """[MQTT-3.10.4-1] [MQTT-3.10.4-4] [MQTT-3.10.4-5]"""
    sub = net.subscriber("s", ("a/+", 1))
    pub = net.connect("p")
    sub.receive_data(mqttraw.unsubscribe(5, "a/b"), 1.0)
    assert sub.data_to_send() == h("b0 02 00 05")
    pub.receive_data(mqttraw.publish("a/b", b"1"), 1.0)
    assert publishes(sub) == [("a/b", b"1", 0, False, False, None)]
    sub.receive_data(mqttraw.unsubscribe(6, "a/+"), 2.0)
    assert sub.data_to_send() == h("b0 02 00 06")
    pub.receive_data(mqttraw.publish("a/b", b"2"), 2.0)
    assert publishes(sub) == []
    assert len(net.broker.trie) == 0


def test_unsuback_even_when_nothing_matched(net):
    """[MQTT-3.10.4-5]"""
    ch = net.connect("c")
    ch.receive_data(mqttraw.unsubscribe(0xABCD, "never/subscribed", "#"), 1.0)
    assert ch.data_to_send() == h("b0 02 ab cd")


def test_unsubscribe_several_filters(net):
    """[MQTT-3.10.4-6] one UNSUBACK."""
    sub = net.subscriber("s", ("a", 0), ("b", 0), ("c", 0))
    sub.receive_data(mqttraw.unsubscribe(2, "a", "c"), 1.0)
    assert sub.data_to_send() == h("b0 02 00 02")
    assert net.broker.sessions["s"].subscriptions == {"b": 0}


def test_unsubscribe_completes_messages_in_flight(net):
    """[MQTT-3.10.4-3]"""
    sub = net.subscriber("s", ("a", 1))
    pub = net.connect("p")
    pub.receive_data(mqttraw.publish("a", b"x", qos=1, pid=1), 1.0)
    assert len(publishes(sub)) == 1
    sub.receive_data(mqttraw.unsubscribe(2, "a") + mqttraw.puback(1), 2.0)
    assert sub.data_to_send() == h("b0 02 00 02")
    assert net.broker.sessions["s"].inflight == {}


# --------------------------------------------------------------------------- retained messages


def subscribe_out(net, client_id, *filters):
    ch = net.connect(client_id)
    ch.receive_data(mqttraw.subscribe(1, *filters), 1.0)
    frames = out(ch)
    assert frames[0].type == mqttraw.SUBACK
    return ch, [(p.topic, p.payload, p.qos, p.retain, p.dup) for p in frames[1:]]


def test_retained_delivered_on_subscribe_with_retain_1(net):
    """[MQTT-3.3.1-5] stored with its QoS; [MQTT-3.3.1-6] sent on subscribe; [MQTT-3.3.1-8] RETAIN=1."""
    live = net.subscriber("live", ("r/#", 2))
    pub = net.connect("p")
    pub.receive_data(mqttraw.publish("r/1", b"v", qos=1, pid=1, retain=True), 1.0)
    assert publishes(live) == [("r/1", b"v", 1, False, False, 1)]  # live: RETAIN=0 [MQTT-3.3.1-9]
    _, got = subscribe_out(net, "new", ("r/#", 2))
    assert got == [("r/1", b"v", 1, True, False)]
    _, got = subscribe_out(net, "low", ("r/+", 0))
    assert got == [("r/1", b"v", 0, True, False)]


def test_retained_sent_again_on_resubscribe(net):
    """[MQTT-3.8.4-3] retained messages are re-sent for a replaced subscription."""
    pub = net.connect("p")
    pub.receive_data(mqttraw.publish("r", b"v", retain=True), 1.0)
    ch, got = subscribe_out(net, "s", ("r", 0))
    assert got == [("r", b"v", 0, True, False)]
    ch.receive_data(mqttraw.subscribe(2, ("r", 0)), 2.0)
    assert ch.data_to_send() == h("90 03 00 02 00") + h("31 04 00 01 72 76")


def test_empty_retained_payload_deletes(net):
    """[MQTT-3.3.1-10] delivered as normal, removes the retained message; [MQTT-3.3.1-11] not stored."""
    live = net.subscriber("live", ("r", 0))
    pub = net.connect("p")
    pub.receive_data(mqttraw.publish("r", b"v", retain=True), 1.0)
    pub.receive_data(mqttraw.publish("r", b"", retain=True), 2.0)
    assert publishes(live) == [("r", b"v", 0, False, False, None), ("r", b"", 0, False, False, None)]
    assert len(net.broker.retained) == 0
    _, got = subscribe_out(net, "new", ("r", 0))
    assert got == []


def test_retain_0_publish_leaves_the_retained_message(net):
    """[MQTT-3.3.1-12]"""
    pub = net.connect("p")
    pub.receive_data(mqttraw.publish("r", b"old", qos=1, pid=1, retain=True), 1.0)
    pub.receive_data(mqttraw.publish("r", b"new", qos=1, pid=2), 2.0)
    pub.receive_data(mqttraw.publish("r", b"", qos=0), 3.0)  # empty, but RETAIN=0
    _, got = subscribe_out(net, "s", ("r", 1))
    assert got == [("r", b"old", 1, True, False)]


def test_qos0_retained_replaces(net):
    """[MQTT-3.3.1-7]"""
    pub = net.connect("p")
    pub.receive_data(mqttraw.publish("r", b"one", qos=2, pid=1, retain=True), 1.0)
    pub.receive_data(mqttraw.publish("r", b"two", qos=0, retain=True), 2.0)
    _, got = subscribe_out(net, "s", ("#", 2))
    assert got == [("r", b"two", 0, True, False)]


def test_retained_dollar_topics_not_matched_by_leading_wildcards(net):
    """[MQTT-4.7.2-1] (a $-topic retained by the node itself, e.g. $SYS)."""
    net.broker.set_retained(Message("$SYS/x", b"sys", 0, True))
    pub = net.connect("p")
    pub.receive_data(mqttraw.publish("a", b"v", retain=True), 1.0)
    _, got = subscribe_out(net, "s", ("#", 0), ("+", 0))
    assert got == [("a", b"v", 0, True, False), ("a", b"v", 0, True, False)]
    _, got = subscribe_out(net, "t", ("$SYS/#", 0))
    assert got == [("$SYS/x", b"sys", 0, True, False)]


def test_retained_filtered_by_acl():
    """Subscribing is granted on r/#, but only r/open may be read."""
    acl = Acl.parse("topic subscribe r/#\ntopic read r/open\ntopic write r/#\n")
    net = Net(auth=Auth(acl=acl))
    pub = net.connect("p")
    pub.receive_data(mqttraw.publish("r/open", b"1", retain=True) + mqttraw.publish("r/secret", b"2", retain=True), 1.0)
    assert len(net.broker.retained) == 2
    _, got = subscribe_out(net, "s", ("r/#", 0))
    assert got == [("r/open", b"1", 0, True, False)]


def test_acl_deny_overlapping_a_filter_grants_it_and_filters_the_denied_topics_at_delivery():
    """Mosquitto's semantics (issue 22): with ``readwrite r/#`` and ``deny r/secret``, a
    subscription to ``r/#`` is granted and r/secret is never delivered through it; a filter
    entirely inside the denied topics is refused (0x80)."""
    acl = Acl.parse("topic readwrite r/#\ntopic deny r/secret\n")
    net = Net(auth=Auth(acl=acl))
    ch = net.connect("c")
    ch.receive_data(mqttraw.subscribe(1, ("r/#", 0), ("r/open", 0), ("r/secret", 0)), 1.0)
    assert ch.data_to_send() == h("90 05 00 01 00 00 80")
    pub = net.connect("p")
    pub.receive_data(mqttraw.publish("r/secret", b"no") + mqttraw.publish("r/open", b"yes"), 2.0)
    got = [(p.topic, p.payload) for p in out(ch)]
    assert got == [("r/open", b"yes")]  # one copy (two filters match it), r/secret none


# --------------------------------------------------------------------------- group commit


def durable_offline_subscriber(net, journal, client_id="d", topic_filter="g/#"):
    ch = net.connect(client_id, clean=False)
    ch.receive_data(mqttraw.subscribe(1, (topic_filter, 1)), 0.0)
    number, _ = journal.take()
    net.committed(number)
    assert out(ch)[0].type == mqttraw.SUBACK
    ch.receive_data(mqttraw.DISCONNECT_BYTES, 0.0)
    number, _ = journal.take()
    net.committed(number)


def test_puback_waits_for_the_commit_of_an_offline_durable_delivery():
    journal = Journal()
    net = Net(journal=journal)
    durable_offline_subscriber(net, journal)
    pub = net.connect("p")
    pub.receive_data(mqttraw.publish("g/x", b"keep", qos=1, pid=1), 1.0)
    assert pub.data_to_send() == b""
    assert pub in net.broker.held_ack_channels
    number, ops = journal.take()
    assert [op[0] for op in ops] == ["message_put"]
    net.committed(number - 1)  # an older batch: still held
    assert pub.data_to_send() == b""
    net.committed(number)
    assert pub.data_to_send() == h("40 02 00 01")
    assert journal.committed == number


def test_acks_stay_in_order_behind_a_held_one():
    """[MQTT-4.6.0-2] PUBACKs in the order of the PUBLISHes."""
    journal = Journal()
    net = Net(journal=journal)
    durable_offline_subscriber(net, journal)
    pub = net.connect("p")
    pub.receive_data(
        mqttraw.publish("g/x", b"1", qos=1, pid=1)
        + mqttraw.publish("elsewhere", b"2", qos=1, pid=2)
        + mqttraw.publish("g/x", b"3", qos=2, pid=3)
        + mqttraw.pubrel(3)
        + mqttraw.publish("elsewhere", b"4", qos=1, pid=4),
        1.0,
    )
    assert pub.data_to_send() == b""
    number, _ = journal.take()
    net.committed(number)
    assert pub.data_to_send() == h("40 02 00 01 40 02 00 02 50 02 00 03 70 02 00 03 40 02 00 04")


def test_puback_immediate_when_nothing_becomes_durable():
    journal = Journal()
    net = Net(journal=journal)
    sub = net.subscriber("s", ("g/#", 1))  # a clean session: nothing to store
    journal.take()
    pub = net.connect("p")
    pub.receive_data(mqttraw.publish("g/x", b"1", qos=1, pid=1), 1.0)
    assert pub.data_to_send() == h("40 02 00 01")
    assert len(journal) == 0
    assert publishes(sub) == [("g/x", b"1", 1, False, False, 1)]


def test_retained_publish_waits_for_commit():
    journal = Journal()
    net = Net(journal=journal)
    pub = net.connect("p")
    pub.receive_data(mqttraw.publish("r", b"v", qos=1, pid=1, retain=True), 1.0)
    assert pub.data_to_send() == b""
    number, ops = journal.take()
    assert ops == [("retained_put", "r", b"v", 1, "n1", ops[0][5], "p", ops[0][7], None, None)]
    net.committed(number)
    assert pub.data_to_send() == h("40 02 00 01")


def test_suback_of_a_durable_session_waits_for_commit():
    journal = Journal()
    net = Net(journal=journal)
    ch = net.connect("d", clean=False)
    journal.take()
    ch.receive_data(mqttraw.subscribe(4, ("a", 1)), 1.0)
    assert ch.data_to_send() == b""
    number, ops = journal.take()
    assert ops == [("session_put", "d", {"a": 1}, None)]
    net.committed(number)
    assert ch.data_to_send() == h("90 03 00 04 01")


def commit(net, journal):
    number, _ = journal.take()
    net.committed(number)


def test_pubrec_of_a_durable_publisher_waits_for_commit():
    """The id awaiting PUBREL must be durable before PUBREC, or a restart would deliver it twice."""
    journal = Journal()
    net = Net(journal=journal)
    pub = net.connect("p", clean=False)
    commit(net, journal)
    pub.receive_data(mqttraw.publish("nobody", b"x", qos=2, pid=3), 1.0)
    assert pub.data_to_send() == b""
    number, ops = journal.take()
    assert ops == [("rel_put", "p", 3)]
    net.committed(number)
    assert pub.data_to_send() == h("50 02 00 03")


def test_pubcomp_of_a_durable_publisher_waits_for_commit():
    journal = Journal()
    net = Net(journal=journal)
    pub = net.connect("p", clean=False)
    commit(net, journal)
    pub.receive_data(mqttraw.publish("nobody", b"x", qos=2, pid=3), 1.0)
    commit(net, journal)
    assert pub.data_to_send() == h("50 02 00 03")
    pub.receive_data(mqttraw.pubrel(3), 2.0)
    assert pub.data_to_send() == b""
    number, ops = journal.take()
    assert ops == [("rel_remove", "p", 3)]
    net.committed(number)
    assert pub.data_to_send() == h("70 02 00 03")


def test_pubrel_to_a_durable_subscriber_waits_for_commit():
    journal = Journal()
    net = Net(journal=journal)
    sub = net.connect("d", clean=False)
    sub.receive_data(mqttraw.subscribe(1, ("a", 2)), 0.0)
    commit(net, journal)
    assert out(sub)[0].type == mqttraw.SUBACK
    pub = net.connect("p")
    pub.receive_data(mqttraw.publish("a", b"x", qos=2, pid=1), 1.0)
    commit(net, journal)
    assert publishes(sub) == [("a", b"x", 2, False, False, 1)]
    sub.receive_data(mqttraw.pubrec(1), 2.0)
    assert sub.data_to_send() == b""
    number, ops = journal.take()
    assert [op[0] for op in ops] == ["message_put"]
    net.committed(number)
    assert sub.data_to_send() == h("62 02 00 01")


# ------------------------------------------------------------------ the six places an ack waits for the journal


def settle(net) -> None:
    """The store committed everything recorded so far; outputs are drained."""
    journal = net.broker.journal
    if len(journal):
        number, _ = journal.take()
        net.committed(number)


def subscribed(net, client_id, topic_filter, qos, clean=True):
    """A connected client with one subscription; its SUBACK (committed if need be) is consumed."""
    ch = net.connect(client_id, clean=clean)
    ch.receive_data(mqttraw.subscribe(1, (topic_filter, qos)), 0.0)
    settle(net)
    assert out(ch)[0].type == mqttraw.SUBACK
    return ch


def _connect(client_id, clean, before=None):
    """A CONNECT of ``client_id``; ``before``: "persistent" when a stored session exists."""

    def setup(net):
        if before == "persistent":
            old = net.connect(client_id, clean=False)
            old.receive_data(mqttraw.DISCONNECT_BYTES, 0.0)
        ch = net.channel(1.0)
        present = 1 if before == "persistent" and not clean else 0
        return ch, lambda: ch.receive_data(mqttraw.connect(client_id, clean=clean), 1.0), bytes((0x20, 2, present, 0))

    return setup


def _pubrec(clean):
    def setup(net):
        sub = subscribed(net, "s", "a", 2, clean)
        pub = net.connect("p")
        pub.receive_data(mqttraw.publish("a", b"x", qos=2, pid=1), 0.5)
        settle(net)
        assert publishes(sub) == [("a", b"x", 2, False, False, 1)]
        return sub, lambda: sub.receive_data(mqttraw.pubrec(1), 1.0), h("62 02 00 01")

    return setup


def _subscribe(clean):
    def setup(net):
        ch = net.connect("s", clean=clean)
        return ch, lambda: ch.receive_data(mqttraw.subscribe(4, ("a", 1)), 1.0), h("90 03 00 04 01")

    return setup


def _unsubscribe(clean, topic_filter):
    def setup(net):
        ch = subscribed(net, "s", "a", 1, clean)
        return ch, lambda: ch.receive_data(mqttraw.unsubscribe(5, topic_filter), 1.0), h("b0 02 00 05")

    return setup


def _publish(retain):
    def setup(net):
        ch = net.connect("p")
        return (
            ch,
            lambda: ch.receive_data(mqttraw.publish("r", b"v", qos=1, pid=6, retain=retain), 1.0),
            h("40 02 00 06"),
        )

    return setup


# (site, setup, whether the journal writes: the ack then waits for its batch, else goes at once)
JOURNAL_SITES = [
    ("connect-new-persistent [MQTT-3.1.2-4]", _connect("d", clean=False), True),
    ("connect-resumes-persistent [MQTT-3.2.2-2]", _connect("d", clean=False, before="persistent"), False),
    ("connect-clean-discards-persistent [MQTT-3.1.2-6]", _connect("d", clean=True, before="persistent"), True),
    ("connect-clean [MQTT-3.1.2-6]", _connect("d", clean=True), False),
    ("pubrec-durable [MQTT-4.3.3-1]", _pubrec(clean=False), True),
    ("pubrec-clean [MQTT-4.3.3-1]", _pubrec(clean=True), False),
    ("subscribe-durable [MQTT-3.8.4-1]", _subscribe(clean=False), True),
    ("subscribe-clean [MQTT-3.8.4-1]", _subscribe(clean=True), False),
    ("unsubscribe-durable [MQTT-3.10.4-4]", _unsubscribe(False, "a"), True),
    ("unsubscribe-durable-nothing-matched [MQTT-3.10.4-5]", _unsubscribe(False, "b"), False),
    ("unsubscribe-clean [MQTT-3.10.4-4]", _unsubscribe(True, "a"), False),
    ("publish-retained [MQTT-3.3.1-5]", _publish(retain=True), True),
    ("publish-not-retained", _publish(retain=False), False),
]


@pytest.mark.parametrize("persistent", [True, False], ids=["journal", "null-journal"])
@pytest.mark.parametrize("site, setup, writes", JOURNAL_SITES, ids=[s[0] for s in JOURNAL_SITES])
def test_an_ack_waits_exactly_when_the_journal_wrote(site, setup, writes, persistent):
    net = Net(journal=Journal() if persistent else None)
    journal = net.broker.journal
    ch, action, ack = setup(net)
    settle(net)
    out(ch)
    before = journal.writes
    action()
    assert (journal.writes != before) is (writes and persistent)
    if writes and persistent:
        assert ch.data_to_send() == b""  # held for the store
        assert ch in net.broker.held_ack_channels
        settle(net)
    assert ch.data_to_send() == ack
    assert not net.broker.held_ack_channels


@pytest.mark.parametrize("persistent", [True, False], ids=["journal", "null-journal"])
def test_deliver_remote_returns_the_batch_when_a_persistent_session_queued_it(persistent):
    """A message from another node: its end-to-end ack waits for what it queued (mesh custody)."""
    net = Net(journal=Journal() if persistent else None)
    journal = net.broker.journal
    durable = subscribed(net, "d", "a", 1, clean=False)
    durable.receive_data(mqttraw.DISCONNECT_BYTES, 0.0)  # offline: it queues [MQTT-3.1.2-5]
    subscribed(net, "c", "b", 1)
    settle(net)
    remote = Message("a", b"x", 1, False, "n2", 5, "p", 1.0)
    assert net.broker.deliver_remote(remote) == (journal.batch if persistent else 0, ())
    assert len(net.broker.sessions["d"].queue) == 1
    settle(net)
    assert net.broker.deliver_remote(Message("b", b"y", 1, False, "n2", 6, "p", 1.0)) == (0, ())  # a clean session
    assert net.broker.deliver_remote(Message("z", b"z", 1, False, "n2", 7, "p", 1.0)) == (0, ())  # nobody


# --------------------------------------------------------------------------- replicated sessions
# A persistent session of a mesh node (mesh/cluster/replica.py) counts its settlements (version); the
# Channel holds each frame that depends on one until every other holder has it (safe_version,
# raised by mesh/cluster/confirm.py on their sess.ack). Here nothing raises it but the test.


def replicated_net():
    from mqttmesh.broker import BrokerPorts
    from mqttmesh.flow import Congestion
    from mqttmesh.mesh.cluster.replica_sessions import ReplicaSessions
    from mqttmesh.store import NULL_JOURNAL

    settled: list[tuple[str, str, int]] = []
    agreed: list = []  # ("in" settlements' message ids and messages)
    congestion = Congestion()

    def hook(session, key, state, pid, msg=None):
        settled.append((session.client_id, state, pid))
        if msg is not None:
            agreed.append((key, msg))

    sessions = ReplicaSessions(Limits(), NULL_JOURNAL, congestion, hook)
    net = Net(ports=BrokerPorts(sessions=sessions, congestion=congestion))
    net.agreed = agreed
    return net, settled


def replicated(net, channel, up_to: int) -> None:
    """The other holders now have the session's settlements up to ``up_to``."""
    channel.session.safe_version = up_to
    channel.release_acks(net.broker.journal.committed, 0.0)


def test_pubrec_and_pubcomp_of_a_replicated_session_wait_for_its_other_holders():
    """Issue 15: a re-send of the PUBLISH to another node after this one died must find the id
    there (no second delivery), and a PUBLISH reusing the id after PUBCOMP must not find it
    (no loss): PUBREC waits for "in", PUBCOMP for "free" [MQTT-4.3.3-2]."""
    net, settled = replicated_net()
    pub = net.connect("p", clean=False)
    pub.receive_data(mqttraw.publish("nobody", b"x", qos=2, pid=3), 1.0)
    assert pub.data_to_send() == b""
    assert settled == [("p", "in", 3)] and pub.session.version == 1
    replicated(net, pub, 1)
    assert pub.data_to_send() == h("50 02 00 03")
    pub.receive_data(mqttraw.pubrel(3), 2.0)
    pub.receive_data(mqttraw.packet(0xC0), 2.0)  # PINGREQ
    assert pub.data_to_send() == b""  # (the PINGRESP keeps its place behind the PUBCOMP)
    assert settled[-1] == ("p", "free", 3)
    replicated(net, pub, 2)
    assert pub.data_to_send() == h("70 02 00 03 d0 00")


def test_a_qos2_publish_to_a_replicated_session_waits_for_its_packet_id_to_be_replicated():
    """Issue 15: the other holders know the packet id before the client has the PUBLISH, so
    a holder taking over re-sends it with that id (DUP=1) [MQTT-4.3.3-1]; the PUBREL waits
    for "rel", so that one never re-sends a PUBLISH the client completed."""
    net, settled = replicated_net()
    sub = net.subscriber("s", ("a", 2), clean=False)
    pub = net.connect("p")
    pub.receive_data(mqttraw.publish("a", b"x", qos=2, pid=1), 1.0)
    pub.receive_data(mqttraw.publish("a", b"y", qos=1, pid=2), 1.0)
    assert publishes(sub) == []
    assert ("s", "sent", 1) in settled
    replicated(net, sub, sub.session.version)
    # the QoS 1 copy went out behind the QoS 2 one: a client sees them in publish order
    assert publishes(sub) == [("a", b"x", 2, False, False, 1), ("a", b"y", 1, False, False, 2)]
    sub.receive_data(mqttraw.pubrec(1), 2.0)
    assert sub.data_to_send() == b""
    assert settled[-1] == ("s", "rel", 1)
    replicated(net, sub, sub.session.version)
    assert sub.data_to_send() == h("62 02 00 01")


def test_a_persistent_publishers_qos2_message_is_routed_once_its_holders_have_it_with_its_id():
    """Issue 15: routed at once, a message whose node died before its holders had the id was
    published twice when the client re-sent it elsewhere; it now goes out only once the
    holders have it, with the id it is routed under, so the node the client moves to can
    route it again under that id (one delivery: the duplicate filters) [MQTT-4.3.3-2]."""
    net, settled = replicated_net()
    sub = net.subscriber("s", ("a", 2))
    pub = net.connect("p", clean=False)
    pub.receive_data(mqttraw.publish("a", b"x", qos=2, pid=7), 1.0)
    assert publishes(sub) == [] and pub.data_to_send() == b""
    assert settled == [("p", "in", 7)]
    [(key, msg)] = net.agreed
    assert key == (msg.origin, msg.seq) == ("n1", msg.seq) and (msg.topic, msg.payload, msg.qos) == ("a", b"x", 2)
    assert pub.session.inbound == {7: msg}
    replicated(net, pub, 1)
    assert publishes(sub) == [("a", b"x", 2, False, False, 1)]
    assert pub.data_to_send() == h("50 02 00 07")
    assert list(pub.session.routed_batch) == [key]  # (a copy names it routed: replica.py ``routed_ids``)
    # a re-send of it (DUP=1) is acknowledged, not routed again [MQTT-4.3.3-2]
    pub.receive_data(mqttraw.publish("a", b"x", qos=2, pid=7, dup=True), 2.0)
    assert pub.data_to_send() == h("50 02 00 07") and publishes(sub) == []
    pub.receive_data(mqttraw.pubrel(7), 2.0)
    replicated(net, pub, 2)
    assert pub.data_to_send() == h("70 02 00 07")
    assert pub.session.inbound == {} and pub.session.routed_here == set() and pub.session.routed_batch == {}


def test_what_a_client_publishes_behind_a_waiting_qos2_message_waits_too_in_order():
    """[MQTT-4.6.0-6]: each topic is ordered; a QoS 0 or 1 message the same client publishes
    while its QoS 2 message waits for the holders is routed after it, and acknowledged after."""
    net, settled = replicated_net()
    sub = net.subscriber("s", ("a", 2))
    pub = net.connect("p", clean=False)
    pub.receive_data(
        mqttraw.publish("a", b"2", qos=2, pid=1)
        + mqttraw.publish("a", b"1", qos=1, pid=2)
        + mqttraw.publish("a", b"0"),
        1.0,
    )
    assert publishes(sub) == [] and pub.data_to_send() == b""
    replicated(net, pub, 1)
    assert [(t, p) for t, p, *_ in publishes(sub)] == [("a", b"2"), ("a", b"1"), ("a", b"0")]
    assert pub.data_to_send() == h("50 02 00 01 40 02 00 02")
    pub.receive_data(mqttraw.publish("a", b"later", qos=1, pid=3), 2.0)  # nothing waits now
    assert [p for _, p, *_ in publishes(sub)] == [b"later"] and pub.data_to_send() == h("40 02 00 03")


def test_a_qos2_message_left_waiting_by_its_connection_is_routed_when_the_client_is_back():
    """The client left before the holders answered: the message was not routed, its id awaits
    PUBREL. When the client is back here the node routes it (once); the client's re-send is
    only acknowledged."""
    net, settled = replicated_net()
    sub = net.subscriber("s", ("a", 2))
    pub = net.connect("p", clean=False)
    pub.receive_data(mqttraw.publish("a", b"x", qos=2, pid=4), 1.0)
    pub.connection_lost(1.5)
    replicated(net, pub, 1)  # (the holders answered meanwhile)
    assert publishes(sub) == []  # not from a closed connection
    again = net.connect("p", now=2.0, clean=False, expect=h("20 02 01 00"))
    assert publishes(sub) == [("a", b"x", 2, False, False, 1)]
    again.receive_data(mqttraw.publish("a", b"x", qos=2, pid=4, dup=True), 2.5)
    assert out(again)[-1].body == b"\x00\x04" and publishes(sub) == []
    again.connection_lost(3.0)
    net.connect("p", now=4.0, clean=False, expect=h("20 02 01 00"))
    assert publishes(sub) == []  # routed here already: not again


def test_a_clean_session_of_a_mesh_node_waits_for_nothing():
    net, settled = replicated_net()
    sub = net.subscriber("s", ("a", 2))
    pub = net.connect("p")
    pub.receive_data(mqttraw.publish("a", b"x", qos=2, pid=1), 1.0)
    assert pub.data_to_send() == h("50 02 00 01")
    assert publishes(sub) == [("a", b"x", 2, False, False, 1)]
    assert settled == []


def test_the_channels_a_commit_releases_come_in_the_order_they_began_to_wait():
    """Released in the order they held (not a set's, which is their addresses': two runs of one
    simulated scenario differed by what the process had allocated before, docs/simulation.md
    finding 39)."""
    journal = Journal()
    net = Net(journal=journal)
    durable_offline_subscriber(net, journal)
    pubs = {name: net.connect(name) for name in ("p1", "p2", "p3")}
    for i, name in enumerate(("p3", "p1", "p2"), 1):
        pubs[name].receive_data(mqttraw.publish("g/x", b"keep", qos=1, pid=i), 1.0)
    number, _ = journal.take()
    assert net.broker.committed(number) == [pubs["p3"], pubs["p1"], pubs["p2"]]
    assert net.broker.committed(number) == []
