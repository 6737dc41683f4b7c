"""``mqttmesh archive info|compact|expire|convert DIR``: the archive's Delta tables by hand.

I/O. Importing this module imports neither pyarrow nor deltalake: the broker's command line
builds its parser from ``add_arguments``, and only ``run`` needs them (the pipeline extra).
A node's writer does the same compaction and expiry on its own schedule
(``archive.compact_interval``, ``archive.retention``); running them by hand while it writes
is safe (archive/table.py).
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import re
import sys

__all__ = ["add_arguments", "run"]

_AGE = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="archive_command", required=True)
    q = sub.add_parser("info", help="each log's table: version, files, rows, bytes, hours")
    q.add_argument("dir", help="archive directory (archive.dir of a node)")
    q = sub.add_parser("compact", help="merge each log's small files into large ones (one commit per log)")
    q.add_argument("dir")
    q.add_argument("--target-mb", type=int, default=128, help="size of the files made (128)")
    q = sub.add_parser("expire", help="remove the hours older than an age, then delete unneeded files")
    q.add_argument("dir")
    q.add_argument("--older-than", required=True, metavar="AGE", help="e.g. 30d, 12h, 90m")
    q.add_argument(
        "--vacuum-hours",
        type=float,
        default=1.0,
        help="files removed from a table less than this long ago stay for readers of older versions (1)",
    )
    q = sub.add_parser("convert", help="make each format-1 log directory (date=/hour= Parquet) a Delta table, in place")
    q.add_argument("dir")


def parse_age(text: str) -> float:
    m = _AGE.match(text.strip())
    if not m:
        raise ValueError(f"--older-than: {text!r} is not an age (a number and s, m, h or d: 30d, 12h)")
    return float(m.group(1)) * _UNITS[m.group(2)]


def run(args: argparse.Namespace) -> int:
    try:
        from .schema import KINDS
        from .table import TableError, compact, convert, expire, is_table
    except ImportError as exc:
        need = "pyarrow and deltalake: pip install 'mqttmesh[pipeline]'"
        print(f"mqttmesh archive: needs {need} ({exc})", file=sys.stderr)
        return 2
    root = args.dir
    if not os.path.isdir(root):
        print(f"mqttmesh archive: {root}: no such directory", file=sys.stderr)
        return 2
    cmd = args.archive_command
    try:
        cutoff = None
        if cmd == "expire":
            cutoff = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=parse_age(args.older_than))
    except ValueError as exc:
        print(f"mqttmesh archive: {exc}", file=sys.stderr)
        return 2
    status = 0
    for kind in KINDS:
        path = os.path.join(root, kind)
        if not os.path.isdir(path):
            continue
        try:
            if cmd == "convert":
                if is_table(path):
                    print(f"{path}: already a Delta table")
                    continue
                print(f"{path}: {convert(path)} files taken into a Delta table (version 0)")
            elif not is_table(path):
                print(f"{path}: not a Delta table (`mqttmesh archive convert {root}` makes one)", file=sys.stderr)
                status = 1
            elif cmd == "info":
                _info(path)
            elif cmd == "compact":
                c = compact(path, args.target_mb << 20)
                print(f"{path}: {c.files_removed} files merged into {c.files_added} (version {c.version})")
            else:
                assert cutoff is not None
                e = expire(path, cutoff, args.vacuum_hours)
                print(
                    f"{path}: {e.rows_removed} rows before {cutoff:%Y-%m-%dT%H:00Z} removed, "
                    f"{e.files_vacuumed} files deleted (version {e.version})"
                )
        except TableError as exc:
            print(f"mqttmesh archive {cmd}: {exc}", file=sys.stderr)
            status = 1
    return status


def _info(path: str) -> None:
    import pyarrow as pa
    from deltalake import DeltaTable

    table = DeltaTable(path)
    actions = pa.table(table.get_add_actions(flatten=True))
    rows = sum(actions.column("num_records").to_pylist()) if actions.num_rows else 0
    nbytes = sum(actions.column("size_bytes").to_pylist()) if actions.num_rows else 0
    hours: list[tuple[str, str]] = []
    if actions.num_rows:
        dates, hrs = actions.column("partition.date").to_pylist(), actions.column("partition.hour").to_pylist()
        hours = sorted(set(zip(dates, hrs, strict=True)))
    span = f", hours {hours[0][0]}T{hours[0][1]} .. {hours[-1][0]}T{hours[-1][1]}" if hours else ""
    print(f"{path}: version {table.version()}, {actions.num_rows} files, {rows} rows, {nbytes} bytes{span}")
