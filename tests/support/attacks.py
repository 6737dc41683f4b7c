"""The attacks of issue 13 on a running MQTT broker, each returning an ``Outcome``.

Shared by the hostile test suite and ``python -m bench.hostile``, so that both run the
same workload against mqttmesh and Mosquitto. An attack takes a ``Target`` (support/probes.py)
and the running ``Canary``, does its damage, and returns the figures it measured and the
criteria of issue 13 the broker missed (``problems``); ``probes.run_attack`` adds the
canary's. Randomness comes from a ``random.Random`` the caller seeds (and prints).
"""

from __future__ import annotations

import os
import random
import re
import selectors
import socket
import struct
import sys
import threading
import time
from pathlib import Path

from support import mqttraw
from support.probes import (
    CANARY_LIMIT,
    PUBACK,
    PUBLISH,
    Canary,
    Closed,
    Outcome,
    Raw,
    RssWatch,
    Target,
    closed_within,
    connect_client,
    cpu_seconds,
    loopback,
    median,
    open_socket,
    percentile,
    reset,
    rss_kb,
    socket_fds,
    subscribe,
    sys_values,
    try_connect,
    wait_sockets,
    wait_until,
)

# --------------------------------------------------------------------------- helpers for attacks


class Subscriber:
    """A well-behaved subscriber on its own thread: reads at once, acknowledges QoS 1,
    records the payloads it received (optionally only the sequence numbers in them)."""

    def __init__(
        self,
        target: Target,
        client_id: str,
        topic_filter: str,
        qos: int = 1,
        port: int | None = None,
        source: str | None = None,
        ack_delay: float = 0.0,
    ):
        self.client = connect_client(
            target.host, port or target.port, client_id, source=source, keepalive=0, **target.credentials
        )
        codes = subscribe(self.client, 1, (topic_filter, qos))
        if codes != [qos]:
            self.client.close()
            raise AssertionError(f"{client_id}: subscription {topic_filter} granted {codes}")
        self.ack_delay = ack_delay
        self.seqs: set[int] = set()
        self.times: dict[int, float] = {}
        self.count = 0
        self.error: str | None = None
        self.lock = threading.Lock()
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True, name=f"sub-{client_id}")
        self.thread.start()

    def _run(self) -> None:
        c = self.client
        while not self._stop.is_set():
            try:
                p = c.recv(0.2)
            except TimeoutError:
                continue
            except (Closed, OSError) as exc:
                if not self._stop.is_set():
                    self.error = f"connection lost: {exc!r}"
                return
            if p.type != PUBLISH:
                continue
            now = time.monotonic()
            head = p.payload.split(b":", 1)[0]
            with self.lock:
                self.count += 1
                if head.isdigit():
                    seq = int(head)
                    self.seqs.add(seq)
                    self.times.setdefault(seq, now)
            if p.qos:
                if self.ack_delay:
                    self._stop.wait(self.ack_delay)
                try:
                    c.send(mqttraw.puback(p.packet_id))
                except OSError as exc:
                    self.error = f"cannot acknowledge: {exc!r}"
                    return

    def missing(self, seqs) -> list[int]:
        with self.lock:
            return sorted(set(seqs) - self.seqs)

    def close(self) -> None:
        self._stop.set()
        self.thread.join(2)
        try:
            self.client.send(mqttraw.DISCONNECT_BYTES)
        except OSError:
            pass
        self.client.close()


class Publisher:
    """A QoS 1 publisher on two threads (one sends, one reads PUBACKs) that keeps at most
    ``window`` messages unacknowledged. Payloads start with the message's sequence number.
    ``sent`` holds the time each was sent, ``acked`` the time its PUBACK came."""

    def __init__(
        self,
        target: Target,
        client_id: str,
        topic: str,
        qos: int = 1,
        window: int = 50,
        payload_size: int = 256,
        port: int | None = None,
        source: str | None = None,
    ):
        self.client = connect_client(
            target.host, port or target.port, client_id, source=source, keepalive=0, timeout=10.0, **target.credentials
        )
        self.topic = topic
        self.qos = qos
        self.window = window
        self.payload_size = payload_size
        self.sent: dict[int, float] = {}
        self.acked: dict[int, float] = {}
        self.seq = 0
        self.error: str | None = None
        self._pid_seq: dict[int, int] = {}  # packet id -> sequence number, unacknowledged
        self._cv = threading.Condition()
        self._stop = threading.Event()  # the sender's
        self._closing = threading.Event()  # the ack reader's
        self._reader = threading.Thread(target=self._read, daemon=True, name=f"pub-{client_id}-acks")
        self._reader.start()
        self._sender: threading.Thread | None = None

    def _read(self) -> None:
        c = self.client
        while not self._closing.is_set():
            try:
                p = c.recv(0.2)
            except TimeoutError:
                continue
            except (Closed, OSError) as exc:
                if not self._closing.is_set():
                    self.error = f"connection lost: {exc!r}"
                with self._cv:
                    self._cv.notify_all()
                return
            if p.type == PUBACK:
                with self._cv:
                    seq = self._pid_seq.pop(p.packet_id, None)
                    if seq is not None:
                        self.acked[seq] = time.monotonic()
                    self._cv.notify_all()

    def publish(self, n: int = 1, timeout: float = 10.0) -> list[int]:
        """Send ``n`` messages, written together (waiting for room in the window, with
        what is ready sent first); their sequence numbers."""
        out: list[int] = []
        frames: list[bytes] = []
        deadline = time.monotonic() + timeout

        def flush() -> bool:
            if frames:
                try:
                    self.client.send(b"".join(frames))
                except OSError as exc:
                    self.error = f"cannot send: {exc!r}"
                    return False
                frames.clear()
            return True

        for _ in range(n):
            if self.qos and len(self._pid_seq) >= self.window and not flush():
                return out
            with self._cv:
                while self.qos and len(self._pid_seq) >= self.window and self.error is None:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0 or self._stop.is_set():
                        return out
                    self._cv.wait(min(remaining, 0.2))
                if self.error is not None:
                    return out
                self.seq += 1
                seq = self.seq
                pid = seq % 65535 + 1
                if self.qos:
                    self._pid_seq[pid] = seq
                self.sent[seq] = time.monotonic()
            payload = f"{seq}:".encode().ljust(self.payload_size, b"p")
            frames.append(mqttraw.publish(self.topic, payload, self.qos, pid=pid if self.qos else None))
            out.append(seq)
        flush()
        return out

    def start(self, rate: float | None = None, duration: float = 10.0, burst: int = 1) -> None:
        """Publish on a thread: ``burst`` messages every 1/``rate`` s (None: as fast as the
        window allows) for ``duration`` seconds or until ``stop``."""

        def run():
            t_end = time.monotonic() + duration
            next_at = time.monotonic()
            while not self._stop.is_set() and time.monotonic() < t_end and self.error is None:
                if not self.publish(burst, timeout=max(0.05, t_end - time.monotonic())):
                    continue
                if rate:
                    next_at += 1.0 / rate
                    self._stop.wait(max(0.0, next_at - time.monotonic()))

        self._sender = threading.Thread(target=run, daemon=True, name="publisher")
        self._sender.start()

    def stop_sending(self) -> None:
        """Stop the sending thread (the acknowledgements are still read)."""
        self._stop.set()
        if self._sender is not None:
            self._sender.join(15)
            self._sender = None
        self._stop = threading.Event()

    def wait_acked(self, timeout: float) -> bool:
        with self._cv:
            deadline = time.monotonic() + timeout
            while self._pid_seq and self.error is None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._cv.wait(min(remaining, 0.2))
            return not self._pid_seq

    def close(self) -> None:
        self._stop.set()
        self._closing.set()
        if self._sender is not None:
            self._sender.join(5)
        try:
            self.client.send(mqttraw.DISCONNECT_BYTES)
        except OSError:
            pass
        self.client.close()
        self._reader.join(2)


def stuck_reader(
    target: Target, client_id: str, topic_filter: str, qos: int = 0, source: str | None = None
) -> socket.socket:
    """A subscriber that reads its CONNACK and SUBACK and then never reads again (a tiny
    receive window, so the broker's send buffer fills at once)."""
    sock = open_socket(target.host, target.port, source, rcvbuf=4096)
    try:
        sock.sendall(
            mqttraw.connect(client_id=client_id, keepalive=0, **target.credentials)
            + mqttraw.subscribe(1, (topic_filter, qos))
        )
        head = b""
        while len(head) < 9:  # CONNACK (4 bytes) and SUBACK (5 bytes)
            chunk = sock.recv(9 - len(head))
            if not chunk:
                raise AssertionError(f"{client_id}: closed before its SUBACK")
            head += chunk
        if head[:4] != b"\x20\x02\x00\x00" or head[4] != 0x90 or head[8] != qos:
            raise AssertionError(f"{client_id}: unexpected answer {head!r}")
    except BaseException:
        sock.close()
        raise
    return sock


class Flooder:
    """A QoS 0 publisher that writes as fast as the broker reads, on a thread, for at most
    ``duration`` seconds or ``max_bytes`` bytes (whichever comes first)."""

    def __init__(
        self,
        target: Target,
        client_id: str,
        topic: str,
        payload_size: int = 1024,
        duration: float = 5.0,
        max_bytes: int = 200 << 20,
        source: str | None = None,
    ):
        self.client = connect_client(
            target.host, target.port, client_id, source=source, keepalive=0, **target.credentials
        )
        self.frame = mqttraw.publish(topic, b"F" * payload_size)
        self.duration = duration
        self.max_bytes = max_bytes
        self.sent = 0
        self.error: str | None = None
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True, name=f"flood-{client_id}")

    def start(self) -> Flooder:
        self.thread.start()
        return self

    def _run(self) -> None:
        chunk = self.frame * max(1, 65536 // len(self.frame))
        sock = self.client.sock
        sock.settimeout(0.2)
        t_end = time.monotonic() + self.duration
        view = memoryview(chunk)
        while not self._stop.is_set() and time.monotonic() < t_end and self.sent < self.max_bytes:
            try:
                n = sock.send(view)
            except TimeoutError:
                continue  # the broker is not reading us (flow control): try again
            except OSError as exc:
                self.error = repr(exc)
                return
            self.sent += n
            view = view[n:] if n < len(view) else memoryview(chunk)

    def stop(self) -> None:
        self._stop.set()
        self.thread.join(5)

    def close(self) -> None:
        self.stop()
        self.client.close()


# --------------------------------------------------------------------------- a. reset during fan-out


def reset_during_fanout(
    target: Target,
    canary: Canary,
    rng: random.Random,
    rounds: int = 10,
    per_round: int = 16,
    rate: float = 200,
    burst: int = 10,
    payload_size: int = 512,
    topic: str = "fanout/t",
) -> Outcome:
    """Subscribers of one topic (QoS 0 and 1, small receive windows) vanish with a TCP reset
    while a publisher fans QoS 1 messages out to them, ``rounds`` times; three well-behaved
    subscribers of the same topic must get every message."""
    out = Outcome("reset during fan-out")
    tag = f"{os.getpid()}-{rng.getrandbits(24):x}"
    good = [Subscriber(target, f"fan-good{i}-{tag}", topic, 1) for i in range(3)]
    pub = Publisher(target, f"fan-pub-{tag}", topic, qos=1, window=100, payload_size=payload_size)
    resets = 0
    try:
        # 2,000 messages a second by default: enough to keep every victim's window full, and
        # few enough that the well-behaved subscribers (Python threads) keep up
        pub.start(rate=rate, duration=60.0, burst=burst)
        for r in range(rounds):
            victims = []
            for i in range(per_round):
                qos = rng.choice((0, 1))
                try:
                    victims.append(stuck_reader(target, f"fan-victim{r}-{i}-{tag}", topic, qos, source=loopback(i)))
                except (OSError, AssertionError) as exc:
                    out.notes.append(f"a victim could not subscribe: {exc}")
            # let the fan-out fill their windows, then they all vanish at once
            time.sleep(rng.uniform(0.1, 0.4))
            rng.shuffle(victims)
            for sock in victims:
                reset(sock)
                resets += 1
                if rng.random() < 0.3:
                    time.sleep(rng.uniform(0, 0.005))
        pub.stop_sending()
        last = pub.publish(20, timeout=3.0)  # and a few after the storm
        acked = pub.wait_acked(3.0)
        published = sorted(pub.sent)
        out.figures.update(published=len(published), resets=resets)
        if pub.error or not acked or not last:
            out.problems.append(
                f"the publisher stalled: {len(pub.acked)} of {len(published)} "
                f"acknowledged ({pub.error or 'no PUBACK within 3 s'})"
            )
        wanted = sorted(pub.acked)
        wait_until(lambda: not any(g.missing(wanted) for g in good), 3.0, 0.05)
        for i, g in enumerate(good):
            missing = g.missing(wanted)
            if missing:
                out.problems.append(
                    f"well-behaved subscriber {i} is missing {len(missing)} of "
                    f"{len(wanted)} acknowledged QoS 1 messages (first: {missing[:5]})"
                    + (f"; {g.error}" if g.error else "")
                )
        out.figures["delivered_min"] = min(len(g.seqs) for g in good)
    finally:
        pub.close()
        for g in good:
            g.close()
    return out


# --------------------------------------------------------------------------- b. memory behind an unverified CONNECT


def _stream(sock: socket.socket, total: int, duration: float) -> tuple[int, str]:
    """Write up to ``total`` filler bytes within ``duration`` seconds; (bytes the kernel took,
    why it stopped)."""
    chunk = memoryview(b"\x00" * (1 << 20))
    sent = 0
    t_end = time.monotonic() + duration
    sock.settimeout(0.25)
    while sent < total:
        if time.monotonic() > t_end:
            return sent, "time"
        try:
            sent += sock.send(chunk[: min(len(chunk), total - sent)])
        except TimeoutError:
            continue  # not being read: keep trying until the deadline
        except OSError as exc:
            return sent, f"closed ({exc.strerror or exc})"
    return sent, "all sent"


UNVERIFIED_VARIANTS = ("wrong-password", "slow-check", "many-sockets")


def unverified_connect_memory(
    target: Target, canary: Canary, variant: str = "wrong-password", total: int = 200 << 20, max_growth_mb: float = 20.0
) -> Outcome:
    """A CONNECT the broker must check a password for, with megabytes of bytes streamed right
    behind it: the broker must not buffer them (RSS growth < ``max_growth_mb``) and must close
    the connection. Variants: a wrong password; the right password (a slow, successful check)
    and a PUBLISH header announcing far more than the packet-size limit; 20 sockets at once
    with a wrong password."""
    out = Outcome(f"unverified CONNECT + stream ({variant})")
    # the slow check needs a user whose password nobody (the canary) proved before: a
    # broker may remember a recent successful check
    others = [u for u in target.users if target.login is None or u != target.login[0]]
    user = others[-1] if others else next(iter(target.users))
    password = target.users[user]
    watch = RssWatch(target.pid)
    socks: list[socket.socket] = []
    try:
        n = 20 if variant == "many-sockets" else 1
        for i in range(n):
            socks.append(open_socket(target.host, target.port, source=loopback(40 + i)))
        if variant == "slow-check":
            lead = (
                mqttraw.connect(client_id="unverified-0", username=user, password=password)
                + b"\x30"
                + mqttraw.varint(268_435_455)
            )
        else:
            lead = None
        results: list[tuple[int, str]] = [(0, "")] * n

        def attack(i: int) -> None:
            sock = socks[i]
            head = lead or mqttraw.connect(
                client_id=f"unverified-{i}", username=user, password=f"wrong-{i}-{random.getrandbits(32):x}"
            )
            try:
                sock.sendall(head)
            except OSError as exc:
                results[i] = (0, f"closed at once ({exc})")
                return
            results[i] = _stream(sock, total // n, 5.0)

        threads = [threading.Thread(target=attack, args=(i,), daemon=True) for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(15)
        closed = [closed_within(sock, 5.0)[0] for sock in socks]
    finally:
        growth_kb = watch.stop()
        for sock in socks:
            reset(sock)
    accepted = sum(r[0] for r in results)
    out.figures.update(
        attempted_mb=total / 2**20, accepted_mb=round(accepted / 2**20, 1), rss_growth_mb=round(growth_kb / 1024, 1)
    )
    if growth_kb / 1024 > max_growth_mb:
        out.problems.append(
            f"RSS grew by {growth_kb / 1024:.0f} MB (limit {max_growth_mb:g} MB) while "
            f"{accepted / 2**20:.0f} MB were streamed behind unverified CONNECTs"
        )
    if not all(closed):
        out.problems.append(
            f"{closed.count(False)} of {len(closed)} connections were not closed by the broker within 5 s of the stream"
        )
    return out


# --------------------------------------------------------------------------- c. first byte / reserved flags


# (name, needs a CONNECT first, fixed header) -- each announces 500,000 bytes it never sends
# (under the default 1 MiB packet limit, so only the header can give it away)
_BIG = mqttraw.varint(500_000)
BAD_HEADERS = [
    ("first byte PUBLISH [MQTT-3.1.0-1]", False, b"\x30" + _BIG),
    ("first byte SUBSCRIBE [MQTT-3.1.0-1]", False, b"\x82" + _BIG),
    ("first byte CONNACK [MQTT-3.1.0-1]", False, b"\x20" + _BIG),
    ("first byte reserved type 0 [MQTT-3.1.0-1]", False, b"\x00" + _BIG),
    ("CONNECT flags 0x1 [MQTT-2.2.2-2]", False, b"\x11" + _BIG),
    ("CONNECT flags 0x8 [MQTT-2.2.2-2]", False, b"\x18" + _BIG),
    ("SUBSCRIBE flags 0 [MQTT-2.2.2-2]", True, b"\x80" + _BIG),
    ("UNSUBSCRIBE flags 0 [MQTT-2.2.2-2]", True, b"\xa0" + _BIG),
    ("PUBREL flags 0 [MQTT-2.2.2-2]", True, b"\x60" + _BIG),
    ("PUBACK flags 0x1 [MQTT-2.2.2-2]", True, b"\x41" + _BIG),
    ("PINGREQ flags 0x1 [MQTT-2.2.2-2]", True, b"\xc1" + _BIG),
    ("PUBLISH QoS 3 [MQTT-3.3.1-4]", True, b"\x36" + _BIG),
    ("reserved type 15", True, b"\xf0" + _BIG),
]


def bad_first_bytes(target: Target, canary: Canary, limit: float = 1.0) -> Outcome:
    """A fixed header that cannot start a valid packet (not CONNECT first, wrong reserved
    flags), announcing 500,000 bytes: the broker must close the connection within ``limit``
    seconds, without waiting for the body (nor for the connect timeout or keepalive)."""
    out = Outcome("bad first byte / reserved flags")
    socks = []
    try:
        for i, (name, after_connect, _header) in enumerate(BAD_HEADERS):
            sock = open_socket(target.host, target.port, source=loopback(60 + i))
            if after_connect:
                sock.sendall(mqttraw.connect(client_id=f"badhdr-{i}", keepalive=60, **target.credentials))
                got = b""
                while len(got) < 4:
                    got += sock.recv(4 - len(got))
                if got != b"\x20\x02\x00\x00":
                    raise AssertionError(f"{name}: CONNECT refused: {got!r}")
            socks.append((name, sock))
        results = {}

        def probe(name, sock):
            t0 = time.monotonic()
            sock.sendall(header_of[name] + b"\x00" * 16)
            closed, got, how = closed_within(sock, limit + 2.0)
            results[name] = (time.monotonic() - t0 if closed else None, got)

        header_of = {name: header for name, _, header in BAD_HEADERS}
        threads = [threading.Thread(target=probe, args=pair, daemon=True) for pair in socks]
        for t in threads:
            t.start()
        for t in threads:
            t.join(limit + 4)
    finally:
        for _, sock in socks:
            reset(sock)
    slow = []
    for name, _, _ in BAD_HEADERS:
        took, got = results.get(name, (None, b""))
        if took is None or took > limit:
            slow.append(
                f"{name}: " + (f"still open after {limit + 2:g}s" if took is None else f"closed after {took:.1f}s")
            )
        if got:
            out.problems.append(f"{name}: the broker answered {got[:8]!r}")
    times = [r[0] for r in results.values() if r[0] is not None]
    out.figures["closed"] = f"{len(times)}/{len(BAD_HEADERS)}"
    if times:
        out.figures["slowest_close_s"] = round(max(times), 2)
    if slow:
        out.problems.append(
            f"{len(slow)} of {len(BAD_HEADERS)} bad headers were not closed within {limit:g}s: " + "; ".join(slow)
        )
    return out


# --------------------------------------------------------------------------- d. slow readers and publishers


def slow_acker(target: Target, canary: Canary, duration: float = 10.0, ack_delay: float = 0.05) -> Outcome:
    """A QoS 1 ``#`` subscriber that acknowledges one message at a time, slowly (it reads
    its socket, but acknowledges 1/``ack_delay`` messages a second), while a publisher
    floods QoS 1: the canary, whose topic ``#`` also matches, must keep its round trips."""
    out = Outcome("slow QoS 1 # subscriber")
    tag = f"{os.getpid()}-{random.getrandbits(24):x}"
    slow = Subscriber(target, f"slow-acker-{tag}", "#", qos=1, ack_delay=ack_delay)
    pub = Publisher(target, f"slow-flood-{tag}", f"flood/{tag}", qos=1, window=200, payload_size=200)
    try:
        pub.start(rate=None, duration=duration, burst=20)
        pub._sender.join(duration + 15)
        out.figures.update(flood_published=len(pub.sent), flood_acked=len(pub.acked), slow_received=slow.count)
    finally:
        pub.close()
        slow.close()
    return out


def congested_own_topic(
    target: Target,
    canary: Canary,
    duration: float = 8.0,
    burst: int = 1200,
    rate: float = 2.0,
    limit: float = CANARY_LIMIT,
) -> Outcome:
    """Clients that congest their own topic (subscribe, never read, a publisher floods it)
    must not hold back a busy publisher on an unrelated topic whose subscriber is healthy:
    every one of its QoS 1 messages is delivered within ``limit`` seconds of being sent.
    The congesting pairs come one after another, so that one is always there."""
    out = Outcome("congested own topic")
    tag = f"{os.getpid()}-{random.getrandbits(24):x}"
    healthy = Subscriber(target, f"busy-sub-{tag}", f"busy/{tag}", qos=1)
    busy = Publisher(target, f"busy-pub-{tag}", f"busy/{tag}", qos=1, window=burst, payload_size=100)
    stuck: list[socket.socket] = []
    flooders: list[Flooder] = []
    try:
        busy.start(rate=rate, duration=duration, burst=burst)  # bursts: more than its in-flight window
        t_end = time.monotonic() + duration
        i = 0
        while time.monotonic() < t_end - 1.0:
            stuck.append(stuck_reader(target, f"own-{i}-{tag}", f"own/{i}/{tag}", 0, source=loopback(80 + i)))
            flooders.append(
                Flooder(
                    target,
                    f"own-flood-{i}-{tag}",
                    f"own/{i}/{tag}",
                    4096,
                    duration=t_end - time.monotonic(),
                    source=loopback(80 + i),
                ).start()
            )
            i += 1
            time.sleep(min(2.0, max(0.0, t_end - 1.0 - time.monotonic())))
        busy._sender.join(duration + 15)
        busy.wait_acked(5.0)
        sent = dict(busy.sent)
        wait_until(lambda: not healthy.missing(sent), 5.0)
        with healthy.lock:
            delays = [healthy.times[s] - t for s, t in sent.items() if s in healthy.times]
        missing = healthy.missing(sent)
        out.figures.update(busy_sent=len(sent), congesting_clients=i)
        if delays:
            out.figures.update(
                busy_p50_ms=round(percentile(delays, 0.5) * 1000),
                busy_p99_ms=round(percentile(delays, 0.99) * 1000),
                busy_max_ms=round(max(delays) * 1000),
            )
        late = [d for d in delays if d > limit]
        if late or missing:
            out.problems.append(
                f"the busy publisher on an unrelated topic was held back: {len(late)} of "
                f"{len(sent)} messages took over {limit:g}s (worst {max(delays):.1f}s), "
                f"{len(missing)} never arrived"
            )
            if missing:
                acked = sum(1 for seq in missing if seq in busy.acked)
                drops = sys_values(target, "$SYS/broker/publish/dropped/#")
                out.problems.append(
                    f"of those never delivered, {acked} had been acknowledged; the broker's "
                    f"drop counters: {drops or 'not published (start it with --sys-interval)'}"
                )
    finally:
        for f in flooders:
            f.close()
        for sock in stuck:
            reset(sock)
        busy.close()
        healthy.close()
    return out


def stuck_qos0_reader(target: Target, canary: Canary, duration: float = 4.0) -> Outcome:
    """A QoS 0 ``#`` subscriber that never reads its socket while a publisher floods QoS 0."""
    out = Outcome("stuck QoS 0 # reader")
    tag = f"{os.getpid()}-{random.getrandbits(24):x}"
    sock = stuck_reader(target, f"stuck-hash-{tag}", "#", 0)
    flood = Flooder(target, f"stuck-flood-{tag}", f"flood/{tag}", 1024, duration=duration)
    try:
        flood.start()
        flood.thread.join(duration + 5)
        out.figures["flood_mb"] = round(flood.sent / 2**20, 1)
    finally:
        flood.close()
        reset(sock)
    return out


# --------------------------------------------------------------------------- e. dropped slow consumer


def dropped_slow_consumer(target: Target, canary: Canary, margin: float = 4.0) -> Outcome:
    """A subscriber stops reading while a publisher floods its topic; the broker drops it
    after its slow-consumer timeout. Once dropped, its socket must be gone (the broker's
    socket count back to what it was before the subscriber came, the subscriber reading a
    reset when it finally reads) and its connection slot free (with ``max_connections``
    all in use, a new client is accepted) within the timeout + ``margin`` seconds of the
    flood's start (the margin covers filling the buffers and a once-a-second check)."""
    out = Outcome("dropped slow consumer")
    tag = f"{os.getpid()}-{random.getrandbits(24):x}"
    timeout = target.slow_consumer_timeout or 5.0
    flood = None
    sock = None
    try:
        before = socket_fds(target.pid)
        sock = stuck_reader(target, f"dropped-{tag}", f"drop/{tag}", 0, source=loopback(100))
        flood = Flooder(
            target, f"drop-flood-{tag}", f"drop/{tag}", 16384, duration=timeout + margin + 2, source=loopback(101)
        )
        with_flooder = before + 1  # the stuck subscriber's socket gone, the flooder's still there
        if target.max_connections:
            rc, _ = try_connect(target.host, target.port, f"drop-probe-{tag}", timeout=1.0, **target.credentials)
            if rc == 0:
                out.notes.append(
                    f"max_connections ({target.max_connections}) was not reached by the "
                    "canary, the stuck subscriber and the flooder: the slot check means little"
                )
        t0 = time.monotonic()
        flood.start()
        deadline = t0 + timeout + margin
        freed_at = slot_at = None
        while time.monotonic() < deadline and (freed_at is None or (target.max_connections and slot_at is None)):
            if freed_at is None and socket_fds(target.pid) <= with_flooder:
                freed_at = time.monotonic()
            if target.max_connections and slot_at is None:
                rc, _ = try_connect(target.host, target.port, f"drop-probe-{tag}", timeout=0.5, **target.credentials)
                if rc == 0:
                    slot_at = time.monotonic()
            time.sleep(0.05)
        out.figures["socket_freed_s"] = round(freed_at - t0, 2) if freed_at else None
        if not freed_at:
            out.problems.append(
                f"the dropped subscriber's socket is still open {timeout + margin:g}s after "
                f"the flood began ({socket_fds(target.pid)} sockets, "
                f"{with_flooder} expected)"
            )
        if target.max_connections:
            out.figures["slot_freed_s"] = round(slot_at - t0, 2) if slot_at else None
            if slot_at is None:
                out.problems.append(
                    f"no connection slot was free {timeout + margin:g}s after the flood "
                    f"began (max_connections {target.max_connections})"
                )
        flood.stop()
        closed, _, how = closed_within(sock, 2.0)
        out.figures["client_saw"] = how or "nothing"
        if how != "reset":
            out.problems.append(
                "the dropped subscriber did not read a reset (the broker closed its "
                f"socket gracefully or not at all: {how or 'still open'})"
            )
    finally:
        if flood is not None:
            flood.close()
        if sock is not None:
            reset(sock)
    return out


# --------------------------------------------------------------------------- i, j, k. logins


def _login(
    target: Target, source: str, username: str, password: str, timeout: float, client_id: str | None = None
) -> tuple[int | None, float]:
    """(CONNACK code or None, seconds from sending the CONNECT to the answer or the close)."""
    try:
        sock = open_socket(target.host, target.port, source, timeout=5.0)
    except OSError:
        return None, 0.0
    try:
        t0 = time.monotonic()
        # (a ClientId without "login" or "auth" in it: the log check looks for those words)
        sock.sendall(
            mqttraw.connect(
                client_id=client_id or f"t-{random.getrandbits(32):x}", username=username, password=password
            )
        )
        got = b""
        deadline = t0 + timeout
        while len(got) < 4:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None, time.monotonic() - t0
            sock.settimeout(remaining)
            try:
                data = sock.recv(4 - len(got))
            except TimeoutError:
                return None, time.monotonic() - t0
            except OSError:
                data = b""
            if not data:
                return None, time.monotonic() - t0
            got += data
        took = time.monotonic() - t0
        return (got[3] if got[0] == 0x20 else None), took
    finally:
        reset(sock)


FAILED_LOGIN_WORDS = ("bad user name or password", "login", "auth")


def login_throttling(
    target: Target,
    canary: Canary,
    user: str = "alice",
    other: str = "bob",
    attempts: int = 9,
    budget: float = 15.0,
    sys_topic: str | None = None,
    sys_port: int | None = None,
) -> Outcome:
    """Bad logins in a row for one user from one address (127.0.0.2): the later refusals
    must come back with growing delays, while a correct login of another user from another
    address (127.0.0.3) is answered at once. With ``sys_topic``: the failures are counted
    there (read from ``$SYS/#`` by a logged-in client). With ``target.log``: the broker
    logs the failures with the address."""
    out = Outcome("failed-login throttling")
    attacker, bystander = loopback(0), loopback(1)
    watcher = None
    sys_seen: dict[str, bytes] = {}
    if sys_topic is not None:
        watcher = connect_client(
            target.host,
            target.port,
            f"sys-watch-{random.getrandbits(24):x}",
            source=loopback(2),
            keepalive=0,
            **target.credentials,
        )
        subscribe(watcher, 1, ("$SYS/#", 0))
    times: list[float] = []
    codes: list[int | None] = []
    other_logins: list[tuple[int | None, float]] = []
    t_end = time.monotonic() + budget
    for i in range(attempts):
        remaining = t_end - time.monotonic()
        if remaining <= 0.2:
            break
        rc, took = _login(target, attacker, user, f"guess-{i}-{random.getrandbits(32):x}", remaining)
        times.append(took)
        codes.append(rc)
        if i in (attempts // 2, attempts - 1):
            other_logins.append(_login(target, bystander, other, target.users[other], 5.0))
    out.figures["refusal_s"] = "/".join(f"{t:.2f}" for t in times)
    if 0 in codes:
        out.problems.append("a wrong password was accepted")
    if len(times) < 6:
        out.problems.append(f"only {len(times)} attempts fit in {budget:g}s")
    else:
        first, last = median(times[:3]), times[-2:]
        if not (first < 0.5 and min(last) >= 1.0 and min(last) >= 3 * first):
            out.problems.append(
                f"no growing delay: the first refusals took {first * 1000:.0f} ms (median), "
                f"the last two {last[0]:.2f}s and {last[1]:.2f}s (want >= 1s)"
            )
    for rc, took in other_logins:
        if rc != 0 or took > 1.0:
            out.problems.append(
                f"another user's correct login from another address was not answered "
                f"promptly: CONNACK {rc} after {took:.2f}s"
            )
    if watcher is not None:
        deadline = time.monotonic() + 4.0
        while time.monotonic() < deadline:
            try:
                p = watcher.recv(max(0.01, deadline - time.monotonic()))
            except (TimeoutError, Closed, OSError):
                break
            if p.type == PUBLISH:
                sys_seen[p.topic] = p.payload
                value = sys_seen.get(sys_topic, b"")
                if value.strip().isdigit() and int(value) >= len(times):
                    break
        watcher.close()
        value = sys_seen.get(sys_topic)
        out.figures["sys_counter"] = value.decode(errors="replace") if value is not None else None
        if value is None or not value.strip().isdigit() or int(value) < len(times):
            near = sorted(t for t in sys_seen if re.search(r"auth|login|fail", t, re.I))
            out.problems.append(
                f"{sys_topic} does not count the {len(times)} failed logins "
                f"(got {value!r}; $SYS topics about logins: {near or 'none'})"
            )
    if target.log is not None:
        lines = [
            ln
            for ln in target.log().splitlines()
            if attacker in ln and any(w in ln.lower() for w in FAILED_LOGIN_WORDS)
        ]
        if not lines:
            out.problems.append(f"no log line names the failed logins' address {attacker}")
    return out


def login_cpu(
    target: Target,
    canary: Canary,
    user: str = "alice",
    rate: float = 20.0,
    duration: float = 5.0,
    p99_limit: float = 0.5,
) -> Outcome:
    """``rate`` bad logins a second (a known user, a new password each time, from distinct
    loopback addresses) for ``duration`` seconds: the canary's p99 stays under ``p99_limit``."""
    out = Outcome("login CPU")
    results: list[tuple[int | None, float]] = []
    cpu0, wall0 = cpu_seconds(target.pid), time.monotonic()
    threads = []
    t0 = time.monotonic()
    n = int(rate * duration)
    for i in range(n):
        at = t0 + i / rate
        time.sleep(max(0.0, at - time.monotonic()))
        t = threading.Thread(
            target=lambda i=i: results.append(
                _login(target, loopback(150 + i % 100), user, f"cpu-{i}-{random.getrandbits(32):x}", 3.0)
            ),
            daemon=True,
        )
        t.start()
        threads.append(t)
    for t in threads:
        t.join(5)
    cpu1 = cpu_seconds(target.pid)
    if cpu0 is not None and cpu1 is not None:
        out.figures["broker_cpu_cores"] = round((cpu1 - cpu0) / (time.monotonic() - wall0), 2)
    answered = sorted(took for rc, took in results if rc is not None)
    if answered:
        out.figures["refusal_p50_ms"] = round(percentile(answered, 0.5) * 1000)
    s = canary.summary("during")
    out.figures.update(logins=n, answered=len(answered), canary_p99_ms=round(s.get("p99", float("inf")) * 1000))
    if s.get("p99", float("inf")) >= p99_limit:
        out.problems.append(
            f"canary p99 {s.get('p99', float('inf')):.2f}s during {rate:g} bad logins/s (limit {p99_limit:g}s)"
        )
    if any(rc == 0 for rc, _ in results):
        out.problems.append("a wrong password was accepted")
    return out


def user_oracle(
    target: Target,
    canary: Canary,
    user: str = "alice",
    samples: int = 15,
    max_ratio: float = 0.3,
    min_diff: float = 0.002,
    rounds: int = 3,
) -> Outcome:
    """The time to a CONNACK 0x04 for unknown users and for a known user with a wrong
    password (fresh passwords, distinct addresses), taken in pairs, one of each back to
    back (which goes first alternates). Judged pair by pair, so that a burst of load from
    elsewhere (other tests, the password hash's lower CPU priority) lands on both halves of
    a pair rather than on one kind: the median of the pairs' differences must be below
    ``max_ratio`` of the larger median (or below ``min_diff`` seconds). Noise is
    symmetric, an oracle is not: when a round of ``samples`` pairs fails the check, up to
    ``rounds`` rounds are taken and judged together (an oracle fails them all)."""
    out = Outcome("user-name timing oracle")
    known: list[float] = []
    unknown: list[float] = []
    diffs: list[float] = []
    for i in range(samples * rounds):
        took = {}
        for kind in ("known", "unknown") if i % 2 else ("unknown", "known"):
            name = user if kind == "known" else f"nobody-{i}-{random.getrandbits(24):x}"
            rc, took[kind] = _login(
                target,
                loopback(200 + 2 * i + (kind == "known")),
                name,
                f"oracle-{i}-{random.getrandbits(32):x}",
                10.0,
            )
            if rc is not None and rc not in (4, 5):
                out.problems.append(f"{kind} user: CONNACK {rc}")
        known.append(took["known"])
        unknown.append(took["unknown"])
        diffs.append(took["known"] - took["unknown"])
        if (i + 1) % samples == 0:
            mk, mu, md = median(known), median(unknown), median(diffs)
            if abs(md) < min_diff or abs(md) < max_ratio * max(mk, mu):
                break
    mk, mu, md = median(known), median(unknown), median(diffs)
    out.figures.update(
        pairs=len(diffs), known_ms=round(mk * 1000, 1), unknown_ms=round(mu * 1000, 1), diff_ms=round(md * 1000, 1)
    )
    if abs(md) >= min_diff and abs(md) >= max_ratio * max(mk, mu):
        out.problems.append(
            f"a user-name oracle: over {len(diffs)} pairs known users are refused after {mk * 1000:.1f} ms "
            f"(median), unknown ones after {mu * 1000:.1f} ms, a median difference of {md * 1000:.1f} ms"
        )
    return out


# --------------------------------------------------------------------------- h. TLS handshakes


def idle_tls_handshakes(target: Target, canary: Canary, n: int = 20, margin: float = 1.5) -> Outcome:
    """``n`` TCP connections to the TLS port that never start the handshake. They must count
    against ``max_connections`` (which the canary's 2 connections and these fill: one more
    plain connection is refused), and be closed by the connect timeout (+ ``margin``)."""
    out = Outcome("idle TLS handshakes")
    socks = []
    base = socket_fds(target.pid)
    t0 = time.monotonic()
    try:
        for i in range(n):
            socks.append(open_socket(target.host, target.tls_port, source=loopback(120 + i)))
        opened = time.monotonic()
        # the kernel completes a TCP handshake before the broker accepts the socket: probe
        # the limit once the broker holds them all
        if not wait_until(lambda: socket_fds(target.pid) >= base + n, 2.0):
            out.notes.append(f"the broker accepted only {socket_fds(target.pid) - base} of the {n} sockets within 2 s")
        rc, took = try_connect(
            target.host, target.port, f"tls-extra-{random.getrandbits(24):x}", timeout=1.0, **target.credentials
        )
        out.figures["extra_plain_connection"] = "refused" if rc != 0 else "accepted"
        if rc == 0:
            out.problems.append(
                f"{n} idle TLS connections and the canary's 2 did not fill "
                f"max_connections ({target.max_connections}): one more was accepted"
            )
        limit = (target.connect_timeout or 10.0) + margin
        closed_at: dict[int, float] = {}
        sel = selectors.DefaultSelector()
        for i, sock in enumerate(socks):
            sock.setblocking(False)
            sel.register(sock, selectors.EVENT_READ, i)
        deadline = t0 + limit + (opened - t0)
        while len(closed_at) < n and time.monotonic() < deadline:
            for key, _ in sel.select(max(0.0, deadline - time.monotonic())):
                try:
                    data = key.fileobj.recv(4096)
                except BlockingIOError:
                    continue
                except OSError:
                    data = b""
                if not data:
                    closed_at[key.data] = time.monotonic()
                    sel.unregister(key.fileobj)
        sel.close()
        out.figures["closed"] = f"{len(closed_at)}/{n}"
        if closed_at:
            out.figures["last_closed_s"] = round(max(closed_at.values()) - t0, 2)
        if len(closed_at) < n:
            out.problems.append(
                f"{n - len(closed_at)} of {n} idle TLS connections were still open "
                f"{limit:g}s after they were made (connect timeout "
                f"{target.connect_timeout:g}s)"
            )
        else:
            rc, took = try_connect(
                target.host, target.port, f"tls-after-{random.getrandbits(24):x}", timeout=2.0, **target.credentials
            )
            if rc != 0:
                out.problems.append("no connection slot was free after the idle TLS connections closed")
    finally:
        for sock in socks:
            reset(sock)
    return out


# --------------------------------------------------------------------------- attacks that hold today


def slowloris(target: Target, canary: Canary, n: int = 40, step: float = 0.5, margin: float = 1.5) -> Outcome:
    """``n`` sockets each trickle a CONNECT, one byte every ``step`` seconds: the broker must
    close each within its connect timeout (+ ``margin``) of its opening."""
    out = Outcome("slowloris")
    limit = (target.connect_timeout or 10.0) + margin
    frame = mqttraw.connect(client_id="slowloris-" + "x" * 40, keepalive=60)
    socks, opened_at, closed_at = [], [], {}
    try:
        for i in range(n):
            socks.append(open_socket(target.host, target.port, source=loopback(i)))
            opened_at.append(time.monotonic())
            socks[-1].setblocking(False)  # (a socket with a timeout waits in recv, whatever the flags)
        deadline = max(opened_at) + limit
        k = 0
        while len(closed_at) < n and time.monotonic() < deadline:
            for i, sock in enumerate(socks):
                if i in closed_at:
                    continue
                try:
                    data = sock.recv(4096, socket.MSG_DONTWAIT)
                    gone = not data
                except BlockingIOError:
                    gone = False
                except OSError:
                    gone = True
                if not gone and k < len(frame):
                    try:
                        sock.send(frame[k : k + 1])
                    except OSError:
                        gone = True
                if gone:
                    closed_at[i] = time.monotonic()
            k += 1
            time.sleep(min(step, max(0.0, deadline - time.monotonic())))
    finally:
        for sock in socks:
            reset(sock)
    late = [i for i in range(n) if i not in closed_at or closed_at[i] - opened_at[i] > limit]
    out.figures["closed"] = f"{n - len(late)}/{n}"
    if closed_at:
        out.figures["slowest_close_s"] = round(max(closed_at[i] - opened_at[i] for i in closed_at), 2)
    if late:
        out.problems.append(f"{len(late)} of {n} trickling connections were not closed within {limit:g}s")
    return out


def _bad_connect(flags: int = 0x02, payload: bytes = mqttraw.s("bc"), proto=b"MQTT") -> bytes:
    return mqttraw.packet(0x10, mqttraw.s(proto) + bytes([4, flags]) + b"\x00\x3c" + payload)


def _pid(n: int) -> bytes:
    return struct.pack(">H", n)


# complete packets that break a rule of the standard: (name, after CONNECT?, bytes)
MALFORMED = [
    ("CONNECT reserved flag [MQTT-3.1.2-3]", False, _bad_connect(0x03)),
    ("CONNECT will QoS 3 [MQTT-3.1.2-14]", False, _bad_connect(0x1E, mqttraw.s("w") + mqttraw.s("t") + mqttraw.s("m"))),
    ("CONNECT password without user [MQTT-3.1.2-22]", False, _bad_connect(0x42, mqttraw.s("pw") + mqttraw.s("x"))),
    ("ClientId invalid UTF-8 [MQTT-3.1.3-4]", False, _bad_connect(payload=mqttraw.s(b"\xff\xfe"))),
    ("remaining length of 5 bytes", False, b"\x10\x80\x80\x80\x80\x01"),
    ("second CONNECT [MQTT-3.1.0-2]", True, mqttraw.connect(client_id="again")),
    ("topic invalid UTF-8 [MQTT-1.5.3-1]", True, mqttraw.packet(0x30, mqttraw.s(b"a/\xff") + b"x")),
    ("topic with NUL [MQTT-1.5.3-2]", True, mqttraw.packet(0x30, mqttraw.s(b"a\x00b") + b"x")),
    ("PUBLISH to a wildcard [MQTT-3.3.2-2]", True, mqttraw.publish("a/#", b"x")),
    ("QoS 1 PUBLISH with packet id 0 [MQTT-2.3.1-1]", True, mqttraw.publish("a/b", b"x", qos=1, pid=0)),
    ("SUBSCRIBE without filters [MQTT-3.8.3-3]", True, mqttraw.packet(0x82, _pid(1))),
    ("SUBSCRIBE QoS 3 [MQTT-3.8.3-4]", True, mqttraw.packet(0x82, _pid(1) + mqttraw.s("a") + b"\x03")),
    ("filter with # not last [MQTT-4.7.1-2]", True, mqttraw.subscribe(1, ("a/#/b", 0))),
    ("topic length past the packet", True, mqttraw.packet(0x30, b"\x00\x50a/b")),
    ("PINGREQ with a body", True, b"\xc0\x01\x00"),
    ("CONNACK from a client [MQTT-4.8.0-1]", True, b"\x20\x02\x00\x00"),
]


def malformed_packets(target: Target, canary: Canary, repeat: int = 2) -> Outcome:
    """Complete packets that break the standard, before and after CONNECT, each on its own
    connection: each connection is closed without an answer, within 3 s."""
    out = Outcome("malformed packets")
    base = socket_fds(target.pid)
    results: dict[str, tuple[bool, bytes]] = {}
    socks = []
    try:
        for r in range(repeat):
            for i, (name, after_connect, data) in enumerate(MALFORMED):
                sock = open_socket(target.host, target.port, source=loopback(i))
                if after_connect:
                    sock.sendall(mqttraw.connect(client_id=f"malformed-{r}-{i}", **target.credentials))
                    head = b""
                    while len(head) < 4:
                        chunk = sock.recv(4 - len(head))
                        if not chunk:
                            break
                        head += chunk
                    if head != b"\x20\x02\x00\x00":
                        raise AssertionError(f"{name}: the CONNECT before it was refused: {head!r}")
                sock.sendall(data)
                socks.append((f"{name} #{r}", sock))
        for name, sock in socks:
            closed, got, _ = closed_within(sock, 3.0)
            results[name] = (closed, got)
    finally:
        for _, sock in socks:
            sock.close()
    for name, (closed, got) in results.items():
        if not closed:
            out.problems.append(f"{name}: not closed within 3s")
        elif got:
            out.problems.append(f"{name}: the broker answered {got[:8]!r}")
    took = wait_sockets(target.pid, base, 3.0)
    if took is None:
        out.problems.append(f"the broker holds {socket_fds(target.pid)} sockets, {base} before")
    out.figures["cases"] = len(results)
    return out


def random_bytes(target: Target, canary: Canary, rng: random.Random, n: int = 40) -> Outcome:
    """Random byte strings (1 B - 4 kB) from ``n`` connections, half of them right after a
    valid CONNECT; each client then shuts its sending side. Every connection must be closed
    by the broker within 5 s and its sockets must go back to what they were."""
    out = Outcome("random bytes")
    base = socket_fds(target.pid)
    socks = []
    try:
        for i in range(n):
            after_connect = i % 2 == 1
            sock = open_socket(target.host, target.port, source=loopback(i))
            data = rng.randbytes(rng.choice((1, 2, 5, 16, 100, 1000, 4096)))
            if after_connect:
                data = mqttraw.connect(client_id=f"random-{i}", keepalive=0, **target.credentials) + data
            try:
                sock.sendall(data)
                sock.shutdown(socket.SHUT_WR)
            except OSError:
                pass
            socks.append(sock)
        closed = [closed_within(sock, 5.0)[0] for sock in socks]
    finally:
        for sock in socks:
            sock.close()
    if not all(closed):
        out.problems.append(
            f"{closed.count(False)} of {n} connections sending random bytes were not closed within 5 s of their end"
        )
    took = wait_sockets(target.pid, base, 3.0)
    if took is None:
        out.problems.append(f"the broker holds {socket_fds(target.pid)} sockets, {base} before")
    return out


def huge_inputs(target: Target, canary: Canary, subscriptions: int = 5000, max_growth_mb: float = 200.0) -> Outcome:
    """Large but legal: a PUBLISH of exactly the packet-size limit, ``subscriptions``
    subscriptions on one client, a 65,000-byte topic. All are delivered."""
    out = Outcome("huge legal inputs")
    tag = f"{os.getpid()}-{random.getrandbits(24):x}"
    watch = RssWatch(target.pid)
    sub = connect_client(target.host, target.port, f"huge-sub-{tag}", timeout=10.0, keepalive=0, **target.credentials)
    pub = connect_client(target.host, target.port, f"huge-pub-{tag}", timeout=10.0, keepalive=0, **target.credentials)
    step = "the largest packet allowed"
    try:
        # 1. the largest packet allowed
        assert subscribe(sub, 1, (f"huge/{tag}/max", 1)) == [1]
        overhead = len(mqttraw.publish(f"huge/{tag}/max", b"", qos=1, pid=1))
        size = target.max_packet_size
        payload = b"m" * (size - overhead - 3)  # the remaining length takes 4 bytes, not 1
        frame = mqttraw.publish(f"huge/{tag}/max", payload, qos=1, pid=1)
        if len(frame) != size:
            payload = b"m" * (len(payload) + size - len(frame))
            frame = mqttraw.publish(f"huge/{tag}/max", payload, qos=1, pid=1)
        pub.send(frame)
        _expect_delivery(out, pub, sub, 1, payload, step)
        # 2. many subscriptions on one client, 100 filters a SUBSCRIBE
        step = f"{subscriptions} subscriptions"
        granted = 0
        for k in range(subscriptions // 100):
            filters = [(f"many/{tag}/{k}/{j}/+", 1) for j in range(100)]
            granted += sum(1 for c in subscribe(sub, 2 + k, *filters, timeout=10.0) if c == 1)
        if granted != subscriptions // 100 * 100:
            out.problems.append(f"only {granted} of {subscriptions} subscriptions were granted")
        pub.send(mqttraw.publish(f"many/{tag}/7/42/x", b"one of many", qos=1, pid=2))
        _expect_delivery(out, pub, sub, 2, b"one of many", "a message to one of many subscriptions")
        # 3. a topic of 65,000 bytes (2,600 levels), subscribed exactly and through a wildcard
        step = "a 65,000-byte topic of 2,600 levels"
        long_topic = f"long/{tag}/" + "/".join(["abcdefghijklmnopqrstuvwx"] * 2600)
        long_topic = long_topic[:65000]
        assert subscribe(sub, 900, (long_topic, 1), (f"long/{tag}/#", 1)) == [1, 1]
        pub.send(mqttraw.publish(long_topic, b"long", qos=1, pid=3))
        # (two matching subscriptions: one copy or two [MQTT-3.3.5-1]; one is enough here)
        _expect_delivery(out, pub, sub, 3, b"long", "a message on a 65,000-byte topic")
    except (Closed, OSError, TimeoutError, AssertionError) as exc:
        out.problems.append(f"{step}: refused ({exc!r})")
    finally:
        growth = watch.stop()
        for c in (sub, pub):
            try:
                c.send(mqttraw.DISCONNECT_BYTES)
            except OSError:
                pass
            c.close()
    out.figures["rss_growth_mb"] = round(growth / 1024, 1)
    if growth / 1024 > max_growth_mb:
        out.problems.append(f"RSS grew by {growth / 1024:.0f} MB")
    return out


def _expect_delivery(out: Outcome, pub: Raw, sub: Raw, pid: int, payload: bytes, what: str, copies: int = 1) -> None:
    try:
        p = pub.recv(10.0)
        if p.type != PUBACK or p.packet_id != pid:
            out.problems.append(f"{what}: expected PUBACK {pid}, got {p!r}")
            return
        got = 0
        while got < copies:
            p = sub.recv(10.0)
            if p.type == PUBLISH:
                if p.payload != payload:
                    out.problems.append(f"{what}: a different payload arrived")
                    return
                if p.qos:
                    sub.send(mqttraw.puback(p.packet_id))
                got += 1
    except (TimeoutError, Closed, OSError) as exc:
        out.problems.append(f"{what}: not delivered ({exc!r})")


def many_connections(target: Target, canary: Canary, n: int = 2000, max_kb: float = 50.0) -> Outcome:
    """``n`` clients connect and stay; the broker's RSS per connection stays under ``max_kb``."""
    out = Outcome(f"{n} connections")
    base = rss_kb(target.pid)
    socks = []
    accepted = 0
    try:
        for batch in range(0, n, 200):
            group = []
            for i in range(batch, min(n, batch + 200)):
                sock = open_socket(target.host, target.port, source=loopback(i % 50), timeout=10.0)
                sock.sendall(mqttraw.connect(client_id=f"many-{i}-{os.getpid()}", keepalive=0, **target.credentials))
                group.append(sock)
            for sock in group:
                head = b""
                while len(head) < 4:
                    chunk = sock.recv(4 - len(head))
                    if not chunk:
                        break
                    head += chunk
                accepted += head == b"\x20\x02\x00\x00"
            socks += group
        grown = rss_kb(target.pid) - base
    finally:
        for sock in socks:
            sock.close()
    per = grown / max(1, accepted)
    out.figures.update(accepted=accepted, rss_growth_mb=round(grown / 1024, 1), kb_per_connection=round(per, 1))
    if accepted < n:
        out.problems.append(f"only {accepted} of {n} connections were accepted")
    if per > max_kb:
        out.problems.append(f"{per:.1f} kB of RSS per connection (limit {max_kb:g} kB)")
    return out


# --------------------------------------------------------------------------- set-up shared with the bench


def make_pki(d: Path) -> Path:
    """Two CAs (``ca``, ``rogue-ca``), a node certificate for 127.0.0.1 and a client
    certificate from each CA (``client``, ``rogue``), made with the openssl command (EC keys:
    quick to make)."""
    import subprocess

    def openssl(*args):
        subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True, timeout=60)

    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    (d / "ext.cnf").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    for ca in ("ca", "rogue-ca"):
        openssl(
            "req", "-x509", *ec, "-keyout", f"{ca}.key", "-out", f"{ca}.pem", "-days", "2", "-subj", f"/CN=hostile-{ca}"
        )
    for name, ca in (("node", "ca"), ("client", "ca"), ("rogue", "rogue-ca")):
        openssl("req", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}")
        openssl(
            "x509",
            "-req",
            "-in",
            f"{name}.csr",
            "-CA",
            f"{ca}.pem",
            "-CAkey",
            f"{ca}.key",
            "-CAcreateserial",
            "-out",
            f"{name}.pem",
            "-days",
            "2",
            "-extfile",
            "ext.cnf",
        )
    return d


_FLAGS: dict[str, set[str]] = {}


def mqttmesh_flags(python: str = sys.executable) -> set[str]:
    """The flags ``mqttmesh broker`` accepts (read once from its --help)."""
    if python not in _FLAGS:
        import subprocess

        out = subprocess.run([python, "-m", "mqttmesh", "broker", "--help"], capture_output=True, text=True, timeout=60)
        _FLAGS[python] = set(re.findall(r"(--[a-z0-9][a-z0-9-]*)", out.stdout))
    return _FLAGS[python]


def optional_flags(python: str = sys.executable, **settings) -> list[str]:
    """``--flag value`` for each setting the node knows (auth_fail_threshold=3 gives
    ``--auth-fail-threshold 3``); the others are left out, so that an attack runs on a node
    without the setting too and fails on what the node does, not on an unknown flag."""
    args = []
    for key, value in settings.items():
        flag = "--" + key.replace("_", "-")
        if flag in mqttmesh_flags(python):
            args += [flag, str(value)]
    return args
