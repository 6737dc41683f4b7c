"""Where a node's CPU goes during a benchmark run: py-spy's samples and strace's syscall counts.

``start_pyspy`` and ``start_strace`` start, after ``delay`` seconds and for ``seconds``, one
``py-spy record`` (collapsed stacks, ``--format raw``, native frames, one line per function)
or one ``strace -c -f`` per node process; every process started is in ``bench.brokers``'
REGISTRY and is ended by its PID. ``summarize`` reads the collapsed stacks of the nodes of a
run and counts, per function, the samples where it was running (self) and where it was on
the stack (total); ``syscalls`` reads strace's tables. Both need root (ptrace), as the bench
runs here. bench/mesh_cost.py ``--profile DIR`` / ``--strace SECONDS`` drive them.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from .brokers import REGISTRY, stop_process

PYSPY_RATE = 100  # samples a second (py-spy's default)
WAITING = "epoll_pwait ("


def _later(delay: float, argv: list[str], log: Path) -> subprocess.Popen:
    """``argv`` after ``delay`` seconds, as one process (``sh`` execs it: the PID stays)."""
    script = f"sleep {delay:.3f}; exec " + " ".join(_quote(a) for a in argv)
    with open(log, "ab") as fh:
        proc = subprocess.Popen(["sh", "-c", script], stdout=fh, stderr=subprocess.STDOUT)
    REGISTRY.add(proc)
    return proc


def _quote(a: str) -> str:
    return "'" + a.replace("'", "'\\''") + "'"


def pyspy() -> str | None:
    """The py-spy executable beside this Python, else on PATH."""
    import sys

    here = Path(sys.executable).with_name("py-spy")
    return str(here) if here.exists() else shutil.which("py-spy")


def start_pyspy(
    pids: list[int], delay: float, seconds: float, out: Path, label: str, native: bool = False
) -> list[subprocess.Popen]:
    exe = pyspy()
    if exe is None:
        raise RuntimeError("py-spy is not installed (pip install py-spy)")
    out.mkdir(parents=True, exist_ok=True)
    procs = []
    for i, pid in enumerate(pids):
        argv = [exe, "record", "--pid", str(pid), "--duration", f"{max(1, round(seconds))}"]
        argv += ["--rate", str(PYSPY_RATE), "--format", "raw", "--nolineno", "--threads"]
        # Only the thread holding the GIL: py-spy's idle detection counts a node's threads as
        # busy while they wait (in uvloop's epoll, in a futex, for the GIL), here 4 times the
        # CPU /proc shows; the GIL's holder is the one running Python (or a C call made with the
        # GIL held: uvloop's writes and reads). What runs without it (SQLite's work on the store
        # thread, the kernel's) is perf's to show (start_perf).
        argv += ["--gil", "--nonblocking"] + (["--native"] if native else [])
        argv += ["--output", str(out / f"{label}-n{i}.txt")]
        procs.append(_later(delay, argv, out / f"{label}-n{i}.pyspy.log"))
    return procs


def start_strace(pids: list[int], delay: float, seconds: float, out: Path, label: str) -> list[subprocess.Popen]:
    if shutil.which("strace") is None:
        raise RuntimeError("strace is not installed (apt-get install strace)")
    out.mkdir(parents=True, exist_ok=True)
    procs = []
    for i, pid in enumerate(pids):
        argv = ["timeout", "-s", "INT", f"{seconds:g}", "strace", "-c", "-f", "-q", "-p", str(pid)]
        argv += ["-o", str(out / f"{label}-n{i}.strace")]
        procs.append(_later(delay, argv, out / f"{label}-n{i}.strace.log"))
    return procs


def finish(procs: list[subprocess.Popen], timeout: float = 30.0) -> None:
    """Wait for the recorders to write their files, then end any left by PID."""
    for proc in procs:
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            pass
        stop_process(proc, grace=2.0)


# --------------------------------------------------------------------------- reading


@dataclass
class Profile:
    samples: int = 0
    self_: Counter = field(default_factory=Counter)
    total: Counter = field(default_factory=Counter)
    threads: Counter = field(default_factory=Counter)
    waiting: int = 0  # samples in epoll_pwait

    @property
    def working(self) -> int:
        return self.samples - self.waiting


_THREAD = re.compile(r"^thread \([^)]*\):\s*(.*)$")  # py-spy --threads: "thread (TID): NAME"
_PATH = re.compile(r"\((?:[^()]*?/)?((?:site-packages/)?[^()/]+(?:/[^()/]+)?)\)$")


def _frame(raw: str) -> str:
    """``fn (path/to/pkg/module.py)`` -> ``fn (pkg/module.py)``: short and stable."""
    raw = raw.strip()
    m = _PATH.search(raw)
    if not m:
        return raw
    return raw[: m.start()].strip() + f" ({m.group(1)})"


def summarize(paths: list[Path]) -> Profile:
    """Collapsed stacks (``frame;frame;... count``) of several files, added up."""
    prof = Profile()
    for path in paths:
        try:
            lines = path.read_text(errors="replace").splitlines()
        except OSError:
            continue
        for line in lines:
            stack, _, count = line.rpartition(" ")
            if not stack or not count.isdigit():
                continue
            n = int(count)
            frames = stack.split(";")
            thread = "?"
            m = _THREAD.match(frames[0])
            if m:
                thread = m.group(1) or "?"
                frames = frames[1:]
            frames = [_frame(f) for f in frames if f]
            if not frames:
                continue
            prof.samples += n
            prof.threads[thread] += n
            if frames[-1].startswith(WAITING):
                # a thread woken in epoll and not yet run, or the kernel's epoll work: on a
                # busy 2-core machine mostly the former (put apart: it is not the node's work)
                prof.waiting += n
                continue
            prof.self_[frames[-1]] += n
            for f in set(frames):
                prof.total[f] += n
    return prof


def profile_text(prof: Profile, top: int = 15) -> str:
    """Self time over every frame (Python and native); total time over Python functions only
    (the native frames of the loop are on every stack and say nothing); shares of the samples
    not in epoll_pwait."""
    if not prof.working:
        return "(no samples)"
    pct = lambda n: f"{n / prof.working * 100:5.1f} %"  # noqa: E731
    lines = [
        f"{prof.samples} samples ({prof.samples / PYSPY_RATE:.1f} s at {PYSPY_RATE} Hz), "
        f"{prof.waiting} of them in epoll_pwait (put apart); shares below of the other {prof.working}",
        "by thread: " + "; ".join(f"{k} {n / prof.samples * 100:.0f} %" for k, n in prof.threads.most_common(4)),
        "self time:",
    ]
    lines += [f"  {pct(n)}  {name}" for name, n in prof.self_.most_common(top)]
    lines.append("total time (Python functions on the stack, below 95 %):")
    python = [(f, n) for f, n in prof.total.most_common() if ".py)" in f and n < 0.95 * prof.working]
    lines += [f"  {pct(n)}  {name}" for name, n in python[:top]]
    return "\n".join(lines)


def syscalls(paths: list[Path]) -> Counter:
    """strace -c tables of several files, added up: syscall -> calls."""
    calls: Counter = Counter()
    for path in paths:
        try:
            text = path.read_text(errors="replace")
        except OSError:
            continue
        for line in text.splitlines():
            parts = line.split()
            # % time, seconds, usecs/call, calls, [errors,] syscall
            if len(parts) >= 5 and parts[0].replace(".", "").isdigit() and parts[-1] != "total":
                try:
                    calls[parts[-1]] += int(parts[3])
                except ValueError:
                    continue
    return calls


def syscalls_text(calls: Counter, messages: float, top: int = 10) -> str:
    total = sum(calls.values())
    if not total or not messages:
        return "(no strace counts)"
    head = f"{total} system calls over about {messages:,.0f} deliveries: {total / messages:.2f} per delivery"
    return head + "\n" + "\n".join(f"  {n / messages:6.2f}  {name}" for name, n in calls.most_common(top))


# --------------------------------------------------------------------------- perf

PERF_RATE = 499  # samples a second (cpu-clock: on-CPU time only, kernel included)


def start_perf(pids: list[int], delay: float, seconds: float, out: Path, label: str) -> list[subprocess.Popen]:
    """One ``perf record`` of every node process (all threads, kernel stacks included)."""
    if shutil.which("perf") is None:
        raise RuntimeError("perf is not installed (apt-get install linux-perf)")
    out.mkdir(parents=True, exist_ok=True)
    argv = ["perf", "record", "-F", str(PERF_RATE), "-g", "-p", ",".join(map(str, pids))]
    argv += ["-o", str(out / f"{label}.perf"), "--", "sleep", f"{seconds:g}"]
    return [_later(delay, argv, out / f"{label}.perf.log")]


_ROW = re.compile(r"^\s*([\d.]+)%\s+(.*?)\s*$")


def _perf_rows(path: Path, sort: str) -> tuple[int, list[tuple[float, str]]]:
    """(samples, [(share %, key)]) of ``perf report --sort SORT`` (self time, no call graph)."""
    cmd = ["perf", "report", "-i", str(path), "--no-children", "-g", "none", "--sort", sort, "--stdio"]
    try:
        text = subprocess.run(cmd, capture_output=True, text=True, timeout=300).stdout
    except (OSError, subprocess.TimeoutExpired):
        return 0, []
    samples = 0
    rows = []
    for line in text.splitlines():
        if line.startswith("# Samples:"):
            m = re.search(r"Samples:\s*([\d.]+)([KM]?)", line)
            if m:
                samples = int(float(m.group(1)) * {"": 1, "K": 1000, "M": 1_000_000}[m.group(2)])
        elif not line.startswith("#"):
            m = _ROW.match(line)
            if m:
                rows.append((float(m.group(1)), " ".join(m.group(2).split())))
    return samples, rows


def perf_text(paths: list[Path], seconds: float, top: int = 25) -> str:
    """On-CPU time of the recordings added up: by thread, by library, by symbol."""
    total = 0
    parts: dict[str, Counter] = {"comm": Counter(), "dso": Counter(), "dso,sym": Counter()}
    for path in paths:
        for sort, counter in parts.items():
            n, rows = _perf_rows(path, sort)
            if sort == "comm":
                total += n
            for pct, key in rows:
                counter[key] += pct * n / 100
    if not total:
        return "(no perf samples)"
    cores = total / PERF_RATE / (seconds * len(paths))
    lines = [f"{total} on-CPU samples at {PERF_RATE} Hz: {cores:.2f} cores over the recorded windows"]
    for sort, counter in parts.items():
        lines.append(f"by {sort}:")
        lines += [f"  {n / total * 100:5.1f} %  {key}" for key, n in counter.most_common(top if "sym" in sort else 6)]
    return "\n".join(lines)
