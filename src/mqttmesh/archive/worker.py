"""The archive writer process: chunks on standard input, Parquet files, reports on stdout.

I/O. A node that archives starts one (server/archive.py) with its own interpreter
and feeds it over a pipe (archive/wire.py), so that turning records into Arrow
columns and Parquet pages never competes with the node's event loop for the GIL
(measured with a writer thread inside the node: the event loop spent 30 % of its
time waiting for the GIL, and fanin QoS 0 lost a third of its throughput).

It runs at idle CPU priority (SCHED_IDLE, Linux) while it keeps up: it then only uses
CPU time nothing else wants, and never takes the node's core from it when the node wakes
it with a chunk (measured in the benchmark harness on two cores: fan-in QoS 0 lost 5 %
of its throughput to the archive at idle priority, 11 % at nice 10). Once it falls
behind (its pipe more than half full after it handled what it had read) it goes back to
normal scheduling at ``--nice``, and to idle priority again when it has emptied the pipe:
on a machine with no idle CPU it competes for its share instead of letting records pile
up until the node drops them. When its input ends (the node is stopping and waits for
the files) it stays at normal priority. While other processes keep every core busy and
the node is quiet, an idle writer gets almost no CPU and a file can appear later than
the flush interval; ``archive.writer_idle = false`` trades that for the node's speed.

It ignores SIGINT and SIGTERM, which a terminal or a process manager may send to
the node's whole process group: it ends when its input ends, after writing
everything it received. That is also what happens when the node is killed with
``kill -9``: only the records still buffered inside the node are lost.
"""

from __future__ import annotations

import argparse
import array
import datetime as dt
import logging
import os
import select
import signal
import sys
import threading
import time

try:
    import fcntl
    import termios
except ImportError:  # not a Unix: no pipe sizes, no idle priority
    fcntl = termios = None  # type: ignore[assignment]

from .recorder import ArchiveLimits
from .schema import KINDS
from .wire import FrameReader, WireError, encode_report
from .writer import FileWriter

log = logging.getLogger("mqttmesh.archive")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m mqttmesh.archive.worker", description="archive writer of one node (started by the node)"
    )
    p.add_argument("--dir", required=True)
    p.add_argument("--node", required=True)
    p.add_argument("--incarnation", type=int, required=True)
    p.add_argument("--generation", type=int, default=0, help="restarts of the writer during this run")
    p.add_argument("--compression", default="zstd")
    p.add_argument("--format", default="parquet", choices=("parquet", "delta"))
    p.add_argument(
        "--compact-interval", type=float, default=3600.0, help="delta: seconds between compactions (0: none)"
    )
    p.add_argument("--compact-target-bytes", type=int, default=128 << 20)
    p.add_argument("--retention", type=float, default=0.0, help="delta: seconds of rows kept (0: all)")
    p.add_argument("--vacuum-retention", type=float, default=3600.0)
    p.add_argument("--flush-interval", type=float, default=ArchiveLimits.flush_interval)
    p.add_argument("--flush-rows", type=int, default=ArchiveLimits.flush_rows)
    p.add_argument("--flush-bytes", type=int, default=ArchiveLimits.flush_bytes)
    p.add_argument("--nice", type=int, default=0, help="lower this process's CPU priority by this much")
    p.add_argument(
        "--idle", type=int, default=0, choices=(0, 1), help="1: idle CPU priority while the writer keeps up (Linux)"
    )
    p.add_argument("--log-level", default="info")
    return p.parse_args(argv)


def _threads() -> list[int]:
    """This process's threads but the calling one (Linux; none elsewhere)."""
    me = threading.get_native_id()
    try:
        return [t for t in map(int, os.listdir("/proc/self/task")) if t != me]
    except OSError:
        return []


def _nice_all(increment: int) -> None:
    """``os.nice`` for every thread of the process (it changes the calling thread's alone)."""
    try:
        os.nice(increment)
    except OSError:
        return
    value = os.getpriority(os.PRIO_PROCESS, 0)
    for tid in _threads():
        try:
            os.setpriority(os.PRIO_PROCESS, tid, value)
        except OSError:
            pass


class Priority:
    """Idle CPU priority while the pipe does not back up, normal (at the nice value) while it does."""

    def __init__(self, fd: int, enabled: bool):
        self.fd = fd
        self.enabled = enabled and hasattr(os, "SCHED_IDLE") and fcntl is not None
        self.idle = False
        try:
            size = fcntl.fcntl(fd, getattr(fcntl, "F_GETPIPE_SZ", 1032)) if self.enabled else 65536
        except OSError:
            size = 65536
        self.behind = size // 2  # bytes waiting in the pipe that mean the writer is behind
        if self.enabled:
            self._set(True)

    def check(self) -> None:
        """After handling what was read: switch if the backlog says so."""
        if not self.enabled:
            return
        backlog = self.backlog()
        if self.idle and backlog >= self.behind:
            self._set(False)
        elif not self.idle and backlog == 0:
            self._set(True)

    def normal(self) -> None:
        if self.enabled and self.idle:
            self._set(False)

    def backlog(self) -> int:
        """Bytes waiting in the pipe."""
        n = array.array("i", [0])
        try:
            fcntl.ioctl(self.fd, termios.FIONREAD, n)
        except OSError:
            return 0
        return n[0]

    def _set(self, idle: bool) -> None:
        try:
            policy = os.SCHED_IDLE if idle else os.SCHED_OTHER
            os.sched_setscheduler(0, policy, os.sched_param(0))
            # (Linux schedules threads, not processes: the threads the libraries started, pyarrow's
            # and delta-rs's, keep what they had when they were made unless told too; measured: a
            # delta-rs writer whose other threads ran at normal priority cost fan-in QoS 0 a
            # quarter of its throughput)
            for tid in _threads():
                try:
                    os.sched_setscheduler(tid, policy, os.sched_param(0))
                except OSError:  # (a thread that just ended)
                    pass
        except OSError as exc:  # not allowed here (a container, a seccomp profile): stay as we are
            log.warning("archive writer: cannot change its CPU scheduling: %s", exc)
            self.enabled = False
            return
        self.idle = idle


class Upkeep:
    """Compaction and expiry of the Delta tables (archive.format = delta), every
    ``--compact-interval`` seconds, in a thread of their own: delta-rs does the work outside
    the GIL, and the appends go on meanwhile (a blind append never conflicts with a rewrite).
    The first one runs one interval after the start."""

    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.interval = args.compact_interval or 3600.0  # (expiry alone: hourly)
        self.due = time.monotonic() + self.interval
        self.thread: threading.Thread | None = None

    def check(self, now: float) -> None:
        if now < self.due or (self.thread is not None and self.thread.is_alive()):
            return
        self.due = now + self.interval
        self.thread = threading.Thread(target=self.run, name="archive-upkeep", daemon=True)
        self.thread.start()

    def run(self) -> None:
        from .table import TableError, compact, expire, is_table

        a = self.args
        for kind in KINDS:
            path = os.path.join(a.dir, kind)
            if not is_table(path):
                continue
            try:
                if a.retention:
                    cutoff = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=a.retention)
                    e = expire(path, cutoff, a.vacuum_retention / 3600.0)
                    if e.rows_removed or e.files_vacuumed:
                        log.info(
                            "archive: %s: %d rows before %s removed, %d files deleted",
                            path,
                            e.rows_removed,
                            f"{cutoff:%Y-%m-%dT%H:00Z}",
                            e.files_vacuumed,
                        )
                if a.compact_interval:
                    c = compact(path, a.compact_target_bytes, None if a.compression == "none" else a.compression)
                    if c.files_removed:
                        log.info("archive: %s: %d files compacted into %d", path, c.files_removed, c.files_added)
            except TableError as exc:  # (a race lost for good, a full disk: the next round tries again)
                log.warning("archive: upkeep of %s: %s", path, exc)

    def join(self) -> None:
        if self.thread is not None:
            self.thread.join()


def main(argv=None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if args.nice:
        _nice_all(args.nice)  # the node and its clients first; a writer that falls behind drops
    logging.basicConfig(
        level=getattr(logging, args.log_level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    out = sys.stdout.buffer
    node_gone = False

    def report(*values) -> None:
        nonlocal node_gone
        if node_gone:
            return
        try:
            out.write(encode_report(*values))
            out.flush()
        except OSError:  # the node is gone; the files still get written
            node_gone = True

    limits = ArchiveLimits(flush_interval=args.flush_interval, flush_rows=args.flush_rows, flush_bytes=args.flush_bytes)
    incarnation = args.incarnation if not args.generation else f"{args.incarnation}.{args.generation}"
    writer = FileWriter(args.dir, args.node, incarnation, limits, args.compression, report, args.format)
    upkeep = Upkeep(args) if args.format == "delta" and (args.compact_interval or args.retention) else None
    reader = FrameReader()
    fd = sys.stdin.buffer.fileno()
    priority = Priority(fd, bool(args.idle))
    status = 0
    while True:
        due = writer.next_due()
        timeout = None if due is None else max(0.0, due - time.monotonic())
        readable, _, _ = select.select([fd], [], [], timeout)
        now = time.monotonic()
        if readable:
            data = os.read(fd, 1 << 20)
            if not data:
                priority.normal()  # the node is stopping and waits for the files: no more idling
                break
            reader.feed(data)
            try:
                for chunk in reader.chunks():
                    writer.add(chunk, now)
            except WireError as exc:
                log.error("archive writer: %s; stopping", exc)
                status = 1
                break
        writer.write_due(now)
        if upkeep is not None:
            upkeep.check(now)
        priority.check()
    writer.close()
    if upkeep is not None:
        upkeep.join()
    if reader.buffered and not status:
        log.warning(
            "archive writer: input ended inside a chunk (%d bytes): the node stopped while sending it", reader.buffered
        )
    return status


if __name__ == "__main__":
    sys.exit(main())
