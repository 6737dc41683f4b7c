"""mqttmesh.channel.Channel serving MQTT 5 clients (channel5.py), beside 3.1.1 ones.

Client bytes come from tests/support/mqttraw5.py (independent of the codec); the Channel's
answers are read with the codec's decoder in MQTT 5 mode and compared field by field, and
the short ones byte for byte. Rule ids are MQTT 5.0's unless a test says 3.1.1.
"""

from __future__ import annotations

import pytest

from mqttmesh import properties as P
from mqttmesh.auth import Acl, Auth
from mqttmesh.channel import CLOSED, CONNECTED
from mqttmesh.codec import ConnAck, Decoder, Disconnect, Publish, SubAck, UnsubAck
from mqttmesh.store import Journal
from support import mqttraw
from support import mqttraw5 as r5
from support.frames import Net
from support.mqttraw import s, varint


def answers(ch) -> list:
    d = Decoder(version=5)
    d.feed(ch.data_to_send())
    return list(d.packets())


def connect5(net: Net, client_id: str = "c", now: float = 0.0, **kw):
    """A channel whose MQTT 5 CONNECT was accepted; (channel, CONNACK)."""
    ch = net.channel(now)
    ch.receive_data(r5.connect(client_id, **kw), now)
    got = answers(ch)
    if not got and net.broker.journal is not None and len(net.broker.journal):
        net.committed(net.broker.journal.batch)
        got = answers(ch)
    assert got and isinstance(got[0], ConnAck) and got[0].return_code == 0, got
    assert ch.state == CONNECTED
    return ch, got[0]


def subscribe5(ch, *filters, pid=1, sub_id=None, now=0.0) -> SubAck:
    props = r5.props((P.SUBSCRIPTION_ID, varint(sub_id))) if sub_id else b"\x00"
    ch.receive_data(r5.subscribe(pid, *filters, properties=props), now)
    journal = ch.broker.journal
    if journal is not None and len(journal):
        for channel in ch.broker.committed(journal.batch):  # (the SUBACK waits for the store)
            channel.release_acks(journal.batch, 0.0)
    got = answers(ch)
    assert isinstance(got[0], SubAck), got
    return got[0]


@pytest.fixture
def net():
    return Net()


# --------------------------------------------------------------------------- CONNECT


def test_connack_tells_the_client_what_the_node_holds_it_to(net):
    """[MQTT-3.2.2-2]-style answer: 0x00 with the node's Receive Maximum, Maximum Packet
    Size, Topic Alias Maximum, and Shared Subscription Available 1 (0 where they are not
    taken: test_shared_subscriptions_off_are_refused_with_0x9e)."""
    ch, ack = connect5(net)
    assert ack.session_present is False
    assert ack.properties[P.RECEIVE_MAXIMUM] == net.broker.settings.receive_maximum
    assert ack.properties[P.MAXIMUM_PACKET_SIZE] == net.broker.settings.max_packet_size
    assert ack.properties[P.TOPIC_ALIAS_MAXIMUM] == net.broker.settings.topic_alias_maximum
    assert ack.properties[P.SHARED_SUB_AVAILABLE] == 1
    assert P.ASSIGNED_CLIENT_ID not in ack.properties and P.SERVER_KEEP_ALIVE not in ack.properties


def test_an_empty_client_id_is_assigned_one_and_told_it(net):
    """[MQTT-3.1.3-6] [MQTT-3.1.3-7]: even with Clean Start 0 in MQTT 5."""
    ch, ack = connect5(net, "", clean=False, properties=r5.props((P.SESSION_EXPIRY, r5.u32(60))))
    assigned = ack.properties[P.ASSIGNED_CLIENT_ID]
    assert assigned and ch.client_id == assigned
    assert assigned in net.broker.sessions


def test_server_keep_alive_caps_the_clients():
    """[MQTT-3.2.2-21] [MQTT-3.2.2-22]: mqtt.max_keepalive; a client asking for none gets it too."""
    net = Net(max_keepalive=30)
    ch, ack = connect5(net, keepalive=600)
    assert ack.properties[P.SERVER_KEEP_ALIVE] == 30 and ch.keepalive == 30
    ch, ack = connect5(net, "c2", keepalive=0)
    assert ack.properties[P.SERVER_KEEP_ALIVE] == 30
    ch, ack = connect5(net, "c3", keepalive=20)
    assert P.SERVER_KEEP_ALIVE not in ack.properties and ch.keepalive == 20


def test_a_311_client_over_the_largest_keep_alive_is_refused():
    """3.1.1 has no Server Keep Alive: CONNACK 0x02, as Mosquitto answers."""
    net = Net(max_keepalive=30)
    ch = net.channel()
    ch.receive_data(mqttraw.connect("c", keepalive=600), 0.0)
    assert ch.data_to_send() == bytes.fromhex("20020002")
    assert ch.state == CLOSED


def test_an_authentication_method_the_node_does_not_serve_gets_0x8c(net):
    ch = net.channel()
    ch.receive_data(r5.connect("c", properties=r5.props((P.AUTH_METHOD, s("SCRAM-SHA-256")))), 0.0)
    assert answers(ch) == [ConnAck(False, 0x8C)]
    assert ch.state == CLOSED


def test_a_refusal_is_answered_with_mqtt5s_code():
    """[MQTT-3.2.2-6] [MQTT-3.2.2-7]: an anonymous login where none is allowed gets 0x87
    (Not authorized; 3.1.1's 0x05), then the close."""
    net = Net(auth=Auth(allow_anonymous=False))
    ch = net.channel()
    ch.receive_data(r5.connect("c"), 0.0)
    assert answers(ch) == [ConnAck(False, 0x87)]
    assert ch.state == CLOSED


def test_a_malformed_packet_after_connack_gets_disconnect_0x81_then_the_close(net):
    """[MQTT-4.13.1-1]: DISCONNECT with the reason code, then the connection closes."""
    ch, _ = connect5(net)
    ch.receive_data(mqttraw.packet(0xE1, b""), 1.0)  # DISCONNECT with a reserved flag [MQTT-3.14.1-1]
    assert answers(ch) == [Disconnect(0x81)]
    assert ch.state == CLOSED


def test_auth_after_connect_without_a_method_is_a_protocol_error(net):
    ch, _ = connect5(net)
    ch.receive_data(r5.auth(0x19), 1.0)
    assert answers(ch) == [Disconnect(0x82)]
    assert ch.state == CLOSED


# --------------------------------------------------------------------------- sessions


def test_clean_start_and_session_expiry_are_two_things():
    """Clean Start 0 resumes the session held [MQTT-3.1.2-5]; a Session Expiry Interval of 0
    ends it with the connection; Clean Start 1 with an interval starts afresh and keeps it."""
    net = Net(journal=Journal())
    keep = r5.props((P.SESSION_EXPIRY, r5.u32(3600)))
    ch, ack = connect5(net, "p", clean=True, properties=keep)
    assert ack.session_present is False
    subscribe5(ch, ("t/#", 1))
    ch.receive_data(r5.disconnect(), 1.0)
    assert "p" in net.broker.sessions  # kept: its interval is not 0
    ch, ack = connect5(net, "p", clean=False, now=2.0)  # resumed, and now ends with this connection
    assert ack.session_present is True
    assert "t/#" in net.broker.sessions["p"].subscriptions
    ch.receive_data(r5.disconnect(), 3.0)
    assert "p" not in net.broker.sessions
    ch, ack = connect5(net, "p", clean=False, now=4.0, properties=keep)
    assert ack.session_present is False  # [MQTT-3.1.2-6]
    assert P.SESSION_EXPIRY not in ack.properties  # (served as asked: CONNACK says nothing)


def test_a_session_ends_its_expiry_interval_after_the_connection_unless_resumed():
    """[MQTT-3.1.2-23] [MQTT-4.1.0-2]: kept that long after the connection closed, then ended (the node's
    sweep, SessionTable.expire_sessions); a connection before that resumes it and the time
    starts again when it ends; a DISCONNECT may change the interval (3.14.2.2.2); a
    durable session's end is in the store."""
    net = Net(journal=Journal())
    keep = r5.props((P.SESSION_EXPIRY, r5.u32(10)))
    ch, _ = connect5(net, "p", clean=False, properties=keep)
    subscribe5(ch, ("t/#", 1))
    ch.connection_lost(1.0)
    table = net.broker.table
    assert table.expire_sessions(10.9) == 0 and "p" in net.broker.sessions
    ch, ack = connect5(net, "p", clean=False, now=5.0, properties=keep)
    assert ack.session_present is True and net.broker.sessions["p"].expires_at is None
    assert table.expire_sessions(100.0) == 0  # (connected: it does not expire)
    ch.receive_data(r5.disconnect(0, r5.props((P.SESSION_EXPIRY, r5.u32(30)))), 6.0)
    assert net.broker.sessions["p"].expires_at == 36.0
    assert table.expire_sessions(35.9) == 0
    assert table.expire_sessions(36.0) == 1 and "p" not in net.broker.sessions
    assert table.ended.sessions_expired == 1
    ch, ack = connect5(net, "p", clean=False, now=40.0, properties=keep)
    assert ack.session_present is False


def test_a_takeover_tells_the_first_connection_0x8e(net):
    """[MQTT-3.1.4-3]-style takeover: the old connection gets DISCONNECT 0x8E (Session taken over)."""
    first, _ = connect5(net, "dup")
    second, _ = connect5(net, "dup", now=1.0)
    assert answers(first) == [Disconnect(0x8E)]
    assert first.state == CLOSED and second.state == CONNECTED


def test_disconnect_0x04_publishes_the_will_and_0x00_drops_it(net):
    """[MQTT-3.14.4-3]; 0x04 is Disconnect with Will Message (3.14.2.1)."""
    watcher, _ = connect5(net, "w")
    subscribe5(watcher, ("will/#", 0))
    will_props = r5.props((P.CONTENT_TYPE, s("text/plain")), (P.USER_PROPERTY, r5.pair("k", "v")))
    a, _ = connect5(net, "a", will=("will/a", b"gone", 0, False, will_props))
    a.receive_data(r5.disconnect(0x04), 1.0)
    got = answers(watcher)
    assert got == [Publish("will/a", b"gone", properties={P.CONTENT_TYPE: "text/plain", P.USER_PROPERTY: [("k", "v")]})]
    b, _ = connect5(net, "b", will=("will/b", b"gone", 0, False, b"\x00"))
    b.receive_data(r5.disconnect(0x00), 2.0)
    assert answers(watcher) == []


def test_disconnect_may_not_give_an_interval_to_a_session_that_had_none(net):
    """3.14.2.2.2: a Protocol Error when the CONNECT's interval was 0."""
    ch, _ = connect5(net)
    ch.receive_data(r5.disconnect(0x00, r5.props((P.SESSION_EXPIRY, r5.u32(10)))), 1.0)
    assert answers(ch) == [Disconnect(0x82)]


# --------------------------------------------------------------------------- messages


def test_properties_reach_mqtt5_subscribers_unaltered_and_311_subscribers_not_at_all(net):
    """[MQTT-3.3.2-4] [MQTT-3.3.2-15] [MQTT-3.3.2-16] [MQTT-3.3.2-17] [MQTT-3.3.2-18]
    [MQTT-3.3.2-20]; a 3.1.1 subscriber gets the 3.1.1 PUBLISH, without them."""
    sub5, _ = connect5(net, "s5")
    subscribe5(sub5, ("a/#", 1))
    sub4 = net.subscriber("s4", ("a/#", 1))
    pub, _ = connect5(net, "p")
    props = r5.props(
        (P.PAYLOAD_FORMAT, b"\x01"),
        (P.CONTENT_TYPE, s("application/json")),
        (P.RESPONSE_TOPIC, s("reply/p")),
        (P.CORRELATION_DATA, s(b"\x00\x07")),
        (P.USER_PROPERTY, r5.pair("z", "1")),
        (P.USER_PROPERTY, r5.pair("a", "2")),
        (P.USER_PROPERTY, r5.pair("z", "3")),
    )
    pub.receive_data(r5.publish("a/b", b"{}", qos=1, pid=5, properties=props), 1.0)
    assert pub.data_to_send() == bytes.fromhex("40020005")  # PUBACK, the short form
    (got,) = answers(sub5)
    assert got.topic == "a/b" and got.payload == b"{}" and got.qos == 1
    assert got.properties == {
        P.PAYLOAD_FORMAT: 1,
        P.CONTENT_TYPE: "application/json",
        P.RESPONSE_TOPIC: "reply/p",
        P.CORRELATION_DATA: b"\x00\x07",
        P.USER_PROPERTY: [("z", "1"), ("a", "2"), ("z", "3")],
    }
    raw = sub4.data_to_send()
    assert raw == mqttraw.publish("a/b", b"{}", qos=1, pid=1)  # 3.1.1, no properties


def test_a_311_publish_reaches_an_mqtt5_subscriber_with_no_properties(net):
    sub5, _ = connect5(net, "s5")
    subscribe5(sub5, ("t", 0))
    pub = net.connect("p4")
    pub.receive_data(mqttraw.publish("t", b"x"), 1.0)
    assert answers(sub5) == [Publish("t", b"x")]


def test_topic_aliases_from_the_client(net):
    """[MQTT-3.3.2-12]: set with a topic, used without one; this connection only [MQTT-3.3.2-7]."""
    sub, _ = connect5(net, "s")
    subscribe5(sub, ("long/topic/name", 0))
    pub, _ = connect5(net, "p")
    alias = r5.props((P.TOPIC_ALIAS, r5.u16(3)))
    pub.receive_data(r5.publish("long/topic/name", b"1", properties=alias), 1.0)
    pub.receive_data(r5.publish("", b"2", properties=alias), 1.0)
    assert [(p.topic, p.payload) for p in answers(sub)] == [("long/topic/name", b"1"), ("long/topic/name", b"2")]
    assert all(p.properties is None or P.TOPIC_ALIAS not in p.properties for p in answers(sub))


@pytest.mark.parametrize(
    "raw, reason",
    [
        pytest.param(r5.publish("t", properties=r5.props((P.TOPIC_ALIAS, r5.u16(65)))), 0x94, id="over-maximum"),
        pytest.param(r5.publish("t", properties=r5.props((P.TOPIC_ALIAS, r5.u16(0)))), 0x94, id="zero"),
        pytest.param(r5.publish("", properties=r5.props((P.TOPIC_ALIAS, r5.u16(1)))), 0x82, id="never-set"),
        pytest.param(r5.publish("t", properties=r5.props((P.SUBSCRIPTION_ID, varint(1)))), 0x82, id="subscription-id"),
    ],
)
def test_a_bad_topic_alias_or_a_subscription_identifier_from_a_client_disconnects_it(net, raw, reason):
    """[MQTT-3.3.2-8] [MQTT-3.3.2-12] (0x94 Topic Alias invalid); [MQTT-3.3.4-6]."""
    ch, _ = connect5(net)
    ch.receive_data(raw, 1.0)
    assert answers(ch) == [Disconnect(reason)]
    assert ch.state == CLOSED


def test_topic_aliases_to_the_client_when_it_takes_them(net):
    """[MQTT-3.3.2-11]: within the client's Topic Alias Maximum; the first use carries the topic."""
    sub, _ = connect5(net, "s", properties=r5.props((P.TOPIC_ALIAS_MAXIMUM, r5.u16(1))))
    subscribe5(sub, ("#", 0))
    pub = net.connect("p4")
    for topic in ("sensors/one", "sensors/one", "sensors/two", "sensors/one"):
        pub.receive_data(mqttraw.publish(topic, b"x"), 1.0)
    got = answers(sub)
    assert [(p.topic, (p.properties or {}).get(P.TOPIC_ALIAS)) for p in got] == [
        ("sensors/one", 1),
        ("", 1),
        ("sensors/two", None),  # (the one alias is taken)
        ("", 1),
    ]


def test_no_topic_alias_to_a_client_that_did_not_ask_for_them(net):
    """[MQTT-3.1.2-27]"""
    sub, _ = connect5(net, "s")
    subscribe5(sub, ("#", 0))
    pub = net.connect("p4")
    pub.receive_data(mqttraw.publish("sensors/one", b"x") * 2, 1.0)
    assert [p.topic for p in answers(sub)] == ["sensors/one", "sensors/one"]


def test_a_message_larger_than_the_clients_maximum_is_not_sent_and_is_counted(net):
    """[MQTT-3.1.2-24]/[MQTT-3.1.2-25]: the server does not send it; the rest go on."""
    sub, _ = connect5(net, "s", properties=r5.props((P.MAXIMUM_PACKET_SIZE, r5.u32(64))))
    subscribe5(sub, ("t", 1))
    pub = net.connect("p4")
    pub.receive_data(mqttraw.publish("t", b"x" * 100, qos=1, pid=1) + mqttraw.publish("t", b"small", qos=1, pid=2), 1.0)
    got = answers(sub)
    assert [p.payload for p in got] == [b"small"]
    assert got[0].packet_id == 1  # (no id was spent on the one not sent)
    assert net.broker.stats.too_large == 1


def test_receive_maximum_bounds_what_is_in_flight_to_the_client(net):
    """[MQTT-3.3.4-9]: no more QoS 1/2 PUBLISHes unacknowledged than the client's Receive Maximum."""
    sub, _ = connect5(net, "s", properties=r5.props((P.RECEIVE_MAXIMUM, r5.u16(2))))
    subscribe5(sub, ("t", 1))
    pub = net.connect("p4")
    for i in range(5):
        pub.receive_data(mqttraw.publish("t", bytes([i]), qos=1, pid=i + 1), 1.0)
    got = answers(sub)
    assert [p.payload for p in got] == [b"\x00", b"\x01"]
    sub.receive_data(r5.ack(4, got[0].packet_id), 2.0)
    assert [p.payload for p in answers(sub)] == [b"\x02"]


def test_more_qos2_messages_than_the_receive_maximum_disconnects_with_0x93():
    """[MQTT-3.3.4-7]: the client exceeded the node's Receive Maximum."""
    net = Net(receive_maximum=2)
    ch, _ = connect5(net)
    for pid in (1, 2):
        ch.receive_data(r5.publish("t", b"x", qos=2, pid=pid), 1.0)
    assert [type(p).__name__ for p in answers(ch)] == ["PubRec", "PubRec"]
    ch.receive_data(r5.publish("t", b"x", qos=2, pid=1), 1.0)  # a re-send: still fine
    answers(ch)
    ch.receive_data(r5.publish("t", b"x", qos=2, pid=3), 1.0)
    assert answers(ch) == [Disconnect(0x93)]
    assert ch.state == CLOSED


# --------------------------------------------------------------------------- subscriptions


def test_no_local(net):
    """[MQTT-3.8.3-3]: not to the connection that published it; other subscriptions of the
    same client without No Local still deliver it."""
    ch, _ = connect5(net, "me")
    subscribe5(ch, ("chat/#", 0x04))
    other = net.connect("other")
    other.receive_data(mqttraw.publish("chat/x", b"theirs"), 1.0)
    ch.receive_data(r5.publish("chat/x", b"mine"), 1.0)
    assert [p.payload for p in answers(ch)] == [b"theirs"]
    subscribe5(ch, ("chat/x", 0), pid=2)  # a second, plain subscription
    ch.receive_data(r5.publish("chat/x", b"mine again"), 2.0)
    assert [p.payload for p in answers(ch)] == [b"mine again"]


def test_retain_as_published(net):
    """[MQTT-3.3.1-12] [MQTT-3.3.1-13]: RETAIN kept on live delivery only when asked."""
    rap, _ = connect5(net, "rap")
    subscribe5(rap, ("t", 0x08))
    plain, _ = connect5(net, "plain")
    subscribe5(plain, ("t", 0))
    pub = net.connect("p")
    pub.receive_data(mqttraw.publish("t", b"x", retain=True), 1.0)
    assert [p.retain for p in answers(rap)] == [True]
    assert [p.retain for p in answers(plain)] == [False]


def test_retain_handling(net):
    """[MQTT-3.3.1-9] 0: at every subscribe; [MQTT-3.3.1-10] 1: only a new one; [MQTT-3.3.1-11] 2: never."""
    pub = net.connect("p")
    pub.receive_data(mqttraw.publish("r", b"kept", retain=True), 0.0)
    ch, _ = connect5(net, "s")
    for handling, pid, expect in ((0, 1, 1), (0, 2, 1), (1, 3, 0), (2, 4, 0)):
        ch.receive_data(r5.subscribe(pid, ("r", handling << 4)), 1.0)
        got = answers(ch)
        assert isinstance(got[0], SubAck)
        assert sum(1 for p in got if isinstance(p, Publish)) == expect, (handling, pid)
    ch2, _ = connect5(net, "s2")
    ch2.receive_data(r5.subscribe(1, ("r", 1 << 4)), 1.0)  # new: sent, with RETAIN 1
    assert [(p.payload, p.retain) for p in answers(ch2) if isinstance(p, Publish)] == [(b"kept", True)]


def test_subscription_identifiers_of_every_matching_subscription(net):
    """[MQTT-3.3.4-3] [MQTT-3.3.4-4]: one copy, with the ids of all matching subscriptions."""
    ch, _ = connect5(net, "s")
    subscribe5(ch, ("a/#", 1), sub_id=7)
    subscribe5(ch, ("a/+", 0), pid=2, sub_id=300)
    subscribe5(ch, ("#", 0), pid=3)  # no identifier
    pub = net.connect("p")
    pub.receive_data(mqttraw.publish("a/b", b"x", qos=1, pid=1), 1.0)
    (got,) = answers(ch)
    assert got.qos == 1 and sorted(got.properties[P.SUBSCRIPTION_ID]) == [7, 300]
    pub.receive_data(mqttraw.publish("b", b"y"), 1.0)
    (got,) = answers(ch)
    assert got.properties is None


def test_suback_and_unsuback_reason_codes():
    """SUBACK: the granted QoS, 0x80 for a denied filter by default (or 0x87, a setting),
    for a shared subscription too (the ACL judges its filter after the share name); UNSUBACK:
    0x00, or 0x11 when there was none [MQTT-3.11.3-2]."""
    acl = Acl.parse("topic readwrite open/#\n")
    for denied in (0x80, 0x87):
        net = Net(auth=Auth(acl=acl), subscribe_denied_code=denied, max_qos=1)
        ch, _ = connect5(net, "s")
        ack = subscribe5(ch, ("open/a", 2), ("closed/a", 1), ("$share/g/open/b", 1), ("$share/g/closed/b", 1))
        assert ack.return_codes == [1, denied, 1, denied]
        ch.receive_data(r5.unsubscribe(2, "open/a", "never"), 1.0)
        assert answers(ch) == [UnsubAck(2, [0x00, 0x11])]


def test_shared_subscriptions_off_are_refused_with_0x9e():
    """Where shared subscriptions are not taken (a setting; a mesh node until they are served
    across it), CONNACK says Shared Subscription Available 0 and a SUBSCRIBE to one gets
    0x9E (Shared Subscriptions not supported), the others of the packet their own codes."""
    net = Net(shared_subscriptions=False)
    ch, ack = connect5(net, "s")
    assert ack.properties[P.SHARED_SUB_AVAILABLE] == 0
    ack = subscribe5(ch, ("a", 1), ("$share/g/a", 1))
    assert ack.return_codes == [1, 0x9E]
    assert "$share/g/a" not in net.broker.sessions["s"].subscriptions


def test_an_mqtt5_subscription_is_stored_with_its_options():
    """A persistent session's subscriptions keep their options and identifier in the store."""
    journal = Journal()
    net = Net(journal=journal)
    ch, _ = connect5(net, "p", clean=False, properties=r5.props((P.SESSION_EXPIRY, r5.u32(60))))
    subscribe5(ch, ("t", 0x04 | 0x08 | 0x01), sub_id=9)
    value = net.broker.sessions["p"].subscriptions["t"]
    assert value & 0x03 == 1 and value & 0x04 and value & 0x08 and value >> 8 == 9
    assert net.broker.trie.match("t") == {net.broker.sessions["p"]: 1}  # the trie: the QoS only


def test_a_silent_client_is_told_keep_alive_timeout_before_the_close(net):
    """[MQTT-3.1.2-22] (5.0): 1.5 times its Keep Alive without a packet; DISCONNECT 0x8D."""
    ch, _ = connect5(net, keepalive=10)
    ch.tick(14.0)
    assert ch.state == CONNECTED
    ch.tick(15.5)
    assert answers(ch) == [Disconnect(0x8D)]
    assert ch.state == CLOSED


def test_response_information_on_request():
    """4.10: a client that asks (Request Response Information 1) is given where it may have
    responses sent (mqtt.response_information, its ClientId filled in); one that does not is
    given none."""
    net = Net()
    _, ack = connect5(net, "asker", properties=r5.props((P.REQUEST_RESPONSE_INFO, b"\x01")))
    assert ack.properties[P.RESPONSE_INFO] == "response/asker/"
    _, ack = connect5(net, "other")
    assert P.RESPONSE_INFO not in ack.properties
    net = Net(response_information="")
    _, ack = connect5(net, "asker", properties=r5.props((P.REQUEST_RESPONSE_INFO, b"\x01")))
    assert P.RESPONSE_INFO not in ack.properties


def test_mqtt_max_session_expiry_caps_what_is_served_and_connack_says_so():
    """3.2.2.3.2: the node serves at most ``mqtt.max_session_expiry``: CONNACK tells the client
    the interval it is given (also for 0xFFFFFFFF, and for a larger one in DISCONNECT); a
    3.1.1 CleanSession=0 session ends that long after its client left."""
    net = Net(max_session_expiry=100)
    never = r5.props((P.SESSION_EXPIRY, r5.u32(0xFFFFFFFF)))
    ch, ack = connect5(net, "p", clean=False, properties=never)
    assert ack.properties[P.SESSION_EXPIRY] == 100
    ch.receive_data(r5.disconnect(0, r5.props((P.SESSION_EXPIRY, r5.u32(5000)))), 1.0)
    assert net.broker.sessions["p"].expires_at == 101.0
    old = net.channel(2.0)
    old.receive_data(mqttraw.connect("v311", clean=False), 2.0)
    old.connection_lost(3.0)
    assert net.broker.sessions["v311"].expires_at == 103.0
    assert net.broker.table.expire_sessions(103.0) == 2
