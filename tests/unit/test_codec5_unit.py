"""MQTT 5.0 packets at the byte level: codec5.py and properties.py, through codec.Decoder.

Bytes are built by tests/support/mqttraw5.py, which shares no code with the codec. Rule ids
are MQTT 5.0's (the same id names another statement in 3.1.1); "section 2.2.2.2" marks the
unlabelled rules of the property table.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mqttmesh import properties as P
from mqttmesh.codec import (
    Auth,
    ConnAck,
    Connect,
    Decoder,
    Disconnect,
    MalformedPacket,
    PingReq,
    PingResp,
    ProtocolError,
    PubAck,
    PubComp,
    Publish,
    PubRec,
    PubRel,
    SubAck,
    Subscribe,
    UnsubAck,
    Unsubscribe,
    Will,
)
from mqttmesh.codec5 import REASON_CODES, encode5
from support import mqttraw5 as r5
from support.mqttraw import packet, s, varint

CONNECT5 = r5.connect("c")


def decode(*raws: bytes, version: int = 5) -> list:
    d = Decoder(version=version)
    for raw in raws:
        d.feed(raw)
    return list(d.packets())


def after_connect(raw: bytes) -> list:
    """The packets a server's decoder reads after an MQTT 5 CONNECT, bytes fed one at a time."""
    d = Decoder()
    got = []
    for b in CONNECT5 + raw:
        d.feed(bytes((b,)))
        got += list(d.packets())
    return got[1:]


def refused(raw: bytes, version: int = 5) -> MalformedPacket:
    with pytest.raises(MalformedPacket) as info:
        decode(raw, version=version)
    return info.value


# --------------------------------------------------------------------------- CONNECT


def test_an_mqtt5_connect_switches_the_decoder_to_mqtt5():
    """A CONNECT of level 5 says how the rest of the connection is encoded: the PUBLISH after
    it has a property set (a 3.1.1 decoder would take it as payload)."""
    pub = r5.publish("t", b"x", properties=r5.props((P.CONTENT_TYPE, s("text/plain"))))
    got = after_connect(pub)
    assert got == [Publish("t", b"x", properties={P.CONTENT_TYPE: "text/plain"})]


def test_a_311_connect_leaves_the_decoder_in_311():
    from support import mqttraw

    d = Decoder()
    d.feed(mqttraw.connect("c") + mqttraw.publish("t", b"\x00x"))
    got = list(d.packets())
    assert d.version == 4 and got[1] == Publish("t", b"\x00x")


def test_connect_with_every_connect_property_and_a_will_with_every_will_property():
    """[MQTT-3.1.3-1] order: ClientId, Will Properties, Will Topic, Will Payload, User Name,
    Password; [MQTT-3.1.2-9] the will's fields are present when the Will Flag is set."""
    props = r5.props(
        (P.SESSION_EXPIRY, r5.u32(3600)),
        (P.RECEIVE_MAXIMUM, r5.u16(10)),
        (P.MAXIMUM_PACKET_SIZE, r5.u32(4096)),
        (P.TOPIC_ALIAS_MAXIMUM, r5.u16(5)),
        (P.REQUEST_RESPONSE_INFO, b"\x01"),
        (P.REQUEST_PROBLEM_INFO, b"\x00"),
        (P.USER_PROPERTY, r5.pair("a", "1")),
        (P.USER_PROPERTY, r5.pair("a", "2")),
        (P.AUTH_METHOD, s("SCRAM-SHA-1")),
        (P.AUTH_DATA, s(b"\x01\x02")),
    )
    will_props = r5.props(
        (P.WILL_DELAY, r5.u32(30)),
        (P.PAYLOAD_FORMAT, b"\x01"),
        (P.MESSAGE_EXPIRY, r5.u32(60)),
        (P.CONTENT_TYPE, s("text/plain")),
        (P.RESPONSE_TOPIC, s("reply/to")),
        (P.CORRELATION_DATA, s(b"\xff\x00")),
        (P.USER_PROPERTY, r5.pair("k", "v")),
    )
    raw = r5.connect(
        "dev1",
        clean=False,
        keepalive=30,
        properties=props,
        will=("w/t", b"bye", 1, True, will_props),
        username="u",
        password=b"p",
    )
    (pkt,) = decode(raw, version=4)
    assert pkt == Connect(
        "dev1",
        False,
        30,
        Will(
            "w/t",
            b"bye",
            1,
            True,
            {
                P.WILL_DELAY: 30,
                P.PAYLOAD_FORMAT: 1,
                P.MESSAGE_EXPIRY: 60,
                P.CONTENT_TYPE: "text/plain",
                P.RESPONSE_TOPIC: "reply/to",
                P.CORRELATION_DATA: b"\xff\x00",
                P.USER_PROPERTY: [("k", "v")],
            },
        ),
        "u",
        b"p",
        "MQTT",
        5,
        {
            P.SESSION_EXPIRY: 3600,
            P.RECEIVE_MAXIMUM: 10,
            P.MAXIMUM_PACKET_SIZE: 4096,
            P.TOPIC_ALIAS_MAXIMUM: 5,
            P.REQUEST_RESPONSE_INFO: 1,
            P.REQUEST_PROBLEM_INFO: 0,
            P.USER_PROPERTY: [("a", "1"), ("a", "2")],
            P.AUTH_METHOD: "SCRAM-SHA-1",
            P.AUTH_DATA: b"\x01\x02",
        },
    )
    assert encode5(pkt) == raw  # and back, byte for byte


def test_a_password_without_a_user_name_is_allowed_in_mqtt5():
    """MQTT 5 dropped 3.1.1's rule against it (3.1.2.9: either may be present alone)."""
    (pkt,) = decode(r5.connect("c", password=b"secret"), version=4)
    assert pkt.username is None and pkt.password == b"secret"


@pytest.mark.parametrize(
    "flags, rule",
    [
        pytest.param(0x01, "MQTT-3.1.2-3", id="reserved"),
        pytest.param(0x08, "MQTT-3.1.2-11", id="will-qos-without-will"),
        pytest.param(0x20, "MQTT-3.1.2-13", id="will-retain-without-will"),
        pytest.param(0x04 | 0x18, "MQTT-3.1.2-12", id="will-qos-3"),
    ],
)
def test_connect_flags_that_break_a_rule_are_malformed(flags, rule):
    exc = refused(r5.connect("c", flags_extra=flags), version=4)
    assert exc.rule == rule and exc.reason == 0x81


# --------------------------------------------------------------------------- properties


# every property with a valid raw value
VALUES = {
    P.PAYLOAD_FORMAT: b"\x01",
    P.MESSAGE_EXPIRY: r5.u32(5),
    P.CONTENT_TYPE: s("x"),
    P.RESPONSE_TOPIC: s("r"),
    P.CORRELATION_DATA: s(b"c"),
    P.SUBSCRIPTION_ID: varint(7),
    P.SESSION_EXPIRY: r5.u32(5),
    P.ASSIGNED_CLIENT_ID: s("id"),
    P.SERVER_KEEP_ALIVE: r5.u16(5),
    P.AUTH_METHOD: s("m"),
    P.AUTH_DATA: s(b"d"),
    P.REQUEST_PROBLEM_INFO: b"\x01",
    P.WILL_DELAY: r5.u32(5),
    P.REQUEST_RESPONSE_INFO: b"\x01",
    P.RESPONSE_INFO: s("ri"),
    P.SERVER_REFERENCE: s("sr"),
    P.REASON_STRING: s("why"),
    P.RECEIVE_MAXIMUM: r5.u16(5),
    P.TOPIC_ALIAS_MAXIMUM: r5.u16(5),
    P.TOPIC_ALIAS: r5.u16(5),
    P.MAXIMUM_QOS: b"\x01",
    P.RETAIN_AVAILABLE: b"\x01",
    P.USER_PROPERTY: r5.pair("k", "v"),
    P.MAXIMUM_PACKET_SIZE: r5.u32(5),
    P.WILDCARD_SUB_AVAILABLE: b"\x01",
    P.SUB_ID_AVAILABLE: b"\x01",
    P.SHARED_SUB_AVAILABLE: b"\x01",
}


def _carrying(where: str, prop: bytes) -> bytes:
    """A packet of kind ``where`` whose property set is ``prop``."""
    if where == "CONNECT":
        return r5.connect("c", properties=prop)
    if where == "WILL":
        return r5.connect("c", will=("w", b"x", 0, False, prop))
    if where == "CONNACK":
        return packet(0x20, b"\x00\x00" + prop)
    if where == "PUBLISH":
        return r5.publish("t", b"x", properties=prop)
    if where in ("PUBACK", "PUBREC", "PUBREL", "PUBCOMP"):
        return r5.ack({"PUBACK": 4, "PUBREC": 5, "PUBREL": 6, "PUBCOMP": 7}[where], 1, 0, prop)
    if where == "SUBSCRIBE":
        return r5.subscribe(1, ("t", 1), properties=prop)
    if where == "SUBACK":
        return packet(0x90, r5.u16(1) + prop + b"\x00")
    if where == "UNSUBSCRIBE":
        return r5.unsubscribe(1, "t", properties=prop)
    if where == "UNSUBACK":
        return packet(0xB0, r5.u16(1) + prop + b"\x00")
    if where == "DISCONNECT":
        return r5.disconnect(0, prop)
    assert where == "AUTH"
    return r5.auth(0, prop)


KINDS = {
    "CONNECT": 1,
    "WILL": P.WILL,
    "CONNACK": 2,
    "PUBLISH": 3,
    "PUBACK": 4,
    "PUBREC": 5,
    "PUBREL": 6,
    "PUBCOMP": 7,
    "SUBSCRIBE": 8,
    "SUBACK": 9,
    "UNSUBSCRIBE": 10,
    "UNSUBACK": 11,
    "DISCONNECT": 14,
    "AUTH": 15,
}
PLACES = [(pid, where) for pid in sorted(VALUES) for where in KINDS]


@pytest.mark.parametrize("pid, where", PLACES, ids=[f"0x{p:02x}-{w}" for p, w in PLACES])
def test_each_property_is_read_where_table_2_4_allows_it_and_malformed_elsewhere(pid, where):
    """Section 2.2.2.2: an identifier not valid for its packet type is a Malformed Packet
    (0x81); where it is valid, it is read as its type says."""
    allowed = KINDS[where] in P.TABLE[pid][2]
    raw = _carrying(where, r5.props((pid, VALUES[pid])))
    version = 4 if where in ("CONNECT", "WILL") else 5
    if not allowed:
        exc = refused(raw, version=version)
        assert exc.reason == 0x81 and not isinstance(exc, ProtocolError)
        return
    (pkt,) = decode(raw, version=version)
    got = pkt.will.properties if where == "WILL" else pkt.properties
    assert pid in got


SINGLE = [pid for pid in sorted(VALUES) if pid not in (P.USER_PROPERTY, P.SUBSCRIPTION_ID)]


@pytest.mark.parametrize("pid", SINGLE, ids=[f"0x{p:02x}" for p in SINGLE])
def test_a_single_valued_property_given_twice_is_a_protocol_error(pid):
    """ "It is a Protocol Error to include <the property> more than once" (0x82)."""
    where = next(w for w in KINDS if KINDS[w] in P.TABLE[pid][2])
    raw = _carrying(where, r5.props((pid, VALUES[pid]), (pid, VALUES[pid])))
    exc = refused(raw, version=4 if where in ("CONNECT", "WILL") else 5)
    assert isinstance(exc, ProtocolError) and exc.reason == 0x82


def test_user_properties_repeat_and_keep_their_order():
    """[MQTT-3.3.2-17] [MQTT-3.3.2-18] every User Property, in order, duplicates too."""
    pairs = [("b", "2"), ("a", "1"), ("b", "2"), ("a", "0")]
    raw = r5.publish("t", properties=r5.props(*[(P.USER_PROPERTY, r5.pair(k, v)) for k, v in pairs]))
    (pkt,) = decode(raw)
    assert pkt.properties[P.USER_PROPERTY] == pairs
    assert encode5(pkt) == raw


@pytest.mark.parametrize(
    "pid, raw",
    [
        pytest.param(P.RECEIVE_MAXIMUM, r5.u16(0), id="receive-maximum-0"),
        pytest.param(P.MAXIMUM_PACKET_SIZE, r5.u32(0), id="maximum-packet-size-0"),
        pytest.param(P.REQUEST_PROBLEM_INFO, b"\x02", id="request-problem-2"),
        pytest.param(P.REQUEST_RESPONSE_INFO, b"\x02", id="request-response-2"),
    ],
)
def test_a_connect_property_out_of_its_range_is_a_protocol_error(pid, raw):
    exc = refused(r5.connect("c", properties=r5.props((pid, raw))), version=4)
    assert isinstance(exc, ProtocolError)


def test_no_properties_is_a_property_length_of_zero():
    """[MQTT-2.2.2-1]"""
    assert (
        encode5(Publish("t", b"x")) == r5.publish("t", b"x") == bytes.fromhex("30 05 00 01 74 00 78".replace(" ", ""))
    )


def test_a_property_length_in_a_longer_form_than_needed_is_malformed():
    """[MQTT-1.5.5-1] a Variable Byte Integer uses the fewest bytes: 0x80 0x00 for zero is not."""
    raw = packet(0x30, s("t") + b"\x80\x00" + b"x")
    exc = refused(raw)
    assert exc.rule == "MQTT-1.5.5-1"


def test_a_property_length_that_overruns_the_packet_is_malformed():
    raw = packet(0x30, s("t") + b"\x05\x01\x01")
    assert refused(raw).reason == 0x81


def test_a_value_that_runs_past_its_property_set_is_malformed():
    """A Content Type whose length reaches past the property length into the payload."""
    raw = packet(0x30, s("t") + b"\x03\x03\x00\x05" + b"abcde")
    assert refused(raw).reason == 0x81


@pytest.mark.parametrize(
    "text, rule",
    [
        pytest.param(b"\xed\xa0\x80", "MQTT-1.5.3-1", id="surrogate"),
        pytest.param(b"a\x00b", "MQTT-1.5.3-2", id="null"),
    ],
)
def test_strings_in_properties_are_checked_like_every_string(text, rule):
    """[MQTT-1.5.4-1] well-formed, no surrogates; [MQTT-1.5.4-2] no U+0000 (the 3.1.1 ids of
    the same two rules are what the codec names)."""
    exc = refused(r5.publish("t", properties=r5.props((P.CONTENT_TYPE, s(text)))))
    assert exc.rule == rule and exc.reason == 0x81


def test_a_byte_order_mark_in_a_string_is_kept():
    """[MQTT-1.5.4-3] 0xEF 0xBB 0xBF is U+FEFF, never stripped."""
    (pkt,) = decode(r5.publish("t", properties=r5.props((P.CONTENT_TYPE, s("\ufefftext")))))
    assert pkt.properties[P.CONTENT_TYPE] == "\ufefftext"


# --------------------------------------------------------------------------- PUBLISH


def test_publish_with_every_publish_property():
    props = r5.props(
        (P.PAYLOAD_FORMAT, b"\x01"),
        (P.MESSAGE_EXPIRY, r5.u32(120)),
        (P.TOPIC_ALIAS, r5.u16(3)),
        (P.RESPONSE_TOPIC, s("resp")),
        (P.CORRELATION_DATA, s(b"\x00\x01")),
        (P.USER_PROPERTY, r5.pair("x", "y")),
        (P.SUBSCRIPTION_ID, varint(1)),
        (P.SUBSCRIPTION_ID, varint(268_435_455)),
        (P.CONTENT_TYPE, s("application/json")),
    )
    raw = r5.publish("a/b", b"{}", qos=2, retain=True, dup=True, pid=9, properties=props)
    (pkt,) = after_connect(raw)
    assert pkt == Publish(
        "a/b",
        b"{}",
        2,
        True,
        True,
        9,
        {
            P.PAYLOAD_FORMAT: 1,
            P.MESSAGE_EXPIRY: 120,
            P.TOPIC_ALIAS: 3,
            P.RESPONSE_TOPIC: "resp",
            P.CORRELATION_DATA: b"\x00\x01",
            P.USER_PROPERTY: [("x", "y")],
            P.SUBSCRIPTION_ID: [1, 268_435_455],
            P.CONTENT_TYPE: "application/json",
        },
    )
    assert encode5(pkt) == raw


def test_an_empty_topic_needs_a_topic_alias():
    """3.3.2.1: a zero-length Topic Name without a Topic Alias is a Protocol Error."""
    assert isinstance(refused(r5.publish("", b"x")), ProtocolError)
    (pkt,) = decode(r5.publish("", b"x", properties=r5.props((P.TOPIC_ALIAS, r5.u16(1)))))
    assert pkt.topic == "" and pkt.properties[P.TOPIC_ALIAS] == 1


def test_a_wildcard_in_a_topic_name_is_topic_name_invalid():
    """[MQTT-3.3.2-2] with reason 0x90 (Topic Name invalid)."""
    exc = refused(r5.publish("a/+", b"x"))
    assert exc.rule == "MQTT-3.3.2-2" and exc.reason == 0x90


def test_a_packet_over_the_maximum_size_is_packet_too_large():
    d = Decoder(max_packet_size=64, version=5)
    d.feed(r5.publish("t", b"x" * 100))
    with pytest.raises(MalformedPacket) as info:
        list(d.packets())
    assert info.value.reason == 0x95


def test_a_subscription_identifier_of_zero_is_a_protocol_error():
    raw = r5.subscribe(1, ("t", 0), properties=r5.props((P.SUBSCRIPTION_ID, varint(0))))
    assert isinstance(refused(raw), ProtocolError)


# --------------------------------------------------------------------------- acks


@pytest.mark.parametrize("ptype, cls", [(4, PubAck), (5, PubRec), (6, PubRel), (7, PubComp)])
def test_acks_in_their_three_lengths(ptype, cls):
    """3.4.2.1: remaining length 2 is reason 0x00 without properties; 3, a reason code without
    properties; more, a reason code and properties."""
    assert after_connect(r5.ack(ptype, 5)) == [cls(5)]
    code = 0x92 if ptype in (6, 7) else 0x10
    assert after_connect(r5.ack(ptype, 5, code)) == [cls(5, code)]
    props = r5.props((P.REASON_STRING, s("no")), (P.USER_PROPERTY, r5.pair("k", "v")))
    got = after_connect(r5.ack(ptype, 5, code, props))
    assert got == [cls(5, code, {P.REASON_STRING: "no", P.USER_PROPERTY: [("k", "v")]})]
    assert encode5(cls(5)) == r5.ack(ptype, 5)  # the short form when it says all
    assert encode5(cls(5, code)) == r5.ack(ptype, 5, code)


@pytest.mark.parametrize(
    "ptype, rule", [(4, "MQTT-3.4.2-1"), (5, "MQTT-3.5.2-1"), (6, "MQTT-3.6.2-1"), (7, "MQTT-3.7.2-1")]
)
def test_an_ack_with_a_reason_code_not_its_own_is_malformed(ptype, rule):
    bad = next(c for c in range(256) if c not in REASON_CODES[ptype])
    exc = refused(r5.ack(ptype, 5, bad))
    assert exc.rule == rule
    # a PUBREL may not say "No matching subscribers"
    if ptype == 6:
        assert refused(r5.ack(6, 5, 0x10)).rule == rule


# --------------------------------------------------------------------------- SUBSCRIBE


def test_subscribe_options_and_subscription_identifier():
    """3.8.3.1: QoS (bits 0-1), No Local (2), Retain As Published (3), Retain Handling (4-5)."""
    props = r5.props((P.SUBSCRIPTION_ID, varint(300)), (P.USER_PROPERTY, r5.pair("k", "v")))
    raw = r5.subscribe(3, ("a/#", 0x01 | 0x04), ("b", 0x02 | 0x08 | 0x20), properties=props)
    (pkt,) = after_connect(raw)
    assert pkt == Subscribe(3, [("a/#", 0x05), ("b", 0x2A)], {P.SUBSCRIPTION_ID: [300], P.USER_PROPERTY: [("k", "v")]})
    assert encode5(pkt) == raw


@pytest.mark.parametrize("options", [0x40, 0x80, 0xC1])
def test_reserved_subscription_option_bits_are_malformed(options):
    """[MQTT-3.8.3-5]"""
    exc = refused(r5.subscribe(1, ("t", options)))
    assert exc.rule == "MQTT-3.8.3-5" and exc.reason == 0x81


def test_retain_handling_3_is_a_protocol_error():
    assert isinstance(refused(r5.subscribe(1, ("t", 0x30))), ProtocolError)


def test_subscribe_and_unsubscribe_need_a_topic_filter():
    """[MQTT-3.8.3-2] [MQTT-3.10.3-2]: a Protocol Error in MQTT 5."""
    assert refused(r5.subscribe(1)).rule == "MQTT-3.8.3-2"
    assert refused(r5.unsubscribe(1)).rule == "MQTT-3.10.3-2"


def test_a_subscribe_with_two_subscription_identifiers_is_a_protocol_error():
    props = r5.props((P.SUBSCRIPTION_ID, varint(1)), (P.SUBSCRIPTION_ID, varint(2)))
    assert isinstance(refused(r5.subscribe(1, ("t", 0), properties=props)), ProtocolError)


def test_an_invalid_topic_filter_is_topic_filter_invalid():
    exc = refused(r5.subscribe(1, ("a/#/b", 0)))
    assert exc.reason == 0x8F


def test_unsubscribe_and_the_acks_with_their_reason_codes():
    (pkt,) = after_connect(r5.unsubscribe(4, "a", "b/+", properties=r5.props((P.USER_PROPERTY, r5.pair("k", "v")))))
    assert pkt == Unsubscribe(4, ["a", "b/+"], {P.USER_PROPERTY: [("k", "v")]})
    suback = SubAck(7, [0, 1, 2, 0x80, 0x87, 0x8F, 0x9E, 0xA1, 0xA2], {P.REASON_STRING: "see codes"})
    assert decode(encode5(suback)) == [suback]
    unsuback = UnsubAck(8, [0x00, 0x11, 0x87])
    assert decode(encode5(unsuback)) == [unsuback]
    assert encode5(unsuback) == packet(0xB0, r5.u16(8) + b"\x00" + bytes((0x00, 0x11, 0x87)))


# --------------------------------------------------------------------------- DISCONNECT, AUTH


def test_disconnect_in_its_three_lengths():
    assert after_connect(r5.disconnect()) == [Disconnect()]
    assert after_connect(r5.disconnect(0x04)) == [Disconnect(0x04)]
    props = r5.props((P.SESSION_EXPIRY, r5.u32(0)), (P.REASON_STRING, s("bye")))
    assert after_connect(r5.disconnect(0x00, props)) == [Disconnect(0, {P.SESSION_EXPIRY: 0, P.REASON_STRING: "bye"})]
    assert encode5(Disconnect(0x8E)) == bytes.fromhex("e0018e")


def test_disconnect_with_reserved_flags_is_malformed():
    """[MQTT-3.14.1-1]"""
    exc = refused(packet(0xE1, b""))
    assert exc.rule == "MQTT-3.14.1-1" and exc.reason == 0x81


def test_auth_is_a_packet_in_mqtt5_and_reserved_in_311():
    """[MQTT-3.15.1-1] its flags are 0; in 3.1.1 type 15 is reserved."""
    props = r5.props((P.AUTH_METHOD, s("SCRAM-SHA-1")), (P.AUTH_DATA, s(b"\x00")))
    assert after_connect(r5.auth(0x18, props)) == [Auth(0x18, {P.AUTH_METHOD: "SCRAM-SHA-1", P.AUTH_DATA: b"\x00"})]
    assert after_connect(r5.auth()) == [Auth()]
    assert refused(packet(0xF1, b"")).rule == "MQTT-3.15.1-1"
    assert refused(r5.auth(0x18, props), version=4).rule == "MQTT-2.2.2-1"  # (3.1.1's reserved type)
    assert refused(r5.auth(0x04)).rule == "MQTT-3.15.2-1"


def test_connack_with_server_properties():
    props = {
        P.SESSION_EXPIRY: 10,
        P.ASSIGNED_CLIENT_ID: "auto-1",
        P.SERVER_KEEP_ALIVE: 30,
        P.RECEIVE_MAXIMUM: 100,
        P.TOPIC_ALIAS_MAXIMUM: 10,
        P.MAXIMUM_QOS: 1,
        P.RETAIN_AVAILABLE: 1,
        P.MAXIMUM_PACKET_SIZE: 1 << 20,
        P.WILDCARD_SUB_AVAILABLE: 1,
        P.SUB_ID_AVAILABLE: 1,
        P.SHARED_SUB_AVAILABLE: 0,
        P.RESPONSE_INFO: "resp/",
    }
    ack = ConnAck(True, 0, props)
    assert decode(encode5(ack)) == [ack]
    assert encode5(ConnAck(False, 0x84)) == bytes.fromhex("2003008400")
    assert refused(packet(0x20, b"\x00\x01\x00")).rule == "MQTT-3.2.2-8"  # 0x01 is 3.1.1's, not 5.0's
    assert refused(packet(0x20, b"\x02\x00\x00")).rule == "MQTT-3.2.2-1"


# --------------------------------------------------------------------------- round trips

_text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=8)
_topic = _text.filter(lambda t: t and "+" not in t and "#" not in t)
_message_props = st.fixed_dictionaries(
    {},
    optional={
        P.PAYLOAD_FORMAT: st.integers(0, 1),
        P.MESSAGE_EXPIRY: st.integers(0, 2**32 - 1),
        P.CONTENT_TYPE: _text,
        P.RESPONSE_TOPIC: _topic,
        P.CORRELATION_DATA: st.binary(max_size=8),
        P.USER_PROPERTY: st.lists(st.tuples(_text, _text), min_size=1, max_size=3),
        P.TOPIC_ALIAS: st.integers(1, 0xFFFF),
        P.SUBSCRIPTION_ID: st.lists(st.integers(1, 268_435_455), min_size=1, max_size=3),
    },
)
_acks = st.sampled_from([(PubAck, 0x10), (PubRec, 0x97), (PubRel, 0x92), (PubComp, 0x92)])

PACKETS5 = st.one_of(
    st.builds(
        lambda t, p, q, r, d, pid, props: Publish(t, p, q, r, d and q > 0, pid if q else None, props or None),
        _topic,
        st.binary(max_size=300),
        st.integers(0, 2),
        st.booleans(),
        st.booleans(),
        st.integers(1, 0xFFFF),
        _message_props,
    ),
    st.builds(
        lambda ack, pid, ok, why: ack[0](pid, 0 if ok else ack[1], {P.REASON_STRING: why} if why else None),
        _acks,
        st.integers(1, 0xFFFF),
        st.booleans(),
        _text,
    ),
    st.builds(
        lambda pid, fs, sid: Subscribe(pid, fs, {P.SUBSCRIPTION_ID: [sid]} if sid else None),
        st.integers(1, 0xFFFF),
        st.lists(
            st.tuples(_topic, st.integers(0, 2) | st.sampled_from([0x04, 0x09, 0x1A, 0x2E])), min_size=1, max_size=3
        ),
        st.integers(0, 1000),
    ),
    st.builds(lambda pid, fs: Unsubscribe(pid, fs), st.integers(1, 0xFFFF), st.lists(_topic, min_size=1, max_size=3)),
    st.builds(Disconnect, st.sampled_from(sorted(REASON_CODES[14]))),
    st.builds(Auth, st.sampled_from([0, 0x18, 0x19])),
    st.just(PingReq()),
    st.just(PingResp()),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(PACKETS5, min_size=1, max_size=6), st.data())
def test_mqtt5_packets_round_trip_in_any_chunking(packets, data):
    """Encoded back to back and fed in random pieces, the packets come back equal."""
    raw = b"".join(encode5(p) for p in packets)
    cuts = sorted(data.draw(st.sets(st.integers(1, max(1, len(raw) - 1)), max_size=5)))
    d = Decoder(version=5)
    got = []
    last = 0
    for cut in [*cuts, len(raw)]:
        d.feed(raw[last:cut])
        last = cut
        got += list(d.packets())
    assert got == packets
