"""SQLite (WAL) storage for persistent sessions, their messages, and retained messages.

The broker core records changes in a Journal; this module commits them in
groups on a writer thread and reports each committed batch back to the event
loop, which then releases the acknowledgements that waited for it.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import sqlite3
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from ..message import Message
from ..store import FORMAT_VERSION, clock_incarnation, restore_sessions

if TYPE_CHECKING:
    from ..broker import Broker

log = logging.getLogger("mqttmesh.store")

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS sessions(client_id TEXT PRIMARY KEY, subscriptions TEXT NOT NULL, expires REAL);
CREATE TABLE IF NOT EXISTS messages(
    client_id TEXT NOT NULL, key INTEGER NOT NULL, topic TEXT NOT NULL, payload BLOB NOT NULL,
    msg_qos INTEGER NOT NULL, qos INTEGER NOT NULL, retain INTEGER NOT NULL,
    packet_id INTEGER NOT NULL, state INTEGER NOT NULL, origin TEXT NOT NULL, seq INTEGER NOT NULL,
    publisher TEXT NOT NULL, ts REAL NOT NULL, props BLOB, expires REAL, share TEXT, root TEXT,
    PRIMARY KEY(client_id, key));
CREATE TABLE IF NOT EXISTS awaiting_rel(client_id TEXT NOT NULL, packet_id INTEGER NOT NULL,
    PRIMARY KEY(client_id, packet_id));
CREATE TABLE IF NOT EXISTS inbound(client_id TEXT NOT NULL, packet_id INTEGER NOT NULL,
    topic TEXT NOT NULL, payload BLOB NOT NULL, retain INTEGER NOT NULL, origin TEXT NOT NULL,
    seq INTEGER NOT NULL, publisher TEXT NOT NULL, ts REAL NOT NULL, props BLOB, expires REAL,
    PRIMARY KEY(client_id, packet_id));
CREATE TABLE IF NOT EXISTS session_versions(client_id TEXT PRIMARY KEY, epoch INTEGER NOT NULL,
    version INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS tombstones(client_id TEXT NOT NULL, slot INTEGER NOT NULL,
    n INTEGER NOT NULL, origin TEXT NOT NULL, seq INTEGER NOT NULL, PRIMARY KEY(client_id, slot));
CREATE TABLE IF NOT EXISTS nodes_seen(node TEXT PRIMARY KEY);
CREATE TABLE IF NOT EXISTS tombstone_floors(client_id TEXT NOT NULL, origin TEXT NOT NULL,
    seq INTEGER NOT NULL, PRIMARY KEY(client_id, origin));
CREATE TABLE IF NOT EXISTS custody(seq INTEGER PRIMARY KEY, topic TEXT NOT NULL, payload BLOB NOT NULL,
    qos INTEGER NOT NULL, retain INTEGER NOT NULL, origin TEXT NOT NULL, publisher TEXT NOT NULL,
    ts REAL NOT NULL, dests TEXT NOT NULL, props BLOB, expires REAL);
CREATE TABLE IF NOT EXISTS rerouted(origin TEXT NOT NULL, seq INTEGER NOT NULL, topic TEXT NOT NULL,
    payload BLOB NOT NULL, qos INTEGER NOT NULL, retain INTEGER NOT NULL, publisher TEXT NOT NULL,
    ts REAL NOT NULL, dests TEXT NOT NULL, props BLOB, expires REAL, PRIMARY KEY(origin, seq));
CREATE TABLE IF NOT EXISTS wills(client_id TEXT PRIMARY KEY, topic TEXT NOT NULL, payload BLOB NOT NULL,
    qos INTEGER NOT NULL, retain INTEGER NOT NULL, origin TEXT NOT NULL, seq INTEGER NOT NULL,
    publisher TEXT NOT NULL, ts REAL NOT NULL, props BLOB, expiry INTEGER, due REAL NOT NULL);
CREATE TABLE IF NOT EXISTS retained(topic TEXT PRIMARY KEY, payload BLOB NOT NULL, qos INTEGER NOT NULL,
    origin TEXT NOT NULL, seq INTEGER NOT NULL, publisher TEXT NOT NULL, ts REAL NOT NULL, props BLOB,
    expires REAL);
"""

# the tables whose messages gained their MQTT 5 properties (a NULL column) in format 2, and
# when they expire in format 3 (wall-clock seconds: a restart keeps counting)
_PROPS_TABLES = ("messages", "inbound", "custody", "retained")
# the column format 4 gave the messages table: the shared group an entry came through
_SHARE_COLUMN = "ALTER TABLE messages ADD COLUMN share TEXT"
# and format 5: the message a group's re-send re-sends (its root, shared.py ``resend_mark``)
_ROOT_COLUMN = "ALTER TABLE messages ADD COLUMN root TEXT"
# the ops that carry a message's expiry last, on the clock of this run (store.py _snapshot)
_EXPIRING = frozenset(("message_put", "inbound_put", "retained_put", "custody_put", "rerouted_put", "will_put"))

_SQL = {
    "session_put": "INSERT OR REPLACE INTO sessions(client_id, subscriptions, expires) VALUES (?, ?, ?)",
    # (by name: a store brought from an older format has the share column last, a new one too)
    "message_put": "INSERT OR REPLACE INTO messages(client_id, key, topic, payload, msg_qos, qos, retain,"
    " packet_id, state, origin, seq, publisher, ts, props, share, root, expires)"
    " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
    "message_remove": "DELETE FROM messages WHERE client_id = ? AND key = ?",
    "rel_put": "INSERT OR IGNORE INTO awaiting_rel VALUES (?, ?)",
    "rel_remove": "DELETE FROM awaiting_rel WHERE client_id = ? AND packet_id = ?",
    "inbound_put": "INSERT OR REPLACE INTO inbound VALUES (?,?,?,?,?,?,?,?,?,?,?)",
    "inbound_remove": "DELETE FROM inbound WHERE client_id = ? AND packet_id = ?",
    "version_put": "INSERT OR REPLACE INTO session_versions VALUES (?,?,?)",
    "done_put": "INSERT OR REPLACE INTO tombstones VALUES (?,?,?,?,?)",
    "floor_put": "INSERT OR REPLACE INTO tombstone_floors VALUES (?,?,?)",
    "node_seen": "INSERT OR IGNORE INTO nodes_seen VALUES (?)",
    "retained_put": "INSERT OR REPLACE INTO retained VALUES (?,?,?,?,?,?,?,?,?)",
    "retained_delete": "DELETE FROM retained WHERE topic = ?",
    "custody_put": "INSERT OR REPLACE INTO custody VALUES (?,?,?,?,?,?,?,?,?,?,?)",
    "custody_remove": "DELETE FROM custody WHERE seq = ?",
    "rerouted_put": "INSERT OR REPLACE INTO rerouted VALUES (?,?,?,?,?,?,?,?,?,?,?)",
    "rerouted_remove": "DELETE FROM rerouted WHERE origin = ? AND seq = ?",
    "will_put": "INSERT OR REPLACE INTO wills VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
    "will_delete": "DELETE FROM wills WHERE client_id = ?",
}


class StoreError(Exception):
    """The data directory cannot be used; the message says which file and why."""


class SqliteStore:
    def __init__(self, data_dir: str, synchronous: str = "normal"):
        try:
            os.makedirs(data_dir, exist_ok=True)
        except OSError as exc:
            raise StoreError(
                f"data_dir {data_dir}: cannot use it as the data directory ({exc.strerror or exc})"
            ) from None
        self.path = os.path.join(data_dir, "mqttmesh.db")
        self.synchronous = synchronous
        # wall-clock seconds minus the event loop's clock (asyncio's is time.monotonic):
        # message expiry is stored on the wall clock, which a restart does not reset
        self.clock_offset = time.time() - time.monotonic()
        try:
            self.db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute(f"PRAGMA synchronous={synchronous.upper()}")
            self.db.executescript(SCHEMA)
            check = self.db.execute("PRAGMA quick_check").fetchone()[0]
            if check != "ok":
                raise StoreError(f"{self.path}: database is damaged ({check})")
            version = self._meta("format_version")
            if version is None:
                self._set_meta("format_version", str(FORMAT_VERSION))
            elif int(version) in (1, 2):
                # format 1 knew no MQTT 5 properties, 2 no message expiry: each message table
                # gains the columns it lacks
                for table in _PROPS_TABLES:
                    if int(version) == 1:
                        self.db.execute(f"ALTER TABLE {table} ADD COLUMN props BLOB")
                    self.db.execute(f"ALTER TABLE {table} ADD COLUMN expires REAL")
                self.db.execute("ALTER TABLE sessions ADD COLUMN expires REAL")
                self.db.execute(_SHARE_COLUMN)
                self.db.execute(_ROOT_COLUMN)
                self._set_meta("format_version", str(FORMAT_VERSION))
                log.info(
                    "%s: format version %s brought to %d (MQTT 5 properties, message expiry, shared groups)",
                    self.path,
                    version,
                    FORMAT_VERSION,
                )
            elif int(version) in (3, 4):
                # format 3 kept no entry's shared group, 4 no re-send's root: its entries
                # restore without them, as they did
                if int(version) == 3:
                    self.db.execute(_SHARE_COLUMN)
                self.db.execute(_ROOT_COLUMN)
                self._set_meta("format_version", str(FORMAT_VERSION))
                log.info("%s: format version %s brought to %d (shared groups)", self.path, version, FORMAT_VERSION)
            elif int(version) != FORMAT_VERSION:
                raise StoreError(f"{self.path}: format version {version}, this mqttmesh reads version {FORMAT_VERSION}")
        except sqlite3.DatabaseError as exc:
            raise StoreError(f"{self.path}: not a usable mqttmesh database ({exc})") from None
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self.commits = 0
        self.commit_seconds = 0.0

    def _meta(self, key: str) -> str | None:
        row = self.db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return row[0] if row else None

    def _set_meta(self, key: str, value: str) -> None:
        self.db.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, value))

    def next_incarnation(self) -> int:
        """A number larger than any earlier start's (and not below the clock, in 1/16 s)."""
        stored = int(self._meta("incarnation") or 0)
        incarnation = max(stored + 1, clock_incarnation(time.time()))
        self._set_meta("incarnation", str(incarnation))
        return incarnation

    # -- loading at start ---------------------------------------------------------------

    def load(self, broker: Broker) -> tuple[int, int]:
        """Restore sessions and retained messages into ``broker``; (sessions, retained)."""
        db = self.db
        sessions = restore_sessions(
            broker.session_factory,  # the mesh's replicated kind when in a mesh
            _sessions(db, self.clock_offset),
            _rows(
                db,
                "SELECT client_id, key, topic, payload, msg_qos, qos, retain, packet_id, state,"
                " origin, seq, publisher, ts, props, share, root, expires FROM messages ORDER BY client_id, key",
                self.clock_offset,
            ),
            _rows(db, "SELECT client_id, packet_id FROM awaiting_rel"),
            _rows(
                db,
                "SELECT client_id, packet_id, topic, payload, retain, origin, seq, publisher, ts, props, expires"
                " FROM inbound ORDER BY client_id, packet_id",
                self.clock_offset,
            ),
            _rows(db, "SELECT * FROM session_versions"),
            _rows(db, "SELECT client_id, n, origin, seq FROM tombstones ORDER BY client_id, n"),
            _rows(db, "SELECT client_id, origin, seq FROM tombstone_floors"),
        )
        for session in sessions:
            broker.table.restore_session(session)
        retained = 0
        for topic, payload, qos, origin, seq, publisher, ts, props, expires in db.execute(
            "SELECT topic, payload, qos, origin, seq, publisher, ts, props, expires FROM retained"
        ):
            msg = Message(topic, bytes(payload), qos, True, origin, seq, publisher, ts, _props(props))
            msg.expires = self._here(expires)
            broker.retained.set(topic, msg)
            retained += 1
        for cid, topic, payload, qos, retain, origin, seq, publisher, ts, props, expiry, due in db.execute(
            "SELECT client_id, topic, payload, qos, retain, origin, seq, publisher, ts, props, expiry, due FROM wills"
        ):
            # (a delayed will, on the clock of this run: one whose time passed while the node
            # was down is published at the first sweep)
            msg = Message(topic, bytes(payload), qos, bool(retain), origin, seq, publisher, ts, _props(props))
            broker.delayed_wills[cid] = (due - self.clock_offset, msg, expiry)
        return len(sessions), retained

    def load_nodes(self) -> list[str]:
        """The nodes of the mesh this node had seen when it stopped (mesh/cluster/membership.py)."""
        return [row[0] for row in self.db.execute("SELECT node FROM nodes_seen ORDER BY node")]

    def load_custody(self) -> list[tuple[Message, list[str]]]:
        """Messages this node held for other nodes when it stopped (mesh/routing/engine.py custody):
        its own, then those of other origins it routed again (``rerouted``)."""
        out = []
        for table, order in (("custody", "seq"), ("rerouted", "origin, seq")):
            for origin, seq, topic, payload, qos, retain, publisher, ts, dests, props, expires in self.db.execute(
                "SELECT origin, seq, topic, payload, qos, retain, publisher, ts, dests, props, expires"
                f" FROM {table} ORDER BY {order}"  # noqa: S608 (two fixed names)
            ):
                msg = Message(topic, bytes(payload), qos, bool(retain), origin, seq, publisher, ts, _props(props))
                msg.expires = self._here(expires)
                out.append((msg, dests.split("\0")))
        return out

    # -- the writer thread -----------------------------------------------------------------

    def start(self, on_committed) -> None:
        """Commit batches on a thread; ``on_committed(batch, error)`` runs on that thread."""
        self._thread = threading.Thread(target=self._run, args=(on_committed,), name="mqttmesh-store", daemon=True)
        self._thread.start()

    def submit(self, batch: int, ops: list[tuple]) -> None:
        self._queue.put((batch, ops))

    def write(self, ops: list[tuple]) -> None:
        """Commit one batch in one transaction (writer thread, or at shutdown)."""
        started = time.perf_counter()
        db = self.db
        db.execute("BEGIN")
        try:
            for op in ops:
                kind = op[0]
                if kind == "session_put":
                    expires = None if op[3] is None else op[3] + self.clock_offset  # (on the wall clock)
                    db.execute(_SQL[kind], (op[1], json.dumps(op[2]), expires))
                elif kind == "session_delete":
                    db.execute("DELETE FROM sessions WHERE client_id = ?", (op[1],))
                    db.execute("DELETE FROM messages WHERE client_id = ?", (op[1],))
                    db.execute("DELETE FROM awaiting_rel WHERE client_id = ?", (op[1],))
                    db.execute("DELETE FROM inbound WHERE client_id = ?", (op[1],))
                    db.execute("DELETE FROM session_versions WHERE client_id = ?", (op[1],))
                    db.execute("DELETE FROM tombstones WHERE client_id = ?", (op[1],))
                    db.execute("DELETE FROM tombstone_floors WHERE client_id = ?", (op[1],))
                elif kind in _EXPIRING and op[-1] is not None:
                    db.execute(_SQL[kind], (*op[1:-1], op[-1] + self.clock_offset))  # (on the wall clock)
                else:
                    db.execute(_SQL[kind], op[1:])
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        self.commits += 1
        self.commit_seconds += time.perf_counter() - started

    def _run(self, on_committed) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            batch, ops = item
            try:
                self.write(ops)
                on_committed(batch, None)
            except Exception as exc:  # disk full, I/O error: acks stay held, say why
                log.error("store commit of batch %d failed: %s", batch, exc)
                on_committed(batch, exc)

    def stop_writer(self) -> None:
        """Let the writer finish every batch it was given, then end it."""
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join(timeout=30)
            self._thread = None

    def close(self) -> None:
        self.stop_writer()
        self.db.close()

    def _here(self, expires: float | None) -> float | None:
        """A stored expiry (wall clock) on the clock of this run."""
        return None if expires is None else expires - self.clock_offset


def _props(raw: bytes | None) -> bytes | None:
    return bytes(raw) if raw is not None else None


def _rows(db: sqlite3.Connection, sql: str, clock_offset: float | None = None) -> Iterator[Any]:
    """The rows of ``sql``, queried when the first one is wanted (one query at a time); with
    ``clock_offset``, the last column is an expiry on the wall clock, given on this run's."""
    if clock_offset is None:
        yield from db.execute(sql)
        return
    for row in db.execute(sql):
        expires = row[-1]
        yield row if expires is None else (*row[:-1], expires - clock_offset)


def _sessions(db: sqlite3.Connection, clock_offset: float) -> Iterator[tuple[str, dict[str, int], float | None]]:
    """(client_id, subscriptions, when it ends on the clock of this run or None)."""
    for client_id, subs, expires in _rows(db, "SELECT client_id, subscriptions, expires FROM sessions", clock_offset):
        yield client_id, {f: int(q) for f, q in json.loads(subs).items()}, expires
