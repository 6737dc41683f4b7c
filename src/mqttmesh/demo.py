"""``mqttmesh demo``: a sensor workload on a local mesh, then the traffic and payload reports.

Several sites, many devices, each device its own MQTT client on one of the nodes,
publishing JSON readings (temperature, humidity, battery) at QoS 1 for a bounded time;
a few legacy devices send plain-text readings, which the payloads job counts as not
JSON. By default the demo starts its own mesh (admin.LocalMesh, archive on, on free
ports) and stops it before the analysis, which flushes every node's archive; with
--ports it publishes to a running mesh whose nodes archive into --archive instead.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import socket
import sys
import threading
import time

from .codec import (
    CONNACK,
    PUBACK,
    PUBLISH,
    SUBACK,
    Connect,
    Decoder,
    Disconnect,
    PubAck,
    Subscribe,
    encode,
    encode_publish,
)

__all__ = ["add_arguments", "run_demo", "Device", "device_fleet"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--out",
        default="mqttmesh-demo",
        metavar="DIR",
        help="where the mesh's logs, the archive and the reports go (./mqttmesh-demo)",
    )
    p.add_argument("--nodes", type=int, default=3, help="nodes of the local mesh (3)")
    p.add_argument("--sites", type=int, default=4, help="sites (4)")
    p.add_argument("--devices", type=int, default=30, help="devices per site (30)")
    p.add_argument("--rate", type=float, default=2.0, help="readings per second per device (2)")
    p.add_argument("--duration", type=float, default=20.0, help="seconds of publishing (20)")
    p.add_argument("--window", type=int, default=2, help="seconds per window in the reports (2)")
    p.add_argument("--seed", type=int, default=1, help="seed of the readings")
    p.add_argument(
        "--ports",
        metavar="P1,P2,...",
        help="publish to these running nodes (127.0.0.1) instead of starting a mesh; needs --archive",
    )
    p.add_argument("--archive", metavar="DIR", help="with --ports: the archive directory of those nodes")
    p.add_argument(
        "--settle",
        type=float,
        default=12.0,
        help="with --ports: seconds to let the nodes write their archive files (12)",
    )
    p.add_argument("--master", metavar="URL", help="Spark master for the analysis (default local[*])")


class Device:
    """One sensor: a ClientId, a node, a topic, and a reading for any time."""

    def __init__(self, site: int, index: int, node: int, rng: random.Random, legacy: bool = False):
        self.site = site
        self.index = index
        self.node = node
        self.legacy = legacy
        kind = "legacy" if legacy else "dev"
        self.client_id = f"site{site}-{kind}-{index:03d}"
        self.topic = f"sensors/site-{site}/{kind}-{index:03d}/{'raw' if legacy else 'reading'}"
        self.base = 17.0 + 2.5 * site + rng.uniform(-1.5, 1.5)  # each site has its own climate
        self.humidity = rng.uniform(35, 60)
        self.battery = rng.uniform(60, 100)
        self.phase = rng.uniform(0, 2 * math.pi)
        self.rng = random.Random(rng.random())
        self.seq = 0

    def reading(self, t: float) -> bytes:
        self.seq += 1
        temp = self.base + 1.5 * math.sin(t / 30.0 + self.phase) + self.rng.gauss(0, 0.2)
        if self.rng.random() < 0.002:
            temp += self.rng.choice((-8, 8))  # the odd faulty reading
        rh = min(100.0, max(0.0, self.humidity + self.rng.gauss(0, 1.0)))
        self.battery = max(0.0, self.battery - self.rng.uniform(0, 0.01))
        if self.legacy:
            return f"{temp:.1f};{rh:.0f}".encode()
        return json.dumps(
            {
                "temperature": round(temp, 2),
                "humidity": round(rh, 1),
                "battery": round(self.battery, 1),
                "seq": self.seq,
            }
        ).encode()


def device_fleet(sites: int, per_site: int, nodes: int, seed: int = 1) -> list[Device]:
    """``per_site`` devices at each site, spread over the nodes; one in twenty is a legacy device."""
    rng = random.Random(seed)
    fleet: list[Device] = []
    for s in range(sites):
        for i in range(per_site):
            n = len(fleet)
            fleet.append(Device(s, i, n % nodes, rng, legacy=(i % 20 == 19)))
    return fleet


class _Connection:
    """One device's MQTT connection: CONNECT, then QoS 1 PUBLISH with acknowledgements read as
    they come (non-blocking)."""

    def __init__(self, host: str, port: int, client_id: str):
        self.sock = socket.create_connection((host, port), timeout=10)
        self.sock.sendall(encode(Connect(client_id, True, 60)))
        self.decoder = Decoder()
        self.pid = 0
        self.unacked = 0
        while True:
            data = self.sock.recv(4096)
            if not data:
                raise ConnectionError(f"{host}:{port} closed the connection of {client_id}")
            self.decoder.feed(data)
            packets = list(self.decoder.packets())
            if packets:
                if packets[0].type != CONNACK or packets[0].return_code:
                    raise ConnectionError(f"{host}:{port} refused {client_id}: {packets[0]!r}")
                break
        self.sock.setblocking(False)

    def publish(self, topic: bytes, payload: bytes) -> None:
        self.pid = self.pid % 65535 + 1
        self.sock.setblocking(True)
        self.sock.sendall(encode_publish(topic, payload, 1, False, False, self.pid))
        self.sock.setblocking(False)
        self.unacked += 1
        self.drain()

    def drain(self) -> None:
        try:
            while True:
                data = self.sock.recv(65536)
                if not data:
                    raise ConnectionError("connection closed")
                self.decoder.feed(data)
                self.unacked -= sum(1 for p in self.decoder.packets() if p.type == PUBACK)
        except BlockingIOError:
            pass

    def close(self, deadline: float) -> None:
        while self.unacked > 0 and time.monotonic() < deadline:
            self.drain()
            time.sleep(0.01)
        self.sock.setblocking(True)
        try:
            self.sock.sendall(encode(Disconnect()))
        except OSError:
            pass
        self.sock.close()


def _publish_on(
    host: str, port: int, devices: list[Device], rate: float, duration: float, counts: dict, errors: list
) -> None:
    try:
        conns = [_Connection(host, port, d.client_id) for d in devices]
        topics = [d.topic.encode() for d in devices]
        start = time.monotonic()
        period = 1.0 / rate
        # devices report at the same rate, spread over the period
        next_at = [start + period * i / max(1, len(devices)) for i in range(len(devices))]
        sent = 0
        while True:
            now = time.monotonic()
            if now - start >= duration:
                break
            i = min(range(len(devices)), key=next_at.__getitem__)
            if next_at[i] > now:
                time.sleep(min(next_at[i] - now, 0.05))
                continue
            conns[i].publish(topics[i], devices[i].reading(time.time()))
            next_at[i] += period
            sent += 1
        deadline = time.monotonic() + 10
        for c in conns:
            c.close(deadline)
        counts[port] = sent
    except Exception as exc:  # reported by the main thread, which then stops the mesh
        errors.append(f"node on port {port}: {type(exc).__name__}: {exc}")


class _Dashboard(threading.Thread):
    """A subscriber to every reading (QoS 1), as a dashboard would be: its deliveries are in the
    delivery log, for ``mqttmesh analyze audit``."""

    def __init__(self, host: str, port: int, client_id: str = "dashboard", topic_filter: str = "sensors/#"):
        super().__init__(daemon=True)
        self.sock = socket.create_connection((host, port), timeout=10)
        self.sock.sendall(encode(Connect(client_id, True, 60)) + encode(Subscribe(1, [(topic_filter, 1)])))
        self.decoder = Decoder()
        self.stopped = threading.Event()
        self.received = 0
        self.subscribed = threading.Event()

    def run(self) -> None:
        self.sock.settimeout(0.2)
        while not self.stopped.is_set():
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                return
            if not data:
                return
            self.decoder.feed(data)
            acks = []
            for p in self.decoder.packets():
                if p.type == SUBACK:
                    self.subscribed.set()
                elif p.type == PUBLISH:
                    self.received += 1
                    if p.qos == 1:
                        acks.append(encode(PubAck(p.packet_id)))
            if acks:
                self.sock.sendall(b"".join(acks))

    def close(self) -> None:
        self.stopped.set()
        self.join(2)
        try:
            self.sock.sendall(encode(Disconnect()))
        except OSError:
            pass
        self.sock.close()


def _free_ports(n: int) -> list[int]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def run_demo(args: argparse.Namespace) -> int:
    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    if args.ports and not args.archive:
        print("mqttmesh demo: --ports needs --archive (the archive directory of those nodes)", file=sys.stderr)
        return 2
    if min(args.nodes, args.sites, args.devices) < 1 or args.rate <= 0 or args.duration <= 0:
        print("mqttmesh demo: --nodes, --sites, --devices, --rate and --duration must be positive", file=sys.stderr)
        return 2
    cluster = None
    if args.ports:
        try:
            ports = [int(p) for p in args.ports.split(",") if p]
        except ValueError:
            print(f"mqttmesh demo: --ports {args.ports!r} is not a list of ports", file=sys.stderr)
            return 2
        archive = os.path.abspath(args.archive)
    else:
        from .admin import LocalMesh

        archive = os.path.join(out, "archive")
        # the mesh is stopped before the analysis, which writes every node's last files
        extra = ["--archive", "true", "--archive-dir", archive, "--archive-delivery-log", "true"]
        cluster = LocalMesh(args.nodes, "full", 0, workdir=os.path.join(out, "mesh"), extra=extra)
        cluster.ports = ports = _free_ports(args.nodes)
        print(
            f"mqttmesh demo: starting {args.nodes} nodes on ports {', '.join(map(str, ports))} "
            f"(logs in {cluster.workdir})",
            flush=True,
        )
        cluster.start()
        try:
            took = cluster.wait_converged(60)
        except (TimeoutError, RuntimeError) as exc:
            print(f"mqttmesh demo: {exc}", file=sys.stderr)
            cluster.stop()
            return 1
        print(f"mqttmesh demo: the mesh converged in {took:.1f}s", flush=True)
    fleet = device_fleet(args.sites, args.devices, len(ports), args.seed)
    print(
        f"mqttmesh demo: {len(fleet)} devices at {args.sites} sites publish {args.rate:g} readings/s each "
        f"for {args.duration:g}s on {len(ports)} nodes",
        flush=True,
    )
    dashboard = _Dashboard("127.0.0.1", ports[-1])
    dashboard.start()
    if not dashboard.subscribed.wait(10):
        print("mqttmesh demo: the dashboard subscriber got no SUBACK", file=sys.stderr)
    time.sleep(1.0)  # let the dashboard's subscription reach the other nodes before the first reading
    counts: dict[int, int] = {}
    errors: list[str] = []
    threads = [
        threading.Thread(
            target=_publish_on,
            args=("127.0.0.1", port, [d for d in fleet if d.node == i], args.rate, args.duration, counts, errors),
        )
        for i, port in enumerate(ports)
    ]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        deadline = time.monotonic() + 10
        while dashboard.received < sum(counts.values()) and time.monotonic() < deadline:
            time.sleep(0.05)
        dashboard.close()
    finally:
        if cluster is not None:
            print("mqttmesh demo: stopping the mesh (each node writes what it still holds)", flush=True)
            cluster.stop()
    if errors:
        for e in errors:
            print(f"mqttmesh demo: {e}", file=sys.stderr)
        return 1
    print(
        f"mqttmesh demo: published {sum(counts.values())} messages "
        f"({', '.join(f'{counts.get(p, 0)} on port {p}' for p in ports)}); the dashboard received "
        f"{dashboard.received}",
        flush=True,
    )
    if cluster is None:
        time.sleep(args.settle)  # the nodes write their files every archive.flush_interval
    return _analyze(args, archive, out)


def _analyze(args, archive: str, out: str) -> int:
    try:
        from .pipeline.jobs import job_options, run_payloads, run_traffic
        from .pipeline.session import build_session
    except ImportError as exc:
        print(
            f"mqttmesh demo: the analysis needs pyspark, pyarrow and matplotlib ({exc}); "
            f"install them with: pip install 'mqttmesh[pipeline]'",
            file=sys.stderr,
        )
        return 2

    def say(text: str) -> None:
        print(f"mqttmesh demo: {text}", file=sys.stderr, flush=True)

    print("mqttmesh demo: starting Spark for the traffic and payloads jobs", flush=True)
    spark = build_session("mqttmesh-demo", args.master, 4)
    try:
        reports = []
        for name, job in (("traffic", run_traffic), ("payloads", run_payloads)):
            opts = job_options(archive=[archive], out=os.path.join(out, "reports", name), window=args.window)
            result = job(spark, opts, say)
            summary = ", ".join(
                f"{k} {v}"
                for k, v in result.summary.items()
                if k
                in ("messages", "bytes", "publishers", "topics", "nodes", "json_objects", "non_json", "numeric_fields")
            )
            print(f"mqttmesh demo: {name}: {summary} ({result.seconds:.1f}s)", flush=True)
            reports.append(result.html)
    finally:
        spark.stop()
    print("\nreports:")
    for path in reports:
        print(f"  {path}")
    print(f"""
more: the delivery log is on, so the audit works too:
  mqttmesh analyze audit --archive {archive} --out {os.path.join(out, "reports", "audit")} \\
      --expect 'dashboard=sensors/#'""")
    return 0
