"""The stream job: killed (the driver and its JVM, kill -9) in the middle, started again from its
checkpoint, it ends with the batch job's totals: nothing counted twice, nothing left out."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

pytest.importorskip("pyarrow")

from pyspark.sql import functions as F  # noqa: E402
from pyspark.testing import assertDataFrameEqual  # noqa: E402

from mqttmesh.archive.recorder import ArchiveLimits, Chunk  # noqa: E402
from mqttmesh.archive.schema import PUBLISH  # noqa: E402
from mqttmesh.archive.writer import FileWriter  # noqa: E402
from mqttmesh.pipeline.extract import read_log  # noqa: E402
from mqttmesh.pipeline.jobs import job_options  # noqa: E402
from mqttmesh.pipeline.stream import run_stream  # noqa: E402
from mqttmesh.pipeline.traffic import traffic_by  # noqa: E402
from support.processes import wait_for

pytestmark = [pytest.mark.process, pytest.mark.spark]

T = 1769868000.0  # 2026-01-31T14:00:00Z


def write_file(root, number, times, first_seq):
    w = FileWriter(str(root), "n1", number, ArchiveLimits())
    rows = [
        (t, first_seq + i, "pub", f"t/{(first_seq + i) % 3}", 1, False, b'{"v": %d}' % (first_seq + i))
        for i, t in enumerate(times)
    ]
    w.add(Chunk(PUBLISH, rows, sum(len(r[6]) for r in rows), 0), now=0.0)
    w.close()


def children(pid):
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as fh:
                    if int(fh.read().rsplit(")", 1)[1].split()[1]) == pid:
                        out.append(int(entry))
            except (OSError, ValueError, IndexError):
                pass
    return out


def gone(pid):
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def commits(checkpoint):
    path = os.path.join(checkpoint, "traffic", "commits")
    return sorted(n for n in os.listdir(path) if n.isdigit()) if os.path.isdir(path) else []


def batch_windows(spark, archive, closed_before):
    pub = read_log(spark, [str(archive)], PUBLISH)
    return (
        traffic_by(pub, ["topic"], 60)
        .where(F.col("window_end") <= F.lit(closed_before).cast("timestamp"))
        .select("window_start", "topic", "messages", "bytes")
    )


# above the waits inside (180 s for two micro-batches, 30 s for the kill, then the re-run): a
# pytest timeout in the middle of a py4j call breaks the worker's shared SparkSession for every
# later test of the worker, where the wait's own deadline fails this test alone
@pytest.mark.timeout(420)
def test_the_stream_job_restarted_after_a_kill_gives_the_batch_totals(spark, tmp_path):
    archive, out = tmp_path / "archive", tmp_path / "out"
    # six files, 20 messages each, one every 2.5 s from 14:00:00 to 14:04:57.5
    for k in range(6):
        write_file(archive, k + 1, [T + k * 50 + i * 2.5 for i in range(20)], 1 + 20 * k)
    args = [
        "--archive",
        str(archive),
        "--out",
        str(out),
        "--window",
        "60",
        "--watermark",
        "0",
        "--schema",
        "v DOUBLE",
        "--shuffle-partitions",
        "2",
    ]
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mqttmesh",
            "analyze",
            "stream",
            *args,
            "--trigger",
            "1",
            "--max-files-per-trigger",
            "1",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    jvms = []
    try:
        wait_for(
            lambda: len(commits(out / "checkpoint")) >= 2 or proc.poll() is not None,
            180,
            interval=0.1,
            what="two committed micro-batches",
        )
        assert proc.poll() is None, proc.stderr.read().decode(errors="replace")[-3000:]
        jvms = children(proc.pid)
        for pid in jvms:
            os.kill(pid, signal.SIGKILL)
        proc.kill()
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(30)
        proc.stderr.close()
    for pid in jvms:
        wait_for(lambda pid=pid: gone(pid), 30, what=f"the JVM {pid} to be gone")
    done = commits(out / "checkpoint")
    assert 2 <= len(done) < 6, done  # killed with files left to read

    opts = job_options(archive=[str(archive)], out=str(out), window=60, watermark=0, schema="v DOUBLE")
    run_stream(spark, opts, lambda s: None)
    sink = spark.read.parquet(str(out / "stream" / "traffic")).select("window_start", "topic", "messages", "bytes")
    # newest timestamp 14:04:57.5 with no delay: the windows up to 14:04 are final, 14:04-14:05 is not
    assertDataFrameEqual(sink, batch_windows(spark, archive, "2026-01-31 14:04:57.5"))
    assert sink.count() == 12 and sink.agg(F.sum("messages")).first()[0] == 96
    payloads = spark.read.parquet(str(out / "stream" / "payloads"))
    assert payloads.agg(F.sum("count")).first()[0] == 96

    # later data closes the last window; a third run adds it, once
    write_file(archive, 7, [T + 400], 121)
    run_stream(spark, opts, lambda s: None)
    sink = spark.read.parquet(str(out / "stream" / "traffic")).select("window_start", "topic", "messages", "bytes")
    assertDataFrameEqual(sink, batch_windows(spark, archive, "2026-01-31 14:06:40"))
    assert sink.agg(F.sum("messages")).first()[0] == 120
