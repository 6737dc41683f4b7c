"""The hostile attacks of issue 13 against mqttmesh and Mosquitto, side by side.

    python -m bench.hostile [--brokers mqttmesh,mosquitto] [--attacks name,...] [--seed N]

Runs each attack that applies to a single broker (tests/support/attacks.py: the same code
as the test suite) against a fresh broker of each kind, configured alike (connect timeout,
connection limit, password file, TLS listener where the attack needs them), and prints a
Markdown table: the canary's round trips during the attack (p50/p99/max), the broker's RSS
growth (peak), the time to free a connection slot where that is the point, and whether the
broker held (every criterion of the attack met, canary within 2 s throughout).

Every process it starts is ended by PID when it finishes, also on Ctrl-C (bench.brokers).
"""

from __future__ import annotations

import argparse
import os
import pwd
import random
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from support import attacks, probes

from .brokers import MOSQUITTO, REGISTRY, BrokerError, _popen, free_port, stop_process, wait_for_port

REPO = Path(__file__).resolve().parent.parent

HOST = "127.0.0.1"
USERS = {"canary": "canary-pw", "alice": "wonderland", "bob": "builder", "slowcheck": "tortoise"}
CANARY_LOGIN = ("canary", USERS["canary"])


@dataclass
class Spec:
    """One attack and the broker set-up it needs."""

    name: str
    attack: object
    kwargs: dict = field(default_factory=dict)
    connect_timeout: float | None = None
    max_connections: int | None = None
    slow_consumer_timeout: float | None = None
    max_queued: int | None = None
    passwords: bool = False
    sys_interval: float | None = None
    tls: bool = False
    mqttmesh_extra: list = field(default_factory=list)  # settings issue 13 adds (optional_flags)
    mosquitto: str | None = ""  # None: does not apply to Mosquitto; else why it differs
    slot: str | None = None  # the figure that says how fast a slot was freed


def specs(seed: int) -> list[Spec]:
    rng = random.Random(seed)
    no_throttle = dict(auth_fail_threshold=1000)
    return [
        Spec("malformed packets", attacks.malformed_packets, connect_timeout=2),
        Spec("random bytes", attacks.random_bytes, {"rng": random.Random(rng.getrandbits(32))}, connect_timeout=2),
        Spec("slowloris", attacks.slowloris, connect_timeout=2),
        Spec("huge legal inputs", attacks.huge_inputs),
        Spec("2,000 connections", attacks.many_connections, {"n": 2000}),
        Spec("bad first byte / reserved flags", attacks.bad_first_bytes, connect_timeout=10),
        Spec("reset during fan-out", attacks.reset_during_fanout, {"rng": random.Random(rng.getrandbits(32))}),
        Spec("slow QoS 1 # subscriber", attacks.slow_acker, {"duration": 8.0}),
        Spec(
            "congested own topic",
            attacks.congested_own_topic,
            {"duration": 6.0, "burst": 1200, "rate": 2.0},
            max_queued=2000,
        ),
        Spec("stuck QoS 0 # reader", attacks.stuck_qos0_reader, {"duration": 4.0}),
        Spec(
            "dropped slow consumer",
            attacks.dropped_slow_consumer,
            slow_consumer_timeout=1,
            max_connections=4,
            slot="slot_freed_s",
            mosquitto=None,
        ),  # Mosquitto never drops a slow consumer: nothing to free
        Spec(
            "unverified CONNECT + 200 MB (wrong password)",
            attacks.unverified_connect_memory,
            {"variant": "wrong-password"},
            passwords=True,
            mqttmesh_extra=[no_throttle],
        ),
        Spec(
            "unverified CONNECT + 200 MB (slow check)",
            attacks.unverified_connect_memory,
            {"variant": "slow-check"},
            passwords=True,
            mqttmesh_extra=[no_throttle],
        ),
        Spec(
            "unverified CONNECT + 200 MB (20 sockets)",
            attacks.unverified_connect_memory,
            {"variant": "many-sockets"},
            passwords=True,
            mqttmesh_extra=[no_throttle],
        ),
        Spec(
            "failed-login throttling",
            attacks.login_throttling,
            {"attempts": 9, "budget": 15.0, "sys_topic": "$SYS/broker/connections/auth_failures"},
            passwords=True,
            sys_interval=1,
            mqttmesh_extra=[dict(auth_fail_threshold=3, auth_fail_delay=0.2, auth_fail_delay_max=1.6)],
        ),
        Spec(
            "20 bad logins/s (CPU)",
            attacks.login_cpu,
            {"rate": 20.0, "duration": 5.0},
            passwords=True,
            mqttmesh_extra=[no_throttle],
        ),
        Spec(
            "user-name timing oracle",
            attacks.user_oracle,
            {"samples": 15},
            passwords=True,
            mqttmesh_extra=[no_throttle],
        ),
        Spec(
            "idle TLS handshakes",
            attacks.idle_tls_handshakes,
            {"n": 20},
            tls=True,
            connect_timeout=2,
            max_connections=22,
            slot="last_closed_s",
            mosquitto="max_connections is per listener in Mosquitto; it has no connect timeout",
        ),
    ]


# --------------------------------------------------------------------------- brokers


class Broker:
    kind = "?"

    def __init__(self, workdir: Path):
        self.workdir = workdir
        self.proc = None
        self.log_path: Path | None = None

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc)
            self.proc = None

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace") if self.log_path else ""
        except OSError:
            return ""


class Mqttmesh(Broker):
    kind = "mqttmesh"

    def __init__(self, workdir: Path, python: str):
        super().__init__(workdir)
        self.python = python

    def version(self) -> str:
        out = subprocess.run(
            [self.python, "-m", "mqttmesh", "--version"], capture_output=True, text=True, timeout=30, cwd=REPO
        )
        return (out.stdout or out.stderr).strip()

    def make_passwords(self) -> Path:
        path = self.workdir / "passwd"
        for user, password in USERS.items():
            subprocess.run(
                [self.python, "-m", "mqttmesh", "passwd", str(path), user, "-b", password],
                check=True,
                capture_output=True,
                timeout=60,
                cwd=REPO,
            )
        return path

    def start(self, spec: Spec, pki: Path | None, passwd: Path | None) -> probes.Target:
        port_file = self.workdir / "node.port"
        port_file.unlink(missing_ok=True)
        self.log_path = self.workdir / f"mqttmesh-{int(time.time() * 1000)}.log"
        args = [
            "--host",
            HOST,
            "--port",
            "0",
            "--port-file",
            str(port_file),
            "--sys-interval",
            str(spec.sys_interval or 0),
        ]
        if spec.connect_timeout:
            args += ["--connect-timeout", str(spec.connect_timeout)]
        if spec.max_connections:
            args += ["--max-connections", str(spec.max_connections)]
        if spec.slow_consumer_timeout:
            args += ["--slow-consumer-timeout", str(spec.slow_consumer_timeout)]
        if spec.max_queued:
            args += ["--max-queued", str(spec.max_queued)]
        if passwd is not None:
            args += ["--password-file", str(passwd), "--allow-anonymous", "false"]
        tls_port = None
        if spec.tls:
            tls_port = free_port()
            args += [
                "--tls-port",
                str(tls_port),
                "--tls-cert",
                str(pki / "node.pem"),
                "--tls-key",
                str(pki / "node.key"),
            ]
        for extra in spec.mqttmesh_extra:
            args += attacks.optional_flags(self.python, **extra)
        self.proc = _popen([self.python, "-m", "mqttmesh", "broker", *args], self.log_path, cwd=REPO)
        deadline = time.monotonic() + 20
        while not port_file.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise BrokerError(f"mqttmesh did not start: {self.log()[-2000:]}")
            time.sleep(0.05)
        port = int(port_file.read_text())
        wait_for_port(HOST, port, deadline, self.proc)
        return probes.Target(
            "mqttmesh",
            HOST,
            port,
            self.proc.pid,
            users=dict(USERS) if passwd else {},
            login=CANARY_LOGIN if passwd else None,
            connect_timeout=spec.connect_timeout or 10.0,
            slow_consumer_timeout=spec.slow_consumer_timeout or 5.0,
            max_connections=spec.max_connections,
            tls_port=tls_port,
            log=self.log,
        )


class Mosquitto(Broker):
    kind = "mosquitto"

    def version(self) -> str:
        out = subprocess.run([MOSQUITTO, "-h"], capture_output=True, text=True, timeout=10)
        first = (out.stdout + out.stderr).splitlines()
        return first[0] if first else "?"

    def make_passwords(self) -> Path:
        path = self.workdir / "mosquitto.passwd"
        path.unlink(missing_ok=True)
        for i, (user, password) in enumerate(USERS.items()):
            subprocess.run(
                ["mosquitto_passwd", *(["-c"] if i == 0 else []), "-b", str(path), user, password],
                check=True,
                capture_output=True,
                timeout=30,
            )
        return path

    def start(self, spec: Spec, pki: Path | None, passwd: Path | None) -> probes.Target:
        port = free_port()
        self.log_path = self.workdir / f"mosquitto-{int(time.time() * 1000)}.log"
        conf = self.workdir / "mosquitto.conf"
        listener_opts = ""
        if spec.max_connections:
            listener_opts += f"max_connections {spec.max_connections}\n"
        lines = [
            # started as root, mosquitto switches to the user "mosquitto" unless told otherwise
            f"user {pwd.getpwuid(os.getuid()).pw_name}",
            "per_listener_settings false",
            f"listener {port} {HOST}",
            listener_opts,
            "set_tcp_nodelay true",
            "persistence false",
            # as mqttmesh's defaults: limits.max_packet_size, max_inflight, max_queued
            "max_packet_size 1048576",
            "max_inflight_messages 100",
            f"log_dest file {self.log_path}",
            "log_type error",
            "log_type warning",
            "log_type notice",
        ]
        lines.append(f"max_queued_messages {spec.max_queued or 10000}")
        if spec.sys_interval:
            lines.append(f"sys_interval {int(spec.sys_interval)}")
        if passwd is not None:
            lines += [f"password_file {passwd}", "allow_anonymous false"]
        else:
            lines.append("allow_anonymous true")
        tls_port = None
        if spec.tls:
            tls_port = free_port()
            lines += [
                f"listener {tls_port} {HOST}",
                listener_opts,
                f"certfile {pki / 'node.pem'}",
                f"keyfile {pki / 'node.key'}",
            ]
        conf.write_text("\n".join(lines) + "\n")
        self.proc = _popen([MOSQUITTO, "-c", str(conf)], self.workdir / "mosquitto.stdout")
        wait_for_port(HOST, port, time.monotonic() + 10, self.proc)
        return probes.Target(
            "mosquitto",
            HOST,
            port,
            self.proc.pid,
            users=dict(USERS) if passwd else {},
            login=CANARY_LOGIN if passwd else None,
            connect_timeout=spec.connect_timeout or 10.0,
            slow_consumer_timeout=spec.slow_consumer_timeout,
            max_connections=spec.max_connections,
            tls_port=tls_port,
            log=self.log,
        )


# --------------------------------------------------------------------------- running


@dataclass
class Row:
    attack: str
    broker: str
    outcome: probes.Outcome | None = None
    rss_growth_mb: float | None = None
    log_problems: int = 0
    skipped: str = ""


def run_one(broker: Broker, spec: Spec, pki, passwd) -> Row:
    row = Row(spec.name, broker.kind)
    target = broker.start(spec, pki, passwd if spec.passwords else None)
    try:
        watch = probes.RssWatch(target.pid, interval=0.01)
        try:
            row.outcome = probes.run_attack(target, spec.attack, tag=f"bench-{random.getrandbits(24):x}", **spec.kwargs)
        finally:
            row.rss_growth_mb = round(watch.stop() / 1024, 1)
    except Exception as exc:  # an attack the broker makes impossible (it refused a set-up step)
        row.outcome = probes.Outcome(spec.name, problems=[f"attack aborted: {exc!r}"])
    finally:
        broker.stop()
    row.log_problems = len(probes.log_problems(broker.log(), limit=10_000))
    return row


def ms(x) -> str:
    if x is None:
        return "-"
    return "timeout" if x == float("inf") else f"{x * 1000:.0f}"


def table(rows: list[Row], brokers: list[str]) -> str:
    out = [
        "| attack | broker | canary p50 / p99 / max during (ms) | RSS growth (MB) | slot freed (s) | "
        "result | figures |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        if row.skipped:
            out.append(f"| {row.attack} | {row.broker} | - | - | - | n/a: {row.skipped} | |")
            continue
        o = row.outcome
        during = o.canary.get("during", {})
        canary = f"{ms(during.get('p50'))} / {ms(during.get('p99'))} / {ms(during.get('max'))}"
        slot = o.figures.get("slot_freed_s", o.figures.get("last_closed_s", "-"))
        slot = "never" if slot is None else slot
        result = "held" if o.held else "failed: " + o.problems[0].split(":")[0][:70]
        if row.log_problems:
            result += f" ({row.log_problems} exception lines in the log)"
        figures = ", ".join(
            f"{k} {v}" for k, v in o.figures.items() if k not in ("rss_growth_mb", "slot_freed_s", "last_closed_s")
        )
        out.append(f"| {row.attack} | {row.broker} | {canary} | {row.rss_growth_mb} | {slot} | {result} | {figures} |")
    return "\n".join(out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.hostile", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--brokers", default="mqttmesh,mosquitto")
    p.add_argument("--attacks", default="", help="comma-separated substrings of attack names")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--python", default=None, help="the Python that runs mqttmesh (default: .venv's)")
    args = p.parse_args(argv)
    seed = args.seed if args.seed is not None else random.randrange(1 << 32)
    venv_python = REPO / ".venv" / "bin" / "python"
    python = args.python or (str(venv_python) if venv_python.exists() else sys.executable)
    wanted = [a.strip() for a in args.attacks.split(",") if a.strip()]
    chosen = [s for s in specs(seed) if not wanted or any(w in s.name for w in wanted)]
    kinds = [k.strip() for k in args.brokers.split(",") if k.strip()]
    if "mosquitto" in kinds and not os.access(MOSQUITTO, os.X_OK):
        print(f"{MOSQUITTO} not installed: mosquitto left out", file=sys.stderr)
        kinds.remove("mosquitto")
    print(f"seed {seed}", file=sys.stderr)
    workdir = Path(tempfile.mkdtemp(prefix="hostile-bench-"))
    rows: list[Row] = []
    versions = {}
    try:
        pki = attacks.make_pki(workdir) if shutil.which("openssl") else None
        for kind in kinds:
            broker = Mqttmesh(workdir, python) if kind == "mqttmesh" else Mosquitto(workdir)
            versions[kind] = broker.version()
            passwd = broker.make_passwords() if any(s.passwords for s in chosen) else None
            for spec in chosen:
                if kind == "mosquitto" and spec.mosquitto is None:
                    rows.append(Row(spec.name, kind, skipped="Mosquitto does not drop slow consumers"))
                    continue
                if spec.tls and pki is None:
                    rows.append(Row(spec.name, kind, skipped="no openssl command"))
                    continue
                t0 = time.monotonic()
                row = run_one(broker, spec, pki, passwd)
                rows.append(row)
                print(
                    f"{kind:>9} {spec.name}: {'held' if row.outcome.held else 'FAILED'} ({time.monotonic() - t0:.0f}s)",
                    file=sys.stderr,
                )
                for problem in row.outcome.problems:
                    print(f"            - {problem[:300]}", file=sys.stderr)
    finally:
        REGISTRY.kill_all()
        shutil.rmtree(workdir, ignore_errors=True)
    rows.sort(key=lambda r: ([s.name for s in chosen].index(r.attack), kinds.index(r.broker)))
    print(f"Hostile attacks (issue 13), seed {seed}: " + ", ".join(f"{k} {v}" for k, v in versions.items()))
    print()
    print(table(rows, kinds))
    notes = [f"- {s.name}, Mosquitto: {s.mosquitto}" for s in chosen if s.mosquitto and "mosquitto" in kinds]
    if notes:
        print()
        print("\n".join(notes))
    for kind in kinds:
        held = sum(1 for r in rows if r.broker == kind and r.outcome is not None and r.outcome.held)
        ran = sum(1 for r in rows if r.broker == kind and r.outcome is not None)
        print(f"\n{kind}: held {held} of {ran}", end="")
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
