"""Check the load generator's own accounting against a deliberately faulty relay.

    python -m bench.selftest

A tiny MQTT relay (one process, asyncio) forwards PUBLISHes to matching
subscribers but drops every Nth delivery and sends every Mth one twice, and
counts what it did in shared memory. A run of the real load generator against
it must report exactly those numbers as ``lost`` and ``dups``; against a
faultless relay, zero. This is how we know that "0 lost" in BENCHMARKS.md
means something.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import signal
import sys
import time

from . import mqttproto as mq
from .brokers import HOST, REGISTRY, Endpoint, Target, die_with_parent, stop_process
from .loadgen import RunOptions, run_once
from .workloads import WORKLOADS


def _matches(topic_filter: str, topic: str) -> bool:
    if topic_filter.endswith("/#"):
        return topic.startswith(topic_filter[:-1]) or topic == topic_filter[:-2]
    return topic_filter == "#" or topic_filter == topic


class _Relay(asyncio.Protocol):
    subscribers: list = []  # (protocol, filter, qos)

    def __init__(self, drop_every: int, dup_every: int, counters):
        self.drop_every = drop_every
        self.dup_every = dup_every
        self.counters = counters  # [deliveries, dropped, duplicated]
        self.buf = b""
        self.next_pid = 0

    def connection_made(self, transport):
        self.transport = transport

    def connection_lost(self, exc):
        _Relay.subscribers = [s for s in _Relay.subscribers if s[0] is not self]

    def data_received(self, data):
        data = self.buf + data
        frames, pos = mq.split_frames(data)
        self.buf = data[pos:]
        out = []
        for first, s, e in frames:
            kind = first >> 4
            if kind == mq.CONNECT:
                out.append(b"\x20\x02\x00\x00")
            elif kind == mq.SUBSCRIBE:
                pid = data[s : s + 2]
                tlen = (data[s + 2] << 8) | data[s + 3]
                topic_filter = data[s + 4 : s + 4 + tlen].decode()
                qos = data[s + 4 + tlen]
                _Relay.subscribers.append((self, topic_filter, qos))
                out.append(b"\x90\x03" + pid + bytes((qos,)))
            elif kind == mq.PUBLISH:
                qos = (first >> 1) & 3
                tlen = (data[s] << 8) | data[s + 1]
                topic = data[s + 2 : s + 2 + tlen].decode()
                p = s + 2 + tlen
                if qos:
                    out.append(mq.ack(mq.PUBACK_B if qos == 1 else mq.PUBREC_B, (data[p] << 8) | data[p + 1]))
                    p += 2
                payload = data[p:e]
                for sub, topic_filter, sub_qos in _Relay.subscribers:
                    if _matches(topic_filter, topic):
                        sub.deliver(topic, payload, min(qos, sub_qos))
            elif kind == mq.PUBREL:
                out.append(mq.ack(mq.PUBCOMP_B, (data[s] << 8) | data[s + 1]))
            elif kind == mq.PUBREC:
                out.append(mq.ack(mq.PUBREL_B, (data[s] << 8) | data[s + 1]))
            # PUBACK / PUBCOMP from subscribers, DISCONNECT: nothing to do
        if out:
            self.transport.write(b"".join(out))

    def deliver(self, topic: str, payload: bytes, qos: int) -> None:
        c = self.counters
        c[0] += 1
        if self.drop_every and c[0] % self.drop_every == 0:
            c[1] += 1
            return
        times = 2 if self.dup_every and c[0] % self.dup_every == 0 else 1
        c[2] += times - 1
        for _ in range(times):
            prefix = mq.publish_prefix(topic, qos)
            if qos:
                self.next_pid = self.next_pid % 65535 + 1
                frame = prefix + bytes((self.next_pid >> 8, self.next_pid & 0xFF)) + payload
            else:
                frame = prefix + payload
            self.transport.write(frame)


def _relay_proc(conn, drop_every: int, dup_every: int, counters) -> None:
    die_with_parent(signal.SIGKILL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.alarm(300)

    async def main():
        loop = asyncio.get_running_loop()
        server = await loop.create_server(lambda: _Relay(drop_every, dup_every, counters), HOST, 0)
        conn.send(server.sockets[0].getsockname()[1])
        await asyncio.sleep(280)

    asyncio.run(main())


def check(workload: str, qos: int, drop_every: int, dup_every: int) -> bool:
    ctx = mp.get_context("fork")
    counters = ctx.RawArray("q", 3)
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_relay_proc, args=(child, drop_every, dup_every, counters), daemon=True)
    proc.start()
    REGISTRY.add(proc)
    try:
        if not parent.poll(10):
            print("relay did not start")
            return False
        port = parent.recv()
        target = Target("relay", [Endpoint(HOST, port)], [Endpoint(HOST, port)], [proc.pid])
        res = run_once(
            target,
            WORKLOADS[workload],
            qos,
            RunOptions(warmup=0.2, duration=0.8, quiet=0.5),
            int(time.time()) & 0xFFFFFF,
        )
    finally:
        stop_process(proc)
    deliveries, dropped, duplicated = counters[:]
    ok = (
        res["lost"] == dropped
        and res["dups"] == duplicated
        and res["received"] == deliveries - dropped
        and not res["errors"]
    )
    print(
        f"{'ok  ' if ok else 'FAIL'} {workload:7} QoS {qos} drop 1/{drop_every or '-'} dup 1/{dup_every or '-'}: "
        f"relay delivered {deliveries - dropped:,} dropped {dropped} duplicated {duplicated}; generator says "
        f"received {res['received']:,} lost {res['lost']} dups {res['dups']} errors {res['errors'][:2]}"
    )
    return ok


def main() -> int:
    cases = [
        ("fanin", 0, 0, 0),
        ("fanin", 0, 997, 0),
        ("fanin", 1, 1009, 0),
        ("fanin", 2, 0, 1013),
        ("p2p", 1, 499, 701),
        ("fanout", 0, 997, 991),
    ]
    try:
        results = [check(*c) for c in cases]
    finally:
        REGISTRY.kill_all()
    print("selftest:", "passed" if all(results) else "FAILED")
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
