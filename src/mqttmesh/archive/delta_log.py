"""A Delta table's log replayed to the data files of one version, on any file system (pure).

Leaves to its caller: listing the ``_delta_log`` directory (names and modification times),
reading ``_last_checkpoint``, a checkpoint's rows and the commit files' lines. It says which
files to read (``plan``: the newest whole checkpoint at or before the version, then the commits
after it, oldest first) and what a version holds (``replay``: add and remove actions, as the
Delta protocol's "Action Reconciliation" says). A version is a number, or the newest commit at
or before a time, a commit's time being its file's modification time made increasing
(``commit_times``; from the last checkpoint on, ``plan_from``, for a time after it), as Delta
Lake takes it for tables without in-commit timestamps (the archive's). ``archive/table.py``
reads local tables with delta-rs, as of the version ``plan`` names; ``pipeline/delta_uri.py``
reads tables at a URI through Spark.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import unquote

__all__ = [
    "LogError",
    "Listing",
    "Plan",
    "parse_listing",
    "names_from",
    "plan",
    "plan_from",
    "commit_times",
    "replay",
    "check_protocol",
    "data_path",
    "last_checkpoint_version",
]

_COMMIT = re.compile(r"^(\d{20})\.json$")
# a classic checkpoint (one file) or one part of a multi-part one (PART of PARTS)
_CHECKPOINT = re.compile(r"^(\d{20})\.checkpoint(?:\.(\d{10})\.(\d{10}))?\.parquet$")
# reader features whose files a reader of plain Parquet files and add/remove actions reads right
_HARMLESS_FEATURES = {"timestampNtz", "vacuumProtocolCheck"}


class LogError(Exception):
    """The log cannot give the version asked; the message says why (the caller names the table)."""


@dataclass
class Listing:
    """What a listing of ``_delta_log`` found: each commit's time (ms since the epoch) and each
    whole checkpoint's file names (a multi-part one only when every part is there)."""

    commits: dict[int, int]
    checkpoints: dict[int, list[str]]


@dataclass
class Plan:
    """The files to read for ``version``: a checkpoint's (none: from commit 0) and commits."""

    version: int
    checkpoint: list[str]
    commits: list[int]


def parse_listing(entries: Iterable[tuple[str, int]]) -> Listing:
    """``entries``: (name, modification time in ms) of the files in ``_delta_log``; other names
    (``_last_checkpoint``, ``.crc`` files, temporary files) are left out."""
    commits: dict[int, int] = {}
    parts: dict[tuple[int, int], list[tuple[int, str]]] = {}
    for name, mtime in entries:
        m = _COMMIT.match(name)
        if m:
            commits[int(m.group(1))] = int(mtime)
            continue
        m = _CHECKPOINT.match(name)
        if m:
            total = int(m.group(3)) if m.group(3) else 1
            parts.setdefault((int(m.group(1)), total), []).append((int(m.group(2) or 1), name))
    checkpoints: dict[int, list[str]] = {}
    for (version, total), found in parts.items():
        if sorted(p for p, _ in found) == list(range(1, total + 1)):
            checkpoints[version] = [name for _, name in sorted(found)]
    return Listing(commits, checkpoints)


def names_from(version: int) -> str:
    """A Hadoop glob matching the log's file names of versions ``version`` and later (commits,
    checkpoints): listing those alone spares reading the whole log's names, thousands of them
    for an archive flushed every few seconds. Names are 20 digits: a name is at or above
    ``version`` when it starts with its digits, or shares their first i digits and has a larger
    one next."""
    digits = f"{version:020d}"
    alternatives = [digits + "*"]
    for i, d in enumerate(digits):
        if d != "9":
            alternatives.append(f"{digits[:i]}[{int(d) + 1}-9]*")
    return "{" + ",".join(alternatives) + "}"


def last_checkpoint_version(text: str) -> int | None:
    """The version ``_last_checkpoint`` (its text) names, or None when it names none."""
    try:
        version = json.loads(text).get("version")
    except (ValueError, AttributeError):
        return None
    return version if isinstance(version, int) and version >= 0 else None


def _ms(t: dt.datetime) -> int:
    return (t - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)) // dt.timedelta(milliseconds=1)


def _at(ms: int) -> str:
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).isoformat(timespec="milliseconds")


def commit_times(commits: dict[int, int]) -> dict[int, int]:
    """Each commit's time, made increasing: a commit whose file is not newer than the one
    before it (clocks of two writers) is taken at 1 ms after it, as Delta Lake does."""
    out: dict[int, int] = {}
    last: int | None = None
    for version in sorted(commits):
        t = commits[version] if last is None else max(commits[version], last + 1)
        out[version] = last = t
    return out


def _version_at(listing: Listing, when: dt.datetime) -> int:
    times = commit_times(listing.commits)
    if not times:
        raise LogError("its log has no commit file to take a time from")
    first = min(times)
    wanted = _ms(when)
    if wanted < times[first]:
        if first == 0:
            raise LogError(
                f"--as-of {when.isoformat()} is before the table's first commit (version 0, at {_at(times[0])})"
            )
        raise LogError(
            f"--as-of {when.isoformat()}: the log no longer has the commits before version {first} "
            f"(at {_at(times[first])}; cleaned up)"
        )
    return max(v for v, t in times.items() if t <= wanted)


def plan(listing: Listing, as_of: int | dt.datetime | None = None) -> Plan:
    """What to read for the current version, or ``as_of`` (a version, or the newest commit at
    or before a time). Raises LogError for a version the table does not have (yet), a time
    before its first commit, and a version whose commits the log no longer has."""
    known = set(listing.commits) | set(listing.checkpoints)
    if not known:
        raise LogError("its log has no commit")
    latest = max(known)
    if as_of is None:
        version = latest
    elif isinstance(as_of, dt.datetime):
        version = _version_at(listing, as_of)
    else:
        version = as_of
        if version > latest:
            raise LogError(f"--as-of {version}: no such version (the latest is {latest})")
    base = max((c for c in listing.checkpoints if c <= version), default=None)
    start = 0 if base is None else base + 1
    missing = [v for v in range(start, version + 1) if v not in listing.commits]
    if missing:
        oldest = _oldest_readable(listing)
        if base is None and oldest is not None and version < oldest:
            raise LogError(
                f"--as-of {version}: the log no longer has that version (cleaned up; the oldest it can "
                f"give is {oldest})"
            )
        raise LogError(f"its log lacks commit {missing[0]} (needed for version {version}): a log cleaned up or damaged")
    checkpoint = listing.checkpoints[base] if base is not None else []
    return Plan(version, checkpoint, list(range(start, version + 1)))


def plan_from(listing: Listing, start: int, as_of: int | dt.datetime | None = None) -> Plan | None:
    """``plan`` from the checkpoint at version ``start`` (the one ``_last_checkpoint`` names) on,
    the log's older files left out, or None when they are needed: that checkpoint is not whole,
    or ``as_of`` is an older version, or a time before that commit's own. A time's commits are
    then made increasing from that commit on (as Delta Lake makes those it lists from a
    checkpoint), and a reader lists only the files from ``start`` on (``names_from``)."""
    window = Listing(
        {v: t for v, t in listing.commits.items() if v >= start},
        {v: names for v, names in listing.checkpoints.items() if v >= start},
    )
    if start not in window.checkpoints:
        return None
    if isinstance(as_of, dt.datetime):
        if start not in window.commits or _ms(as_of) < window.commits[start]:
            return None
    elif as_of is not None and as_of < start:
        return None
    return plan(window, as_of)


def _oldest_readable(listing: Listing) -> int | None:
    """The oldest version the log can be replayed to (a checkpoint's, or 0), None if none."""
    if 0 in listing.commits:
        return 0
    return min(listing.checkpoints, default=None)


def check_protocol(protocol: dict) -> None:
    """Refuses a table whose files need more than plain Parquet files and add/remove actions
    (column mapping, deletion vectors, v2 checkpoints...): its reader would read wrong rows."""
    reader = int(protocol.get("minReaderVersion", 1))
    features = set(protocol.get("readerFeatures") or [])
    if reader == 2 or (reader >= 3 and not features <= _HARMLESS_FEATURES) or reader > 3:
        named = ", ".join(sorted(features - _HARMLESS_FEATURES)) or "column mapping"
        raise LogError(f"its protocol (reader version {reader}: {named}) is not read by this reader")


def replay(
    checkpoint_adds: Iterable[tuple[str, dict[str, str | None]]],
    commits: Iterable[tuple[int, list[dict]]],
) -> dict[str, dict[str, str | None]]:
    """The version's files (path as the log has it -> partition values): a checkpoint's adds,
    then each commit's adds and removes, oldest first. A checkpoint's adds are its version's
    files (its removes are tombstones for vacuum); each protocol action is checked."""
    files = dict(checkpoint_adds)
    for _, actions in sorted(commits, key=lambda c: c[0]):
        for action in actions:
            if "add" in action:
                add = action["add"]
                files[add["path"]] = dict(add.get("partitionValues") or {})
            elif "remove" in action:
                files.pop(action["remove"]["path"], None)
            elif "protocol" in action:
                check_protocol(action["protocol"])
    return files


def data_path(root: str, path: str) -> str:
    """A data file's full path or URI: the log's ``path`` is a URI, relative to the table's root
    (percent-encoded) or absolute (with its scheme)."""
    if re.match(r"^[A-Za-z][A-Za-z0-9+.-]*:", path):
        return path
    return root.rstrip("/") + "/" + unquote(path)
