"""The nodes of a run: N broker processes on 127.0.0.1, their peer links through fault proxies.

``mqttmesh``: a full mesh, ``--connect configured``, every node dialling every other one
through the proxy of that ordered pair. ``mosquitto``: Debian's Mosquitto, node 0 the root of
a binary tree, every other node bridging to its parent through the proxy (child, parent).
Every port is picked free at run time; every process is ours and is ended by PID.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from ..ports import free_port
from .proxy import FaultProxy, ProxyLoop

SECRET = "chaos-secret"
ADMIN_USER, ADMIN_PASSWORD = "chaos-admin", "chaos-admin-pw"


def _die_with_parent() -> None:
    """In the child before exec (Linux): SIGKILL when the thread that started it ends, so
    that a harness killed without its cleanup (a test time-out) leaves no node behind."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


class Node:
    """One broker process; kill/restart keep its port and data directory."""

    def __init__(self, name: str, port: int, workdir: Path, cmd: list[str]):
        self.name, self.port, self.workdir, self.cmd = name, port, workdir, cmd
        self.proc: subprocess.Popen[bytes] | None = None
        self.paused = False
        self.log_path = workdir / f"{name}.log"
        self.starts = 0

    def start(self, timeout: float = 30.0) -> None:
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                self.cmd,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.workdir,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
                preexec_fn=_die_with_parent if sys.platform == "linux" else None,
            )
        self.starts += 1
        deadline = time.monotonic() + timeout
        while not _listening(self.port):
            if self.proc.poll() is not None:
                raise RuntimeError(f"node {self.name} exited with {self.proc.returncode}; see {self.log_path}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"node {self.name} not listening on {self.port} after {timeout}s")
            time.sleep(0.05)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill9(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self.paused = False

    def pause(self) -> None:
        if self.alive():
            assert self.proc is not None
            os.kill(self.proc.pid, signal.SIGSTOP)
            self.paused = True

    def resume(self) -> None:
        if self.proc is not None and self.paused:
            if self.proc.poll() is None:
                os.kill(self.proc.pid, signal.SIGCONT)
            self.paused = False

    def stop(self, timeout: float = 5.0) -> str:
        """End the process by its PID: SIGCONT if paused, SIGTERM, SIGKILL if it lingers past
        ``timeout``. Says how it ended: "term" (it exited on SIGTERM, after its shutdown: an
        archive's last flush committed), "kill", or "" (it was not running)."""
        if self.proc is None or self.proc.poll() is not None:
            return ""
        try:
            os.kill(self.proc.pid, signal.SIGCONT)
            self.proc.terminate()
            self.proc.wait(timeout)
            return "term"
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
            return "kill"


class Cluster:
    """Nodes, proxies and the links a partition or a flap can break."""

    def __init__(self, kind: str, n: int, workdir: Path, archive: Path | None = None, flush_interval: float = 1.0):
        """``archive``: each mqttmesh node archives into ``archive/NODE`` (Delta tables), with
        the delivery log, the workload's topics only (``chaos/#``: not the probes'), a flush
        every ``flush_interval`` seconds (bench/chaos/auditcheck.py reads them)."""
        self.kind = kind
        self.workdir = workdir
        self.archive = archive
        self.flush_interval = flush_interval
        self.stopped: dict[str, str] = {}  # node -> how close() ended it (Node.stop)
        self.names = [f"n{i}" for i in range(n)]
        self.ports = {name: free_port() for name in self.names}
        self.proxies = ProxyLoop()
        self.links: dict[tuple[str, str], FaultProxy] = {}  # (dialler, listener) -> proxy
        self.nodes: dict[str, Node] = {}
        self.where: dict[str, list[str]] = {}  # ClientId -> the nodes that list it (connections_per_client)
        if kind == "mqttmesh":
            self._mqttmesh()
        elif kind == "mosquitto":
            self._mosquitto()
        else:
            raise ValueError(f"unknown broker {kind!r}")

    def _proxy(self, a: str, b: str) -> FaultProxy:
        p = self.proxies.proxy(f"{a}->{b}", self.ports[b])
        self.links[(a, b)] = p
        return p

    def _mqttmesh(self) -> None:
        from mqttmesh.auth import PasswordFile

        pwfile = self.workdir / "admin-passwd"
        passwords = PasswordFile(str(pwfile))
        passwords.set(ADMIN_USER, ADMIN_PASSWORD, iterations=1000, salt=b"chaos-admin-salt")
        passwords.save()
        for a in self.names:
            peers: list[str] = []
            for b in self.names:
                if a != b:
                    peers += ["--peer", self._proxy(a, b).address]
            data = self.workdir / a
            data.mkdir()
            cmd = [
                sys.executable,
                "-m",
                "mqttmesh",
                "broker",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.ports[a]),
                "--node-id",
                a,
                "--data-dir",
                str(data),
                "--cluster-secret",
                SECRET,
                "--connect",
                "configured",
                "--password-file",
                str(pwfile),
                "--sys-interval",
                "0",
                "--status-interval",
                "0.5",
                *peers,
            ]
            if self.archive is not None:
                cmd += [
                    "--archive",
                    "true",
                    "--archive-dir",
                    str(self.archive / a),
                    "--archive-delivery-log",
                    "true",
                    "--archive-filter",
                    "chaos/#",
                    "--archive-flush-interval",
                    str(self.flush_interval),
                ]
            self.nodes[a] = Node(a, self.ports[a], self.workdir, cmd)

    def _mosquitto(self) -> None:
        for i, a in enumerate(self.names):
            data = self.workdir / a
            data.mkdir()
            lines = [
                "per_listener_settings false",
                "allow_anonymous true",
                f"listener {self.ports[a]} 127.0.0.1",
                "user root",
                "persistence true",
                f"persistence_location {data}/",
                "autosave_interval 1",
                "max_queued_messages 10000",
                f"log_dest file {data}/mosquitto.log",
            ]
            if i:
                parent = self.names[(i - 1) // 2]
                lines += [
                    f"connection {a}-to-{parent}",
                    f"address {self._proxy(a, parent).address}",
                    f"remote_clientid bridge-{a}",
                    "cleansession false",
                    "try_private true",
                    "bridge_protocol_version mqttv311",
                    "topic chaos/# both 2",
                    "topic chaosprobe/# both 0",
                    "keepalive_interval 5",
                    "restart_timeout 1 5",
                    "notifications false",
                ]
            conf = self.workdir / f"{a}.conf"
            conf.write_text("\n".join(lines) + "\n")
            self.nodes[a] = Node(a, self.ports[a], self.workdir, ["mosquitto", "-c", str(conf)])

    def start(self) -> None:
        for node in self.nodes.values():
            node.start()

    def links_between(self, side_a: set[str], side_b: set[str]) -> list[FaultProxy]:
        return [p for (a, b), p in self.links.items() if (a in side_a and b in side_b) or (a in side_b and b in side_a)]

    def pairs(self) -> list[tuple[str, str]]:
        """Every pair of nodes, each once: what a flap picks from, the same for every broker
        so that one seed gives one schedule."""
        return [(a, b) for i, a in enumerate(self.names) for b in self.names[i + 1 :]]

    def path_links(self, a: str, b: str) -> list[FaultProxy]:
        """The proxies of the links between a and b: the direct ones (a full mesh), or those
        of the tree path between them (Mosquitto's bridges)."""
        direct = self.links_between({a}, {b})
        if direct or self.kind != "mosquitto":
            return direct
        parent = {n: self.names[(i - 1) // 2] for i, n in enumerate(self.names) if i}

        def up(n: str) -> list[str]:
            path = [n]
            while path[-1] in parent:
                path.append(parent[path[-1]])
            return path

        pa, pb = up(a), up(b)
        common = next(n for n in pa if n in pb)
        edges = pa[: pa.index(common) + 1] + pb[: pb.index(common)][::-1]
        return [p for x, y in zip(edges, edges[1:], strict=False) for p in self.links_between({x}, {y})]

    def connections_per_client(self, timeout: float = 5.0) -> dict[str, int] | None:
        """How many nodes list each ClientId among their local clients (mqttmesh status)."""
        if self.kind != "mqttmesh":
            return None
        from mqttmesh.admin import fetch_status

        counts: dict[str, int] = {}
        self.where = {}
        for name, node in self.nodes.items():
            st = fetch_status("127.0.0.1", node.port, timeout, ADMIN_USER, ADMIN_PASSWORD.encode())
            for cid in st.get("cluster", {}).get("local_clients", []):
                counts[cid] = counts.get(cid, 0) + 1
                self.where.setdefault(cid, []).append(name)
        return counts

    def close(self) -> None:
        # an archiving node writes what it holds before it exits (archive.stop_timeout)
        timeout = 60.0 if self.archive is not None else 5.0
        try:
            for name, node in self.nodes.items():
                how = node.stop(timeout)
                if how:
                    self.stopped[name] = how
        finally:
            self.proxies.close()
