"""The mesh over a distance: what a publish waits for when node-to-node links are slow (issue 26).

    python -m bench.wan [--delay 0.025] [--jitter 0.005] [--rounds 2] [--messages 100]
                        [--rate 10] [--qos 1,2] [--sessions clean,persistent] [--out FILE.json] [--md]

Three mqttmesh nodes (a, b, c), each with a data directory, in a full mesh whose every
node-to-node connection goes through a relay (tests/support/faultrelay.py) that delays what
it forwards by ``--delay`` seconds (± ``--jitter``, uniformly, in order) one way; the clients
connect to their nodes directly (no delay). A publisher on a publishes ``--messages`` 64-byte
messages at ``--rate`` a second, paced, not waiting for acknowledgements (at 10/s and these
latencies one or two are in flight, so hardly anything queues behind another); a
subscriber on a (``local``) and one on b (``remote``) subscribe to them at the same QoS and
acknowledge at once. Per message: publish -> PUBACK (QoS 1) or PUBREC and PUBCOMP (QoS 2)
at the publisher, publish -> PUBLISH at each subscriber. Every variant (session kind x QoS)
is measured with the relays at the delay and at no delay, each round on freshly started
nodes, the two meshes alternating; the table gives medians and p99 over the rounds' messages,
and how many peer round trips (2 x delay) each median is above the same figure without delay.

Every process and relay started is ended by its PID / its close, also on Ctrl-C.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from support.faultrelay import FaultRelay

from . import mqttproto as mq
from .brokers import HOST, REGISTRY, MqttmeshNodes, Target
from .mesh_cost import MD_END, wait_meshed, write_markdown
from .ports import free_port

REPO = Path(__file__).resolve().parent.parent
SECRET = "bench-wan"
MD_BEGIN = "<!-- BEGIN kept: bench/wan.py writes this section -->"
WARM = 5  # messages published before the counted ones (routes, sessions, connections warm)
_HEAD = mq.PAYLOAD_HEAD  # run, publisher, seq, send time (monotonic ns)


class Mesh3:
    """Three nodes, every ordered pair's connection through a relay of its own."""

    def __init__(self, workdir: Path, delay: float, jitter: float):
        self.relays: dict[tuple[int, int], FaultRelay] = {}
        self.server: MqttmeshNodes | None = None
        self.workdir = workdir
        self.delay, self.jitter = delay, jitter

    def start(self) -> Target:
        ports = [free_port() for _ in range(3)]
        for a, b in itertools.permutations(range(3), 2):
            relay = FaultRelay(HOST, ports[b])
            if self.delay:
                relay.delay(self.delay, self.jitter)
            self.relays[(a, b)] = relay
        args = []
        for a in range(3):
            data = self.workdir / f"n{a}"
            data.mkdir(parents=True, exist_ok=True)
            peers = [x for b in range(3) if b != a for x in ("--peer", self.relays[(a, b)].address)]
            args.append(
                ["--cluster-secret", SECRET, "--node-id", f"n{a}", "--connect", "configured", "--data-dir", str(data)]
                + peers
            )
        self.server = MqttmeshNodes(self.workdir, count=3, extra_args=args, ports=ports)
        target = self.server.start()
        wait_meshed(target)
        return target

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
        for relay in self.relays.values():
            relay.close()
        self.relays.clear()


# --------------------------------------------------------------------------- clients


class Client(asyncio.Protocol):
    """One MQTT 3.1.1 client: a publisher (``publish``) or a subscriber (``subscribe``)."""

    def __init__(self, client_id: str, clean: bool):
        self.client_id, self.clean = client_id, clean
        self.transport: asyncio.Transport | None = None
        self.buf = b""
        loop = asyncio.get_running_loop()
        self.connack: asyncio.Future = loop.create_future()
        self.suback: asyncio.Future | None = None  # made by subscribe
        self.sent: dict[int, int] = {}  # packet id -> send time (ns), awaiting PUBACK / PUBREC
        self.releasing: dict[int, int] = {}  # QoS 2: packet id -> send time, awaiting PUBCOMP
        self.acked: list[tuple[int, int]] = []  # (seq, ns to PUBACK or PUBREC)
        self.completed: list[tuple[int, int]] = []  # (seq, ns to PUBCOMP)
        self.seq_of: dict[int, int] = {}
        self.got: dict[int, int] = {}  # seq -> ns from publish to arrival (first copy)
        self.dups = 0
        self.lost_reason: str | None = None
        self.idle = asyncio.Event()

    def connection_made(self, transport):
        self.transport = transport
        transport.write(mq.connect(self.client_id, clean=self.clean))

    def connection_lost(self, exc):
        self.lost_reason = f"{self.client_id}: connection lost ({exc})"
        for fut in (self.connack, self.suback):
            if fut is not None and not fut.done():
                fut.set_exception(ConnectionError(self.lost_reason))

    def data_received(self, data: bytes) -> None:
        now = time.monotonic_ns()
        data = self.buf + data
        frames, pos = mq.split_frames(data)
        self.buf = data[pos:]
        out = []
        for first, s, _e in frames:
            kind = first >> 4
            if kind == mq.PUBLISH:
                qos = (first >> 1) & 3
                p = s + 2 + ((data[s] << 8) | data[s + 1])
                if qos:
                    pid = (data[p] << 8) | data[p + 1]
                    out.append(mq.ack(mq.PUBACK_B if qos == 1 else mq.PUBREC_B, pid))
                    p += 2
                _run, _pub, seq, ts = _HEAD.unpack_from(data, p)
                if seq in self.got:
                    self.dups += 1
                else:
                    self.got[seq] = now - ts
            elif kind == mq.PUBREL:
                out.append(mq.ack(mq.PUBCOMP_B, (data[s] << 8) | data[s + 1]))
            elif kind in (mq.PUBACK, mq.PUBREC):
                pid = (data[s] << 8) | data[s + 1]
                ts = self.sent.pop(pid, None)
                if ts is not None:
                    self.acked.append((self.seq_of[pid], now - ts))
                    if kind == mq.PUBREC:
                        self.releasing[pid] = ts
                        out.append(mq.ack(mq.PUBREL_B, pid))
                if not self.sent and not self.releasing:
                    self.idle.set()
            elif kind == mq.PUBCOMP:
                pid = (data[s] << 8) | data[s + 1]
                ts = self.releasing.pop(pid, None)
                if ts is not None:
                    self.completed.append((self.seq_of[pid], now - ts))
                if not self.sent and not self.releasing:
                    self.idle.set()
            elif kind == mq.CONNACK and not self.connack.done():
                rc = data[s + 1]
                if rc:
                    self.connack.set_exception(ConnectionError(f"{self.client_id}: CONNACK {rc}"))
                else:
                    self.connack.set_result(True)
            elif kind == mq.SUBACK and self.suback is not None and not self.suback.done():
                self.suback.set_result(data[s + 2])
        if out and self.transport is not None:
            self.transport.write(b"".join(out))

    async def subscribe(self, topic_filter: str, qos: int) -> None:
        self.suback = asyncio.get_running_loop().create_future()
        assert self.transport is not None
        self.transport.write(mq.subscribe(1, [(topic_filter, qos)]))
        granted = await asyncio.wait_for(self.suback, 10)
        if granted != qos:
            raise ConnectionError(f"{self.client_id}: SUBACK {granted:#x} for QoS {qos}")

    def publish(self, prefix: bytes, qos: int, run: int, seq: int) -> None:
        pid = seq % 65535 + 1
        ts = time.monotonic_ns()
        self.sent[pid] = ts
        self.seq_of[pid] = seq
        self.idle.clear()
        assert self.transport is not None
        self.transport.write(prefix + mq.PAYLOAD_QOS12.pack(pid, run, 0, seq, ts))

    def close(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(mq.DISCONNECT_PACKET)
            self.transport.close()


async def _open(ep, client_id: str, clean: bool, attempts: int = 50) -> Client:
    """Connected (CONNACK 0); a node that cannot serve a persistent session yet answers 3:
    try again, as a client does."""
    loop = asyncio.get_running_loop()
    for _ in range(attempts):
        _, c = await loop.create_connection(lambda: Client(client_id, clean), ep.host, ep.port)
        try:
            await asyncio.wait_for(c.connack, 10)
            return c
        except ConnectionError:
            c.close()
            await asyncio.sleep(0.2)
    raise ConnectionError(f"{client_id}: no CONNACK 0 after {attempts} attempts")


@dataclass
class Sample:
    acked: list[int] = field(default_factory=list)  # ns: PUBACK (QoS 1) / PUBREC (QoS 2)
    completed: list[int] = field(default_factory=list)  # ns: PUBCOMP (QoS 2)
    local: list[int] = field(default_factory=list)
    remote: list[int] = field(default_factory=list)
    sent: int = 0
    missing: int = 0  # (message, subscriber) pairs that never arrived
    dups: int = 0


async def measure(target: Target, qos: int, clean: bool, messages: int, rate: float, run: int) -> Sample:
    """One variant: publisher and ``local`` subscriber on node 0, ``remote`` on node 1."""
    a, b = target.nodes[0], target.nodes[1]
    tag = f"wan{run}"
    topic = f"bench/wan/{run}"
    subs = [await _open(a, f"{tag}-local", clean), await _open(b, f"{tag}-remote", clean)]
    for s in subs:
        await s.subscribe(topic, qos)
    await asyncio.sleep(2.0)  # the subscriptions reach every node over the slow links
    pub = await _open(a, f"{tag}-pub", clean)
    prefix = mq.publish_prefix(topic, qos)
    t0 = time.monotonic()
    total = WARM + messages
    for seq in range(total):
        delay = t0 + seq / rate - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        pub.publish(prefix, qos, run, seq)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if pub.idle.is_set() and all(len(s.got) >= total for s in subs):
            break
        await asyncio.sleep(0.05)
    out = Sample(sent=messages)
    out.acked = [ns for seq, ns in pub.acked if seq >= WARM]
    out.completed = [ns for seq, ns in pub.completed if seq >= WARM]
    out.local = [ns for seq, ns in subs[0].got.items() if seq >= WARM]
    out.remote = [ns for seq, ns in subs[1].got.items() if seq >= WARM]
    out.missing = sum(messages - len(x) for x in (out.local, out.remote))
    out.dups = sum(s.dups for s in subs)
    for c in (pub, *subs):
        c.close()
    await asyncio.sleep(0.1)
    return out


# --------------------------------------------------------------------------- report


def _q(values: list[int], q: float) -> float | None:
    """The q-quantile (nearest rank) in ms."""
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, max(0, int(q * len(s) + 0.999999) - 1))] / 1e6


def _ms(values: list[int]) -> str:
    m = _q(values, 0.5)
    return "-" if m is None else f"{m:.1f}"


def table(results: dict, delay: float) -> str:
    rtt_ms = 2 * delay * 1000
    lines = [
        f"Medians and p99 in ms over every counted message of every round; `RTT`: how many peer round "
        f"trips ({rtt_ms:g} ms) the median is above the same figure with undelayed links.",
        "",
        "| session | QoS | links | publish -> PUBACK / PUBREC | -> PUBCOMP | -> local delivery "
        "| -> remote delivery | delivered | dups |",
        "|---|---:|---|---|---|---|---|---:|---:|",
    ]
    for (session, qos), by_delay in results.items():
        base = by_delay.get(0.0)
        for d, s in sorted(by_delay.items()):
            cols = []
            for what in ("acked", "completed", "local", "remote"):
                vals = getattr(s, what)
                if not vals:
                    cols.append("-")
                    continue
                med, p99 = _q(vals, 0.5), _q(vals, 0.99)
                text = f"{med:.1f} / {p99:.1f}"
                if d and base is not None and getattr(base, what):
                    trips = (med - _q(getattr(base, what), 0.5)) / rtt_ms  # type: ignore[operator]
                    text += f" ({round(trips, 1) + 0.0:.1f} RTT)"  # (+ 0.0: no "-0.0")
                cols.append(text)
            owed = 2 * s.sent
            frac = f"{(owed - s.missing) / owed * 100:.1f} %" if owed else "-"
            links = f"{d * 1000:g} ms" if d else "no delay"
            lines.append(f"| {session} | {qos} | {links} | " + " | ".join(cols) + f" | {frac} | {s.dups} |")
    return "\n".join(lines)


def _merge(into: Sample, s: Sample) -> None:
    into.acked += s.acked
    into.completed += s.completed
    into.local += s.local
    into.remote += s.remote
    into.sent += s.sent
    into.missing += s.missing
    into.dups += s.dups


def _interrupt(signum, frame):
    raise KeyboardInterrupt(signal.Signals(signum).name)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.wan", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--delay", type=float, default=0.025, help="one-way delay of a node-to-node link (s)")
    p.add_argument("--jitter", type=float, default=0.005, help="± this much (s), uniformly, in order")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--messages", type=int, default=100, help="counted messages per variant and round")
    p.add_argument("--rate", type=float, default=10.0, help="messages a second")
    p.add_argument("--qos", default="1,2")
    p.add_argument("--sessions", default="clean,persistent")
    p.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "wan.json")
    p.add_argument("--md", action="store_true", help="write the WAN section of BENCHMARKS.md")
    args = p.parse_args(argv)
    qos_list = [int(q) for q in args.qos.split(",")]
    sessions = [s for s in args.sessions.split(",") if s]
    if any(q not in (1, 2) for q in qos_list) or any(s not in ("clean", "persistent") for s in sessions):
        p.error("--qos takes 1,2 and --sessions clean,persistent")
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _interrupt)
    work = Path(tempfile.mkdtemp(prefix="mqttmesh-wan-"))
    variants = [(s, q) for s in sessions for q in qos_list]
    results: dict = {v: {} for v in variants}
    loads = [" ".join(f"{x:.2f}" for x in os.getloadavg())]
    print(f"wan: {len(variants)} variants x 2 meshes x {args.rounds} rounds; load average {loads[0]}", flush=True)
    run = int(time.time()) & 0xFFFFFF
    interrupted = False
    try:
        for rnd in range(args.rounds):
            delays = (args.delay, 0.0) if rnd % 2 == 0 else (0.0, args.delay)
            for d in delays:
                wd = work / f"r{rnd}-{d:g}"
                mesh = Mesh3(wd, d, args.jitter if d else 0.0)
                try:
                    target = mesh.start()
                    for session, qos in variants if rnd % 2 == 0 else variants[::-1]:
                        run += 1
                        s = asyncio.run(measure(target, qos, session == "clean", args.messages, args.rate, run))
                        _merge(results[(session, qos)].setdefault(d, Sample()), s)
                        print(
                            f"r{rnd + 1} delay {d * 1000:g} ms {session} QoS {qos}: "
                            f"medians: ack {_ms(s.acked)} complete {_ms(s.completed)} local {_ms(s.local)} "
                            f"remote {_ms(s.remote)} ms; missing {s.missing} dups {s.dups}",
                            flush=True,
                        )
                finally:
                    mesh.stop()
                    shutil.rmtree(wd, ignore_errors=True)
            loads.append(" ".join(f"{x:.2f}" for x in os.getloadavg()))
    except KeyboardInterrupt:
        interrupted = True
        print("interrupted: partial results", flush=True)
    finally:
        REGISTRY.kill_all()
        shutil.rmtree(work, ignore_errors=True)
    print()
    print(f"load average by round: {' | '.join(loads)}")
    print(table(results, args.delay))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {
                "command": " ".join(["python -m bench.wan", *(argv if argv is not None else sys.argv[1:])]),
                "loads": loads,
                "delay": args.delay,
                "jitter": args.jitter,
                "results": [
                    {"session": s, "qos": q, "delay": d, **{k: v for k, v in vars(x).items()}}
                    for (s, q), by in results.items()
                    for d, x in by.items()
                ],
            }
        )
    )
    print(f"raw results: {args.out}")
    if args.md and not interrupted:
        command = " ".join(["python -m bench.wan", *(argv if argv is not None else sys.argv[1:])])
        section = "\n".join(
            [
                MD_BEGIN,
                "### The mesh over a distance (`python -m bench.wan`, issue 26)",
                "",
                f"*Written by `{command}` on {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}: 3 nodes, "
                f"every node-to-node link through a relay adding {args.delay * 1000:g} ms "
                f"(± {args.jitter * 1000:g}) one way, the clients next to their nodes; publisher and `local` "
                f"subscriber on one node, `remote` on another; {args.messages} messages at {args.rate:g}/s "
                f"per variant and round, {args.rounds} rounds alternating the delayed and undelayed meshes. "
                f"Load average by round: {' | '.join(loads)}.*",
                "",
                table(results, args.delay),
                "",
                MD_END,
            ]
        )
        write_markdown(REPO / "BENCHMARKS.md", section, MD_BEGIN)
        print("wrote the WAN section of BENCHMARKS.md")
    return 130 if interrupted else 0


if __name__ == "__main__":
    sys.exit(main())
