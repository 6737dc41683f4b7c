"""A shared-subscription workload, beside Mosquitto in the same run (issue 24).

4 publishers publish a bounded number of QoS 0 or 1 messages each (64-byte payloads, the
load generator's: publisher, sequence, send time) to ``bench/shared/{i}``; 6 members of
``$share/bench/bench/shared/#`` take them, acknowledging QoS 1 at once. Publishers keep at
most ``--window`` messages ahead of what the group has received in all (so every broker is
measured at the rate it sustains, not at how it buffers). Per broker and round it reports
messages delivered per second (first PUBLISH to last delivery), the fraction delivered
(each message to exactly one member: a second copy is counted apart), each member's share
(the spread: the smallest and the largest share over the fair one), the broker's CPU per
delivered message, and the latency's median and p99. Rounds alternate the brokers; the
medians over rounds are printed last.

    python -m bench.shared [--brokers mqttmesh,mosquitto] [--qos 1] [--messages 20000]
                           [--rounds 3] [--out FILE.json]

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
from pathlib import Path

from bench import mqttproto as proto
from bench.brokers import Mosquitto, MqttmeshNodes, Target

PUBLISHERS = 4
MEMBERS = 6
GROUP_FILTER = "$share/bench/bench/shared/#"
_HEAD = struct.Struct("!IIQQ")  # run, publisher, seq, send time (monotonic ns)


async def _open(host: str, port: int, client_id: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(proto.connect(client_id))
    await writer.drain()
    head = await reader.readexactly(4)
    if head[0] >> 4 != proto.CONNACK or head[3] != 0:
        raise RuntimeError(f"{client_id}: CONNACK {head!r}")
    return reader, writer


async def _members(host: str, port: int, qos: int, total: int, counts, ready, deadline: float) -> dict:
    """The group's members until ``total`` messages arrived in all (or the deadline)."""
    got: list[list[tuple[int, int, int]]] = [[] for _ in range(MEMBERS)]  # (publisher, seq, latency ns)
    last = [0.0]  # when the last message arrived (monotonic seconds)

    async def member(j: int) -> None:
        reader, writer = await _open(host, port, f"member{j}")
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


def _members_main(host, port, qos, total, counts, ready, deadline, out) -> None:
    try:
        out.put(asyncio.run(_members(host, port, qos, total, counts, ready, deadline)))
    except Exception as exc:  # (reported by the parent)
        out.put({"error": repr(exc)})


async def _publishers(host: str, port: int, qos: int, per_pub: int, window: int, counts, deadline: float) -> float:
    """Every publisher's messages, at most ``window`` ahead of the group's count; when the
    first PUBLISH left (monotonic seconds)."""
    started = time.monotonic()
    sent_total = [0]

    async def publisher(i: int) -> None:
        reader, writer = await _open(host, port, f"pub{i}")
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


def run_once(target: Target, qos: int, messages: int, window: int, timeout: float) -> dict:
    """One round against a running broker."""
    ep = target.pub_endpoint(0)
    per_pub = messages // PUBLISHERS
    total = per_pub * PUBLISHERS
    ctx = mp.get_context("fork")
    counts, ready = ctx.Value("q", 0), ctx.Value("i", 0)
    out = ctx.Queue()
    deadline = time.monotonic() + timeout
    members = ctx.Process(target=_members_main, args=(ep.host, ep.port, qos, total, counts, ready, deadline, out))
    members.start()
    try:
        while ready.value < MEMBERS:
            if time.monotonic() > deadline or not members.is_alive():
                raise RuntimeError("the members did not subscribe")
            time.sleep(0.01)
        cpu0 = target.cpu_seconds() or 0.0
        started = asyncio.run(_publishers(ep.host, ep.port, qos, per_pub, window, counts, deadline))
        result = out.get(timeout=max(1.0, deadline - time.monotonic() + 5))
        cpu1 = target.cpu_seconds() or 0.0
    finally:
        members.join(10)
        if members.is_alive():
            members.kill()
    if "error" in result:
        raise RuntimeError(result["error"])
    got = result["got"]
    ids = [(p, s) for g in got for p, s, _ in g]
    distinct = len(set(ids))
    latencies = sorted(ns for g in got for _, _, ns in g)
    shares = [len(g) for g in got]
    fair = total / MEMBERS
    delivered = len(ids)
    seconds = max(1e-9, result["last"] - started)
    return {
        "broker": target.name,
        "qos": qos,
        "published": total,
        "delivered": distinct,
        "fraction": distinct / total,
        "twice": delivered - distinct,
        "msgs_per_s": distinct / seconds,
        "spread": [round(min(shares) / fair, 3), round(max(shares) / fair, 3)],
        "cpu_us_per_msg": (cpu1 - cpu0) / max(1, distinct) * 1e6,
        "p50_ms": latencies[len(latencies) // 2] / 1e6 if latencies else None,
        "p99_ms": latencies[int(len(latencies) * 0.99)] / 1e6 if latencies else None,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.shared", description=__doc__.split("\n\n")[0])
    ap.add_argument("--brokers", default="mqttmesh,mosquitto")
    ap.add_argument("--qos", type=int, default=1, choices=(0, 1))
    ap.add_argument("--messages", type=int, default=20_000, help="in all, per round")
    ap.add_argument("--window", type=int, default=2_000, help="messages the publishers keep ahead of the group")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds per round, at most")
    ap.add_argument("--out", help="the results as JSON")
    args = ap.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="bench-shared-"))
    servers = {}
    for name in args.brokers.split(","):
        if name == "mqttmesh":
            servers[name] = MqttmeshNodes(work / "mqttmesh")
        elif name == "mosquitto":
            servers[name] = Mosquitto(work / "mosquitto")
        else:
            ap.error(f"unknown broker {name!r} (mqttmesh, mosquitto)")
        (work / name).mkdir(parents=True, exist_ok=True)
    results: list[dict] = []
    for r in range(args.rounds):
        for name, server in servers.items():
            why = server.unavailable()
            if why:
                print(f"{name}: skipped, {why}", file=sys.stderr)
                continue
            target = server.start()
            try:
                row = run_once(target, args.qos, args.messages, args.window, args.timeout)
            finally:
                server.stop()
            row["round"] = r + 1
            results.append(row)
            print(
                f"round {r + 1} {name:10s} QoS {args.qos}: {row['msgs_per_s']:9,.0f} msgs/s delivered, "
                f"{row['fraction']:.4f} delivered ({row['twice']} twice), spread {row['spread']}, "
                f"{row['cpu_us_per_msg']:.1f} us CPU/msg, p50 {row['p50_ms']:.2f} ms, p99 {row['p99_ms']:.2f} ms",
                flush=True,
            )
    print(f"\nmedians over {args.rounds} rounds ({PUBLISHERS} publishers, {MEMBERS} members, QoS {args.qos}):")
    head = "| broker | delivered msgs/s | fraction delivered | twice | spread (min, max of fair) | CPU µs/msg |"
    print(head + " p50 ms | p99 ms |")
    print("|---|---:|---:|---:|---|---:|---:|---:|")
    for name in servers:
        rows = [x for x in results if x["broker"] == servers[name].name]
        if not rows:
            continue

        def med(key: str, rows: list[dict] = rows) -> float:
            return statistics.median(x[key] for x in rows)

        spread = [min(x["spread"][0] for x in rows), max(x["spread"][1] for x in rows)]
        print(
            f"| {name} | {med('msgs_per_s'):,.0f} | {med('fraction'):.4f} | {sum(x['twice'] for x in rows)} | "
            f"{spread[0]:.2f}, {spread[1]:.2f} | {med('cpu_us_per_msg'):.1f} | "
            f"{med('p50_ms'):.2f} | {med('p99_ms'):.2f} |"
        )
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
