"""Fuzzing a real node: seeded random and mutated byte streams from several sockets at once.

MQTTMESH_FUZZ_SECONDS sets how long (default 15 s inside the normal test run; `make fuzz`
runs 300 s) and MQTTMESH_FUZZ_SEED the seed (printed either way, so a failing run can be
repeated). Valid packets are built by tests/support/mqttraw.py and then mutated: bit flips, bytes
set, inserted and deleted, truncation, splicing of two packets, rewritten remaining lengths
(bogus, malformed, up to 256 MB). Half the streams come after a valid CONNECT.

Whatever the node decides for each connection, it stays alive, the canary keeps its
round trips within 2 s, its log holds no unhandled exception, its RSS stays bounded and its
sockets return to what they were once the fuzzing sockets are gone.
"""

from __future__ import annotations

import os
import random
import socket
import threading
import time

import pytest

from support import mqttraw, probes
from support.hostile import check, run, target_of

FUZZ_SECONDS = float(os.environ.get("MQTTMESH_FUZZ_SECONDS", "15"))
WORKERS = 6

pytestmark = [pytest.mark.hostile, pytest.mark.process, pytest.mark.timeout(FUZZ_SECONDS + 120)]

TEMPLATES = [
    mqttraw.connect(client_id="fz-a"),
    mqttraw.connect(
        client_id="fz-b", clean=False, keepalive=2, will=("fz/will", b"gone", 1, True), username="u", password="p"
    ),
    mqttraw.publish("fz/a", b"hello"),
    mqttraw.publish("fz/a/b", b"x" * 300, qos=1, pid=1),
    mqttraw.publish("fz/r", b"kept", qos=2, pid=2, retain=True),
    mqttraw.publish("fz/r", b"", qos=0, retain=True),
    mqttraw.puback(1),
    mqttraw.pubrec(2),
    mqttraw.pubrel(2),
    mqttraw.pubcomp(2),
    mqttraw.subscribe(3, ("fz/#", 2), ("fz/+/b", 1)),
    mqttraw.unsubscribe(4, "fz/#"),
    mqttraw.PINGREQ_BYTES,
    mqttraw.DISCONNECT_BYTES,
]


def _with_length(first: int, length_field: bytes, body: bytes) -> bytes:
    return bytes([first]) + length_field + body


def mutate(rng: random.Random, data: bytes) -> bytes:
    data = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        kind = rng.choice(("flip", "set", "insert", "delete", "truncate", "splice", "length", "huge"))
        if not data:
            data = bytearray(rng.choice(TEMPLATES))
        i = rng.randrange(len(data))
        if kind == "flip":
            data[i] ^= 1 << rng.randrange(8)
        elif kind == "set":
            data[i] = rng.randrange(256)
        elif kind == "insert":
            data[i:i] = rng.randbytes(rng.randint(1, 16))
        elif kind == "delete":
            del data[i : i + rng.randint(1, 8)]
        elif kind == "truncate":
            del data[i:]
        elif kind == "splice":
            other = rng.choice(TEMPLATES)
            data = data[:i] + other[rng.randrange(len(other)) :]
        elif kind == "length":  # a remaining length that lies: shorter, longer, malformed
            field = rng.choice(
                (
                    mqttraw.varint(rng.randrange(1 << 14)),
                    mqttraw.varint(rng.randrange(1 << 28)),
                    b"\xff\xff\xff\xff\x7f",
                    b"\x80",
                )
            )
            data = bytearray(_with_length(data[0], field, bytes(data[2:])))
        else:  # announce (nearly) the largest packet MQTT can describe, send a little of it
            data = bytearray(_with_length(data[0], b"\xff\xff\xff\x7f", bytes(data[2:])))
    return bytes(data)


def stream(rng: random.Random) -> bytes:
    parts = []
    for _ in range(rng.randint(1, 8)):
        r = rng.random()
        if r < 0.25:
            parts.append(rng.randbytes(rng.randint(1, 512)))
        elif r < 0.45:
            parts.append(rng.choice(TEMPLATES))
        else:
            parts.append(mutate(rng, rng.choice(TEMPLATES)))
    return b"".join(parts)


class Fuzzer:
    def __init__(self, target, seed: int, seconds: float):
        self.target = target
        self.seed = seed
        self.seconds = seconds
        self.cases = 0
        self.bytes = 0
        self.closed_by_node = 0
        self.lock = threading.Lock()

    def run(self) -> None:
        deadline = time.monotonic() + self.seconds
        threads = [
            threading.Thread(target=self._worker, args=(random.Random(self.seed * 1000 + k), deadline, k), daemon=True)
            for k in range(WORKERS)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(self.seconds + 30)

    def _worker(self, rng: random.Random, deadline: float, k: int) -> None:
        t = self.target
        n = 0
        while time.monotonic() < deadline:
            n += 1
            try:
                sock = probes.open_socket(t.host, t.port, source=probes.loopback(k * 10 + n % 10), timeout=2.0)
            except OSError:
                continue
            try:
                data = stream(rng)
                if rng.random() < 0.5:
                    keepalive = rng.choice((0, 1, 5, 60))
                    data = mqttraw.connect(client_id=f"fz-{k}-{n}", keepalive=keepalive) + data
                view = memoryview(data)
                while view:
                    size = rng.choice((1, 7, 64, len(view)))
                    sock.sendall(view[:size])
                    view = view[size:]
                    if rng.random() < 0.1:
                        time.sleep(rng.random() * 0.01)
                ending = rng.random()
                if ending < 0.4:  # say we are done and see what the node does, briefly
                    sock.shutdown(socket.SHUT_WR)
                    closed, _, _ = probes.closed_within(sock, 0.3)
                    with self.lock:
                        self.closed_by_node += closed
                elif ending < 0.7:
                    probes.reset(sock)
                elif ending < 0.9:
                    closed, _, _ = probes.closed_within(sock, 0.05)
                    with self.lock:
                        self.closed_by_node += closed
            except OSError:
                with self.lock:
                    self.closed_by_node += 1
            finally:
                sock.close()
            with self.lock:
                self.cases += 1
                self.bytes += len(data)


def fuzz(target, canary, seed, seconds, max_growth_mb=100.0):
    out = probes.Outcome("fuzz")
    base = probes.socket_fds(target.pid)
    watch = probes.RssWatch(target.pid, interval=0.05)
    f = Fuzzer(target, seed, seconds)
    try:
        f.run()
    finally:
        growth = watch.stop() / 1024
    out.figures.update(
        seed=seed,
        cases=f.cases,
        mb=round(f.bytes / 2**20, 1),
        closed_by_node=f.closed_by_node,
        rss_growth_mb=round(growth, 1),
    )
    if growth > max_growth_mb:
        out.problems.append(f"RSS grew by {growth:.0f} MB during the fuzzing")
    took = probes.wait_sockets(target.pid, base, 5.0)
    if took is None:
        out.problems.append(
            f"the node holds {probes.socket_fds(target.pid)} sockets 5 s after the fuzzing, {base} before"
        )
    return out


def test_fuzz_random_and_mutated_streams(nodes):
    """Seeded random and mutated MQTT byte streams from 6 sockets at once, before and after
    a valid CONNECT, for MQTTMESH_FUZZ_SECONDS: the node stays alive and serves the canary,
    its RSS grows by less than 100 MB, its sockets come back, its log stays clean."""
    seed = int(os.environ.get("MQTTMESH_FUZZ_SEED") or random.randrange(1 << 32))
    print(f"MQTTMESH_FUZZ_SEED={seed} MQTTMESH_FUZZ_SECONDS={FUZZ_SECONDS:g}")
    b = nodes("--connect-timeout", "2")
    outcome = run(target_of(b, connect_timeout=2.0), fuzz, seed, FUZZ_SECONDS)
    assert b.alive(), f"the node died (seed {seed}):\n{b.log()[-3000:]}"
    check(outcome)
