"""Durability with --data-dir: what was acknowledged survives kill -9; bad store files.

[MQTT-4.1.0-1] the server stores session state for the whole session; a
broker that acknowledged a message (PUBACK/PUBREC) has taken ownership of it
[MQTT-4.3.2-2, MQTT-4.3.3-2], so a crash after the acknowledgement must not
lose it.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess

import pytest

from support import mqttraw
from support.integration import PYTHON, control_roundtrip, wait_log
from support.mqttraw import PUBACK, PUBCOMP, PUBREC, PUBREL

pytestmark = pytest.mark.process


@pytest.fixture
def durable(broker_factory, tmp_path):
    """A broker with --data-dir; ``durable.data_dir`` is the directory."""
    data_dir = tmp_path / "data"
    b = broker_factory("--data-dir", str(data_dir))
    b.data_dir = data_dir
    return b


def crash(b, how: str) -> None:
    """kill -9 (nothing flushed) or SIGTERM, then start again on the same port and data."""
    if how == "kill -9":
        b.kill()
    else:
        assert b.stop() == 0
    b.start()


@pytest.mark.parametrize("how", ["kill -9", "SIGTERM"])
def test_acknowledged_qos1_messages_for_offline_session_survive_restart(durable, clients, how):
    """N QoS 1 messages PUBACKed for an offline persistent session are all delivered,
    in order, after the broker restarts [MQTT-3.1.2-5, MQTT-4.6.0-6]; the session and its
    subscription are still there [MQTT-3.2.2-2]."""
    n = 200
    c = clients(durable, client_id="dur-sub", clean=False)
    assert c.sub(1, ("dur/t", 1)) == [1]
    c.send(mqttraw.DISCONNECT_BYTES)
    c.expect_closed()
    pub = clients(durable, client_id="dur-pub")
    pub.send(b"".join(mqttraw.publish("dur/t", str(i).encode(), qos=1, pid=i + 1) for i in range(n)))
    acks = [pub.recv() for _ in range(n)]
    assert all(p.type == PUBACK for p in acks)
    assert sorted(p.packet_id for p in acks) == list(range(1, n + 1))
    pub.close()

    crash(durable, how)

    c = clients(durable, client_id="dur-sub", clean=False)
    assert c.session_present == 1
    payloads = []
    while len(payloads) < n:
        (p,) = c.publishes(1)
        assert p.qos == 1
        payloads.append(int(p.payload))
        c.ack(p)
    assert payloads == list(range(n))
    c.expect_silence(0.3)
    # the subscription itself survived: a new message is delivered without SUBSCRIBE
    pub = clients(durable, client_id="dur-pub2")
    pub.pub("dur/t", b"after restart", qos=1)
    (p,) = c.publishes(1)
    assert p.payload == b"after restart"


def test_unacknowledged_inflight_messages_resent_with_dup_after_kill(durable, clients):
    """Messages sent but not acknowledged before a crash are re-sent after restart with
    DUP=1 and their original ids [MQTT-4.4.0-1], QoS 2 past PUBREC as a PUBREL, in order
    [MQTT-4.6.0-1]."""
    c = clients(durable, client_id="inf-sub", clean=False)
    assert c.sub(1, ("inf/#", 2)) == [2]
    pub = clients(durable, client_id="inf-pub")
    pub.pub("inf/a", b"m1", qos=1, pid=1)
    pub.pub("inf/b", b"m2", qos=2, pid=2)
    pub.pub("inf/c", b"m3", qos=2, pid=3)
    m1, m2, m3 = c.publishes(3)
    c.send(mqttraw.pubrec(m3.packet_id))
    c.expect_ack(PUBREL, m3.packet_id)
    # a round trip on the same connection after the PUBREC, then one more commit
    # through the publisher, so the PUBREC's state change is in the store
    c.ping()
    pub.pub("inf/zz", b"sync", qos=1, pid=4)
    (sync,) = c.publishes(1)  # sent to the subscriber too, not acknowledged either

    crash(durable, "kill -9")

    c = clients(durable, client_id="inf-sub", clean=False)
    assert c.session_present == 1
    got = [c.recv() for _ in range(4)]
    assert [p.type for p in got] == [mqttraw.PUBLISH, mqttraw.PUBLISH, PUBREL, mqttraw.PUBLISH]
    assert got[2].packet_id == m3.packet_id
    publishes = [got[0], got[1], got[3]]
    assert [(p.payload, p.qos, p.dup, p.packet_id) for p in publishes] == [
        (b"m1", 1, True, m1.packet_id),
        (b"m2", 2, True, m2.packet_id),
        (b"sync", 1, True, sync.packet_id),
    ]
    c.expect_silence(0.3)


@pytest.mark.parametrize("how", ["kill -9", "SIGTERM"])
def test_retained_messages_and_their_deletion_survive_restart(durable, clients, how):
    """[MQTT-3.3.1-5] the stored retained message (with its QoS) survives a crash once
    PUBACKed; so does a deletion [MQTT-3.3.1-10]."""
    pub = clients(durable, client_id="ret-pub")
    pub.pub("ret/kept", b"value", qos=1, retain=True, pid=1)
    pub.pub("ret/gone", b"old", qos=1, retain=True, pid=2)
    pub.pub("ret/gone", b"", qos=1, retain=True, pid=3)
    pub.pub("ret/replaced", b"v1", qos=1, retain=True, pid=4)
    pub.pub("ret/replaced", b"v2", qos=2, retain=True, pid=5)

    crash(durable, how)

    c = clients(durable, client_id="ret-sub")
    assert c.sub(1, ("ret/#", 2)) == [2]
    got = sorted((p.topic, p.payload, p.qos, p.retain) for p in c.publishes(2))
    assert got == [("ret/kept", b"value", 1, True), ("ret/replaced", b"v2", 2, True)]
    c.expect_silence(0.3)


def test_inbound_qos2_awaiting_pubrel_survives_kill(durable, clients):
    """[MQTT-4.3.3-2] after PUBREC the broker owns the message: a crash between PUBREC and
    PUBREL must neither lose it nor deliver it twice when the client re-sends."""
    sub = clients(durable, client_id="q2d-sub", clean=False)
    assert sub.sub(1, ("q2d/t", 2)) == [2]
    sub.send(mqttraw.DISCONNECT_BYTES)
    sub.expect_closed()
    pub = clients(durable, client_id="q2d-pub", clean=False)
    pub.send(mqttraw.publish("q2d/t", b"exactly once", qos=2, pid=7))
    pub.expect_ack(PUBREC, 7)

    crash(durable, "kill -9")

    pub = clients(durable, client_id="q2d-pub", clean=False)
    assert pub.session_present == 1
    # the client had not processed the PUBREC, so it re-sends the PUBLISH [MQTT-4.4.0-1]
    pub.send(mqttraw.publish("q2d/t", b"exactly once", qos=2, pid=7, dup=True))
    pub.expect_ack(PUBREC, 7)
    pub.send(mqttraw.pubrel(7))
    pub.expect_ack(PUBCOMP, 7)
    sub = clients(durable, client_id="q2d-sub", clean=False)
    (p,) = sub.publishes(1)
    assert (p.payload, p.qos) == (b"exactly once", 2)
    sub.ack(p)
    sub.expect_ack(PUBREL, p.packet_id)
    sub.send(mqttraw.pubcomp(p.packet_id))
    sub.expect_silence(0.4)


def test_clean_session_discard_is_durable(durable, clients):
    """[MQTT-3.1.2-6] a session discarded by CleanSession=1 stays discarded after a restart."""
    c = clients(durable, client_id="disc", clean=False)
    assert c.sub(1, ("disc/t", 1)) == [1]
    c.close()
    c = clients(durable, client_id="disc", clean=True)
    assert c.session_present == 0
    c.send(mqttraw.DISCONNECT_BYTES)
    c.expect_closed()
    durable.restart()
    c = clients(durable, client_id="disc", clean=False)
    assert c.session_present == 0


def test_without_data_dir_the_log_says_it_runs_in_memory(broker, clients):
    """The operator is told that nothing survives a restart; and indeed nothing does.
    (Operations.)"""
    wait_log(broker, "running in memory")
    c = clients(broker, client_id="mem", clean=False)
    assert c.sub(1, ("mem/t", 1)) == [1]
    pub = clients(broker, client_id="mem-pub")
    pub.pub("mem/r", b"retained", qos=1, retain=True)
    c.close()
    pub.close()
    broker.restart()
    c = clients(broker, client_id="mem", clean=False)
    assert c.session_present == 0
    assert c.sub(1, ("mem/#", 1)) == [1]
    c.expect_silence(0.3)


def test_with_data_dir_the_log_names_the_store_and_what_was_restored(durable, clients):
    """After kill -9 and restart the log names the store file and what it restored. (Operations.)"""
    c = clients(durable, client_id="logged", clean=False)
    assert c.sub(1, ("l/t", 1)) == [1]
    pub = clients(durable, client_id="logged-pub")
    pub.pub("l/r", b"x", qos=1, retain=True)
    durable.kill()
    durable.start()
    wait_log(durable, str(durable.data_dir / "mqttmesh.db"), "1 persistent sessions", "1 retained")
    assert not log_has_traceback(durable.log())


# --------------------------------------------------------------------------- bad store files


def log_has_traceback(text: str) -> bool:
    return "Traceback" in text


def run_broker_expecting_exit(tmp_path, data_dir, timeout=20) -> subprocess.CompletedProcess:
    """Start a broker on a bad data dir; it must exit on its own (bounded)."""
    return subprocess.run(
        [
            PYTHON,
            "-m",
            "mqttmesh",
            "broker",
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--port-file",
            str(tmp_path / "bad.port"),
            "--data-dir",
            str(data_dir),
        ],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=tmp_path,
    )


def assert_clear_failure(r: subprocess.CompletedProcess, names: str) -> None:
    out = r.stdout + r.stderr
    assert r.returncode != 0, out
    assert names in out, out
    assert not log_has_traceback(out), out


def test_garbage_database_file_exits_with_clear_message(tmp_path):
    """Random bytes in DATA_DIR/mqttmesh.db: exit non-zero, name the file, no traceback.
    (Operations: persisted files and their corruption.)"""
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    (data_dir / "mqttmesh.db").write_bytes(os.urandom(8192))
    r = run_broker_expecting_exit(tmp_path, data_dir)
    assert_clear_failure(r, str(data_dir / "mqttmesh.db"))
    assert not (tmp_path / "bad.port").exists()  # it never listened


def test_database_and_wal_overwritten_with_garbage_after_kill_exits_with_clear_message(
    broker_factory, tmp_path, clients
):
    """A store that was in use (kill -9 leaves mqttmesh.db-wal next to it), then both
    files overwritten with garbage: the same clear refusal, naming the database file.
    (Operations.)"""
    data_dir = tmp_path / "data"
    b = broker_factory("--data-dir", str(data_dir))
    pub = clients(b, client_id="g-pub")
    pub.pub("g/r", b"x", qos=1, retain=True)
    b.kill()
    db = data_dir / "mqttmesh.db"
    wal = data_dir / "mqttmesh.db-wal"
    assert wal.exists()
    db.write_bytes(b"this is not SQLite " * 500)
    wal.write_bytes(os.urandom(20000))
    r = run_broker_expecting_exit(tmp_path, data_dir)
    assert_clear_failure(r, str(db))


def test_truncated_database_exits_with_clear_message(broker_factory, tmp_path, clients):
    """A store cut short (half of its pages gone) is refused, naming the file. (Operations.)"""
    data_dir = tmp_path / "data"
    b = broker_factory("--data-dir", str(data_dir))
    c = clients(b, client_id="t-sub", clean=False)
    assert c.sub(1, ("t/#", 1)) == [1]
    c.close()
    pub = clients(b, client_id="t-pub")
    for i in range(300):
        pub.pub(f"t/{i}", os.urandom(200), qos=1, retain=True, pid=i + 1)
    assert b.stop() == 0
    db = data_dir / "mqttmesh.db"
    for extra in ("-wal", "-shm"):
        p = data_dir / f"mqttmesh.db{extra}"
        if p.exists():
            p.unlink()
    size = db.stat().st_size
    assert size > 8 * 4096
    with open(db, "r+b") as fh:
        fh.truncate(size // 2)
    r = run_broker_expecting_exit(tmp_path, data_dir)
    assert_clear_failure(r, str(db))


def test_database_of_another_format_version_is_refused(broker_factory, tmp_path, clients):
    """Persisted files carry a format version: a newer one is refused by name, not misread.
    (Operations.)"""
    data_dir = tmp_path / "data"
    b = broker_factory("--data-dir", str(data_dir))
    clients(b, client_id="up").ping()  # serving (not just listening) before the stop
    assert b.stop() == 0
    db = data_dir / "mqttmesh.db"
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT key FROM meta").fetchall()
        assert ("format_version",) in rows
        conn.execute("UPDATE meta SET value = '999' WHERE key = 'format_version'")
    conn.close()
    r = run_broker_expecting_exit(tmp_path, data_dir)
    assert_clear_failure(r, str(db))
    assert "999" in r.stderr


def test_data_dir_that_is_a_file_exits_naming_the_directory(tmp_path):
    """A data directory that cannot be used: exit non-zero, naming it, no traceback.
    (Operations.)"""
    data_dir = tmp_path / "not-a-dir"
    data_dir.write_text("I am a file\n")
    r = run_broker_expecting_exit(tmp_path, data_dir)
    assert_clear_failure(r, str(data_dir))
    assert "listen" not in r.stderr


def test_healthy_store_restarts_and_serves(durable, clients):
    """Control: the same steps on an intact store start fine, twice. [MQTT-4.1.0-1]"""
    pub = clients(durable, client_id="h-pub")
    pub.pub("h/r", b"x", qos=1, retain=True)
    durable.kill()
    durable.start()
    durable.restart()
    control_roundtrip(durable, "healthy")


def test_discarded_session_messages_do_not_come_back_after_restart(broker_factory, tmp_path, clients):
    """[MQTT-3.1.2-6] state of a session discarded by CleanSession=1 MUST NOT be reused in
    any later session, also after a restart. Here the discard (clean=1 connect) and the
    next clean=0 connect happen while a large store commit is still being written, so
    both land in the same commit batch; tried with two ClientIds."""
    b = broker_factory("--data-dir", str(tmp_path / "data"), "--store-synchronous", "full")
    pub = clients(b, client_id="ghost-pub")
    big = os.urandom(900_000)
    for n, ghost in enumerate(("ghost-1", "ghost-2")):
        c = clients(b, client_id=ghost, clean=False)
        assert c.sub(1, (f"{ghost}/t", 1)) == [1]
        c.send(mqttraw.DISCONNECT_BYTES)
        c.expect_closed()
        for i in range(3):
            pub.pub(f"{ghost}/t", f"old {i}".encode(), qos=1, pid=i + 1)
        # ~27 MB of retained messages: the store is busy committing them for a while
        pub.send(b"".join(mqttraw.publish(f"bulk/{n}/{i}", big, retain=True) for i in range(30)))
        pub.ping(10)
        a = clients(b, client_id=ghost, clean=True)  # discards the stored session
        assert a.session_present == 0
        a.send(mqttraw.DISCONNECT_BYTES)
        a.expect_closed()
        fresh = clients(b, client_id=ghost, clean=False)  # a new, empty session
        assert fresh.session_present == 0
        fresh.send(mqttraw.DISCONNECT_BYTES)
        fresh.expect_closed()
    pub.pub("sync/t", b"s", qos=1, retain=True, pid=9)  # PUBACK after everything is committed

    crash(b, "kill -9")

    for ghost in ("ghost-1", "ghost-2"):
        c = clients(b, client_id=ghost, clean=False)
        assert c.session_present == 1  # the new (empty) session
        c.expect_silence(0.4)  # and none of the discarded session's messages


@pytest.mark.parametrize("policy,expected", [("oldest", [b"7", b"8", b"9"]), ("newest", [b"0", b"1", b"2"])])
def test_drop_policy_result_is_what_survives_kill(broker_factory, tmp_path, clients, policy, expected):
    """--max-queued 3 with a store: the messages the policy kept are the ones that come
    back after kill -9, and only those.
    [MQTT-3.1.2-5] within the --max-queued limit."""
    b = broker_factory("--data-dir", str(tmp_path / "data"), "--max-queued", "3", "--drop-policy", policy)
    c = clients(b, client_id="dp", clean=False)
    assert c.sub(1, ("dp/t", 1)) == [1]
    c.send(mqttraw.DISCONNECT_BYTES)
    c.expect_closed()
    pub = clients(b, client_id="dp-pub")
    for i in range(10):
        pub.pub("dp/t", str(i).encode(), qos=1, pid=i + 1)
    crash(b, "kill -9")
    c = clients(b, client_id="dp", clean=False)
    got = c.publishes(3)
    assert [p.payload for p in got] == expected
    for p in got:
        c.ack(p)
    c.expect_silence(0.4)


def test_unsubscribe_is_durable(durable, clients):
    """An UNSUBACKed unsubscribe survives kill -9: nothing is queued for the removed filter
    [MQTT-3.10.4-2], the kept one still works."""
    c = clients(durable, client_id="du", clean=False)
    assert c.sub(1, ("du/a", 1), ("du/b", 1)) == [1, 1]
    c.unsub(2, "du/a")
    c.send(mqttraw.DISCONNECT_BYTES)
    c.expect_closed()
    crash(durable, "kill -9")
    pub = clients(durable, client_id="du-pub")
    pub.pub("du/a", b"removed", qos=1, pid=1)
    pub.pub("du/b", b"kept", qos=1, pid=2)
    c = clients(durable, client_id="du", clean=False)
    (p,) = c.publishes(1)
    assert p.payload == b"kept"
    c.ack(p)
    c.expect_silence(0.3)


def test_session_discarded_by_clean_connect_stays_discarded_after_kill(broker_factory, tmp_path, clients):
    """[MQTT-3.1.2-6] once CONNACK confirmed CleanSession=1 (session present 0), the old
    session's state MUST NOT be reused, a crash right after the CONNACK included. The
    store is kept busy with a large commit so the crash falls inside the commit window."""
    b = broker_factory("--data-dir", str(tmp_path / "data"), "--store-synchronous", "full")
    c = clients(b, client_id="wipe", clean=False)
    assert c.sub(1, ("wipe/t", 1)) == [1]
    c.send(mqttraw.DISCONNECT_BYTES)
    c.expect_closed()
    pub = clients(b, client_id="wipe-pub")
    for i in range(3):
        pub.pub("wipe/t", f"old {i}".encode(), qos=1, pid=i + 1)
    big = os.urandom(900_000)
    pub.send(b"".join(mqttraw.publish(f"bulk/{i}", big, retain=True) for i in range(30)))
    pub.ping(10)
    fresh = clients(b, client_id="wipe", clean=True)
    assert fresh.session_present == 0  # the server confirms: old session discarded

    crash(b, "kill -9")

    c = clients(b, client_id="wipe", clean=False)
    assert c.session_present == 0
    c.expect_silence(0.4)
