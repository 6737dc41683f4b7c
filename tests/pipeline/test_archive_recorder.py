"""The archive's pure parts: the recorder's hooks, chunks, limits and counters; file layout; the pipe."""

from __future__ import annotations

import marshal
import struct

import pytest

from mqttmesh.archive.recorder import ArchiveLimits, Chunk, Recorder, file_name, hour_of, partition_dir, topic_filter
from mqttmesh.archive.schema import DELIVERY, PUBLISH, schema_markdown
from mqttmesh.archive.wire import FrameReader, WireError, decode_report, encode_chunk, encode_report
from mqttmesh.message import Message


def msg(topic="a/b", payload=b"xy", qos=1, retain=False, seq=7, publisher="pub", ts=1000.5, origin="n1"):
    return Message(topic, payload, qos, retain, origin, seq, publisher, ts)


class Session:
    def __init__(self, client_id):
        self.client_id = client_id


class Rig:
    """A recorder whose chunks land in a list, with a clock the test moves."""

    def __init__(self, delivery_log=False, filters=("#",), **limits):
        self.chunks = []
        self.now = 50.0
        self.rec = Recorder(ArchiveLimits(**limits), self.chunks.append, lambda: self.now, filters, delivery_log)

    def done(self, chunk, written=None):
        n = len(chunk.rows)
        self.rec.rows_done(chunk.kind, n, chunk.nbytes, n if written is None else written, 0, 1, 100)


def test_a_publish_record_is_the_messages_values_in_the_documented_order():
    r = Rig()
    r.rec.publish_hook(msg(topic="t/1", payload=b"hello", qos=2, retain=True, seq=42, publisher="dev-1", ts=12.25))
    r.rec.flush()
    assert len(r.chunks) == 1
    c = r.chunks[0]
    assert (c.kind, c.first, c.nbytes) == (PUBLISH, 0, 5)
    assert c.rows == [(12.25, 42, "dev-1", "t/1", 2, True, b"hello")]


def test_a_delivery_record_carries_the_clock_the_client_and_the_message_id():
    r = Rig(delivery_log=True)
    r.now = 77.5
    r.rec.delivery_hook(Session("sub-1"), msg(topic="t/9", seq=9, origin="n2", ts=70.0), 1, True)
    r.rec.flush()
    assert [c.kind for c in r.chunks] == [DELIVERY]
    assert r.chunks[0].rows == [(77.5, "n2", 9, "t/9", 70.0, "sub-1", 1, True)]
    assert r.chunks[0].nbytes == 0  # a delivery record holds no payload


def test_deliveries_on_dollar_topics_are_not_logged():
    r = Rig(delivery_log=True)
    r.rec.delivery_hook(Session("$mesh-n2"), msg(topic="$mesh/to/n2/fwd"), 1, False)
    r.rec.delivery_hook(Session("sys-watcher"), msg(topic="$SYS/broker/uptime"), 0, False)
    r.rec.flush()
    assert r.chunks == []


def test_no_delivery_hook_unless_the_delivery_log_is_on():
    assert Rig().rec.delivery_hook is None


def test_a_message_under_another_nodes_id_is_the_same_record_with_its_origin_beside_it():
    """Mostly a message archived here was published here: its record has no origin (the
    writer names the node). One this node routes under another node's id (Broker.publish
    picks it: an agreed id, a dead node's client's will) has the same record, and its
    origin goes into the chunk's ``origins`` by the record's position."""
    r = Rig()
    r.rec.publish_hook(msg(seq=1))
    r.rec.other_origin_hook(msg(seq=900, origin="n0", publisher="moved", topic="t/q2", qos=2))
    r.rec.publish_hook(msg(seq=2))
    r.rec.flush()
    (chunk,) = r.chunks
    assert chunk.rows == [
        (1000.5, 1, "pub", "a/b", 1, False, b"xy"),
        (1000.5, 900, "moved", "t/q2", 2, False, b"xy"),
        (1000.5, 2, "pub", "a/b", 1, False, b"xy"),
    ]
    assert chunk.origins == [(1, "n0")]
    r.rec.publish_hook(msg(seq=3))  # the common case: a chunk with none
    r.rec.flush()
    assert r.chunks[1].origins == () and r.chunks[1].rows[0][1] == 3


def test_origins_follow_their_records_into_the_next_chunk_and_a_dropped_one_leaves_none():
    r = Rig(flush_rows=2, max_queue_rows=4)
    r.rec.publish_hook(msg(seq=1))
    r.rec.publish_hook(msg(seq=2))
    r.rec.other_origin_hook(msg(seq=3, origin="n0"))  # cuts [1, 2], then is the first of the next
    r.rec.other_origin_hook(msg(seq=4, origin="n5"))
    r.rec.publish_hook(msg(seq=5))  # cuts [3, 4]
    got = [(c.origins, [row[1] for row in c.rows]) for c in r.chunks]
    assert got == [((), [1, 2]), ([(0, "n0"), (1, "n5")], [3, 4])]
    r.rec.other_origin_hook(msg(seq=6, origin="n0"))
    r.rec.other_origin_hook(msg(seq=7, origin="n0"))  # the queue is full (4): dropped, counted
    assert r.rec.dropped[PUBLISH] == 1
    r.rec.flush()
    assert (r.chunks[2].origins, [row[1] for row in r.chunks[2].rows]) == ([(1, "n0")], [5, 6])


def test_topic_filters_apply_to_messages_under_another_nodes_id_too():
    r = Rig(filters=("t/#",))
    r.rec.other_origin_hook(msg(topic="u/1", origin="n0"))
    r.rec.other_origin_hook(msg(topic="t/1", origin="n0", seq=8))
    r.rec.flush()
    assert [(c.origins, [row[1] for row in c.rows]) for c in r.chunks] == [([(0, "n0")], [8])]


def test_chunks_are_cut_by_rows_and_number_their_first_record():
    r = Rig(flush_rows=3, max_queue_rows=100)
    for i in range(7):
        r.rec.publish_hook(msg(seq=i))
    # chunk_rows = min(4096, flush_rows) = 3: two chunks cut, one record still buffered
    assert [len(c.rows) for c in r.chunks] == [3, 3]
    assert [c.first for c in r.chunks] == [0, 3]
    assert [row[1] for row in r.chunks[1].rows] == [3, 4, 5]
    assert r.rec.pending() == 1
    r.rec.flush()
    assert [c.first for c in r.chunks] == [0, 3, 6]


def test_chunks_are_cut_by_payload_bytes():
    r = Rig(flush_bytes=1024, max_queue_bytes=1 << 20)
    r.rec.publish_hook(msg(payload=b"x" * 1000))
    r.rec.publish_hook(msg(payload=b"x" * 100))  # 1100 bytes buffered, over 1024: the next one cuts
    assert r.chunks == []
    r.rec.publish_hook(msg(payload=b"x"))
    assert [(len(c.rows), c.nbytes) for c in r.chunks] == [(2, 1100)]


def test_tick_cuts_only_what_already_waited_one_tick():
    r = Rig()
    r.rec.publish_hook(msg(seq=1))
    r.rec.tick()  # the record arrived after the previous tick: it stays
    assert r.chunks == []
    r.rec.publish_hook(msg(seq=2))
    r.rec.tick()  # it was there at the last tick: cut, with what came since
    assert [[row[1] for row in c.rows] for c in r.chunks] == [[1, 2]]
    r.rec.tick()
    assert len(r.chunks) == 1  # nothing buffered, nothing cut


def test_a_full_queue_drops_and_counts_new_records_and_never_waits():
    r = Rig(flush_rows=2, max_queue_rows=4)
    for i in range(9):
        r.rec.publish_hook(msg(seq=i))
    # two chunks of 2 fill the queue (4); the buffer fills up to 2; the next 3 are dropped
    assert [len(c.rows) for c in r.chunks] == [2, 2]
    assert r.rec.pending() == 2
    assert r.rec.dropped[PUBLISH] == 3
    assert r.rec.queued() == (4, 8)
    assert r.rec.take_drops() == 3 and r.rec.take_drops() == 0
    r.done(r.chunks[0])  # the writer finished one chunk: room for another
    r.rec.publish_hook(msg(seq=100))
    assert [len(c.rows) for c in r.chunks] == [2, 2, 2]
    assert r.rec.dropped[PUBLISH] == 3


def test_flush_at_stop_hands_over_everything_whatever_the_queue_holds():
    r = Rig(flush_rows=2, max_queue_rows=4)
    for i in range(6):
        r.rec.publish_hook(msg(seq=i))
    r.rec.flush()
    assert sum(len(c.rows) for c in r.chunks) == 6 - r.rec.dropped[PUBLISH]
    assert r.rec.pending() == 0


def test_counters_follow_the_writers_reports_and_a_lost_writer():
    r = Rig(flush_rows=2, max_queue_rows=10)
    for i in range(5):
        r.rec.publish_hook(msg(seq=i))
    r.rec.flush()
    r.done(r.chunks[0])
    s = r.rec.stats()
    assert (s["publish/written"], s["files"], s["bytes"], s["queued"]) == (2, 1, 100, 3)
    assert r.rec.abandon_queued() == 3
    s = r.rec.stats()
    assert (s["publish/written"], s["publish/failed"], s["queued"], s["queued_bytes"]) == (2, 3, 0, 0)


def test_topic_filters_choose_what_is_recorded():
    r = Rig(filters=("keep/#", "also/+"), delivery_log=True)
    for t in ("keep", "keep/x/y", "also/1", "also/1/2", "drop/x"):
        r.rec.publish_hook(msg(topic=t))
        r.rec.delivery_hook(Session("s"), msg(topic=t), 0, False)
    r.rec.flush()
    by_kind = {c.kind: c for c in r.chunks}
    assert [row[3] for row in by_kind[PUBLISH].rows] == ["keep", "keep/x/y", "also/1"]
    assert [row[3] for row in by_kind[DELIVERY].rows] == ["keep", "keep/x/y", "also/1"]


def test_topic_filter_rejects_what_is_not_a_filter():
    assert topic_filter(["#"]) is None
    with pytest.raises(ValueError, match="a/#/b"):
        topic_filter(["a/#/b"])
    with pytest.raises(ValueError, match="no topic filter"):
        topic_filter([])


def test_limits_that_cannot_work_are_named():
    assert ArchiveLimits().problems() == []
    problems = ArchiveLimits(flush_rows=100, max_queue_rows=150, flush_bytes=4096, max_queue_bytes=4096).problems()
    assert len(problems) == 2
    assert problems[0].startswith("max_queue_rows (150) must be at least twice flush_rows (100)")
    assert problems[1].startswith("max_queue_bytes (4096) must be at least twice flush_bytes (4096)")


def test_partitions_and_file_names():
    # 2026-01-31T13:59:59Z and 14:00:00Z
    assert hour_of(1769867999.9) == 491629 and hour_of(1769868000.0) == 491630
    assert partition_dir(PUBLISH, 491629) == "publish/date=2026-01-31/hour=13"
    assert partition_dir(DELIVERY, 491630) == "delivery/date=2026-01-31/hour=14"
    assert file_name("n1", 1769868000, 7) == "n1-1769868000-000007.parquet"
    assert file_name("127.0.0.1-1883", 5, 1) == "127.0.0.1-1883-5-000001.parquet"
    assert file_name("a/b c", 5, 1) == "a_b_c-5-000001.parquet"  # a node id is not a path
    assert file_name("n1", "5.2", 3) == "n1-5.2-000003.parquet"  # the writer's third start


def test_schema_markdown_lists_every_column():
    text = schema_markdown()
    for name in (
        "timestamp",
        "msg_id",
        "origin",
        "seq",
        "publisher",
        "topic",
        "qos",
        "retain",
        "payload",
        "payload_size",
        "published",
        "node",
        "client_id",
        "dup",
        "log_seq",
    ):
        assert f"| `{name}` |" in text


# -- the pipe -------------------------------------------------------------------------------------


def _frame(kind, first, nbytes, rows, reads=False, data=b"", origins=()) -> bytes:
    """A frame built by hand from the documented layout, not by encode_chunk."""
    meta = marshal.dumps((kind, first, nbytes, rows, len(rows), reads, origins))
    return b"MQAR" + struct.pack(">II", len(meta), len(data)) + meta + data


def test_frames_decode_whole_byte_by_byte_and_with_a_partial_tail():
    rows = [(1.5, 9, "p", "t", 1, False, b"\x00\xff")]
    data = _frame(PUBLISH, 3, 2, rows) + _frame(DELIVERY, 0, 0, [(2.0, "n", 1, "t", 1.0, "c", 0, False)])
    whole = FrameReader()
    whole.feed(data)
    got = [(c.kind, c.first, c.nbytes, c.rows) for c in whole.chunks()]
    assert got == [(PUBLISH, 3, 2, rows), (DELIVERY, 0, 0, [(2.0, "n", 1, "t", 1.0, "c", 0, False)])]
    slow = FrameReader()
    seen = []
    for i in range(len(data)):
        slow.feed(data[i : i + 1])
        seen += [(c.kind, c.first) for c in slow.chunks()]
    assert seen == [(PUBLISH, 3), (DELIVERY, 0)]
    tail = FrameReader()
    tail.feed(data[:-1])
    assert [c.kind for c in tail.chunks()] == [PUBLISH]
    assert tail.buffered == len(_frame(DELIVERY, 0, 0, [(2.0, "n", 1, "t", 1.0, "c", 0, False)])) - 1


def test_encode_chunk_writes_the_documented_layout():
    r = Rig()
    r.rec.publish_hook(msg(seq=5, payload=b"p"))
    r.rec.flush()
    data = b"".join(encode_chunk(r.chunks[0]))
    magic, meta, size = struct.unpack(">4sII", data[:12])  # read back by hand, not by FrameReader
    assert (magic, meta, size) == (b"MQAR", len(data) - 12, 0)
    assert marshal.loads(data[12:]) == (PUBLISH, 0, 1, [(1000.5, 5, "pub", "a/b", 1, False, b"p")], 1, False, ())


def test_origins_travel_in_the_frame_and_come_out_as_they_went_in():
    rows = [(1.5, 9, "p", "t", 2, False, b"a"), (1.5, 77, "q", "t", 2, False, b"b")]
    reader = FrameReader()
    reader.feed(_frame(PUBLISH, 0, 2, rows, origins=[(1, "n0")]))
    (chunk,) = reader.chunks()
    assert chunk.rows == rows and chunk.origins == [(1, "n0")]
    r = Rig()
    r.rec.other_origin_hook(msg(seq=5, origin="n0"))
    r.rec.flush()
    meta = b"".join(encode_chunk(r.chunks[0]))[12:]
    assert marshal.loads(meta)[6] == [(0, "n0")]


def test_captured_reads_travel_with_their_bytes_after_the_records():
    reads = [("dev", 5.0, b"\x30\x04\x00\x01ax", [(0, 9)], [], 1), ("dev", 6.0, bytearray(b"\xc0\x00"), [], [], 0)]
    frame = b"".join(encode_chunk(Chunk(PUBLISH, reads, 8, 0, 1, reads=True)))
    magic, meta, size = struct.unpack(">4sII", frame[:12])
    assert (magic, size) == (b"MQAR", 8)
    assert marshal.loads(frame[12 : 12 + meta]) == (
        PUBLISH,
        0,
        8,
        [("dev", 5.0, 6, [(0, 9)], [], 1), ("dev", 6.0, 2, [], [], 0)],
        1,
        True,
        (),
    )
    assert frame[12 + meta :] == b"\x30\x04\x00\x01ax\xc0\x00"
    reader = FrameReader()
    reader.feed(frame)
    (chunk,) = reader.chunks()
    assert chunk.reads and chunk.count == 1 and chunk.data == b"\x30\x04\x00\x01ax\xc0\x00"
    assert chunk.rows == [("dev", 5.0, 6, [(0, 9)], [], 1), ("dev", 6.0, 2, [], [], 0)]


def test_a_frame_of_before_origins_is_a_chunk_without_any():
    """A writer started again after an upgrade may read a frame of the node's older code."""
    rows = [(1.5, 9, "p", "t", 2, False, b"a")]
    meta = marshal.dumps((PUBLISH, 4, 1, rows, 1, False))
    old = FrameReader()
    old.feed(b"MQAR" + struct.pack(">II", len(meta), 0) + meta)
    (chunk,) = old.chunks()
    assert (chunk.kind, chunk.first, chunk.rows, chunk.origins) == (PUBLISH, 4, rows, ())


def test_bad_frames_are_refused_by_name():
    bad = FrameReader()
    bad.feed(b"HTTP/1.1 200 OK\r\n")
    with pytest.raises(WireError, match="bad frame magic"):
        list(bad.chunks())
    junk = FrameReader()
    junk.feed(b"MQAR" + struct.pack(">II", 3, 0) + b"\x00\x01\x02")
    with pytest.raises(WireError, match="does not decode"):
        list(junk.chunks())
    wrong = FrameReader()
    wrong.feed(_frame("other", 0, 0, []))
    with pytest.raises(WireError, match="not a chunk"):
        list(wrong.chunks())
    odd = FrameReader()
    odd.feed(_frame(PUBLISH, 0, 0, [], origins="n0"))
    with pytest.raises(WireError, match="not a chunk"):
        list(odd.chunks())
    short = FrameReader()
    short.feed(_frame(PUBLISH, 0, 0, [("dev", 5.0, 6, [(0, 9)], [], 1)], True, b"\x30\x04\x00"))
    with pytest.raises(WireError, match="add up to 6 bytes, it carries 3"):
        list(short.chunks())


def test_reports_round_trip_and_bad_ones_are_refused():
    line = encode_report(PUBLISH, 10, 200, 9, 0, 1, 4096)
    assert line.endswith(b"\n")
    assert decode_report(line) == {
        "kind": "publish",
        "records": 10,
        "nbytes": 200,
        "written": 9,
        "failed": 0,
        "files": 1,
        "file_bytes": 4096,
    }
    with pytest.raises(WireError):
        decode_report(b'{"kind": "nope"}')
    with pytest.raises(WireError):
        decode_report(b"not json")
