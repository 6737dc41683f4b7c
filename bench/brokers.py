"""Brokers under test: start them on free loopback ports, measure their CPU, stop them.

A started broker (or a set of mqttmesh nodes) is described by a ``Target``:
the endpoints publishers connect to, the endpoints subscribers connect to, and
the PIDs whose CPU time is the broker's. For one broker both endpoint lists
are the same single endpoint; for a mesh, publishers go to one node and
subscribers to another, so every message crosses the mesh.

Every process started here is registered in ``REGISTRY`` and is killed by its
PID when the harness ends, also on Ctrl-C or an exception. Brokers also get
PR_SET_PDEATHSIG, so a harness killed with SIGKILL does not leave them behind.
"""

from __future__ import annotations

import ctypes
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from .ports import free_port

REPO = Path(__file__).resolve().parent.parent
HOST = "127.0.0.1"  # loopback only

AMQTT_VERSION = "0.12.1"
AMQTT_VENV = REPO / ".venv-amqtt"
MOSQUITTO = "/usr/sbin/mosquitto"

_CLK_TCK = os.sysconf("SC_CLK_TCK")


# --------------------------------------------------------------------------- small helpers


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    """Ask the kernel to send ``sig`` to this process when its parent dies (Linux prctl)."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, int(sig), 0, 0, 0)  # PR_SET_PDEATHSIG = 1
    except OSError:
        pass


def cpu_seconds(pid: int) -> float | None:
    """utime + stime of ``pid`` from /proc/PID/stat, in seconds (None if it is gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            raw = fh.read()
    except OSError:
        return None
    # the command name (field 2) may contain spaces and parentheses: split after the last ')'
    fields = raw[raw.rindex(b")") + 2 :].split()
    utime, stime = int(fields[11]), int(fields[12])  # fields 14 and 15 of proc(5)
    return (utime + stime) / _CLK_TCK


def machine_cpu() -> tuple[float, float]:
    """(busy, total) jiffies of all CPUs from /proc/stat; busy counts softirq (loopback TCP) too."""
    with open("/proc/stat") as fh:
        values = [int(x) for x in fh.readline().split()[1:]]
    total = sum(values[:8])  # guest time is already inside user
    idle = values[3] + values[4]  # idle + iowait
    return total - idle, total


def wait_for_port(host: str, port: int, deadline: float, proc: subprocess.Popen | None = None) -> None:
    """Until a TCP connect to host:port succeeds; raises on deadline or if ``proc`` exits."""
    while True:
        if proc is not None and proc.poll() is not None:
            raise BrokerError(f"exited with code {proc.returncode} before listening")
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise BrokerError(f"not listening on {host}:{port} after start timeout")
        time.sleep(0.05)


class BrokerError(Exception):
    pass


class ProcessRegistry:
    """Every process the harness starts, so that all of them can be ended by PID."""

    def __init__(self):
        self._procs: list = []  # subprocess.Popen or multiprocessing.Process

    def add(self, proc) -> None:
        self._procs.append(proc)

    def discard(self, proc) -> None:
        if proc in self._procs:
            self._procs.remove(proc)

    def kill_all(self) -> None:
        for proc in list(self._procs):
            stop_process(proc, grace=1.0)
        self._procs.clear()


REGISTRY = ProcessRegistry()


def stop_process(proc, grace: float = 3.0) -> None:
    """SIGTERM, wait up to ``grace`` seconds, then SIGKILL; for Popen and multiprocessing.Process."""
    is_popen = isinstance(proc, subprocess.Popen)
    alive = (proc.poll() is None) if is_popen else proc.is_alive()
    if alive:
        try:
            proc.terminate()
        except (ProcessLookupError, OSError):
            pass
        try:
            if is_popen:
                proc.wait(timeout=grace)
            else:
                proc.join(grace)
        except subprocess.TimeoutExpired:
            pass
        still = (proc.poll() is None) if is_popen else proc.is_alive()
        if still:
            try:
                proc.kill()
            except (ProcessLookupError, OSError):
                pass
            if is_popen:
                try:
                    proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    pass
            else:
                proc.join(5)
    elif not is_popen:
        proc.join(0.1)
    REGISTRY.discard(proc)


def _popen(argv: list[str], log_path: Path, **kw) -> subprocess.Popen:
    log = open(log_path, "ab")
    try:
        proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, preexec_fn=die_with_parent, **kw
        )
    finally:
        log.close()  # the child has its own copy of the descriptor
    REGISTRY.add(proc)
    return proc


# --------------------------------------------------------------------------- targets


@dataclass(frozen=True)
class Endpoint:
    host: str
    port: int
    path: str | None = None  # MQTT over WebSocket at this path (None: plain TCP)

    def __str__(self) -> str:
        return f"ws://{self.host}:{self.port}{self.path}" if self.path else f"{self.host}:{self.port}"


@dataclass
class Target:
    """Where the load generator connects: publisher i uses pub_endpoints[i % len], subscriber j
    sub_endpoints[j % len]. ``pids`` are the broker processes whose CPU time is measured."""

    name: str
    pub_endpoints: list[Endpoint]
    sub_endpoints: list[Endpoint]
    pids: list[int] = field(default_factory=list)
    protocol: int = 4  # the MQTT protocol level its clients speak (5: a ``-v5`` broker)
    nodes: list[Endpoint] = field(default_factory=list)  # every node's, in start order (a mesh)

    def pub_endpoint(self, i: int) -> Endpoint:
        return self.pub_endpoints[i % len(self.pub_endpoints)]

    def sub_endpoint(self, j: int) -> Endpoint:
        return self.sub_endpoints[j % len(self.sub_endpoints)]

    def cpu_seconds(self) -> float | None:
        total = 0.0
        for pid in self.pids:
            t = cpu_seconds(pid)
            if t is None:
                return None
            total += t
        return total


# --------------------------------------------------------------------------- brokers


class BrokerServer:
    """One broker kind. ``start`` returns a Target; ``stop`` ends every process it started."""

    name = "?"

    def __init__(self, workdir: Path):
        self.workdir = workdir
        self.procs: list[subprocess.Popen] = []
        self.log_paths: list[Path] = []
        self.target: Target | None = None

    # why a broker cannot run at all (not installed, ...), or None
    def unavailable(self) -> str | None:
        return None

    def version(self) -> str:
        return "?"

    def start(self) -> Target:
        raise NotImplementedError

    def use_defaults(self, on: bool) -> None:
        """Start with the broker's own default limits (True) or the large ones set for the
        benchmark (False) from the next ``start`` on."""

    def alive(self) -> bool:
        return bool(self.procs) and all(p.poll() is None for p in self.procs)

    def exit_codes(self) -> list[int | None]:
        return [p.poll() for p in self.procs]

    def stop(self) -> None:
        for proc in self.procs:
            stop_process(proc)
        self.procs = []
        self.target = None

    def log_problems(self, limit: int = 20) -> list[str]:
        """Warning/error lines and tracebacks from this broker's logs (for the report)."""
        out: list[str] = []
        pattern = re.compile(r"WARNING|ERROR|CRITICAL|Traceback|Error:|exception", re.I)
        for path in self.log_paths:
            try:
                text = path.read_text(errors="replace")
            except OSError:
                continue
            for line in text.splitlines():
                if pattern.search(line) and not self._benign(line):
                    out.append(line.strip()[:300])
        if len(out) > limit:
            out = out[:limit] + [f"... and {len(out) - limit} more"]
        return out

    def _benign(self, line: str) -> bool:
        return False


class Scraper:
    """GET /metrics from each address every ``interval`` seconds, on a thread, until
    ``stop`` (at most an hour: a bench run that forgot to stop it ends it all the same)."""

    def __init__(self, addresses: list[tuple[str, int]], interval: float):
        import threading

        self.addresses = addresses
        self.interval = interval
        self.scrapes = 0
        self.failures = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="metrics-scraper", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        import http.client

        deadline = time.monotonic() + 3600
        while not self._stop.wait(self.interval) and time.monotonic() < deadline:
            for host, port in self.addresses:
                conn = http.client.HTTPConnection(host, port, timeout=5)
                try:
                    conn.request("GET", "/metrics")
                    conn.getresponse().read()
                    self.scrapes += 1
                except OSError:
                    self.failures += 1
                finally:
                    conn.close()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)


class MqttmeshNodes(BrokerServer):
    """``count`` mqttmesh nodes, each ``python -m mqttmesh broker`` on its own free port.

    ``extra_args[i]`` are appended to node i's command line after ``str.format`` with
    ``ports`` (the list of all nodes' ports, picked before any node starts) and
    ``host``: e.g. ``["--peer", "{host}:{ports[0]}"]`` once the mesh flags exist.
    With more than one node, publishers connect to node 0 and subscribers to node 1.
    """

    name = "mqttmesh"

    def __init__(
        self,
        workdir: Path,
        count: int = 1,
        extra_args: list[list[str]] | None = None,
        max_inflight: int = 1000,
        max_queued: int = 1_000_000,
        python: str | None = None,
        start_timeout: float = 20.0,
        ws: bool = False,
        protocol: int = 4,
        ports: list[int] | None = None,
    ):
        super().__init__(workdir)
        self.count = count
        # the nodes' ports, when something must know them before the nodes start (a relay in
        # front of each, bench/wan.py); else picked free at every start
        self.ports = ports
        # ws: clients connect over WebSocket (--ws-port, path /mqtt) instead of TCP
        self.ws = ws
        if ws:
            self.name = "mqttmesh-ws"
        # protocol 5: the clients speak MQTT 5, with properties and (subscribers) topic aliases
        self.protocol = protocol
        if protocol == 5:
            self.name = "mqttmesh-v5"
        self.extra_args = extra_args or [[] for _ in range(count)]
        if len(self.extra_args) != count:
            raise ValueError("extra_args needs one list per node")
        self.max_inflight = max_inflight
        self.max_queued = max_queued
        self.defaults = False  # use_defaults: no --max-inflight / --max-queued
        venv_python = REPO / ".venv" / "bin" / "python"
        self.python = python or (str(venv_python) if venv_python.exists() else sys.executable)
        self.start_timeout = start_timeout

    def version(self) -> str:
        try:
            out = subprocess.run(
                [self.python, "-m", "mqttmesh", "--version"], capture_output=True, text=True, timeout=30
            )
            return (out.stdout or out.stderr).strip().replace("mqttmesh ", "") or "?"
        except (OSError, subprocess.TimeoutExpired):
            return "?"

    def start(self) -> Target:
        # With one node the kernel picks the port (--port 0) and the node reports it in the
        # port file: no race. A mesh needs every port before the first node starts.
        if self.ports is not None:
            ports = list(self.ports)
        else:
            ports = [0] if self.count == 1 else [free_port() for _ in range(self.count)]
        # MQTTMESH_BENCH_SCRAPE=SECONDS: every node serves HTTP and /metrics is fetched that
        # often while it runs (what a Prometheus costs the node: bench.ab --a-scrape)
        scrape = float(os.environ.get("MQTTMESH_BENCH_SCRAPE", "0") or 0)
        http_ports = [free_port() for _ in range(self.count)] if scrape > 0 else []
        ws_ports = [free_port() for _ in range(self.count)] if self.ws else []
        endpoints = []
        self.procs, self.log_paths = [], []
        try:
            for i in range(self.count):
                port_file = self.workdir / f"mqttmesh-{i}.port"
                port_file.unlink(missing_ok=True)
                log_path = self.workdir / f"mqttmesh-{i}.log"
                extra = [a.format(ports=ports, host=HOST) for a in self.extra_args[i]]
                argv = [
                    self.python,
                    "-m",
                    "mqttmesh",
                    "broker",
                    "--host",
                    HOST,
                    "--port",
                    str(ports[i]),
                    "--port-file",
                    str(port_file),
                    "--sys-interval",
                    "0",
                    *(
                        []
                        if self.defaults
                        else ["--max-inflight", str(self.max_inflight), "--max-queued", str(self.max_queued)]
                    ),
                    *extra,
                    *(["--http-port", str(http_ports[i])] if http_ports else []),
                    *(["--ws-port", str(ws_ports[i])] if ws_ports else []),
                ]
                proc = _popen(argv, log_path, cwd=REPO)
                self.procs.append(proc)
                self.log_paths.append(log_path)
                deadline = time.monotonic() + self.start_timeout
                while not port_file.exists():
                    if proc.poll() is not None:
                        raise BrokerError(f"mqttmesh node {i} exited with code {proc.returncode}: {_tail(log_path)}")
                    if time.monotonic() > deadline:
                        raise BrokerError(f"mqttmesh node {i} wrote no port file in {self.start_timeout:g} s")
                    time.sleep(0.05)
                port = int(port_file.read_text().strip())
                wait_for_port(HOST, port, deadline, proc)
                if ws_ports:
                    wait_for_port(HOST, ws_ports[i], deadline, proc)
                    endpoints.append(Endpoint(HOST, ws_ports[i], "/mqtt"))
                else:
                    endpoints.append(Endpoint(HOST, port))
        except Exception:
            self.stop()
            raise
        if http_ports:
            self.scraper = Scraper([(HOST, p) for p in http_ports], scrape)
        sub_eps = [endpoints[1]] if len(endpoints) > 1 else [endpoints[0]]
        self.target = Target(
            self.name if self.count == 1 else f"{self.name}x{self.count}",
            [endpoints[0]],
            sub_eps,
            [p.pid for p in self.procs],
            self.protocol,
            endpoints,
        )
        return self.target

    def stop(self) -> None:
        scraper = getattr(self, "scraper", None)
        if scraper is not None:
            scraper.stop()
            self.scraper = None
        super().stop()

    def use_defaults(self, on: bool) -> None:
        self.defaults = on

    def _benign(self, line: str) -> bool:
        return "no data directory" in line  # the in-memory warning at every start


class Mosquitto(BrokerServer):
    """Debian's mosquitto with limits large enough not to drop QoS 1/2 messages silently
    (``tuned``), or as it comes (``tuned=False``: "mosquitto-default", its stock limits of
    20 messages in flight and 1,000 queued per client, Nagle on)."""

    name = "mosquitto"

    def __init__(
        self,
        workdir: Path,
        path: str = MOSQUITTO,
        start_timeout: float = 10.0,
        tuned: bool = True,
        ws: bool = False,
        protocol: int = 4,
    ):
        super().__init__(workdir)
        self.path = path
        self.start_timeout = start_timeout
        self.tuned = tuned
        # ws: clients connect to its WebSocket listener. Mosquitto 2.0's (libwebsockets) binds
        # every interface whatever address it is given, so it runs only in a private network
        # namespace (bench/__main__.py starts the run in one), and it needs a TCP listener
        # beside it or it refuses to start.
        self.ws = ws
        if not tuned:
            self.name = "mosquitto-default"
        if ws:
            self.name = "mosquitto-ws"
        self.protocol = protocol  # 5: MQTT 5 clients (Mosquitto sends them no topic aliases)
        if protocol == 5:
            self.name = "mosquitto-v5"

    def unavailable(self) -> str | None:
        if not os.access(self.path, os.X_OK):
            return f"{self.path} not installed (apt-get install mosquitto)"
        return None

    def version(self) -> str:
        try:
            out = subprocess.run([self.path, "-h"], capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            return "?"
        m = re.search(r"version (\S+)", out.stdout + out.stderr)
        return m.group(1) if m else "?"

    def start(self) -> Target:
        last_error = None
        for _attempt in range(3):  # the port picked may be taken before mosquitto binds it
            port = free_port()
            ws_port = free_port() if self.ws else 0
            log_path = self.workdir / "mosquitto.log"
            conf = self.workdir / "mosquitto.conf"
            conf.write_text(
                # Started as root, mosquitto switches to the user "mosquitto": that could not
                # write the log here, and the kernel drops PR_SET_PDEATHSIG on a user change.
                # Naming the current user keeps it as is (ignored when not started as root).
                f"user {pwd.getpwuid(os.getuid()).pw_name}\n"
                f"listener {port} {HOST}\n"
                + (f"listener {ws_port}\nprotocol websockets\n" if self.ws else "")
                + "allow_anonymous true\n"
                + (
                    "set_tcp_nodelay true\nmax_inflight_messages 1000\nmax_queued_messages 1000000\n"
                    if self.tuned
                    else ""
                )
                + "persistence false\n"
                f"log_dest file {log_path}\n"
                "log_type error\nlog_type warning\nlog_type notice\nlog_type information\n"
            )
            proc = _popen([self.path, "-c", str(conf)], self.workdir / "mosquitto.stdout")
            self.procs = [proc]
            self.log_paths = [log_path, self.workdir / "mosquitto.stdout"]
            try:
                wait_for_port(HOST, port, time.monotonic() + self.start_timeout, proc)
                if self.ws:
                    wait_for_port(HOST, ws_port, time.monotonic() + self.start_timeout, proc)
            except BrokerError as exc:
                last_error = exc
                self.stop()
                continue
            ep = Endpoint(HOST, ws_port, "/mqtt") if self.ws else Endpoint(HOST, port)
            self.target = Target(self.name, [ep], [ep], [proc.pid], self.protocol, [ep])
            return self.target
        raise BrokerError(f"mosquitto did not start: {last_error}")

    def _benign(self, line: str) -> bool:
        return "should not be run as root" in line  # `user root` above, on purpose


class Amqtt(BrokerServer):
    """amqtt (pure-Python broker) from PyPI, in its own venv because its dependencies may conflict."""

    name = "amqtt"

    def __init__(
        self,
        workdir: Path,
        venv: Path = AMQTT_VENV,
        version: str = AMQTT_VERSION,
        start_timeout: float = 30.0,
        install_timeout: float = 600.0,
    ):
        super().__init__(workdir)
        self.venv = venv
        self.wanted = version
        self.start_timeout = start_timeout
        self.install_timeout = install_timeout
        self._unavailable: str | None = None
        self._checked = False

    @property
    def exe(self) -> Path:
        return self.venv / "bin" / "amqtt"

    def _installed_version(self) -> str | None:
        if not self.exe.exists():
            return None
        try:
            out = subprocess.run([str(self.exe), "--version"], capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return out.stdout.strip() or None

    def ensure_installed(self, log=print) -> str | None:
        """Create the venv and install amqtt on first use; the reason it cannot be used, or None."""
        if self._checked:
            return self._unavailable
        self._checked = True
        if self._installed_version() == self.wanted:
            return None
        log(f"installing amqtt=={self.wanted} into {self.venv} (first use) ...")
        python = shutil.which("python3") or sys.executable
        try:
            if not (self.venv / "bin" / "python").exists():
                subprocess.run([python, "-m", "venv", str(self.venv)], check=True, capture_output=True, timeout=120)
            pip = [
                str(self.venv / "bin" / "python"),
                "-m",
                "pip",
                "install",
                "-q",
                "--disable-pip-version-check",
                f"amqtt=={self.wanted}",
            ]
            res = subprocess.run(pip, capture_output=True, text=True, timeout=self.install_timeout)
            if res.returncode != 0:
                tail = (res.stderr or res.stdout).strip().splitlines()[-1:] or ["?"]
                self._unavailable = f"pip install amqtt=={self.wanted} failed: {tail[0][:160]}"
                return self._unavailable
        except subprocess.TimeoutExpired:
            self._unavailable = "installing amqtt timed out"
            return self._unavailable
        except (OSError, subprocess.CalledProcessError) as exc:
            self._unavailable = f"cannot create {self.venv}: {exc}"
            return self._unavailable
        got = self._installed_version()
        if got != self.wanted:
            self._unavailable = f"amqtt --version says {got!r}, wanted {self.wanted}"
        return self._unavailable

    def unavailable(self) -> str | None:
        return self.ensure_installed()

    def version(self) -> str:
        return self._installed_version() or "n/a"

    def start(self) -> Target:
        reason = self.ensure_installed()
        if reason:
            raise BrokerError(reason)
        last_error = None
        for _attempt in range(3):
            port = free_port()
            conf = self.workdir / "amqtt.yaml"
            # only the anonymous-auth plugin: the default config also loads packet/event
            # loggers and $SYS, which would only make it slower
            conf.write_text(
                "listeners:\n"
                "  default:\n"
                "    type: tcp\n"
                f"    bind: {HOST}:{port}\n"
                "plugins:\n"
                "  amqtt.plugins.authentication.AnonymousAuthPlugin:\n"
                "    allow_anonymous: true\n"
            )
            log_path = self.workdir / "amqtt.log"
            proc = _popen([str(self.exe), "-c", str(conf)], log_path)
            self.procs = [proc]
            self.log_paths = [log_path]
            try:
                wait_for_port(HOST, port, time.monotonic() + self.start_timeout, proc)
            except BrokerError as exc:
                last_error = f"{exc}: {_tail(log_path)}"
                self.stop()
                continue
            self.target = Target(self.name, [Endpoint(HOST, port)], [Endpoint(HOST, port)], [proc.pid])
            return self.target
        raise BrokerError(f"amqtt did not start: {last_error}")

    def _benign(self, line: str) -> bool:
        # wait_for_port's probe connects and closes without a CONNECT; our clients never do that
        return "No data to decode MQTT packet fixed header" in line


def _tail(path: Path, lines: int = 3) -> str:
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return " | ".join(text[-lines:])[:400]


BROKER_KINDS = {"mqttmesh": MqttmeshNodes, "mosquitto": Mosquitto, "amqtt": Amqtt}
