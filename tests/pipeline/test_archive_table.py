"""The archive's logs as Delta tables (archive/table.py): one commit per flush, at most once per
version of a writer, pruned and versioned snapshots, compaction, expiry, conversion of format-1
directories. Real files, the real ``deltalake`` package, no mocks."""

from __future__ import annotations

import datetime as dt
import json
import os

import pytest

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
pytest.importorskip("deltalake")

from mqttmesh.archive.recorder import ArchiveLimits, Chunk  # noqa: E402
from mqttmesh.archive.schema import DELIVERY, PUBLISH  # noqa: E402
from mqttmesh.archive.table import (  # noqa: E402
    TableError,
    TableWriter,
    compact,
    convert,
    expire,
    is_table,
    snapshot_files,
    table_version,
)
from mqttmesh.archive.writer import FileWriter, publish_table, records_array  # noqa: E402

UTC = dt.UTC
T13 = 1769867999.5  # 2026-01-31T13:59:59.5Z
T14 = 1769868000.25  # 2026-01-31T14:00:00.25Z


def rows(table_files: list[str]) -> list[dict]:
    out = []
    for f in table_files:
        out += pq.read_table(f).to_pylist()
    return sorted(out, key=lambda r: r["seq"])


def publishes(first: int, n: int, t: float = T14) -> pa.Table:
    records = [(t + i * 0.001, first + i, "dev", f"t/{i % 3}", 1, False, b"p%d" % i) for i in range(n)]
    return publish_table(pa.chunked_array([records_array(PUBLISH, records)]), "n1")


def test_each_append_is_one_commit_partitioned_by_hour_and_named_by_its_writer(tmp_path):
    w = TableWriter(str(tmp_path), "n1", PUBLISH)
    both = pa.concat_tables([publishes(1, 2, T13), publishes(3, 3, T14)])
    c = w.append(both)
    assert c is not None and is_table(str(tmp_path / PUBLISH)) and c.version == 0 and c.files == 2 and c.nbytes > 0
    version, files = snapshot_files(str(tmp_path / PUBLISH))
    assert version == 0 and len(files) == 2
    assert sorted(os.path.relpath(os.path.dirname(f), tmp_path) for f in files) == [
        "publish/date=2026-01-31/hour=13",
        "publish/date=2026-01-31/hour=14",
    ]
    assert [r["seq"] for r in rows(files)] == [1, 2, 3, 4, 5]
    assert all(f.startswith(str(tmp_path)) for f in files)  # (absolute: for Spark)
    with open(tmp_path / PUBLISH / "_delta_log" / f"{0:020d}.json") as fh:
        actions = [json.loads(line) for line in fh]
    [txn] = [a["txn"] for a in actions if "txn" in a]
    assert txn["appId"] == "mqttmesh:n1:publish" and txn["version"] == 1
    [info] = [a["commitInfo"] for a in actions if "commitInfo" in a]
    assert info["mqttmesh.archive"] == "1" and info["mqttmesh.rows"] == "5"


def test_a_writer_started_again_goes_on_from_its_last_version_and_others_keep_their_own(tmp_path):
    TableWriter(str(tmp_path), "n1", PUBLISH).append(publishes(1, 2))
    TableWriter(str(tmp_path), "n1", PUBLISH).append(publishes(3, 2))  # (the node restarted)
    other = TableWriter(str(tmp_path), "n2", PUBLISH)
    other.append(publishes(10, 1))
    again = TableWriter(str(tmp_path), "n1", PUBLISH)
    assert again._last_committed() == 2 and other.last == 1
    from deltalake import DeltaTable

    assert DeltaTable(str(tmp_path / PUBLISH)).transaction_version("mqttmesh:n2:publish") == 1
    assert [r["seq"] for r in rows(snapshot_files(str(tmp_path / PUBLISH))[1])] == [1, 2, 3, 4, 10]


def test_an_append_whose_version_is_already_in_the_log_is_not_committed_twice(tmp_path):
    """Rows appended again under the version they were first appended with (a flush retried
    by a writer that did not learn that its commit had landed, a writer started again) are
    not committed again: the log's application transaction has that version."""
    w = TableWriter(str(tmp_path), "n1", PUBLISH)
    first = w.append(publishes(1, 3), version=1)
    assert first is not None and w.last == 1
    assert TableWriter(str(tmp_path), "n1", PUBLISH).append(publishes(1, 3), version=1) is None
    assert w.append(publishes(1, 3), version=1) is None
    version, files = snapshot_files(str(tmp_path / PUBLISH))
    assert [r["seq"] for r in rows(files)] == [1, 2, 3], "the same rows committed twice"
    assert version == first.version == 0
    nxt = w.append(publishes(4, 1))
    assert nxt is not None and w.last == 2 and nxt.version == 1


def test_a_snapshot_is_pruned_by_hour_and_read_as_of_a_version_or_a_time(tmp_path):
    w = TableWriter(str(tmp_path), "n1", PUBLISH)
    w.append(publishes(1, 2, T13))
    w.append(publishes(3, 2, T14))
    path = str(tmp_path / PUBLISH)
    at = dt.datetime(2026, 1, 31, 14, 0, tzinfo=UTC)
    assert [r["seq"] for r in rows(snapshot_files(path, since=at)[1])] == [3, 4]
    assert [r["seq"] for r in rows(snapshot_files(path, until=at)[1])] == [1, 2]
    assert snapshot_files(path, since=at + dt.timedelta(hours=1))[1] == []
    v0, files0 = snapshot_files(path, as_of=0)
    assert v0 == 0 and [r["seq"] for r in rows(files0)] == [1, 2]
    later = dt.datetime.now(UTC) + dt.timedelta(seconds=1)
    assert snapshot_files(path, as_of=later)[0] == 1
    with pytest.raises(TableError):
        snapshot_files(path, as_of=7)  # (no such version: said, not a crash)
    with pytest.raises(TableError, match="not a Delta table"):
        snapshot_files(str(tmp_path / DELIVERY))


def test_compaction_merges_small_files_into_one_per_hour_and_keeps_every_row_once(tmp_path):
    w = TableWriter(str(tmp_path), "n1", PUBLISH)
    for i in range(6):
        w.append(publishes(1 + 10 * i, 10))
    path = str(tmp_path / PUBLISH)
    before = snapshot_files(path)[1]
    assert len(before) == 6
    c = compact(path)
    assert c.files_removed == 6 and c.files_added == 1
    version, after = snapshot_files(path)
    assert version == c.version and len(after) == 1
    assert [r["seq"] for r in rows(after)] == [r["seq"] for r in rows(before)]
    w.append(publishes(100, 1))  # (the writer goes on after a compaction)
    assert len(snapshot_files(path)[1]) == 2
    assert [r["seq"] for r in rows(snapshot_files(path, as_of=5)[1])] == [r["seq"] for r in rows(before)]


def test_expiry_removes_old_hours_and_vacuums_what_no_version_needs(tmp_path):
    w = TableWriter(str(tmp_path), "n1", PUBLISH)
    w.append(publishes(1, 2, T13))
    w.append(publishes(3, 2, T14))
    path = str(tmp_path / PUBLISH)
    orphan = tmp_path / PUBLISH / "date=2026-01-31" / "hour=13" / "part-killed-mid-write.parquet"
    orphan.write_bytes(b"half a file")  # (a writer killed before its commit)
    e = expire(path, dt.datetime(2026, 1, 31, 14, 30, tzinfo=UTC), vacuum_hours=0)
    assert e.rows_removed == 2 and e.files_vacuumed >= 2
    assert [r["seq"] for r in rows(snapshot_files(path)[1])] == [3, 4]
    assert not orphan.exists()
    assert not os.listdir(tmp_path / PUBLISH / "date=2026-01-31" / "hour=13")


def test_a_format_1_directory_is_converted_in_place_and_read_as_before(tmp_path):
    fw = FileWriter(str(tmp_path), "n1", 1, ArchiveLimits())
    fw.add(Chunk(PUBLISH, [(T13, 1, "d", "t/1", 1, False, b"a"), (T14, 2, "d", "t/2", 0, True, b"b")], 2, 0), 0.0)
    fw.close()
    path = str(tmp_path / PUBLISH)
    assert not is_table(path)
    assert convert(path) == 2
    assert is_table(path) and table_version(path) == 0
    files = snapshot_files(path, since=dt.datetime(2026, 1, 31, 14, tzinfo=UTC))[1]
    assert [r["seq"] for r in rows(files)] == [2]
    w = TableWriter(str(tmp_path), "n1", PUBLISH)  # (a writer appends to the converted table)
    w.append(publishes(3, 1))
    assert [r["seq"] for r in rows(snapshot_files(path)[1])] == [1, 2, 3]
    with pytest.raises(TableError, match="already a Delta table"):
        convert(path)


def test_conversion_refuses_a_directory_with_a_file_that_is_not_of_the_archive(tmp_path):
    fw = FileWriter(str(tmp_path), "n1", 1, ArchiveLimits())
    fw.add(Chunk(PUBLISH, [(T14, 1, "d", "t/1", 1, False, b"a")], 1, 0), 0.0)
    fw.close()
    bad = tmp_path / PUBLISH / "date=2026-01-31" / "hour=14" / "n1-1-000099.parquet"
    pq.write_table(pa.table({"x": [1]}), bad)
    with pytest.raises(TableError, match="n1-1-000099.parquet: not an mqttmesh archive file"):
        convert(str(tmp_path / PUBLISH))
    assert not is_table(str(tmp_path / PUBLISH))
    with pytest.raises(TableError, match="no archive files"):
        convert(str(tmp_path / DELIVERY))


class Reports(list):
    def __call__(self, *values):
        self.append(values)


def chunk(seqs, t=T14):
    return Chunk(PUBLISH, [(t, s, "p", "t/1", 1, False, b"x") for s in seqs], len(seqs), 0)


def test_the_node_writer_in_delta_format_commits_each_flush_and_retries_a_failed_one_in_order(tmp_path):
    """archive.format = delta: a flush is a commit. A commit that fails (here: a file where the
    table's directory must be) is tried again under its version, and the flushes after it wait
    behind it, so that each is committed once and in order; reports come when a flush is
    committed."""
    reports = Reports()
    w = FileWriter(str(tmp_path), "n1", 1, ArchiveLimits(), report=reports, fmt="delta")
    w.add(chunk([1, 2]), now=0.0)
    w.write(PUBLISH, 0.0)
    assert reports[0][:5] == (PUBLISH, 2, 2, 2, 0) and reports[0][5] == 1
    blocker = tmp_path / PUBLISH / "_delta_log"
    moved = tmp_path / "log-aside"
    blocker.rename(moved)
    blocker.write_text("not a directory")  # (the table cannot be read nor written now)
    w.add(chunk([3]), now=1.0)
    w.write(PUBLISH, 1.0)
    w.add(chunk([4]), now=1.5)
    w.write(PUBLISH, 1.5)
    assert len(reports) == 1 and len(w.retries) == 2 and w.next_due() == 1.0 + 2.0
    w.write_due(2.0)  # (not due yet)
    assert [r.attempts for r in w.retries] == [1, 0]
    blocker.unlink()
    moved.rename(blocker)
    w.write_due(3.5)
    assert w.retries == [] and [r[:5] for r in reports[1:]] == [(PUBLISH, 1, 1, 1, 0)] * 2
    version, files = snapshot_files(str(tmp_path / PUBLISH))
    assert [r["seq"] for r in rows(files)] == [1, 2, 3, 4] and version == 2
    from deltalake import DeltaTable

    assert DeltaTable(str(tmp_path / PUBLISH)).transaction_version("mqttmesh:n1:publish") == 3


def test_a_commit_that_keeps_failing_is_given_up_and_counted_at_the_stop(tmp_path):
    reports = Reports()
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where the archive directory should be")
    w = FileWriter(str(blocked), "n1", 1, ArchiveLimits(), report=reports, fmt="delta")
    w.add(chunk([1, 2, 3]), now=0.0)
    w.close()
    assert reports == [(PUBLISH, 3, 3, 0, 3, 0, 0)] and w.retries == []
    assert w.last_error
