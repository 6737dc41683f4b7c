"""``python -m bench.chaos``: runs of the fault harness, a Markdown table, a JSON file per run.

Exit status 1 when any run lost an acknowledged message, delivered a QoS 2 message twice,
reused a packet id a subscriber still held, or answered session present = 0 to a client
that had a session (or did not complete); with ``--shared``, also when an acknowledged message
reached no member of the group, or reached a second one without a reason (sharecheck.py);
with ``--archive``, also when the audit of the archives disagrees with the checker beyond the
differences auditcheck.py explains; 0 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
from pathlib import Path
from typing import Any

from mqttmesh.sim.history import History

from .checker import ChaosCheck, check
from .nemesis import KINDS, pauses_of, windows_of
from .nodelogs import link_losses
from .report import audit_lines, row, table_header
from .run import RunConfig, node_logs, run
from .sharecheck import SharedCheck, check_shared
from .workload import Options


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.chaos", description=__doc__.splitlines()[0])
    p.add_argument("--broker", default="mqttmesh", help="mqttmesh, mosquitto, or both (comma-separated)")
    p.add_argument("--nodes", type=int, default=5)
    p.add_argument("--seeds", type=_ints, default=None, help="comma-separated; default: one random seed")
    p.add_argument("--duration", type=float, default=90.0, help="seconds of load and faults per run")
    p.add_argument("--rate", type=float, default=120.0, help="messages per second, all publishers together")
    p.add_argument("--pid-range", type=int, default=65535, help="publishers take packet ids from 1..K")
    p.add_argument("--publishers", type=int, default=4)
    p.add_argument("--subscribers", type=int, default=4)
    p.add_argument("--max-pause", type=float, default=5.0, help="longest SIGSTOP, seconds")
    p.add_argument("--tail", type=float, default=30.0, help="longest drain after the last heal, seconds")
    p.add_argument("--out", default="chaos-out", help="directory of the JSON files")
    p.add_argument("--keep", action="store_true", help="keep the nodes' directories (logs, stores)")
    p.add_argument("--recheck", metavar="JSON", help="judge the history a run wrote again (no processes)")
    p.add_argument(
        "--mqtt5",
        action="store_true",
        help="MQTT 5 clients: sessions with a Session Expiry Interval, every third message with a "
        "Message Expiry Interval of 2 s (checked: none delivered after it)",
    )
    p.add_argument(
        "--shared",
        action="store_true",
        help="the subscribers are members of one shared group $share/chaos/chaos/# (issue 24): "
        "some persistent, --clean-members of them clean sessions; moves include a stall and a reset",
    )
    p.add_argument("--clean-members", type=int, default=None, help="with --shared: clean members (default: half)")
    p.add_argument(
        "--faults",
        default=None,
        help="only these fault kinds, each once, none overlapping (comma-separated: kill, pause, "
        "partition-cut, partition-blackhole, flap); default: every kind, then overlapping ones",
    )
    p.add_argument(
        "--archive",
        action="store_true",
        help="the nodes archive with the delivery log (under OUT/archive-...); after the run the "
        "pipeline's audit job reads the archives and its counts are reconciled with the checker's",
    )
    p.add_argument("--flush-interval", type=float, default=1.0, help="with --archive: archive.flush_interval")
    args = p.parse_args(argv)
    if args.recheck:
        return recheck(Path(args.recheck))
    # SIGTERM ends the run through its finally blocks: the nodes are stopped by PID
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    seeds = args.seeds or [int.from_bytes(os.urandom(3), "big")]
    kinds = None if args.faults is None else tuple(k.strip() for k in args.faults.split(",") if k.strip())
    if kinds is not None and not set(kinds) <= set(KINDS):
        p.error(f"--faults: kinds are {', '.join(KINDS)}")
    if args.archive and args.shared:
        p.error("--archive: the audit expects every message at every subscriber, not a shared group's")
    brokers = [b.strip() for b in args.broker.split(",") if b.strip()]
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    rows: list[str] = []
    failed = False
    for seed in seeds:
        for broker in brokers:
            wopts = Options(
                publishers=args.publishers,
                subscribers=args.subscribers,
                rate=args.rate,
                pid_range=args.pid_range,
                window=min(20, args.pid_range),
                mqtt5=args.mqtt5,
                shared=args.shared,
                clean_members=args.subscribers // 2 if args.clean_members is None else args.clean_members,
            )
            v5 = ("-mqtt5" if args.mqtt5 else "") + ("-shared" if args.shared else "")
            name = f"chaos-{broker}{v5}-seed{seed}-{args.nodes}n-{args.rate:g}"
            archive = None
            if args.archive and broker == "mqttmesh":
                archive = out_dir / f"archive-{name[len('chaos-') :]}"
                if archive.exists():
                    shutil.rmtree(archive)
            cfg = RunConfig(
                broker=broker,
                nodes=args.nodes,
                seed=seed,
                duration=args.duration,
                max_pause=args.max_pause,
                tail=args.tail,
                keep=args.keep,
                workload=wopts,
                kinds=kinds,
                archive=archive,
                flush_interval=args.flush_interval,
            )
            result: dict[str, Any] = run(cfg, log=lambda s: print(s, flush=True))
            path = out_dir / f"{name}.json"
            path.write_text(json.dumps(result, default=list) + "\n")
            print(f"chaos: {path}", flush=True)
            rows.append(row(result))
            failed = failed or not result["completed"] or result["check"]["failed"]
            print(table_header(args.shared) + "\n" + rows[-1], flush=True)
            if "audit" in result:
                print(audit_lines(result["audit"]), flush=True)
                failed = failed or not result["audit"]["agrees"]
    print()
    print(table_header(args.shared))
    print("\n".join(rows))
    return 1 if failed else 0


def recheck(path: Path) -> int:
    """The checker is a pure function of the history: run it again on a saved one."""
    saved = json.loads(path.read_text())
    history = History()
    history.ops = [tuple(op) for op in saved["history"]]
    persistent = {c for c, d in saved["clients"].items() if not d.get("clean")}
    connections = saved["check"]["connections_per_client"]
    pauses = pauses_of(saved.get("events", []), saved.get("faults", []))
    result: ChaosCheck | SharedCheck
    if saved.get("shared"):
        windows = windows_of(saved.get("events", []), saved.get("faults", []))
        lost_links = saved.get("link_loss_windows")
        if lost_links is None and saved.get("workdir") and saved.get("wall0"):  # (a run kept with --keep)
            logs = node_logs({p.stem: p for p in Path(saved["workdir"]).glob("*.log")})
            lost_links = link_losses(logs, saved["wall0"], max((op[0] for op in history.ops), default=0.0))
        windows += lost_links or []
        result = check_shared(history, persistent, saved.get("settle", 2.0), connections, pauses, windows)
    else:
        result = check(history, persistent, saved.get("settle", 2.0), connections, pauses)
    print(json.dumps(result.summary(), indent=1))
    if saved.get("completed"):  # (the run's row, judged again)
        print(table_header(bool(saved.get("shared"))) + "\n" + row({**saved, "check": result.summary()}))
    return 1 if result.failed else 0


if __name__ == "__main__":
    sys.exit(main())
