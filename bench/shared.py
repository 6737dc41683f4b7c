"""A shared-subscription workload, beside Mosquitto in the same run (issue 24).

4 publishers publish a bounded number of QoS 0 or 1 messages each (64-byte payloads, the
load generator's: publisher, sequence, send time) to ``bench/shared/{i}``; 6 members of
``$share/bench/bench/shared/#`` take them, acknowledging QoS 1 at once. Publishers keep at
most ``--window`` messages ahead of what the group has received in all (so every broker is
measured at the rate it sustains, not at how it buffers). Per broker and round it reports
messages delivered per second (first PUBLISH to last delivery), the fraction delivered
(each message to exactly one member: a second copy is counted apart), each member's share
(the spread: the smallest and the largest share over the fair one), the broker's CPU per
delivered message (summed over every node process), and the latency's median and p99.
Rounds alternate the brokers (each round starting one further along); the medians over
rounds are printed last.

With ``--nodes 3`` mqttmesh runs as a real 3-node mesh (every node dials the ones started
before it), member j on node j mod 3 (2 per node) and publisher i on node i mod 3
(``--publishers-on all``) or all on node 0 (``one``); Mosquitto stays one node and takes the
same clients. A row then also says which fraction of the deliveries crossed a peer link for
the group (the member's node is not the publisher's). ``--strategy`` sets
``mqtt.shared_strategy`` on every mqttmesh node; ``--strategy`` and ``--publishers-on`` take
comma-separated lists, and every combination is a row of its own, in the same rounds:

    python -m bench.shared [--brokers mqttmesh,mosquitto] [--qos 1] [--messages 20000]
                           [--rounds 3] [--nodes 1|3] [--strategy local,round_robin,...]
                           [--publishers-on all,one] [--out FILE.json] [--logs DIR]

Publishers and members run in two processes (the generator, not the broker, would be the
bottleneck in one); every run is bounded in messages and in time (``--timeout``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import statistics
import struct
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench import mqttproto as proto
from bench.brokers import BrokerServer, Endpoint, Mosquitto, MqttmeshNodes, Target

PUBLISHERS = 4
MEMBERS = 6
GROUP_FILTER = "$share/bench/bench/shared/#"
STRATEGIES = ("local", "round_robin", "hash_topic", "hash_clientid", "sticky")
PLACEMENTS = ("all", "one")  # publishers spread over the nodes, or all on node 0
_HEAD = struct.Struct("!IIQQ")  # run, publisher, seq, send time (monotonic ns)
_CONNACK_UNAVAILABLE = 3  # a mesh node that has not learned the mesh yet


@dataclass
class Variant:
    """One row of the table: a broker, the strategy its nodes use, where the publishers go."""

    label: str
    server: BrokerServer
    strategy: str | None = None  # None: the node's default
    publishers_on: str = "all"


def placement(nodes: int, publishers_on: str) -> tuple[list[int], list[int]]:
    """(the node of each publisher, the node of each member): members 2 per node (j mod n),
    publishers i mod n (``all``) or on node 0 (``one``)."""
    pubs = [i % nodes if publishers_on == "all" else 0 for i in range(PUBLISHERS)]
    return pubs, [j % nodes for j in range(MEMBERS)]


async def _open(
    host: str, port: int, client_id: str, deadline: float
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    while True:
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(proto.connect(client_id))
        await writer.drain()
        head = await reader.readexactly(4)
        if head[0] >> 4 == proto.CONNACK and head[3] == _CONNACK_UNAVAILABLE and time.monotonic() < deadline:
            writer.close()  # (asked again: the node is still learning the mesh)
            await asyncio.sleep(0.1)
            continue
        if head[0] >> 4 != proto.CONNACK or head[3] != 0:
            raise RuntimeError(f"{client_id}: CONNACK {head!r}")
        return reader, writer


async def _members(endpoints: list[Endpoint], qos: int, total: int, counts, ready, deadline: float) -> dict:
    """The group's members (member j on ``endpoints[j]``) until ``total`` messages arrived in
    all (or the deadline)."""
    got: list[list[tuple[int, int, int]]] = [[] for _ in range(MEMBERS)]  # (publisher, seq, latency ns)
    last = [0.0]  # when the last message arrived (monotonic seconds)

    async def member(j: int) -> None:
        reader, writer = await _open(endpoints[j].host, endpoints[j].port, f"member{j}", deadline)
        writer.write(proto.subscribe(1, [(GROUP_FILTER, qos)]))
        await writer.drain()
        buf = b""
        subscribed = False
        mine = got[j]
        while sum(len(g) for g in got) < total and time.monotonic() < deadline:
            try:
                data = await asyncio.wait_for(reader.read(65536), 0.2)
            except TimeoutError:
                continue  # (the others may have taken the rest)
            if not data:
                break
            buf += data
            frames, rest = proto.split_frames(buf)
            acks = []
            for first, start, _end in frames:
                kind = first >> 4
                if kind == proto.SUBACK:
                    if buf[start + 2] & 0x80:
                        raise RuntimeError(f"member{j}: SUBACK {buf[start + 2]:#x}")
                    subscribed = True
                    with ready.get_lock():
                        ready.value += 1
                    continue
                if kind != proto.PUBLISH:
                    continue
                tlen = (buf[start] << 8) | buf[start + 1]
                pos = start + 2 + tlen
                if (first >> 1) & 3:
                    pid = (buf[pos] << 8) | buf[pos + 1]
                    pos += 2
                    acks.append(proto.ack(proto.PUBACK_B, pid))
                _, pub, seq, sent = _HEAD.unpack_from(buf, pos)
                mine.append((pub, seq, time.monotonic_ns() - sent))
            if acks:
                writer.write(b"".join(acks))
            if frames:
                last[0] = time.monotonic()
            counts.value = sum(len(g) for g in got)
            buf = buf[rest:]
        if not subscribed:
            raise RuntimeError(f"member{j} got no SUBACK")
        writer.write(proto.DISCONNECT_PACKET)
        writer.close()

    await asyncio.gather(*(member(j) for j in range(MEMBERS)))
    return {"got": got, "last": last[0]}


def _members_main(endpoints, qos, total, counts, ready, deadline, out) -> None:
    try:
        out.put(asyncio.run(_members(endpoints, qos, total, counts, ready, deadline)))
    except Exception as exc:  # (reported by the parent)
        out.put({"error": repr(exc)})


async def _publishers(endpoints: list[Endpoint], qos: int, per_pub: int, window: int, counts, deadline: float) -> float:
    """Every publisher's messages (publisher i on ``endpoints[i]``), at most ``window`` ahead
    of the group's count; when the first PUBLISH left (monotonic seconds)."""
    started = time.monotonic()
    sent_total = [0]

    async def publisher(i: int) -> None:
        reader, writer = await _open(endpoints[i].host, endpoints[i].port, f"pub{i}", deadline)
        prefix = proto.publish_prefix(f"bench/shared/{i}", qos)
        acked = [0]

        async def read_acks() -> None:
            buf = b""
            while acked[0] < per_pub and time.monotonic() < deadline:
                try:
                    data = await asyncio.wait_for(reader.read(65536), 1.0)
                except TimeoutError:
                    continue
                if not data:
                    return
                buf += data
                frames, rest = proto.split_frames(buf)
                acked[0] += sum(1 for first, _, _ in frames if first >> 4 == proto.PUBACK)
                buf = buf[rest:]

        acker = asyncio.create_task(read_acks()) if qos else None
        seq = 0
        while seq < per_pub and time.monotonic() < deadline:
            if sent_total[0] - counts.value >= window:
                await asyncio.sleep(0.0005)
                continue
            burst = []
            for _ in range(min(50, per_pub - seq)):
                seq += 1
                payload = _HEAD.pack(0, i, seq, time.monotonic_ns()).ljust(proto.PAYLOAD_SIZE, b"\0")
                burst.append(prefix + (struct.pack("!H", (seq % 65535) + 1) if qos else b"") + payload)
            sent_total[0] += len(burst)
            writer.write(b"".join(burst))
            await writer.drain()
        if acker is not None:
            await acker
        writer.write(proto.DISCONNECT_PACKET)
        writer.close()

    await asyncio.gather(*(publisher(i) for i in range(PUBLISHERS)))
    return started


def _mesh_status(ep: Endpoint, deadline: float) -> dict:
    from mqttmesh.admin import fetch_status  # (only a mesh needs it)

    return fetch_status(ep.host, ep.port, max(0.5, min(5.0, deadline - time.monotonic())))


def _wait_for_mesh(target: Target, deadline: float) -> None:
    """Until every node reaches every other one (before the members connect)."""
    while True:
        try:
            if all(
                len(s["nodes"]) == len(target.nodes) and all(n["reachable"] for n in s["nodes"].values())
                for s in (_mesh_status(ep, deadline) for ep in target.nodes)
            ):
                return
        except (OSError, ValueError, KeyError):
            pass
        if time.monotonic() > deadline:
            raise RuntimeError("the mesh did not form")
        time.sleep(0.1)


def _serves(filters: list[str]) -> bool:
    """A node's advertised filters name the group with a connected member: its share, alone
    or with the weight of its members ("\\0w2": mqttmesh.shared.WEIGHT), not queueing."""
    return any(f == GROUP_FILTER or f.startswith(GROUP_FILTER + "\0w") for f in filters)


def _wait_for_group(target: Target, pub_nodes: set[int], member_nodes: set[int], deadline: float) -> None:
    """Until each publisher's node knows the group at every node with members (else its first
    messages would go to the members it knows of, and the spread would measure the start)."""
    while True:
        try:
            if all(
                sum(
                    _serves(n["filters"]) and n["reachable"]
                    for n in _mesh_status(target.nodes[p], deadline)["nodes"].values()
                )
                == len(member_nodes)
                for p in pub_nodes
            ):
                return
        except (OSError, ValueError, KeyError):
            pass
        if time.monotonic() > deadline:
            raise RuntimeError("the group's interest did not reach the publishers' nodes")
        time.sleep(0.1)


def run_once(target: Target, qos: int, messages: int, window: int, timeout: float, publishers_on: str = "all") -> dict:
    """One round against a running broker (every node of ``target.nodes``)."""
    nodes = target.nodes or [target.pub_endpoint(0)]
    pub_node, member_node = placement(len(nodes), publishers_on)
    per_pub = messages // PUBLISHERS
    total = per_pub * PUBLISHERS
    ctx = mp.get_context("fork")
    counts, ready = ctx.Value("q", 0), ctx.Value("i", 0)
    out = ctx.Queue()
    deadline = time.monotonic() + timeout
    if len(nodes) > 1:
        _wait_for_mesh(target, deadline)
    member_eps = [nodes[n] for n in member_node]
    members = ctx.Process(target=_members_main, args=(member_eps, qos, total, counts, ready, deadline, out))
    members.start()
    try:
        while ready.value < MEMBERS:
            if time.monotonic() > deadline or not members.is_alive():
                raise RuntimeError("the members did not subscribe")
            time.sleep(0.01)
        if len(nodes) > 1:
            _wait_for_group(target, set(pub_node), set(member_node), deadline)
        cpu0 = target.cpu_seconds() or 0.0
        pub_eps = [nodes[n] for n in pub_node]
        started = asyncio.run(_publishers(pub_eps, qos, per_pub, window, counts, deadline))
        result = out.get(timeout=max(1.0, deadline - time.monotonic() + 5))
        cpu1 = target.cpu_seconds() or 0.0
    finally:
        members.join(10)
        if members.is_alive():
            members.kill()
            members.join(5)
    if "error" in result:
        raise RuntimeError(result["error"])
    got = result["got"]
    ids = [(p, s) for g in got for p, s, _ in g]
    distinct = len(set(ids))
    latencies = sorted(ns for g in got for _, _, ns in g)
    shares = [len(g) for g in got]
    fair = total / MEMBERS
    delivered = len(ids)
    # a delivery crossed a link for the group when its member is on another node than its publisher
    crossed = sum(1 for j, g in enumerate(got) for p, _, _ in g if pub_node[p] != member_node[j])
    seconds = max(1e-9, result["last"] - started)
    return {
        "broker": target.name,
        "nodes": len(nodes),
        "publishers_on": publishers_on,
        "qos": qos,
        "published": total,
        "delivered": distinct,
        "fraction": distinct / total,
        "twice": delivered - distinct,
        "msgs_per_s": distinct / seconds,
        "spread": [round(min(shares) / fair, 3), round(max(shares) / fair, 3)],
        "shares": shares,
        "crossed": crossed / max(1, delivered),
        "cpu_us_per_msg": (cpu1 - cpu0) / max(1, distinct) * 1e6,
        "p50_ms": latencies[len(latencies) // 2] / 1e6 if latencies else None,
        "p99_ms": latencies[int(len(latencies) * 0.99)] / 1e6 if latencies else None,
    }


def _mesh_args(count: int, strategy: str | None) -> list[list[str]]:
    """Each node's command line: node i dials every node before it (a full mesh of ``count``)."""
    out = []
    for i in range(count):
        args = ["--shared-strategy", strategy] if strategy else []
        if count > 1:
            args += ["--node-id", f"n{i}", "--cluster-secret", "bench-shared", "--status-interval", "0.25"]
            for k in range(i):
                args += ["--peer", f"{{host}}:{{ports[{k}]}}"]
        out.append(args)
    return out


def variants(
    brokers: list[str], nodes: int, strategies: list[str | None], placements: list[str], work: Path
) -> list[Variant]:
    """Every row of the run: Mosquitto once (one node, the placement means nothing there),
    mqttmesh per strategy and (with several nodes) per placement."""
    out = []
    for name in brokers:
        if name == "mosquitto":
            (work / name).mkdir(parents=True, exist_ok=True)
            out.append(Variant(name, Mosquitto(work / name)))
            continue
        for strategy in strategies:
            for where in placements if nodes > 1 else ["all"]:
                label = name if nodes == 1 else f"{name} x{nodes}"
                label += f" {strategy}" if strategy else ""
                label += f" pubs:{where}" if nodes > 1 else ""
                d = work / label.replace(" ", "_").replace(":", "-")
                d.mkdir(parents=True, exist_ok=True)
                server = MqttmeshNodes(d, count=nodes, extra_args=_mesh_args(nodes, strategy))
                out.append(Variant(label, server, strategy, where))
    return out


def _print_medians(results: list[dict], rows: list[Variant], qos: int, rounds: int, nodes: int) -> None:
    print(
        f"\nmedians over {rounds} rounds ({PUBLISHERS} publishers, {MEMBERS} members"
        f"{f' on {nodes} mqttmesh nodes' if nodes > 1 else ''}, QoS {qos}):"
    )
    print(
        "| broker | delivered msgs/s | fraction delivered | twice | spread (min, max of fair) | "
        "crossed a link | CPU µs/msg | p50 ms | p99 ms |"
    )
    print("|---|---:|---:|---:|---|---:|---:|---:|---:|")
    for v in rows:
        got = [x for x in results if x["label"] == v.label]
        if not got:
            continue

        def med(key: str, got: list[dict] = got) -> float:
            return statistics.median(x[key] for x in got)

        lo = statistics.median(x["spread"][0] for x in got)
        hi = statistics.median(x["spread"][1] for x in got)
        print(
            f"| {v.label} | {med('msgs_per_s'):,.0f} | {med('fraction'):.4f} | {sum(x['twice'] for x in got)} | "
            f"{lo:.2f}, {hi:.2f} | {med('crossed'):.2f} | {med('cpu_us_per_msg'):.1f} | "
            f"{med('p50_ms'):.2f} | {med('p99_ms'):.2f} |"
        )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.shared", description=__doc__.split("\n\n")[0])
    ap.add_argument("--brokers", default="mqttmesh,mosquitto")
    ap.add_argument("--qos", type=int, default=1, choices=(0, 1))
    ap.add_argument("--messages", type=int, default=20_000, help="in all, per round")
    ap.add_argument("--window", type=int, default=2_000, help="messages the publishers keep ahead of the group")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds per round, at most")
    ap.add_argument("--nodes", type=int, default=1, help="mqttmesh nodes in a full mesh (Mosquitto: always one)")
    ap.add_argument("--strategy", help=f"mqtt.shared_strategy of the mqttmesh nodes, a list of {', '.join(STRATEGIES)}")
    ap.add_argument("--publishers-on", default="all", help="all: spread over the nodes; one: all on node 0; or both")
    ap.add_argument("--out", help="the results as JSON")
    ap.add_argument("--logs", help="where the brokers' logs go (default: a new /tmp/bench-shared-* directory)")
    args = ap.parse_args(argv)
    brokers = args.brokers.split(",")
    for name in brokers:
        if name not in ("mqttmesh", "mosquitto"):
            ap.error(f"unknown broker {name!r} (mqttmesh, mosquitto)")
    strategies: list[str | None] = list(args.strategy.split(",")) if args.strategy else [None]
    for s in strategies:
        if s is not None and s not in STRATEGIES:
            ap.error(f"unknown strategy {s!r} ({', '.join(STRATEGIES)})")
    placements = args.publishers_on.split(",")
    for p in placements:
        if p not in PLACEMENTS:
            ap.error(f"unknown --publishers-on {p!r} ({', '.join(PLACEMENTS)})")
    if args.nodes < 1:
        ap.error("--nodes is at least 1")
    work = Path(args.logs) if args.logs else Path(tempfile.mkdtemp(prefix="bench-shared-"))
    rows = variants(brokers, args.nodes, strategies, placements, work)
    results: list[dict] = []
    for r in range(args.rounds):
        for k in range(len(rows)):
            v = rows[(k + r) % len(rows)]  # each round starts one further along
            why = v.server.unavailable()
            if why:
                print(f"{v.label}: skipped, {why}", file=sys.stderr)
                continue
            target = v.server.start()
            try:
                row = run_once(target, args.qos, args.messages, args.window, args.timeout, v.publishers_on)
            finally:
                v.server.stop()
            row.update(round=r + 1, label=v.label, strategy=v.strategy)
            results.append(row)
            print(
                f"round {r + 1} {v.label:30s} QoS {args.qos}: {row['msgs_per_s']:9,.0f} msgs/s delivered, "
                f"{row['fraction']:.4f} delivered ({row['twice']} twice), spread {row['spread']}, "
                f"crossed {row['crossed']:.2f}, {row['cpu_us_per_msg']:.1f} us CPU/msg, "
                f"p50 {row['p50_ms']:.2f} ms, p99 {row['p99_ms']:.2f} ms",
                flush=True,
            )
    _print_medians(results, rows, args.qos, args.rounds, args.nodes)
    print(f"\nbroker logs: {work}")
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
