"""Before/after figures for a change on the hot path: two source trees, alternating runs.

    .venv/bin/python -m bench.ab --a SRC_A --b SRC_B [--rounds 5] [--brokers mqttmesh,mesh2]
        [--workloads fanin,p2p,latency] [--qos 0,1] [--duration 3] [--a-scrape SECONDS]

SRC_A and SRC_B are ``src`` directories of two checkouts (e.g. ``git worktree add
/tmp/base <commit>`` for the "before" one). Each round runs every cell once with A
and once with B, in alternating order (A B, then B A), through the normal harness
(``python -m bench``, one repeat per call) with the nodes importing mqttmesh from the
given tree. It prints, per cell, the median msgs/s of each side, their ratio, and the
medians of p50/p99 latency and broker CPU per message. Every process is ended by the
harness when its run finishes.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run_cell(src: str, broker: str, workload: str, qos: int, duration: float, out: Path, scrape: float = 0.0) -> dict:
    env = {**os.environ, "PYTHONPATH": os.path.abspath(src), "MQTTMESH_BENCH_SCRAPE": str(scrape)}
    cmd = [
        sys.executable,
        "-m",
        "bench",
        "--brokers",
        broker,
        "--workloads",
        workload,
        "--qos",
        str(qos),
        "--repeat",
        "1",
        "--duration",
        str(duration),
        "--json",
        str(out),
        "--no-md",
    ]
    proc = subprocess.run(
        cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=900
    )
    if proc.returncode != 0:
        raise RuntimeError(f"bench failed ({broker} {workload} QoS {qos}): {proc.stderr[-2000:]}")
    s = json.loads(out.read_text())["cells"][0]["summary"]
    return {
        "rate": s["delivered_per_s"]["median"],
        "cpu": s["broker_cpu_us_per_msg"]["median"],
        "p50": (s.get("p50_ms") or {}).get("median"),
        "p99": (s.get("p99_ms") or {}).get("median"),
        "lost": s.get("lost_total", 0),
        # the share of what was sent (QoS 0) or acknowledged (QoS 1/2) that arrived
        "delivered": (s.get("delivered_fraction") or {}).get("median"),
    }


def _med(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def _fmt(v, spec):
    return "-" if v is None else format(v, spec)


def _pct(v):
    return "-" if v is None else f"{v * 100:.1f} %"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.ab", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--a", required=True, help="src directory of the 'after' tree")
    p.add_argument("--b", required=True, help="src directory of the 'before' tree")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--brokers", default="mqttmesh,mesh2")
    p.add_argument("--workloads", default="fanin,p2p")
    p.add_argument("--qos", default="0,1")
    p.add_argument("--duration", type=float, default=3.0)
    p.add_argument(
        "--a-scrape",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="A's nodes serve HTTP and their /metrics is fetched this often (what a Prometheus costs)",
    )
    args = p.parse_args(argv)
    cells = [
        (b, w, int(q)) for b in args.brokers.split(",") for w in args.workloads.split(",") for q in args.qos.split(",")
    ]
    results: dict = {c: {"A": [], "B": []} for c in cells}
    work = Path(tempfile.mkdtemp(prefix="mqttmesh-ab-"))
    for r in range(args.rounds):
        for cell in cells:
            order = ("A", "B") if r % 2 == 0 else ("B", "A")
            for side in order:
                src = args.a if side == "A" else args.b
                scrape = args.a_scrape if side == "A" else 0.0
                res = run_cell(src, *cell, args.duration, work / "run.json", scrape)
                results[cell][side].append(res)
                print(
                    f"round {r + 1} {cell[0]} {cell[1]} QoS {cell[2]} {side}: {res['rate']:>10,.0f} msgs/s"
                    f"  p99 {_fmt(res['p99'], '.2f')} ms  cpu {_fmt(res['cpu'], '.2f')} us/msg",
                    flush=True,
                )
    print(f"\nmedians of {args.rounds} alternating rounds ({args.duration:g} s windows); A = {args.a}, B = {args.b}")
    print(
        "| broker | workload | QoS | A msgs/s | B msgs/s | A/B | A / B delivered | A p50/p99 ms | B p50/p99 ms "
        "| A / B cpu µs/msg |"
    )
    print("|---|---|---:|---:|---:|---:|---|---|---|---|")
    for (broker, workload, qos), sides in results.items():
        a, b = sides["A"], sides["B"]
        ra, rb = _med(x["rate"] for x in a), _med(x["rate"] for x in b)
        print(
            f"| {broker} | {workload} | {qos} | {ra:,.0f} | {rb:,.0f} | {ra / rb:.3f} | "
            f"{_pct(_med(x['delivered'] for x in a))} / {_pct(_med(x['delivered'] for x in b))} | "
            f"{_fmt(_med(x['p50'] for x in a), '.2f')}/{_fmt(_med(x['p99'] for x in a), '.2f')} | "
            f"{_fmt(_med(x['p50'] for x in b), '.2f')}/{_fmt(_med(x['p99'] for x in b), '.2f')} | "
            f"{_fmt(_med(x['cpu'] for x in a), '.2f')} / {_fmt(_med(x['cpu'] for x in b), '.2f')} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
