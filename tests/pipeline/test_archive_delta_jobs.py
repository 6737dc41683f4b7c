"""The jobs and ``mqttmesh archive`` on Delta archives (archive.format = delta): a job reads the
table's current version or the one ``--as-of`` names, pruned by hour; files no commit names
are never read; the command line compacts, expires, converts and describes real tables."""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys

import pytest

pa = pytest.importorskip("pyarrow")
pytest.importorskip("deltalake")

from mqttmesh.archive.recorder import ArchiveLimits, Chunk  # noqa: E402
from mqttmesh.archive.schema import PUBLISH  # noqa: E402
from mqttmesh.archive.table import is_table, snapshot_files  # noqa: E402
from mqttmesh.archive.writer import FileWriter  # noqa: E402
from mqttmesh.pipeline.extract import ExtractError, read_log  # noqa: E402
from mqttmesh.pipeline.jobs import job_options, run_traffic  # noqa: E402
from mqttmesh.pipeline.options import OptionError, parse_as_of  # noqa: E402

T13 = 1769864400.0  # 2026-01-31T13:00:00Z
T14 = 1769868000.0  # 2026-01-31T14:00:00Z
UTC = dt.UTC


def flush(root, start: float, first: int, n: int, fmt: str = "delta") -> None:
    """``n`` messages from ``start``, one a second, as one flush of node n1's writer."""
    w = FileWriter(str(root), "n1", first, ArchiveLimits(), fmt=fmt)  # (format 1: a file name of its own)
    rows = [(start + i, first + i, "pub", f"t/{i % 2}", 1, False, b'{"v": %d}' % i) for i in range(n)]
    w.add(Chunk(PUBLISH, rows, sum(len(r[6]) for r in rows), 0), now=0.0)
    w.close()


def mqttmesh(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "mqttmesh", *args], capture_output=True, text=True, timeout=120, check=False
    )


def test_as_of_is_a_version_or_a_time_and_nothing_else():
    assert parse_as_of("0") == 0 and parse_as_of("12") == 12
    assert parse_as_of("2026-01-31T14:00") == dt.datetime(2026, 1, 31, 14, tzinfo=UTC)
    assert parse_as_of("-1h", now=T14) == dt.datetime(2026, 1, 31, 13, tzinfo=UTC)
    with pytest.raises(OptionError, match="--as-of"):
        parse_as_of("yesterday")


@pytest.mark.spark
def test_a_job_reads_the_tables_current_version_or_an_older_one_and_never_an_uncommitted_file(spark, tmp_path):
    root = tmp_path / "arc"
    flush(root, T13, 1, 10)
    flush(root, T14, 11, 5)
    orphan = root / PUBLISH / "date=2026-01-31" / "hour=14" / "part-99999-killed-mid-write.parquet"
    orphan.write_bytes(b"PAR1 half a file")  # (a writer killed before its commit: no commit names it)
    said: list[str] = []
    df = read_log(spark, [str(root)], PUBLISH, say=said.append)
    assert df.count() == 15 and said == [f"{root / PUBLISH}: Delta table, version 1, 2 files in the time range"]
    assert read_log(spark, [str(root)], PUBLISH, as_of=0, say=said.append).count() == 10
    since = dt.datetime(2026, 1, 31, 14, tzinfo=UTC)
    assert read_log(spark, [str(root)], PUBLISH, since=since, say=said.append).count() == 5
    result = run_traffic(spark, job_options(archive=[str(root)], out=str(tmp_path / "out"), as_of=0), lambda s: None)
    assert result.summary["messages"] == 10
    with pytest.raises(ExtractError, match="version"):
        read_log(spark, [str(root)], PUBLISH, as_of=9)
    plain = tmp_path / "plain"
    flush(plain, T13, 1, 3, fmt="parquet")
    with pytest.raises(ExtractError, match="not a Delta table"):
        read_log(spark, [str(plain)], PUBLISH, as_of=0)
    assert read_log(spark, [str(plain)], PUBLISH).count() == 3  # (format 1 is read as before)


def test_the_archive_command_converts_describes_compacts_and_expires(tmp_path):
    root = tmp_path / "arc"
    for i in range(3):
        flush(root, T13 + i, 1 + 10 * i, 10, fmt="parquet")
    flush(root, T14, 100, 4, fmt="parquet")
    out = mqttmesh("archive", "info", str(root))
    assert out.returncode == 1 and "not a Delta table" in out.stderr
    out = mqttmesh("archive", "convert", str(root))
    assert out.returncode == 0, out.stderr
    assert f"{root / PUBLISH}: 4 files taken into a Delta table (version 0)" in out.stdout
    assert is_table(str(root / PUBLISH))
    out = mqttmesh("archive", "info", str(root))
    assert out.returncode == 0 and "version 0, 4 files, 34 rows" in out.stdout
    assert "hours 2026-01-31T13 .. 2026-01-31T14" in out.stdout
    out = mqttmesh("archive", "compact", str(root))
    assert out.returncode == 0 and "3 files merged into 1 (version 1)" in out.stdout, out.stdout + out.stderr
    assert len(snapshot_files(str(root / PUBLISH))[1]) == 2
    out = mqttmesh("archive", "expire", str(root), "--older-than", "soon")
    assert out.returncode == 2 and "not an age" in out.stderr
    out = mqttmesh("archive", "expire", str(root), "--older-than", "1d", "--vacuum-hours", "0")
    assert out.returncode == 0 and "34 rows before" in out.stdout, out.stdout + out.stderr  # (2026-01-31 is long gone)
    assert snapshot_files(str(root / PUBLISH))[1] == []
    leftovers = [f for _, _, fs in os.walk(root / PUBLISH / "date=2026-01-31") for f in fs]
    assert leftovers == [], "vacuum left files behind"
    out = mqttmesh("archive", "info", str(tmp_path / "nowhere"))
    assert out.returncode == 2 and "no such directory" in out.stderr


@pytest.mark.spark
def test_the_stream_job_reads_a_tables_new_commits_once_and_not_its_compactions(spark, tmp_path):
    """Two runs of the stream job on one checkpoint, a compaction and more flushes between them,
    and a file no commit names beside them: the sink has each message once (the compaction's
    files carry no new data), as the batch job counts them."""
    from pyspark.sql import functions as F
    from pyspark.testing import assertDataFrameEqual

    from mqttmesh.archive.table import compact
    from mqttmesh.pipeline.stream import run_stream
    from mqttmesh.pipeline.traffic import traffic_by

    root, out = tmp_path / "arc", tmp_path / "out"
    for k in range(3):
        flush(root, T14 + k * 50, 1 + 20 * k, 20)
    opts = job_options(archive=[str(root)], out=str(out), window=60, watermark=0, schema="v DOUBLE")
    run_stream(spark, opts, lambda s: None)
    assert compact(str(root / PUBLISH)).files_removed == 3
    for k in range(3, 6):
        flush(root, T14 + k * 50, 1 + 20 * k, 20)
    orphan = root / PUBLISH / "date=2026-01-31" / "hour=14" / "part-99999-killed.parquet"
    orphan.write_bytes(b"not committed")
    run_stream(spark, opts, lambda s: None)
    sink = spark.read.parquet(str(out / "stream" / "traffic")).select("window_start", "topic", "messages", "bytes")
    # newest timestamp 14:04:29 (the last flush: 14:04:10 + 19 s), no delay: the windows up to
    # 14:04 are final, with every message but the last flush's 20
    assert sink.agg(F.sum("messages")).first()[0] == 100
    batch = (
        traffic_by(read_log(spark, [str(root)], PUBLISH), ["topic"], 60)
        .where(F.col("window_end") <= F.lit("2026-01-31 14:04:29").cast("timestamp"))
        .select("window_start", "topic", "messages", "bytes")
    )
    assertDataFrameEqual(sink, batch)
