"""``mqttmesh simulate --fuzz N``: run the drawn scenarios of N seeds, judge, shrink what fails.

Each seed's scenario (sim/fuzz.py) runs on the simulator with every invariant checked
and none stopping the run; a seed whose run broke an invariant is printed with it, its
scenario written (``--out``), and shrunk (sim/shrink.py) to a smaller scenario that breaks
the same invariant, printed and written as TOML that ``mqttmesh simulate FILE`` replays.
The last line says how many seeds ran, the violations per invariant and the failing seeds.
Exit status 1 when any seed broke an invariant.
"""

from __future__ import annotations

import copy
import random
import time
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from .core import Simulator
from .fuzz import describe, draw_scenario
from .scenario import Scenario, ScenarioError
from .scenario_dump import dump_scenario
from .shrink import Shrunk, shrink

__all__ = ["Verdict", "SeedResult", "judge", "fuzz_seed", "fuzz", "summary_line", "main_fuzz"]

EXCEPTION = "simulator.exception"  # the run raised: a bug of the cluster code or of the simulator
# what each run reports: what it gave the invariants to judge, and how they broke (the
# cluster summary's counts), so that a sweep can tell one finding's signature from another's
_COUNTS = (
    "handover_checked",
    "wills_checked",
    "registration_checks",
    "sessions_resumed_checked",
    "handover_lost",
    "qos2_twice",
    "wills_missing",
    "wills_twice",
    "wills_unwanted",
    "sessions_not_present",
    "order_checked",
    # persistent publishers (sim/sessions.py; 0 in a run without them)
    "persistent_publishers",
    "publisher_moves",
    "publisher_resends",
    "reorders_same_connection",
    "reorders_across_connections",
    # MQTT 5 (sim/history5.py; 0 in a run without MQTT 5 clients)
    "mqtt5_clients",
    "expiring_checked",
    "expiring_dropped",
    "delivered_after_expiry",
    "begun_before_expiry",
    "handover_may_expire",
    "handover_session_ended",
    "sessions_expired_checked",
    "sessions_unexpired_checked",
    "sessions_expiry_broken",
    "wills_delayed_checked",
    "wills_delayed_cancelled",
    "wills_delayed_due",
    "wills_delayed_broken",
)


@dataclass
class Verdict:
    """What one run broke: invariant -> violations, and the first message of each."""

    violated: dict[str, int] = field(default_factory=dict)
    first: dict[str, str] = field(default_factory=dict)
    wall: float = 0.0
    events: int = 0
    counts: dict[str, int] = field(default_factory=dict)  # judged and broken (_COUNTS), stalls, moves
    digest: str = ""  # of the clients' history: equal digests, equal runs


def judge(sc: Scenario) -> Verdict:
    """Run ``sc`` to its end with every invariant checked (none stops the run). A run that
    raises is the violation ``simulator.exception``; ScenarioError (a scenario that cannot
    run) is raised."""
    sc = copy.deepcopy(sc)
    sc.checks.fail = False
    started = time.perf_counter()
    sim = Simulator(sc)
    verdict = Verdict()
    try:
        sim.run()
    except ScenarioError:
        raise
    except Exception as exc:  # the fuzzer reports it as a finding, with where it was raised
        where = traceback.extract_tb(exc.__traceback__)[-1]
        verdict.violated[EXCEPTION] = 1
        verdict.first[EXCEPTION] = f"{type(exc).__name__}: {exc} ({where.filename}:{where.lineno})"
    verdict.wall = time.perf_counter() - started
    verdict.events = sim.events
    for invariant, count in sim.violations.count.items():
        verdict.violated[invariant] = count
    for item in sim.violations.items:
        invariant, _, message = item[1:].partition("] ")
        verdict.first.setdefault(invariant, message)
    if EXCEPTION not in verdict.violated:
        cl = sim.cluster_summary()
        verdict.counts = {k: cl[k] for k in _COUNTS} | {"moves": sum(cl["moves"].values())}
        verdict.counts |= {k: v for k, v in sim.stall_counts.items() if k != "held"}
        shared = cl.get("shared") or {}  # (a run with shared groups: sim/members.py)
        verdict.counts |= {f"shared_{k}": v for k, v in shared.items() if isinstance(v, int) and k != "links"}
        verdict.digest = cl["history_digest"]
    return verdict


def still_fails(invariant: str) -> Callable[[Scenario], bool]:
    """The shrinker's predicate: the variant breaks ``invariant`` (one that cannot run does not)."""

    def fails(sc: Scenario) -> bool:
        try:
            return invariant in judge(sc).violated
        except ScenarioError:
            return False

    return fails


@dataclass
class SeedResult:
    seed: int
    nodes: int
    kind: str
    faults: dict[str, int]  # fault kinds drawn (the opening fault of each)
    verdict: Verdict
    mqtt5: float = 0.0  # the share of its clients drawn to speak MQTT 5 (0: a 3.1.1 run)
    shrunk: dict[str, Shrunk] = field(default_factory=dict)  # invariant -> its shrunk scenario
    invalid: str = ""  # the drawn scenario could not run (a bug of the generator)


def fuzz_seed(seed: int) -> SeedResult:
    """Draw and judge the scenario of one seed (no shrinking)."""
    sc = draw_scenario(seed)
    kinds: dict[str, int] = {}
    for f in sc.faults:
        if f.kind not in ("restart", "heal", "link_up"):
            kinds[f.kind] = kinds.get(f.kind, 0) + 1
    result = SeedResult(seed, sc.topology.nodes, sc.topology.kind, kinds, Verdict(), mqtt5=sc.clients.mqtt5)
    try:
        result.verdict = judge(sc)
    except ScenarioError as exc:
        result.invalid = str(exc)
        result.verdict.violated["fuzz.invalid_scenario"] = 1
    return result


def fuzz(
    seeds: Iterable[int],
    out: Path | None = None,
    shrinking: str = "all",
    max_runs: int = 50,
    log: Callable[[str], None] = print,
    results: Iterable[SeedResult] | None = None,
) -> list[SeedResult]:
    """Judge every seed (or take ``results`` already judged, in seed order), then shrink the
    failures: ``shrinking`` "all", "first" (the first seed breaking each invariant) or "none"."""
    done: list[SeedResult] = []
    shrunk_for: set[str] = set()
    source = results if results is not None else (fuzz_seed(s) for s in seeds)
    for r in source:
        done.append(r)
        log(seed_line(r))
        if not r.verdict.violated:
            continue
        sc = draw_scenario(r.seed)
        if out is not None:
            out.mkdir(parents=True, exist_ok=True)
            (out / f"fuzz-{r.seed}.toml").write_text(dump_scenario(sc))
        for invariant in sorted(r.verdict.violated):
            log(f"  seed {r.seed} violated {invariant}: {r.verdict.first.get(invariant, r.invalid)}")
            if invariant == "fuzz.invalid_scenario" or shrinking == "none":
                continue
            if shrinking == "first" and invariant in shrunk_for:
                continue
            shrunk_for.add(invariant)
            log(f"  shrinking seed {r.seed} for {invariant} (at most {max_runs} runs)")
            s = r.shrunk[invariant] = shrink(sc, still_fails(invariant), max_runs, log)
            s.scenario.name = f"fuzz-{r.seed}-{invariant.replace('.', '-')}"
            s.scenario.description = f"Shrunk ({s.runs} runs) for {invariant}. " + describe(s.scenario)
            text = dump_scenario(s.scenario)
            log(f"  smallest scenario still breaking {invariant} ({', '.join(s.steps) or 'nothing removed'}):")
            log("\n".join("    " + line for line in text.splitlines()))
            if out is not None:
                path = out / f"{s.scenario.name}.toml"
                path.write_text(text)
                log(f"  wrote {path}")
    return done


def seed_line(r: SeedResult) -> str:
    faults = ", ".join(f"{n} {k}" for k, n in sorted(r.faults.items())) or "no fault"
    v5 = f", MQTT 5 {r.mqtt5:.0%}" if r.mqtt5 else ""
    what = f"seed {r.seed}: {r.nodes} nodes ({r.kind}){v5}, {faults}, {r.verdict.wall:.1f}s"
    if not r.verdict.violated:
        return f"{what}: ok"
    return f"{what}: VIOLATED " + ", ".join(f"{k} ({n})" for k, n in sorted(r.verdict.violated.items()))


def summary_line(results: list[SeedResult]) -> str:
    per: dict[str, list[int]] = {}
    for r in results:
        for invariant in r.verdict.violated:
            per.setdefault(invariant, []).append(r.seed)
    failing = sorted({r.seed for r in results if r.verdict.violated})
    seeds = [r.seed for r in results]
    span = f" ({min(seeds)}..{max(seeds)})" if seeds else ""
    run = f"fuzz: {len(results)} seed{'s' if len(results) != 1 else ''} run{span}"
    if not per:
        return f"{run}, no invariant violated"
    each = "; ".join(
        f"{k} on {len(v)} seed{'s' if len(v) > 1 else ''} ({', '.join(map(str, v))})" for k, v in sorted(per.items())
    )
    return f"{run}, violations: {each}; failing seeds: {' '.join(map(str, failing))}"


def main_fuzz(count: int, first: int | None, out: str | None, shrinking: str, max_runs: int) -> int:
    if first is None:
        first = random.SystemRandom().randrange(1, 1_000_000)  # (which seeds; every run is seeded)
    print(f"fuzz: {count} seed{'s' if count != 1 else ''} from {first} (--seed {first} repeats them)", flush=True)
    results = fuzz(
        range(first, first + count),
        Path(out) if out else None,
        shrinking,
        max_runs,
        log=lambda line: print(line, flush=True),
    )
    print(summary_line(results))
    return 1 if any(r.verdict.violated for r in results) else 0
