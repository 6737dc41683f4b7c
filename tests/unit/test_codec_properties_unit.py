"""Property tests of mqttmesh.codec (the exact bytes are checked in test_codec_unit.py).

1. Any valid packet encodes and decodes back to itself, however the bytes are cut.
2. No byte string makes the decoder raise anything but MalformedPacket, or spin:
   random bytes, plausible headers with random bodies, and mutated valid packets.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mqttmesh.codec import (
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
)
from mqttmesh.packets import _Packet  # the common base: everything the decoder may yield
from support import mqttraw

pytestmark = pytest.mark.timeout(60)  # a decoder that loops forever fails here, not in CI's global limit

PROPS = settings(max_examples=300, deadline=1000, suppress_health_check=[HealthCheck.too_slow])

# strings: no surrogates (not encodable), no U+0000 [MQTT-1.5.3-2]
_chars = st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00")
text = st.text(_chars, max_size=12)
topic_names = st.text(
    st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00+#"), min_size=1, max_size=16
)
pids = st.integers(1, 65535)
_levels = st.sampled_from(["a", "b", "", "$x", "\u00e9", "+", "long-level"])


@st.composite
def topic_filters(draw):
    levels = draw(st.lists(_levels, min_size=1, max_size=4))
    if draw(st.booleans()):
        levels.append("#")
    result = "/".join(levels)
    return result or "#"


@st.composite
def publishes(draw):
    qos = draw(st.integers(0, 2))
    return Publish(
        draw(topic_names),
        draw(st.binary(max_size=300)),
        qos,
        draw(st.booleans()),
        draw(st.booleans()) if qos else False,
        draw(pids) if qos else None,
    )


@st.composite
def connects(draw):
    will = None
    if draw(st.booleans()):
        will = Will(draw(topic_names), draw(st.binary(max_size=20)), draw(st.integers(0, 2)), draw(st.booleans()))
    username = draw(st.none() | text)
    password = draw(st.none() | st.binary(max_size=20)) if username is not None else None
    return Connect(draw(text), draw(st.booleans()), draw(st.integers(0, 65535)), will, username, password)


packets = st.one_of(
    connects(),
    st.builds(ConnAck, st.booleans(), st.integers(0, 255)),
    publishes(),
    st.builds(PubAck, pids),
    st.builds(PubRec, pids),
    st.builds(PubRel, pids),
    st.builds(PubComp, pids),
    st.builds(Subscribe, pids, st.lists(st.tuples(topic_filters(), st.integers(0, 2)), min_size=1, max_size=4)),
    st.builds(SubAck, pids, st.lists(st.sampled_from([0, 1, 2, 0x80]), min_size=1, max_size=4)),
    st.builds(Unsubscribe, pids, st.lists(topic_filters(), min_size=1, max_size=4)),
    st.builds(UnsubAck, pids),
    st.just(PingReq()),
    st.just(PingResp()),
    st.just(Disconnect()),
)


def _feed_in_pieces(data: bytes, cuts: list[int], **kw) -> list:
    d = Decoder(**kw)
    out = []
    last = 0
    for cut in sorted(set(cuts)) + [len(data)]:
        d.feed(data[last:cut])
        last = cut
        out += list(d.packets())
    assert d.buffered == 0
    return out


@PROPS
@given(st.lists(packets, min_size=1, max_size=4), st.data())
def test_encode_decode_identity(pkts, data):
    raw = b"".join(encode(p) for p in pkts)
    cuts = data.draw(st.lists(st.integers(0, len(raw)), max_size=6))
    assert _feed_in_pieces(raw, cuts) == pkts


def _mqttraw_bytes(p) -> bytes:
    """The same packet built by tests/support/mqttraw.py, which shares no code with our codec."""
    if isinstance(p, Connect):
        will = None if p.will is None else (p.will.topic, p.will.payload, p.will.qos, p.will.retain)
        return mqttraw.connect(p.client_id, p.clean_session, p.keepalive, will, p.username, p.password)
    if isinstance(p, Publish):
        return mqttraw.publish(p.topic, p.payload, p.qos, p.retain, p.dup, p.packet_id)
    if isinstance(p, Subscribe):
        return mqttraw.subscribe(p.packet_id, *p.topics)
    if isinstance(p, Unsubscribe):
        return mqttraw.unsubscribe(p.packet_id, *p.filters)
    builder = {PubAck: mqttraw.puback, PubRec: mqttraw.pubrec, PubRel: mqttraw.pubrel, PubComp: mqttraw.pubcomp}
    return builder[type(p)](p.packet_id)


@PROPS
@given(
    st.one_of(
        connects(),
        publishes(),
        st.builds(Subscribe, pids, st.lists(st.tuples(topic_filters(), st.integers(0, 2)), min_size=1, max_size=40)),
        st.builds(Unsubscribe, pids, st.lists(topic_filters(), min_size=1, max_size=40)),
        st.builds(PubAck, pids),
        st.builds(PubRec, pids),
        st.builds(PubRel, pids),
        st.builds(PubComp, pids),
    )
)
def test_encode_agrees_with_mqttraw(pkt):
    """A second, independent source of exact bytes: a bug mirrored in encoder and decoder shows here."""
    raw = _mqttraw_bytes(pkt)
    assert encode(pkt) == raw
    d = Decoder()
    d.feed(raw)
    assert list(d.packets()) == [pkt]


def _decode_only_malformed(chunks: list[bytes], max_packet_size: int) -> None:
    d = Decoder(max_packet_size)
    total = 0
    yielded = 0
    for chunk in chunks:
        d.feed(chunk)
        total += len(chunk)
        try:
            for packet in d.packets():
                assert isinstance(packet, _Packet)
                yielded += 1
                assert yielded <= total // 2, "more packets than a 2-byte minimum allows"
        except MalformedPacket as exc:
            assert exc.rule.startswith("MQTT-")
            assert d.broken
            return
    assert d.buffered <= total


sizes = st.sampled_from([16, 100, 1000, 268_435_460])


@PROPS
@given(st.lists(st.binary(max_size=64), min_size=1, max_size=5), sizes)
def test_random_bytes_raise_only_malformed_packet(chunks, max_packet_size):
    _decode_only_malformed(chunks, max_packet_size)


@st.composite
def plausible_frames(draw):
    """A random first byte and a remaining length that fits a random body."""
    body = draw(st.binary(max_size=40))
    first = draw(st.integers(0, 255))
    return bytes([first, len(body)]) + body


@PROPS
@given(st.lists(plausible_frames(), min_size=1, max_size=6), st.data())
def test_plausible_frames_raise_only_malformed_packet(frames, data):
    raw = b"".join(frames)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(raw)), max_size=4)))
    chunks = [raw[a:b] for a, b in zip([0] + cuts, cuts + [len(raw)], strict=False)]
    _decode_only_malformed(chunks, 1000)


@PROPS
@given(
    packets,
    st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), min_size=1, max_size=4),
    st.sampled_from(["replace", "insert", "delete"]),
)
def test_mutated_packets_raise_only_malformed_packet(pkt, edits, how):
    raw = bytearray(encode(pkt))
    for pos, value in edits:
        pos %= len(raw) + (how == "insert")
        if how == "replace" and pos < len(raw):
            raw[pos] = value
        elif how == "insert":
            raw.insert(pos, value)
        elif how == "delete" and len(raw) > 1 and pos < len(raw):
            del raw[pos]
    _decode_only_malformed([bytes(raw), encode(PingReq())], 268_435_460)
