"""The driver JVM's class data archive (pipeline/session.py ``class_archive``): made by a first
run as its JVM exits, taken once that run is over and the file settled, then mapped."""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys

from mqttmesh.pipeline import session as S

JAVA = 'openjdk version "17.0.15" 2025-04-15'


def test_made_by_a_first_run_then_mapped(tmp_path, monkeypatch):
    monkeypatch.delenv("MQTTMESH_SPARK_CDS", raising=False)
    first = S.class_archive(JAVA, str(tmp_path))
    assert first is not None and first.startswith("-XX:ArchiveClassesAtExit=") and S.QUIET in first
    made = first.split()[0].split("=", 1)[1]
    assert made.endswith(f".tmp-{os.getpid()}")
    # while this run (the one the name gives) lives, or its file is fresh, nobody takes it nor
    # makes another
    with open(made, "wb") as fh:
        fh.write(b"x" * 100)
    assert S.class_archive(JAVA, str(tmp_path)) is None
    # a run that ended (a process that exited) and a file left alone for CDS_SETTLED seconds
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    done = made.rsplit("-", 1)[0] + "-" + gone.stdout.strip()
    os.replace(made, done)
    assert S.class_archive(JAVA, str(tmp_path)) is None  # (fresh)
    old = os.path.getmtime(done) - S.CDS_SETTLED - 1
    os.utime(done, (old, old))
    mapped = S.class_archive(JAVA, str(tmp_path))
    final = done.rsplit(".tmp-", 1)[0]
    assert mapped == f"-XX:SharedArchiveFile={final} {S.QUIET}"
    assert os.listdir(tmp_path) == [os.path.basename(final)]
    # another Java (or PySpark) has its own archive
    assert S.class_archive('openjdk version "21.0.1"', str(tmp_path)).startswith("-XX:ArchiveClassesAtExit=")


def test_turned_off(tmp_path, monkeypatch):
    monkeypatch.setenv("MQTTMESH_SPARK_CDS", "off")
    assert S.class_archive(JAVA, str(tmp_path)) is None
    assert os.listdir(tmp_path) == []


def test_a_small_local_job_compiles_with_the_quick_compiler_only(tmp_path, monkeypatch):
    """session.quick_jit: C1 only below QUICK_JIT_BYTES of archive on a local master; the full
    tiered compiler for a large or unknown input, on a cluster, or as MQTTMESH_SPARK_JIT says."""
    monkeypatch.setenv("MQTTMESH_SPARK_CDS", "off")
    monkeypatch.delenv("MQTTMESH_SPARK_JIT", raising=False)
    for kind, size in (("publish", 3000), ("delivery", 500)):
        folder = tmp_path / "a" / kind / "date=2026-01-31" / "hour=12"
        folder.mkdir(parents=True)
        (folder / "n1-1-000001.parquet").write_bytes(b"x" * size)
        (folder / ".n1-1-000002.parquet.tmp").write_bytes(b"x" * 99)  # (not a data file)
    root = str(tmp_path / "a")
    assert S.archive_bytes([root], ("publish",)) == 3000
    assert S.archive_bytes([root, "file://" + root], ("publish", "delivery")) == 7000
    assert S.archive_bytes([root, "hdfs://nn/a"], ("publish",)) is None
    # what the job reads: the hours of --since/--until only
    later = tmp_path / "a" / "publish" / "date=2026-01-31" / "hour=13"
    later.mkdir()
    (later / "n1-1-000003.parquet").write_bytes(b"x" * 400)
    at = dt.datetime(2026, 1, 31, 13, tzinfo=dt.UTC)
    assert S.archive_bytes([root], ("publish",)) == 3400
    assert S.archive_bytes([root], ("publish",), since=at) == 400
    assert S.archive_bytes([root], ("publish",), until=at) == 3000
    assert S.archive_bytes([root], ("publish",), at - dt.timedelta(minutes=1), at + dt.timedelta(minutes=1)) == 3400
    assert S.driver_options("local[2]", 3000) == S.QUICK_JIT
    assert S.driver_options("local[2]", S.QUICK_JIT_BYTES) == ""
    assert S.driver_options("local[2]", None) == ""
    assert S.driver_options("spark://m:7077", 3000) == ""
    monkeypatch.setenv("MQTTMESH_SPARK_JIT", "full")
    assert S.driver_options("local[2]", 3000) == ""
    monkeypatch.setenv("MQTTMESH_SPARK_JIT", "quick")
    assert S.driver_options("local[*]", None) == S.QUICK_JIT
