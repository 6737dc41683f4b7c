"""`make bench`: run the workloads against mqttmesh, Mosquitto and amqtt in one go.

    python -m bench [--quick] [--repeat N] [--brokers a,b] [--workloads w,..] [--qos 0,1,2]

Prints a table, writes bench/results/latest.json (every run's raw numbers) and
rewrites BENCHMARKS.md (unless --no-md). Every process it starts is ended by
PID when it finishes, also on Ctrl-C.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from . import report
from .brokers import AMQTT_VERSION, REGISTRY, Amqtt, BrokerError, Mosquitto, MqttmeshNodes
from .loadgen import RunError, RunOptions, run_once
from .workloads import WORKLOADS

RESULTS = Path(__file__).resolve().parent / "results"
BROKER_ORDER = [
    "mqttmesh",
    "mesh2",
    "mosquitto",
    "mosquitto-default",
    "amqtt",
    "mqttmesh-ws",
    "mosquitto-ws",
    "mqttmesh-v5",
    "mesh2-v5",
    "mosquitto-v5",
]
WS_BROKERS = {"mqttmesh-ws", "mosquitto-ws"}  # clients over WebSocket; the run in a private network namespace
# mesh2: two mqttmesh nodes linked as a mesh, publishers on one, subscribers on the other,
# so every message crosses a peer link (issue 3 compares it with the same-node runs)
MESH2_ARGS = [["--cluster-secret", "bench"], ["--cluster-secret", "bench", "--peer", "{host}:{ports[0]}"]]


def _csv(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def parse_args(argv):
    p = argparse.ArgumentParser(
        prog="python -m bench", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--quick", action="store_true", help="smoke test: 1 repeat, 0.25 s warm-up, 1 s window (about 2-3 minutes)"
    )
    p.add_argument("--repeat", type=int, default=None, help="runs per measurement, median reported (default 3)")
    p.add_argument(
        "--brokers",
        default=",".join(BROKER_ORDER),
        help=f"comma list of {','.join(BROKER_ORDER)} (mesh2: "
        "two linked mqttmesh nodes, publishers on one and subscribers on the other; mosquitto-default: "
        "Mosquitto with its stock limits, run only in the workloads where every broker runs at its "
        "defaults; the -ws ones: clients over WebSocket, the whole run in a private network namespace; "
        "the -v5 ones: MQTT 5 clients, each PUBLISH with a Content Type and a User Property, "
        "subscribers taking topic aliases)",
    )
    p.add_argument("--workloads", default=",".join(WORKLOADS), help=f"comma list of {','.join(WORKLOADS)}")
    p.add_argument("--qos", default="0,1,2", help="comma list of QoS levels (a workload runs those it has)")
    p.add_argument("--warmup", type=float, default=None, help="seconds published before the window (0.5)")
    p.add_argument("--duration", type=float, default=None, help="seconds in the measurement window (3)")
    p.add_argument("--drain-timeout", type=float, default=10.0, help="longest wait for acks and stragglers")
    p.add_argument(
        "--connect-timeout", type=float, default=30.0, help="longest wait for all clients to connect and subscribe"
    )
    p.add_argument(
        "--e2e-window",
        type=int,
        default=None,
        help="messages a publisher may be ahead of its slowest subscriber (0: off; default per workload)",
    )
    p.add_argument("--inflight", type=int, default=None, help="QoS 1/2 window per publisher (default per workload)")
    p.add_argument("--batch", type=int, default=128, help="messages per write of an unpaced publisher")
    p.add_argument(
        "--mqttmesh-nodes",
        type=int,
        default=1,
        help="start N mqttmesh nodes; publishers use node 0, subscribers node 1 (a mesh)",
    )
    p.add_argument(
        "--mqttmesh-args",
        default="",
        help="extra arguments for every mqttmesh node; {host} and {ports[i]} are replaced, "
        'e.g. "--peer {host}:{ports[0]}"',
    )
    p.add_argument(
        "--mqttmesh-node-args",
        action="append",
        default=[],
        metavar="I:ARGS",
        help="extra arguments for node I only (repeatable), same replacements, e.g. "
        '"1:--peer {host}:{ports[0]} --cluster-secret s"',
    )
    p.add_argument(
        "--settle",
        type=float,
        default=None,
        help="seconds between subscribing and publishing (default 0; 1 with several mqttmesh nodes, "
        "for the subscriptions to reach the other nodes)",
    )
    p.add_argument("--json", type=Path, default=RESULTS / "latest.json", help="where the raw results go")
    p.add_argument("--no-md", action="store_true", help="do not rewrite BENCHMARKS.md")
    p.add_argument(
        "--render",
        type=Path,
        metavar="JSON",
        help="run nothing: rewrite BENCHMARKS.md from a results file (e.g. bench/results/latest.json)",
    )
    args = p.parse_args(argv)
    args.repeat = args.repeat or (1 if args.quick else 3)
    args.warmup = args.warmup if args.warmup is not None else (0.25 if args.quick else 0.5)
    args.duration = args.duration if args.duration is not None else (1.0 if args.quick else 3.0)
    args.broker_list = _csv(args.brokers)
    for b in args.broker_list:
        if b not in BROKER_ORDER:
            p.error(f"unknown broker {b!r}")
    args.workload_list = _csv(args.workloads)
    for w in args.workload_list:
        if w not in WORKLOADS:
            p.error(f"unknown workload {w!r}")
    try:
        args.qos_list = [int(q) for q in _csv(args.qos)]
    except ValueError:
        p.error("--qos wants numbers like 0,1")
    if any(q not in (0, 1, 2) for q in args.qos_list) or args.repeat < 1 or args.duration <= 0:
        p.error("bad --qos, --repeat or --duration")
    if args.inflight is not None and not 1 <= args.inflight <= 30000:
        p.error("--inflight must be 1..30000 (packet identifiers are reused modulo 65535)")
    if args.mqttmesh_nodes < 1:
        p.error("--mqttmesh-nodes must be >= 1")
    args.node_args = [shlex.split(args.mqttmesh_args) for _ in range(args.mqttmesh_nodes)]
    for spec in args.mqttmesh_node_args:
        index, _, rest = spec.partition(":")
        if not index.isdigit() or int(index) >= args.mqttmesh_nodes:
            p.error(f"--mqttmesh-node-args {spec!r}: wants I:ARGS with I < --mqttmesh-nodes")
        args.node_args[int(index)] += shlex.split(rest)
    return args


def make_brokers(args, logs: Path) -> dict:
    out = {}
    for name in args.broker_list:
        if name == "mqttmesh":
            out[name] = MqttmeshNodes(logs, count=args.mqttmesh_nodes, extra_args=args.node_args)
        elif name == "mesh2":
            out[name] = MqttmeshNodes(logs / "mesh2", count=2, extra_args=[list(a) for a in MESH2_ARGS])
        elif name == "mosquitto":
            out[name] = Mosquitto(logs)
        elif name == "mosquitto-default":
            out[name] = Mosquitto(logs / "default", tuned=False)
        elif name == "mqttmesh-ws":
            out[name] = MqttmeshNodes(logs / "ws", count=args.mqttmesh_nodes, extra_args=args.node_args, ws=True)
        elif name == "mosquitto-ws":
            out[name] = Mosquitto(logs / "ws", ws=True)
        elif name == "mqttmesh-v5":
            out[name] = MqttmeshNodes(logs / "v5", count=args.mqttmesh_nodes, extra_args=args.node_args, protocol=5)
        elif name == "mesh2-v5":
            out[name] = MqttmeshNodes(logs / "mesh2-v5", count=2, extra_args=[list(a) for a in MESH2_ARGS], protocol=5)
        elif name == "mosquitto-v5":
            out[name] = Mosquitto(logs / "v5", protocol=5)
        else:
            out[name] = Amqtt(logs)
    return out


def _line(res: dict) -> str:
    if not res.get("ok"):
        return f"FAILED: {res.get('error', '?').splitlines()[0][:200]}"
    cpu = res["broker_cpu_us_per_msg"]
    util = res["broker_cpu_util"]
    lat = f"p50 {res['p50_ms']:.2f} p99 {res['p99_ms']:.2f} ms" if res["p99_ms"] is not None else "no latency"
    extra = ""
    if res["lost"] or res["dups"]:
        extra += f" lost {res['lost']} dups {res['dups']}"
    if res["errors"]:
        extra += f" ERR {res['errors'][0][:120]}"
    return (
        f"{res['delivered_per_s']:>10,.0f} msgs/s  {lat}  cpu "
        f"{'-' if cpu is None else f'{cpu:.2f}'} µs/msg ({'-' if util is None else f'{util * 100:.0f}'}%)"
        f"  drain {res['drain_s']:.2f}s{extra}"
    )


def _interrupt(signum, frame):
    raise KeyboardInterrupt(signal.Signals(signum).name)


def _in_private_netns(argv) -> int | None:
    """Run this very command again in a new network namespace with only a loopback (for
    Mosquitto's WebSocket listener, which binds every interface); None when already in one.
    Needs root (``unshare -n``)."""
    if os.environ.get("MQTTMESH_BENCH_NETNS") == "1":
        return None
    if os.geteuid() != 0 or shutil.which("unshare") is None or shutil.which("ip") is None:
        print(
            "bench: the WebSocket brokers run in a private network namespace (Mosquitto's ws listener "
            "binds every interface): that needs root, unshare and ip (util-linux, iproute2)",
            file=sys.stderr,
        )
        return 2
    env = {**os.environ, "MQTTMESH_BENCH_NETNS": "1"}
    cmd = ["unshare", "-n", "--", "sh", "-c", 'ip link set lo up && exec "$@"', "sh", sys.executable, "-m", "bench"]
    return subprocess.run([*cmd, *(argv if argv is not None else sys.argv[1:])], env=env).returncode


def main(argv=None) -> int:
    args = parse_args(argv)
    if WS_BROKERS & set(args.broker_list) and not args.render:
        rc = _in_private_netns(argv)
        if rc is not None:
            return rc
    if args.render:
        data = json.loads(args.render.read_text())
        report.write_markdown(report.REPO / "BENCHMARKS.md", data)
        print(f"wrote BENCHMARKS.md from {args.render}")
        return 0
    load_before = os.getloadavg()
    # Ctrl-C, kill and a closed terminal all end the same way: every process started is
    # stopped by PID and the partial results are written. SIGINT is set explicitly because
    # a shell without job control starts background commands with SIGINT ignored.
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _interrupt)
    started = time.monotonic()
    logs = RESULTS / "logs"
    RESULTS.mkdir(parents=True, exist_ok=True)
    settle = (
        args.settle
        if args.settle is not None
        else (1.0 if args.mqttmesh_nodes > 1 or "mesh2" in args.broker_list else 0.0)
    )
    opts = RunOptions(
        warmup=args.warmup,
        duration=args.duration,
        drain_timeout=args.drain_timeout,
        connect_timeout=args.connect_timeout,
        settle=settle,
        e2e_window=args.e2e_window,
        inflight=args.inflight,
        batch=args.batch,
    )
    brokers = make_brokers(args, logs)
    workloads = [WORKLOADS[w] for w in args.workload_list]
    cells_todo = [(w, q) for w in workloads for q in w.qos_levels if q in args.qos_list]
    n_runs = sum(1 for w, _ in cells_todo for name in brokers if _runs_in(name, w)) * args.repeat
    print(
        f"mqttmesh bench: {len(cells_todo)} workload/QoS x up to {len(brokers)} brokers x {args.repeat} "
        f"repeats = {n_runs} runs; windows {args.warmup:g}+{args.duration:g} s",
        flush=True,
    )

    unavailable = {}
    versions = {"amqtt_wanted": AMQTT_VERSION}
    for name, b in brokers.items():
        reason = b.unavailable()
        if reason:
            print(f"  {name}: n/a ({reason})", flush=True)
            unavailable[name] = reason
        versions[name] = b.version() if not reason else f"n/a ({reason})"
    print("  versions: " + ", ".join(f"{k} {v}" for k, v in versions.items() if k != "amqtt_wanted"), flush=True)

    cells: list[dict] = []
    all_runs: list[dict] = []
    run_id = int(time.time()) & 0x3FFFFFFF  # any value: it only has to differ between runs
    interrupted = False
    try:
        for w, q in cells_todo:
            for name, b in brokers.items():
                if not _runs_in(name, w):
                    continue
                cell = {"broker": name, "workload": w.name, "qos": q}
                cells.append(cell)
                if name in unavailable:
                    cell["na"] = unavailable[name]
                    continue
                b.workdir = logs / name / f"{w.name}-qos{q}"
                if b.workdir.exists():
                    shutil.rmtree(b.workdir)
                b.workdir.mkdir(parents=True)
                b.use_defaults(w.broker_defaults)
                try:
                    target = b.start()
                except BrokerError as exc:
                    cell["na"] = f"did not start: {str(exc)[:160]}"
                    print(f"[{time.monotonic() - started:6.0f}s] {w.name:8} QoS {q} {name:9} n/a: {exc}", flush=True)
                    continue
                runs = []
                try:
                    for r in range(args.repeat):
                        if not b.alive():
                            # it crashed in the previous run: say so, and measure a fresh one
                            runs[-1].setdefault("errors", []).append(f"broker exited with {b.exit_codes()}")
                            b.stop()
                            target = b.start()
                        run_id += 1
                        try:
                            res = run_once(target, w, q, opts, run_id)
                        except RunError as exc:
                            res = {"ok": False, "error": str(exc)}
                        res.update(
                            broker=name, workload=w.name, qos=q, repeat=r, run_id=run_id, broker_alive_after=b.alive()
                        )
                        if not res["broker_alive_after"]:
                            res.setdefault("errors", []).append(f"broker exited with {b.exit_codes()}")
                        runs.append(res)
                        all_runs.append(res)
                        print(
                            f"[{time.monotonic() - started:6.0f}s] {w.name:8} QoS {q} {name:9} #{r + 1}  {_line(res)}",
                            flush=True,
                        )
                except BrokerError as exc:
                    cell["restart_error"] = str(exc)
                finally:
                    # read the logs before stopping: what a broker says while shutting down is not news
                    cell["broker_log_problems"] = b.log_problems()
                    b.stop()
                cell["summary"] = report.summarize(runs)
                cell["target"] = {
                    "pub": [str(e) for e in target.pub_endpoints],
                    "sub": [str(e) for e in target.sub_endpoints],
                }
                if not runs or not cell["summary"]["runs_ok"]:
                    first = next((x.get("error") for x in runs if x.get("error")), "no run")
                    cell["na"] = f"all runs failed: {first.splitlines()[0][:160]}"
    except KeyboardInterrupt:
        interrupted = True
        print("\ninterrupted: stopping every process started, writing partial results", flush=True)
    finally:
        for b in brokers.values():
            try:
                b.stop()
            except Exception:
                pass
        REGISTRY.kill_all()

    for cell in cells:
        if "summary" not in cell and "na" not in cell:
            cell["na"] = "interrupted"
    report.ratios(cells)
    paced = {w.name for w in workloads if w.paced}
    targets = report.evaluate_targets(cells, paced, frozenset(w.name for w in workloads if "amqtt" in w.skip_brokers))
    data = {
        "meta": {
            "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "command": " ".join(["python -m bench", *(argv if argv is not None else sys.argv[1:])]),
            "machine": report.machine_info(),
            "versions": versions,
            "options": {
                "quick": args.quick,
                "repeat": args.repeat,
                "warmup": args.warmup,
                "duration": args.duration,
                "drain_timeout": args.drain_timeout,
                "connect_timeout": args.connect_timeout,
                "settle": settle,
                "quiet": opts.quiet,
                "batch": args.batch,
                "e2e_window": args.e2e_window,
                "inflight": args.inflight,
                "brokers": args.broker_list,
                "workloads": args.workload_list,
                "qos": args.qos_list,
                "mqttmesh_nodes": args.mqttmesh_nodes,
                "mqttmesh_node_args": args.node_args,
                "inflight_desc": _desc(workloads, "inflight", args.inflight),
                "e2e_desc": _desc(workloads, "e2e_window", args.e2e_window),
            },
            "elapsed_s": time.monotonic() - started,
            # other work on the machine (tests, builds) shows here and makes the numbers noisier
            "loadavg_before": load_before,
            "loadavg_after": os.getloadavg(),
            "interrupted": interrupted,
        },
        "workloads": {w.name: w.__dict__ for w in workloads},
        "targets": targets,
        "cells": cells,
        "runs": all_runs,
    }
    head, rows = report.table_rows(cells)
    print()
    print(report.text_table(head, rows))
    print("\nTargets:")
    print(report.targets_text(targets))
    report.write_json(args.json, data)
    print(f"\nraw results: {os.path.relpath(args.json)}")
    if not args.no_md and not interrupted:
        md = report.REPO / "BENCHMARKS.md"
        report.write_markdown(md, data)
        print(f"wrote {os.path.relpath(md)}")
    print(f"total {time.monotonic() - started:.0f} s")
    return 130 if interrupted else 0


def _runs_in(broker: str, w) -> bool:
    """Does ``broker`` run workload ``w``? (Mosquitto's stock limits only where every broker
    runs at its defaults; amqtt and mesh2 not where the workload says they mean nothing.)"""
    if broker in w.skip_brokers:
        return False
    return broker != "mosquitto-default" or w.broker_defaults


def _desc(workloads, attr: str, override) -> str:
    if override is not None:
        return str(override) + (" (off)" if override == 0 and attr == "e2e_window" else "")
    vals = {w.name: getattr(w, attr) for w in workloads}
    common = max(set(vals.values()), key=list(vals.values()).count)
    others = [f"{n}: {v}" for n, v in vals.items() if v != common]
    return f"{common}" + (f" ({', '.join(others)})" if others else "")


if __name__ == "__main__":
    sys.exit(main())
