"""The archive on real broker processes: what is written, when, and what a slow or dead writer does."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

pytest.importorskip("pyarrow.parquet")

from support.mesh import Subscriber, publish, start_mesh, status, wait_converged, wait_interest
from support.mqttraw import PUBCOMP, PUBREC, RawClient, pubrel
from support.mqttraw import publish as publish_frame
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
    # (a graceful stop flushes the archive, which the writer, stopped until now, catches up
    # on: on a loaded machine, load average 12, that took more than stop's default 10 s)
    assert node.stop(timeout=60.0) == 0
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


def _archived_by(directory, kind="publish") -> list[tuple[str, dict]]:
    """(the node that wrote it, row) for every row of ``kind``: the file's ``mqttmesh.node``."""
    import pyarrow.parquet as pq

    out = []
    for dirpath, _, names in os.walk(os.path.join(directory, kind)):
        for n in sorted(names):
            if n.endswith(".parquet") and not n.startswith("."):
                table = pq.read_table(os.path.join(dirpath, n))
                node = table.schema.metadata[b"mqttmesh.node"].decode()
                out += [(node, row) for row in table.to_pylist()]
    return out


def test_a_will_its_registrar_publishes_for_a_killed_nodes_client_is_archived_under_its_id(broker_factory, tmp_path):
    """The will of a client whose node was killed is published by its registrar as (that
    node, the number reserved at CONNECT): the registrar archives it under that id, the one
    the subscriber's delivery row carries, so the audit joins them (before, the registrar
    named itself as its origin and the audit counted the will lost)."""
    edges = [("b", "a"), ("c", "a"), ("c", "b")]
    archive = tmp_path / "archive"  # (shared: each file names its node)
    flags = archive_flags(
        archive,
        "--archive-format",
        "parquet",
        "--archive-delivery-log",
        "true",
        "--archive-flush-interval",
        "0.2",
        "--mesh-keepalive",
        "0.3",
    )
    nodes = start_mesh(broker_factory, ["a", "b", "c"], edges, extra=flags)
    wait_converged(nodes, edges)
    watcher = Subscriber(nodes["b"], "watcher", "lwt/#", qos=1)
    try:
        wait_interest(nodes, "lwt/#", "b")
        doomed = RawClient(nodes["a"].host, nodes["a"].port)
        doomed.connect(client_id="doomed", will=("lwt/doomed", b"node died", 1, False))
        publish(nodes["a"], "lwt/alive", [b"a is up"], qos=1)  # (a's own message: origin a, written by a)
        watcher.wait_count(1)
        wait_for(lambda: any(r["topic"] == "lwt/alive" for r in read_archive(archive)), 10, what="a's own row")
        nodes["a"].kill()
        watcher.wait_count(2, timeout=15)
        assert watcher.payloads() == [b"a is up", b"node died"]

        def will_rows():
            dlv = [r for _, r in _archived_by(archive, "delivery") if r["topic"] == "lwt/doomed"]
            pub = [(n, r) for n, r in _archived_by(archive) if r["topic"] == "lwt/doomed"]
            return dlv and pub and (dlv, pub)

        delivered, published = wait_for(will_rows, 10, what="the will's publish and delivery rows")
        assert [(r["client_id"], r["node"], r["origin"]) for r in delivered] == [("watcher", "b", "a")]
        ((writer, row),) = published
        assert writer in ("b", "c")  # its registrar (a is dead)
        assert (row["origin"], row["msg_id"], row["seq"]) == ("a", delivered[0]["msg_id"], delivered[0]["seq"])
        assert (row["publisher"], row["payload"]) == ("doomed", b"node died")
        # the common case beside it: a's own message, archived by a under its own id
        own = [(n, r["origin"], r["msg_id"]) for n, r in _archived_by(archive) if r["topic"] == "lwt/alive"]
        assert [(n, o) for n, o, _ in own] == [("a", "a")] and own[0][2].startswith("a:")
        doomed.close()
    finally:
        watcher.close()


def test_a_qos2_message_resent_to_another_node_after_its_node_was_killed_is_archived_under_its_id(
    broker_factory, tmp_path
):
    """The fault harness's finding (bench/chaos/auditcheck.py): a persistent publisher's QoS 2
    message is routed only once its session's other holders have it with its id (a:S); its
    node a is killed before that, the client re-sends the PUBLISH to b, and b routes it under
    a:S. b archives it under a:S too, the id the subscriber's delivery row carries. (b and c
    are stopped while a takes the message, so that a cannot route it: its "in" settlement
    waits in their sockets until they go on.)"""
    edges = [("b", "a"), ("c", "a"), ("c", "b")]
    archive = tmp_path / "archive"
    flags = archive_flags(
        archive, "--archive-format", "parquet", "--archive-delivery-log", "true", "--archive-flush-interval", "0.2"
    )
    nodes = start_mesh(broker_factory, ["a", "b", "c"], edges, extra=flags)  # (replication 3: all hold it)
    wait_converged(nodes, edges)
    sub = Subscriber(nodes["c"], "sub", "q2/#", qos=2)
    try:
        wait_interest(nodes, "q2/#", "c")
        pub = RawClient(nodes["a"].host, nodes["a"].port)
        pub.connect(client_id="pub", clean=False)
        pub.send(publish_frame("q2/x", b"first", qos=2, pid=1))  # the holders in step: PUBREC after them
        pub.expect(PUBREC, 10)
        pub.send(pubrel(1))
        pub.expect(PUBCOMP, 10)
        sub.wait_count(1)
        # a's row of the first message flushed before a dies (kill -9 loses an unflushed tail)
        wait_for(
            lambda: [n for n, r in _archived_by(archive) if r["topic"] == "q2/x"] == ["a"],
            10,
            what="a's publish row of the first message",
        )
        stopped = [nodes["b"].pid, nodes["c"].pid]
        for pid in stopped:
            os.kill(pid, signal.SIGSTOP)
        try:
            pub.send(publish_frame("q2/x", b"second", qos=2, pid=2))
            # a status round trip on a new connection turns a's loop several times after the
            # PUBLISH: its "in" settlement to b and c is in their sockets by then
            status(nodes["a"])
            nodes["a"].kill()
        finally:
            for pid in stopped:
                os.kill(pid, signal.SIGCONT)
        pub.close()
        wait_converged({n: nodes[n] for n in ("b", "c")}, [("c", "b")])
        moved = RawClient(nodes["b"].host, nodes["b"].port)
        assert moved.connect(client_id="pub", clean=False).body == b"\x01\x00"  # session present
        moved.send(publish_frame("q2/x", b"second", qos=2, dup=True, pid=2))
        moved.expect(PUBREC, 10)
        moved.send(pubrel(2))
        moved.expect(PUBCOMP, 10)
        sub.wait_count(2)
        assert sub.payloads() == [b"first", b"second"]  # once [MQTT-4.3.3-2]
        moved.close()

        def rows():
            dlv = [r for _, r in _archived_by(archive, "delivery") if r["topic"] == "q2/x"]
            pub_rows = [(n, r) for n, r in _archived_by(archive) if r["topic"] == "q2/x"]
            return len(dlv) == 2 and len(pub_rows) == 2 and (dlv, pub_rows)

        delivered, published = wait_for(rows, 10, what="the publish and delivery rows of both messages")
        by_payload = {r["payload"]: (n, r) for n, r in published}
        writer, second = by_payload[b"second"]
        assert writer == "b" and second["origin"] == "a"  # archived by b, under a's id
        assert sorted(r["msg_id"] for r in delivered) == sorted(r["msg_id"] for _, r in published)
        assert {(n, r["origin"]) for n, r in published} == {("a", "a"), ("b", "a")}
    finally:
        sub.close()
