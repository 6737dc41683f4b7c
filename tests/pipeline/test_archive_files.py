"""The archive writer's files: columns, types, metadata, hour partitions, atomic names, write errors."""

from __future__ import annotations

import datetime as dt
import os

import pytest

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

from mqttmesh.archive.recorder import ArchiveLimits, Chunk  # noqa: E402
from mqttmesh.archive.schema import DELIVERY, PUBLISH  # noqa: E402
from mqttmesh.archive.writer import FileWriter  # noqa: E402

UTC = dt.UTC
T0 = 1769867999.5  # 2026-01-31T13:59:59.5Z
T1 = 1769868000.25  # 2026-01-31T14:00:00.25Z


class Reports(list):
    def __call__(self, *values):
        self.append(values)


def files(root):
    out = []
    for dirpath, _, names in os.walk(root):
        out += [os.path.relpath(os.path.join(dirpath, n), root) for n in names]
    return sorted(out)


def test_a_publish_file_has_every_column_with_its_type_and_the_format_version(tmp_path):
    reports = Reports()
    w = FileWriter(str(tmp_path), "n1", 1700000000, ArchiveLimits(), report=reports)
    w.add(
        Chunk(
            PUBLISH, [(T1, 42, "dev-1", "t/1", 2, True, b"\x00hi"), (T1 + 0.5, 43, "dev-2", "t/2", 0, False, b"")], 3, 0
        ),
        now=0.0,
    )
    w.close()
    assert files(tmp_path) == ["publish/date=2026-01-31/hour=14/n1-1700000000-000001.parquet"]
    path = tmp_path / files(tmp_path)[0]
    table = pq.read_table(path)
    assert table.schema.metadata == {b"mqttmesh.archive": b"1", b"mqttmesh.kind": b"publish", b"mqttmesh.node": b"n1"}
    assert [(f.name, str(f.type)) for f in table.schema] == [
        ("timestamp", "timestamp[us, tz=UTC]"),
        ("msg_id", "string"),
        ("origin", "string"),
        ("seq", "int64"),
        ("publisher", "string"),
        ("topic", "string"),
        ("qos", "int8"),
        ("retain", "bool"),
        ("payload", "binary"),
        ("payload_size", "int32"),
    ]
    assert table.to_pylist() == [
        {
            "timestamp": dt.datetime(2026, 1, 31, 14, 0, 0, 250000, tzinfo=UTC),
            "msg_id": "n1:42",
            "origin": "n1",
            "seq": 42,
            "publisher": "dev-1",
            "topic": "t/1",
            "qos": 2,
            "retain": True,
            "payload": b"\x00hi",
            "payload_size": 3,
        },
        {
            "timestamp": dt.datetime(2026, 1, 31, 14, 0, 0, 750000, tzinfo=UTC),
            "msg_id": "n1:43",
            "origin": "n1",
            "seq": 43,
            "publisher": "dev-2",
            "topic": "t/2",
            "qos": 0,
            "retain": False,
            "payload": b"",
            "payload_size": 0,
        },
    ]
    assert reports == [(PUBLISH, 2, 3, 2, 0, 1, os.path.getsize(path))]


def test_records_are_split_by_hour_and_dollar_topics_are_not_written(tmp_path):
    reports = Reports()
    w = FileWriter(str(tmp_path), "n2", 5, ArchiveLimits(), report=reports)
    w.add(
        Chunk(
            PUBLISH,
            [
                (T0, 1, "p", "a", 0, False, b"1"),
                (T1, 2, "p", "$SYS/x", 0, False, b"2"),
                (T1, 3, "p", "b", 0, False, b"3"),
            ],
            3,
            0,
        ),
        now=0.0,
    )
    w.close()
    assert files(tmp_path) == [
        "publish/date=2026-01-31/hour=13/n2-5-000001.parquet",
        "publish/date=2026-01-31/hour=14/n2-5-000002.parquet",
    ]
    assert pq.read_table(tmp_path / files(tmp_path)[0]).column("topic").to_pylist() == ["a"]
    assert pq.read_table(tmp_path / files(tmp_path)[1]).column("topic").to_pylist() == ["b"]
    # 3 records done: 2 written, 0 failed, the $SYS one neither
    assert [r[:6] for r in reports] == [(PUBLISH, 3, 3, 2, 0, 2)]


def test_a_delivery_file_numbers_its_rows_in_logging_order(tmp_path):
    w = FileWriter(str(tmp_path), "n3", 9, ArchiveLimits())
    w.add(Chunk(DELIVERY, [(T1, "n1", 5, "t/1", T1 - 0.002, "sub", 1, False)], 0, 10), now=0.0)
    w.add(Chunk(DELIVERY, [(T1 + 1, "n2", 6, "t/2", T1, "sub", 0, True)], 0, 11), now=0.0)
    w.close()
    (name,) = files(tmp_path)
    rows = pq.read_table(tmp_path / name).to_pylist()
    assert rows == [
        {
            "timestamp": dt.datetime(2026, 1, 31, 14, 0, 0, 250000, tzinfo=UTC),
            "msg_id": "n1:5",
            "origin": "n1",
            "seq": 5,
            "topic": "t/1",
            "published": dt.datetime(2026, 1, 31, 14, 0, 0, 248000, tzinfo=UTC),
            "node": "n3",
            "client_id": "sub",
            "qos": 1,
            "dup": False,
            "log_seq": 10,
        },
        {
            "timestamp": dt.datetime(2026, 1, 31, 14, 0, 1, 250000, tzinfo=UTC),
            "msg_id": "n2:6",
            "origin": "n2",
            "seq": 6,
            "topic": "t/2",
            "published": dt.datetime(2026, 1, 31, 14, 0, 0, 250000, tzinfo=UTC),
            "node": "n3",
            "client_id": "sub",
            "qos": 0,
            "dup": True,
            "log_seq": 11,
        },
    ]


def test_files_are_written_by_rows_and_by_age_and_nothing_waits_otherwise(tmp_path):
    w = FileWriter(str(tmp_path), "n1", 1, ArchiveLimits(flush_interval=10.0, flush_rows=3, max_queue_rows=6))
    rec = [(T1, i, "p", "t", 0, False, b"x") for i in range(5)]
    w.add(Chunk(PUBLISH, rec[:2], 2, 0), now=100.0)
    assert files(tmp_path) == [] and w.next_due() == 105.0
    w.add(Chunk(PUBLISH, rec[2:3], 1, 2), now=101.0)  # 3 records: a file
    assert len(files(tmp_path)) == 1 and w.next_due() is None
    w.add(Chunk(PUBLISH, rec[3:], 2, 3), now=102.0)
    w.write_due(106.9)  # waited 4.9 s of its 5
    assert len(files(tmp_path)) == 1
    w.write_due(107.0)
    assert len(files(tmp_path)) == 2
    assert [pq.read_table(tmp_path / f).num_rows for f in files(tmp_path)] == [3, 2]


def test_no_temporary_file_is_left_and_a_failing_directory_is_counted(tmp_path):
    reports = Reports()
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where the publish/ directory should be")
    w = FileWriter(str(blocked), "n1", 1, ArchiveLimits(), report=reports)
    w.add(Chunk(PUBLISH, [(T1, 1, "p", "t", 0, False, b"x")], 1, 0), now=0.0)
    w.close()
    assert reports == [(PUBLISH, 1, 1, 0, 1, 0, 0)]  # one record, failed, no file
    assert "NotADirectoryError" in w.last_error
    ok = FileWriter(str(tmp_path / "ok"), "n1", 1, ArchiveLimits())
    ok.add(Chunk(PUBLISH, [(T1, 1, "p", "t", 0, False, b"x")], 1, 0), now=0.0)
    ok.close()
    assert all(not f.split("/")[-1].startswith(".") for f in files(tmp_path / "ok"))


def test_a_message_published_under_another_nodes_id_has_that_origin_and_msg_id(tmp_path):
    """The node's id is every row's origin but for the records a chunk's ``origins`` names
    (recorder.py ``other_origin``: an inbound QoS 2 message routed under its agreed id, a
    dead node's client's will), across the chunks of one file."""
    w = FileWriter(str(tmp_path), "n2", 1, ArchiveLimits())
    rec = [(T1, s, "p", "t/1", 2, False, b"x") for s in (10, 11, 12, 13, 14)]
    w.add(Chunk(PUBLISH, rec[:2], 2, 0), now=0.0)
    w.add(Chunk(PUBLISH, rec[2:], 3, 2, origins=[(0, "n0"), (2, "n1")]), now=0.0)
    w.close()
    (name,) = files(tmp_path)
    table = pq.read_table(tmp_path / name, columns=["msg_id", "origin", "seq"])
    assert table.to_pylist() == [
        {"msg_id": "n2:10", "origin": "n2", "seq": 10},
        {"msg_id": "n2:11", "origin": "n2", "seq": 11},
        {"msg_id": "n0:12", "origin": "n0", "seq": 12},
        {"msg_id": "n2:13", "origin": "n2", "seq": 13},
        {"msg_id": "n1:14", "origin": "n1", "seq": 14},
    ]


@pytest.mark.parametrize("origins", [[(1, "n0")], [(-1, "n0")], [(0, 5)], [(0, "n0"), (0, "n1")], ["n0"]])
def test_origins_that_do_not_fit_their_chunk_fail_it_alone(tmp_path, origins):
    reports = Reports()
    w = FileWriter(str(tmp_path), "n2", 1, ArchiveLimits(), report=reports)
    w.add(Chunk(PUBLISH, [(T1, 1, "p", "t", 0, False, b"x")], 1, 0, origins=origins), now=0.0)
    w.add(Chunk(PUBLISH, [(T1, 2, "p", "t", 0, False, b"y")], 1, 1, origins=[(0, "n0")]), now=0.0)
    w.close()
    assert reports[0] == (PUBLISH, 1, 1, 0, 1, 0, 0) and "origin" in w.last_error
    assert reports[1][:6] == (PUBLISH, 1, 1, 1, 0, 1)
    (name,) = files(tmp_path)
    assert pq.read_table(tmp_path / name, columns=["msg_id"]).column(0).to_pylist() == ["n0:2"]


def test_a_record_the_schema_cannot_hold_fails_its_chunk_only(tmp_path):
    reports = Reports()
    w = FileWriter(str(tmp_path), "n1", 1, ArchiveLimits(), report=reports)
    w.add(Chunk(PUBLISH, [(T1, "not a number", "p", "t", 0, False, b"x")], 1, 0), now=0.0)
    w.add(Chunk(PUBLISH, [(T1, 2, "p", "t", 0, False, b"y")], 1, 1), now=0.0)
    w.close()
    assert reports[0] == (PUBLISH, 1, 1, 0, 1, 0, 0)
    assert reports[1][:6] == (PUBLISH, 1, 1, 1, 0, 1)
