"""Admin tools: `mqttmesh mesh status` and `mqttmesh cluster up`.

Both talk to nodes the way any client does: over MQTT, reading the retained
``$SYS/mesh/status`` document each node publishes (and ``$SYS/mesh/clients``, the
ClientIds, when the node lets the user read them).
"""

from __future__ import annotations

import json
import os
import random
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time

from .codec import PUBLISH, Connect, Decoder, Disconnect, MalformedPacket, Subscribe, encode

__all__ = ["fetch_retained", "fetch_status", "format_status", "topology_edges", "LocalMesh"]


def fetch_retained(
    host: str, port: int, topic: str, timeout: float = 5.0, username: str | None = None, password: bytes | None = None
) -> bytes | None:
    """The retained message on ``topic`` (None if there is none before the timeout)."""
    return _fetch(host, port, [topic], topic, timeout, username, password).get(topic)


def _fetch(
    host: str, port: int, topics: list[str], last: str, timeout: float, username: str | None, password: bytes | None
) -> dict[str, bytes]:
    """Subscribe to ``topics`` (in that order) and collect what arrives until ``last`` does.
    A node that answers CONNACK 0x03 (it has not learned the mesh yet) is asked again until
    ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return _fetch_once(host, port, topics, last, deadline, username, password)
        except _Unavailable:
            if time.monotonic() + 0.1 >= deadline:
                raise ConnectionError(f"{host}:{port} refused the connection (CONNACK 3)") from None
            time.sleep(0.1)  # (between two attempts)


class _Unavailable(Exception):
    """CONNACK 0x03."""


def _fetch_once(
    host: str, port: int, topics: list[str], last: str, deadline: float, username: str | None, password: bytes | None
) -> dict[str, bytes]:
    timeout = max(0.01, deadline - time.monotonic())
    got: dict[str, bytes] = {}
    with socket.create_connection((host, port), timeout=timeout) as sock:
        sock.sendall(
            encode(
                Connect(
                    f"admin-{os.getpid()}-{random.getrandbits(24):x}", True, 30, username=username, password=password
                )
            )
        )
        sock.sendall(encode(Subscribe(1, [(t, 0) for t in topics])))
        decoder = Decoder()
        while time.monotonic() < deadline:
            sock.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                data = sock.recv(65536)
            except TimeoutError:
                break
            if not data:
                raise ConnectionError(f"{host}:{port} closed the connection")
            decoder.feed(data)
            try:
                for pkt in decoder.packets():
                    if pkt.type == 2 and pkt.return_code == 3:
                        raise _Unavailable
                    if pkt.type == 2 and pkt.return_code:
                        raise ConnectionError(f"{host}:{port} refused the connection (CONNACK {pkt.return_code})")
                    if pkt.type == PUBLISH and pkt.topic in topics:
                        got[pkt.topic] = pkt.payload
                        if pkt.topic == last:
                            sock.sendall(encode(Disconnect()))
                            return got
            except MalformedPacket as exc:
                raise ConnectionError(f"{host}:{port}: {exc}") from None
        try:
            sock.sendall(encode(Disconnect()))
        except OSError:
            pass
    return got


def fetch_status(
    host: str, port: int, timeout: float = 5.0, username: str | None = None, password: bytes | None = None
) -> dict:
    """The node's ``$SYS/mesh/status``, with the ClientIds of ``$SYS/mesh/clients`` in its
    ``cluster`` part when the node lets this user read them (see docs/operations.md)."""
    got = _fetch(host, port, ["$SYS/mesh/clients", "$SYS/mesh/status"], "$SYS/mesh/status", timeout, username, password)
    if "$SYS/mesh/status" not in got:
        raise ConnectionError(f"{host}:{port} publishes no $SYS/mesh/status (is it a mesh node?)")
    status = json.loads(got["$SYS/mesh/status"])
    if "$SYS/mesh/clients" in got:  # the node publishes it first
        status.setdefault("cluster", {}).update(json.loads(got["$SYS/mesh/clients"]))
    return status


def format_status(s: dict) -> str:
    lines = [f"node {s['node']} (incarnation {s['incarnation']})", ""]
    lines.append("links:")
    if not s["neighbours"]:
        lines.append("  (none)")
    for peer, n in s["neighbours"].items():
        link = s.get("links", {}).get(peer, {})
        srtt = f"{n['srtt_us']} us" if n.get("srtt_us") is not None else "-"
        lines.append(
            f"  {peer:<16} cost {n['cost']:>7}  srtt {srtt:>9}  dialled by {link.get('dialled_by', '?'):<10}"
            f" envelopes out {n['envelopes_out']:>8} in {n['envelopes_in']:>8}"
            f"  control out {n['control_out']} in {n['control_in']}"
        )
    lines.append("")
    lines.append("nodes:")
    for node, info in s["nodes"].items():
        state = "self" if node == s["node"] else ("reachable" if info["reachable"] else "UNREACHABLE")
        hop = info.get("next_hop") or "-"
        dist = info.get("distance")
        lines.append(
            f"  {node:<16} inc {info['incarnation']:<11} {state:<11} via {hop:<12} "
            f"distance {dist if dist is not None else '-':<8} filters {len(info['filters'])}"
        )
        for f in info["filters"][:10]:
            lines.append(f"      {f}")
        if len(info["filters"]) > 10:
            lines.append(f"      ... {len(info['filters']) - 10} more")
    lines.append("")
    lines.append("shortest-path tree from this node (node <- parent):")
    for node, parent in s["tree"].items():
        lines.append(f"  {node} <- {parent}")
    lines.append("")
    c = s["counters"]
    lines.append("counters: " + ", ".join(f"{k} {v}" for k, v in c.items()))
    lines.append(f"messages held in custody (awaiting end-to-end acknowledgement): {s['custody']}")
    return "\n".join(lines)


def topology_edges(n: int, topology: str, seed: int = 1) -> list[tuple[int, int]]:
    """Edges (i dials j) between node indexes 0..n-1 for a named topology."""
    if n < 1:
        raise ValueError("at least one node")
    if topology == "full":
        return [(i, j) for i in range(n) for j in range(i)]
    if topology == "line":
        return [(i, i - 1) for i in range(1, n)]
    if topology == "ring":
        return [(i, i - 1) for i in range(1, n)] + ([(0, n - 1)] if n > 2 else [])
    if topology == "star":
        return [(i, 0) for i in range(1, n)]
    if topology == "random":
        rng = random.Random(seed)
        edges = {(i, rng.randrange(i)) for i in range(1, n)}  # a random spanning tree
        target = max(len(edges), int(n * 1.5))  # average degree about 3
        pairs = [(i, j) for i in range(n) for j in range(i)]
        rng.shuffle(pairs)
        for i, j in pairs:
            if len(edges) >= target:
                break
            edges.add((i, j))
        return sorted(edges)
    raise ValueError(f"unknown topology {topology!r} (full, ring, line, star, random)")


class LocalMesh:
    """N local nodes as separate processes, wired in a topology."""

    def __init__(
        self,
        nodes: int,
        topology: str,
        base_port: int,
        host: str = "127.0.0.1",
        secret: str | None = None,
        workdir: str | None = None,
        data: bool = False,
        extra: list[str] | None = None,
        seed: int = 1,
        python: str = sys.executable,
        http_base_port: int = 0,
        ws_base_port: int = 0,
    ):
        self.n = nodes
        self.topology = topology
        self.host = host
        self.ports = [base_port + i for i in range(nodes)]
        # the console and admin API, and MQTT over WebSocket, of each node (0: none)
        self.http_ports = [http_base_port + i if http_base_port else 0 for i in range(nodes)]
        self.ws_ports = [ws_base_port + i if ws_base_port else 0 for i in range(nodes)]
        self.names = [f"n{i + 1}" for i in range(nodes)]
        self.secret = secret or secrets.token_hex(16)
        self.workdir = workdir or tempfile.mkdtemp(prefix="mqttmesh-cluster-")
        self.data = data
        self.extra = list(extra or [])
        self.edges = topology_edges(nodes, topology, seed)
        self.python = python
        self.procs: list[subprocess.Popen] = []

    def command(self, i: int) -> list[str]:
        cmd = [
            self.python,
            "-m",
            "mqttmesh",
            "broker",
            "--host",
            self.host,
            "--port",
            str(self.ports[i]),
            "--node-id",
            self.names[i],
            "--cluster-secret",
            self.secret,
            "--connect",
            "all" if self.topology == "full" else "configured",
        ]
        for a, b in self.edges:
            if a == i:
                cmd += ["--peer", f"{self.host}:{self.ports[b]}"]
        if self.data:
            cmd += ["--data-dir", os.path.join(self.workdir, self.names[i])]
        if self.http_ports[i]:
            cmd += ["--http-port", str(self.http_ports[i])]
        if self.ws_ports[i]:
            cmd += ["--ws-port", str(self.ws_ports[i])]
        return cmd + self.extra

    def start(self) -> None:
        os.makedirs(self.workdir, exist_ok=True)
        for i in range(self.n):
            log = open(os.path.join(self.workdir, f"{self.names[i]}.log"), "ab")
            self.procs.append(
                subprocess.Popen(self.command(i), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            )
            log.close()

    def expected_neighbours(self, i: int) -> set[str]:
        return {self.names[b] for a, b in self.edges if a == i} | {self.names[a] for a, b in self.edges if b == i}

    def converged(self) -> tuple[bool, str]:
        for i in range(self.n):
            if self.procs[i].poll() is not None:
                raise RuntimeError(
                    f"node {self.names[i]} exited with {self.procs[i].returncode}; "
                    f"see {os.path.join(self.workdir, self.names[i] + '.log')}"
                )
            try:
                s = fetch_status(self.host, self.ports[i], timeout=1.0)
            except (OSError, ValueError) as exc:
                return False, f"{self.names[i]}: {exc}"
            reachable = {n for n, info in s["nodes"].items() if info["reachable"]}
            if reachable != set(self.names):
                return False, f"{self.names[i]} reaches {sorted(reachable)}"
            if set(s["neighbours"]) != self.expected_neighbours(i):
                return False, f"{self.names[i]} has links to {sorted(s['neighbours'])}"
        return True, "converged"

    def wait_converged(self, timeout: float = 60.0) -> float:
        started = time.monotonic()
        why = ""
        while time.monotonic() - started < timeout:
            ok, why = self.converged()
            if ok:
                return time.monotonic() - started
            time.sleep(0.2)
        raise TimeoutError(f"the mesh did not converge in {timeout:g}s: {why}")

    def stop(self, timeout: float = 10.0) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for p in self.procs:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)
