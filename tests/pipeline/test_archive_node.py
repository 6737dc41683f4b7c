"""The archive on real broker processes: what is written, when, and what a slow or dead writer does."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

pytest.importorskip("pyarrow.parquet")

from support.mesh import Subscriber, publish
from support.pipeline import archive_flags, read_archive, writer_pid
from support.processes import wait_for

pytestmark = pytest.mark.process


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_a_graceful_stop_writes_every_message_published_at_the_node(broker_factory, tmp_path):
    archive = tmp_path / "archive"
    node = broker_factory(*archive_flags(archive, "--archive-flush-interval", "3600"), name="n1")
    publish(node, "a/b", [b"m%d" % i for i in range(50)], qos=1, client_id="pub-1")
    publish(node, "a/c", [b"r"], qos=2, client_id="pub-2", retain=True)
    publish(node, "a/d", [b"z"], qos=0, client_id="pub-3")
    assert read_archive(archive) == []  # an hour-long interval: nothing written yet
    assert node.stop() == 0
    rows = read_archive(archive)
    assert len(rows) == 52
    assert [r["payload"] for r in rows[:50]] == [b"m%d" % i for i in range(50)]
    assert {(r["topic"], r["publisher"], r["qos"], r["retain"]) for r in rows} == {
        ("a/b", "pub-1", 1, False),
        ("a/c", "pub-2", 2, True),
        ("a/d", "pub-3", 0, False),
    }
    assert all(r["origin"] == "n1" and r["msg_id"] == f"n1:{r['seq']}" for r in rows)
    assert len({r["seq"] for r in rows}) == 52
    assert all(r["payload_size"] == len(r["payload"]) for r in rows)
    assert [r["seq"] for r in rows] == sorted(r["seq"] for r in rows)
    assert "archive: 52 published records written in 1 files" in node.log()


def test_files_appear_within_the_flush_interval_and_only_matching_topics(broker_factory, tmp_path):
    archive = tmp_path / "archive"
    node = broker_factory(
        *archive_flags(
            archive, "--archive-flush-interval", "0.4", "--archive-filter", "keep/#", "--archive-filter", "also/+"
        ),
        name="n1",
    )
    publish(node, "keep/x", [b"1", b"2"], qos=1)
    publish(node, "drop/x", [b"3"], qos=1)
    publish(node, "also/y", [b"4"], qos=1)
    publish(node, "also/y/z", [b"5"], qos=1)
    rows = wait_for(
        lambda: len(read_archive(archive)) == 3 and read_archive(archive),
        10,
        what="the archive files of the first messages",
    )
    assert sorted(r["payload"] for r in rows) == [b"1", b"2", b"4"]
    assert not [n for _, _, names in os.walk(archive) for n in names if n.endswith(".tmp")]


def test_the_delivery_log_has_one_row_per_publish_sent_to_a_client(broker_factory, tmp_path):
    archive = tmp_path / "archive"
    node = broker_factory(*archive_flags(archive, "--archive-delivery-log", "true"), name="n1")
    sub = Subscriber(node, "sub-1", "t/#", qos=2)
    sub0 = Subscriber(node, "sub-0", "t/#", qos=0)
    publish(node, "t/1", [b"a", b"b"], qos=1, client_id="pub")
    sub.wait_count(2)
    sub0.wait_count(2)
    sub.close()
    sub0.close()
    assert node.stop() == 0
    published = {r["msg_id"]: r for r in read_archive(archive)}
    deliveries = read_archive(archive, "delivery")
    assert sorted((d["client_id"], d["qos"], d["dup"], d["node"]) for d in deliveries) == [
        ("sub-0", 0, False, "n1"),
        ("sub-0", 0, False, "n1"),
        ("sub-1", 1, False, "n1"),
        ("sub-1", 1, False, "n1"),
    ]
    for d in deliveries:
        p = published[d["msg_id"]]
        assert (d["origin"], d["seq"], d["topic"], d["published"]) == (
            p["origin"],
            p["seq"],
            p["topic"],
            p["timestamp"],
        )
        assert d["timestamp"] >= d["published"]
    assert sorted(d["log_seq"] for d in deliveries) == [0, 1, 2, 3]


def test_a_stalled_writer_never_blocks_delivery_and_drops_are_counted_and_logged(broker_factory, tmp_path):
    archive = tmp_path / "archive"
    node = broker_factory(
        *archive_flags(
            archive,
            "--archive-flush-rows",
            "10",
            "--archive-max-queue-rows",
            "20",
            "--archive-flush-interval",
            "0.2",
            "--archive-log-interval",
            "0.2",
        ),
        name="n1",
    )
    pid = wait_for(lambda: writer_pid(node), 10, what="the archive writer process")
    os.kill(pid, signal.SIGSTOP)  # a disk that does not answer
    try:
        sub = Subscriber(node, "sub", "s/#", qos=1)
        publish(node, "s/1", [b"%d" % i for i in range(300)], qos=1, client_id="pub")  # every PUBACK arrives
        sub.wait_count(300)
        sub.close()
        wait_for(lambda: "archive: dropped" in node.log(), 10, what="the log line about dropped records")
    finally:
        os.kill(pid, signal.SIGCONT)
    assert node.stop() == 0
    written = len(read_archive(archive))
    line = [x for x in node.log().splitlines() if "published records written" in x][-1]
    dropped = int(line.split("; ")[1].split(" dropped")[0])
    assert 0 < written < 300 and written + dropped == 300, line
    assert "the writer is behind" in node.log()


def test_a_writer_that_dies_is_started_again(broker_factory, tmp_path):
    archive = tmp_path / "archive"
    node = broker_factory(  # (format 1, whose file names count the writer's restarts)
        *archive_flags(archive, "--archive-flush-interval", "0.2", "--archive-format", "parquet"), name="n1"
    )
    first = wait_for(lambda: writer_pid(node), 10, what="the archive writer process")
    os.kill(first, signal.SIGKILL)
    wait_for(lambda: "archive: the writer process" in node.log(), 10, what="the log line about the dead writer")
    second = wait_for(lambda: (p := writer_pid(node)) and p != first and p, 10, what="a new writer process")
    publish(node, "after/restart", [b"x"], qos=1)
    rows = wait_for(lambda: read_archive(archive), 10, what="a file from the new writer")
    assert [r["topic"] for r in rows] == ["after/restart"]
    assert any(".1-" in n for _, _, names in os.walk(archive) for n in names)  # the restart count names it
    assert alive(second)


def test_the_writer_ends_when_its_node_is_killed(broker_factory, tmp_path):
    node = broker_factory(*archive_flags(tmp_path / "archive"), name="n1")
    pid = wait_for(lambda: writer_pid(node), 10, what="the archive writer process")
    node.kill()
    wait_for(lambda: not alive(pid), 10, what="the writer to see the end of its input and exit")


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--archive", "true"], "archive.dir: the archive needs a directory"),
        (["--archive", "true", "--archive-dir", "{tmp}", "--archive-filter", "a/#/b"], "archive.filters: 'a/#/b'"),
        (
            [
                "--archive",
                "true",
                "--archive-dir",
                "{tmp}",
                "--archive-flush-rows",
                "100",
                "--archive-max-queue-rows",
                "150",
            ],
            "archive.max_queue_rows (150) must be at least twice flush_rows (100)",
        ),
        (["--archive", "true", "--archive-dir", "{tmp}/file/sub"], "archive.dir: cannot write to"),
    ],
)
def test_archive_settings_that_cannot_work_stop_the_node_with_their_name(tmp_path, flags, message):
    (tmp_path / "file").write_text("not a directory")
    flags = [f.replace("{tmp}", str(tmp_path)) for f in flags]
    cmd = [sys.executable, "-m", "mqttmesh", "broker", "--port", "0", *flags]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr
