"""`mqttmesh simulate SCENARIO.toml` and `python -m mqttmesh.sim SCENARIO.toml`; with
`--fuzz N`, the scenarios of N seeds drawn at random (sim/fuzz_run.py).

Exit status: 0 when every invariant held, 1 when one was violated, 2 when the
scenario cannot run (a clear message names the key at fault).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

__all__ = ["main", "run", "add_arguments", "build_parser"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The simulate command's arguments (argparse only: the simulator is imported when it runs)."""
    p.add_argument("scenario", nargs="?", help="a scenario file (TOML; examples in scenarios/); not with --fuzz")
    p.add_argument(
        "--fuzz",
        type=int,
        metavar="N",
        help="run the cluster scenarios drawn from N consecutive seeds (from --seed, else a random one), "
        "shrink each that breaks an invariant; --out DIR: write the failing scenarios there",
    )
    p.add_argument(
        "--shrink",
        choices=("all", "first", "none"),
        default="all",
        help="with --fuzz: shrink every failing seed, the first of each invariant, or none (default all)",
    )
    p.add_argument("--shrink-runs", type=int, default=50, metavar="K", help="with --fuzz: runs per shrink (50)")
    p.add_argument("--out", metavar="DIR", help="write summary.json, summary.txt and the plots here")
    p.add_argument("--json", metavar="FILE", help="write the JSON summary to FILE ('-': standard output)")
    p.add_argument("--no-plots", action="store_true", help="with --out: no plots")
    p.add_argument("--seed", type=int, help="override the scenario's seed (--fuzz: the first seed)")
    p.add_argument("--duration", type=float, help="override the scenario's duration (seconds simulated)")
    p.add_argument(
        "--keep-going", action="store_true", help="collect every violated invariant instead of stopping at the first"
    )
    p.add_argument("-q", "--quiet", action="store_true", help="no progress lines, no text summary")


def build_parser(prog: str = "mqttmesh simulate") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog,
        description="Run a scenario of the mesh on the discrete-event "
        "simulator: the real routing engine, a simulated "
        "network, clock and clients.",
    )
    add_arguments(p)
    return p


def main(argv: list[str] | None = None, prog: str = "python -m mqttmesh.sim") -> int:
    return run(build_parser(prog).parse_args(argv), prog)


def run(args: argparse.Namespace, prog: str = "mqttmesh simulate") -> int:
    if args.fuzz is not None:
        if args.scenario is not None or args.fuzz < 1:
            print(f"{prog}: --fuzz N takes a number of seeds (at least 1) and no scenario file", file=sys.stderr)
            return 2
        from .fuzz_run import main_fuzz

        return main_fuzz(args.fuzz, args.seed, args.out, args.shrink, args.shrink_runs)
    if args.scenario is None:
        print(f"{prog}: a scenario file, or --fuzz N", file=sys.stderr)
        return 2
    return _run_scenario(args, prog)


def _run_scenario(args: argparse.Namespace, prog: str) -> int:
    from .checks import InvariantViolation
    from .core import Simulator
    from .report import format_text, summarize
    from .scenario import ScenarioError, load_scenario

    if args.out and not args.no_plots:
        from .plots import INSTALL_HINT, available

        if not available():  # say so before a run that may take minutes, not after it
            print(f"{prog}: {INSTALL_HINT} (or --no-plots)", file=sys.stderr)
            return 2
    try:
        scenario = load_scenario(args.scenario)
        if args.seed is not None:
            scenario.seed = args.seed
        if args.duration is not None:
            scenario.duration = args.duration
            scenario.faults = [f for f in scenario.faults if f.at <= args.duration]
        if args.keep_going:
            scenario.checks.fail = False
        progress = None if args.quiet else (lambda line: print(line, file=sys.stderr, flush=True))
        sim = Simulator(scenario, progress)
        failure = None
        try:
            sim.run()
        except InvariantViolation as exc:
            failure = str(exc)
    except ScenarioError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    summary = summarize(sim)
    if failure is not None:
        summary["invariants"]["stopped_at"] = failure
        summary["invariants"]["ok"] = False
    text = format_text(summary)
    if not args.quiet and args.json != "-":
        sys.stdout.write(text)
    if args.json:
        data = json.dumps(summary, indent=2, sort_keys=True, default=str)
        if args.json == "-":
            sys.stdout.write(data + "\n")
        else:
            Path(args.json).write_text(data + "\n")
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=True, default=str) + "\n")
        (out / "summary.txt").write_text(text)
        if not args.no_plots:
            from .plots import plot_run

            for path in plot_run(sim, summary, out):
                if not args.quiet:
                    print(f"wrote {path}", file=sys.stderr)
    if failure is not None:
        print(f"{prog}: invariant violated: {failure}", file=sys.stderr)
        return 1
    if not summary["invariants"]["ok"]:
        print(f"{prog}: invariants violated: {summary['invariants']['violation_counts']}", file=sys.stderr)
        return 1
    return 0
