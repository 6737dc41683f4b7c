"""Mesh timing figures: dead-node detection and re-route, and subscription propagation.

    .venv/bin/python -m bench.mesh_figures [--repeat 5] [--keepalive 1.0]

Starts real node processes on loopback (ports picked free), measures, stops them.

* **re-route**: nodes a-b-d (direct links) and a-c-d (each link through a relay that adds
  20 ms, tests/support/faultrelay.py); b is killed with SIGKILL; the figures are the time until a's
  status shows d reached through c, and the outage seen by a subscriber on d of a 1 ms
  probe stream published on a.
  The same with b frozen by SIGSTOP instead: its sockets stay open and silent, so only the
  keepalive (3 x ``mesh.keepalive``) can tell it is dead.
* **propagation**: a subscriber connects to the last node of a line of N nodes and
  subscribes; a publisher on the first node publishes a probe every millisecond; the figure
  is the time from SUBACK to the first probe received.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

from mqttmesh.admin import fetch_status
from support import mqttraw as raw
from support.faultrelay import FaultRelay

from .ports import free_port

SECRET = "figures"


class Nodes:
    def __init__(self, workdir: str):
        self.workdir = workdir
        self.procs: dict[str, subprocess.Popen] = {}
        self.ports: dict[str, int] = {}
        self.args: dict[str, list[str]] = {}

    def start(self, name: str, port: int, args: list[str]) -> None:
        self.ports[name] = port
        self.args[name] = args
        log = open(os.path.join(self.workdir, f"{name}.log"), "ab")
        self.procs[name] = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "mqttmesh",
                "broker",
                "--port",
                str(port),
                "--node-id",
                name,
                "--cluster-secret",
                SECRET,
                "--connect",
                "configured",
                "--status-interval",
                "0.05",
                "--sys-interval",
                "0",
                "--log-level",
                "warning",
                *args,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()

    def status(self, name: str) -> dict:
        return fetch_status("127.0.0.1", self.ports[name], 2.0)

    def wait(self, predicate, timeout: float, what: str):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                value = predicate()
            except (OSError, ValueError, KeyError):
                value = None
            if value:
                return value
            time.sleep(0.02)
        raise TimeoutError(what)

    def kill(self, name: str) -> None:
        self.procs[name].send_signal(signal.SIGKILL)
        self.procs[name].wait(5)

    def stop(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs.values():
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)


class Probe:
    """A subscriber that timestamps every probe it receives."""

    def __init__(self, port: int, topic_filter: str):
        self.client = raw.RawClient("127.0.0.1", port, timeout=5)
        self.client.connect(client_id=f"probe-{time.monotonic_ns()}")
        self.client.send(raw.subscribe(1, (topic_filter, 0)))
        self.client.expect(raw.SUBACK)
        self.subacked = time.monotonic()
        self.arrivals: list[tuple[float, bytes]] = []
        self.stop = False
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        while not self.stop:
            try:
                p = self.client.recv(0.1)
            except TimeoutError:
                continue
            except (raw.Closed, OSError):
                return
            if p.type == raw.PUBLISH:
                self.arrivals.append((time.monotonic(), p.payload))

    def close(self):
        self.stop = True
        self.thread.join(1)
        self.client.close()


def publish_stream(port: int, topic: str, until, interval: float = 0.001, limit: float = 30.0):
    """Publish QoS 0 probes (payload = send time) until ``until()`` or the limit."""
    with raw.RawClient("127.0.0.1", port) as c:
        c.connect(client_id=f"prober-{time.monotonic_ns()}")
        end = time.monotonic() + limit
        while time.monotonic() < end and not until():
            c.send(raw.publish(topic, repr(time.monotonic()).encode()))
            time.sleep(interval)


def reroute(keepalive: float, freeze: bool = False) -> dict:
    with tempfile.TemporaryDirectory(prefix="mqttmesh-fig-") as wd:
        nodes = Nodes(wd)
        names = ["a", "b", "c", "d"]
        ports = {n: free_port() for n in names}
        relays = [FaultRelay("127.0.0.1", ports["c"]), FaultRelay("127.0.0.1", ports["d"])]
        for r in relays:
            r.delay(0.02)
        try:
            common = ["--mesh-keepalive", str(keepalive)]
            nodes.start("d", ports["d"], common)
            nodes.start("c", ports["c"], common + ["--peer", relays[1].address])
            nodes.start("b", ports["b"], common + ["--peer", f"127.0.0.1:{ports['d']}"])
            nodes.start("a", ports["a"], common + ["--peer", f"127.0.0.1:{ports['b']}", "--peer", relays[0].address])
            nodes.wait(lambda: nodes.status("a")["nodes"]["d"]["next_hop"] == "b", 30, "a routes via b")
            probe = Probe(ports["d"], "fig/#")
            nodes.wait(lambda: "fig/#" in nodes.status("a")["nodes"]["d"]["filters"], 10, "interest")
            stop = threading.Event()
            pub = threading.Thread(target=publish_stream, args=(ports["a"], "fig/x", stop.is_set), daemon=True)
            pub.start()
            nodes.wait(lambda: probe.arrivals, 5, "probes flowing")
            killed = time.monotonic()
            if freeze:
                # SIGSTOP: the node's sockets stay open and silent, only keepalives can tell
                nodes.procs["b"].send_signal(signal.SIGSTOP)
            else:
                nodes.kill("b")
            nodes.wait(lambda: nodes.status("a")["nodes"]["d"]["next_hop"] == "c", 30, "re-route")
            rerouted = time.monotonic() - killed
            nodes.wait(lambda: any(t > killed + rerouted for t, _ in probe.arrivals), 10, "probes again")
            # probes in flight when b died are lost (QoS 0); the first one after the
            # outage shows when traffic flows again
            flowing = _largest_gap(probe.arrivals, killed)
            stop.set()
            pub.join(2)
            probe.close()
            return {"reroute_s": rerouted, "outage_s": flowing}
        finally:
            if freeze and nodes.procs.get("b") is not None:
                nodes.procs["b"].send_signal(signal.SIGCONT)
            nodes.stop()
            for r in relays:
                r.close()


def _largest_gap(arrivals, after):
    times = [t for t, _ in arrivals if t >= after - 0.5]
    return max((b - a for a, b in zip(times, times[1:], strict=False)), default=0.0)


def propagation(length: int) -> float:
    with tempfile.TemporaryDirectory(prefix="mqttmesh-fig-") as wd:
        nodes = Nodes(wd)
        names = [f"l{i}" for i in range(length)]
        ports = {n: free_port() for n in names}
        try:
            for i, n in enumerate(names):
                args = ["--peer", f"127.0.0.1:{ports[names[i - 1]]}"] if i else []
                nodes.start(n, ports[n], args)
            nodes.wait(
                lambda: (
                    all(info["reachable"] for info in nodes.status(names[0])["nodes"].values())
                    and len(nodes.status(names[0])["nodes"]) == length
                ),
                30,
                "line converged",
            )
            probe = Probe(ports[names[-1]], "prop/#")
            pub = threading.Thread(
                target=publish_stream, args=(ports[names[0]], "prop/x", lambda: bool(probe.arrivals)), daemon=True
            )
            pub.start()
            nodes.wait(lambda: probe.arrivals, 10, "first probe")
            pub.join(2)
            probe.close()
            return probe.arrivals[0][0] - probe.subacked
        finally:
            nodes.stop()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--keepalive", type=float, default=1.0, help="mesh.keepalive of every node")
    args = ap.parse_args(argv)
    rr = [reroute(args.keepalive) for _ in range(args.repeat)]
    frozen = [reroute(args.keepalive, freeze=True) for _ in range(args.repeat)]
    prop2 = [propagation(2) for _ in range(args.repeat)]
    prop4 = [propagation(4) for _ in range(args.repeat)]

    def summary(values):
        return (
            f"median {statistics.median(values) * 1000:.0f} ms "
            f"(min {min(values) * 1000:.0f}, max {max(values) * 1000:.0f})"
        )

    print(f"mesh.keepalive = {args.keepalive:g} s (dead after 3 x keepalive), {args.repeat} runs each")
    print(f"kill -9 of the relay node -> a's route through the other path: {summary([r['reroute_s'] for r in rr])}")
    print(f"kill -9 of the relay node -> outage in a 1 ms QoS 0 probe stream: {summary([r['outage_s'] for r in rr])}")
    print(f"relay node frozen (SIGSTOP, silent) -> re-route: {summary([r['reroute_s'] for r in frozen])}")
    print(
        f"relay node frozen (SIGSTOP, silent) -> outage in the probe stream: {summary([r['outage_s'] for r in frozen])}"
    )
    print(f"subscription made on the far end of a 2-node line, effective at the other end: {summary(prop2)}")
    print(f"subscription made on the far end of a 4-node line, effective at the other end: {summary(prop4)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
