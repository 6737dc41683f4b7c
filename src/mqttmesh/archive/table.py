"""The archive's logs as Delta Lake tables (delta-rs, the ``deltalake`` package: no JVM).

I/O (files). Each log of an archive directory, ``publish/`` and ``delivery/``, is one table,
partitioned by ``date`` (``YYYY-MM-DD``) and ``hour`` (``HH``) of its rows' ``timestamp``, UTC,
as the plain-Parquet layout of format 1 was (``convert`` turns such a directory into a table in
place). A flush of the writer is one commit (``TableWriter.append``), tagged with the writer's
application id (``mqttmesh:{node}:{kind}``) and a version one above its last commit's: a
reader sees whole flushes or none, a write cut off by a crash (kill -9) leaves files no commit
names (invisible; ``expire`` vacuums them), and a flush retried after an error whose commit
did land is not committed twice. ``compact`` merges small files into large ones, ``expire``
removes partitions older than a time and vacuums, both as commits of their own, safe while a
writer appends (delta-rs retries a commit that lost a race, and a blind append never conflicts
with a rewrite). ``snapshot_files`` lists a version's files for Spark, pruned by partition
(``hours_may_hold``), as of the version ``--as-of`` names as ``archive/delta_log.py`` reads the
log: a table at a URI, read through Spark (``pipeline/delta_uri.py``), gives the same.
"""

from __future__ import annotations

import datetime as dt
import json
import os
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from .delta_log import LogError, last_checkpoint_version, parse_listing, plan, plan_from
from .schema import COLUMNS, FORMAT_VERSION, KINDS

__all__ = [
    "PARTITIONS",
    "TableError",
    "TableWriter",
    "Compacted",
    "Expired",
    "is_table",
    "commit_actions",
    "with_partitions",
    "hours_may_hold",
    "snapshot_files",
    "table_version",
    "compact",
    "expire",
    "convert",
]

PARTITIONS = ["date", "hour"]
_DESCRIPTION = "mqttmesh archive, {kind} log, format {version}"


class TableError(Exception):
    """A table that cannot be written, read or maintained as asked; the message says why."""


def is_table(path: str) -> bool:
    """Is ``path`` a Delta table (it has a transaction log)?"""
    return os.path.isdir(os.path.join(path, "_delta_log"))


def with_partitions(table: pa.Table) -> pa.Table:
    """``table`` with its partition columns, ``date`` and ``hour`` of ``timestamp`` (UTC)."""
    ts = table.column("timestamp")
    date = pc.strftime(ts, format="%Y-%m-%d", locale="C")
    hour = pc.strftime(ts, format="%H", locale="C")
    return table.append_column("date", date).append_column("hour", hour)


def _writer_properties(kind: str, compression: str | None):
    from deltalake import ColumnProperties, WriterProperties

    # (as format 1's files: dictionaries for the repetitive strings, deltas for the counters
    # and times, no statistics for the columns nobody filters on)
    names = [name for name, _, _ in COLUMNS[kind]]
    dictionary = {"origin", "publisher", "topic", "node", "client_id"}
    delta = {"timestamp", "seq", "payload_size", "published", "log_seq"}
    columns = {
        name: ColumnProperties(
            dictionary_enabled=name in dictionary,
            statistics_enabled="NONE" if name in ("payload", "msg_id") else "CHUNK",
            encoding="DELTA_BINARY_PACKED" if name in delta else None,
        )
        for name in names
    }
    codec = (compression or "uncompressed").upper()
    return WriterProperties(compression=codec, column_properties=columns)  # type: ignore[arg-type]


@dataclass
class Committed:
    """What one commit added: its version, files and their bytes."""

    version: int
    files: int
    nbytes: int


class TableWriter:
    """Appends flushes of one log (``kind``) of one node to ``directory/kind``."""

    def __init__(self, directory: str, node_id: str, kind: str, compression: str | None = "zstd"):
        if kind not in KINDS:
            raise ValueError(kind)
        self.path = os.path.join(directory, kind)
        self.kind = kind
        self.app_id = f"mqttmesh:{node_id}:{kind}"
        self.compression = compression
        self.last: int | None = None  # the version of our last commit (None: not read yet)
        self.reserved = 0  # the highest version handed out (``next_version``)
        self._props = _writer_properties(kind, compression)
        self._table: Any = None  # (the DeltaTable as of our last commit: brought up to date, not read again)

    def _last_committed(self) -> int:
        """Our application's last version in the table's log (0: none, or no table yet)."""
        if not is_table(self.path):
            return 0
        from deltalake import DeltaTable

        return DeltaTable(self.path).transaction_version(self.app_id) or 0

    def next_version(self) -> int:
        """A version for a commit to come, above every one handed out and every one in the log
        (read once, and again after an error). Versions must be committed in order: the log
        keeps one high-water version per writer, and a lower one is taken as committed."""
        if self.last is None:
            self.last = self._last_committed()
        self.reserved = max(self.reserved, self.last) + 1
        return self.reserved

    def append(self, table: pa.Table, version: int | None = None) -> Committed | None:
        """``table`` (rows of this log) as one commit, our next version, or ``version``: rows
        appended again under the version they had (a retry) are not committed twice, the log
        having it already (None then). An error whose commit landed anyway (the log says our
        version is there) is no error; any other is raised (TableError), and the rows may be
        appended again under the same version."""
        from deltalake import CommitProperties, Transaction, write_deltalake

        if version is None:
            version = self.next_version()
        elif self.last is None:
            self.last = self._last_committed()
        if version <= self.last:  # type: ignore[operator]  # (read just above)
            return None
        commit = CommitProperties(
            app_transactions=[Transaction(app_id=self.app_id, version=version)],
            custom_metadata={"mqttmesh.archive": str(FORMAT_VERSION), "mqttmesh.rows": str(table.num_rows)},
        )
        try:
            write_deltalake(
                self._table if self._table is not None else self.path,
                with_partitions(table),
                partition_by=PARTITIONS,
                mode="append",
                description=_DESCRIPTION.format(kind=self.kind, version=FORMAT_VERSION),
                writer_properties=self._props,
                commit_properties=commit,
            )
        except Exception as exc:
            try:
                landed = self._last_committed() >= version
            except Exception:
                landed = False
            self._table = None  # (read again from the log)
            if not landed:
                self.last = None  # (read again from the log before the next append)
                raise TableError(f"{self.path}: {type(exc).__name__}: {exc}") from exc
        self.last = version
        return self._what_landed()

    def _what_landed(self) -> Committed:
        """The files and bytes our last commit added (read from the newest commit of ours)."""
        from deltalake import DeltaTable

        table = self._table
        if table is None:
            table = self._table = DeltaTable(self.path)
        else:
            table.update_incremental()  # (the commits since the last flush only)
        version = table.version()
        # (a concurrent writer may have committed after us: look back a few versions)
        for v in range(version, max(-1, version - 16), -1):
            try:
                actions = commit_actions(self.path, v)
            except FileNotFoundError:
                continue
            txn = [a["txn"] for a in actions if "txn" in a]
            if any(t.get("appId") == self.app_id and t.get("version") == self.last for t in txn):
                adds = [a["add"] for a in actions if "add" in a]
                return Committed(v, len(adds), sum(int(a.get("size", 0)) for a in adds))
        return Committed(version, 0, 0)


def commit_actions(path: str, version: int) -> list[dict]:
    """The actions of commit ``version`` of the table at ``path``, from its log (raises
    FileNotFoundError for a version the log does not have, or no longer has)."""
    with open(os.path.join(path, "_delta_log", f"{version:020d}.json"), encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def _open(path: str, as_of: int | dt.datetime | None = None):
    from deltalake import DeltaTable

    if not is_table(path):
        raise TableError(f"{path}: not a Delta table (no _delta_log; `mqttmesh archive convert` makes one)")
    try:
        if isinstance(as_of, int):
            return DeltaTable(path, version=as_of)
        table = DeltaTable(path)
        if as_of is not None:
            table.load_as_version(as_of)
        return table
    except Exception as exc:
        raise TableError(f"{path}: {type(exc).__name__}: {exc}") from exc


def table_version(path: str) -> int:
    return _open(path).version()


def _hour_start(date: str | None, hour: str | None) -> dt.datetime | None:
    try:
        return dt.datetime.combine(dt.date.fromisoformat(date or ""), dt.time(int(hour or "")), dt.UTC)
    except (TypeError, ValueError):
        return None


def hours_may_hold(partition: dict[str, str | None], since: dt.datetime | None, until: dt.datetime | None) -> bool:
    """Whether a data file of the partition (its ``date`` and ``hour`` values) may hold rows in
    [since, until): any file whose hour is not known may."""
    start = _hour_start(partition.get("date"), partition.get("hour"))
    if start is None:
        return True
    return (since is None or start + dt.timedelta(hours=1) > since) and (until is None or start < until)


def _version_of(path: str, as_of: int | dt.datetime) -> int:
    """The version ``as_of`` names, read from the log's files as a table at a URI reads them
    (archive/delta_log.py, from the last checkpoint on when that is enough): the newest commit
    at or before a time, commit times made increasing as Delta Lake makes them (delta-rs's own
    search takes a time before the first commit as version 0, and can pick another version
    where two commits' file times are out of order). A version the table does not have, a
    time before its first commit, a version the log was cleaned up past: each a TableError
    that says so."""
    log = os.path.join(path, "_delta_log")
    try:
        with os.scandir(log) as entries:
            listing = parse_listing((e.name, e.stat().st_mtime_ns // 1_000_000) for e in entries if e.is_file())
        start = None
        if os.path.exists(os.path.join(log, "_last_checkpoint")):
            with open(os.path.join(log, "_last_checkpoint"), encoding="utf-8", errors="replace") as fh:
                start = last_checkpoint_version(fh.read())
        chosen = plan_from(listing, start, as_of) if start is not None else None
        return (chosen or plan(listing, as_of)).version
    except LogError as exc:
        raise TableError(f"{path}: {exc}") from None
    except OSError as exc:
        raise TableError(f"{path}: {type(exc).__name__}: {exc}") from exc


def snapshot_files(
    path: str,
    since: dt.datetime | None = None,
    until: dt.datetime | None = None,
    as_of: int | dt.datetime | None = None,
) -> tuple[int, list[str]]:
    """The table's version (the current one, or ``as_of``: a version number or a time) and
    the absolute paths of its data files that may hold rows in [since, until)."""
    if as_of is not None and is_table(path):
        as_of = _version_of(path, as_of)
    table = _open(path, as_of)
    actions = pa.table(table.get_add_actions(flatten=True))
    files = actions.column("path").to_pylist()
    dates = actions.column("partition.date").to_pylist() if "partition.date" in actions.column_names else []
    hours = actions.column("partition.hour").to_pylist() if "partition.hour" in actions.column_names else []
    out = []
    for i, name in enumerate(files):
        if dates and not hours_may_hold({"date": dates[i], "hour": hours[i]}, since, until):
            continue
        out.append(name if os.path.isabs(name) else os.path.join(os.path.abspath(path), name))
    return table.version(), sorted(out)


@dataclass
class Compacted:
    version: int
    files_removed: int
    files_added: int


def compact(path: str, target_bytes: int = 128 << 20, compression: str | None = "zstd") -> Compacted:
    """Small files of ``path`` merged into files of about ``target_bytes`` (one commit; a
    partition with one file or none to merge is left alone)."""
    table = _open(path)
    kind = os.path.basename(os.path.normpath(path))
    props = _writer_properties(kind, compression) if kind in KINDS else None
    try:
        metrics = table.optimize.compact(target_size=target_bytes, writer_properties=props)
    except Exception as exc:
        raise TableError(f"{path}: compaction failed ({type(exc).__name__}: {exc})") from exc
    return Compacted(table.version(), int(metrics.get("numFilesRemoved", 0)), int(metrics.get("numFilesAdded", 0)))


@dataclass
class Expired:
    version: int
    rows_removed: int
    files_vacuumed: int


def expire(path: str, older_than: dt.datetime, vacuum_hours: float = 1.0) -> Expired:
    """Every hour partition that ends at or before ``older_than`` removed (one commit, by
    partition: no file is rewritten), then files no version newer than ``vacuum_hours`` ago
    needs deleted from disk (what this and earlier removals and compactions left, and what a
    writer killed mid-write left). A reader of an older version keeps its files for that
    long."""
    table = _open(path)
    cutoff = older_than.astimezone(dt.UTC)
    day, hour = f"{cutoff:%Y-%m-%d}", f"{cutoff:%H}"
    predicate = f"date < '{day}' OR (date = '{day}' AND hour < '{hour}')"
    removed = 0
    try:
        actions = pa.table(table.get_add_actions(flatten=True))
        if actions.num_rows:
            metrics = table.delete(predicate)
            removed = int(metrics.get("num_deleted_rows", 0))
        # (full: also the files no commit ever named, a killed writer's; a live writer's
        # file not yet committed is younger than the retention, and kept)
        vacuumed = table.vacuum(
            retention_hours=max(0, int(vacuum_hours)), dry_run=False, enforce_retention_duration=False, full=True
        )
    except Exception as exc:
        raise TableError(f"{path}: expiry failed ({type(exc).__name__}: {exc})") from exc
    return Expired(table.version(), removed, len(vacuumed))


def convert(path: str) -> int:
    """A format-1 log directory (``date=/hour=`` folders of Parquet files) made a Delta table
    in place: its files become the table's first version (nothing is copied). Returns the
    number of files taken. Raises TableError if a file is not an archive file of this log
    (named) or it is already a table."""
    from deltalake import convert_to_deltalake

    from ..pipeline.extract import check_file, list_files

    kind = os.path.basename(os.path.normpath(path))
    if kind not in KINDS:
        raise TableError(f"{path}: not a log directory (its name is one of {', '.join(KINDS)})")
    if is_table(path):
        raise TableError(f"{path}: already a Delta table")
    files = list_files([os.path.dirname(os.path.normpath(path))], kind)
    for f in files:
        problem = check_file(f, kind)
        if problem is not None:
            raise TableError(f"{f}: {problem} (move it out of the archive before converting)")
    if not files:
        raise TableError(f"{path}: no archive files to convert")
    from deltalake import Field, Schema
    from deltalake.schema import PrimitiveType

    partitions = Schema([Field("date", PrimitiveType("string")), Field("hour", PrimitiveType("string"))])
    try:
        convert_to_deltalake(
            path,
            partition_by=partitions,
            partition_strategy="hive",
            description=_DESCRIPTION.format(kind=kind, version=FORMAT_VERSION),
        )
    except Exception as exc:
        raise TableError(f"{path}: conversion failed ({type(exc).__name__}: {exc})") from exc
    return len(files)
