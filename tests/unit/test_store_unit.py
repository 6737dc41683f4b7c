"""mqttmesh.store: the Journal (coalescing per key, order, session deletes, batches, on_dirty,
mark/since), the NullJournal, and restore_sessions."""

from __future__ import annotations

import pytest

from mqttmesh.flow import Congestion
from mqttmesh.mesh.cluster.replica import replica_of
from mqttmesh.mesh.cluster.replica_sessions import DurableMeshSession, ReplicaSessions
from mqttmesh.message import Message
from mqttmesh.session import SENT_PUBLISH, SENT_PUBREL, Entry, Limits, Session
from mqttmesh.session_durable import DurableSession, Sessions
from mqttmesh.store import FORMAT_VERSION, NULL_JOURNAL, Journal, NullJournal, _snapshot, restore_sessions
from support.restart import restarted_session, write_store


def entry(key: int, payload: bytes = b"p", qos: int = 1) -> Entry:
    e = Entry(Message("t", payload, 2, False, "n1", 3, "pub", 9.5), qos, False, key)
    return e


def put(client, key, payload=b"p", qos=1, pid=0, state=0):
    head = ("message_put", client, key, "t", payload, 2, qos, False, pid, state, "n1", 3, "pub", 9.5)
    return (*head, None, None, None, None)  # (props, share, root, expires)


def test_format_version_is_an_int():
    assert isinstance(FORMAT_VERSION, int) and FORMAT_VERSION >= 1


def test_empty_take():
    j = Journal()
    assert len(j) == 0
    assert j.take() == (1, [])
    assert j.take() == (2, [])


def test_ops_in_order_of_arrival():
    j = Journal()
    j.session_put("a", {"x": 1})
    j.message_put("a", entry(1))
    j.retained_put("r/1", Message("r/1", b"v", 1, True, "n1", 4, "pub", 2.0))
    j.awaiting_rel_put("a", 7)
    j.retained_delete("r/2")
    assert len(j) == 5
    number, ops = j.take()
    assert number == 1
    assert ops == [
        ("session_put", "a", {"x": 1}, None),
        put("a", 1),
        ("retained_put", "r/1", b"v", 1, "n1", 4, "pub", 2.0, None, None),
        ("rel_put", "a", 7),
        ("retained_delete", "r/2"),
    ]
    assert len(j) == 0


def test_coalescing_per_key_keeps_the_newest_change_in_its_new_place():
    j = Journal()
    j.message_put("a", entry(1))
    j.message_put("a", entry(2))
    j.message_remove("a", 1)  # replaces the put of key 1 and moves after key 2
    j.awaiting_rel_put("a", 5)
    j.awaiting_rel_remove("a", 5)
    j.retained_put("t", Message("t", b"1", 0, True))
    j.retained_delete("t")
    j.session_put("a", {"x": 0})
    j.session_put("a", {"x": 1})
    assert j.take()[1] == [
        put("a", 2),
        ("message_remove", "a", 1),
        ("rel_remove", "a", 5),
        ("retained_delete", "t"),
        ("session_put", "a", {"x": 1}, None),
    ]


def test_same_key_of_different_clients_do_not_coalesce():
    j = Journal()
    j.message_put("a", entry(1))
    j.message_put("b", entry(1))
    assert [op[1] for op in j.take()[1]] == ["a", "b"]


def test_session_put_copies_the_subscriptions():
    j = Journal()
    subs = {"a": 1}
    j.session_put("c", subs)
    subs["b"] = 2
    assert j.take()[1] == [("session_put", "c", {"a": 1}, None)]


def test_message_put_is_read_when_the_batch_is_taken():
    j = Journal()
    e = entry(1)
    j.message_put("c", e)
    e.packet_id, e.state = 42, 2
    assert j.take()[1] == [put("c", 1, pid=42, state=2)]


def test_session_delete_drops_earlier_ops_of_that_client_only():
    j = Journal()
    j.session_put("a", {"x": 1})
    j.message_put("a", entry(1))
    j.awaiting_rel_put("a", 3)
    j.message_put("b", entry(1))
    j.retained_put("a", Message("a", b"v", 0, True, "n1", 1, "p", 0.0))  # a topic named like the client
    j.session_delete("a")
    assert j.take()[1] == [
        put("b", 1),
        ("retained_put", "a", b"v", 0, "n1", 1, "p", 0.0, None, None),
        ("session_delete", "a"),
    ]


def test_session_delete_lands_before_later_messages_of_that_client():
    j = Journal()
    j.message_put("a", entry(1))
    j.session_delete("a")
    j.message_put("a", entry(1, b"new"))
    j.awaiting_rel_put("a", 2)
    assert j.take()[1] == [("session_delete", "a"), put("a", 1, b"new"), ("rel_put", "a", 2)]


def test_session_delete_then_session_put_keeps_the_delete_first():
    j = Journal()
    j.session_put("a", {"old": 1})
    j.message_put("a", entry(1))
    j.take()  # committed: the store holds session a and its message 1
    j.session_delete("a")
    j.session_put("a", {"new": 0})
    assert j.take()[1] == [("session_delete", "a"), ("session_put", "a", {"new": 0}, None)]


def test_on_dirty_once_per_batch():
    calls = []
    j = Journal(on_dirty=lambda: calls.append(j.batch))
    j.message_put("a", entry(1))
    j.message_put("a", entry(2))
    j.retained_delete("x")
    assert calls == [1]
    j.take()
    assert calls == [1]
    j.session_put("a", {})
    j.session_put("b", {})
    assert calls == [1, 2]


def test_on_dirty_once_per_batch_with_session_delete():
    calls = []
    j = Journal(on_dirty=lambda: calls.append(j.batch))
    j.session_put("a", {})
    j.session_delete("a")
    assert calls == [1]


def test_writes_counts_every_change():
    j = Journal()
    j.message_put("a", entry(1))
    j.message_put("a", entry(1))
    j.session_delete("a")
    assert j.writes == 3
    j.take()
    assert j.writes == 3


def test_batch_and_committed_numbers():
    j = Journal()
    assert (j.batch, j.committed) == (1, 0)
    j.retained_delete("x")
    assert j.take()[0] == 1
    assert j.batch == 2
    j.mark_committed(1)
    assert j.committed == 1
    j.take()
    j.take()
    j.mark_committed(3)
    j.mark_committed(2)  # a late report never moves it back
    assert j.committed == 3
    assert j.batch == 4


def test_take_returns_plain_tuples():
    j = Journal()
    j.message_put("a", entry(1))
    j.retained_put("t", Message("t", b"v", 1, True, "n", 1, "p", 0.0))
    for op in j.take()[1]:
        assert type(op) is tuple
        for field in op:
            assert field is None or isinstance(field, (str, bytes, int, float, bool, dict)), field


# --------------------------------------------------------------------------- mark and since


def test_since_is_zero_when_nothing_was_recorded():
    j = Journal()
    mark = j.mark()
    assert j.since(mark) == 0
    j.take()  # a new batch, still nothing recorded since the mark
    assert j.since(mark) == 0


def test_since_is_the_batch_being_filled_when_something_was_recorded():
    j = Journal()
    mark = j.mark()
    j.session_put("a", {})
    assert j.since(mark) == 1
    j.session_put("a", {"x": 1})  # coalesced with the first: still a write
    assert j.since(mark) == 1
    j.take()
    mark = j.mark()
    assert j.since(mark) == 0
    j.message_remove("a", 3)
    assert j.since(mark) == 2


def test_a_mark_taken_before_a_batch_was_taken_points_at_the_new_batch():
    # what the caller waits for is where its own write went, not where its mark was taken
    j = Journal()
    j.retained_delete("r")
    mark = j.mark()
    j.take()
    j.retained_delete("s")
    assert j.since(mark) == 2


def test_null_journal_records_nothing_and_never_holds_an_ack():
    j = NullJournal()
    mark = j.mark()
    j.session_put("a", {"x": 1})
    j.session_delete("a")
    j.message_put("a", entry(1))
    j.message_remove("a", 1)
    j.awaiting_rel_put("a", 1)
    j.awaiting_rel_remove("a", 1)
    j.custody_put(Message("t", b"v", 1), ["n2"])
    j.custody_remove(1)
    j.rerouted_put(Message("t", b"v", 2, False, "n3", 7), ["n2"])
    j.rerouted_remove("n3", 7)
    j.retained_put("t", Message("t", b"v", 1, True))
    j.retained_delete("t")
    j.mark_committed(5)
    assert j.since(mark) == 0 and j.mark() == 0
    assert (len(j), j.writes, j.batch, j.committed) == (0, 0, 0, 0)
    assert j.persistent is False and Journal.persistent is True
    assert NULL_JOURNAL.since(NULL_JOURNAL.mark()) == 0


# --------------------------------------------------------------------------- restore_sessions


def _row(client, key, payload, pid=0, state=0, qos=1, seq=None):
    """A messages row as the store reads it back."""
    return (client, key, "t", payload, 2, qos, 0, pid, state, "n1", seq or key, "pub", 1.5, None, None, None, None)


def test_restore_sessions_rebuilds_queue_inflight_and_awaiting_rel_without_journaling():
    journal = Journal()
    congestion = Congestion()
    sessions = restore_sessions(
        Sessions(Limits(), journal, congestion),
        [("a", {"x/#": 1}, None), ("b", {}, None)],
        [
            _row("a", 1, b"sent", pid=7, state=SENT_PUBLISH),
            _row("a", 2, b"released", pid=9, state=SENT_PUBREL),
            _row("a", 4, b"queued"),
            _row("gone", 1, b"no session"),  # (a row without its session is skipped)
        ],
        [("a", 3), ("b", 5), ("gone", 6)],
    )
    a, b = sessions
    assert [type(s) for s in sessions] == [DurableSession, DurableSession]
    assert (a.client_id, b.client_id) == ("a", "b")
    assert a.subscriptions == {"x/#": 1} and b.subscriptions == {}
    assert a.congestion is congestion and a.journal is journal
    assert {pid: (e.msg.payload, e.state) for pid, e in a.inflight.items()} == {
        7: (b"sent", SENT_PUBLISH),
        9: (b"released", SENT_PUBREL),
    }
    assert [e.msg.payload for e in a.queue] == [b"queued"]
    assert (a.awaiting_rel, b.awaiting_rel) == ({3}, {5})
    assert a._next_pid == 10  # after the highest id in flight
    assert a._next_key == 5  # new entries are keyed after the stored ones
    assert b._next_pid == 1 and b._next_key == 1
    assert len(journal) == 0 and journal.writes == 0  # it is what the store already has


def test_restore_sessions_of_a_mesh_finds_entries_by_message_id():
    journal = Journal()
    settled = []
    factory = ReplicaSessions(Limits(), journal, None, lambda *a: settled.append(a))
    [s] = restore_sessions(
        factory,
        [("a", {}, None)],
        [_row("a", 1, b"x", seq=11), _row("a", 2, b"y", pid=1, state=SENT_PUBLISH, seq=12)],
        [],
    )
    assert isinstance(s, DurableMeshSession) and replica_of(s) is s
    assert {k: e.msg.payload for k, e in s.ids.items()} == {("n1", 11): b"x", ("n1", 12): b"y"}
    assert settled == [] and len(journal) == 0


def test_restore_sessions_reads_each_row_source_after_the_one_before():
    # the SQLite store streams its three queries one after another on one connection
    seen = []

    def rows(name, items):
        seen.append(f"start {name}")
        yield from items
        seen.append(f"end {name}")

    restore_sessions(
        Sessions(Limits(), Journal()),
        rows("sessions", [("a", {}, None)]),
        rows("messages", [_row("a", 1, b"x")]),
        rows("rel", []),
    )
    assert seen == ["start sessions", "end sessions", "start messages", "end messages", "start rel", "end rel"]


def test_restore_sessions_without_a_persistent_journal_makes_memory_sessions():
    [s] = restore_sessions(Sessions(Limits(), NULL_JOURNAL), [("a", {"t": 0}, None)], [_row("a", 1, b"x")], [])
    assert type(s) is Session and s.clean is False
    assert [e.msg.payload for e in s.queue] == [b"x"]


def test_a_durable_replicas_inbound_qos2_messages_are_journaled_and_restored_from_sqlite(tmp_path):
    """Issue 15 (harness, seed 2): two holders of a publisher's session restarted and kept the
    ids awaiting PUBREL but not their messages; the node the client came back to had nothing
    to route, and the client's re-sends were taken for re-sends of routed messages (a loss).
    The messages are journaled with the ids, and a restart brings them back."""
    from mqttmesh.mesh.cluster.cluster_values import Snapshot
    from mqttmesh.mesh.cluster.snapshots import install

    j = Journal()
    s = DurableMeshSession("p", Limits(), j, on_settled=lambda *a: None)
    msg = Message("t/1", b"x", 2, False, "n1", 41, "p", 9.5)
    s.awaiting_rel_agreed(3, msg)
    s.settle(("n2", 7), "in", 5, Message("t/2", b"y", 2, True, "n2", 7, "p", 9.75))  # (another holder's)
    s.awaiting_rel_add(6)  # (an id without a message: a PUBLISH that was not allowed)
    ops = j.take()[1]
    assert ("inbound_put", "p", 3, "t/1", b"x", 0, "n1", 41, "p", 9.5, None, None) in ops
    assert ("inbound_put", "p", 5, "t/2", b"y", 1, "n2", 7, "p", 9.75, None, None) in ops
    write_store(tmp_path, [("session_put", "p", {}, None)] + ops)

    def restarted():
        return restarted_session(tmp_path, "p")

    back = restarted()
    assert back.awaiting_rel == {3, 5, 6}
    assert {pid: (m.origin, m.seq, m.topic, m.payload, m.retain) for pid, m in back.inbound.items()} == {
        3: ("n1", 41, "t/1", b"x", False),
        5: ("n2", 7, "t/2", b"y", True),
    }
    assert [m.seq for m in back.unrouted()] == [41, 7]  # (the node the client comes to routes them)
    assert (back.epoch, back.version) == (0, 1)  # ranked by what it holds in a merge, not as empty
    # PUBREL, a copy installed from another holder: what leaves the session leaves the store
    s.awaiting_rel_remove(3)
    install(s, Snapshot("p", {}, 0, [], [], [6], None, 1, 9), 0.0)
    write_store(tmp_path, j.take()[1])
    back = restarted()
    assert back.awaiting_rel == {6} and back.inbound == {} and (back.epoch, back.version) == (1, 9)


def test_a_durable_replica_keeps_the_ids_it_settled_across_a_restart(tmp_path):
    """Issue 15 (harness, seed 3): a holder that had removed a completed message came back
    from a restart knowing nothing of it, a copy that had missed the settlement still queued
    it, and their merge sent it to the client again under a new packet id. The settled ids
    are stored (a ring of TOMBSTONES per session) and come back with the session."""
    from mqttmesh.mesh.cluster.cluster_values import Snapshot, SnapshotEntry
    from mqttmesh.mesh.cluster.replica import TOMBSTONES
    from mqttmesh.mesh.cluster.snapshots import install

    j = Journal()
    s = DurableMeshSession("s", Limits(), j)
    s.deliver(Message("t", b"x", 2, False, "n2", 7, "p", 1.0), 2)
    s.settle(("n2", 7), "done", 0)  # (it had it: completed at the node the client was on)
    s.settle(("n2", 9), "done", 0)  # (it never had it)
    ops = j.take()[1]
    assert ("done_put", "s", 1, 1, "n2", 7) in ops and ("done_put", "s", 2, 2, "n2", 9) in ops
    write_store(tmp_path, [("session_put", "s", {"t": 2}, None)] + ops)
    back = restarted_session(tmp_path, "s")
    assert list(back.done) == [("n2", 7), ("n2", 9)] and back.tombstones_stored == 2
    stale = SnapshotEntry("n2", 7, "t", "eA==", 2, 2, 0, 0, "p", 1.0)  # (a copy that missed it)
    install(back, Snapshot("s", {"t": 2}, 0, [stale], [], [], None, 1, 5), 0.0)
    assert not back.queue and not back.inflight
    assert 1 < TOMBSTONES and back.tombstones_stored % TOMBSTONES == 2  # (the next slot of the ring)


def test_a_durable_replicas_floors_are_stored_and_come_back(tmp_path, monkeypatch):
    """Issue 20: a copy that forgot settled ids (more than TOMBSTONES) keeps, per origin, the
    highest sequence number it forgot; after a restart it still takes a QoS 2 message at or
    below it for settled, and a QoS 1 one for new."""
    from mqttmesh.mesh.cluster import replica
    from mqttmesh.server.sqlite_store import SqliteStore

    monkeypatch.setattr(replica, "TOMBSTONES", 3)
    j = Journal()
    s = DurableMeshSession("s", Limits(), j)
    for seq in (7, 8, 9, 10, 11):
        s.settle(("n2", seq), "done", 0)
    assert list(s.done) == [("n2", 9), ("n2", 10), ("n2", 11)] and s.floors == {"n2": 8}
    ops = j.take()[1]
    assert ("floor_put", "s", "n2", 8) in ops
    write_store(tmp_path, [("session_put", "s", {"t": 2}, None)] + ops)
    back = restarted_session(tmp_path, "s")
    assert back.floors == {"n2": 8}
    back.deliver(Message("t", b"x", 2, False, "n2", 6, "p", 1.0), 2)  # forgotten: taken as settled
    back.deliver(Message("t", b"y", 1, False, "n2", 5, "p", 1.0), 1)  # QoS 1: taken as new
    back.deliver(Message("t", b"z", 2, False, "n2", 12, "p", 1.0), 2)  # above the floor: new
    assert [(e.msg.seq, e.qos) for e in back.queue] == [(5, 1), (12, 2)] and back.forgotten_qos2 == 1
    # a session deleted for good takes its floors with it
    store = SqliteStore(str(tmp_path))
    store.write([("session_delete", "s")])
    assert store.db.execute("SELECT COUNT(*) FROM tombstone_floors").fetchone()[0] == 0
    store.db.close()


PROPS = b"\x03\x00\x0atext/plain&\x00\x01k\x00\x01v"  # Content Type, a User Property (encoded)


def test_mqtt5_properties_survive_a_restart_in_every_table(tmp_path):
    """A message's properties (message.Message.props) are kept with it: queued or in flight
    for a persistent session, retained, and in custody for other nodes."""
    from mqttmesh.broker import Broker, BrokerPorts, BrokerSettings
    from mqttmesh.server.sqlite_store import SqliteStore
    from mqttmesh.session_durable import Sessions

    j = Journal()
    e = Entry(Message("t", b"p", 1, False, "n1", 3, "pub", 9.5, PROPS), 1, False, 1)
    j.session_put("a", {"t": 1})
    j.message_put("a", e)
    j.retained_put("r", Message("r", b"v", 1, True, "n1", 4, "pub", 2.0, PROPS))
    j.custody_put(Message("c", b"w", 1, False, "n1", 5, "pub", 2.0, PROPS), ["n2"])
    write_store(tmp_path, j.take()[1])
    again = SqliteStore(str(tmp_path))
    broker = Broker(BrokerSettings(node_id="n1"), None, None, BrokerPorts(sessions=Sessions(Limits(), Journal())))
    again.load(broker)
    [(custody, _)] = again.load_custody()
    again.db.close()
    assert [x.msg.props for x in broker.sessions["a"].queue] == [PROPS]
    assert broker.retained.get("r").props == PROPS
    assert custody.props == PROPS


def test_another_origins_message_routed_again_is_kept_by_its_id_until_acknowledged(tmp_path):
    """A message this node routed again under another origin's id (mesh/routing/dataplane.py
    ``route_local``) is stored by (origin, seq), apart from the node's own (numbered by its
    own incarnations, which another node's may equal), with what is left of its life, and
    loaded after them; its removal names the origin (the fault harness, 7 nodes, seed 13)."""
    from mqttmesh.server.sqlite_store import SqliteStore

    j = Journal()
    j.custody_put(Message("c", b"own", 2, False, "n1", 5, "pub", 2.0), ["n2"])
    again = Message("c", b"n3's", 2, False, "n3", 5, "pub", 1.0, PROPS)
    again.expires = 100.0
    j.rerouted_put(again, ["n2", "n4"])
    j.rerouted_put(Message("c", b"n4's", 2, False, "n4", 5, "pub", 1.0), ["n2"])
    write_store(tmp_path, j.take()[1])
    store = SqliteStore(str(tmp_path))
    loaded = store.load_custody()
    assert [(m.origin, m.seq, m.payload, d) for m, d in loaded] == [
        ("n1", 5, b"own", ["n2"]),
        ("n3", 5, b"n3's", ["n2", "n4"]),
        ("n4", 5, b"n4's", ["n2"]),
    ]
    assert loaded[1][0].props == PROPS and loaded[1][0].expires == pytest.approx(100.0)
    store.db.close()
    j.rerouted_remove("n3", 5)
    write_store(tmp_path, j.take()[1])
    store = SqliteStore(str(tmp_path))
    assert [(m.origin, m.seq) for m, _ in store.load_custody()] == [("n1", 5), ("n4", 5)]
    store.db.close()


@pytest.mark.parametrize("older", [1, 2])
def test_an_older_store_gains_the_columns_it_lacks_and_keeps_its_rows(tmp_path, older):
    """An older data directory is brought to format 5 in place, not refused: format 1 had no
    MQTT 5 properties, format 2 no message expiry (and neither the shared group of an entry,
    nor a re-send's root)."""
    import re
    import sqlite3

    from mqttmesh.broker import Broker, BrokerPorts, BrokerSettings
    from mqttmesh.server.sqlite_store import SCHEMA, SqliteStore

    schema = re.sub(r"CREATE TABLE IF NOT EXISTS wills\(.*?\);\n", "", SCHEMA, flags=re.S)  # (newer than both)
    schema = re.sub(r",\s*expires REAL", "", schema).replace(", share TEXT, root TEXT", "")
    if older == 1:
        schema = schema.replace(", props BLOB", "")
    db = sqlite3.connect(tmp_path / "mqttmesh.db")
    db.executescript(schema)
    db.execute("INSERT INTO meta VALUES ('format_version', ?)", (str(older),))
    values = "('r', x'76', 1, 'n1', 4, 'pub', 2.0)" if older == 1 else "('r', x'76', 1, 'n1', 4, 'pub', 2.0, NULL)"
    db.execute(f"INSERT INTO retained VALUES {values}")
    db.commit()
    db.close()
    store = SqliteStore(str(tmp_path))
    broker = Broker(BrokerSettings(node_id="n1"), None, None, BrokerPorts())
    assert store.load(broker) == (0, 1)
    assert store._meta("format_version") == str(FORMAT_VERSION) == "5"
    msg = broker.retained.get("r")
    assert (msg.payload, msg.props, msg.expires) == (b"v", None, None)
    assert store.db.execute("SELECT count(*) FROM wills").fetchone()[0] == 0  # (and the wills table)
    store.db.close()


def _broker_with_store(store):
    """A Broker of persistent sessions (a journal that records), filled from ``store``."""
    from mqttmesh.broker import Broker, BrokerPorts, BrokerSettings

    broker = Broker(BrokerSettings(node_id="n1"), None, None, BrokerPorts(sessions=Sessions(Limits(), Journal())))
    store.load(broker)
    return broker


def test_an_entry_keeps_its_shared_group_across_a_restart(tmp_path):
    """Format 4: a queued and an in-flight entry that came through the group "$share/g/t" are
    stored with its share, and restored as entries of this node's live group of that share
    (the one the session's restored subscription joined); a plain entry has none."""
    from mqttmesh.server.sqlite_store import SqliteStore
    from mqttmesh.shared import SharedGroup

    before = SharedGroup("g", "t", "local")  # (the group of the run that stored them)
    j = Journal()
    j.session_put("p", {"$share/g/t": 1, "t": 1})
    queued = Entry(Message("t", b"q", 1, False, "n1", 3, "pub", 9.5), 1, False, 1, before)
    sent = Entry(Message("t", b"s", 1, False, "n1", 4, "pub", 9.5), 1, False, 2, before)
    sent.packet_id, sent.state = 7, SENT_PUBLISH
    plain = Entry(Message("t", b"p", 1, False, "n1", 5, "pub", 9.5), 1, False, 3)
    for e in (queued, sent, plain):
        j.message_put("p", e)
    ops = j.take()[1]
    assert [op[-3] for op in ops if op[0] == "message_put"] == ["$share/g/t", "$share/g/t", None]
    store = SqliteStore(str(tmp_path))
    store.write(ops)
    assert store.db.execute("SELECT key, share FROM messages ORDER BY key").fetchall() == [
        (1, "$share/g/t"),
        (2, "$share/g/t"),
        (3, None),
    ]
    store.db.close()
    again = SqliteStore(str(tmp_path))
    broker = _broker_with_store(again)
    again.db.close()
    session = broker.sessions["p"]
    group = broker.shared.groups[("g", "t")]
    assert group is not before and session in group.members
    assert [(e.msg.payload, e.group) for e in session.queue] == [(b"q", group), (b"p", None)]
    assert [(pid, e.msg.payload, e.group) for pid, e in session.inflight.items()] == [(7, b"s", group)]


def test_a_format_3_store_opens_and_its_entries_have_no_group(tmp_path):
    """A data directory of format 3 (no shared group column) is brought to format 5 in place:
    its entries are restored without a group, as format 3 restored them, and an entry
    journaled after it keeps its group (the new column, written by name)."""
    import sqlite3

    from mqttmesh.server.sqlite_store import SCHEMA, SqliteStore
    from mqttmesh.shared import SharedGroup

    db = sqlite3.connect(tmp_path / "mqttmesh.db")
    db.executescript(SCHEMA.replace(", share TEXT, root TEXT", ""))
    db.execute("INSERT INTO meta VALUES ('format_version', '3')")
    db.execute("INSERT INTO sessions VALUES ('p', '{\"$share/g/t\": 1}', NULL)")
    db.execute("INSERT INTO messages VALUES ('p', 1, 't', x'6f6c64', 1, 1, 0, 0, 0, 'n1', 3, 'pub', 9.5, NULL, NULL)")
    db.commit()
    db.close()
    store = SqliteStore(str(tmp_path))
    assert store._meta("format_version") == "5"
    broker = _broker_with_store(store)
    [old] = broker.sessions["p"].queue
    assert (old.msg.payload, old.group) == (b"old", None)
    j = Journal()
    j.message_put(
        "p", Entry(Message("t", b"new", 1, False, "n1", 4, "pub", 9.5), 1, False, 2, SharedGroup("g", "t", "local"))
    )
    store.write(j.take()[1])
    store.db.close()
    again = SqliteStore(str(tmp_path))
    broker = _broker_with_store(again)
    again.db.close()
    group = broker.shared.groups[("g", "t")]
    assert [(e.msg.payload, e.group) for e in broker.sessions["p"].queue] == [(b"old", None), (b"new", group)]


def test_a_resends_root_is_stored_and_comes_back(tmp_path):
    """Format 5: an entry that is a shared group's re-send keeps the mark naming its root
    (shared.py ``resend_mark``), so that after a restart its copy of the session still tells
    it from another message (``had``, snapshots.py ``merge_snapshots``); a plain one has none."""
    from mqttmesh.shared import root_of

    resend = Message("t", b"r", 2, False, "n6", 592, "pub", 9.5)
    resend.shares = ("$share/n0 551", "$share/g/t")
    j = Journal()
    j.session_put("p", {"$share/g/t": 2})
    j.message_put("p", Entry(resend, 2, False, 1))
    j.message_put("p", Entry(Message("t", b"q", 2, False, "n0", 552, "pub", 9.5), 2, False, 2))
    ops = j.take()[1]
    assert [op[-2] for op in ops if op[0] == "message_put"] == ["$share/n0 551", None]
    write_store(tmp_path, ops)
    session = restarted_session(tmp_path, "p")
    assert [root_of(e.msg) for e in session.queue] == [("n0", 551), ("n0", 552)]


def test_a_format_4_store_opens_and_its_entries_name_no_root(tmp_path):
    """A data directory of format 4 (no root column) is brought to format 5 in place: its
    entries are restored as format 4 restored them, each its own root."""
    import sqlite3

    from mqttmesh.server.sqlite_store import SCHEMA, SqliteStore
    from mqttmesh.shared import root_of

    db = sqlite3.connect(tmp_path / "mqttmesh.db")
    db.executescript(SCHEMA.replace(", root TEXT", ""))
    db.execute("INSERT INTO meta VALUES ('format_version', '4')")
    db.execute("INSERT INTO sessions VALUES ('p', '{\"t\": 2}', NULL)")
    row = "('p', 1, 't', x'6f6c64', 2, 2, 0, 0, 0, 'n6', 592, 'pub', 9.5, NULL, NULL, NULL)"
    db.execute(f"INSERT INTO messages VALUES {row}")
    db.commit()
    db.close()
    store = SqliteStore(str(tmp_path))
    assert store._meta("format_version") == "5"
    store.db.close()
    [old] = restarted_session(tmp_path, "p").queue
    assert (old.msg.payload, root_of(old.msg), getattr(old.msg, "shares", None)) == (b"old", ("n6", 592), None)


def test_a_message_expiry_is_stored_on_the_wall_clock_and_read_back_on_the_runs_clock(tmp_path):
    """[MQTT-3.3.2-5] across a restart: the store keeps when a message expires on the wall
    clock (the event loop's clock starts again), and gives it back on the clock of the run
    that reads it: the same instant."""
    import time

    from mqttmesh.broker import Broker, BrokerPorts, BrokerSettings
    from mqttmesh.server.sqlite_store import SqliteStore

    store = SqliteStore(str(tmp_path))
    msg = Message("r", b"v", 1, True, "n1", 4, "pub", 2.0).expiring(100.0, time.monotonic())
    store.write([_snapshot(("retained_put", "r", msg))])
    on_wall = store.db.execute("SELECT expires FROM retained").fetchone()[0]
    assert abs(on_wall - (time.time() + 100.0)) < 5.0  # (the wall clock, not the loop's)
    store.db.close()
    again = SqliteStore(str(tmp_path))
    again.clock_offset += 1000.0  # a run whose loop clock is 1000 s behind the first's
    broker = Broker(BrokerSettings(node_id="n1"), None, None, BrokerPorts())
    again.load(broker)
    assert broker.retained.get("r").expires == pytest.approx(msg.expires - 1000.0)
    again.db.close()


def test_a_delayed_will_is_stored_and_comes_back_due_at_the_same_instant(tmp_path):
    """[MQTT-3.1.2-8] across a restart: a will waiting for its Will Delay Interval is part of
    the session's state; the store keeps it with when it is due (on the wall clock) and gives
    it back on the clock of the run that reads it, with its properties and Message Expiry;
    published or cancelled, it is gone from the store."""
    from mqttmesh.broker import Broker, BrokerSettings
    from mqttmesh.server.sqlite_store import SqliteStore

    store = SqliteStore(str(tmp_path))
    j = Journal()
    broker = Broker(BrokerSettings(node_id="n1"), None, j)
    will = Message("w/gone", b"bye", 1, True, "n1", 7, "dev", 1.5, PROPS)
    broker.delay_will("dev", will, 30, 50.0)
    broker.delay_will("other", Message("w/o", b"x", 0, False, "n1", 8, "o", 1.5), None, 60.0)
    store.write(j.take()[1])
    store.db.close()
    again = SqliteStore(str(tmp_path))
    again.clock_offset = store.clock_offset + 1000.0  # a run whose loop clock is 1000 s behind
    j2 = Journal()
    restarted = Broker(BrokerSettings(node_id="n1"), None, j2)
    again.load(restarted)
    due, msg, expiry = restarted.delayed_wills["dev"]
    assert due == pytest.approx(50.0 - 1000.0) and expiry == 30
    assert (msg.topic, msg.payload, msg.qos, msg.retain, msg.seq, msg.publisher, msg.props) == (
        "w/gone",
        b"bye",
        1,
        True,
        7,
        "dev",
        PROPS,
    )
    restarted.cancel_will("other")  # a new connection came first
    assert restarted.publish_due_wills(-900.0) == 1 and restarted.delayed_wills == {}
    again.write(j2.take()[1])
    assert again.db.execute("SELECT count(*) FROM wills").fetchone()[0] == 0
    again.db.close()
