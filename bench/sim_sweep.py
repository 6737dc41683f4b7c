"""A sweep of the cluster fuzzer (`mqttmesh simulate --fuzz`) over many seeds, with its figures.

    python -m bench.sim_sweep --seeds 1000 [--first 1] [--jobs 1] [--out sim-out/sweep.json]

Judges the drawn scenario of every seed (src/mqttmesh/sim/fuzz.py: whole nodes, moving
clients, some of them MQTT 5, crashes, partitions, flapping and slowed links, stalled nodes),
shrinks the first failing seed of each invariant (``--shrink all`` shrinks every one,
``none`` none), and prints a table: seeds, violations per invariant, the failing seeds, the
wall time, the nodes and faults drawn, the seeds with MQTT 5 clients, what the runs gave the
invariants to judge. The JSON holds every seed's result and the shrunk scenarios (TOML
text); ``--out-dir`` also writes those as files that ``mqttmesh simulate FILE`` replays.
``--jobs N`` judges N seeds at a time, each in its own process (results are the same: every
run is seeded). Exit status 1 when any seed broke an invariant.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from mqttmesh.sim.fuzz_run import SeedResult, fuzz, fuzz_seed, summary_line
from mqttmesh.sim.scenario_dump import dump_scenario


def _judged(seeds: range, jobs: int) -> Iterator[SeedResult]:
    if jobs <= 1:
        yield from map(fuzz_seed, seeds)
        return
    with ProcessPoolExecutor(jobs) as pool:
        yield from pool.map(fuzz_seed, seeds, chunksize=4)


def table(results: list[SeedResult], wall: float, judged: float) -> str:
    per: dict[str, list[int]] = {}
    for r in results:
        for invariant in r.verdict.violated:
            per.setdefault(invariant, []).append(r.seed)
    nodes = [r.nodes for r in results]
    kinds = Counter(r.kind for r in results)
    faults: Counter[str] = Counter()
    for r in results:
        faults.update(r.faults)
    counts: Counter[str] = Counter()
    for r in results:
        counts.update(r.verdict.counts)
    walls = [r.verdict.wall for r in results]
    failing = sorted({r.seed for r in results if r.verdict.violated})
    rows = [
        ("seeds", f"{len(results):,} ({results[0].seed}..{results[-1].seed})"),
        (
            "wall time",
            f"{wall:,.0f} s in all; judging {judged:,.0f} s, {statistics.mean(walls):.2f} s per seed "
            f"(median {statistics.median(walls):.2f}, max {max(walls):.1f}); shrinking {wall - judged:,.0f} s",
        ),
        (
            "nodes drawn",
            f"{min(nodes)}-{max(nodes)}, mean {statistics.mean(nodes):.1f}, "
            f"{sum(n <= 10 for n in nodes)} seeds with 10 or fewer, {sum(n > 20 for n in nodes)} with more than 20",
        ),
        ("topologies", ", ".join(f"{k} {n}" for k, n in kinds.most_common())),
        (
            "MQTT 5",
            f"{sum(1 for r in results if r.mqtt5)} seeds with MQTT 5 clients "
            f"({counts.get('mqtt5_clients', 0):,} clients), the others 3.1.1 only",
        ),
        (
            "faults drawn",
            ", ".join(f"{k} {n}" for k, n in faults.most_common())
            + f"; {sum(not r.faults for r in results)} seeds without a fault",
        ),
        ("counted", ", ".join(f"{k} {n:,}" for k, n in sorted(counts.items()))),
    ]
    for invariant, seeds in sorted(per.items()):
        shown = ", ".join(map(str, seeds[:40])) + (", ..." if len(seeds) > 40 else "")
        rows.append(
            (f"violated: {invariant}", f"{len(seeds)} seeds ({100 * len(seeds) / len(results):.1f} %): {shown}")
        )
    if not per:
        rows.append(("violations", "none: every invariant held on every seed"))
    rows.append(("failing seeds", f"{len(failing)}"))
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"| {k:<{width}} | {v} |" for k, v in rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.sim_sweep", description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, default=1000, help="how many seeds (1000)")
    p.add_argument("--first", type=int, default=1, help="the first seed (1)")
    p.add_argument("--jobs", type=int, default=1, help="seeds judged at a time, one process each (1)")
    p.add_argument("--shrink", choices=("all", "first", "none"), default="first")
    p.add_argument("--shrink-runs", type=int, default=50)
    p.add_argument("--out", default="sim-out/sweep.json", help="the JSON results (sim-out/sweep.json)")
    p.add_argument("--out-dir", help="also write the failing and shrunk scenarios here as TOML files")
    p.add_argument("-q", "--quiet", action="store_true", help="no line per seed")
    args = p.parse_args(argv)
    seeds = range(args.first, args.first + args.seeds)
    log = (lambda line: None) if args.quiet else (lambda line: print(line, flush=True))
    started = time.perf_counter()
    judging = [0.0]

    def timed() -> Iterator[SeedResult]:
        for r in _judged(seeds, args.jobs):
            judging[0] += r.verdict.wall
            yield r

    results = fuzz(
        seeds, Path(args.out_dir) if args.out_dir else None, args.shrink, args.shrink_runs, log, results=timed()
    )
    wall = time.perf_counter() - started
    text = table(results, wall, judging[0] / max(1, args.jobs))
    print(text)
    print(summary_line(results))
    doc = {
        "seeds": [seeds.start, seeds.stop - 1],
        "wall_seconds": wall,
        "jobs": args.jobs,
        "table": text,
        "results": [
            {
                "seed": r.seed,
                "nodes": r.nodes,
                "topology": r.kind,
                "mqtt5": r.mqtt5,
                "faults": r.faults,
                "violated": r.verdict.violated,
                "first": r.verdict.first,
                "wall": r.verdict.wall,
                "counts": r.verdict.counts,
                "shrunk": {
                    k: {"runs": s.runs, "steps": s.steps, "toml": dump_scenario(s.scenario)}
                    for k, s in r.shrunk.items()
                },
            }
            for r in results
        ],
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {out}", file=sys.stderr)
    return 1 if any(r.verdict.violated for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
