"""Bad input: corrupt, truncated, foreign and other-version archive files; non-JSON payloads."""

from __future__ import annotations

import datetime as dt
import os
import shutil

import pytest

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

from mqttmesh.archive.recorder import ArchiveLimits, Chunk  # noqa: E402
from mqttmesh.archive.schema import PUBLISH  # noqa: E402
from mqttmesh.archive.writer import FileWriter  # noqa: E402
from mqttmesh.pipeline.extract import ExtractError, check_file, list_files, read_log  # noqa: E402
from mqttmesh.pipeline.jobs import job_options, run_payloads, run_traffic  # noqa: E402

T13 = 1769864400.0  # 2026-01-31T13:00:00Z
T14 = 1769868000.0  # 2026-01-31T14:00:00Z
UTC = dt.UTC


def write_archive(root, hour_starts, per_file, payload=lambda i: b'{"v": %d}' % i):
    """One file per hour of ``per_file`` messages; returns the file paths."""
    w = FileWriter(str(root), "n1", 1, ArchiveLimits())
    seq = 0
    for start in hour_starts:
        rows = []
        for i in range(per_file):
            seq += 1
            rows.append((start + i, seq, "pub", f"t/{i % 2}", 1, False, payload(seq)))
        w.add(Chunk(PUBLISH, rows, sum(len(r[6]) for r in rows), seq - per_file), now=0.0)
        w.close()
    return list_files([str(root)], PUBLISH)


@pytest.fixture
def archive(tmp_path):
    """Two good files of 5 messages (13:00 and 14:00) and, in the 14:00 directory, a truncated
    file, a garbage file, a foreign Parquet file, a file of another format version and a hidden
    file still being written."""
    root = tmp_path / "archive"
    good = write_archive(root, [T13, T14], 5)
    folder = os.path.dirname(good[1])
    with open(good[1], "rb") as fh:
        data = fh.read()
    bad = {
        "n1-1-000090.parquet": data[: len(data) // 2],  # truncated
        "n1-1-000091.parquet": b"this is not parquet at all" * 10,  # garbage
    }
    for name, content in bad.items():
        with open(os.path.join(folder, name), "wb") as fh:
            fh.write(content)
    pq.write_table(pa.table({"x": [1, 2]}), os.path.join(folder, "n1-1-000092.parquet"))  # foreign
    v2 = pq.read_table(good[1]).replace_schema_metadata({b"mqttmesh.archive": b"2", b"mqttmesh.kind": b"publish"})
    pq.write_table(v2, os.path.join(folder, "n1-1-000093.parquet"))  # other version
    shutil.copy(good[1], os.path.join(folder, ".n1-1-000094.parquet.tmp"))  # being written
    return root, good, folder


@pytest.mark.spark
def test_bad_files_are_named_and_skipped(spark, archive):
    root, good, folder = archive
    notes = []
    df = read_log(spark, [str(root)], PUBLISH, on_corrupt="skip", say=notes.append)
    assert df.count() == 10
    assert len(notes) == 4
    assert notes[0].startswith(f"skipping {folder}/n1-1-000090.parquet: not a readable Parquet file (")
    assert notes[1].startswith(f"skipping {folder}/n1-1-000091.parquet: not a readable Parquet file (")
    assert notes[2:] == [
        f"skipping {folder}/n1-1-000092.parquet: not an mqttmesh archive file (no mqttmesh.archive metadata)",
        f"skipping {folder}/n1-1-000093.parquet: archive format version 2, this mqttmesh reads 1",
    ]


@pytest.mark.spark
def test_or_the_job_stops_with_the_first_bad_file_named(spark, archive):
    root, _, folder = archive
    with pytest.raises(ExtractError) as err:
        read_log(spark, [str(root)], PUBLISH, on_corrupt="fail")
    assert str(err.value).startswith(f"{folder}/n1-1-000090.parquet: not a readable Parquet file")
    assert str(err.value).endswith("(--on-corrupt skip leaves such files out)")


def test_a_damaged_page_behind_a_good_footer_is_found_by_full_verification(tmp_path):
    (path,) = write_archive(tmp_path / "a", [T14], 2000, payload=lambda i: b'{"v": %d, "pad": "%s"}' % (i, b"x" * 60))
    size = os.path.getsize(path)
    with open(path, "r+b") as fh:  # scribble over the middle of the data pages
        fh.seek(size // 3)
        fh.write(b"\xff" * 512)
    assert check_file(path, PUBLISH) is None
    problem = check_file(path, PUBLISH, full=True)
    assert problem is not None and problem.startswith("damaged data (")


def test_a_time_range_leaves_other_hours_unlisted(tmp_path):
    files = write_archive(tmp_path / "a", [T13, T14], 1)
    since = dt.datetime(2026, 1, 31, 14, 0, tzinfo=UTC)
    assert list_files([str(tmp_path / "a")], PUBLISH, since=since) == [files[1]]
    assert list_files([str(tmp_path / "a")], PUBLISH, until=since) == [files[0]]


@pytest.mark.spark
def test_an_empty_archive_is_a_clear_error(spark, tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ExtractError, match="no publish log files under"):
        read_log(spark, [str(tmp_path / "empty")], PUBLISH)
    with pytest.raises(ExtractError, match="no such directory"):
        read_log(spark, [str(tmp_path / "missing")], PUBLISH)


@pytest.mark.spark
def test_the_traffic_job_reports_skipped_files_and_counts_the_rest(spark, archive, tmp_path):
    root, _, folder = archive
    said = []
    result = run_traffic(spark, job_options(archive=[str(root)], out=str(tmp_path / "out")), said.append)
    assert result.summary["messages"] == 10
    assert len(said) == 4 and all(s.startswith(f"skipping {folder}/n1-1-00009") for s in said)
    page = open(result.html, encoding="utf-8").read()
    assert "n1-1-000091.parquet" in page and "n1-1-000093.parquet" in page


@pytest.mark.spark
def test_non_json_payloads_are_counted_not_fatal(spark, tmp_path):
    # seq 1..12: every third payload is not a JSON object (3, 6, 9, 12: text, array, bytes, number)
    odd = {3: b"21.5;40", 6: b"[1, 2]", 9: b"\xff\x00\xfe", 12: b"42"}
    root = tmp_path / "a"
    write_archive(root, [T14], 12, payload=lambda i: odd.get(i, b'{"v": %d}' % i))
    # (v rises on every message of its topic: a counter, left out unless asked for)
    opts = job_options(archive=[str(root)], out=str(tmp_path / "out"), level=1, fields="all")
    result = run_payloads(spark, opts, lambda s: None)
    assert (result.summary["messages"], result.summary["json_objects"], result.summary["non_json"]) == (12, 8, 4)
    assert result.summary["numeric_fields"] == "v"
    # v over the JSON ones: 1 2 4 5 7 8 10 11 -> count 8, min 1, max 11, mean 6
    with open(result.tables["payload_totals"].csv) as fh:
        assert fh.read().splitlines() == ["pattern,field,count,min,max,mean,p50,p95", "t/#,v,8,1,11,6,5,11"]
    with open(result.tables["payload_quality"].csv) as fh:
        assert fh.read().splitlines() == ["pattern,messages,json,non_json,non_json_share", "t/#,12,8,4,0.333333"]


@pytest.mark.spark
def test_the_payload_sample_read_on_the_driver_is_the_one_spark_reads(spark, tmp_path):
    """payloads.sample_payloads reads a local archive's sample with pyarrow (no Spark job): the
    same JSON objects as Spark's json_object_keys finds, in the same time range; a URI or a file
    pyarrow cannot read goes to Spark."""
    from mqttmesh.pipeline import payload_schema
    from mqttmesh.pipeline import payloads as P
    from mqttmesh.pipeline.common import with_pattern

    odd = {
        2: b"21.5;40",  # text
        3: b"[1, 2]",  # JSON, not an object
        5: b"\xff\x00\xfe",  # not UTF-8
        7: b"42",
        8: b'{"v": NaN}',  # not JSON
        11: b'{"v": {"w": [1, {"x": 2}]}}',
        13: b"",
        14: b'{"a": 1, "a": 2}',  # repeated key: an object for both
        16: b'  {"v": 16}  ',  # white space around
    }
    root = tmp_path / "a"
    write_archive(root, [T13, T14], 10, payload=lambda i: odd.get(i, b'{"v": %d}' % i))
    since = dt.datetime.fromtimestamp(T13 + 3, UTC)
    until = dt.datetime.fromtimestamp(T14 + 7, UTC)
    for lo, hi in ((None, None), (since, None), (None, until), (since, until)):
        pub = read_log(spark, [str(root)], PUBLISH, lo, hi, say=lambda s: None)
        flagged = P.with_json_flag(with_pattern(pub, level=1))
        files = pub.inputFiles()
        on_driver = P.sample_payloads(flagged, 1000, files, lo, hi)
        by_spark = P.sample_payloads(flagged, 1000)
        assert sorted((t, x) for t, _, x in on_driver) == sorted((t, x) for t, _, x in by_spark), (lo, hi)
        assert len(on_driver) == sum(1 for r in pub.collect() if (r.seq not in odd or r.seq in (11, 14, 16)))
    # the first N in time order
    first = P.sample_payloads(flagged, 3, files, since, until)
    assert [x for _, _, x in first] == ['{"v": 4}', '{"v": 6}', '{"v": 9}']
    assert payload_schema.local_sample(["hdfs://nn/archive/publish/x.parquet"], 10, None, None) is None
    assert payload_schema.local_sample([str(tmp_path / "gone.parquet")], 10, None, None) is None
