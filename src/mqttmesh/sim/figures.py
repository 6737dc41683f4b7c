"""The figures of docs/simulation.md: the mesh at 10, 100 and 1,000 nodes, against full replication.

    python -m mqttmesh.sim.figures --out docs/simulation
    python -m mqttmesh.sim.figures --out docs/simulation --reuse 1000=sim-out/scale/summary.json

Runs scenarios/fig-10.toml, fig-100.toml and scale-1000.toml (or reuses the JSON
summary a previous run wrote, e.g. `make simulate-scale`), then draws one PNG per
figure and writes figures.json and figures.md (the table docs/simulation.md quotes).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from .plots import pyplot

__all__ = ["main"]

SCENARIOS = {10: "fig-10.toml", 100: "fig-100.toml", 1000: "scale-1000.toml"}


def _episode(summary: dict, label: str) -> dict | None:
    for e in summary["convergence"]:
        if e["cause"] == label:
            return e
    return None


def collect(summary: dict) -> dict:
    """The numbers the figures show, from one run's summary."""
    n = summary["scenario"]["nodes"]
    row = {"nodes": n, "links": summary["scenario"]["links"], "filters": summary["workload"]["distinct_filters"]}
    for key, label in (
        ("link", "link failure"),
        ("crash", "node crash (reset)"),
        ("crash_timeout", "node crash (timeout)"),
        ("restart", "node restart"),
        ("subscribe", "subscribe"),
        ("unsubscribe", "unsubscribe"),
        ("partition", "partition"),
        ("heal", "heal"),
    ):
        e = _episode(summary, label)
        if e is None:
            continue
        row[key] = {
            "after_fault_s": e["converged_after"],
            "after_detection_s": e["after_detection"],
            "after_last_detection_s": e.get("after_last_detection"),
            "rounds": e["rounds"],
            "advert_copies": e["attributed_msgs"],
            "advert_bytes": e["attributed_bytes"],
            "spf_runs_per_node": e["spf_runs"] / n,
            "spf_ms_per_run": e["spf_ms_per_run"],
        }
    f, q, m = summary["forwarding"], summary["mqtt_st"], summary["memory"]
    row["copies_per_message"] = f["copies_per_message"]
    row["optimum_per_message"] = f["optimum_per_message"]
    row["copies_over_optimum"] = f["copies_over_optimum"]
    row["destinations_per_message"] = summary["workload"]["mean_destinations"]
    row["mqtt_st_copies_per_message"] = q["copies_per_message"]
    row["mqtt_st_uninterested_per_message"] = q["uninterested_receivers_per_message"]
    row["mqtt_st_stretch_mean"] = q["path_stretch_mean"]
    row["mqtt_st_busiest_sends_per_message"] = q["busiest_node_sends_per_message"]
    row["mesh_busiest_sends_per_message"] = q["mesh_busiest_node_sends_per_message"]
    row["stretch_mean"] = summary["stretch"]["latency_mean"]
    row["advert_db_bytes_per_node"] = m.get("advert_db_bytes")
    row["routing_state_bytes_per_node"] = m.get("routing_state_bytes")
    row["steady_control_bytes_per_node_per_s"] = summary["control"]["steady_bytes_per_node_per_s"]
    row["spf_ms_per_run"] = summary["spf"]["ms_per_run"]
    row["invariants_ok"] = summary["invariants"]["ok"]
    row["wall_seconds"] = summary["run"]["wall_seconds"]
    return row


def run_one(path: Path, quiet: bool) -> dict:
    from .core import Simulator
    from .report import summarize
    from .scenario import load_scenario

    progress = None if quiet else (lambda line: print(line, file=sys.stderr, flush=True))
    sim = Simulator(load_scenario(path), progress).run()
    return summarize(sim)


def draw(rows: list[dict], out: Path) -> list[Path]:
    plt = pyplot()
    ns = [r["nodes"] for r in rows]
    written = []

    def save(fig, name):
        path = out / name
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)

    # convergence: simulated seconds from the detection, and rounds
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 3.8))
    for key, label, marker in (
        ("link", "link failure", "o"),
        ("crash", "node crash (reset)", "s"),
        ("crash_timeout", "node crash (timeout)", "^"),
        ("subscribe", "subscription change", "x"),
    ):
        pts = [(r["nodes"], r[key]) for r in rows if key in r and r[key]["after_last_detection_s"] is not None]
        if not pts:
            continue
        a1.plot([p[0] for p in pts], [1000 * p[1]["after_last_detection_s"] for p in pts], marker=marker, label=label)
        a2.plot([p[0] for p in pts], [p[1]["rounds"] for p in pts], marker=marker, label=label)
    a1.set(
        xscale="log",
        xlabel="nodes",
        ylabel="ms from the last detection to convergence",
        title="convergence time (simulated)",
    )
    a2.set(xscale="log", xlabel="nodes", ylabel="rounds", title="rounds of advertisement")
    a1.legend(fontsize=8)
    save(fig, "convergence.png")

    # control traffic per subscription change, and per topology change
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    for key, label in (("subscribe", "subscription change"), ("link", "link failure"), ("crash", "node crash")):
        pts = [(r["nodes"], r[key]["advert_bytes"]) for r in rows if key in r]
        if pts:
            ax.plot(*zip(*pts, strict=False), marker="o", label=label)
    ax.set(
        xscale="log",
        yscale="log",
        xlabel="nodes",
        ylabel="bytes of advertisement, mesh-wide",
        title="control traffic per change",
    )
    ax.legend(fontsize=8)
    save(fig, "control.png")

    # advertisement database and routing state per node
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    ax.plot(ns, [r["advert_db_bytes_per_node"] / 1024 for r in rows], marker="o", label="advertisement database (JSON)")
    ax.plot(ns, [r["routing_state_bytes_per_node"] / 1024 for r in rows], marker="s", label="routing state in memory")
    ax.set(
        xscale="log",
        yscale="log",
        xlabel="nodes (100 filters each)",
        ylabel="KB per node",
        title="what every node holds",
    )
    ax.legend(fontsize=8)
    save(fig, "memory.png")

    # shortest-path recomputation
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    ax.plot(ns, [r["spf_ms_per_run"] for r in rows], marker="o", label="CPU ms per SPF run")
    pts = [(r["nodes"], r["link"]["spf_runs_per_node"]) for r in rows if "link" in r]
    if pts:
        ax.plot(*zip(*pts, strict=False), marker="s", label="SPF runs per node per link failure")
    ax.set(xscale="log", yscale="log", xlabel="nodes", ylabel="ms, runs", title="shortest-path recomputation")
    ax.legend(fontsize=8)
    save(fig, "spf.png")

    # forwarded copies per message: mesh, optimum, MQTT-ST
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    ax.plot(ns, [r["copies_per_message"] for r in rows], marker="o", label="mesh: copies forwarded")
    ax.plot(ns, [r["optimum_per_message"] for r in rows], marker="x", ls="--", label="shortest-path tree (optimum)")
    ax.plot(ns, [r["destinations_per_message"] for r in rows], marker=".", ls=":", label="destination nodes")
    ax.plot(ns, [r["mqtt_st_copies_per_message"] for r in rows], marker="s", label="MQTT-ST: every node")
    ax.set(
        xscale="log",
        yscale="log",
        xlabel="nodes",
        ylabel="copies per published message",
        title="forwarded copies per message",
    )
    ax.legend(fontsize=8)
    save(fig, "copies.png")
    return written


def table(rows: list[dict]) -> str:
    def cell(r, key, field, fmt):
        v = r.get(key, {}).get(field)
        return "-" if v is None else format(v, fmt)

    lines = ["| | " + " | ".join(f"{r['nodes']:,} nodes" for r in rows) + " |", "|---|" + "---|" * len(rows)]

    def add(label, values):
        lines.append(f"| {label} | " + " | ".join(values) + " |")

    add("links / distinct filters", [f"{r['links']:,} / {r['filters']:,}" for r in rows])
    for key, what in (
        ("link", "link failure"),
        ("crash", "node crash, reset seen"),
        ("crash_timeout", "node crash, keepalive timeout"),
    ):
        add(
            f"{what}: converged after (from the fault / from the last detection)",
            [
                f"{cell(r, key, 'after_fault_s', '.3f')} s / {1000 * r[key]['after_last_detection_s']:.0f} ms"
                if key in r and r[key]["after_last_detection_s"] is not None
                else "-"
                for r in rows
            ],
        )
        add(f"{what}: rounds", [cell(r, key, "rounds", "d") for r in rows])
    add(
        "subscription change: advertisement copies / bytes mesh-wide",
        [f"{cell(r, 'subscribe', 'advert_copies', ',d')} / {cell(r, 'subscribe', 'advert_bytes', ',d')}" for r in rows],
    )
    add("advertisement database per node (JSON)", [f"{r['advert_db_bytes_per_node'] / 1024:,.0f} KB" for r in rows])
    add("routing state per node (memory)", [f"{r['routing_state_bytes_per_node'] / 1024:,.0f} KB" for r in rows])
    add("SPF CPU per run", [f"{r['spf_ms_per_run']:.3f} ms" for r in rows])
    add("SPF runs per node per link failure", [cell(r, "link", "spf_runs_per_node", ".2f") for r in rows])
    add(
        "copies per message: mesh / optimum",
        [f"{r['copies_per_message']:.2f} / {r['optimum_per_message']:.2f}" for r in rows],
    )
    add("copies per message: MQTT-ST", [f"{r['mqtt_st_copies_per_message']:,}" for r in rows])
    add(
        "uninterested receivers per message: mesh / MQTT-ST",
        [f"0 / {r['mqtt_st_uninterested_per_message']:.1f}" for r in rows],
    )
    add(
        "path stretch (latency): mesh / MQTT-ST tree",
        [f"{r['stretch_mean']:.3f} / {r['mqtt_st_stretch_mean']:.3f}" for r in rows],
    )
    add(
        "busiest node's sends per message: mesh / MQTT-ST",
        [f"{r['mesh_busiest_sends_per_message']:.2f} / {r['mqtt_st_busiest_sends_per_message']:.2f}" for r in rows],
    )
    add(
        "steady control traffic per node (refreshes)",
        [f"{r['steady_control_bytes_per_node_per_s']:.0f} B/s" for r in rows],
    )
    add("invariants", ["hold" if r["invariants_ok"] else "VIOLATED" for r in rows])
    add("wall time of the run", [f"{r['wall_seconds']:.0f} s" for r in rows])
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m mqttmesh.sim.figures", description=__doc__.split("\n")[0])
    p.add_argument("--out", default="docs/simulation", help="directory for the PNGs, figures.json, figures.md")
    p.add_argument("--sizes", default="10,100,1000", help="which of 10, 100, 1000 to run")
    p.add_argument(
        "--reuse",
        action="append",
        default=[],
        metavar="N=SUMMARY.json",
        help="take the N-node numbers from a summary.json written by `mqttmesh simulate --out`",
    )
    p.add_argument(
        "--scenarios",
        default=str(Path(__file__).resolve().parents[3] / "scenarios"),
        help="where fig-10.toml, fig-100.toml and scale-1000.toml are",
    )
    p.add_argument("-q", "--quiet", action="store_true")
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    reuse = {}
    for item in args.reuse:
        n, _, path = item.partition("=")
        reuse[int(n)] = Path(path)
    rows = []
    for n in [int(x) for x in args.sizes.split(",")]:
        if n in reuse:
            summary = json.loads(reuse[n].read_text())
        else:
            started = time.perf_counter()
            summary = run_one(Path(args.scenarios) / SCENARIOS[n], args.quiet)
            if not args.quiet:
                print(f"{n} nodes: {time.perf_counter() - started:.0f}s", file=sys.stderr)
        rows.append(collect(summary))
    (out / "figures.json").write_text(json.dumps(rows, indent=2) + "\n")
    (out / "figures.md").write_text(table(rows))
    for path in draw(rows, out):
        print(f"wrote {path}", file=sys.stderr)
    sys.stdout.write(table(rows))
    return 0 if all(r["invariants_ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
