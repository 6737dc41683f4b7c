"""A standalone Spark cluster from the PySpark installation: one master and N workers, each a
JVM started by ``spark-class`` on loopback, on ports picked free at run time.

``SparkCluster.start`` returns once the master lists every worker ALIVE (its JSON page,
polled with a deadline); ``stop`` kills each daemon's process group (the JVM, and the
executors and Python workers it started) and waits until the group is gone. pyspark is
imported where it is needed, so that this module loads without the `pipeline` extra.
"""

from __future__ import annotations

import ipaddress
import json
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

from bench.ports import free_port
from support.processes import wait_for

HOST = "127.0.0.1"
# Spark prints this when it falls back from a loopback hostname to another interface's address
NOT_LOOPBACK = "resolves to a loopback address"
# For JVMs that live a minute on a few hundred rows: C2's compiling is most of their CPU time
# (half of a job's, measured on two cores), and one GC thread is enough
QUICK_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def spark_home() -> str:
    """The pyspark package directory: its bin/ has spark-class and spark-submit."""
    import pyspark

    return os.path.dirname(os.path.abspath(pyspark.__file__))


def spark_env(**extra: str) -> dict[str, str]:
    """The environment of every Spark process here: loopback only, this interpreter for
    Python workers (the venv's, with pyarrow), and no PYTHONPATH, so that a driver imports
    the project from what spark-submit was given (--py-files), not from the source tree."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYSPARK_GATEWAY_PORT")}
    # SPARK_LOCAL_IP: what each JVM binds to; SPARK_LOCAL_HOSTNAME: the name it gives others
    # (else 127.0.0.1 reversed, "localhost")
    env.update(SPARK_HOME=spark_home(), SPARK_LOCAL_IP=HOST, SPARK_LOCAL_HOSTNAME=HOST, PYSPARK_PYTHON=sys.executable)
    env.update(extra)
    return env


class SparkCluster:
    """``spark://127.0.0.1:PORT``: a master and ``workers`` workers of ``cores`` cores and
    ``memory`` each, their logs and work directories under ``root``."""

    def __init__(self, root: Path, workers: int = 2, cores: int = 1, memory: str = "1g"):
        self.root = root
        self.workers, self.cores, self.memory = workers, cores, memory
        self.port = self.ui_port = 0
        self.procs: dict[str, subprocess.Popen] = {}
        self.ports: list[int] = []  # every port given to a daemon (RPC and web UI)

    @property
    def url(self) -> str:
        return f"spark://{HOST}:{self.port}"

    def work_dir(self, i: int) -> Path:
        return self.root / f"worker{i}"

    def log(self, name: str) -> str:
        try:
            return (self.root / f"{name}.log").read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def _daemon(self, name: str, *args: str) -> None:
        cmd = [os.path.join(spark_home(), "bin", "spark-class"), *args]
        with open(self.root / f"{name}.log", "ab") as log:
            # a session of its own: spark-class execs java, which starts executors and Python
            # workers; the process group is all of them, and stop() kills it
            env = spark_env(SPARK_DAEMON_JAVA_OPTS=QUICK_JVM, SPARK_DAEMON_MEMORY="512m")
            self.procs[name] = subprocess.Popen(
                cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=self.root, start_new_session=True
            )

    def state(self) -> dict | None:
        """The master's JSON page (workers, applications), or None while it does not answer."""
        for name, p in self.procs.items():
            if p.poll() is not None:
                raise AssertionError(f"{name} exited with {p.returncode}:\n{self.log(name)[-3000:]}")
        try:
            with urllib.request.urlopen(f"http://{HOST}:{self.ui_port}/json/", timeout=2) as r:
                return json.load(r)
        except (urllib.error.URLError, ConnectionError, TimeoutError, json.JSONDecodeError):
            return None

    def alive_workers(self) -> int:
        s = self.state()
        return sum(w["state"] == "ALIVE" for w in s["workers"]) if s else 0

    def start(self, timeout: float = 90.0) -> SparkCluster:
        self.root.mkdir(parents=True, exist_ok=True)
        self.port, self.ui_port = free_port(), free_port()
        self.ports += [self.port, self.ui_port]
        master = ("--host", HOST, "--port", str(self.port), "--webui-port", str(self.ui_port))
        self._daemon("master", "org.apache.spark.deploy.master.Master", *master)
        wait_for(lambda: (self.state() or {}).get("status") == "ALIVE", timeout, 0.2, what="the Spark master")
        for i in range(1, self.workers + 1):
            self.work_dir(i).mkdir(exist_ok=True)
            port, ui_port = free_port(), free_port()
            self.ports += [port, ui_port]
            ports = ("--port", str(port), "--webui-port", str(ui_port))
            size = ("--cores", str(self.cores), "--memory", self.memory, "--work-dir", str(self.work_dir(i)))
            self._daemon(f"worker{i}", "org.apache.spark.deploy.worker.Worker", "--host", HOST, *ports, *size, self.url)
        wait_for(lambda: self.alive_workers() == self.workers, timeout, 0.2, what=f"{self.workers} workers to register")
        return self

    def stop(self, timeout: float = 20.0) -> None:
        """Kill every process group started here, and wait until each is empty."""
        for p in self.procs.values():
            _kill_group(p.pid, signal.SIGTERM)
        for name, p in self.procs.items():
            try:
                p.wait(timeout)
            except subprocess.TimeoutExpired:
                _kill_group(p.pid, signal.SIGKILL)
                p.wait(5)
            wait_for(lambda pid=p.pid: not _group_alive(pid), timeout, 0.1, what=f"{name}'s process group to end")

    def listening(self) -> set[tuple[str, int]]:
        """(address, port) of every TCP socket the cluster's processes listen on."""
        return listening_sockets({p.pid for p in self.procs.values()})


def _kill_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    # (a zombie still counts, and ours are reaped by wait(); others' are reaped by their parent)
    return True


def run_group(cmd: list[str], timeout: float, **kw) -> subprocess.CompletedProcess:
    """subprocess.run in a session of its own whose whole group is killed if it is still there
    at the end (spark-submit's JVM starts the Python driver, which a plain kill would leave)."""
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True, **kw)
    try:
        out, err = p.communicate(timeout=timeout)
    finally:
        if _group_alive(p.pid):
            _kill_group(p.pid, signal.SIGKILL)
        if p.poll() is None:
            p.wait(5)
    return subprocess.CompletedProcess(cmd, p.returncode, out, err)


def listening_sockets(pgids: set[int]) -> set[tuple[str, int]]:
    """(address, port) of the listening TCP sockets of every process in the groups ``pgids``
    (Linux /proc: the processes' socket inodes, found in /proc/net/tcp and tcp6)."""
    inodes = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.getpgid(int(entry)) not in pgids:
                continue
            for fd in os.listdir(f"/proc/{entry}/fd"):
                link = os.readlink(f"/proc/{entry}/fd/{fd}")
                if link.startswith("socket:["):
                    inodes.add(link[8:-1])
        except OSError:  # (gone meanwhile, or not ours to read)
            continue
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as fh:
            for line in fh.readlines()[1:]:
                fields = line.split()
                if fields[3] != "0A" or fields[9] not in inodes:  # 0A: LISTEN
                    continue
                addr, port = fields[1].split(":")
                raw = bytes.fromhex(addr)
                # each 32-bit word is in host (little-endian) order
                raw = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
                ip = ipaddress.ip_address(raw)
                if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped:
                    ip = ip.ipv4_mapped
                found.add((str(ip), int(port, 16)))
    return found
