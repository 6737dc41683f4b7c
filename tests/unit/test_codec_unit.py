"""mqttmesh.codec: one table of (packet, exact bytes) drives the decoder and the encoder.

The bytes are written by hand from the standard's figures (chapter 3), never
produced by our encoder. Every decoder test feeds its bytes whole, one byte at
a time, and followed by the first bytes of the next packet (which must then
decode too), as h11's tests do.
"""

from __future__ import annotations

import pytest

from mqttmesh.codec import (
    DEFAULT_MAX_PACKET_SIZE,
    ConnAck,
    Connect,
    Decoder,
    Disconnect,
    MalformedPacket,
    PingReq,
    PingResp,
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
    encode,
    encode_publish,
    encode_remaining_length,
    validate_topic_filter,
    validate_topic_name,
)
from support import mqttraw


def h(text: str) -> bytes:
    return bytes.fromhex(text)


# The packet that follows in the trailing-data tests: PUBLISH "z", QoS 0, no payload.
NEXT = h("30 03 00 01 7a")
NEXT_PACKET = Publish("z")

# (packet, exact bytes); ids name the figure or the feature each row covers.
TABLE = [
    pytest.param(
        Connect("c1", clean_session=True, keepalive=60),
        h("10 0e 00 04 4d 51 54 54 04 02 00 3c 00 02 63 31"),
        id="connect-minimal",
    ),
    pytest.param(
        Connect(
            "id", clean_session=False, keepalive=0x0102, will=Will("w/t", b"bye", 1, True), username="u", password=b"pw"
        ),
        h("10 1f 00 04 4d 51 54 54 04 ec 01 02 00 02 69 64 00 03 77 2f 74 00 03 62 79 65 00 01 75 00 02 70 77"),
        id="connect-will-user-password",
    ),
    pytest.param(
        Connect("a", keepalive=60, username="bob"),
        h("10 12 00 04 4d 51 54 54 04 82 00 3c 00 01 61 00 03 62 6f 62"),
        id="connect-user-only",
    ),
    pytest.param(
        Connect("", clean_session=True, keepalive=0, will=Will("t", b"", 2, False)),
        h("10 11 00 04 4d 51 54 54 04 16 00 00 00 00 00 01 74 00 00"),
        id="connect-empty-id-will-qos2",
    ),
    pytest.param(ConnAck(False, 0), h("20 02 00 00"), id="connack-accepted"),
    pytest.param(ConnAck(True, 0), h("20 02 01 00"), id="connack-session-present"),
    pytest.param(ConnAck(False, 5), h("20 02 00 05"), id="connack-not-authorized"),
    pytest.param(Publish("a/b", b"hi"), h("30 07 00 03 61 2f 62 68 69"), id="publish-qos0"),
    pytest.param(
        Publish("a", b"\x01\x02", qos=1, retain=True, packet_id=10),
        h("33 07 00 01 61 00 0a 01 02"),
        id="publish-qos1-retain",
    ),
    pytest.param(
        Publish("x", b"", qos=2, dup=True, packet_id=0xFFFF),
        h("3c 05 00 01 78 ff ff"),
        id="publish-qos2-dup-empty-payload",
    ),
    pytest.param(Publish("t", b"", retain=True), h("31 03 00 01 74"), id="publish-retain-empty"),
    # [MQTT-1.5.3-3]: the BOM EF BB BF is U+FEFF and is kept, not stripped
    pytest.param(Publish("\ufeff\u00e9", b""), h("30 07 00 05 ef bb bf c3 a9"), id="publish-bom-kept"),
    pytest.param(
        Publish("$SYS/x", b"\x00", qos=1, packet_id=1),
        h("32 0b 00 06 24 53 59 53 2f 78 00 01 00"),
        id="publish-dollar-topic",
    ),
    pytest.param(Publish("t", b"x" * 125), h("30 80 01 00 01 74") + b"x" * 125, id="publish-remaining-length-128"),
    pytest.param(PubAck(1), h("40 02 00 01"), id="puback"),
    pytest.param(PubRec(0x1234), h("50 02 12 34"), id="pubrec"),
    pytest.param(PubRel(7), h("62 02 00 07"), id="pubrel"),
    pytest.param(PubComp(0xFFFF), h("70 02 ff ff"), id="pubcomp"),
    pytest.param(
        Subscribe(1, [("a/+", 1), ("#", 0), ("$SYS/#", 2)]),
        h("82 15 00 01 00 03 61 2f 2b 01 00 01 23 00 00 06 24 53 59 53 2f 23 02"),
        id="subscribe-three-filters",
    ),
    pytest.param(Subscribe(0x0100, [("+/+", 2)]), h("82 08 01 00 00 03 2b 2f 2b 02"), id="subscribe-plus-plus"),
    pytest.param(SubAck(1, [1, 0, 0x80]), h("90 05 00 01 01 00 80"), id="suback"),
    pytest.param(Unsubscribe(2, ["a/b", "c"]), h("a2 0a 00 02 00 03 61 2f 62 00 01 63"), id="unsubscribe"),
    pytest.param(UnsubAck(2), h("b0 02 00 02"), id="unsuback"),
    pytest.param(PingReq(), h("c0 00"), id="pingreq"),
    pytest.param(PingResp(), h("d0 00"), id="pingresp"),
    pytest.param(Disconnect(), h("e0 00"), id="disconnect"),
]


def decode_all(data: bytes, **kw) -> list:
    d = Decoder(**kw)
    d.feed(data)
    return list(d.packets())


# --------------------------------------------------------------------------- valid packets


@pytest.mark.parametrize("packet, raw", TABLE)
def test_decode_whole(packet, raw):
    d = Decoder()
    d.feed(raw)
    assert list(d.packets()) == [packet]
    assert d.buffered == 0


@pytest.mark.parametrize("packet, raw", TABLE)
def test_decode_one_byte_at_a_time(packet, raw):
    d = Decoder()
    got = []
    for i in range(len(raw)):
        d.feed(raw[i : i + 1])
        out = list(d.packets())
        if i < len(raw) - 1:
            assert out == [], f"packet yielded after {i + 1} of {len(raw)} bytes"
        got += out
    assert got == [packet]
    assert d.buffered == 0


@pytest.mark.parametrize("cut", [1, 2, 4])
@pytest.mark.parametrize("packet, raw", TABLE)
def test_decode_with_trailing_data_then_next_packet(packet, raw, cut):
    d = Decoder()
    d.feed(raw + NEXT[:cut])
    assert list(d.packets()) == [packet]
    assert d.buffered == cut
    d.feed(NEXT[cut:])
    assert list(d.packets()) == [NEXT_PACKET]
    assert d.buffered == 0


@pytest.mark.parametrize("packet, raw", TABLE)
def test_decode_back_to_back(packet, raw):
    assert decode_all(raw + NEXT + raw) == [packet, NEXT_PACKET, packet]


@pytest.mark.parametrize("packet, raw", TABLE)
def test_encode(packet, raw):
    assert encode(packet) == raw


@pytest.mark.parametrize("packet, raw", [p for p in TABLE if isinstance(p.values[0], Publish)])
def test_encode_publish(packet, raw):
    assert (
        encode_publish(
            packet.topic.encode("utf-8"), packet.payload, packet.qos, packet.retain, packet.dup, packet.packet_id
        )
        == raw
    )


def test_hand_written_bytes_agree_with_mqttraw():
    """A second, independent source for a few rows of the table."""
    assert mqttraw.connect("c1", clean=True, keepalive=60) == h("10 0e 00 04 4d 51 54 54 04 02 00 3c 00 02 63 31")
    assert mqttraw.connect(
        "id", clean=False, keepalive=0x0102, will=("w/t", b"bye", 1, True), username="u", password=b"pw"
    ) == h("10 1f 00 04 4d 51 54 54 04 ec 01 02 00 02 69 64 00 03 77 2f 74 00 03 62 79 65 00 01 75 00 02 70 77")
    assert mqttraw.publish("a/b", b"hi") == h("30 07 00 03 61 2f 62 68 69")
    assert mqttraw.subscribe(1, ("a/+", 1), ("#", 0), ("$SYS/#", 2)) == h(
        "82 15 00 01 00 03 61 2f 2b 01 00 01 23 00 00 06 24 53 59 53 2f 23 02"
    )
    assert mqttraw.unsubscribe(2, "a/b", "c") == h("a2 0a 00 02 00 03 61 2f 62 00 01 63")
    assert mqttraw.pubrel(7) == h("62 02 00 07")


def test_bom_is_not_stripped_from_strings():
    """[MQTT-1.5.3-3] U+FEFF anywhere in a string is kept, in the client id too."""
    [pkt] = decode_all(h("10 10 00 04 4d 51 54 54 04 02 00 3c 00 04 ef bb bf 63"))
    assert pkt.client_id == "\ufeffc"


def test_noncharacter_is_accepted():
    """U+FFFF is well-formed UTF-8 (only SHOULD NOT, 1.5.3); it must not close the connection."""
    [pkt] = decode_all(h("30 05 00 03 ef bf bf"))
    assert pkt.topic == "\uffff"


def test_packets_before_a_malformed_one_are_yielded():
    d = Decoder()
    d.feed(h("c0 00") + h("36 05 00 01 61 00 01"))
    gen = d.packets()
    assert next(gen) == PingReq()
    with pytest.raises(MalformedPacket):
        next(gen)


# --------------------------------------------------------------------------- CONNECT, level != 4


@pytest.mark.parametrize(
    "raw, name, level",
    [
        pytest.param(h("10 0d 00 04 4d 51 54 54 03 02 00 3c 00 01 63"), "MQTT", 3, id="MQTT-level-3"),
        pytest.param(h("10 0f 00 06 4d 51 49 73 64 70 03 02 00 3c 00 01 63"), "MQIsdp", 3, id="MQIsdp"),
    ],
)
def test_connect_other_protocol_level_decodes(raw, name, level):
    """[MQTT-3.1.2-2] another level is not malformed: the channel answers CONNACK 0x01."""
    for chunks in ([raw], [raw[i : i + 1] for i in range(len(raw))], [raw + NEXT[:2], NEXT[2:]]):
        d = Decoder()
        got = []
        for chunk in chunks:
            d.feed(chunk)
            got += list(d.packets())
        assert got[0].protocol_name == name
        assert got[0].protocol_level == level
        assert got[1:] == ([NEXT_PACKET] if len(chunks) == 2 else [])


# --------------------------------------------------------------------------- remaining length


BOUNDARIES = [
    (0, "00"),
    (127, "7f"),
    (128, "80 01"),
    (16383, "ff 7f"),
    (16384, "80 80 01"),
    (2097151, "ff ff 7f"),
    (2097152, "80 80 80 01"),
    (268435455, "ff ff ff 7f"),
]


@pytest.mark.parametrize("length, raw", BOUNDARIES)
def test_encode_remaining_length(length, raw):
    assert encode_remaining_length(length) == h(raw)


def test_encode_remaining_length_too_large():
    with pytest.raises(ValueError):
        encode_remaining_length(268435456)


@pytest.mark.parametrize("length, raw", [b for b in BOUNDARIES if 3 <= b[0] <= 2097152])
def test_decode_remaining_length_boundaries(length, raw):
    payload = bytes(range(256)) * (length // 256) + bytes(length % 256)
    payload = payload[: length - 3]
    frame = h("30") + h(raw) + h("00 01 74") + payload
    assert len(frame) == 1 + len(h(raw)) + length
    assert encode(Publish("t", payload))[: 1 + len(h(raw)) + 3] == frame[: 1 + len(h(raw)) + 3]
    for chunks in ([frame + NEXT], [frame[:3], frame[3:-1], frame[-1:] + NEXT[:1], NEXT[1:]]):
        d = Decoder()
        got = []
        for chunk in chunks:
            d.feed(chunk)
            got += list(d.packets())
        assert got == [Publish("t", payload), NEXT_PACKET]


@pytest.mark.parametrize("length, raw", [b for b in BOUNDARIES if 3 <= b[0] <= 16384])
def test_decode_remaining_length_boundaries_one_byte_at_a_time(length, raw):
    frame = h("30") + h(raw) + h("00 01 74") + b"q" * (length - 3)
    d = Decoder()
    got = []
    for i in range(len(frame)):
        d.feed(frame[i : i + 1])
        got += list(d.packets())
        assert len(got) == (1 if i == len(frame) - 1 else 0)
    assert got == [Publish("t", b"q" * (length - 3))]


def test_decode_largest_remaining_length_waits_for_body():
    """268,435,455 is a legal remaining length: the header alone is no error."""
    d = Decoder(max_packet_size=268_435_460)
    d.feed(h("30 ff ff ff 7f 00 01 74"))
    assert list(d.packets()) == []
    assert not d.broken


def test_default_decoder_accepts_largest_remaining_length_header():
    d = Decoder()
    assert d.max_packet_size == DEFAULT_MAX_PACKET_SIZE
    d.feed(h("30 ff ff ff 7f 00 01 74"))
    assert list(d.packets()) == []


# --------------------------------------------------------------------------- malformed packets

ANY = None  # any statement id will do (e.g. a truncated field is [MQTT-4.8.0-1] or the field's own rule)
FLAGS = {"MQTT-2.2.2-1", "MQTT-2.2.2-2"}
UTF8 = {"MQTT-1.5.3-1"}
WILDCARD = {"MQTT-3.3.2-2", "MQTT-4.7.1-1"}

# (bytes, accepted statement ids, the byte count by which it must have failed or None = at the end)
MALFORMED = [
    # reserved flag nibbles [MQTT-2.2.2-1/2] and the per-type statements
    pytest.param("11 0e 00 04 4d 51 54 54 04 02 00 3c 00 02 63 31", FLAGS, None, id="connect-flags"),
    pytest.param("28 02 00 00", FLAGS, None, id="connack-flags"),
    pytest.param("41 02 00 01", FLAGS, None, id="puback-flags"),
    pytest.param("48 02 00 01", FLAGS, None, id="puback-flags-8"),
    pytest.param("52 02 00 01", FLAGS, None, id="pubrec-flags"),
    pytest.param("60 02 00 01", {"MQTT-3.6.1-1"}, None, id="pubrel-flags-0-MQTT-3.6.1-1"),
    pytest.param("63 02 00 01", {"MQTT-3.6.1-1"}, None, id="pubrel-flags-3-MQTT-3.6.1-1"),
    pytest.param("6a 02 00 01", {"MQTT-3.6.1-1"}, None, id="pubrel-flags-a-MQTT-3.6.1-1"),
    pytest.param("71 02 00 01", FLAGS, None, id="pubcomp-flags"),
    pytest.param("80 06 00 01 00 01 61 00", {"MQTT-3.8.1-1"}, None, id="subscribe-flags-0-MQTT-3.8.1-1"),
    pytest.param("83 06 00 01 00 01 61 00", {"MQTT-3.8.1-1"}, None, id="subscribe-flags-3-MQTT-3.8.1-1"),
    pytest.param("91 03 00 01 00", FLAGS, None, id="suback-flags"),
    pytest.param("a0 05 00 01 00 01 61", {"MQTT-3.10.1-1"}, None, id="unsubscribe-flags-MQTT-3.10.1-1"),
    pytest.param("a6 05 00 01 00 01 61", {"MQTT-3.10.1-1"}, None, id="unsubscribe-flags-6-MQTT-3.10.1-1"),
    pytest.param("b2 02 00 01", FLAGS, None, id="unsuback-flags"),
    pytest.param("c1 00", FLAGS, None, id="pingreq-flags"),
    pytest.param("d8 00", FLAGS, None, id="pingresp-flags"),
    pytest.param("e1 00", {"MQTT-3.14.1-1"}, None, id="disconnect-flags-MQTT-3.14.1-1"),
    pytest.param("e8 00", {"MQTT-3.14.1-1"}, None, id="disconnect-flags-8-MQTT-3.14.1-1"),
    # reserved packet types (table 2.1: forbidden)
    pytest.param("00 00", ANY, None, id="type-0"),
    pytest.param("0f 02 00 01", ANY, None, id="type-0-with-body"),
    pytest.param("f0 00", ANY, None, id="type-15"),
    # PUBLISH fixed header
    pytest.param("36 05 00 01 61 00 01", {"MQTT-3.3.1-4"}, None, id="publish-qos3-MQTT-3.3.1-4"),
    pytest.param("3f 05 00 01 61 00 01", {"MQTT-3.3.1-4"}, None, id="publish-qos3-dup-retain-MQTT-3.3.1-4"),
    pytest.param("38 03 00 01 61", {"MQTT-3.3.1-2"}, None, id="publish-dup-on-qos0-MQTT-3.3.1-2"),
    # packet identifier 0 [MQTT-2.3.1-1]
    pytest.param("32 05 00 01 61 00 00", {"MQTT-2.3.1-1"}, None, id="publish-qos1-pid0-MQTT-2.3.1-1"),
    pytest.param("34 05 00 01 61 00 00", {"MQTT-2.3.1-1"}, None, id="publish-qos2-pid0-MQTT-2.3.1-1"),
    pytest.param("82 06 00 00 00 01 61 00", {"MQTT-2.3.1-1"}, None, id="subscribe-pid0-MQTT-2.3.1-1"),
    pytest.param("a2 05 00 00 00 01 61", {"MQTT-2.3.1-1"}, None, id="unsubscribe-pid0-MQTT-2.3.1-1"),
    pytest.param("40 02 00 00", {"MQTT-2.3.1-1"}, None, id="puback-pid0"),
    pytest.param("50 02 00 00", {"MQTT-2.3.1-1"}, None, id="pubrec-pid0"),
    pytest.param("62 02 00 00", {"MQTT-2.3.1-1"}, None, id="pubrel-pid0"),
    pytest.param("70 02 00 00", {"MQTT-2.3.1-1"}, None, id="pubcomp-pid0"),
    # topic names: wildcards [MQTT-3.3.2-2, MQTT-4.7.1-1], empty [MQTT-4.7.3-1]
    pytest.param("30 05 00 03 61 2f 2b", WILDCARD, None, id="publish-plus-MQTT-3.3.2-2"),
    pytest.param("30 03 00 01 23", WILDCARD, None, id="publish-hash-MQTT-3.3.2-2"),
    pytest.param("32 07 00 03 61 23 62 00 01", WILDCARD, None, id="publish-hash-inside-level-MQTT-3.3.2-2"),
    pytest.param("30 02 00 00", {"MQTT-4.7.3-1"}, None, id="publish-empty-topic-MQTT-4.7.3-1"),
    pytest.param("32 04 00 00 00 01", {"MQTT-4.7.3-1"}, None, id="publish-qos1-empty-topic-MQTT-4.7.3-1"),
    # ill-formed UTF-8 [MQTT-1.5.3-1] and U+0000 [MQTT-1.5.3-2]
    pytest.param("30 05 00 03 ed a0 80", UTF8, None, id="surrogate-d800-MQTT-1.5.3-1"),
    pytest.param("30 05 00 03 ed bf bf", UTF8, None, id="surrogate-dfff-MQTT-1.5.3-1"),
    pytest.param("30 04 00 02 c0 af", UTF8, None, id="overlong-2-byte-MQTT-1.5.3-1"),
    pytest.param("30 05 00 03 e0 80 af", UTF8, None, id="overlong-3-byte-MQTT-1.5.3-1"),
    pytest.param("30 06 00 04 f0 80 80 af", UTF8, None, id="overlong-4-byte-MQTT-1.5.3-1"),
    pytest.param("30 04 00 02 c0 80", {"MQTT-1.5.3-1", "MQTT-1.5.3-2"}, None, id="overlong-nul-MQTT-1.5.3-1"),
    pytest.param("30 04 00 02 c3 28", UTF8, None, id="bad-continuation-MQTT-1.5.3-1"),
    pytest.param("30 03 00 01 80", UTF8, None, id="lone-continuation-MQTT-1.5.3-1"),
    pytest.param("30 04 00 02 e2 82", UTF8, None, id="truncated-sequence-MQTT-1.5.3-1"),
    pytest.param("30 06 00 04 f4 90 80 80", UTF8, None, id="above-10ffff-MQTT-1.5.3-1"),
    pytest.param("30 03 00 01 ff", UTF8, None, id="byte-ff-MQTT-1.5.3-1"),
    pytest.param("32 07 00 03 ed a0 80 00 01", UTF8, None, id="qos1-surrogate-MQTT-1.5.3-1"),
    pytest.param("30 05 00 03 61 00 62", {"MQTT-1.5.3-2"}, None, id="publish-nul-MQTT-1.5.3-2"),
    pytest.param("32 07 00 03 61 00 62 00 01", {"MQTT-1.5.3-2"}, None, id="publish-qos1-nul-MQTT-1.5.3-2"),
    # truncated and overlong bodies
    pytest.param("30 03 00 05 61", ANY, None, id="publish-topic-overruns"),
    pytest.param("30 01 00", ANY, None, id="publish-no-room-for-topic-length"),
    pytest.param("30 00", ANY, None, id="publish-empty-body"),
    pytest.param("32 03 00 01 61", ANY, None, id="publish-qos1-no-pid"),
    pytest.param("32 04 00 01 61 00", ANY, None, id="publish-qos1-half-pid"),
    pytest.param("40 03 00 01 00", ANY, None, id="puback-extra-byte"),
    pytest.param("40 01 00", ANY, None, id="puback-short"),
    pytest.param("62 03 00 01 00", ANY, None, id="pubrel-extra-byte"),
    pytest.param("c0 01 00", ANY, None, id="pingreq-with-body"),
    pytest.param("e0 01 00", ANY, None, id="disconnect-with-body"),
    pytest.param("20 02 02 00", ANY, None, id="connack-reserved-ack-flags"),
    pytest.param("20 01 00", ANY, None, id="connack-short"),
    pytest.param("90 03 00 01 03", {"MQTT-3.9.3-2"}, None, id="suback-reserved-code-MQTT-3.9.3-2"),
    # remaining length: at most four bytes; fail as soon as the fifth would be needed
    pytest.param("30 ff ff ff ff 7f", ANY, 5, id="remaining-length-5-bytes"),
    pytest.param("30 80 80 80 80 01", ANY, 5, id="remaining-length-5-bytes-zero"),
    # SUBSCRIBE payload
    pytest.param("82 06 00 01 00 01 61 03", {"MQTT-3.8.3-4"}, None, id="subscribe-qos3-MQTT-3-8.3-4"),
    pytest.param("82 06 00 01 00 01 61 04", {"MQTT-3.8.3-4"}, None, id="subscribe-reserved-bit-MQTT-3-8.3-4"),
    pytest.param("82 06 00 01 00 01 61 81", {"MQTT-3.8.3-4"}, None, id="subscribe-reserved-high-MQTT-3-8.3-4"),
    pytest.param(
        "82 0a 00 01 00 01 61 00 00 01 62 fe", {"MQTT-3.8.3-4"}, None, id="subscribe-second-qos-bad-MQTT-3-8.3-4"
    ),
    pytest.param("82 02 00 01", {"MQTT-3.8.3-3"}, None, id="subscribe-no-filter-MQTT-3.8.3-3"),
    pytest.param("82 05 00 01 00 01 61", ANY, None, id="subscribe-missing-qos-byte"),
    pytest.param("82 0a 00 01 00 05 61 2f 23 2f 62 00", {"MQTT-4.7.1-2"}, None, id="filter-hash-middle-MQTT-4.7.1-2"),
    pytest.param("82 07 00 01 00 02 61 23 00", {"MQTT-4.7.1-2"}, None, id="filter-hash-in-level-MQTT-4.7.1-2"),
    pytest.param("82 07 00 01 00 02 23 2f 00", {"MQTT-4.7.1-2"}, None, id="filter-hash-not-last-MQTT-4.7.1-2"),
    pytest.param("82 07 00 01 00 02 61 2b 00", {"MQTT-4.7.1-3"}, None, id="filter-plus-in-level-MQTT-4.7.1-3"),
    pytest.param("82 09 00 01 00 04 2b 61 2f 62 00", {"MQTT-4.7.1-3"}, None, id="filter-plus-prefix-MQTT-4.7.1-3"),
    pytest.param("82 05 00 01 00 00 00", {"MQTT-4.7.3-1"}, None, id="filter-empty-MQTT-4.7.3-1"),
    pytest.param("82 08 00 01 00 03 ed a0 80 00", UTF8, None, id="filter-surrogate-MQTT-1.5.3-1"),
    pytest.param("82 07 00 01 00 02 61 00 00", {"MQTT-1.5.3-2"}, None, id="filter-nul-MQTT-1.5.3-2"),
    # UNSUBSCRIBE payload
    pytest.param("a2 02 00 01", {"MQTT-3.10.3-2"}, None, id="unsubscribe-no-filter-MQTT-3.10.3-2"),
    pytest.param("a2 09 00 01 00 05 61 2f 23 2f 62", {"MQTT-4.7.1-2"}, None, id="unsubscribe-bad-filter-MQTT-4.7.1-2"),
    pytest.param("a2 04 00 01 00 00", {"MQTT-4.7.3-1"}, None, id="unsubscribe-empty-filter-MQTT-4.7.3-1"),
    pytest.param("a2 05 00 01 00 05 61", ANY, None, id="unsubscribe-filter-overruns"),
    # CONNECT
    pytest.param(
        "10 0d 00 04 4d 51 54 58 04 02 00 3c 00 01 63", {"MQTT-3.1.2-1"}, None, id="connect-protocol-name-MQTT-3.1.2-1"
    ),
    pytest.param(
        "10 0d 00 04 6d 71 74 74 04 02 00 3c 00 01 63",
        {"MQTT-3.1.2-1"},
        None,
        id="connect-protocol-name-lowercase-MQTT-3.1.2-1",
    ),
    pytest.param(
        "10 0d 00 04 4d 51 54 54 04 03 00 3c 00 01 63", {"MQTT-3.1.2-3"}, None, id="connect-reserved-flag-MQTT-3.1.2-3"
    ),
    pytest.param(
        "10 0d 00 04 4d 51 54 54 04 0a 00 3c 00 01 63",
        {"MQTT-3.1.2-11", "MQTT-3.1.2-13"},
        None,
        id="connect-will-qos-without-will-MQTT-3.1.2-13",
    ),
    pytest.param(
        "10 0d 00 04 4d 51 54 54 04 12 00 3c 00 01 63",
        {"MQTT-3.1.2-11", "MQTT-3.1.2-13"},
        None,
        id="connect-will-qos2-without-will-MQTT-3.1.2-13",
    ),
    pytest.param(
        "10 0d 00 04 4d 51 54 54 04 22 00 3c 00 01 63",
        {"MQTT-3.1.2-11", "MQTT-3.1.2-15"},
        None,
        id="connect-will-retain-without-will-MQTT-3.1.2-15",
    ),
    pytest.param(
        "10 12 00 04 4d 51 54 54 04 1e 00 3c 00 01 63 00 01 74 00 00",
        {"MQTT-3.1.2-14"},
        None,
        id="connect-will-qos3-MQTT-3.1.2-14",
    ),
    pytest.param(
        "10 10 00 04 4d 51 54 54 04 42 00 3c 00 01 63 00 01 70",
        {"MQTT-3.1.2-22"},
        None,
        id="connect-password-without-user-MQTT-3.1.2-22",
    ),
    pytest.param(
        "10 10 00 04 4d 51 54 54 04 02 00 3c 00 01 63 00 01 75",
        {"MQTT-3.1.3-1", "MQTT-3.1.2-18"},
        None,
        id="connect-unflagged-field-MQTT-3.1.3-1",
    ),
    pytest.param(
        "10 0d 00 04 4d 51 54 54 04 82 00 3c 00 01 63",
        {"MQTT-3.1.2-19", "MQTT-4.8.0-1"},
        None,
        id="connect-user-flag-no-user-MQTT-3.1.2-19",
    ),
    pytest.param(
        "10 0d 00 04 4d 51 54 54 04 06 00 3c 00 01 63",
        {"MQTT-3.1.2-9", "MQTT-4.8.0-1"},
        None,
        id="connect-will-flag-no-will-MQTT-3.1.2-9",
    ),
    pytest.param("10 0c 00 04 4d 51 54 54 04 02 00 3c 00 05 63", ANY, None, id="connect-client-id-overruns"),
    pytest.param(
        "10 0a 00 04 4d 51 54 54 04 02 00 3c",
        {"MQTT-3.1.3-3", "MQTT-4.8.0-1"},
        None,
        id="connect-no-client-id-MQTT-3.1.3-3",
    ),
    pytest.param(
        "10 0f 00 04 4d 51 54 54 04 02 00 3c 00 03 ed a0 80", UTF8, None, id="connect-client-id-surrogate-MQTT-1.5.3-1"
    ),
    pytest.param(
        "10 0e 00 04 4d 51 54 54 04 02 00 3c 00 02 61 00",
        {"MQTT-1.5.3-2"},
        None,
        id="connect-client-id-nul-MQTT-1.5.3-2",
    ),
    pytest.param(
        "10 14 00 04 4d 51 54 54 04 06 00 3c 00 01 63 00 03 61 2f 23 00 00",
        WILDCARD,
        None,
        id="connect-will-topic-wildcard-MQTT-3.3.2-2",
    ),
    pytest.param(
        "10 11 00 04 4d 51 54 54 04 82 00 3c 00 01 63 00 02 c0 80",
        UTF8,
        None,
        id="connect-user-name-overlong-MQTT-1.5.3-1",
    ),
    pytest.param("10 0e 00 04 4d 51 54 54 04 02 00 3c 00 01 63 00", ANY, None, id="connect-stray-byte"),
]


def _check_rule(exc: MalformedPacket, rules) -> None:
    assert exc.rule.startswith("MQTT-")
    assert f"[{exc.rule}]" in str(exc)
    if rules is not None:
        assert exc.rule in rules


@pytest.mark.parametrize("raw, rules, fails_by", MALFORMED)
def test_malformed_whole(raw, rules, fails_by):
    d = Decoder()
    d.feed(h(raw))
    with pytest.raises(MalformedPacket) as info:
        list(d.packets())
    _check_rule(info.value, rules)
    assert d.broken
    with pytest.raises(MalformedPacket):  # unusable afterwards [MQTT-4.8.0-1]
        list(d.packets())


@pytest.mark.parametrize("raw, rules, fails_by", MALFORMED)
def test_malformed_one_byte_at_a_time(raw, rules, fails_by):
    raw = h(raw)
    fails_by = fails_by or len(raw)
    d = Decoder()
    for i in range(fails_by):
        d.feed(raw[i : i + 1])
        try:
            out = list(d.packets())
        except MalformedPacket as exc:
            _check_rule(exc, rules)
            return
        assert out == [], f"yielded {out} from a malformed packet"
    pytest.fail(f"no MalformedPacket after {fails_by} bytes")


@pytest.mark.parametrize("raw, rules, fails_by", MALFORMED)
def test_malformed_with_trailing_data(raw, rules, fails_by):
    d = Decoder()
    d.feed(h(raw) + NEXT)
    got = []
    with pytest.raises(MalformedPacket) as info:
        for packet in d.packets():
            got.append(packet)
    assert got == []
    _check_rule(info.value, rules)


# --------------------------------------------------------------------------- maximum packet size


def test_packet_of_exactly_max_packet_size_is_accepted():
    body = h("00 01 74") + b"p" * 95
    frame = h("30 62") + body  # 2 + 98 = 100 bytes
    assert decode_all(frame + NEXT, max_packet_size=100) == [Publish("t", b"p" * 95), NEXT_PACKET]


def test_packet_over_max_packet_size_whole():
    frame = h("30 63 00 01 74") + b"p" * 96  # 101 bytes
    with pytest.raises(MalformedPacket):
        decode_all(frame, max_packet_size=100)


@pytest.mark.parametrize("header", ["30 63", "82 63", "c0 63", "f0 63"])
def test_packet_over_max_packet_size_fails_on_the_header(header):
    """As soon as the fixed header says too big: the body is never waited for."""
    d = Decoder(max_packet_size=100)
    d.feed(h(header))
    with pytest.raises(MalformedPacket):
        list(d.packets())


def test_packet_over_max_packet_size_multi_byte_header():
    d = Decoder(max_packet_size=1000)
    d.feed(h("30 e6 07"))  # remaining length 998: 1001 bytes in all
    with pytest.raises(MalformedPacket):
        list(d.packets())
    d = Decoder(max_packet_size=1000)
    d.feed(h("30 e5 07"))  # remaining length 997: exactly 1000 bytes, so wait for the body
    assert list(d.packets()) == []


def test_valid_packet_then_oversized_header():
    d = Decoder(max_packet_size=100)
    d.feed(NEXT + h("30 7f"))
    gen = d.packets()
    assert next(gen) == NEXT_PACKET
    with pytest.raises(MalformedPacket):
        next(gen)


def test_partial_length_header_waits():
    d = Decoder(max_packet_size=100)
    d.feed(h("30 80"))  # continuation bit: length not known yet
    assert list(d.packets()) == []
    d.feed(h("01"))  # 128: too big
    with pytest.raises(MalformedPacket):
        list(d.packets())


# --------------------------------------------------------------------------- topic validation


@pytest.mark.parametrize("name", ["a", "/", "a/b", "//", "$SYS/x", "a b", "\u00e9", "\ufeff"])
def test_validate_topic_name_accepts(name):
    validate_topic_name(name)


@pytest.mark.parametrize(
    "name, rules",
    [
        ("", {"MQTT-4.7.3-1"}),
        ("+", WILDCARD),
        ("a/+", WILDCARD),
        ("#", WILDCARD),
        ("a/#", WILDCARD),
        ("a+b", WILDCARD),
        ("a#", WILDCARD),
    ],
)
def test_validate_topic_name_refuses(name, rules):
    """[MQTT-3.3.2-2] [MQTT-4.7.1-1] no wildcards in a topic name; [MQTT-4.7.3-1] not empty."""
    with pytest.raises(MalformedPacket) as info:
        validate_topic_name(name)
    assert info.value.rule in rules


@pytest.mark.parametrize(
    "topic_filter",
    [
        "#",
        "+",
        "a",
        "a/#",
        "a/+",
        "+/+",
        "/+",
        "+/",
        "/#",
        "+/#",
        "a/+/b",
        "$SYS/#",
        "//",
        "/",
    ],
)
def test_validate_topic_filter_accepts(topic_filter):
    validate_topic_filter(topic_filter)


@pytest.mark.parametrize(
    "topic_filter, rule",
    [
        ("", "MQTT-4.7.3-1"),
        ("a/#/b", "MQTT-4.7.1-2"),
        ("#/", "MQTT-4.7.1-2"),
        ("a#", "MQTT-4.7.1-2"),
        ("a/b#", "MQTT-4.7.1-2"),
        ("##", "MQTT-4.7.1-2"),
        ("#/#", "MQTT-4.7.1-2"),
        ("a+", "MQTT-4.7.1-3"),
        ("+a", "MQTT-4.7.1-3"),
        ("a/+b/c", "MQTT-4.7.1-3"),
        ("++", "MQTT-4.7.1-3"),
    ],
)
def test_validate_topic_filter_refuses(topic_filter, rule):
    """[MQTT-4.7.1-2] '#' alone and last; [MQTT-4.7.1-3] '+' a whole level; [MQTT-4.7.3-1] not empty."""
    with pytest.raises(MalformedPacket) as info:
        validate_topic_filter(topic_filter)
    assert info.value.rule == rule


def test_malformed_packet_carries_rule_and_detail():
    exc = MalformedPacket("MQTT-3.3.1-4", "both QoS bits")
    assert exc.rule == "MQTT-3.3.1-4"
    assert exc.detail == "both QoS bits"
    assert str(exc) == "[MQTT-3.3.1-4] both QoS bits"


# --------------------------------------------------------------------------- the first byte alone

# Table 2.2 of the standard: the flags each control packet type must carry; PUBLISH's are
# DUP/QoS/RETAIN, where QoS 3 [MQTT-3.3.1-4] and DUP on QoS 0 [MQTT-3.3.1-2] are malformed.
_SPEC_FLAGS = {1: 0, 2: 0, 4: 0, 5: 0, 6: 2, 7: 0, 8: 2, 9: 0, 10: 2, 11: 0, 12: 0, 13: 0, 14: 0}


def _spec_valid_first_byte(b: int) -> bool:
    ptype, flags = b >> 4, b & 0x0F
    if ptype == 3:
        qos = (flags >> 1) & 3
        return qos != 3 and not (qos == 0 and flags & 8)
    return _SPEC_FLAGS.get(ptype) == flags


@pytest.mark.parametrize("first", range(256), ids=lambda b: f"0x{b:02x}")
def test_bad_first_byte_is_refused_before_its_body_arrives(first):
    """[MQTT-2.2.2-1] reserved types and [MQTT-2.2.2-2] wrong reserved flags close the
    connection as soon as the fixed header's first byte is in: a peer announcing a large
    body is not waited for (issue 13)."""
    d = Decoder()
    d.feed(bytes([first, 0xFF, 0xFF, 0x7F]))  # announces ~2 MB that never come
    if _spec_valid_first_byte(first):
        assert list(d.packets()) == []  # a valid header: waits for the body
    else:
        with pytest.raises(MalformedPacket) as info:
            list(d.packets())
        assert info.value.rule in {
            "MQTT-2.2.2-1",
            "MQTT-2.2.2-2",
            "MQTT-3.3.1-2",
            "MQTT-3.3.1-4",
            "MQTT-3.6.1-1",
            "MQTT-3.8.1-1",
            "MQTT-3.10.1-1",
            "MQTT-3.14.1-1",
        }


def test_bad_first_byte_alone_is_refused():
    d = Decoder()
    d.feed(b"\x61")  # PUBREL with flags 1 instead of 2 [MQTT-3.6.1-1]
    with pytest.raises(MalformedPacket) as info:
        list(d.packets())
    assert info.value.rule == "MQTT-3.6.1-1"


def test_first_byte_peek():
    d = Decoder()
    assert d.first_byte() == -1
    d.feed(b"\x10\x00")
    assert d.first_byte() == 0x10


def test_codec_still_offers_every_packet_name_and_packets_needs_no_codec():
    """codec.py was split: the packet values live in packets.py, reading and writing bytes in
    codec.py, which re-exports the packet names so its callers import from one place."""
    import ast
    import inspect

    from mqttmesh import codec, packets

    for name in packets.__all__:
        assert getattr(codec, name) is getattr(packets, name), name
    assert set(packets.__all__) <= set(codec.__all__)
    imported = {
        node.module for node in ast.walk(ast.parse(inspect.getsource(packets))) if isinstance(node, ast.ImportFrom)
    }
    assert not any("codec" in (m or "") for m in imported)
