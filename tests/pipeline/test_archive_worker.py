"""The archive writer process's CPU priority: idle while it keeps up, normal while it is behind.

Real processes: a node with its writer, and a writer started by hand and fed over a real
pipe. The scheduling policy is read from /proc (field 41 of /proc/PID/stat: 0 normal,
5 SCHED_IDLE), as an operator would check it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

import pytest

pytest.importorskip("pyarrow")

from mqttmesh.archive.recorder import Chunk  # noqa: E402
from mqttmesh.archive.schema import PUBLISH  # noqa: E402
from mqttmesh.archive.wire import encode_chunk  # noqa: E402
from support.mesh import publish
from support.pipeline import archive_flags, writer_pid
from support.processes import wait_for

pytestmark = [
    pytest.mark.process,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="SCHED_IDLE and /proc are Linux"),
]

SCHED_OTHER, SCHED_IDLE = 0, 5


def policy_and_nice(pid: int) -> tuple[int, int]:
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return int(fields[38]), int(fields[16])  # fields 41 and 19 of proc(5)


def test_a_node_runs_its_writer_at_idle_priority_unless_told_otherwise(broker_factory, tmp_path):
    idle = broker_factory(*archive_flags(tmp_path / "a"), name="n1")
    pid = wait_for(lambda: writer_pid(idle), 10, what="the archive writer process")
    assert wait_for(lambda: policy_and_nice(pid)[0] == SCHED_IDLE, 10, what="SCHED_IDLE")
    normal = broker_factory(
        *archive_flags(tmp_path / "b", "--archive-writer-idle", "false", "--archive-writer-nice", "7"), name="n2"
    )
    pid = wait_for(lambda: writer_pid(normal), 10, what="the archive writer process")
    assert wait_for(lambda: policy_and_nice(pid) == (SCHED_OTHER, 7), 10, what="nice 7, normal policy")


def thread_policies(pid: int) -> dict[int, tuple[int, int]]:
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
            out[int(tid)] = (int(fields[38]), int(fields[16]))
        except OSError:  # (a thread that just ended)
            pass
    return out


@pytest.mark.parametrize("fmt", ["parquet", "delta"])
def test_every_thread_of_the_writer_runs_at_its_priority(broker_factory, tmp_path, fmt):
    """Linux schedules threads: the threads pyarrow and delta-rs start are set with the
    writer's own (a delta-rs writer whose other threads kept normal priority cost fan-in
    QoS 0 a quarter of its throughput)."""
    archive = tmp_path / "a"
    node = broker_factory(
        *archive_flags(archive, "--archive-format", fmt, "--archive-flush-interval", "0.2"), name="n1"
    )
    publish(node, "a/b", [b"x" * 100] * 200, qos=1, client_id="pub")
    wait_for(lambda: any(n.endswith(".parquet") for _, _, ns in os.walk(archive) for n in ns), 10, what="a file")
    pid = wait_for(lambda: writer_pid(node), 10, what="the archive writer process")
    policies = thread_policies(pid)
    assert len(policies) > 1 and set(policies.values()) == {(SCHED_IDLE, 10)}, policies


def test_a_writer_that_falls_behind_runs_normally_until_it_has_caught_up(tmp_path):
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mqttmesh.archive.worker",
            "--dir",
            str(tmp_path / "a"),
            "--node",
            "n1",
            "--incarnation",
            "1",
            "--idle",
            "1",
            "--nice",
            "3",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert wait_for(lambda: policy_and_nice(proc.pid) == (SCHED_IDLE, 3), 30, what="SCHED_IDLE at start")
        payload = b"p" * 200
        frame = b"".join(
            encode_chunk(
                Chunk(
                    PUBLISH, [(1769868000.25, i, "pub", "a/b", 0, False, payload) for i in range(1024)], 200 * 1024, 0
                )
            )
        )
        sent = 0
        stop = threading.Event()

        def feed():  # keeps the pipe full (blocking writes) until told to stop; at most 3,000 frames
            nonlocal sent
            while not stop.is_set() and sent < 3000:
                proc.stdin.write(frame)
                proc.stdin.flush()
                sent += 1

        feeder = threading.Thread(target=feed, daemon=True)
        feeder.start()
        try:
            wait_for(
                lambda: policy_and_nice(proc.pid) == (SCHED_OTHER, 3) or not feeder.is_alive(),
                60,
                what="normal scheduling while the pipe backs up",
            )
            assert policy_and_nice(proc.pid) == (SCHED_OTHER, 3)
        finally:
            stop.set()
            feeder.join(60)
        assert wait_for(
            lambda: policy_and_nice(proc.pid)[0] == SCHED_IDLE, 60, what="idle priority again once the pipe is empty"
        )
        proc.stdin.close()
        out, err = proc.stdout.read(), proc.stderr.read()  # both end when the writer exits
        proc.wait(60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err.decode()
    reports = [json.loads(line) for line in out.decode().splitlines()]
    assert sum(r["written"] for r in reports) == sent * 1024
    assert sum(r["failed"] for r in reports) == 0
    assert sent > 1 and os.path.isdir(tmp_path / "a" / "publish")
