"""What the mesh hop and persistent sessions cost per delivered message (issue 26).

    python -m bench.mesh_cost [--rounds 3] [--groups paced,saturation,persistent,mesh7] [--duration 3]
                              [--out bench/results/mesh_cost.json] [--md]

Every cell is one run of the load generator (``bench.loadgen.run_once``) against freshly
started brokers; rounds go through the cells in turn (forwards, then backwards), and the
table gives each cell's medians over the rounds. CPU per delivered message is the CPU of
every broker process of the cell (both nodes of a mesh, all seven of the 7-node one) from
"go" to the end of the drain, over the messages the subscribers received; "cores" is that
CPU over the same time. The groups:

* ``paced``: 4 publishers -> 1 subscriber on ``bench/#``, paced at 1,000 and 10,000 msgs/s,
  QoS 0, 1 and 2, and at 100 msgs/s, QoS 1 (sparse messages: what one waits for on a hop),
  clean sessions: one mqttmesh node (``same``), two peered nodes with the publishers on the
  first and the subscriber on the second (``cross``), Mosquitto's one node;
* ``persistent``: the same at 2,000 msgs/s, QoS 1 and 2, with CleanSession=1 and with
  CleanSession=0 for every client: on two nodes (subscriber on the second), on one, and
  Mosquitto; the mqttmesh nodes have a data directory (the durable store a persistent
  session is kept in); ``cross-mem`` is the two nodes in memory (QoS 1 only);
* ``saturation``: 4 publishers -> 1 subscriber as fast as the broker takes
  them (each publisher at most 500 messages ahead of the subscriber, as ``make bench``'s
  fan-in), QoS 0, 1 and 2, ``same``, ``cross`` and Mosquitto;
* ``mesh7``: 7 nodes in a full mesh, each with a data directory; 6 persistent publishers
  (publisher i on node i) at 120 msgs/s in all, 6 persistent subscribers (subscriber j on
  node j + 1) each taking every message (``bench/fanout``): about 720 deliveries a second,
  QoS 1 and 2; the same clients on Mosquitto's one node; and an idle 7-node mesh's CPU
  (``--idle`` seconds, no client).

``--md`` writes the "Mesh cost" section of BENCHMARKS.md (between its ``BEGIN kept`` markers,
so a later ``make bench`` keeps it). Every process started is ended by PID, also on Ctrl-C.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import os
import shlex
import shutil
import signal
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from . import profiles
from .brokers import REGISTRY, BrokerError, BrokerServer, Mosquitto, MqttmeshNodes, Target, cpu_seconds
from .loadgen import RunError, RunOptions, run_once
from .workloads import Workload

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"
SECRET = "bench-cost"
GROUPS = ("paced", "saturation", "persistent", "mesh7")
MD_BEGIN = "<!-- BEGIN kept: bench/mesh_cost.py writes this section -->"
MD_END = "<!-- END kept -->"


# 4 publishers -> 1 subscriber as fast as the broker takes them, each publisher at most 500
# messages ahead of the subscriber (make bench's fan-in): the cross-node cost at saturation
SATURATED = Workload("fanin-max", "fanin", 4, 1, (0, 1, 2), rate=None, pub_procs=2, sub_procs=1)


def paced(rate: float, persistent: bool = False) -> Workload:
    """4 publishers -> 1 subscriber on bench/#, ``rate`` msgs/s in all."""
    return Workload(
        f"fanin-{rate / 1000:g}k" + ("-persistent" if persistent else ""),
        "fanin",
        4,
        1,
        (0, 1, 2),
        rate=rate,
        pub_procs=2,
        sub_procs=1,
        persistent=persistent,
    )


# 6 publishers, 6 subscribers each taking every message: bench/fanout for all
SPREAD7 = Workload(
    "spread7",
    "fanout",
    6,
    6,
    (1, 2),
    rate=120.0,
    inflight=20,
    e2e_window=500,
    pub_procs=1,
    sub_procs=1,
    persistent=True,
)


@dataclass(frozen=True)
class Cell:
    group: str
    broker: str  # same, cross, cross-mem, mesh7, mosquitto
    workload: Workload
    qos: int
    store: bool = False  # mqttmesh nodes with a data directory
    duration: float | None = None  # the window, if not --duration

    @property
    def key(self) -> str:
        return f"{self.group}/{self.workload.name}/q{self.qos}/{self.broker}"


def cells_of(groups: list[str]) -> list[Cell]:
    out: list[Cell] = []
    if "paced" in groups:
        # (an A/B of the cells at 100 and 1,000 msgs/s wants --duration 10: with 3 s, rounds of
        # one tree differed by up to 40 %, docs/performance.md section 2, "The delay's default")
        for b in ("same", "cross", "mosquitto"):  # sparse: what a message waits for on a quiet link
            out.append(Cell("paced", b, paced(100.0), 1))
        for rate in (1000.0, 10_000.0):
            for q in (0, 1, 2):
                for b in ("same", "cross", "mosquitto"):
                    out.append(Cell("paced", b, paced(rate), q))
    if "saturation" in groups:
        for q in (0, 1, 2):
            for b in ("same", "cross", "mosquitto"):
                out.append(Cell("saturation", b, SATURATED, q))
    if "persistent" in groups:
        for q in (1, 2):
            for persistent in (False, True):
                for b in ("cross", "same", "mosquitto"):
                    out.append(Cell("persistent", b, paced(2000.0, persistent), q, store=True))
            out += [Cell("persistent", "cross-mem", paced(2000.0, p), q) for p in (False, True) if q == 1]
    if "mesh7" in groups:
        for q in (1, 2):
            out.append(Cell("mesh7", "mesh7", SPREAD7, q, store=True, duration=10.0))
            out.append(Cell("mesh7", "mosquitto", SPREAD7, q, duration=10.0))
    return out


def mesh_args(count: int, data: Path | None, node_args: list[str] = []) -> list[list[str]]:  # noqa: B006 (read only)
    """Node 0 alone, every other node dialling it: with ``--connect all`` (the default) the
    nodes learn each other from advertisements and make a full mesh. ``node_args``: more
    flags for every node (``--node-args``)."""
    out = []
    for i in range(count):
        args = ["--cluster-secret", SECRET, "--node-id", f"n{i}", *node_args]
        if i:
            args += ["--peer", "{host}:{ports[0]}"]
        if data is not None:
            (data / f"n{i}").mkdir(parents=True, exist_ok=True)
            args += ["--data-dir", str(data / f"n{i}")]
        out.append(args)
    return out


def server_for(cell_broker: str, store: bool, workdir: Path, node_args: list[str]) -> BrokerServer:
    data = workdir / "data" if store else None
    if cell_broker == "mosquitto":
        return Mosquitto(workdir)
    if cell_broker == "same":
        if data is None:
            return MqttmeshNodes(workdir, count=1, extra_args=[node_args])
        (data / "n0").mkdir(parents=True, exist_ok=True)
        return MqttmeshNodes(workdir, count=1, extra_args=[["--data-dir", str(data / "n0"), *node_args]])
    if cell_broker in ("cross", "cross-mem"):
        return MqttmeshNodes(workdir, count=2, extra_args=mesh_args(2, data, node_args))
    if cell_broker == "mesh7":
        return MqttmeshNodes(workdir, count=7, extra_args=mesh_args(7, data, node_args))
    raise ValueError(cell_broker)


def wait_meshed(target: Target, timeout: float = 30.0) -> float:
    """Until every node of ``target`` has every other as a neighbour; the seconds it took."""
    from mqttmesh.admin import fetch_status

    t0 = time.monotonic()
    want = len(target.nodes) - 1
    pending = list(target.nodes)
    while pending:
        ep = pending[0]
        try:
            if len(fetch_status(ep.host, ep.port, 2.0)["neighbours"]) >= want:
                pending.pop(0)
                continue
        except (OSError, ValueError, KeyError):
            pass
        if time.monotonic() - t0 > timeout:
            raise BrokerError(f"mesh of {len(target.nodes)} not formed in {timeout:g} s")
        time.sleep(0.2)
    return time.monotonic() - t0


LINK_COUNTERS = ("envelopes_out", "batches_out", "control_out", "control_bytes_out")


def link_counters(target: Target) -> dict[str, int]:
    """Every node's peer-link counters ($SYS/mesh/status), added up over nodes and links."""
    from mqttmesh.admin import fetch_status

    out = dict.fromkeys(LINK_COUNTERS, 0)
    if len(target.nodes) < 2:
        return out
    for ep in target.nodes:
        for n in fetch_status(ep.host, ep.port, 5.0)["neighbours"].values():
            for k in LINK_COUNTERS:
                out[k] += n.get(k) or 0
    return out


def spread(target: Target) -> None:
    """Publisher i on node i, subscriber j on node j + 1 (7 nodes: 6 of each)."""
    target.pub_endpoints = list(target.nodes[:-1])
    target.sub_endpoints = list(target.nodes[1:])


@dataclass
class Recording:
    """What to record of the nodes while a cell runs: py-spy stacks (``profile``: into this
    directory) or strace counts for ``strace`` seconds (into ``out``)."""

    out: Path
    profile: bool = False
    strace: float = 0.0
    perf: bool = False
    links: bool = False  # count what the peer links carried per delivery (no recorder)


def deliveries_per_s(w: Workload) -> float:
    return (w.rate or 0.0) * sum(len(w.receivers(i)) for i in range(w.n_pubs)) / w.n_pubs


def run_cell(
    cell: Cell,
    opts: RunOptions,
    run_id: int,
    workdir: Path,
    rec: Recording | None = None,
    node_args: list[str] = [],  # noqa: B006
) -> dict:
    if workdir.exists():
        shutil.rmtree(workdir)
    workdir.mkdir(parents=True)
    server = server_for(cell.broker, cell.store, workdir, node_args)
    try:
        target = server.start()
        if len(target.nodes) > 1:
            wait_meshed(target)
        if cell.broker == "mesh7":
            spread(target)
        o = dataclasses.replace(opts, duration=cell.duration or opts.duration)
        recorders = []
        if rec is not None and cell.broker != "mosquitto" and not rec.links:
            # from about the start of the window (the clients connect and settle first)
            delay = o.settle + 1.0 + o.warmup
            label = f"{cell.key.replace('/', '-')}-{run_id}"
            if rec.perf:
                recorders = profiles.start_perf(target.pids, delay, o.duration, rec.out, label)
            elif rec.profile:
                recorders = profiles.start_pyspy(target.pids, delay, o.duration, rec.out, label)
            elif rec.strace:
                recorders = profiles.start_strace(target.pids, delay, rec.strace, rec.out, label)
        links0 = link_counters(target) if rec is not None and rec.links else None
        node0 = [cpu_seconds(pid) for pid in target.pids]
        try:
            res = run_once(target, cell.workload, cell.qos, o, run_id)
        except RunError as exc:
            res = {"ok": False, "error": str(exc)}
        finally:
            profiles.finish(recorders)
        node1 = [cpu_seconds(pid) for pid in target.pids]
        if res.get("ok") and res.get("elapsed_s"):
            # each node's share (publishers' node first): which one a cell's cost sits on
            took = res["elapsed_s"]
            spans = zip(node0, node1, strict=True)
            res["node_cores"] = [None if a is None or b is None else round((b - a) / took, 3) for a, b in spans]
        if links0 is not None and res.get("ok") and res.get("received"):
            time.sleep(1.2)  # (a node publishes its status every second: the counts after the run)
            links1 = link_counters(target)
            res["links_per_delivery"] = {k: (links1[k] - links0[k]) / res["received"] for k in links0}
        res["alive_after"] = server.alive()
        problems = server.log_problems(5)
        if problems:
            res["log_problems"] = problems
        return res
    finally:
        server.stop()


def idle_mesh(count: int, seconds: float, workdir: Path, node_args: list[str] = []) -> dict:  # noqa: B006
    """The CPU of ``count`` meshed nodes with no client, over ``seconds`` once meshed."""
    if workdir.exists():
        shutil.rmtree(workdir)
    workdir.mkdir(parents=True)
    server = MqttmeshNodes(workdir, count=count, extra_args=mesh_args(count, workdir / "data", node_args))
    try:
        target = server.start()
        formed = wait_meshed(target)
        time.sleep(2.0)  # the first advertisements and status rounds settle
        c0, t0 = target.cpu_seconds(), time.monotonic()
        time.sleep(seconds)
        c1, t1 = target.cpu_seconds(), time.monotonic()
        if c0 is None or c1 is None:
            return {"ok": False, "error": "a node exited"}
        return {"ok": True, "cores": (c1 - c0) / (t1 - t0), "meshed_after_s": formed}
    finally:
        server.stop()


# --------------------------------------------------------------------------- summary


def _med(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def summarize(runs: list[dict]) -> dict:
    ok = [r for r in runs if r.get("ok")]
    out: dict = {"runs": len(runs), "ok": len(ok), "lost": sum(r.get("lost", 0) for r in ok)}
    for m in ("delivered_per_s", "delivered_fraction", "p50_ms", "p99_ms", "broker_cpu_us_per_msg", "broker_cpu_util"):
        out[m] = _med(r.get(m) for r in ok)
    out["errors"] = sorted({e for r in runs for e in ([r["error"]] if r.get("error") else []) + r.get("errors", [])})[
        :5
    ]
    return out


@dataclass
class Results:
    meta: dict
    cells: dict[str, dict] = field(default_factory=dict)  # key -> {"cell": ..., "runs": [...]}
    idle: list[dict] = field(default_factory=list)

    def add(self, cell: Cell, res: dict) -> None:
        entry = self.cells.setdefault(
            cell.key,
            {
                "group": cell.group,
                "broker": cell.broker,
                "workload": cell.workload.name,
                "rate": cell.workload.rate,
                "persistent": cell.workload.persistent,
                "qos": cell.qos,
                "store": cell.store,
                "runs": [],
            },
        )
        entry["runs"].append(res)
        entry["summary"] = summarize(entry["runs"])

    def get(self, group: str, broker: str, workload: str, qos: int) -> dict | None:
        e = self.cells.get(f"{group}/{workload}/q{qos}/{broker}")
        return e["summary"] if e else None

    def to_json(self) -> dict:
        return {"meta": self.meta, "cells": self.cells, "idle": self.idle}


def _f(v, spec: str = ",.0f") -> str:
    return "-" if v is None else format(v, spec)


def _ratio(a, b) -> str:
    return "-" if a is None or not b else f"{a / b:.2f}x"


def _lat(s: dict | None) -> str:
    if not s:
        return "-"
    return f"{_f(s['p50_ms'], '.2f')} / {_f(s['p99_ms'], '.2f')}"


def _cpu(s: dict | None) -> str:
    return "-" if not s else _f(s["broker_cpu_us_per_msg"], ".1f")


def _frac(s: dict | None) -> str:
    if not s or s["delivered_fraction"] is None:
        return "-"
    return f"{s['delivered_fraction'] * 100:.1f} %"


def _rate(s: dict | None) -> str:
    return "-" if not s else _f(s["delivered_per_s"])


def _cores(s: dict | None) -> str:
    return "-" if not s else _f(s["broker_cpu_util"], ".2f")


def tables(r: Results) -> str:
    lines: list[str] = []
    if any(e["group"] in ("paced", "saturation") for e in r.cells.values()):
        lines += [
            "CPU µs per delivered message, every node crossed summed; p50 / p99 latency in ms; "
            "clean sessions, 4 publishers -> 1 subscriber.",
            "",
            "| rate | QoS | same node | cross-node | cross / same | Mosquitto | same p50/p99 | cross p50/p99 "
            "| Mosquitto p50/p99 | delivered msgs/s same / cross / Mosquitto | delivered |",
            "|---:|---:|---:|---:|---:|---:|---|---|---|---|---|",
        ]
        rows = [("paced", paced(rate).name, f"{rate:,.0f}") for rate in (100.0, 1000.0, 10_000.0)]
        rows.append(("saturation", SATURATED.name, "as taken"))
        for group, w, label in rows:
            for q in (0, 1, 2):
                s, c, m = (r.get(group, b, w, q) for b in ("same", "cross", "mosquitto"))
                if not (s or c or m):
                    continue
                lines.append(
                    f"| {label} | {q} | {_cpu(s)} | {_cpu(c)} | "
                    f"{_ratio(c and c['broker_cpu_us_per_msg'], s and s['broker_cpu_us_per_msg'])} | {_cpu(m)} | "
                    f"{_lat(s)} | {_lat(c)} | {_lat(m)} | {_rate(s)} / {_rate(c)} / {_rate(m)} | "
                    f"{_frac(s)} / {_frac(c)} / {_frac(m)} |"
                )
        lines.append("")
    if any(e["group"] == "persistent" for e in r.cells.values()):
        lines += [
            "Paced 2,000 msgs/s, 4 publishers -> 1 subscriber; `cross`: subscriber on the second of two "
            "nodes, each with a data directory; `cross-mem`: the same nodes in memory; CPU µs per "
            "delivered message (cores used).",
            "",
            "| QoS | broker | clean | persistent | persistent / clean | clean p50/p99 | persistent p50/p99 "
            "| delivered msgs/s clean / persistent | delivered |",
            "|---:|---|---:|---:|---:|---|---|---|---|",
        ]
        wc, wp = paced(2000.0).name, paced(2000.0, True).name
        for q in (1, 2):
            for b in ("same", "cross", "cross-mem", "mosquitto"):
                c, p = r.get("persistent", b, wc, q), r.get("persistent", b, wp, q)
                if not (c or p):
                    continue
                lines.append(
                    f"| {q} | {b} | {_cpu(c)} ({_cores(c)}) | {_cpu(p)} ({_cores(p)}) | "
                    f"{_ratio(p and p['broker_cpu_us_per_msg'], c and c['broker_cpu_us_per_msg'])} | "
                    f"{_lat(c)} | {_lat(p)} | {_rate(c)} / {_rate(p)} | {_frac(c)} / {_frac(p)} |"
                )
            cross_c = r.get("persistent", "cross", wc, q)
            same_c = r.get("persistent", "same", wc, q)
            cross_p = r.get("persistent", "cross", wp, q)
            if cross_p and same_c and cross_c:
                lines.append(
                    f"| {q} | cross persistent / same clean | | | "
                    f"{_ratio(cross_p['broker_cpu_us_per_msg'], same_c['broker_cpu_us_per_msg'])} | | | | |"
                )
        lines.append("")
    if any(e["group"] == "mesh7" for e in r.cells.values()) or r.idle:
        lines += [
            "7 nodes, 6 persistent publishers (120 msgs/s in all), 6 persistent subscribers each taking "
            "every message; Mosquitto: the same clients on its one node.",
            "",
            "| QoS | broker | cores | CPU µs per delivery | deliveries/s | delivered | p50 / p99 ms |",
            "|---:|---|---:|---:|---:|---|---|",
        ]
        for q in (1, 2):
            for b in ("mesh7", "mosquitto"):
                s = r.get("mesh7", b, SPREAD7.name, q)
                if s:
                    lines.append(
                        f"| {q} | {'mqttmesh, 7 nodes' if b == 'mesh7' else b} | {_cores(s)} | {_cpu(s)} | "
                        f"{_rate(s)} | {_frac(s)} | {_lat(s)} |"
                    )
        idle = _med(x.get("cores") for x in r.idle if x.get("ok"))
        if idle is not None:
            lines.append(f"| - | mqttmesh, 7 nodes, idle | {idle:.3f} | | | | |")
        lines.append("")
    return "\n".join(lines)


def markdown(r: Results) -> str:
    m = r.meta
    return "\n".join(
        [
            MD_BEGIN,
            "### Mesh cost (`python -m bench.mesh_cost`, issue 26)",
            "",
            f"*Written by `{m['command']}` on {m['date']}: medians of {m['rounds']} alternating round(s), "
            f"{m['duration']:g} s windows (10 s for the 7-node cells) after {m['warmup']:g} s of warm-up; "
            f"64-byte payloads, loopback. Load average before / after: {m['load_before']} / {m['load_after']} "
            f"(2 cores; the benchmark's own processes count in them).*",
            "",
            "`make bench-mesh` runs this and the next section; the profiles behind them, the "
            "commands and the levers they point at: docs/performance.md, section 2.",
            "",
            tables(r),
            MD_END,
        ]
    )


def write_markdown(path: Path, section: str, begin: str = MD_BEGIN) -> None:
    """Put ``section`` (which starts with ``begin``) in ``path`` in place of an earlier one,
    else before "## Method"."""
    text = path.read_text()
    at = text.find(begin)
    if at >= 0:
        end = text.find(MD_END, at) + len(MD_END)
        text = text[:at] + section + text[end:]
    else:
        at = text.find("\n## Method")
        at = len(text) if at < 0 else at + 1
        text = text[:at] + section + "\n\n" + text[at:]
    path.write_text(text)


# --------------------------------------------------------------------------- main


def _interrupt(signum, frame):
    raise KeyboardInterrupt(signal.Signals(signum).name)


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.mesh_cost", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument(
        "--groups",
        default=",".join(GROUPS),
        help=f"comma list of {','.join(GROUPS)}",
    )
    p.add_argument("--qos", default="0,1,2", help="only the cells of these QoS levels")
    p.add_argument("--brokers", default="", help="only these cell brokers (same,cross,cross-mem,mesh7,mosquitto)")
    p.add_argument("--warmup", type=float, default=0.5)
    p.add_argument("--duration", type=float, default=3.0, help="the measured window (the 7-node cells: 10 s)")
    p.add_argument("--idle", type=float, default=10.0, help="seconds an idle 7-node mesh is measured (0: not)")
    p.add_argument("--drain-timeout", type=float, default=10.0)
    p.add_argument("--out", type=Path, default=RESULTS / "mesh_cost.json")
    p.add_argument("--md", action="store_true", help="write the Mesh cost section of BENCHMARKS.md")
    p.add_argument("--logs", type=Path, default=None, help="broker logs and data (default: a temporary directory)")
    p.add_argument(
        "--render",
        type=Path,
        nargs="+",
        default=None,
        metavar="JSON",
        help="run nothing: the tables (and --md) of results files (their cells together; a cell in "
        "several: the last file's)",
    )
    p.add_argument("--cells", default="", help="only these cells, by key (as printed: GROUP/WORKLOAD/qQ/BROKER)")
    p.add_argument(
        "--profile",
        type=Path,
        default=None,
        metavar="DIR",
        help="py-spy every mqttmesh node through each window (collapsed stacks into DIR, a summary printed); "
        "the figures of such a run are not the benchmark's",
    )
    p.add_argument(
        "--links",
        action="store_true",
        help="count what the peer links carried per delivery (every node's $SYS/mesh/status before and after)",
    )
    p.add_argument(
        "--perf",
        action="store_true",
        help="perf record (on-CPU, kernel included) every mqttmesh node through each window, into --profile DIR",
    )
    p.add_argument(
        "--strace",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="strace -c -f every mqttmesh node for SECONDS of each window (into --profile DIR or "
        "bench/results/strace): system calls per delivery",
    )
    p.add_argument(
        "--node-args",
        default="",
        metavar="FLAGS",
        help='more flags for every mqttmesh node, e.g. "--mesh-batch-delay 0.002" (shell words)',
    )
    args = p.parse_args(argv)
    node_args = shlex.split(args.node_args)
    groups = [g for g in args.groups.split(",") if g]
    if any(g not in GROUPS for g in groups) or args.rounds < 1:
        p.error("bad --groups or --rounds")
    qos = {int(q) for q in args.qos.split(",") if q}
    brokers = {b for b in args.brokers.split(",") if b}
    only = {k for k in args.cells.split(",") if k}
    cells = [
        c
        for c in cells_of(groups)
        if c.qos in qos and (not brokers or c.broker in brokers) and (not only or c.key in only)
    ]
    rec = None
    if args.profile or args.strace or args.links:
        rec = Recording(args.profile or RESULTS / "strace", profile=args.profile is not None and not args.strace)
        rec.strace = args.strace
        rec.perf = args.perf
        rec.links = args.links
    if args.render:
        files = [json.loads(path.read_text()) for path in args.render]
        results = Results(dict(files[0]["meta"]), {}, [])
        for saved in files:
            results.cells.update(saved["cells"])
            results.idle += saved["idle"]
        results.meta["command"] = "` and `".join(saved["meta"]["command"] for saved in files)
        results.meta["date"] = ", ".join(saved["meta"]["date"] for saved in files)
        results.meta["load_after"] = files[-1]["meta"].get("load_after", "?")
        print(tables(results))
        if args.md:
            write_markdown(REPO / "BENCHMARKS.md", markdown(results))
            print("wrote the Mesh cost section of BENCHMARKS.md")
        return 0
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _interrupt)
    logs = args.logs or Path(tempfile.mkdtemp(prefix="mqttmesh-cost-"))
    opts = RunOptions(warmup=args.warmup, duration=args.duration, drain_timeout=args.drain_timeout, settle=1.0)
    command = " ".join(["python -m bench.mesh_cost", *(argv if argv is not None else sys.argv[1:])])
    results = Results(
        {
            "command": command,
            "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "rounds": args.rounds,
            "warmup": args.warmup,
            "duration": args.duration,
            "load_before": _load(),
        }
    )
    do_idle = "mesh7" in groups and args.idle > 0 and (not brokers or "mesh7" in brokers) and not only
    print(f"mesh cost: {len(cells)} cells x {args.rounds} rounds; load average {_load()}", flush=True)
    run_id = int(time.time()) & 0x3FFFFFFF
    started = time.monotonic()
    interrupted = False
    try:
        for rnd in range(args.rounds):
            order = cells if rnd % 2 == 0 else cells[::-1]
            for cell in order:
                run_id += 1
                try:
                    res = run_cell(cell, opts, run_id, logs / cell.key.replace("/", "-"), rec, node_args)
                except BrokerError as exc:
                    res = {"ok": False, "error": f"broker: {exc}"}
                res["round"] = rnd
                res["load"] = _load()
                results.add(cell, res)
                print(f"[{time.monotonic() - started:5.0f}s] r{rnd + 1} {cell.key:42} {_line(res)}", flush=True)
            if do_idle:
                res = idle_mesh(7, args.idle, logs / "idle7", node_args)
                res["load"] = _load()
                results.idle.append(res)
                print(f"[{time.monotonic() - started:5.0f}s] r{rnd + 1} idle 7-node mesh: {res}", flush=True)
    except KeyboardInterrupt:
        interrupted = True
        print("interrupted: partial results", flush=True)
    finally:
        REGISTRY.kill_all()
        if args.logs is None:
            shutil.rmtree(logs, ignore_errors=True)
    results.meta["load_after"] = _load()
    results.meta["elapsed_s"] = round(time.monotonic() - started)
    results.meta["interrupted"] = interrupted
    text = tables(results)
    print()
    print(text)
    if rec is not None:
        runs = {k: e["runs"] for k, e in results.cells.items()}
        recorded = recordings_text(cells, rec, args.duration, runs)
        print(recorded)
        rec.out.mkdir(parents=True, exist_ok=True)  # (--links alone records nothing there before)
        (rec.out / "summary.txt").write_text(recorded + "\n")
        print(f"recordings: {rec.out}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results.to_json(), indent=1, default=str))
    print(f"raw results: {args.out}")
    if args.md and not interrupted:
        write_markdown(REPO / "BENCHMARKS.md", markdown(results))
        print("wrote the Mesh cost section of BENCHMARKS.md")
    return 130 if interrupted else 0


def recordings_text(cells: list[Cell], rec: Recording, duration: float, runs: dict[str, list[dict]]) -> str:
    """Per cell, every round's recordings of every node added up (and per node, self time)."""
    out = []
    for cell in cells:
        if cell.broker == "mosquitto":
            continue
        prefix = cell.key.replace("/", "-") + "-"
        out.append(f"== {cell.key}")
        if rec.links:
            for k in LINK_COUNTERS:
                per = _med(x.get("links_per_delivery", {}).get(k) for x in runs.get(cell.key, []))
                out.append(f"  {k} per delivery: {_f(per, '.2f')}")
            out.append("")
            continue
        if rec.perf:
            files = sorted(rec.out.glob(prefix + "*.perf"))
            window = cell.duration or duration
            out.append(profiles.perf_text(files, window))
            out.append("")
            continue
        if rec.strace:
            files = sorted(rec.out.glob(prefix + "*.strace"))
            rounds = len({f.name.rsplit("-n", 1)[0] for f in files})
            messages = deliveries_per_s(cell.workload) * rec.strace * rounds
            out.append(profiles.syscalls_text(profiles.syscalls(files), messages))
            continue
        files = sorted(f for f in rec.out.glob(prefix + "*.txt"))
        out.append(profiles.profile_text(profiles.summarize(files)))
        nodes = sorted({f.stem.rsplit("-", 1)[-1] for f in files})
        if 1 < len(nodes) <= 2:
            for node in nodes:
                prof = profiles.summarize([f for f in files if f.stem.endswith("-" + node)])
                share = max(1, prof.working)
                top = ", ".join(f"{name} {n / share * 100:.0f} %" for name, n in prof.self_.most_common(6))
                out.append(f"node {node}: {prof.samples} samples, {prof.waiting} in epoll_pwait; self: {top}")
        out.append("")
    return "\n".join(out)


def _line(res: dict) -> str:
    if not res.get("ok"):
        return f"FAILED {str(res.get('error', '?')).splitlines()[0][:160]}"
    frac = res.get("delivered_fraction")
    return (
        f"{res['delivered_per_s']:>9,.0f}/s {'-' if frac is None else f'{frac * 100:.1f}%'} "
        f"p50 {_f(res['p50_ms'], '.2f')} p99 {_f(res['p99_ms'], '.2f')} ms  "
        f"cpu {_f(res['broker_cpu_us_per_msg'], '.1f')} µs/msg ({_f(res['broker_cpu_util'], '.2f')} cores)"
        f"  lost {res['lost']} load {res['load']}"
    )


if __name__ == "__main__":
    sys.exit(main())
