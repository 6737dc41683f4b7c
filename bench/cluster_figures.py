"""Figures of the mesh-wide MQTT service (issue 6), on a local 3-node full mesh.

    .venv/bin/python -m bench.cluster_figures [--repeat 5] [--retained 10000] [--sessions 2000]

* session hand-over: a CleanSession=0 client with 5 subscriptions and 100 queued QoS 1
  messages reconnects on another node: time from sending CONNECT to CONNACK (the session
  is gathered before CONNACK), and to the last queued message;
* takeover: the same ClientId connects on another node while connected: CONNECT -> CONNACK;
* wills: a node is killed (SIGKILL); time until a subscriber on another node has the will
  of a client that was connected to it (mesh.will_delay is 0.5 s by default);
* retained lookups on a mesh holding N retained topics: SUBSCRIBE -> last retained message,
  for an exact topic and for '#';
* memory per replicated session: RSS of a node before and after N persistent sessions
  (one subscription each, 10 queued 64-byte messages) are held on it.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

from mqttmesh.mesh.cluster.hrw import owners
from support import mqttraw as raw

from .mesh_figures import Nodes, free_port


def mesh3(wd: str) -> Nodes:
    nodes = Nodes(wd)
    ports = {n: free_port() for n in "abc"}
    nodes.start("a", ports["a"], ["--connect", "all"])
    nodes.start("b", ports["b"], ["--connect", "all", "--peer", f"127.0.0.1:{ports['a']}"])
    nodes.start("c", ports["c"], ["--connect", "all", "--peer", f"127.0.0.1:{ports['a']}"])
    nodes.wait(lambda: all(len(nodes.status(n)["neighbours"]) == 2 for n in "abc"), 30, "full mesh")
    return nodes


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def publish_all(port: int, items, qos=1, retain=False):
    with raw.RawClient("127.0.0.1", port, timeout=10) as c:
        c.connect(client_id=f"feeder-{time.monotonic_ns()}")
        window = []
        for i, (topic, payload) in enumerate(items):
            pid = i % 65535 + 1
            c.send(raw.publish(topic, payload, qos, retain, pid=pid))
            window.append(pid)
            if len(window) >= 200:
                for _ in window:
                    c.expect(raw.PUBACK)
                window = []
        for _ in window:
            c.expect(raw.PUBACK)


def handover(nodes: Nodes, i: int) -> tuple[float, float, float]:
    cid = f"roam{i}"
    with raw.RawClient("127.0.0.1", nodes.ports["a"]) as c:
        c.connect(client_id=cid, clean=False)
        c.send(raw.subscribe(1, *[(f"ho{i}/{k}", 1) for k in range(5)]))
        c.expect(raw.SUBACK)
        c.send(raw.DISCONNECT_BYTES)
    nodes.wait(lambda: f"ho{i}/0" in nodes.status("c")["nodes"]["a"]["filters"], 10, "interest")
    publish_all(nodes.ports["c"], [(f"ho{i}/0", b"x" * 64)] * 100)
    time.sleep(0.2)  # let the holders take the last messages (a measurement, not a test)
    with raw.RawClient("127.0.0.1", nodes.ports["b"], timeout=10) as c:
        started = time.monotonic()
        ack = c.connect(client_id=cid, clean=False)
        connack = time.monotonic() - started
        assert ack.body == b"\x01\x00", ack
        got = 0
        while got < 100:
            p = c.recv(10)
            if p.type == raw.PUBLISH:
                got += 1
                c.send(raw.puback(p.packet_id))
        drained = time.monotonic() - started
        # takeover of a live connection from another node
        other = raw.RawClient("127.0.0.1", nodes.ports["c"], timeout=10)
        started = time.monotonic()
        other.connect(client_id=cid, clean=False)
        takeover = time.monotonic() - started
        other.close()
    return connack, drained, takeover


def wills(repeat: int) -> list[float]:
    out = []
    for _ in range(repeat):
        with tempfile.TemporaryDirectory(prefix="mqttmesh-fig-") as wd:
            nodes = mesh3(wd)
            try:
                watcher = raw.RawClient("127.0.0.1", nodes.ports["b"])
                watcher.connect(client_id="watcher")
                watcher.send(raw.subscribe(1, ("wills/#", 1)))
                watcher.expect(raw.SUBACK)
                nodes.wait(lambda nodes=nodes: "wills/#" in nodes.status("a")["nodes"]["b"]["filters"], 10, "interest")
                doomed = raw.RawClient("127.0.0.1", nodes.ports["a"])
                doomed.connect(client_id="doomed", will=("wills/doomed", b"gone", 1, False))
                time.sleep(0.3)  # the registration reaches its registrar
                started = time.monotonic()
                nodes.kill("a")
                while True:
                    p = watcher.recv(15)
                    if p.type == raw.PUBLISH:
                        out.append(time.monotonic() - started)
                        break
                watcher.close()
                doomed.close()
            finally:
                nodes.stop()
    return out


def retained(nodes: Nodes, count: int, repeat: int) -> tuple[list[float], list[float]]:
    publish_all(nodes.ports["a"], [(f"ret/{i // 100}/{i % 100}", b"v" * 64) for i in range(count)], retain=True)
    time.sleep(1.0)  # owners receive their copies (a measurement, not a test)
    exact, every = [], []
    for r in range(repeat):
        topic = f"ret/{r % 100}/{(r * 7) % 100}"
        with raw.RawClient("127.0.0.1", nodes.ports["c"], timeout=10) as c:
            c.connect(client_id=f"look-{r}")
            started = time.monotonic()
            c.send(raw.subscribe(1, (topic, 0)))
            while c.recv(10).type != raw.PUBLISH:
                pass
            exact.append(time.monotonic() - started)
            c.send(raw.subscribe(2, ("ret/#", 0)))
            started = time.monotonic()
            got = 0
            while got < count:
                if c.recv(10).type == raw.PUBLISH:
                    got += 1
            every.append(time.monotonic() - started)
    return exact, every


def session_memory(nodes: Nodes, sessions: int) -> float:
    holder = "b"
    pid = nodes.procs[holder].pid
    cids = [f"mem{i}" for i in range(sessions * 4) if holder in owners(f"mem{i}", ["a", "b", "c"], 2)][:sessions]
    before = rss_kib(pid)
    for cid in cids:
        with raw.RawClient("127.0.0.1", nodes.ports["a"]) as c:
            c.connect(client_id=cid, clean=False)
            c.send(raw.subscribe(1, (f"mem/{cid}", 1)))
            c.expect(raw.SUBACK)
            c.send(raw.DISCONNECT_BYTES)
    time.sleep(1.0)
    publish_all(nodes.ports["c"], [(f"mem/{cid}", b"m" * 64) for cid in cids for _ in range(10)])
    time.sleep(1.0)
    return (rss_kib(pid) - before) * 1024 / len(cids)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--retained", type=int, default=10_000)
    ap.add_argument("--sessions", type=int, default=2000)
    args = ap.parse_args(argv)

    def ms(values):
        return (
            f"median {statistics.median(values) * 1000:.1f} ms (min {min(values) * 1000:.1f}, "
            f"max {max(values) * 1000:.1f}, n={len(values)})"
        )

    with tempfile.TemporaryDirectory(prefix="mqttmesh-fig-") as wd:
        nodes = mesh3(wd)
        try:
            hand = [handover(nodes, i) for i in range(args.repeat)]
            print(f"session hand-over, CONNECT -> CONNACK (session present): {ms([h[0] for h in hand])}")
            print(f"session hand-over, CONNECT -> 100th queued message:      {ms([h[1] for h in hand])}")
            print(f"takeover of a live connection from another node:          {ms([h[2] for h in hand])}")
            exact, every = retained(nodes, args.retained, args.repeat)
            print(f"retained lookup, exact topic, {args.retained} retained topics: {ms(exact)}")
            print(f"retained lookup, all {args.retained} topics ('ret/#'):        {ms(every)}")
            per = session_memory(nodes, args.sessions)
            print(
                f"memory per replicated session (1 subscription, 10 queued 64-byte messages): "
                f"{per / 1024:.1f} KiB on a holder node"
            )
        finally:
            nodes.stop()
    w = wills(args.repeat)
    print(f"will of a client on a killed node, at a subscriber on another: {ms(w)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
