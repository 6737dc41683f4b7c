"""archive.format = delta on real broker processes: a flush is one commit, and a writer or a node
killed with kill -9 in the middle of its flushes leaves no partial and no duplicate rows."""

from __future__ import annotations

import json
import os
import random
import signal

import pytest

pytest.importorskip("pyarrow.parquet")
pytest.importorskip("deltalake")

from mqttmesh.archive.table import is_table, snapshot_files
from support.mesh import publish
from support.pipeline import archive_flags, writer_pid
from support.processes import wait_for

pytestmark = pytest.mark.process


def table_rows(archive, kind="publish"):
    import pyarrow.parquet as pq

    rows = []
    for f in snapshot_files(os.path.join(archive, kind))[1]:
        rows += pq.read_table(f).to_pylist()
    return rows


def commits(archive, kind="publish"):
    """(version, our application's transaction version) of each commit of the log."""
    log = os.path.join(archive, kind, "_delta_log")
    out = []
    for name in sorted(os.listdir(log)):
        if name.endswith(".json"):
            with open(os.path.join(log, name)) as fh:
                actions = [json.loads(line) for line in fh if line.strip()]
            txn = [a["txn"]["version"] for a in actions if "txn" in a]
            out.append((int(name.split(".")[0]), txn[0] if txn else None))
    return out


def test_a_graceful_stop_commits_every_message_in_one_flush(broker_factory, tmp_path):
    archive = tmp_path / "archive"
    node = broker_factory(
        *archive_flags(archive, "--archive-format", "delta", "--archive-flush-interval", "3600"), name="n1"
    )
    publish(node, "a/b", [b"m%d" % i for i in range(50)], qos=1, client_id="pub-1")
    assert not is_table(str(archive / "publish"))  # (nothing flushed yet)
    assert node.stop() == 0
    rows = table_rows(archive)
    assert sorted(r["seq"] for r in rows) == sorted({r["seq"] for r in rows}) and len(rows) == 50
    assert commits(archive) == [(0, 1)]
    assert "archive: 50 published records written in 1 files" in node.log()


def test_writers_and_a_node_killed_mid_flush_leave_whole_flushes_only(broker_factory, tmp_path):
    """The writer flushes every 0.1 s while messages arrive; it is killed with kill -9 at
    random moments (seeded), and once the node itself. Every row the table names is there
    once; a writer started again goes on from its last version; what the kills cut off is
    lost (the records in memory), never half-committed."""
    seed = random.randrange(1 << 30)
    print(f"seed {seed}")
    rng = random.Random(seed)
    archive = tmp_path / "archive"
    node = broker_factory(
        *archive_flags(archive, "--archive-format", "delta", "--archive-flush-interval", "0.1"), name="n1"
    )
    sent = 0
    for round_ in range(8):
        payloads = [b"r%d-%d" % (round_, i) for i in range(rng.randrange(50, 200))]
        publish(node, f"k/{round_}", payloads, qos=1, client_id=f"pub-{round_}")
        sent += len(payloads)
        if round_ == 4:
            node.kill()  # (kill -9 of the node: its writer sees its input end and finishes)
            node.start()
            continue
        pid = wait_for(lambda: writer_pid(node), 10, what="the archive writer process")
        wait_for(lambda: rng.random() < 0.3, 1.0, interval=0.01, what="a moment")  # (seeded: 0-1 s in)
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda p=pid: (q := writer_pid(node)) and q != p, 10, what="a new writer process")
    publish(node, "last", [b"end"], qos=1, client_id="pub-last")
    assert node.stop() == 0
    rows = table_rows(archive)
    ids = [r["msg_id"] for r in rows]
    assert len(ids) == len(set(ids)), f"duplicate rows (seed {seed})"
    assert 0 < len(rows) <= sent + 1 and any(r["topic"] == "last" for r in rows)
    assert all(r["payload_size"] == len(r["payload"]) for r in rows)
    versions = [t for _, t in commits(archive) if t is not None]
    assert versions == sorted(versions) and len(set(versions)) == len(versions), versions
