"""Idle connections (issue 26): what one client costs a broker at rest, and how fast clients
connect and subscribe, mqttmesh beside Mosquitto in the same run.

    python -m bench.idle [--brokers mqttmesh,mosquitto] [--clients N] [--rounds R] [--json FILE]

Each round starts a fresh broker of each kind (in turn), waits until its resident memory is
steady, then opens ``--clients`` connections (default: as many as this process's
file-descriptor limit allows, less a margin; the soft limit is raised to the hard one), each
a CONNECT (MQTT 3.1.1, clean session, keep alive ``--keepalive``, 0 by default) and a
SUBSCRIBE of one filter of its own (``idle/<i>/#``, QoS 1), written together as soon as the
TCP connection is up, at most ``--window`` connections being set up at once. It counts a
client done when its CONNACK and SUBACK are read. Then every client stays connected and
silent for ``--rest`` seconds, the broker's RSS is read again, and the clients are closed
with a reset (no socket left in TIME_WAIT for the next round).

Printed per broker (medians over the rounds, and each round's figures): clients connected
and subscribed, connect+subscribe per second (first connect to last SUBACK), the broker's
RSS before and after, and the **RSS per idle client** ((after - before) / clients), with the
broker's CPU seconds over the connecting and the load generator's own. The load generator is
one Python process driving non-blocking sockets through ``epoll``, each client from a source
address of 127.0.0.0/8 shared by 250 (the kernel's search for a free port then stays short);
when its CPU seconds come near the connecting's seconds it is what limits the rate, and
Mosquitto's figure in the same run says how far.

Every process it starts is ended by PID when it finishes, also on Ctrl-C (bench.brokers).
"""

from __future__ import annotations

import argparse
import errno
import json
import resource
import select
import socket
import statistics
import struct
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from .brokers import REGISTRY, BrokerServer, Mosquitto, MqttmeshNodes, cpu_seconds
from .mqttproto import connect, subscribe

HOST = "127.0.0.1"
CONNACK_SUBACK = 4 + 5  # CONNACK (20 02 00 00) and SUBACK (90 03 00 01 qos) of MQTT 3.1.1
MARGIN = 200  # descriptors kept free for the broker's own files and this process's
SOURCE_SHARE = 250  # clients to each source address (_source)
IP_BIND_ADDRESS_NO_PORT = getattr(socket, "IP_BIND_ADDRESS_NO_PORT", 24)  # (Linux: the port is chosen at connect)
LINGER_RESET = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() sends a reset


@dataclass
class Round:
    broker: str
    clients: int  # connected and subscribed
    failed: int  # refused, reset or wrong answer
    seconds: float  # first connect to last SUBACK
    per_second: float
    rss_before_kb: int
    rss_after_kb: int
    per_client_bytes: float
    cpu_s: float | None  # the broker's CPU seconds over the connecting
    client_cpu_s: float  # this process's (the load generator's) over the connecting


def rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for {pid}")


def steady_rss(pid: int, within: float = 10.0, still: float = 1.0) -> int:
    """The broker's RSS once it changed by under 64 kB over ``still`` seconds (at most
    ``within`` seconds of waiting)."""
    deadline = time.monotonic() + within
    last = rss_kb(pid)
    while True:
        time.sleep(still)
        now = rss_kb(pid)
        if abs(now - last) < 64 or time.monotonic() > deadline:
            return now
        last = now


def _source(i: int) -> str:
    """The source address of client ``i``: SOURCE_SHARE clients to each address of
    127.0.0.0/8, so that the kernel finds each one's port at once (with every client on
    127.0.0.1 the search for a free port grows with the ports in use and in TIME_WAIT: at
    20,000 clients it cost this process 0.5 ms a connection)."""
    n = i // SOURCE_SHARE
    return f"127.0.{1 + n // 250}.{1 + n % 250}"


def open_clients(
    port: int, count: int, window: int, timeout: float, keepalive: int = 0
) -> tuple[list[socket.socket], int, float]:
    """``count`` clients connected and subscribed to ``HOST:port``: their sockets (kept open),
    the number that failed, and the seconds from the first connect to the last SUBACK.

    Each client's bytes are made before the clock starts; a client sends them as soon as its
    TCP connection is up (on loopback usually before ``connect`` returns, else once the
    socket is writable), and is done when its CONNACK and SUBACK are read."""
    hellos = [connect(f"idle-{i}", keepalive=keepalive) + subscribe(1, [(f"idle/{i}/#", 1)]) for i in range(count)]
    poll = select.epoll()
    socks: dict[int, socket.socket] = {}  # fd -> socket, while being set up
    unsent: dict[int, bytes] = {}  # fd -> what it has still to send (not connected yet)
    got: dict[int, int] = {}  # fd -> bytes of CONNACK and SUBACK read so far
    done: list[socket.socket] = []
    failed = 0
    started = 0
    t0 = time.monotonic()
    deadline = t0 + timeout

    def drop(fd: int) -> None:
        poll.unregister(fd)
        socks.pop(fd).close()
        unsent.pop(fd, None)
        got.pop(fd, None)

    while len(done) + failed < count:
        while started < count and len(socks) < window:
            i = started
            started += 1
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.setblocking(False)
            try:
                s.setsockopt(socket.IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, 1)
                s.bind((_source(i), 0))
                err = s.connect_ex((HOST, port))
            except OSError:
                err = -1
            if err not in (0, errno.EINPROGRESS):
                s.close()
                failed += 1
                continue
            fd = s.fileno()
            socks[fd] = s
            got[fd] = 0
            try:
                sent = s.send(hellos[i])
            except OSError:  # (BlockingIOError: not connected yet)
                sent = 0
            if sent < len(hellos[i]):
                unsent[fd] = hellos[i][sent:]
                poll.register(fd, select.EPOLLOUT)
            else:
                poll.register(fd, select.EPOLLIN)
        if time.monotonic() > deadline:
            break
        for fd, _ in poll.poll(1.0):
            s = socks[fd]
            rest = unsent.get(fd)
            if rest is not None:  # writable: connected (or refused)
                try:
                    if s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
                        raise ConnectionRefusedError
                    sent = s.send(rest)
                except OSError:
                    drop(fd)
                    failed += 1
                    continue
                if sent < len(rest):
                    unsent[fd] = rest[sent:]
                else:
                    del unsent[fd]
                    poll.modify(fd, select.EPOLLIN)
                continue
            try:
                data = s.recv(64)
            except OSError:
                data = b""
            if not data:
                drop(fd)
                failed += 1
                continue
            n = got[fd] + len(data)
            if n >= CONNACK_SUBACK:
                poll.unregister(fd)
                del got[fd]
                done.append(socks.pop(fd))
            else:
                got[fd] = n
    seconds = time.monotonic() - t0
    for fd in list(socks):
        drop(fd)
        failed += 1
    poll.close()
    return done, failed, seconds


def close_clients(socks: list[socket.socket]) -> None:
    """Close with a reset (SO_LINGER 0): no socket of this process lingers in TIME_WAIT to slow
    down the next round's connects."""
    for s in socks:
        try:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, LINGER_RESET)
        except OSError:
            pass
        s.close()


def one_round(
    server: BrokerServer, clients: int, window: int, rest: float, timeout: float, keepalive: int = 0
) -> Round:
    target = server.start()
    try:
        pid = target.pids[0]
        ep = target.nodes[0] if target.nodes else target.sub_endpoints[0]
        before = steady_rss(pid)
        cpu0 = cpu_seconds(pid)
        mine = time.process_time()
        socks, failed, seconds = open_clients(ep.port, clients, window, timeout, keepalive)
        mine = time.process_time() - mine
        cpu1 = cpu_seconds(pid)
        try:
            time.sleep(rest)  # (silent clients: what the broker keeps for them at rest)
            after = steady_rss(pid)
        finally:
            close_clients(socks)
        n = len(socks)
        return Round(
            server.name,
            n,
            failed,
            round(seconds, 3),
            round(n / seconds, 1) if seconds > 0 else 0.0,
            before,
            after,
            round((after - before) * 1024 / n, 1) if n else 0.0,
            None if cpu0 is None or cpu1 is None else round(cpu1 - cpu0, 3),
            round(mine, 3),
        )
    finally:
        server.stop()


def default_clients() -> int:
    """As many clients as the file-descriptor limit allows: the hard one (main raises the
    soft limit to it, for this process and the brokers it starts), less a margin."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    limit = soft if hard == resource.RLIM_INFINITY else hard
    return max(100, limit - MARGIN)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.idle", description=__doc__.split("\n\n")[0])
    p.add_argument("--brokers", default="mqttmesh,mosquitto")
    p.add_argument("--clients", type=int, default=0, help="default: the file-descriptor limit less a margin")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--window", type=int, default=500, help="connections being set up at once")
    p.add_argument("--rest", type=float, default=2.0, help="seconds the clients stay silent before RSS is read")
    p.add_argument("--timeout", type=float, default=120.0, help="longest the connecting may take, seconds")
    p.add_argument("--keepalive", type=int, default=0, help="the clients' Keep Alive, seconds (0: none)")
    p.add_argument("--json", help="write the rounds here")
    args = p.parse_args(argv)
    clients = args.clients or default_clients()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if clients + MARGIN > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, clients + MARGIN), hard))
    names = [b.strip() for b in args.brokers.split(",") if b.strip()]
    rounds: list[Round] = []
    with tempfile.TemporaryDirectory(prefix="bench-idle-") as tmp:
        try:
            servers = run_rounds(Path(tmp), names, clients, args, rounds)
        finally:
            REGISTRY.kill_all()
    print()
    print("| broker | clients | connect+subscribe /s | RSS per idle client, bytes | broker CPU s |  (medians)")
    print("|---|---:|---:|---:|---:|")
    for name in servers:
        mine = [r for r in rounds if r.broker == name]
        if not mine:
            continue
        cpu = [r.cpu_s for r in mine if r.cpu_s is not None]
        print(
            f"| {name} | {min(r.clients for r in mine):,} |"
            f" {statistics.median(r.per_second for r in mine):,.0f} |"
            f" {statistics.median(r.per_client_bytes for r in mine):,.0f} |"
            f" {statistics.median(cpu) if cpu else '-'} |"
        )
    if args.json:
        Path(args.json).write_text(json.dumps([asdict(r) for r in rounds], indent=1))
    return 0


def run_rounds(tmp: Path, names: list[str], clients: int, args: argparse.Namespace, rounds: list[Round]) -> list[str]:
    """Every round, each broker once in turn; the names of the brokers run."""
    servers: list[BrokerServer] = []
    for name in names:
        work = tmp / name
        work.mkdir()
        if name == "mqttmesh":
            servers.append(MqttmeshNodes(work))
        elif name == "mosquitto":
            servers.append(Mosquitto(work))
        else:
            raise SystemExit(f"unknown broker {name!r} (mqttmesh, mosquitto)")
    for server in servers:
        why = server.unavailable()
        if why:
            print(f"{server.name}: not run ({why})", file=sys.stderr)
    servers = [s for s in servers if not s.unavailable()]
    for r in range(args.rounds):
        for server in servers:  # (alternating: each round runs every broker once)
            one = one_round(server, clients, args.window, args.rest, args.timeout, args.keepalive)
            rounds.append(one)
            print(
                f"round {r + 1} {one.broker}: {one.clients:,} clients ({one.failed} failed) in {one.seconds:.2f} s,"
                f" {one.per_second:,.0f}/s; RSS {one.rss_before_kb:,} -> {one.rss_after_kb:,} kB,"
                f" {one.per_client_bytes:,.0f} B a client; CPU {one.cpu_s} s (load generator {one.client_cpu_s} s)",
                flush=True,
            )
    return [s.name for s in servers]


if __name__ == "__main__":
    sys.exit(main())
