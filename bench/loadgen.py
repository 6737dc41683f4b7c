"""The load generator: publisher and subscriber processes, and one run of a workload.

``run_once`` forks a few subscriber processes and a few publisher processes
(two cores: the generator is easily the bottleneck, so it is spread out), each
running many MQTT clients on one uvloop event loop over raw asyncio Protocols.
The parent orchestrates the phases over pipes:

    subscribers connect + subscribe -> publishers connect -> "go" at T0
    -> publishers publish until T0 + warmup + duration, then wait for their acks
    -> subscribers drain: until everything sent arrived, or no progress for a
       quiet period, or a deadline -> results -> "close"

Every wait has a deadline, and every child also arms SIGALRM at a hard deadline
and PR_SET_PDEATHSIG, so neither a stuck broker nor a dead harness leaves a
process behind.

Measurements:
- every payload carries (run id, publisher id, sequence number, time.monotonic_ns()
  at send); CLOCK_MONOTONIC is system-wide on Linux, so latency = receive - send
  across processes;
- delivered msgs/s = distinct messages the subscribers received inside the
  window [T0 + warmup, T0 + warmup + duration) / duration;
- a subscriber tracks per publisher the next expected sequence number and the
  gaps below it, which gives loss, duplicates and reordering in O(1) per message;
- lost = messages sent at QoS 0, or acknowledged at QoS 1/2, that a subscriber
  that should have received them never did; delivered fraction = 1 - lost / those
  messages (times their subscribers): the share of what a broker took that it delivered.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import multiprocessing.connection as mpc
import os
import signal
import socket
import struct
import sys
import time
import traceback
from bisect import bisect_right
from dataclasses import dataclass

from . import mqttproto as mq
from .brokers import REGISTRY, Target, cpu_seconds, die_with_parent, machine_cpu, stop_process
from .workloads import Workload

try:
    import uvloop
except ImportError:  # the generator still works, only slower
    uvloop = None

# latency histogram: 1 µs buckets up to 100 ms, then a list of the (rare) larger values
HIST_US = 100_000

_monotonic_ns = time.monotonic_ns
_PID = struct.Struct("!H")
_monotonic = time.monotonic


@dataclass
class RunOptions:
    warmup: float = 0.5  # seconds published before the measurement window opens
    duration: float = 3.0  # the measurement window
    drain_timeout: float = 10.0  # publishers waiting for acks, then subscribers for stragglers
    # a subscriber process stops draining after this long without progress: longer than a
    # node's timer period (0.25 s), on which the last of a persistent session's messages
    # across nodes may wait, so that a straggler is counted late, not lost
    quiet: float = 1.0
    connect_timeout: float = 30.0
    batch: int = 128  # messages per write for unpaced publishers
    settle: float = 0.0  # pause between "subscribed" and publishing (a mesh propagates routes)
    e2e_window: int | None = None  # override the workload's end-to-end window (0: off)
    inflight: int | None = None  # override the workload's QoS 1/2 window


@dataclass
class RunSpec:
    """What every child process needs (pickled into it by fork)."""

    run_id: int
    workload: Workload
    qos: int
    pub_eps: list[tuple[str, int, str | None]]  # per publisher index (host, port, WebSocket path)
    sub_eps: list[tuple[str, int, str | None]]  # per subscriber index
    opts: RunOptions
    inflight: int
    e2e_window: int
    hard_deadline: float  # seconds a child may live at most
    version: int = 4  # the clients' MQTT protocol level (5: the ``-v5`` brokers, properties and aliases)


class RunError(Exception):
    pass


# =========================================================================== child side


def _child_setup(hard_deadline: float) -> None:
    die_with_parent(signal.SIGKILL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's business: it kills us
    signal.alarm(max(1, int(hard_deadline)))  # default action of SIGALRM: terminate


def _run_child(coro_factory, conn, hard_deadline: float) -> None:
    _child_setup(hard_deadline)
    try:
        if uvloop is not None:
            with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
                runner.run(coro_factory())
        else:
            asyncio.run(coro_factory())
    except BaseException as exc:  # report, then die: the parent turns it into a failed run
        text = f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=4)}"
        try:
            conn.send(("error", text))
        except Exception:
            print(f"bench child {os.getpid()}: {text}", file=sys.stderr, flush=True)
    finally:
        try:
            conn.close()
        except Exception:
            pass


class _Pipe:
    """The parent's pipe, readable from the event loop without blocking it."""

    def __init__(self, conn, loop):
        self.conn = conn
        self.loop = loop
        self.queue: asyncio.Queue = asyncio.Queue()
        loop.add_reader(conn.fileno(), self._readable)

    def _readable(self):
        # the event loop made the descriptor non-blocking; a large message must not be cut
        os.set_blocking(self.conn.fileno(), True)
        try:
            msg = self.conn.recv()
        except (EOFError, OSError):
            self.loop.remove_reader(self.conn.fileno())
            msg = ("eof",)
        self.queue.put_nowait(msg)

    async def expect(self, kind: str, timeout: float):
        msg = await asyncio.wait_for(self.queue.get(), timeout)
        if msg[0] != kind:
            raise RunError(f"expected {kind!r} from the harness, got {msg[0]!r}")
        return msg

    def send(self, *msg):
        os.set_blocking(self.conn.fileno(), True)
        self.conn.send(msg)


def _set_nodelay(transport) -> None:
    sock = transport.get_extra_info("socket")
    if sock is not None:
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass


class _Client(asyncio.Protocol):
    """What publishers and subscribers share: CONNECT/CONNACK, connection state."""

    aliases = 0  # topic aliases it takes (an MQTT 5 subscriber)

    def __init__(self, client_id: str, clean: bool = True, version: int = 4):
        self.client_id = client_id
        self.clean = clean
        self.version = version
        self.transport = None
        self.buf = b""
        self.connack: asyncio.Future | None = None
        self.lost: str | None = None
        self.closing = False

    def connection_made(self, transport):
        self.transport = transport
        _set_nodelay(transport)
        self.connack = asyncio.get_running_loop().create_future()
        transport.write(mq.connect(self.client_id, clean=self.clean, version=self.version, aliases=self.aliases))

    def connection_lost(self, exc):
        if not self.closing:
            self.lost = f"{self.client_id}: connection lost ({exc or 'closed by broker'})"
        for fut in self._futures():
            if fut is not None and not fut.done():
                fut.set_exception(RunError(self.lost or "connection closed"))

    def _futures(self):
        return [self.connack]

    def _on_connack(self, data: bytes, start: int, end: int) -> None:
        rc = data[start + 1] if end - start >= 2 else 255
        if rc != 0:
            self.connack.set_exception(RunError(f"{self.client_id}: CONNACK return code {rc}"))
        elif not self.connack.done():
            self.connack.set_result(True)

    def close(self) -> None:
        self.closing = True
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(mq.DISCONNECT_PACKET)
            self.transport.close()


async def _connect(loop, factory, ep: tuple[str, int, str | None], attempts: int = 20):
    """Connect and wait for CONNACK 0. A CONNACK 0x03 (server unavailable: a mesh node that
    does not yet see enough of the mesh to serve a persistent session) is retried, as a real
    client does, every 0.1 s, ``attempts`` times at most. ``ep[2]``: a WebSocket path (MQTT
    over WebSocket, bench/wsclient.py), or None for TCP."""
    host, port, path = ep
    for attempt in range(attempts):
        if path is None:
            _, proto = await loop.create_connection(factory, host, port)
        else:
            from .wsclient import WsAdapter

            _, adapter = await loop.create_connection(lambda: WsAdapter(factory(), host, path), host, port)
            try:
                await adapter.opened
            except ConnectionError as exc:
                raise RunError(str(exc)) from None
            proto = adapter.inner
        try:
            await proto.connack
            return proto
        except RunError as exc:
            if "CONNACK return code 3" not in str(exc) or attempt == attempts - 1:
                raise
            proto.close()
            await asyncio.sleep(0.1)
    raise RunError("unreachable")  # (the loop returns or raises)


# --------------------------------------------------------------------------- subscribers


class Stats:
    """Counters and the latency histogram shared by all subscribers of one process."""

    def __init__(self):
        self.hist = [0] * HIST_US
        self.over: dict[int, int] = {}  # latencies >= 100 ms: count per whole millisecond
        self.window = 0  # distinct messages received inside the window
        self.total = 0  # distinct messages received
        self.dups = 0
        self.reordered = 0
        self.foreign = 0  # not of this run (a late message of an earlier run)
        self.misrouted = 0  # of this run, but from a publisher the subscriber does not match
        self.w0 = 0
        self.w1 = 0


class SubClient(_Client):
    def __init__(
        self,
        client_id: str,
        sub_id: int,
        topic_filter: str,
        qos: int,
        run_id: int,
        senders: list[int],
        n_pubs: int,
        stats: Stats,
        progress,
        clean: bool = True,
        version: int = 4,
    ):
        super().__init__(client_id, clean, version)
        if version == 5:
            self.aliases = mq.ALIASES5
        self.sub_id = sub_id
        self.topic_filter = topic_filter
        self.qos = qos
        self.run_id = run_id
        self.senders = senders
        self.nexts = [0] * n_pubs  # per publisher: highest sequence number seen + 1
        self.expect = [i in senders for i in range(n_pubs)]
        self.gaps: dict[int, tuple[list[int], list[int]]] = {}  # publisher -> (starts, ends) sorted
        self.count = 0
        self.stats = stats
        self.progress = progress
        self.progress_base = sub_id * n_pubs
        self.suback: asyncio.Future | None = None

    def _futures(self):
        return [self.connack, self.suback]

    async def subscribe(self):
        self.suback = asyncio.get_running_loop().create_future()
        self.transport.write(mq.subscribe(1, [(self.topic_filter, self.qos)], self.version))
        await self.suback

    def data_received(self, data: bytes) -> None:
        # The hot loop: one timestamp per read, frames parsed inline (no per-frame objects),
        # acknowledgements collected and written once per read.
        now = _monotonic_ns()
        if self.buf:
            data = self.buf + data
        st = self.stats
        in_window = st.w0 <= now < st.w1
        hist = st.hist
        nexts = self.nexts
        expect = self.expect
        run_id = self.run_id
        unpack = mq.PAYLOAD_HEAD.unpack_from
        v5 = self.version == 5
        acks = []
        got = 0
        win = 0
        pos = 0
        n = len(data)
        while n - pos >= 2:
            first = data[pos]
            length = data[pos + 1]
            i = pos + 2
            if length & 0x80:  # multi-byte Remaining Length (not for the benchmark's PUBLISHes)
                length &= 0x7F
                shift = 7
                complete = False
                while i < n and shift <= 21:
                    b = data[i]
                    i += 1
                    length |= (b & 0x7F) << shift
                    if not b & 0x80:
                        complete = True
                        break
                    shift += 7
                if not complete:
                    break
            end = i + length
            if end > n:
                break
            if first >> 4 == 3:  # PUBLISH
                p = i + 2 + ((data[i] << 8) | data[i + 1])
                qos = (first >> 1) & 3
                if qos:
                    acks.append(bytes((0x40 if qos == 1 else 0x50, 2, data[p], data[p + 1])))
                    p += 2
                if v5:
                    p += 1 + data[p]  # the properties (shorter than 128 bytes: a one-byte length)
                run, pub, seq, ts = unpack(data, p)
                pos = end
                if run != run_id:
                    st.foreign += 1
                    continue
                if not expect[pub]:  # a message this subscriber should not have received
                    st.misrouted += 1
                    continue
                nx = nexts[pub]
                if seq == nx:
                    nexts[pub] = seq + 1
                elif seq > nx:
                    self._gap(pub, nx, seq)
                    nexts[pub] = seq + 1
                elif not self._late(pub, seq):
                    continue  # a duplicate: counted in _late, not delivered again
                got += 1
                if in_window:
                    win += 1
                    us = (now - ts) // 1000
                    if us < HIST_US:
                        hist[us if us > 0 else 0] += 1
                    else:
                        ms = us // 1000
                        st.over[ms] = st.over.get(ms, 0) + 1
                continue
            kind = first >> 4
            if kind == mq.PUBREL:
                acks.append(bytes((mq.PUBCOMP_B, 2, data[i], data[i + 1])))
            elif kind == mq.CONNACK:
                self._on_connack(data, i, end)
            elif kind == mq.SUBACK:
                codes = data[i + 3 + data[i + 2] : end] if v5 else data[i + 2 : end]
                if any(c & 0x80 for c in codes):
                    self.suback.set_exception(RunError(f"{self.client_id}: SUBACK refused {self.topic_filter}"))
                elif codes and codes[0] != self.qos:
                    self.suback.set_exception(RunError(f"{self.client_id}: granted QoS {codes[0]}, asked {self.qos}"))
                else:
                    self.suback.set_result(True)
            pos = end
        self.buf = data[pos:] if pos < n else b""
        if acks:
            self.transport.write(b"".join(acks))
        if got:
            self.count += got
            st.total += got
            st.window += win
            # tell the publishers how far we are (end-to-end window); a plain store per sender
            base = self.progress_base
            progress = self.progress
            for pub in self.senders:
                progress[base + pub] = nexts[pub]

    def _gap(self, pub: int, start: int, end: int) -> None:
        g = self.gaps.get(pub)
        if g is None:
            g = self.gaps[pub] = ([], [])
        g[0].append(start)
        g[1].append(end)

    def _late(self, pub: int, seq: int) -> bool:
        """``seq`` is below the next expected one: fills a gap (True) or is a duplicate (False)."""
        g = self.gaps.get(pub)
        if g is not None:
            starts, ends = g
            k = bisect_right(starts, seq) - 1
            if k >= 0 and seq < ends[k]:
                s, e = starts[k], ends[k]
                if s == seq and e == seq + 1:
                    del starts[k], ends[k]
                elif s == seq:
                    starts[k] = seq + 1
                elif e == seq + 1:
                    ends[k] = seq
                else:
                    ends[k] = seq
                    starts.insert(k + 1, seq + 1)
                    ends.insert(k + 1, e)
                self.stats.reordered += 1
                return True
        self.stats.dups += 1
        return False

    def complete(self, sent: dict[int, int]) -> bool:
        for pub in self.senders:
            if self.nexts[pub] < sent.get(pub, 0):
                return False
            g = self.gaps.get(pub)
            if g and g[0] and g[0][0] < sent.get(pub, 0):
                return False
        return True

    def count_lost(self, sent: dict[int, int], unacked: dict[int, list[int]]) -> tuple[int, int]:
        """(lost, unexplained) for this subscriber: acknowledged/QoS 0 messages never received,
        and messages received with a sequence number the publisher never sent (a broker bug)."""
        lost = 0
        beyond = 0
        for pub in self.senders:
            n_sent = sent.get(pub, 0)
            nx = self.nexts[pub]
            starts, ends = self.gaps.get(pub, ([], []))
            not_received = max(0, n_sent - nx)
            for s, e in zip(starts, ends, strict=False):
                if s < n_sent:
                    not_received += min(e, n_sent) - s
            # messages never acknowledged are in flight, not lost
            for seq in unacked.get(pub, ()):
                if seq >= nx:
                    not_received -= 1
                else:
                    k = bisect_right(starts, seq) - 1
                    if k >= 0 and seq < ends[k]:
                        not_received -= 1
            lost += not_received
            beyond += max(0, nx - n_sent)
        return lost, beyond


async def _sub_main(conn, spec: RunSpec, sub_ids: list[int], progress) -> None:
    loop = asyncio.get_running_loop()
    pipe = _Pipe(conn, loop)
    w = spec.workload
    stats = Stats()
    clients: list[SubClient] = []

    async def one(j: int) -> SubClient:
        cid = f"bench-{spec.run_id}-s{j}"
        c = await _connect(
            loop,
            lambda: SubClient(
                cid,
                j,
                w.sub_filter(j),
                spec.qos,
                spec.run_id,
                w.senders(j),
                w.n_pubs,
                stats,
                progress,
                not w.persistent,
                spec.version,
            ),
            spec.sub_eps[j],
        )
        await c.subscribe()
        return c

    try:
        clients = list(await asyncio.wait_for(asyncio.gather(*(one(j) for j in sub_ids)), spec.opts.connect_timeout))
    except TimeoutError:
        raise RunError(f"subscribers not connected and subscribed within {spec.opts.connect_timeout:g} s") from None
    pipe.send("ready")
    o = spec.opts
    _, t0 = await pipe.expect("go", 2 * o.connect_timeout + o.settle + 30)  # publishers connect meanwhile
    stats.w0 = int((t0 + o.warmup) * 1e9)
    stats.w1 = int((t0 + o.warmup + o.duration) * 1e9)
    cpu0 = sum(os.times()[:2])
    _, sent, unacked = await pipe.expect("drain", t0 + o.warmup + o.duration + 2 * o.drain_timeout + 30 - _monotonic())
    # wait for stragglers: until all sent arrived, or no progress for `quiet`, or the deadline
    t_drain = _monotonic()
    deadline = t_drain + o.drain_timeout
    last_total, last_change = stats.total, t_drain
    while True:
        now = _monotonic()
        if all(c.complete(sent) for c in clients) or now > deadline:
            break
        if any(c.lost for c in clients):
            break
        if stats.total != last_total:
            last_total, last_change = stats.total, now
        elif now - last_change > o.quiet:
            break
        await asyncio.sleep(0.01)
    drain_s = _monotonic() - t_drain
    cpu1 = sum(os.times()[:2])
    lost = beyond = 0
    per_sub = {}
    for c in clients:
        lc, bc = c.count_lost(sent, unacked)
        lost += lc
        beyond += bc
        per_sub[c.sub_id] = {"received": c.count, "lost": lc}
    hist = {us: k for us, k in enumerate(stats.hist) if k}
    errors = [c.lost for c in clients if c.lost]
    if stats.misrouted:
        errors.append(f"{stats.misrouted} messages delivered to a subscriber whose filter does not match")
    if beyond:
        errors.append(f"{beyond} messages with sequence numbers never sent")
    pipe.send(
        "result",
        {
            "window": stats.window,
            "total": stats.total,
            "dups": stats.dups,
            "reordered": stats.reordered,
            "foreign": stats.foreign,
            "lost": lost,
            "hist": hist,
            "over": stats.over,
            "per_sub": per_sub,
            "drain_s": drain_s,
            "cpu_s": cpu1 - cpu0,
            "errors": errors,
        },
    )
    await pipe.expect("close", 60)
    for c in clients:
        c.close()
    await asyncio.sleep(0.05)


def _sub_proc(conn, spec: RunSpec, sub_ids: list[int], progress) -> None:
    _run_child(lambda: _sub_main(conn, spec, sub_ids, progress), conn, spec.hard_deadline)


# --------------------------------------------------------------------------- publishers


class PubClient(_Client):
    def __init__(
        self, client_id: str, pub_id: int, topic: str, qos: int, run_id: int, clean: bool = True, version: int = 4
    ):
        super().__init__(client_id, clean, version)
        self.pub_id = pub_id
        self.qos = qos
        self.run_id = run_id
        self.prefix = mq.publish_prefix(topic, qos, version)
        self.inflight: dict[int, int] = {}  # packet id -> seq, waiting for PUBACK / PUBREC
        self.releasing: set[int] = set()  # QoS 2: packet ids waiting for PUBCOMP
        self.acked = 0
        self.paused = False
        self.waiter: asyncio.Future | None = None
        self.protocol_errors: list[str] = []

    def connection_made(self, transport):
        super().connection_made(transport)
        transport.set_write_buffer_limits(high=256 * 1024)

    def pause_writing(self):
        self.paused = True

    def resume_writing(self):
        self.paused = False
        self._wake()

    def _wake(self):
        w = self.waiter
        if w is not None and not w.done():
            w.set_result(None)

    def connection_lost(self, exc):
        super().connection_lost(exc)
        self._wake()

    def data_received(self, data: bytes) -> None:
        if self.buf:
            data = self.buf + data
        frames, pos = mq.split_frames(data)
        self.buf = data[pos:]
        out = []
        inflight = self.inflight
        for first, s, e in frames:
            kind = first >> 4
            if kind == mq.PUBACK or kind == mq.PUBREC:
                pid = (data[s] << 8) | data[s + 1]
                if inflight.pop(pid, None) is None:
                    if kind == mq.PUBREC and pid in self.releasing:
                        out.append(mq.ack(mq.PUBREL_B, pid))  # a resent PUBREC: answer again
                    else:
                        self.protocol_errors.append(f"unexpected {'PUBACK' if kind == 4 else 'PUBREC'} {pid}")
                    continue
                self.acked += 1
                if kind == mq.PUBREC:
                    self.releasing.add(pid)
                    out.append(mq.ack(mq.PUBREL_B, pid))
            elif kind == mq.PUBCOMP:
                pid = (data[s] << 8) | data[s + 1]
                self.releasing.discard(pid)
            elif kind == mq.CONNACK:
                self._on_connack(data, s, e)
        if out:
            self.transport.write(b"".join(out))
        self._wake()

    @property
    def outstanding(self) -> int:
        return len(self.inflight) + len(self.releasing)

    async def wait(self, timeout: float) -> None:
        """Until an ack or resume_writing, or ``timeout`` seconds."""
        loop = asyncio.get_running_loop()
        fut = self.waiter = loop.create_future()
        handle = loop.call_later(timeout, _resolve, fut)
        try:
            await fut
        finally:
            handle.cancel()
            self.waiter = None

    async def publish_until(
        self,
        t0: float,
        t_end: float,
        rate: float | None,
        batch: int,
        inflight_max: int,
        e2e: int,
        progress,
        progress_idx: list[int],
    ) -> int:
        """Publish seq 0, 1, ... until ``t_end``; returns how many were sent."""
        qos = self.qos
        prefix = self.prefix
        run_id, pub_id = self.run_id, self.pub_id
        pack0 = mq.PAYLOAD_QOS0.pack
        pack12 = mq.PAYLOAD_QOS12.pack
        props5 = mq.PROPS5_FIELD if self.version == 5 else b""  # (between packet id and payload)
        inflight = self.inflight
        transport = self.transport
        seq = 0
        slowest = 0  # cached minimum progress of our subscribers
        while self.lost is None:
            now = _monotonic()
            if now >= t_end:
                break
            credit = batch
            if rate is not None:
                due = int((now - t0) * rate) + 1 - seq
                if due < credit:
                    credit = due
            if qos and inflight_max - self.outstanding < credit:
                credit = inflight_max - self.outstanding
            if e2e:
                if seq - slowest + credit > e2e:
                    slowest = min([progress[k] for k in progress_idx])
                    if e2e - (seq - slowest) < credit:
                        credit = e2e - (seq - slowest)
            if self.paused:
                credit = 0
            if credit <= 0:
                if rate is not None and due <= 0:
                    timeout = (seq / rate + t0) - now  # until the next message is due
                else:
                    timeout = 0.001  # the end-to-end window is polled (shared memory)
                # uvloop's timers count whole milliseconds and fire a shorter delay at once:
                # waiting less than 1 ms would spin, and a spinning generator on two cores
                # delays the broker and the subscribers (it showed as p90 latency of 2-4 ms)
                await self.wait(min(max(timeout, 0.001), max(t_end - now, 0.001)))
                continue
            ts = _monotonic_ns()
            end = seq + credit
            if qos == 0:
                transport.write(b"".join([prefix + pack0(run_id, pub_id, s, ts) for s in range(seq, end)]))
            else:
                frames = []
                for s in range(seq, end):
                    pid = s % 65535 + 1
                    inflight[pid] = s
                    if props5:
                        frames.append(prefix + _PID.pack(pid) + props5 + pack0(run_id, pub_id, s, ts))
                    else:
                        frames.append(prefix + pack12(pid, run_id, pub_id, s, ts))
                transport.write(b"".join(frames))
            seq = end
            await asyncio.sleep(0)  # let the acks in and the other publishers of this process run
        return seq


def _resolve(fut):
    if not fut.done():
        fut.set_result(None)


async def _pub_main(conn, spec: RunSpec, pub_ids: list[int], progress) -> None:
    loop = asyncio.get_running_loop()
    pipe = _Pipe(conn, loop)
    w = spec.workload
    o = spec.opts

    async def one(i: int) -> PubClient:
        cid = f"bench-{spec.run_id}-p{i}"
        return await _connect(
            loop,
            lambda: PubClient(cid, i, w.pub_topic(i), spec.qos, spec.run_id, not w.persistent, spec.version),
            spec.pub_eps[i],
        )

    try:
        clients = list(await asyncio.wait_for(asyncio.gather(*(one(i) for i in pub_ids)), o.connect_timeout))
    except TimeoutError:
        raise RunError(f"publishers not connected within {o.connect_timeout:g} s") from None
    pipe.send("ready")
    _, t0 = await pipe.expect("go", o.connect_timeout + 30)
    cpu0 = sum(os.times()[:2])
    t_end = t0 + o.warmup + o.duration
    rate = w.rate / w.n_pubs if w.rate else None
    delay = t0 - _monotonic()
    if delay > 0:
        await asyncio.sleep(delay)
    tasks = [
        c.publish_until(
            t0,
            t_end,
            rate,
            o.batch,
            spec.inflight,
            spec.e2e_window,
            progress,
            [j * w.n_pubs + c.pub_id for j in w.receivers(c.pub_id)],
        )
        for c in clients
    ]
    sent = await asyncio.wait_for(asyncio.gather(*tasks), t_end - _monotonic() + 10)
    # drain: every QoS 1/2 message acknowledged (and QoS 2 completed), every byte written
    deadline = _monotonic() + o.drain_timeout
    while _monotonic() < deadline:
        if all(
            (c.outstanding == 0 or c.lost) and (c.lost or c.transport.get_write_buffer_size() == 0) for c in clients
        ):
            break
        await asyncio.sleep(0.005)
    cpu1 = sum(os.times()[:2])
    result = {}
    for c, n in zip(clients, sent, strict=False):
        result[c.pub_id] = {
            "sent": n,
            "acked": c.acked if spec.qos else n,
            "unacked": sorted(c.inflight.values()),
            "incomplete": len(c.releasing),  # QoS 2: PUBREC received, PUBCOMP not
            "errors": ([c.lost] if c.lost else []) + c.protocol_errors[:5],
        }
    pipe.send("result", {"pubs": result, "cpu_s": cpu1 - cpu0})
    await pipe.expect("close", 120)
    for c in clients:
        c.close()
    await asyncio.sleep(0.05)


def _pub_proc(conn, spec: RunSpec, pub_ids: list[int], progress) -> None:
    _run_child(lambda: _pub_main(conn, spec, pub_ids, progress), conn, spec.hard_deadline)


# =========================================================================== parent side


def _split(ids: list[int], parts: int) -> list[list[int]]:
    parts = max(1, min(parts, len(ids)))
    return [ids[k::parts] for k in range(parts)]


class _Children:
    """The processes of one run, their pipes, and message collection with deadlines."""

    def __init__(self):
        self.procs: list = []
        self.conns: list = []
        self.names: list[str] = []

    def start(self, ctx, target_fn, name: str, *args) -> None:
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=target_fn, args=(child, *args), name=name, daemon=True)
        proc.start()
        REGISTRY.add(proc)
        child.close()
        self.procs.append(proc)
        self.conns.append(parent)
        self.names.append(name)

    def cpu_seconds(self) -> float:
        """utime+stime of all the generator's processes so far (from /proc)."""
        return sum(cpu_seconds(p.pid) or 0.0 for p in self.procs)

    def send(self, idx: list[int], *msg) -> None:
        for k in idx:
            try:
                self.conns[k].send(msg)
            except (OSError, BrokenPipeError):
                pass

    def collect(self, idx: list[int], kind: str, timeout: float) -> dict[int, object]:
        """One ``kind`` message from each child in ``idx``, or RunError."""
        deadline = _monotonic() + timeout
        got: dict[int, object] = {}
        waiting = {self.conns[k]: k for k in idx}
        while waiting:
            left = deadline - _monotonic()
            if left <= 0:
                names = ", ".join(self.names[k] for k in waiting.values())
                raise RunError(f"timed out after {timeout:.0f} s waiting for {kind!r} from {names}")
            for conn in mpc.wait(list(waiting), timeout=left):
                k = waiting.pop(conn)
                try:
                    msg = conn.recv()
                except (EOFError, OSError) as exc:
                    self.procs[k].join(1.0)
                    raise RunError(
                        f"{self.names[k]} died (exit code {self.procs[k].exitcode}; {type(exc).__name__} {exc})"
                    ) from exc
                if msg[0] == "error":
                    raise RunError(f"{self.names[k]}: {msg[1]}")
                if msg[0] != kind:
                    raise RunError(f"{self.names[k]}: expected {kind!r}, got {msg[0]!r}")
                got[k] = msg[1] if len(msg) > 1 else None
        return got

    def finish(self) -> None:
        self.send(list(range(len(self.conns))), "close")
        deadline = _monotonic() + 5
        for proc in self.procs:
            proc.join(max(0.0, deadline - _monotonic()))
        for proc in self.procs:
            stop_process(proc, grace=1.0)
        for conn in self.conns:
            conn.close()


def percentile(hist: dict[int, int], over: dict[int, int], q: float) -> float | None:
    """The q-quantile (0..1) in µs: ``hist`` counts per µs below 100 ms, ``over`` per ms above."""
    n = sum(hist.values()) + sum(over.values())
    if n == 0:
        return None
    rank = max(1, int(q * n + 0.999999))  # nearest-rank
    seen = 0
    for us in sorted(hist):
        seen += hist[us]
        if seen >= rank:
            return float(us)
    for ms in sorted(over):
        seen += over[ms]
        if seen >= rank:
            return float(ms * 1000)
    return None


def run_once(target: Target, workload: Workload, qos: int, opts: RunOptions, run_id: int) -> dict:
    """One run of ``workload`` at ``qos`` against ``target``; a dict of raw results.

    Never hangs: every phase has a deadline, and the child processes are killed
    by PID at the end whatever happened. Raises RunError when the run failed.
    """
    w = workload
    ctx = mp.get_context("fork")  # the parent runs no event loop, so fork is safe and fast
    progress = ctx.RawArray("q", w.n_subs * w.n_pubs)  # [sub * n_pubs + pub] = next seq seen
    inflight = opts.inflight or w.inflight
    e2e = w.e2e_window if opts.e2e_window is None else opts.e2e_window
    if qos and e2e and e2e < inflight:
        inflight = e2e
    hard = opts.connect_timeout * 3 + opts.settle + opts.warmup + opts.duration + 3 * opts.drain_timeout + 60
    spec = RunSpec(
        run_id,
        w,
        qos,
        [(e.host, e.port, e.path) for e in map(target.pub_endpoint, range(w.n_pubs))],
        [(e.host, e.port, e.path) for e in map(target.sub_endpoint, range(w.n_subs))],
        opts,
        inflight,
        e2e,
        hard,
        target.protocol,
    )
    kids = _Children()
    try:
        sub_groups = _split(list(range(w.n_subs)), w.sub_procs)
        for k, ids in enumerate(sub_groups):
            kids.start(ctx, _sub_proc, f"sub{k}", spec, ids, progress)
        subs = list(range(len(sub_groups)))
        kids.collect(subs, "ready", opts.connect_timeout + 10)
        if opts.settle > 0:
            time.sleep(opts.settle)
        pub_groups = _split(list(range(w.n_pubs)), w.pub_procs)
        for k, ids in enumerate(pub_groups):
            kids.start(ctx, _pub_proc, f"pub{k}", spec, ids, progress)
        pubs = list(range(len(sub_groups), len(sub_groups) + len(pub_groups)))
        kids.collect(pubs, "ready", opts.connect_timeout + 10)

        cpu0 = target.cpu_seconds()
        gen0 = kids.cpu_seconds()
        mach0 = machine_cpu()
        t0 = _monotonic() + 0.1
        kids.send(subs + pubs, "go", t0)
        pub_res = kids.collect(pubs, "result", 0.1 + opts.warmup + opts.duration + opts.drain_timeout + 20)
        t_pubs_done = _monotonic()
        per_pub = {}
        for r in pub_res.values():
            per_pub.update(r["pubs"])
        sent = {i: p["sent"] for i, p in per_pub.items()}
        unacked = {i: p["unacked"] for i, p in per_pub.items()}
        kids.send(subs, "drain", sent, unacked)
        sub_res = kids.collect(subs, "result", opts.drain_timeout + 20)
        t_end = _monotonic()
        cpu1 = target.cpu_seconds()
        gen1 = kids.cpu_seconds()
        mach1 = machine_cpu()
    finally:
        kids.finish()

    hist: dict[int, int] = {}
    over: dict[int, int] = {}
    for r in sub_res.values():
        for us, k in r["hist"].items():
            hist[us] = hist.get(us, 0) + k
        for ms, k in r["over"].items():
            over[ms] = over.get(ms, 0) + k
    window = sum(r["window"] for r in sub_res.values())
    total = sum(r["total"] for r in sub_res.values())
    broker_cpu = (cpu1 - cpu0) if cpu0 is not None and cpu1 is not None else None
    errors = [e for r in sub_res.values() for e in r["errors"]]
    errors += [f"publisher {i}: {e}" for i, p in per_pub.items() for e in p["errors"]]
    n_sent = sum(sent.values())
    expected = sum(sent[i] * len(w.receivers(i)) for i in sent)
    # what a subscriber must get: every message sent at QoS 0, every one acknowledged at QoS 1/2
    owed = sum((sent[i] - len(unacked.get(i, ()))) * len(w.receivers(i)) for i in sent)
    lost = sum(r["lost"] for r in sub_res.values())
    p = lambda q: None if (v := percentile(hist, over, q)) is None else v / 1000.0  # noqa: E731
    elapsed = t_end - t0
    return {
        "ok": True,
        "delivered_per_s": window / opts.duration,
        "window_msgs": window,
        "received": total,
        "published": n_sent,
        "published_per_s": n_sent / (opts.warmup + opts.duration),
        "expected": expected,
        "unacked": sum(len(u) for u in unacked.values()),
        "lost": lost,
        # the fraction of what was sent (QoS 0) or acknowledged (QoS 1/2) that arrived
        "delivered_fraction": (owed - lost) / owed if owed else None,
        "dups": sum(r["dups"] for r in sub_res.values()),
        "reordered": sum(r["reordered"] for r in sub_res.values()),
        "foreign": sum(r["foreign"] for r in sub_res.values()),
        "p50_ms": p(0.50),
        "p99_ms": p(0.99),
        "max_ms": p(1.0),
        "latency_samples": sum(hist.values()) + sum(over.values()),
        "broker_cpu_s": broker_cpu,
        "broker_cpu_us_per_msg": (broker_cpu / total * 1e6) if broker_cpu is not None and total else None,
        # share of one core the broker used from "go" to the end of the drain
        "broker_cpu_util": (broker_cpu / elapsed) if broker_cpu is not None else None,
        # the load generator's processes, same period: near 2 x elapsed on 2 cores means it was the limit
        "gen_cpu_s": gen1 - gen0,
        "gen_cpu_util": (gen1 - gen0) / elapsed,
        "gen_cpu_s_inside": sum(r["cpu_s"] for r in sub_res.values()) + sum(r["cpu_s"] for r in pub_res.values()),
        # all CPUs of the machine, same period (1.0 = every core busy; includes other users' load)
        "machine_busy": (mach1[0] - mach0[0]) / max(1, mach1[1] - mach0[1]),
        "elapsed_s": elapsed,
        "pub_phase_s": t_pubs_done - t0,
        "drain_s": max(r["drain_s"] for r in sub_res.values()),
        "inflight": inflight if qos else None,
        "e2e_window": e2e,
        "errors": errors[:20],
    }
