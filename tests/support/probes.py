"""The measuring side of the hostile suite: a canary client, /proc probes, plain clients.

Shared by the hostile test suite (tests/hostile/) and the Mosquitto comparison
(``python -m bench.hostile``). Nothing here knows which broker it talks to: a
``Target`` names its address, its PID (for the /proc probes) and the settings an
attack needs to judge the result. Everything on the wire is built by
tests/support/mqttraw.py, which shares no code with mqttmesh.

The canary is a well-behaved client pair that round-trips a QoS 1 message every
100 ms; ``run_attack`` runs an attack (tests/support/attacks.py) with the canary
measuring before, during and after it, and adds the canary's criterion to the
attack's ``Outcome``: every round trip within 2 s.
"""

from __future__ import annotations

import os
import random
import re
import socket
import struct
import threading
import time
from dataclasses import dataclass, field

from support import mqttraw
from support.mqttraw import CONNACK, PUBACK, PUBLISH, SUBACK, Closed, Packet

CANARY_LIMIT = 2.0  # seconds: the bound on every canary round trip

# what an unhandled exception leaves in a node's log (asyncio's handler, a dying task, a crash)
LOG_PROBLEMS = re.compile(
    r"Traceback|Exception in callback|Task exception was never retrieved|"
    r"exception was never retrieved|RuntimeError|Unhandled exception|"
    r"ERROR asyncio|CRITICAL"
)


def log_problems(text: str, limit: int = 12) -> list[str]:
    """The lines of a log that show an unhandled exception (at most ``limit``)."""
    lines = [ln for ln in text.splitlines() if LOG_PROBLEMS.search(ln)]
    return lines[:limit] + ([f"... and {len(lines) - limit} more"] if len(lines) > limit else [])


# --------------------------------------------------------------------------- target


@dataclass
class Target:
    """One broker (or a mesh: the canary publishes at ``port``, subscribes at ``sub_port``)."""

    name: str
    host: str
    port: int
    pid: int
    sub_port: int | None = None
    users: dict[str, str] = field(default_factory=dict)  # logins that work: user -> password
    login: tuple[str, str] | None = None  # what the canary and helpers log in with
    connect_timeout: float | None = None
    slow_consumer_timeout: float | None = None
    max_connections: int | None = None
    max_packet_size: int = 1024 * 1024
    tls_port: int | None = None
    log: object = None  # () -> the broker's log text, if known

    @property
    def credentials(self) -> dict:
        if self.login is None:
            return {}
        return {"username": self.login[0], "password": self.login[1]}


# --------------------------------------------------------------------------- probes (/proc)


def _status_kb(pid: int, key: str) -> int:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise KeyError(key)


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of ``pid`` so far (None when it is gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            raw = fh.read()
    except OSError:
        return None
    fields = raw[raw.rindex(b")") + 2 :].split()  # the name may hold spaces and parentheses
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_kb(pid: int) -> int:
    """Resident set size of ``pid`` (VmRSS), in kB."""
    return _status_kb(pid, "VmRSS")


def peak_rss_kb(pid: int) -> int:
    """The largest resident set ``pid`` ever had (VmHWM), in kB."""
    return _status_kb(pid, "VmHWM")


def socket_fds(pid: int) -> int:
    """Open sockets of ``pid``: its /proc/PID/fd links that read ``socket:[...]``."""
    n = 0
    fd_dir = f"/proc/{pid}/fd"
    for name in os.listdir(fd_dir):
        try:
            if os.readlink(f"{fd_dir}/{name}").startswith("socket:"):
                n += 1
        except OSError:
            pass  # closed while we looked
    return n


class RssWatch:
    """The largest RSS of a process over a stretch of time: sampled on a thread, and its
    VmHWM (which catches a peak between two samples when it is a new all-time high)."""

    def __init__(self, pid: int, interval: float = 0.005):
        self.pid = pid
        self.interval = interval
        self.base = rss_kb(pid)
        self._hwm0 = peak_rss_kb(pid)
        self.peak = self.base
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="rss-watch")
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.peak = max(self.peak, rss_kb(self.pid))
            except (OSError, KeyError):
                return
            self._stop.wait(self.interval)

    def stop(self) -> int:
        """Growth over the baseline at the peak, in kB."""
        self._stop.set()
        self._thread.join(5)
        try:
            hwm = peak_rss_kb(self.pid)
        except (OSError, KeyError):
            hwm = self._hwm0
        peak = max(self.peak, hwm if hwm > self._hwm0 else 0)
        return max(0, peak - self.base)


def wait_until(predicate, timeout: float, interval: float = 0.02):
    """``predicate()``'s first truthy value within ``timeout`` seconds, else None."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            return None
        time.sleep(interval)


# --------------------------------------------------------------------------- clients


def loopback(i: int) -> str:
    """The i-th extra loopback address: 127.0.0.2, 127.0.0.3, ... (never anything off this host)."""
    return f"127.0.{i // 250}.{2 + i % 250}"


def open_socket(
    host: str, port: int, source: str | None = None, rcvbuf: int | None = None, timeout: float = 5.0
) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        if rcvbuf is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)  # before connect: the window
        if source is not None:
            sock.bind((source, 0))
        sock.settimeout(timeout)
        sock.connect((host, port))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    except BaseException:
        sock.close()
        raise
    return sock


def reset(sock: socket.socket) -> None:
    """Close with a TCP reset (SO_LINGER on, zero timeout), as a crashed device would."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    sock.close()


class Raw(mqttraw.RawClient):
    """mqttraw's blocking client, optionally from another loopback address or with a small
    receive buffer."""

    def __init__(
        self, host: str, port: int, timeout: float = 5.0, source: str | None = None, rcvbuf: int | None = None
    ):
        self.sock = open_socket(host, port, source, rcvbuf, timeout)
        self.buf = b""
        self.timeout = timeout

    def reset(self) -> None:
        reset(self.sock)


def connack_code(p: Packet) -> int:
    if p.type != CONNACK or len(p.body) != 2:
        raise AssertionError(f"not a CONNACK: {p!r}")
    return p.body[1]


def connect_client(host: str, port: int, client_id: str, timeout: float = 5.0, source=None, rcvbuf=None, **kw) -> Raw:
    """A connection that was accepted (CONNACK 0); raises otherwise. CONNACK 0x03 (server
    unavailable: a mesh node that has not learned the mesh yet, issue 20) is tried again
    within ``timeout``, as a client does."""
    deadline = time.monotonic() + timeout
    while True:
        c = Raw(host, port, timeout, source, rcvbuf)
        try:
            c.send(mqttraw.connect(client_id=client_id, **kw))
            rc = connack_code(c.recv())
            if rc == 3 and time.monotonic() < deadline:
                c.close()
                time.sleep(0.05)  # (between two attempts, as a client backs off)
                continue
            if rc != 0:
                raise AssertionError(f"{client_id}: CONNACK {rc:#04x}")
        except BaseException:
            c.close()
            raise
        return c


def sys_values(target, topic_filter: str = "$SYS/broker/#", timeout: float = 2.0) -> dict[str, str]:
    """The broker's retained ``$SYS`` values under ``topic_filter`` (empty if it publishes
    none, e.g. started with ``--sys-interval 0``); for the text of a failure, not a check."""
    seen: dict[str, str] = {}
    try:
        c = connect_client(
            target.host,
            target.port,
            f"sys-read-{os.getpid()}-{time.monotonic_ns() % 10**9}",
            timeout,
            keepalive=0,
            **target.credentials,
        )
    except (AssertionError, OSError):
        return seen
    try:
        subscribe(c, 1, (topic_filter, 0), timeout=timeout)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                p = c.recv(min(0.3, max(0.01, deadline - time.monotonic())))
            except (TimeoutError, Closed, OSError):
                break  # (retained values come at once after the SUBACK: a pause means all came)
            if p.type == PUBLISH:
                seen[p.topic] = p.payload.decode(errors="replace")
    finally:
        c.close()
    return seen


def subscribe(c: Raw, pid: int, *filters, timeout: float = 5.0) -> list[int]:
    """SUBSCRIBE and the SUBACK's return codes (PUBLISHes before the SUBACK are dropped)."""
    c.send(mqttraw.subscribe(pid, *filters))
    deadline = time.monotonic() + timeout
    while True:
        p = c.recv(max(0.0, deadline - time.monotonic()))
        if p.type == SUBACK and p.packet_id == pid:
            return list(p.body[2:])
        if p.type != PUBLISH:
            raise AssertionError(f"expected SUBACK, got {p!r}")


def try_connect(
    host: str, port: int, client_id: str, timeout: float = 2.0, source=None, **kw
) -> tuple[int | None, float]:
    """(CONNACK return code or None when the server closed without one, seconds taken).

    None also when nothing came within ``timeout`` (the connection is then given up)."""
    t0 = time.monotonic()
    try:
        c = Raw(host, port, timeout, source)
    except OSError:
        return None, time.monotonic() - t0
    try:
        c.send(mqttraw.connect(client_id=client_id, **kw))
        p = c.recv(timeout)
        rc = connack_code(p)
        if rc == 0:
            c.send(mqttraw.DISCONNECT_BYTES)
        return rc, time.monotonic() - t0
    except (Closed, TimeoutError, OSError):
        return None, time.monotonic() - t0
    finally:
        c.close()


def closed_within(sock: socket.socket, timeout: float) -> tuple[bool, bytes, str]:
    """Read until the peer closes; (closed?, what it sent first, how: "eof"/"reset")."""
    deadline = time.monotonic() + timeout
    got = b""
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False, got, ""
        sock.settimeout(remaining)
        try:
            data = sock.recv(65536)
        except TimeoutError:
            return False, got, ""
        except ConnectionResetError:
            return True, got, "reset"
        except OSError as exc:
            return True, got, f"error {exc.errno}"
        if not data:
            return True, got, "eof"
        if len(got) < 4096:
            got += data[: 4096 - len(got)]


def wait_sockets(pid: int, baseline: int, timeout: float) -> float | None:
    """Seconds until the process holds at most ``baseline`` sockets (None: not in time)."""
    t0 = time.monotonic()
    return time.monotonic() - t0 if wait_until(lambda: socket_fds(pid) <= baseline, timeout) else None


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..1) of a non-empty list."""
    ordered = sorted(values)
    k = max(0, min(len(ordered) - 1, int(-(-q * len(ordered) // 1)) - 1))
    return ordered[k]


def median(values: list[float]) -> float:
    ordered = sorted(values)
    n = len(ordered)
    return ordered[n // 2] if n % 2 else (ordered[n // 2 - 1] + ordered[n // 2]) / 2


# --------------------------------------------------------------------------- canary


class Canary:
    """A well-behaved client pair that measures QoS 1 round trips every ``interval``.

    The publisher sends a QoS 1 PUBLISH on the canary's own topic; a round trip ends when
    both its PUBACK and the delivery to the canary's subscriber (which acknowledges it)
    have arrived. A round trip that takes longer than ``wait`` seconds is recorded as a
    failure (latency None) and the next one starts. Each sample carries the phase that was
    current when it started ("before", "during", "after", ...). A connection the broker
    closes is a failure too; the canary then connects again, as a real device would.
    """

    def __init__(self, target: Target, tag: str, interval: float = 0.1, wait: float = 5.0, source: str | None = None):
        self.target = target
        self.tag = tag
        self.topic = f"canary/{tag}"
        self.interval = interval
        self.wait = wait
        self.source = source
        self.samples: list[tuple[str, float | None]] = []  # (phase, latency or None)
        self.errors: list[str] = []
        self.current = "warmup"
        self._lock = threading.Condition()
        self._delivered: dict[int, float] = {}
        self._stop = threading.Event()
        self._pub: Raw | None = None
        self._sub: Raw | None = None
        self._threads: list[threading.Thread] = []

    # connections -----------------------------------------------------------------------

    def _connect_sub(self) -> Raw:
        t = self.target
        c = connect_client(
            t.host, t.sub_port or t.port, f"canary-sub-{self.tag}", source=self.source, keepalive=0, **t.credentials
        )
        codes = subscribe(c, 1, (self.topic, 1))
        if codes != [1]:
            c.close()
            raise AssertionError(f"canary subscription refused: {codes}")
        return c

    def _connect_pub(self) -> Raw:
        t = self.target
        return connect_client(
            t.host, t.port, f"canary-pub-{self.tag}", source=self.source, keepalive=0, **t.credentials
        )

    def start(self, warmup: float = 15.0) -> Canary:
        """Connect, and wait until one round trip works (a mesh needs the subscription to
        spread first); the warm-up round trips are not samples."""
        self._sub = self._connect_sub()
        self._pub = self._connect_pub()
        self._threads = [threading.Thread(target=self._read_sub, daemon=True, name="canary-sub")]
        self._threads[0].start()
        deadline = time.monotonic() + warmup
        seq = 0
        while True:
            seq += 1
            if self._round_trip(-seq, min(1.0, max(0.05, deadline - time.monotonic()))) is not None:
                break
            if time.monotonic() > deadline:
                self.stop()
                raise AssertionError(f"the canary never completed a round trip in {warmup:g}s")
        self.errors.clear()
        t = threading.Thread(target=self._run, daemon=True, name="canary-pub")
        self._threads.append(t)
        t.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(self.wait + 2)
        for c in (self._pub, self._sub):
            if c is not None:
                try:
                    c.send(mqttraw.DISCONNECT_BYTES)
                except OSError:
                    pass
                c.close()

    # threads ---------------------------------------------------------------------------

    def _read_sub(self) -> None:
        while not self._stop.is_set():
            sub = self._sub
            if sub is None:
                self._sub = self._reconnect(self._connect_sub)
                continue
            try:
                p = sub.recv(0.2)
            except TimeoutError:
                continue
            except (Closed, OSError) as exc:
                if self._stop.is_set():
                    return
                self.errors.append(f"{time.strftime('%X')} subscriber connection lost: {exc!r}")
                self._sub = self._reconnect(self._connect_sub)
                continue
            if p.type != PUBLISH:
                continue
            now = time.monotonic()
            try:
                if p.qos:
                    sub.send(mqttraw.puback(p.packet_id))
                seq = int(p.payload.split(b":")[0])
            except (ValueError, OSError):
                continue
            with self._lock:
                self._delivered[seq] = now
                self._lock.notify_all()

    def _reconnect(self, connect):
        """A new connection, trying for up to ``wait`` seconds (None if none came)."""
        deadline = time.monotonic() + self.wait
        while not self._stop.is_set() and time.monotonic() < deadline:
            try:
                return connect()
            except (OSError, AssertionError, Closed, TimeoutError) as exc:
                self.errors.append(f"{time.strftime('%X')} reconnect failed: {exc!r}")
                self._stop.wait(0.2)
        return None

    def _round_trip(self, seq: int, wait: float) -> float | None:
        """One QoS 1 publish to ourselves; its latency, or None on timeout or error."""
        pid = abs(seq) % 65535 + 1
        t0 = time.monotonic()
        deadline = t0 + wait
        pub = self._pub
        if pub is None:
            self._pub = self._reconnect(self._connect_pub)
            return None
        try:
            pub.send(mqttraw.publish(self.topic, f"{seq}:".encode() + b"c" * 32, qos=1, pid=pid))
            acked = None
            while acked is None:
                p = pub.recv(max(0.0, deadline - time.monotonic()))
                if p.type == PUBACK and p.packet_id == pid:
                    acked = time.monotonic()
        except TimeoutError:
            return None
        except (Closed, OSError) as exc:
            self.errors.append(f"{time.strftime('%X')} publisher connection lost: {exc!r}")
            self._pub = self._reconnect(self._connect_pub)
            return None
        with self._lock:
            while seq not in self._delivered:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                self._lock.wait(remaining)
            delivered = self._delivered.pop(seq)
        return max(acked, delivered) - t0

    def _run(self) -> None:
        seq = 0
        next_at = time.monotonic()
        while not self._stop.is_set():
            seq += 1
            phase = self.current
            latency = self._round_trip(seq, self.wait)
            if phase != "warmup":
                with self._lock:
                    self.samples.append((phase, latency))
                    self._lock.notify_all()
            next_at = max(next_at + self.interval, time.monotonic())
            self._stop.wait(max(0.0, next_at - time.monotonic()))

    # phases and figures --------------------------------------------------------------

    def phase(self, name: str, samples: int = 0, timeout: float = 30.0) -> None:
        """Start phase ``name``; with ``samples``, wait until it has that many."""
        self.current = name
        if samples:
            self.wait_samples(name, samples, timeout)

    def wait_samples(self, name: str, n: int, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        with self._lock:
            while sum(1 for ph, _ in self.samples if ph == name) < n:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self._stop.is_set():
                    return
                self._lock.wait(remaining)

    def latencies(self, phase: str | None = None) -> list[float | None]:
        with self._lock:
            return [lat for ph, lat in self.samples if phase is None or ph == phase]

    def summary(self, phase: str | None = None) -> dict:
        lats = self.latencies(phase)
        ok = [x for x in lats if x is not None]
        failures = sum(1 for x in lats if x is None)
        out = {"n": len(lats), "failures": failures}
        if ok:
            out.update(p50=percentile(ok, 0.5), p99=percentile(ok, 0.99), max=max(ok))
        if failures:
            out["max"] = float("inf")
            out["p99"] = out["p99"] if failures <= 0.01 * len(lats) and ok else float("inf")
        return out

    def phases(self) -> list[str]:
        with self._lock:
            seen = []
            for ph, _ in self.samples:
                if ph not in seen:
                    seen.append(ph)
            return seen

    def report(self) -> str:
        parts = []
        for ph in self.phases():
            parts.append(f"{ph}: {format_summary(self.summary(ph))}")
        text = "canary round trips " + "; ".join(parts)
        if self.errors:
            text += "\ncanary errors: " + "; ".join(self.errors[:5])
        return text

    def problems(self, limit: float = CANARY_LIMIT, phases=("before", "during", "after")) -> list[str]:
        """The canary criterion: samples in every phase, each round trip within ``limit``."""
        out = []
        for ph in phases:
            lats = self.latencies(ph)
            if not lats:
                out.append(f"the canary has no round trip in phase {ph!r}")
                continue
            slow = [x for x in lats if x is None or x > limit]
            if slow:
                worst = "a timeout" if any(x is None for x in slow) else f"{max(slow):.2f}s"
                out.append(
                    f"canary: {len(slow)} of {len(lats)} round trips {ph} the attack "
                    f"took over {limit:g}s (worst: {worst})"
                    if ph in ("before", "during", "after")
                    else f"canary: {len(slow)} of {len(lats)} round trips in {ph!r} took over "
                    f"{limit:g}s (worst: {worst})"
                )
        return out


def format_summary(s: dict) -> str:
    if not s.get("n"):
        return "no samples"

    def ms(x):
        return "timeout" if x == float("inf") else f"{x * 1000:.0f} ms"

    text = f"n={s['n']}"
    if "p50" in s:
        text += f" p50 {ms(s['p50'])} p99 {ms(s['p99'])} max {ms(s['max'])}"
    if s["failures"]:
        text += f" ({s['failures']} timed out)"
    return text


# --------------------------------------------------------------------------- outcomes


@dataclass
class Outcome:
    attack: str
    problems: list[str] = field(default_factory=list)
    figures: dict = field(default_factory=dict)
    canary: dict = field(default_factory=dict)  # phase -> summary
    canary_report: str = ""
    notes: list[str] = field(default_factory=list)

    @property
    def held(self) -> bool:
        return not self.problems

    def report(self) -> str:
        lines = [f"attack {self.attack!r}: " + ("held" if self.held else "FAILED")]
        lines += [f"  - {p}" for p in self.problems]
        if self.figures:
            lines.append("  figures: " + ", ".join(f"{k}={_fmt(v)}" for k, v in self.figures.items()))
        if self.canary_report:
            lines.append("  " + self.canary_report.replace("\n", "\n  "))
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.report()


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.3g}"
    return str(v)


def run_attack(
    target: Target,
    attack,
    *args,
    tag: str | None = None,
    canary_source: str | None = None,
    before: int = 5,
    after: int = 10,
    canary: Canary | None = None,
    **kw,
) -> Outcome:
    """Run ``attack(target, canary, *args, **kw) -> Outcome`` with a canary measuring
    round trips before (``before`` samples), during and after (``after`` samples)."""
    own = canary is None
    if own:
        canary = Canary(
            target, tag or f"{attack.__name__}-{os.getpid()}-{random.getrandbits(24):x}", source=canary_source
        ).start()
    try:
        canary.phase("before", samples=before)
        canary.phase("during")
        outcome = attack(target, canary, *args, **kw)
        canary.wait_samples("during", 1, timeout=10.0)  # a short attack still gets one
        canary.phase("after", samples=after, timeout=10.0)
    finally:
        if own:
            canary.stop()
    outcome.canary = {ph: canary.summary(ph) for ph in canary.phases() if ph != "warmup"}
    outcome.canary_report = canary.report()
    outcome.problems += canary.problems()
    return outcome
