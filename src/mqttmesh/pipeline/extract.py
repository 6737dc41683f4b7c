"""Extract: the archive's Parquet files -> DataFrames, with bad files reported by name.

Local archives are listed here (pruned by the ``date=``/``hour=`` directories when a
time range is given) and every file's footer is checked before Spark sees it: a
truncated or foreign file is named and skipped, or the job stops, as ``on_corrupt``
says. At a URI (``hdfs://``, ``s3a://``), a log that is a Delta table is read through its
log by Spark's Hadoop FileSystem (pipeline/delta_uri.py), any other is handed to Spark as a
directory; there, Spark's own ``ignoreCorruptFiles`` applies the same choice without the names.
"""

from __future__ import annotations

import datetime as dt
import os
import re
from collections.abc import Callable

from ..archive.schema import COLUMNS, FORMAT_VERSION, KINDS

__all__ = [
    "ExtractError",
    "is_uri",
    "list_files",
    "check_file",
    "check_table_file",
    "read_log",
    "local_roots",
    "log_files",
    "read_files",
]

_PART = re.compile(r"^(date|hour)=(.+)$")


class ExtractError(Exception):
    """The archive cannot be read as asked; the message says which file or option."""


def is_uri(root: str) -> bool:
    """Is ``root`` for Spark's Hadoop FileSystem (``hdfs://``, ``s3a://``...), not a local path?"""
    return "://" in root and not root.startswith("file://")


def _local(root: str) -> str:
    return root[len("file://") :] if root.startswith("file://") else root


def _hour_of_dir(dirpath: str) -> tuple[dt.date | None, int | None]:
    date = hour = None
    for part in dirpath.replace("\\", "/").split("/"):
        m = _PART.match(part)
        if not m:
            continue
        try:
            if m.group(1) == "date":
                date = dt.date.fromisoformat(m.group(2))
            else:
                hour = int(m.group(2))
        except ValueError:
            pass
    return date, hour


def _may_hold(dirpath: str, since: dt.datetime | None, until: dt.datetime | None) -> bool:
    """Whether a partition directory can hold rows in [since, until)."""
    date, hour = _hour_of_dir(dirpath)
    if date is None:
        return True
    start = dt.datetime.combine(date, dt.time(hour or 0), dt.UTC)
    end = start + (dt.timedelta(hours=1) if hour is not None else dt.timedelta(days=1))
    return (since is None or end > since) and (until is None or start < until)


def list_files(roots: list[str], kind: str, since=None, until=None) -> list[str]:
    """The archive files of ``kind`` under local ``roots`` (hidden and ``_`` files are not
    data: a file being written is ``.NAME.tmp`` until it is complete)."""
    if kind not in KINDS:
        raise ValueError(kind)
    out: list[str] = []
    for root in roots:
        base = os.path.join(_local(root), kind)
        for dirpath, dirnames, filenames in os.walk(base):
            dirnames[:] = sorted(
                d
                for d in dirnames
                if not d.startswith((".", "_")) and _may_hold(os.path.join(dirpath, d), since, until)
            )
            out.extend(
                os.path.join(dirpath, f)
                for f in sorted(filenames)
                if f.endswith(".parquet") and not f.startswith((".", "_"))
            )
    return out


def check_file(path: str, kind: str, full: bool = False) -> str | None:
    """Why ``path`` is not a readable archive file of ``kind`` (None when it is).

    By default only the footer is read (truncated, foreign or other-version files); with
    ``full`` every page is decompressed and decoded too (a damaged page in a good file).
    """
    import pyarrow.parquet as pq

    try:
        meta = pq.read_metadata(path)
        schema = meta.schema.to_arrow_schema()
    except Exception as exc:  # pyarrow says ArrowInvalid/OSError for truncated and foreign files
        return f"not a readable Parquet file ({type(exc).__name__}: {_first_line(exc)})"
    info = schema.metadata or {}
    version = info.get(b"mqttmesh.archive")
    if version is None:
        return "not an mqttmesh archive file (no mqttmesh.archive metadata)"
    if version != str(FORMAT_VERSION).encode():
        return f"archive format version {version.decode(errors='replace')}, this mqttmesh reads {FORMAT_VERSION}"
    stored_kind = info.get(b"mqttmesh.kind", b"").decode(errors="replace")
    if stored_kind != kind:
        return f"a {stored_kind or 'unknown'} log file in the {kind} log"
    return _columns_and_pages(path, schema.names, kind, full)


def check_table_file(path: str, kind: str, full: bool = False) -> str | None:
    """Why ``path``, a data file a Delta table's log names, is not readable as ``kind``
    rows (None when it is): its footer (or, with ``full``, every page) and its columns. The
    table's log, not the file, says which files and rows belong to it."""
    import pyarrow.parquet as pq

    try:
        schema = pq.read_schema(path)
    except Exception as exc:
        return f"not a readable Parquet file ({type(exc).__name__}: {_first_line(exc)})"
    return _columns_and_pages(path, schema.names, kind, full)


def _columns_and_pages(path: str, names: list[str], kind: str, full: bool) -> str | None:
    """What a readable file of ``kind`` with columns ``names`` lacks: a column, or (``full``)
    a page that decodes."""
    import pyarrow.parquet as pq

    missing = [name for name, _, _ in COLUMNS[kind] if name not in names]
    if missing:
        return f"columns missing: {', '.join(missing)}"
    if full:
        try:
            pq.ParquetFile(path).read()
        except Exception as exc:
            return f"damaged data ({type(exc).__name__}: {_first_line(exc)})"
    return None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return (text.splitlines()[0] if text else type(exc).__name__)[:200]


def _remote_paths(spark, root: str, kind: str, since, until, as_of, say: Callable[[str], None]) -> list[str]:
    """What Spark reads of the ``kind`` log at a URI: a Delta table's files of the version
    asked (its log read by Spark, as a local table's by delta-rs), or the directory."""
    from ..archive.table import TableError
    from .delta_uri import uri_is_table, uri_snapshot_files

    log_uri = root.rstrip("/") + "/" + kind
    if not uri_is_table(spark, log_uri):
        if as_of is not None:
            raise ExtractError(f"--as-of: {log_uri} is not a Delta table (`mqttmesh archive convert` makes one)")
        return [log_uri]
    try:
        version, files = uri_snapshot_files(spark, log_uri, since, until, as_of)
    except TableError as exc:
        raise ExtractError(str(exc)) from None
    say(f"{log_uri}: Delta table, version {version}, {len(files)} files in the time range")
    return files


def read_log(
    spark,
    roots: list[str],
    kind: str,
    since=None,
    until=None,
    on_corrupt: str = "skip",
    say: Callable[[str], None] = print,
    required: bool = True,
    verify: str = "footer",
    as_of=None,
):
    """The ``kind`` log of the archives under ``roots`` as a DataFrame, rows in [since, until).
    A log that is a Delta table (archive.format = delta) is read as of its current version,
    or ``as_of`` (a version number or a time): the files of that version alone, pruned by
    hour (archive/table.py; at a URI, pipeline/delta_uri.py); a format-1 log directory, as
    its files are now (``as_of`` is refused there: it has no versions).

    ``on_corrupt``: "skip" names each bad file through ``say`` and leaves it out; "fail"
    raises ExtractError naming the first one. ``verify``: "footer" (every file's footer
    and schema) or "full" (every page too, read once on the driver). With ``required``,
    no file at all is an ExtractError; otherwise the result is an empty DataFrame.
    """
    paths = log_files(roots, kind, since, until, on_corrupt, say, required, verify, as_of, spark)
    return read_files(spark, paths, kind, since, until, on_corrupt)


def local_roots(roots: list[str]) -> bool:
    """Whether ``log_files`` lists ``roots`` without Spark (no URI among them)."""
    return not any(is_uri(root) for root in roots)


def log_files(
    roots: list[str],
    kind: str,
    since=None,
    until=None,
    on_corrupt: str = "skip",
    say: Callable[[str], None] = print,
    required: bool = True,
    verify: str = "footer",
    as_of=None,
    spark=None,
) -> list[str]:
    """What ``read_log`` hands Spark: the files of the ``kind`` log under ``roots``, each
    checked (``on_corrupt``, ``verify``, ``required``, ``as_of`` as there). Local roots are
    listed and checked on the driver without Spark (so before its session is up: cli.py);
    a URI needs ``spark`` (its Hadoop FileSystem)."""
    # (archive.table imports pyarrow: not for list_files, which session.archive_bytes calls
    # before the JVM starts)
    from ..archive.table import TableError, is_table, snapshot_files

    if on_corrupt not in ("skip", "fail"):
        raise ValueError(on_corrupt)
    paths: list[str] = []
    for root in roots:
        if is_uri(root):
            if spark is None:
                raise ValueError(f"{root}: a URI is listed by Spark")
            paths.extend(_remote_paths(spark, root, kind, since, until, as_of, say))
            continue
        if not os.path.isdir(_local(root)):
            raise ExtractError(f"--archive {root}: no such directory")
        log_dir = os.path.join(_local(root), kind)
        if is_table(log_dir):
            try:
                version, files = snapshot_files(log_dir, since, until, as_of)
            except TableError as exc:
                raise ExtractError(str(exc)) from None
            say(f"{log_dir}: Delta table, version {version}, {len(files)} files in the time range")
            checked = [(f, check_table_file(f, kind, full=verify == "full")) for f in files]
        elif as_of is not None:
            raise ExtractError(f"--as-of: {log_dir} is not a Delta table (`mqttmesh archive convert` makes one)")
        else:
            checked = [(f, check_file(f, kind, full=verify == "full")) for f in list_files([root], kind, since, until)]
        for path, problem in checked:
            if problem is None:
                paths.append(path)
            elif on_corrupt == "fail":
                raise ExtractError(f"{path}: {problem} (--on-corrupt skip leaves such files out)")
            else:
                say(f"skipping {path}: {problem}")
    if not paths and required:
        where = ", ".join(os.path.join(r, kind) for r in roots)
        raise ExtractError(
            f"no {kind} log files under {where}"
            + (" in the time range" if since or until else "")
            + ("" if kind == "publish" else " (is archive.delivery_log on?)")
        )
    return paths


def read_files(spark, paths: list[str], kind: str, since=None, until=None, on_corrupt: str = "skip"):
    """``log_files``'s ``paths`` as a DataFrame of the ``kind`` log, rows in [since, until)
    (none: an empty DataFrame)."""
    from pyspark.sql import functions as F

    from .schema import spark_schema

    schema = spark_schema(kind)
    if not paths:
        return spark.createDataFrame([], schema)
    # a file whose footer is fine but whose pages are not is Spark's to find
    spark.conf.set("spark.sql.files.ignoreCorruptFiles", "true" if on_corrupt == "skip" else "false")
    df = spark.read.schema(schema).option("recursiveFileLookup", "true").parquet(*paths)
    if since is not None:
        df = df.where(F.col("timestamp") >= F.lit(since))
    if until is not None:
        df = df.where(F.col("timestamp") < F.lit(until))
    return df
