"""Where an idle client's bytes go (issue 26): a node under ``tracemalloc``, snapshots taken
after N and after 2N idle clients (bench.idle's), and the second N's bytes per client by
allocation site and by object type.

    python -m bench.idle_trace [--clients N] [--frames F] [--top K]

The node runs in a child process (``python -m bench.idle_trace --node ...``: the ordinary
broker of ``python -m mqttmesh broker``, uvloop included, with ``tracemalloc`` started
first); a thread of it takes a snapshot when the driver asks (a file in the work directory)
and counts the live objects the garbage collector tracks, by type, with their
``sys.getsizeof``. Tracing slows the node down and adds its own bytes to the RSS: the RSS
figures are bench.idle's, not this tool's. Every process it starts is ended by PID.
"""

from __future__ import annotations

import argparse
import collections
import gc
import linecache
import os
import pickle
import sys
import tempfile
import threading
import time
import tracemalloc
from pathlib import Path

from .brokers import REGISTRY, MqttmeshNodes
from .idle import close_clients, open_clients, steady_rss


def _types() -> dict[str, tuple[int, int]]:
    """Live gc-tracked objects by type: (count, bytes of sys.getsizeof)."""
    out: dict[str, list[int]] = collections.defaultdict(lambda: [0, 0])
    for o in gc.get_objects():
        t = type(o)
        entry = out[f"{t.__module__}.{t.__qualname__}"]
        entry[0] += 1
        entry[1] += sys.getsizeof(o)
    return {k: (v[0], v[1]) for k, v in out.items()}


def _who(names: str) -> dict[str, list[str]]:
    """For each type named (comma-separated qualnames), what refers to three of its objects."""
    out: dict[str, list[str]] = {}
    wanted = {n for n in names.split(",") if n}
    if not wanted:
        return out
    seen: dict[str, int] = collections.Counter()
    for o in gc.get_objects():
        name = type(o).__qualname__
        if name in wanted and seen[name] < 3:
            seen[name] += 1
            refs = [type(r).__qualname__ for r in gc.get_referrers(o)]
            out.setdefault(name, []).append(f"{o!r:.120} <- {refs}")
    return out


def _watch(work: Path) -> None:
    """In the node: for each request file ``snap-K``, a snapshot and a type count in
    ``snap-K.pickle``."""
    done: set[str] = set()
    while True:
        for req in sorted(work.glob("snap-*[0-9]")):
            if req.name in done:
                continue
            done.add(req.name)
            gc.collect()
            types = _types()
            who = _who(os.environ.get("IDLE_TRACE_WHO", ""))
            snap = tracemalloc.take_snapshot().filter_traces(
                [tracemalloc.Filter(False, tracemalloc.__file__), tracemalloc.Filter(False, __file__)]
            )
            tmp = work / f"{req.name}.tmp"
            tmp.write_bytes(pickle.dumps((snap, types, who)))
            tmp.rename(work / f"{req.name}.pickle")
            del snap, types, who  # (else the next count finds this snapshot's tuples alive)
        time.sleep(0.2)


def node_main(work: Path, frames: int, argv: list[str]) -> int:
    tracemalloc.start(frames)
    threading.Thread(target=_watch, args=(work,), daemon=True).start()
    from mqttmesh.cli import main

    return main(argv)


def _snapshot(work: Path, k: int, timeout: float = 120.0):
    (work / f"snap-{k}").touch()
    out = work / f"snap-{k}.pickle"
    deadline = time.monotonic() + timeout
    while not out.exists():
        if time.monotonic() > deadline:
            raise SystemExit("the node took no snapshot")
        time.sleep(0.2)
    return pickle.loads(out.read_bytes())


def _site(tb: tracemalloc.Traceback) -> str:
    lines = []
    for f in tb:  # (most recent first)
        src = linecache.getline(f.filename, f.lineno).strip()
        lines.append(f"{Path(f.filename).name}:{f.lineno} {src[:90]}")
    return "\n      ".join(lines)


class TracedNode(MqttmeshNodes):
    """bench.brokers' node, started through node_main."""

    def __init__(self, workdir: Path, frames: int):
        super().__init__(workdir)
        self.frames = frames

    def start(self):
        real = self.python
        # (the argv bench.brokers builds is ``python -m mqttmesh broker ...``)
        self.python = sys.executable
        try:
            import bench.brokers as b

            popen = b._popen

            def traced(argv, log_path, **kw):
                rest = argv[3:]  # after "python -m mqttmesh"
                argv = [
                    sys.executable,
                    "-m",
                    "bench.idle_trace",
                    "--node",
                    str(self.workdir),
                    "--frames",
                    str(self.frames),
                    "--",
                    *rest,
                ]
                return popen(argv, log_path, **kw)

            b._popen = traced
            try:
                return super().start()
            finally:
                b._popen = popen
        finally:
            self.python = real


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.idle_trace", description=__doc__.split("\n\n")[0])
    p.add_argument("--clients", type=int, default=2000, help="N: the snapshots are at N and 2N clients")
    p.add_argument("--frames", type=int, default=1, help="frames of each allocation's traceback")
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--node", help=argparse.SUPPRESS)
    p.add_argument("rest", nargs="*", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.node:
        return node_main(Path(args.node), args.frames, args.rest)
    n = args.clients
    with tempfile.TemporaryDirectory(prefix="bench-idle-trace-") as tmp:
        work = Path(tmp)
        server = TracedNode(work, args.frames)
        try:
            target = server.start()
            pid = target.pids[0]
            port = target.nodes[0].port
            steady_rss(pid)
            first, failed1, _ = open_clients(port, n, 500, 120.0)
            time.sleep(1.0)
            snap1, types1, _ = _snapshot(work, 1)
            second, failed2, _ = _open_more(port, n)
            time.sleep(1.0)
            snap2, types2, who = _snapshot(work, 2)
            close_clients(first + second)
        finally:
            server.stop()
            REGISTRY.kill_all()
    if failed1 or failed2:
        print(f"failed clients: {failed1} + {failed2}")
    grouped = "traceback" if args.frames > 1 else "lineno"
    stats = snap2.compare_to(snap1, grouped)
    total = sum(s.size_diff for s in stats)
    print(f"traced bytes per client (the second {n:,}): {total / n:,.1f}\n")
    print("by allocation site, bytes per client (count per client):")
    for s in stats[: args.top]:
        if abs(s.size_diff) < n:  # (under a byte a client)
            continue
        print(f"  {s.size_diff / n:8.1f} B ({s.count_diff / n:5.2f})  {_site(s.traceback)}")
    print("\nlive gc-tracked objects by type, per client (sys.getsizeof):")
    rows = []
    for k, (c2, b2) in types2.items():
        c1, b1 = types1.get(k, (0, 0))
        if c2 - c1 >= n // 2:
            rows.append(((b2 - b1) / n, (c2 - c1) / n, k))
    for size, count, k in sorted(rows, reverse=True):
        print(f"  {size:8.1f} B ({count:5.2f})  {k}")
    for name, lines in who.items():
        print(f"\nwhat refers to a {name}:")
        for line in lines:
            print(f"  {line}")
    return 0


def _open_more(port: int, n: int):
    """N more clients, with ClientIds and filters of their own (after the first N's)."""
    import bench.idle as idle

    real = idle.connect, idle.subscribe

    def connect(client_id, **kw):
        return real[0](client_id.replace("idle-", "idle-b"), **kw)

    def subscribe(pid, filters):
        return real[1](pid, [(f.replace("idle/", "idle/b"), q) for f, q in filters])

    idle.connect, idle.subscribe = connect, subscribe
    try:
        return open_clients(port, n, 500, 120.0)
    finally:
        idle.connect, idle.subscribe = real


if __name__ == "__main__":
    os.environ.setdefault("PYTHONDONTWRITEBYTECODE", "1")
    sys.exit(main())
