"""A Delta table at a URI (``hdfs://``, ``s3a://``...) read through its log by Spark itself.

The driver lists ``_delta_log`` and reads ``_last_checkpoint`` with the JVM's Hadoop
``FileSystem`` (``spark._jvm``), the checkpoint with ``spark.read.parquet`` and the commits
with ``spark.read.text`` (Spark jobs: the executors read them in their JVM, no Python package
needed there); ``archive/delta_log.py`` says which files to read and replays their add and
remove actions, as ``archive/table.snapshot_files`` gives a local table's files with delta-rs.
Whatever file system Spark reads the data files with reads the log the same way.
"""

from __future__ import annotations

import datetime as dt
import json

from ..archive.delta_log import (
    LogError,
    Plan,
    check_protocol,
    data_path,
    last_checkpoint_version,
    names_from,
    parse_listing,
    plan,
    plan_from,
    replay,
)
from ..archive.table import TableError, hours_may_hold

__all__ = ["uri_is_table", "uri_snapshot_files"]


def _fs(spark, uri: str):
    """The Hadoop FileSystem of ``uri`` and its Path class (Spark's Hadoop configuration)."""
    path_class = spark._jvm.org.apache.hadoop.fs.Path
    return path_class(uri).getFileSystem(spark._jsc.hadoopConfiguration()), path_class


def uri_is_table(spark, uri: str) -> bool:
    """Is the directory at ``uri`` a Delta table (it has a ``_delta_log`` directory)?"""
    fs, path_class = _fs(spark, uri)
    log = path_class(uri.rstrip("/") + "/_delta_log")
    return bool(fs.exists(log) and fs.getFileStatus(log).isDirectory())


def _read_small(fs, path) -> str | None:
    """A small file's text (None if it is not there)."""
    if not fs.exists(path):
        return None
    stream = fs.open(path)
    try:
        data = bytes(stream.readAllBytes())
    finally:
        stream.close()
    return data.decode("utf-8", errors="replace")


def _list(fs, path_class, log: str, pattern: str) -> list[tuple[str, int]]:
    """(name, modification time in ms) of the log's files matching a Hadoop glob (four py4j
    calls an entry, about 0.4 ms: what the glob leaves out never crosses to Python)."""
    found = fs.globStatus(path_class(log + "/" + pattern)) or []
    return [(st.getPath().getName(), int(st.getModificationTime())) for st in found]


def _plan(spark, uri: str, as_of: int | dt.datetime | None) -> Plan:
    """What to read. The listing starts at the checkpoint ``_last_checkpoint`` names when that
    is enough (``plan_from``: the current version, a version or a time at or after it); else
    it is of the whole log."""
    fs, path_class = _fs(spark, uri)
    log = uri.rstrip("/") + "/_delta_log"
    hint = _read_small(fs, path_class(log + "/_last_checkpoint"))
    start = last_checkpoint_version(hint) if hint is not None else None
    if start is not None:
        chosen = plan_from(parse_listing(_list(fs, path_class, log, names_from(start))), start, as_of)
        if chosen is not None:
            return chosen
    return plan(parse_listing(_list(fs, path_class, log, "[0-9]*")), as_of)


def _reader(spark):
    # (the log is read whole or not at all, whatever the session's settings for data files)
    return spark.read.option("ignoreCorruptFiles", "false").option("ignoreMissingFiles", "false")


def _checkpoint_files(spark, log: str, names: list[str]) -> list[tuple[str, dict[str, str | None]]]:
    from pyspark.sql import functions as F

    if not names:
        return []
    rows = (
        _reader(spark)
        .parquet(*[f"{log}/{n}" for n in names])
        .where(F.col("add").isNotNull() | F.col("protocol").isNotNull())
        .select(F.col("add.path").alias("path"), F.col("add.partitionValues").alias("pv"), F.to_json("protocol"))
        .collect()
    )
    adds = []
    for path, values, protocol in rows:
        if protocol is not None:
            check_protocol(json.loads(protocol))
        if path is not None:
            adds.append((path, dict(values or {})))
    return adds


def _commits(spark, log: str, versions: list[int]) -> list[tuple[int, list[dict]]]:
    from pyspark.sql import functions as F

    if not versions:
        return []
    rows = (
        _reader(spark)
        .text([f"{log}/{v:020d}.json" for v in versions])
        .select(F.col("_metadata.file_name"), F.col("value"))
        .collect()
    )
    actions: dict[int, list[dict]] = {v: [] for v in versions}
    for name, line in rows:
        if line.strip():
            version = int(name.split(".")[0])
            try:
                actions[version].append(json.loads(line))
            except ValueError:
                raise LogError(f"its commit {version} has a line that is not JSON: {line[:80]!r}") from None
    return list(actions.items())


def uri_snapshot_files(
    spark,
    uri: str,
    since: dt.datetime | None = None,
    until: dt.datetime | None = None,
    as_of: int | dt.datetime | None = None,
) -> tuple[int, list[str]]:
    """``snapshot_files`` of the table at ``uri``, read with Spark's Hadoop FileSystem: its
    version (the current one, or ``as_of``) and its data files' URIs that may hold rows in
    [since, until). Raises TableError saying why a version cannot be read."""
    root = uri.rstrip("/")
    log = root + "/_delta_log"
    try:
        chosen = _plan(spark, root, as_of)
        files = replay(_checkpoint_files(spark, log, chosen.checkpoint), _commits(spark, log, chosen.commits))
    except LogError as exc:
        raise TableError(f"{uri}: {exc}") from None
    out = [data_path(root, path) for path, values in files.items() if hours_may_hold(values, since, until)]
    return chosen.version, sorted(out)
