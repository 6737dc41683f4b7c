"""The nemesis: a seeded fault schedule (pure), and its execution against a Cluster.

``schedule`` is a pure function of a ``random.Random``, the node names, the linked pairs and
the run's length: the same seed gives the same faults at the same offsets. First every fault
kind once, one at a time with quiet gaps (in a seeded order), then overlapping faults; every
fault ends (is healed) before ``duration``. ``Nemesis`` applies a schedule in real time and
reports each heal (to measure reconvergence) through ``on_heal``, saying whether it healed
the only fault then holding (``alone``).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .proxy import BLACKHOLE, CUT

KINDS = ("kill", "pause", "partition-cut", "partition-blackhole", "flap")


@dataclass
class Fault:
    fid: int
    kind: str
    start: float
    end: float
    node: str = ""  # kill, pause
    sides: tuple[tuple[str, ...], tuple[str, ...]] = ((), ())  # partitions
    link: tuple[str, str] = ("", "")  # flap
    toggles: list[float] = field(default_factory=list)  # flap: offsets of cut/heal flips
    overlapping: bool = False

    def describe(self) -> str:
        if self.kind in ("kill", "pause"):
            return f"{self.kind} {self.node}"
        if self.kind == "flap":
            return f"flap {self.link[0]}-{self.link[1]} ({len(self.toggles)} flips)"
        return f"{self.kind} {','.join(self.sides[0])} | {','.join(self.sides[1])}"

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.fid,
            "kind": self.kind,
            "start": round(self.start, 3),
            "end": round(self.end, 3),
            "what": self.describe(),
            "overlapping": self.overlapping,
            "node": self.node,
            "sides": [list(x) for x in self.sides],
            "link": list(self.link),
        }


def _make(
    rng: random.Random, fid: int, kind: str, start: float, dur: float, names: list[str], pairs: list[tuple[str, str]]
) -> Fault:
    f = Fault(fid, kind, start, start + dur)
    if kind in ("kill", "pause"):
        f.node = rng.choice(names)
    elif kind.startswith("partition"):
        shuffled = names[:]
        rng.shuffle(shuffled)
        half = len(names) // 2
        f.sides = (tuple(sorted(shuffled[:half])), tuple(sorted(shuffled[half:])))
    else:
        f.link = rng.choice(pairs)
        t = start
        while True:
            t += rng.uniform(0.1, 0.4)
            if t >= f.end:
                break
            f.toggles.append(t)
    return f


def schedule(
    rng: random.Random,
    names: list[str],
    pairs: list[tuple[str, str]],
    duration: float,
    max_pause: float = 5.0,
    warmup: float = 3.0,
    end_margin: float = 2.0,
    kinds: tuple[str, ...] | None = None,
) -> list[Fault]:
    """Faults over [warmup, duration - end_margin]: each kind once in turn, then overlapping ones.
    ``kinds``: only these, each once, nothing overlapping (a run with one chosen fault)."""
    faults: list[Fault] = []
    last = duration - end_margin
    order = list(KINDS if kinds is None else kinds)
    rng.shuffle(order)
    t = warmup
    # phase 1: one at a time, quiet gaps between; every kind once, whatever the length
    for kind in order:
        dur = rng.uniform(1.0, max_pause) if kind == "pause" else rng.uniform(1.5, 4.0)
        if t + dur > last:
            dur = max(0.5, last - t)
        faults.append(_make(rng, len(faults), kind, t, dur, names, pairs))
        t += dur + rng.uniform(1.5, 3.0)
    if kinds is not None:
        return faults
    # phase 2: overlapping faults; at most (N-1)//2 nodes down or paused at once, not one twice
    max_down = max(1, (len(names) - 1) // 2)
    while True:
        t += rng.uniform(0.5, 2.5)
        kind = rng.choice(KINDS)
        dur = rng.uniform(1.0, max_pause) if kind == "pause" else rng.uniform(2.0, 6.0)
        if t + dur > last:
            break
        f = _make(rng, len(faults), kind, t, dur, names, pairs)
        f.overlapping = True
        if kind in ("kill", "pause"):
            busy = {g.node for g in faults if g.node and g.start <= t < g.end}
            free = [n for n in names if n not in busy]
            if len(busy) >= max_down or not free:
                continue
            f.node = rng.choice(free)
        faults.append(f)
    return faults


def pauses_of(events: list[dict[str, Any]], faults: list[Any]) -> dict[str, list[tuple[float, float]]]:
    """node -> (stop, continue) times of the pauses in ``events`` (``Nemesis.events``, or the
    same saved in a run's JSON with its ``faults``, as dicts or Faults)."""
    node = {}
    for f in faults:
        d = f if isinstance(f, dict) else f.as_dict()
        if d["kind"] == "pause":
            node[d["id"]] = d["what"].split()[-1]  # ("pause NODE")
    began: dict[int, float] = {}
    out: dict[str, list[tuple[float, float]]] = {}
    for e in events:
        fid = e["fault"]
        if fid not in node:
            continue
        if e["step"] == "start":
            began[fid] = e["t"]
        elif e["step"] == "end" and fid in began:
            out.setdefault(node[fid], []).append((began.pop(fid), e["t"]))
    return out


def windows_of(events: list[dict[str, Any]], faults: list[Any]) -> list[dict[str, Any]]:
    """Each fault as it was applied: its ``as_dict`` with ``start`` and ``end`` the times of its
    start and end steps in ``events`` (a fault never ended: ``end`` infinite)."""
    out: dict[int, dict[str, Any]] = {}
    for f in faults:
        d = dict(f if isinstance(f, dict) else f.as_dict())
        out[d["id"]] = d
    began: dict[int, float] = {}
    ended: dict[int, float] = {}
    for e in events:
        if e["step"] == "start":
            began[e["fault"]] = e["t"]
        elif e["step"] == "end":
            ended[e["fault"]] = e["t"]
    never = float("inf")
    return [{**d, "start": began[i], "end": ended.get(i, never)} for i, d in sorted(out.items()) if i in began]


class Nemesis:
    """Applies a schedule; ``t0`` is the run's clock origin (time.monotonic())."""

    def __init__(
        self, cluster: Any, faults: list[Fault], on_heal: Callable[[str, float, bool], None], log: Callable[[str], None]
    ):
        self.cluster = cluster
        self.faults = faults
        self.on_heal = on_heal
        self.log = log
        self.applied: dict[str, int] = {k: 0 for k in KINDS}
        self.healed: dict[str, int] = {k: 0 for k in KINDS}
        self.events: list[dict[str, Any]] = []
        self.active: set[int] = set()
        self.t0 = time.monotonic()

    def pauses(self) -> dict[str, list[tuple[float, float]]]:
        """node -> (stop, continue) of each SIGSTOP applied, as it happened (a step may come
        later than scheduled: the one before it, a restart, takes a moment)."""
        return pauses_of(self.events, self.faults)

    def _steps(self) -> list[tuple[float, int, str, Fault]]:
        steps: list[tuple[float, int, str, Fault]] = []
        for f in self.faults:
            steps.append((f.start, 0, "start", f))
            for i, t in enumerate(f.toggles):
                steps.append((t, 1, "heal-flip" if i % 2 else "cut-flip", f))
            steps.append((f.end, 2, "end", f))
        return sorted(steps, key=lambda s: (s[0], s[1], s[3].fid))

    def run(self, t0: float, stop: Callable[[], bool]) -> None:
        self.t0 = t0
        try:
            for at, _, step, f in self._steps():
                while time.monotonic() - t0 < at:  # a schedule, not a wait for a condition
                    if stop():
                        return
                    time.sleep(min(0.02, max(0.0, at - (time.monotonic() - t0))))
                self._do(step, f, time.monotonic() - t0)
        finally:
            self.heal_all(time.monotonic() - t0)

    def _do(self, step: str, f: Fault, now: float) -> None:
        token = f"f{f.fid}"
        c = self.cluster
        if step == "start":
            self.active.add(f.fid)
            self.applied[f.kind] += 1
            self.log(f"[{now:7.2f}s] nemesis: {f.describe()}")
            if f.kind == "kill":
                c.nodes[f.node].kill9()
            elif f.kind == "pause":
                c.nodes[f.node].pause()
            elif f.kind.startswith("partition"):
                mode = CUT if f.kind == "partition-cut" else BLACKHOLE
                for p in c.links_between(set(f.sides[0]), set(f.sides[1])):
                    p.hold(token, mode)
            else:
                self._flap(f, token, True)
        elif step == "cut-flip":
            self._flap(f, token, True)
        elif step == "heal-flip":
            self._flap(f, token, False)
        else:
            self._end(f, token)
            now = time.monotonic() - self.t0  # a restart takes a moment: the heal is when it is done
            self.log(f"[{now:7.2f}s] nemesis: healed {f.describe()}")
            self.on_heal(f.describe(), now, not self.active)
        self.events.append({"t": round(now, 3), "step": step, "fault": f.fid})

    def _flap(self, f: Fault, token: str, cut: bool) -> None:
        a, b = f.link
        for p in self.cluster.path_links(a, b):
            if cut:
                p.hold(token, CUT)
            else:
                p.release(token)

    def _end(self, f: Fault, token: str) -> None:
        if f.fid not in self.active:
            return
        self.active.discard(f.fid)
        c = self.cluster
        if f.kind == "kill":
            c.nodes[f.node].start()
        elif f.kind == "pause":
            c.nodes[f.node].resume()
        else:
            for p in c.links.values():
                p.release(token)
        self.healed[f.kind] += 1

    def heal_all(self, now: float) -> None:
        """Whatever is still broken (an interrupted run) is healed."""
        for f in self.faults:
            if f.fid in self.active:
                self._end(f, f"f{f.fid}")
                self.on_heal(f.describe(), now, False)
