"""The archive writer process: chunks on standard input, Parquet files, reports on stdout.

I/O. A node that archives starts one (server/archive.py) with its own interpreter
and feeds it over a pipe (archive/wire.py), so that turning records into Arrow
columns and Parquet pages never competes with the node's event loop for the GIL
(measured with a writer thread inside the node: the event loop spent 30 % of its
time waiting for the GIL, and fanin QoS 0 lost a third of its throughput).

It ignores SIGINT and SIGTERM, which a terminal or a process manager may send to
the node's whole process group: it ends when its input ends, after writing
everything it received. That is also what happens when the node is killed with
``kill -9``: only the records still buffered inside the node are lost.
"""

from __future__ import annotations

import argparse
import logging
import os
import select
import signal
import sys
import time

from .recorder import ArchiveLimits
from .wire import FrameReader, WireError, encode_report
from .writer import FileWriter

log = logging.getLogger("mqttmesh.archive")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m mqttmesh.archive.worker",
                                description="archive writer of one node (started by the node)")
    p.add_argument("--dir", required=True)
    p.add_argument("--node", required=True)
    p.add_argument("--incarnation", type=int, required=True)
    p.add_argument("--generation", type=int, default=0, help="restarts of the writer during this run")
    p.add_argument("--compression", default="zstd")
    p.add_argument("--flush-interval", type=float, default=ArchiveLimits.flush_interval)
    p.add_argument("--flush-rows", type=int, default=ArchiveLimits.flush_rows)
    p.add_argument("--flush-bytes", type=int, default=ArchiveLimits.flush_bytes)
    p.add_argument("--nice", type=int, default=0, help="lower this process's CPU priority by this much")
    p.add_argument("--log-level", default="info")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if args.nice:
        try:
            os.nice(args.nice)  # the node and its clients first; a writer that falls behind drops
        except OSError:
            pass
    logging.basicConfig(level=getattr(logging, args.log_level.upper(), logging.INFO),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
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

    limits = ArchiveLimits(flush_interval=args.flush_interval, flush_rows=args.flush_rows,
                           flush_bytes=args.flush_bytes)
    incarnation = args.incarnation if not args.generation else f"{args.incarnation}.{args.generation}"
    writer = FileWriter(args.dir, args.node, incarnation, limits, args.compression, report)
    reader = FrameReader()
    fd = sys.stdin.buffer.fileno()
    status = 0
    while True:
        due = writer.next_due()
        timeout = None if due is None else max(0.0, due - time.monotonic())
        readable, _, _ = select.select([fd], [], [], timeout)
        now = time.monotonic()
        if readable:
            data = os.read(fd, 1 << 20)
            if not data:
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
    writer.close()
    if reader.buffered and not status:
        log.warning("archive writer: input ended inside a chunk (%d bytes): the node stopped while "
                    "sending it", reader.buffered)
    return status


if __name__ == "__main__":
    sys.exit(main())
