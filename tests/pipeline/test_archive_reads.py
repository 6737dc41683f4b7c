"""Captured reads (archive/reads.py): messages taken back out of the bytes a client sent.

The unit tests build the reads with the independent byte builder (tests/support/mqttraw.py) and
work the expected seqs out by hand. The broker tests send several packets in one write,
among them packets that are not messages (a `$` topic, a QoS 2 re-send, a PINGREQ, a
protocol error), and compare the archive with what the subscriber and the delivery log saw.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("pyarrow.parquet")

from mqttmesh.archive.reads import ReadError, messages  # noqa: E402
from mqttmesh.archive.writer import reads_array  # noqa: E402
from support import mqttraw as raw
from support.mesh import Subscriber
from support.pipeline import archive_flags, read_archive

S = 1 << 40  # a seq with more than 32 bits, like the broker's (incarnation << 28)


def publishes(data, segments, skips, count: int) -> list[tuple[int, int, bytes, bytes]]:
    """(seq, first byte, topic bytes, payload) of each message of one read, in order."""
    m = messages([("", 0.0, len(data), segments, skips, count)], data)
    return [(int(m.seq[i]), int(m.first[i]), m.topic(i), m.payload(i)) for i in range(len(m.seq))]


def apart(reads):
    """Read records as the node holds them (with their bytes) -> as the writer gets them:
    sizes in the records, the bytes one after the other (archive/wire.py)."""
    return [(p, t, len(d), segments, skips, n) for p, t, d, segments, skips, n in reads], b"".join(r[2] for r in reads)


def test_every_publish_of_a_read_gets_its_seq_topic_flags_and_payload():
    long_payload = bytes(range(256)) * 2  # 512 bytes: a two-byte remaining length
    data = (
        raw.publish("a/1", b"x")
        + raw.PINGREQ_BYTES
        + raw.publish("a/2", b"yy", qos=1, retain=True, pid=7)
        + raw.puback(3)
        + raw.publish("a/3", long_payload, qos=2, pid=8)
        + raw.publish("a/4", b"")
    )
    got = publishes(data, [(0, S)], [], 4)
    assert got == [
        (S, 0x30, b"a/1", b"x"),
        (S + 1, 0x33, b"a/2", b"yy"),
        (S + 2, 0x34, b"a/3", long_payload),
        (S + 3, 0x30, b"a/4", b""),
    ]


def test_skips_and_gaps_number_the_messages_as_the_broker_did():
    data = b"".join(raw.publish(f"t/{i}", b"%d" % i) for i in range(7))
    # ordinal 1 was refused ($ topic), 4 was a QoS 2 re-send; ordinal 3 came after somebody
    # else took seqs S+2..S+9; the read's last packet (6) was never handled
    got = publishes(data, [(0, S), (2, S + 1), (3, S + 10), (5, S + 11)], [1, 4], 6)
    assert [(seq, topic) for seq, _, topic, _ in got] == [
        (S, b"t/0"),
        (S + 1, b"t/2"),
        (S + 10, b"t/3"),
        (S + 11, b"t/5"),
    ]


def test_reads_become_the_records_the_message_hook_would_have_made():
    a = raw.publish("s/1", b"p1", qos=1, pid=1) + raw.publish("s/2", b"p2", retain=True)
    b = raw.publish("s/3", "é".encode(), qos=2, pid=2)
    reads = [("dev-a", 1000.25, a, [(0, S)], [], 2), ("dev-b", 1001.5, b, [(0, S + 5)], [], 1)]
    m = messages(*apart(reads))
    assert m.timestamp.tolist() == [1000.25, 1000.25, 1001.5]
    assert m.seq.tolist() == [S, S + 1, S + 5]
    assert [m.publishers[i] for i in m.publisher] == ["dev-a", "dev-a", "dev-b"]
    assert m.first.tolist() == [0x32, 0x31, 0x34]
    assert [m.topic(i) for i in range(3)] == [b"s/1", b"s/2", b"s/3"]
    assert [m.payload(i) for i in range(3)] == [b"p1", b"p2", "é".encode()]
    array = reads_array(*apart(reads))
    array.validate(full=True)
    assert array.to_pylist() == [
        {
            "timestamp": 1000.25,
            "seq": S,
            "publisher": "dev-a",
            "topic": "s/1",
            "qos": 1,
            "retain": False,
            "payload": b"p1",
        },
        {
            "timestamp": 1000.25,
            "seq": S + 1,
            "publisher": "dev-a",
            "topic": "s/2",
            "qos": 0,
            "retain": True,
            "payload": b"p2",
        },
        {
            "timestamp": 1001.5,
            "seq": S + 5,
            "publisher": "dev-b",
            "topic": "s/3",
            "qos": 2,
            "retain": False,
            "payload": "é".encode(),
        },
    ]


def test_publish_packets_after_the_handled_ones_are_no_messages_in_any_read_of_a_list():
    # read 0: three PUBLISH packets, the broker handled two; read 1 starts with a PUBACK,
    # then one message; read 2 handled both, the first one refused
    r0 = raw.publish("a/0", b"0") + raw.publish("a/1", b"1", qos=1, pid=9) + raw.publish("a/x", b"never")
    r1 = raw.puback(4) + raw.publish("b/0", b"2")
    r2 = raw.publish("$c", b"refused") + raw.publish("c/1", b"3")
    m = messages(
        *apart(
            [("p", 1.0, r0, [(0, S)], [], 2), ("q", 2.0, r1, [(0, S + 7)], [], 1), ("p", 3.0, r2, [(1, S + 8)], [0], 2)]
        )
    )
    assert m.seq.tolist() == [S, S + 1, S + 7, S + 8]
    assert [m.topic(i) for i in range(4)] == [b"a/0", b"a/1", b"b/0", b"c/1"]
    assert [m.payload(i) for i in range(4)] == [b"0", b"1", b"2", b"3"]
    assert m.timestamp.tolist() == [1.0, 1.0, 2.0, 3.0]
    assert m.publishers == ["p", "q"] and m.publisher.tolist() == [0, 0, 1, 0]


_packets = st.lists(
    st.one_of(
        st.tuples(
            st.just("publish"),
            st.text(st.characters(min_codepoint=32, max_codepoint=0x2FF), min_size=1, max_size=20),
            st.binary(max_size=300),
            st.integers(0, 2),
            st.booleans(),
            st.booleans(),
        ),
        st.tuples(st.just("other"), st.sampled_from([raw.PINGREQ_BYTES, raw.puback(1), raw.pubrel(2)])),
    ),
    max_size=12,
)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(_packets, st.integers(0, 3), st.data()), min_size=1, max_size=5))
def test_any_list_of_reads_gives_back_the_messages_it_was_built_from(reads_spec):
    """Reads built from generated packets (long payloads take 2-byte remaining lengths);
    each read handles all but its last ``cut`` PUBLISH packets and refuses some: the
    expected messages and seqs come from the generated values, not from parsing."""
    reads, expected = [], []
    seq = S
    for r, (packets, cut, data) in enumerate(reads_spec):
        body, ordinal, publishes_in_read = b"", 0, []
        for p in packets:
            if p[0] == "publish":
                _, topic, payload, qos, retain, dup = p
                body += raw.publish(topic, payload, qos, retain, dup and qos > 0, pid=ordinal + 1 if qos else None)
                publishes_in_read.append((topic.encode(), payload, qos, retain, dup and qos > 0))
                ordinal += 1
            else:
                body += p[1]
        count = max(0, len(publishes_in_read) - cut)
        skips = sorted(data.draw(st.sets(st.integers(0, count - 1), max_size=count) if count else st.just(set())))
        segments = []
        for o in range(count):
            if o in skips:
                continue
            if not segments or o - 1 in skips or data.draw(st.booleans()):  # a new segment: a gap
                seq += data.draw(st.integers(1, 3))
                segments.append((o, seq))
            else:
                seq += 1
            topic, payload, qos, retain, dup = publishes_in_read[o]
            first = 0x30 | (qos << 1) | int(retain) | (8 if dup else 0)
            expected.append((float(r), seq, f"c{r % 2}", topic, first, payload))
        if count > len(skips) or not body:
            reads.append((f"c{r % 2}", float(r), body or raw.PINGREQ_BYTES, segments, skips, count))
    if not reads:
        return
    m = messages(*apart(reads))
    got = [
        (m.timestamp[i], m.seq[i], m.publishers[m.publisher[i]], m.topic(i), m.first[i], m.payload(i))
        for i in range(len(m.seq))
    ]
    assert got == expected
    array = reads_array(*apart(reads))
    array.validate(full=True)
    assert array.field("payload").to_pylist() == [e[5] for e in expected]
    assert array.field("topic").to_pylist() == [e[3].decode() for e in expected]


@pytest.mark.parametrize(
    "data, segments, skips, count, message",
    [
        (raw.publish("a", b"1")[:-1], [(0, S)], [], 1, "overruns"),
        (raw.publish("a", b"1")[:1], [(0, S)], [], 1, "overruns"),
        (raw.publish("a", b"1"), [(0, S)], [], 2, "ends after 1 of 2"),
        (raw.publish("a", b"1") + raw.publish("b", b"2"), [(0, S), (1, S + 1)], [1], 2, "is a skip"),
        (raw.publish("a", b"1") + raw.publish("b", b"2"), [(0, S)], [1, 1], 2, "not distinct"),
        (raw.publish("a", b"1"), [], [], 1, "numbered"),
        (b"\x30\xff\xff\xff\xff\x01", [(0, S)], [], 1, "bad fixed header"),
        (b"\x30\x01\x00", [(0, S)], [], 1, "too short for its topic length"),
        (b"\x30\x03\x00\x05a", [(0, S)], [], 1, "topic overruns the packet"),
        (b"\x32\x04\x00\x01ab", [(0, S)], [], 1, "topic overruns the packet"),  # QoS 1 without its packet id
    ],
)
def test_reads_that_do_not_fit_together_are_refused_by_name(data, segments, skips, count, message):
    with pytest.raises(ReadError, match=message):
        messages(*apart([("c", 1.0, data, segments, skips, count)]))


def test_a_packet_across_two_reads_is_refused_by_the_read_it_overruns():
    whole = raw.publish("a", b"1") + raw.publish("b", b"2")
    with pytest.raises(ReadError, match="read 0: its last packet overruns"):
        messages(*apart([("c", 1.0, whole[:-3], [(0, S)], [], 2), ("c", 2.0, whole[-3:], [(0, S + 2)], [], 1)]))


def test_reads_and_bytes_that_do_not_add_up_are_refused():
    with pytest.raises(ReadError, match="add up to 5 bytes, not the 4 given"):
        messages([("c", 1.0, 5, [(0, S)], [], 1)], raw.publish("a", b"1")[:4])


# -- through a broker -------------------------------------------------------------------------------


@pytest.mark.process
def test_packets_that_are_no_message_leave_the_others_archived_with_the_seqs_they_were_delivered_with(
    broker_factory, tmp_path
):
    archive = tmp_path / "archive"
    node = broker_factory(*archive_flags(archive, "--archive-delivery-log", "true"), name="n1")
    sub = Subscriber(node, "sub", "t/#", qos=2)
    with raw.RawClient(node.host, node.port) as c:
        c.connect(client_id="dev")
        big = b"B" * 300
        c.send(
            raw.publish("t/1", b"a")
            + raw.publish("$x/y", b"refused")
            + raw.publish("t/2", b"b", 1, True, pid=1)
            + raw.publish("t/3", b"c", 2, pid=2)
            + raw.publish("t/3", b"c", 2, dup=True, pid=2)
            + raw.PINGREQ_BYTES
            + raw.publish("t/4", big)
        )
        assert c.expect(raw.PUBACK).packet_id == 1
        assert c.expect(raw.PUBREC).packet_id == 2
        assert c.expect(raw.PUBREC).packet_id == 2
        c.expect(raw.PINGRESP)
        c.send(raw.pubrel(2))
        assert c.expect(raw.PUBCOMP).packet_id == 2
        c.send(raw.DISCONNECT_BYTES)
    sub.wait_count(4)
    sub.close()
    assert node.stop() == 0
    rows = read_archive(archive)
    assert [(r["topic"], r["payload"], r["qos"], r["retain"], r["publisher"]) for r in rows] == [
        ("t/1", b"a", 0, False, "dev"),
        ("t/2", b"b", 1, True, "dev"),
        ("t/3", b"c", 2, False, "dev"),
        ("t/4", big, 0, False, "dev"),
    ]
    seqs = [r["seq"] for r in rows]
    assert seqs == sorted(set(seqs))
    delivered = [d["msg_id"] for d in sorted(read_archive(archive, "delivery"), key=lambda d: d["log_seq"])]
    assert delivered == [r["msg_id"] for r in rows]  # the audit's join holds message by message
    assert sorted(sub.received) == [
        ("t/1", b"a", 0, False),
        ("t/2", b"b", 1, False),
        ("t/3", b"c", 2, False),
        ("t/4", big, 0, False),
    ]


@pytest.mark.process
def test_a_read_cut_short_by_a_protocol_error_archives_what_was_handled_and_the_will(broker_factory, tmp_path):
    archive = tmp_path / "archive"
    node = broker_factory(*archive_flags(archive), name="n1")
    sub = Subscriber(node, "sub", "#", qos=1)
    with raw.RawClient(node.host, node.port) as c:
        c.connect(client_id="dev", will=("will/dev", b"gone", 1, False))
        c.send(
            raw.publish("t/1", b"1")
            + raw.publish("t/2", b"2", 1, pid=1)
            + raw.packet(0x36, raw.s("t/3") + b"\x00\x02" + b"3")  # QoS 3: malformed [MQTT-3.3.1-4]
            + raw.publish("t/4", b"4")
        )
        c.expect(raw.PUBACK)
        c.expect_closed()
    sub.wait_count(3)
    sub.close()
    assert node.stop() == 0
    rows = read_archive(archive)
    assert sorted((r["topic"], r["payload"]) for r in rows) == [("t/1", b"1"), ("t/2", b"2"), ("will/dev", b"gone")]
    assert len({r["seq"] for r in rows}) == 3
    assert sorted(p for _, p, _, _ in sub.received) == [b"1", b"2", b"gone"]
