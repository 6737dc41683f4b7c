"""What the pipeline tests share: timestamps, and reading what a node's archive wrote.

pyarrow is imported where it is needed, so that this module loads without the
`pipeline` extra (the tests that need it skip themselves with importorskip).
"""

from __future__ import annotations

import datetime as dt
import os

UTC = dt.UTC


def ts(text: str) -> dt.datetime:
    """An aware UTC datetime from 'HH:MM:SS[.ffffff]' on 2026-01-31, or a full ISO string."""
    if "T" not in text and "-" not in text:
        text = "2026-01-31T" + text
    t = dt.datetime.fromisoformat(text)
    return t if t.tzinfo else t.replace(tzinfo=UTC)


def archive_flags(directory, *extra):
    return ["--archive", "true", "--archive-dir", str(directory), *extra]


def read_archive(directory, kind="publish"):
    import pyarrow.parquet as pq

    rows = []
    base = os.path.join(directory, kind)
    for dirpath, _, names in os.walk(base):
        for n in sorted(names):
            if n.endswith(".parquet") and not n.startswith("."):
                rows += pq.read_table(os.path.join(dirpath, n)).to_pylist()
    return rows


def writer_pid(broker) -> int | None:
    """The archive writer process the broker started (its child running mqttmesh.archive.worker)."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                cmd = fh.read()
        except (OSError, IndexError, ValueError):
            continue
        if ppid == broker.pid and b"mqttmesh.archive.worker" in cmd:
            return int(entry)
    return None
