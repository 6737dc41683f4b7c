"""A Delta archive at a URI, read through its log by Spark (pipeline/delta_uri.py, with the
pure replay of archive/delta_log.py), against the local reader (archive/table.snapshot_files,
delta-rs) on real tables the archive writer made.

The URIs are ``viewfs://``: Hadoop's ViewFileSystem, a real scheme other than ``file`` that
Spark's Hadoop FileSystem serves on this machine, a mount table (set in the session's Hadoop
configuration, one mount per test) pointing it at the test's directory. With it, ``read_log``
takes the URI path exactly as it takes ``hdfs://`` or ``s3a://`` (no argument of its own for
tests), the log and the data files are read through Hadoop, and every file name the reader
makes is of the mount, so a path built from a local one would not be found.
"""

from __future__ import annotations

import datetime as dt
import itertools
import os
import re
import shutil

import pytest

pa = pytest.importorskip("pyarrow")
pytest.importorskip("deltalake")

from mqttmesh.archive.recorder import ArchiveLimits, Chunk  # noqa: E402
from mqttmesh.archive.schema import PUBLISH  # noqa: E402
from mqttmesh.archive.table import TableError, TableWriter, compact, expire, snapshot_files  # noqa: E402
from mqttmesh.archive.writer import FileWriter, publish_table, records_array  # noqa: E402

UTC = dt.UTC
T13 = 1769864400.0  # 2026-01-31T13:00:00Z
T14 = 1769868000.0  # 2026-01-31T14:00:00Z
BASE = 1790000000  # the commits' file times in the history table (2026-09-21), one second apart
_mounts = itertools.count()


def viewfs(spark, directory) -> str:
    """A ``viewfs://`` URI that Hadoop serves from ``directory`` (a mount of its own)."""
    name = f"mqttmesh{os.getpid()}x{next(_mounts)}"
    spark._jsc.hadoopConfiguration().set(f"fs.viewfs.mounttable.{name}.link./arc", f"file://{directory}")
    return f"viewfs://{name}/arc"


def publishes(first: int, n: int, t: float) -> pa.Table:
    records = [(t + i * 0.5, first + i, "dev", f"t/{i % 3}", 1, False, b"p%d" % i) for i in range(n)]
    return publish_table(pa.chunked_array([records_array(PUBLISH, records)]), "n1")


def _name(v: int) -> str:
    return f"{v:020d}.json"


def _log_versions(path) -> list[int]:
    return sorted(int(f[:20]) for f in os.listdir(os.path.join(path, "_delta_log")) if re.match(r"^\d{20}\.json$", f))


def _set_times(path, times: dict[int, int]) -> None:
    for v, seconds in times.items():
        os.utime(os.path.join(path, "_delta_log", _name(v)), (seconds, seconds))


@pytest.fixture(scope="module")
def history(tmp_path_factory):
    """A publish table of 105 commits by the archive writer: flushes into two hours, a
    compaction (version 8), an expiry of the first hour and its vacuum (versions 60-62), the
    checkpoint the writer makes at version 99. Its commit files' times are set one second
    apart, from BASE, but version 31's, set before version 30's (two writers' clocks)."""
    root = tmp_path_factory.mktemp("history")
    path = str(root / PUBLISH)
    w = TableWriter(str(root), "n1", PUBLISH)
    seq, events = 1, {}
    while (v := len(_log_versions(path)) if os.path.isdir(path) else 0) < 105:
        if v == 8:
            events["compaction"] = compact(path).version
        elif v == 60:  # (a commit that removes the hour, then the vacuum's two: start, end)
            events["expiry"] = expire(path, dt.datetime(2026, 1, 31, 14, tzinfo=UTC), vacuum_hours=0).version
            # (the writer's table, read before the expiry, would fail its next commit once, as
            # a node's does, and be retried: a writer started again reads the log afresh)
            w = TableWriter(str(root), "n1", PUBLISH)
        else:
            w.append(publishes(seq, 3, T13 if v < 30 and v % 2 else T14 + v))
            seq += 3
    assert events == {"compaction": 8, "expiry": 62}
    assert os.path.exists(os.path.join(path, "_delta_log", "00000000000000000099.checkpoint.parquet"))
    assert _log_versions(path) == list(range(105))
    times = {v: BASE + v for v in range(105)}
    times[31] = BASE + 29
    _set_times(path, times)
    return root


def version_at(spark, path: str, seconds: float) -> int:
    from mqttmesh.pipeline.delta_uri import uri_snapshot_files

    when = dt.datetime.fromtimestamp(seconds, UTC)
    return (uri_snapshot_files(spark, path, as_of=when) if "://" in path else snapshot_files(path, as_of=when))[0]


def _as_local(files: list[str], uri: str, root) -> list[str]:
    assert all(f.startswith(uri + "/") for f in files), files[:2]
    return sorted(str(root) + f[len(uri) :] for f in files)


@pytest.mark.spark
def test_the_log_read_by_spark_gives_the_files_delta_rs_gives_at_every_kind_of_version(spark, history):
    """Versions before and after the compaction, the expiry and its vacuum, the checkpoint;
    times on a commit, between two, on the commit whose file time is out of order, and after
    the checkpoint (listed from it on); hour pruning. The reader's file set must be delta-rs's."""
    from mqttmesh.pipeline.delta_uri import uri_snapshot_files

    uri = viewfs(spark, history)
    local, remote = str(history / PUBLISH), uri + "/" + PUBLISH
    h14 = dt.datetime(2026, 1, 31, 14, tzinfo=UTC)
    cases: list[dict] = [{}, {"since": h14}, {"until": h14}, {"since": h14, "until": h14 + dt.timedelta(minutes=1)}]
    cases += [{"as_of": v} for v in (0, 1, 7, 8, 9, 59, 60, 61, 62, 63, 98, 99, 100, 104)]
    cases += [{"as_of": v, "until": h14} for v in (7, 9)]
    cases += [
        {"as_of": dt.datetime.fromtimestamp(BASE + s, UTC)}
        for s in (0, 7.5, 8, 29, 29.5, 30, 30.0005, 30.001, 31, 98.999, 99.999, 100.5, 104.5)
    ]
    seen = set()
    for case in cases:
        version, files = snapshot_files(local, **case)
        got_version, got = uri_snapshot_files(spark, remote, **case)
        assert (got_version, _as_local(got, remote, history / PUBLISH)) == (version, files), case
        seen.add((version, len(files)))
    # (the table changes over its versions: a test on one file set would not tell them apart)
    assert len(seen) > 10
    # (version 31's file is older than version 30's: both take it at 1 ms after it, as Delta
    # Lake does; delta-rs's own search for a time found 31 at BASE + 29)
    for path in (local, remote):
        at = [version_at(spark, path, BASE + s) for s in (29, 29.5, 30.0005, 30.001)]
        assert at == [29, 29, 30, 31], path
    # (elsewhere, where the times increase, delta-rs's own search is the independent judge)
    from deltalake import DeltaTable

    for s in (0, 7.5, 8, 59.999, 99, 104.5):
        table = DeltaTable(local)
        table.load_as_version(dt.datetime.fromtimestamp(BASE + s, UTC))
        assert version_at(spark, remote, BASE + s) == table.version(), s


@pytest.mark.spark
def test_a_uri_says_what_the_local_path_says_of_a_version_it_cannot_read(spark, history, tmp_path):
    """A version the table does not have, a time before its first commit, and (after a cleanup
    of the log's first 50 commits, as Delta's log retention does once a checkpoint is newer)
    a version or a time the log no longer has: the same message on both paths."""
    from mqttmesh.pipeline.extract import ExtractError, read_log

    root = tmp_path / "arc"
    shutil.copytree(history, root)  # (copy2: the commit files' times are kept)
    uri = viewfs(spark, root)

    def both(**kw) -> tuple[str, str]:
        with pytest.raises(ExtractError) as local:
            read_log(spark, [str(root)], PUBLISH, **kw)
        with pytest.raises(ExtractError) as remote:
            read_log(spark, [uri], PUBLISH, **kw)
        assert str(local.value).startswith(str(root / PUBLISH) + ": ")
        assert str(remote.value).startswith(f"{uri}/{PUBLISH}: ")
        return str(local.value).split(": ", 1)[1], str(remote.value).split(": ", 1)[1]

    local, remote = both(as_of=105)
    assert local == remote == "--as-of 105: no such version (the latest is 104)"
    before = dt.datetime.fromtimestamp(BASE - 1, UTC)
    local, remote = both(as_of=before)
    assert local == remote and "before the table's first commit (version 0, at 2026-09-21" in local
    for v in range(50):
        os.remove(root / PUBLISH / "_delta_log" / _name(v))
    local, remote = both(as_of=10)
    assert (
        local == remote == "--as-of 10: the log no longer has that version (cleaned up; the oldest it can give is 99)"
    )
    local, remote = both(as_of=dt.datetime.fromtimestamp(BASE + 20, UTC))
    assert local == remote and "no longer has the commits before version 50" in local
    said: list[str] = []
    assert (
        read_log(spark, [uri], PUBLISH, as_of=100, say=said.append).count()
        == read_log(spark, [str(root)], PUBLISH, as_of=100, say=said.append).count()
    )
    assert said[0].startswith(f"{uri}/{PUBLISH}: Delta table, version 100, ")
    assert said[0].split(", ", 1)[1] == said[1].split(", ", 1)[1]
    with open(root / PUBLISH / "_delta_log" / _name(104), "a") as fh:
        fh.write("{half a line\n")  # (a damaged commit: named, not a traceback)
    with pytest.raises(ExtractError, match="its commit 104 has a line that is not JSON"):
        read_log(spark, [uri], PUBLISH)


def flush(root, start: float, first: int, n: int, fmt: str = "delta") -> None:
    """``n`` messages from ``start``, one a second, as one flush of node n1's writer."""
    w = FileWriter(str(root), "n1", first, ArchiveLimits(), fmt=fmt)
    rows = [(start + i, first + i, "pub", f"t/{i % 2}", 1, False, b'{"v": %d}' % i) for i in range(n)]
    w.add(Chunk(PUBLISH, rows, sum(len(r[6]) for r in rows), 0), now=0.0)
    w.close()


def _tables(result) -> dict[str, list]:
    return {name: sorted(map(repr, t.data.to_pylist())) for name, t in result.tables.items()}


@pytest.mark.spark
def test_traffic_on_a_uri_delta_archive_with_an_unvacuumed_compaction_counts_what_the_local_path_counts(
    spark, tmp_path
):
    """Four flushes, a compaction whose replaced files are still on disk, and a file no commit
    names (a writer killed mid-write): read as a directory of Parquet files, as URIs were, the
    archive has every row twice and then some; read through its log, the traffic job's tables
    at a URI equal the local path's, now and as of the version before the compaction."""
    from mqttmesh.pipeline.jobs import job_options, run_traffic

    root = tmp_path / "arc"
    for k in range(4):
        flush(root, (T13 + 3000) if k < 2 else T14 + 60 * k, 1 + 100 * k, 40)
    assert compact(str(root / PUBLISH)).files_removed == 4
    hour14 = root / PUBLISH / "date=2026-01-31" / "hour=14"
    committed = sorted(f for f in os.listdir(hour14) if f.endswith(".parquet"))
    shutil.copy(hour14 / committed[0], hour14 / "part-99999-killed-mid-write.parquet")
    uri = viewfs(spark, root)
    assert spark.read.option("recursiveFileLookup", "true").parquet(f"{uri}/{PUBLISH}").count() > 2 * 160

    def traffic(archive: str, **kw):
        out = tmp_path / f"out{next(_mounts)}"
        return run_traffic(spark, job_options(archive=[archive], out=str(out), **kw), lambda s: None)

    for kw in ({}, {"as_of": 3}, {"since": dt.datetime(2026, 1, 31, 14, tzinfo=UTC)}):
        local, remote = traffic(str(root), **kw), traffic(uri, **kw)
        assert remote.summary == local.summary, kw
        assert _tables(remote) == _tables(local), kw
    assert local.summary["messages"] == 80 and traffic(uri).summary["messages"] == 160
    # (the stream job does not read such a table yet: it says so rather than count it wrong)
    from mqttmesh.pipeline.extract import ExtractError
    from mqttmesh.pipeline.stream import stream_source

    with pytest.raises(ExtractError, match="Delta table at a URI, which the stream job does not read yet"):
        stream_source(spark, [uri])


@pytest.mark.spark
def test_a_uri_that_is_not_a_delta_table_is_read_as_a_directory_and_refuses_as_of(spark, tmp_path):
    """A format-1 archive at a URI: read as its directory of Parquet files, as before."""
    from mqttmesh.pipeline.extract import ExtractError, read_log

    root = tmp_path / "plain"
    flush(root, T13, 1, 3, fmt="parquet")
    flush(root, T14, 4, 2, fmt="parquet")
    uri = viewfs(spark, root)
    said: list[str] = []
    assert read_log(spark, [uri], PUBLISH, say=said.append).count() == 5 and said == []
    with pytest.raises(ExtractError, match=f"--as-of: {re.escape(uri)}/publish is not a Delta table"):
        read_log(spark, [uri], PUBLISH, as_of=0)
    from mqttmesh.pipeline.stream import stream_source

    assert stream_source(spark, [uri]).isStreaming  # (a file source over the directory, as before)
    with pytest.raises(TableError):  # (nor is it one to the log reader)
        from mqttmesh.pipeline.delta_uri import uri_snapshot_files

        uri_snapshot_files(spark, f"{uri}/{PUBLISH}")
