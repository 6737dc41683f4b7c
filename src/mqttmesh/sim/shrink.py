"""Shrinking a failing scenario: smaller variants that still fail the same way.

Pure, given its predicate: ``shrink(scenario, fails)`` tries smaller variants of the
scenario in a fixed order (no fault at all, then one fault fewer at a time; fewer nodes;
fewer subscribers and publishers; a lower publish rate; a shorter run; a full mesh) and
keeps each one for which ``fails`` is still true, until no variant fails or ``max_runs``
runs are spent. The seed never changes, so the result is the same at every call. Running
a variant is the predicate's business (sim/fuzz_run.py runs the simulator and asks whether
the same invariant broke).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from .scenario import Clients, Fault, Scenario, Topology
from .topology import node_names

__all__ = ["Shrunk", "shrink", "fault_groups", "with_nodes"]

Variant = tuple[str, Scenario]


@dataclass
class Shrunk:
    scenario: Scenario
    runs: int = 0  # variants run
    steps: list[str] = field(default_factory=list)  # the variants kept, in order


def shrink(
    sc: Scenario, fails: Callable[[Scenario], bool], max_runs: int = 50, log: Callable[[str], None] | None = None
) -> Shrunk:
    """The smallest variant of ``sc`` found for which ``fails`` holds (``sc`` itself must)."""
    out = Shrunk(sc)
    progress = True
    while progress and out.runs < max_runs:
        progress = False
        passed: set[str] = set()  # variants that did not fail, not tried again in this pass
        for step in (_fewer_faults, _fewer_nodes, _fewer_clients, _shorter, _simpler_topology):
            kept = True
            while kept and out.runs < max_runs:  # the step again, on what it kept
                kept = False
                for name, variant in step(out.scenario):
                    if name in passed:
                        continue
                    if out.runs >= max_runs:
                        break
                    out.runs += 1
                    kept = fails(variant)
                    if log is not None:
                        log(f"  shrink {out.runs:3d}: {name}: {'still fails, kept' if kept else 'passes'}")
                    if not kept:
                        passed.add(name)
                        continue
                    out.scenario = variant
                    out.steps.append(name)
                    progress = True
                    break
    return out


# ---------------------------------------------------------------- fault groups


def fault_groups(faults: list[Fault]) -> list[list[int]]:
    """The faults as groups that only make sense together (indices into ``faults``): a crash
    and the restart of its node, a partition and its heal, a link taken down and brought up,
    a link slowed and restored; a stall alone."""
    groups: list[list[int]] = []
    open_: dict[tuple[str, Any], int] = {}  # what a later fault closes -> its group
    for i, f in enumerate(faults):
        key = _closes(f)
        if key is not None and key in open_:
            groups[open_.pop(key)].append(i)
            continue
        opens = _opens(f)
        if opens is not None:
            open_[opens] = len(groups)
        groups.append([i])
    return groups


def _opens(f: Fault) -> tuple[str, Any] | None:
    p = f.params
    if f.kind == "crash":
        return ("node", p.get("node"))
    if f.kind == "partition":
        return ("cut", None)
    if f.kind in ("link_down", "latency"):
        return (f.kind, tuple(p.get("link", ())))
    return None


def _closes(f: Fault) -> tuple[str, Any] | None:
    p = f.params
    if f.kind == "restart":
        return ("node", p.get("node"))
    if f.kind == "heal":
        return ("cut", None)
    if f.kind == "link_up":
        return ("link_down", tuple(p.get("link", ())))
    if f.kind == "latency":
        return ("latency", tuple(p.get("link", ())))
    return None


def _without(sc: Scenario, drop: set[int]) -> Scenario:
    out = copy.deepcopy(sc)
    out.faults = [f for i, f in enumerate(out.faults) if i not in drop]
    return out


def _fewer_faults(sc: Scenario) -> Iterator[Variant]:
    groups = fault_groups(sc.faults)
    if len(groups) > 1:
        yield "no fault", _without(sc, set(range(len(sc.faults))))
    for g in groups:
        what = ", ".join(_fault_text(sc.faults[i]) for i in g)
        yield f"without {what}", _without(sc, set(g))


def _fault_text(f: Fault) -> str:
    return f"{f.kind} at {f.at}s " + " ".join(f"{k}={v}" for k, v in sorted(f.params.items()))


# ---------------------------------------------------------------- numbers


def _smaller(value: int, lowest: int) -> list[int]:
    """Smaller values to try, the smallest first: lowest, halfway, one less."""
    return sorted({v for v in (lowest, (lowest + value) // 2, value - 1) if lowest <= v < value})


def _fewer_nodes(sc: Scenario) -> Iterator[Variant]:
    for n in _smaller(sc.topology.nodes, 3):
        yield f"{n} nodes", with_nodes(sc, n)


def _fewer_clients(sc: Scenario) -> Iterator[Variant]:
    c = sc.clients
    for n in _smaller(c.persistent, 1):
        out = copy.deepcopy(sc)
        out.clients.persistent = n
        yield f"{n} persistent subscriber{'s' if n != 1 else ''}", out
    for n in _smaller(c.publishers, 0):
        out = copy.deepcopy(sc)
        out.clients.publishers = n
        if not n:  # (what only publishers use: back to the defaults, which changes nothing)
            default = Clients()
            out.clients.publish_rate = default.publish_rate
            out.clients.qos = default.qos
            out.clients.shared = default.shared
            out.clients.publisher_persistent = default.publisher_persistent
        yield f"{n} publisher{'s' if n != 1 else ''}", out
    for n in _smaller(c.groups, 0):
        out = copy.deepcopy(sc)
        out.clients.groups = n
        yield f"{n} shared group{'s' if n != 1 else ''}", out
    for n in _smaller(c.members, 1) if c.groups else ():
        out = copy.deepcopy(sc)
        out.clients.members = n
        yield f"{n} member{'s' if n != 1 else ''} per group", out
    if c.groups and c.member_persistent:  # (each member's own draw: the others stay what they were)
        out = copy.deepcopy(sc)
        out.clients.member_persistent = 0.0
        yield "no persistent member", out
    if c.publishers and c.publisher_persistent:  # (each publisher's own draw, as for members)
        out = copy.deepcopy(sc)
        out.clients.publisher_persistent = 0.0
        yield "no persistent publisher", out
    if c.publishers and c.publish_rate > 0.5:
        out = copy.deepcopy(sc)
        out.clients.publish_rate = max(0.5, round(c.publish_rate / 2, 2))
        yield f"publish rate {out.clients.publish_rate}/s", out


def _shorter(sc: Scenario) -> Iterator[Variant]:
    """A shorter run: the faults that would not be over before the drain go."""
    duration = max(sc.drain + 6.0, float(round(sc.duration * 0.7)))
    if duration >= sc.duration:
        return
    last = duration - sc.drain
    late = {i for g in fault_groups(sc.faults) if any(sc.faults[j].at > last for j in g) for i in g}
    out = _without(sc, late)
    out.duration = duration
    yield f"{duration:g} s", out


def _simpler_topology(sc: Scenario) -> Iterator[Variant]:
    t = sc.topology
    if t.kind != "full" and t.nodes <= 16:
        out = copy.deepcopy(sc)
        out.topology = Topology(kind="full", nodes=t.nodes, latency_ms=t.latency_ms)
        out.faults = [f for f in out.faults if f.kind != "partition" or "isolate_site" not in f.params]
        out.faults = [out.faults[i] for g in fault_groups(out.faults) for i in g if _complete(out.faults, g)]
        yield "a full mesh", out


def _complete(faults: list[Fault], group: list[int]) -> bool:
    """A group whose opening fault is still there (a heal alone is harmless, but pointless)."""
    return _closes(faults[group[0]]) is None or len(group) > 1


# ---------------------------------------------------------------- fewer nodes


def with_nodes(sc: Scenario, n: int) -> Scenario:
    """``sc`` on ``n`` nodes: node ``i`` keeps its number; a fault group naming a node that is
    gone, or a link the new topology lacks, goes (the topology is drawn again for ``n``)."""
    from .fuzz import scenario_graph  # (the graph the Simulator will build)

    out = copy.deepcopy(sc)
    t = out.topology
    old, new = node_names(t.nodes), node_names(n)
    rename = {a: new[i] for i, a in enumerate(old) if i < n}
    t.nodes = n
    if t.kind == "sites":
        t.sites = max(1, min(t.sites, n // 2))
    edges = set(scenario_graph(out).latency)
    keep: list[Fault] = []
    for g in fault_groups(out.faults):
        moved = [_renamed(out.faults[i], rename, edges, t.sites) for i in g]
        if all(f is not None for f in moved):
            keep += [f for f in moved if f is not None]
    out.faults = sorted(keep, key=lambda f: f.at)
    return out


def _renamed(f: Fault, rename: dict[str, str], edges: set[tuple[str, str]], sites: int) -> Fault | None:
    p = dict(f.params)
    if "node" in p and p["node"] not in ("random", "last"):
        if p["node"] not in rename:
            return None
        p["node"] = rename[p["node"]]
    if isinstance(p.get("link"), list):
        a, b = (rename.get(x) for x in p["link"])
        if a is None or b is None or (min(a, b), max(a, b)) not in edges:
            return None
        p["link"] = [a, b]
    if "isolate" in p:
        p["isolate"] = [rename[x] for x in p["isolate"] if x in rename]
        if not p["isolate"] or len(p["isolate"]) == len(rename):
            return None
    if "groups" in p:
        p["groups"] = [g for g in ([rename[x] for x in g if x in rename] for g in p["groups"]) if g]
        if len(p["groups"]) < 2:
            return None
    if "grow" in p:
        p["grow"] = min(p["grow"], len(rename) - 1)
    if "isolate_site" in p and p["isolate_site"] >= sites:
        return None
    return Fault(f.at, f.kind, p, f.label)
