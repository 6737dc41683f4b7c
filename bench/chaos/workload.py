"""The workload: persistent publishers and subscribers, and probe clients, over real sockets.

Every client is a ``mqttmesh.sim.mqttclient.MqttClient`` (sans-I/O: it re-sends unacknowledged
PUBLISHes with DUP=1 and PUBRELs on every reconnection, as MQTT 3.1.1 requires) driven over a
non-blocking socket; all of them share one thread and one selector, and record one
``History``. Persistent clients move to another node every few (seeded) seconds, half the
time with DISCONNECT and half by dropping the connection; a refused (CONNACK != 0), failed or
silent connection makes them try another node after a short back-off. One probe client per
node (clean session, never moves) measures reconvergence: after a heal every probe
publishes a QoS 0 message on its own node until each has reached every other node's probe.

With ``Options.mqtt5`` the persistent clients speak MQTT 5 (issue 23): their sessions have a
Session Expiry Interval (``session_expiry``, longer than any absence the faults cause), and
every ``expiring_every``-th message has a Message Expiry Interval of ``message_expiry``
seconds, named in its topic (``.../e2``) so that the checker knows it without the broker.

With ``Options.shared`` (issue 24) the subscribers are the members of one shared group,
``$share/chaos/chaos/#``: ``sub{i}`` persistent, ``csub{i}`` clean sessions (``clean_members``
of them), which subscribe again on every connection. Their moves are DISCONNECT, a dropped
connection, or a *stall*: the member stops writing (its PUBACKs and PUBRECs are not sent) for
``stall_min``-``stall_max`` seconds, then resets the connection (RST); what it received
without acknowledging is recorded (an ``unacked`` op, ``record_unacked``): another member may
legitimately get it again.
"""

from __future__ import annotations

import queue
import random
import selectors
import socket
import struct
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from mqttmesh.sim.history import History
from mqttmesh.sim.mqttclient import MqttClient

SUB_FILTER = "chaos/#"
SHARE_FILTER = "$share/chaos/chaos/#"
PROBE_FILTER = "chaosprobe/#"


@dataclass
class Options:
    publishers: int = 4
    subscribers: int = 4
    rate: float = 120.0  # messages per second, all publishers together
    pid_range: int = 65535
    window: int = 20  # unacknowledged messages a publisher may have (at most pid_range)
    move_min: float = 4.0
    move_max: float = 12.0
    keepalive: int = 5  # in CONNECT; the server drops a silent client after 1.5 x this
    ping_every: float = 1.0
    dead_after: float = 4.0  # nothing from the server for this long: the connection is dead
    connack_timeout: float = 3.0
    probe_interval: float = 0.2
    probe_deadline: float = 40.0  # a heal not reconverged within this is reported as such
    mqtt5: bool = False  # the persistent clients speak MQTT 5 (module docstring)
    session_expiry: int = 120
    expiring_every: int = 3
    message_expiry: int = 2
    shared: bool = False  # the subscribers are one shared group's members (module docstring)
    clean_members: int = 0  # of the subscribers, clean-session ones (shared only)
    stall_min: float = 0.3
    stall_max: float = 1.5


@dataclass
class Measurement:
    label: str
    t_heal: float
    pending: set[tuple[str, str]]
    alone: bool = True  # no other fault held at the heal
    t_done: float | None = None
    expired: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {
            "heal": self.label,
            "t": round(self.t_heal, 3),
            "alone": self.alone,
            "reconverged_s": None if self.t_done is None else round(self.t_done - self.t_heal, 3),
            "missing_pairs": sorted(f"{a}->{b}" for a, b in self.pending) if self.expired else [],
        }


@dataclass
class Actor:
    name: str
    role: str  # pub, sub, probe
    rng: random.Random
    mqtt: MqttClient
    home: str = ""  # probe: its node
    sock: socket.socket | None = None
    conn_id: str = ""
    node: str = ""
    conns: int = 0
    out: bytearray = field(default_factory=bytearray)
    t_open: float = 0.0
    last_rx: float = 0.0
    last_ping: float = 0.0
    retry_at: float = 0.0
    next_move: float = float("inf")
    subscribed: bool = False
    n: int = 0
    next_pub: float = 0.0
    sent: dict[str, tuple[str, int]] = field(default_factory=dict)  # msg id -> (topic, qos)
    moves: int = 0
    skipped: int = 0
    clean: bool = False  # a clean-session member (shared workload)
    stall_until: float = 0.0  # stalled (nothing written) until then, then reset; 0: not stalled
    unacked: list[str] = field(default_factory=list)  # received, acknowledgement not written
    pending_ack: list[str] = field(default_factory=list)  # received, acknowledgement not all written yet
    resets: int = 0


class Workload:
    def __init__(self, ports: dict[str, int], history: History, rng: random.Random, opts: Options, t0: float):
        self.ports = ports
        self.names = sorted(ports)
        self.h = history
        self.opts = opts
        self.t0 = t0
        self.sel = selectors.DefaultSelector()
        self.heals: queue.Queue[tuple[str, float, bool]] = queue.Queue()
        self.measurements: list[Measurement] = []
        self.publishing = False
        self.moving = False
        self.persistent_on = False
        self.stopping = False
        self.last_receive = 0.0
        self.errors: list[str] = []
        self.actors: list[Actor] = []
        n_clean = opts.clean_members if opts.shared else 0
        for i in range(opts.subscribers):
            clean = i >= opts.subscribers - n_clean
            name = f"csub{i}" if clean else f"sub{i}"
            a = Actor(name, "sub", random.Random(rng.getrandbits(64)), self._client(name, clean), clean=clean)
            self.actors.append(a)
        for i in range(opts.publishers):
            name = f"pub{i}"
            mqtt = MqttClient(
                name, clean=False, keepalive=opts.keepalive, pid_range=opts.pid_range, **self._version(opts)
            )
            self.actors.append(Actor(name, "pub", random.Random(rng.getrandbits(64)), mqtt))
        for node in self.names:
            name = f"probe-{node}"
            mqtt = MqttClient(name, clean=True, keepalive=opts.keepalive)
            self.actors.append(Actor(name, "probe", random.Random(rng.getrandbits(64)), mqtt, home=node))
        self.thread = threading.Thread(target=self._run, daemon=True, name="chaos-workload")
        self._next_probe = 0.0

    @staticmethod
    def _sub_qos(a: Actor) -> int:
        """QoS 2, but 1 for a clean member: a QoS 2 message in flight to a member whose session
        ends is sent to no other member [MQTT-4.8.2-5], so a clean member that leaves with one
        loses it by the standard; at QoS 1 what it held goes to another member, and every
        loss the checker finds is a finding."""
        return 1 if a.clean else 2

    def _client(self, name: str, clean: bool = False) -> MqttClient:
        version = self._version(self.opts)
        if clean and version:
            version = {"version": 5}  # Clean Start 1, no Session Expiry: it ends with the connection
        return MqttClient(name, clean=clean, keepalive=self.opts.keepalive, report_repeats=True, **version)

    @staticmethod
    def _version(opts: Options) -> dict[str, int]:
        return {"version": 5, "session_expiry": opts.session_expiry} if opts.mqtt5 else {}

    @property
    def sub_filter(self) -> str:
        return SHARE_FILTER if self.opts.shared else SUB_FILTER

    def now(self) -> float:
        return time.monotonic() - self.t0

    # -- control, from other threads ---------------------------------------------------------

    def start(self) -> None:
        self.thread.start()

    def heal(self, label: str, t: float, alone: bool = True) -> None:
        self.heals.put((label, t, alone))

    def stop(self, timeout: float = 10.0) -> None:
        self.stopping = True
        self.thread.join(timeout)

    def clients(self) -> list[Actor]:
        """Publishers and subscribers (every client but the probes)."""
        return [a for a in self.actors if a.role != "probe"]

    def persistent(self) -> list[Actor]:
        return [a for a in self.clients() if not a.clean]

    def snapshot(self) -> dict[str, Any]:
        pers = self.clients()
        return {
            "connected": sum(1 for a in pers if a.mqtt.connected),
            "clients": len(pers),
            "unacked": sum(len(a.mqtt.outgoing) for a in pers if a.role == "pub"),
            "quiet_for": self.now() - self.last_receive,
            "measuring": sum(1 for m in self.measurements if m.t_done is None and not m.expired) + self.heals.qsize(),
            "subscribed": sum(1 for a in pers if a.role == "sub" and a.subscribed),
            "probes_ready": sum(1 for a in self.actors if a.role == "probe" and a.subscribed),
        }

    # -- the loop ---------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while not self.stopping:
                now = self.now()
                self._take_heals(now)
                for a in self.actors:
                    if a.role != "probe" and not self.persistent_on:
                        continue
                    self._tick(a, now)
                self._probe(now)
                for key, _ in self.sel.select(timeout=0.01):
                    self._readable(key.data)
        except Exception as exc:  # the run is judged incomplete, not silently wrong
            self.errors.append(f"workload thread: {exc!r}")
            raise
        finally:
            for a in self.actors:
                if a.sock is not None:
                    if a.mqtt.connected:
                        a.mqtt.disconnect()
                        a.out += a.mqtt.data_to_send()
                        self._flush(a)
                        self.h.closed(self.now(), a.name, a.conn_id, True, "end of run")
                    self._close(a)

    def _tick(self, a: Actor, now: float) -> None:
        if a.sock is None:
            if now >= a.retry_at:
                self._open(a, now)
            return
        if not a.mqtt.connected:
            if now - a.t_open > self.opts.connack_timeout:
                self._lost(a, now, "no CONNACK")
            return
        if a.stall_until:
            if now >= a.stall_until:
                self._reset(a, now)
            return
        if now - a.last_rx > self.opts.dead_after:
            self._lost(a, now, "server silent")
            return
        if now - a.last_ping >= self.opts.ping_every:
            a.mqtt.ping()
            a.last_ping = now
        if a.role == "pub":
            self._publish(a, now)
        if self.moving and now >= a.next_move and a.role != "probe":
            self._move(a, now)
            return
        self._pump(a)

    def _publish(self, a: Actor, now: float) -> None:
        interval = self.opts.publishers / self.opts.rate
        if a.next_pub < now - 1.0:
            a.next_pub = now  # no catch-up burst after a disconnection
        while self.publishing and a.next_pub <= now:
            a.next_pub += interval
            if not a.mqtt.connected or len(a.mqtt.outgoing) >= min(self.opts.window, self.opts.pid_range):
                a.skipped += 1
                continue
            a.n += 1
            qos = 1 if a.n % 2 else 2
            topic = f"chaos/{a.name}/q{qos}"
            expiry = None
            if self.opts.mqtt5 and a.n % self.opts.expiring_every == 0:
                expiry = self.opts.message_expiry
                topic += f"/e{expiry}"  # (what the checker reads it from: checker.expiry_of)
            msg_id = f"{a.name}:{a.n}"
            a.sent[msg_id] = (topic, qos)
            self.h.publish(now, a.name, "invoke", msg_id, topic, qos)
            a.mqtt.publish(topic, msg_id.encode(), qos, expiry)

    def _pick(self, a: Actor) -> str:
        if a.role == "probe":
            return a.home
        others = [n for n in self.names if n != a.node] or self.names
        return a.rng.choice(others)

    def _open(self, a: Actor, now: float) -> None:
        node = self._pick(a)
        a.conns += 1
        a.conn_id = f"{a.name}/{a.conns}"
        a.node = node
        try:
            sock = socket.create_connection(("127.0.0.1", self.ports[node]), timeout=0.5)
        except OSError as exc:
            if a.role != "probe":
                self.h.connect(now, a.name, "invoke", a.conn_id, node)
                self.h.connect(self.now(), a.name, "fail", a.conn_id, node, f"connect: {exc.__class__.__name__}")
            a.retry_at = self.now() + a.rng.uniform(0.1, 0.5)
            return
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        a.sock = sock
        a.out.clear()
        a.unacked, a.pending_ack = [], []
        a.t_open = a.last_rx = a.last_ping = now
        self.sel.register(sock, selectors.EVENT_READ, a)
        a.mqtt.connect()
        if a.role != "probe":
            self.h.connect(now, a.name, "invoke", a.conn_id, node)
        self._pump(a)

    def _close(self, a: Actor) -> None:
        if a.sock is not None:
            try:
                self.sel.unregister(a.sock)
            except (KeyError, ValueError):
                pass
            a.sock.close()
            a.sock = None

    def _lost(self, a: Actor, now: float, reason: str) -> None:
        """The connection failed or went silent: drop it, try another node after a back-off."""
        accepted = a.mqtt.connected or reason.startswith("malformed")
        a.mqtt.connection_lost()
        self._close(a)
        a.stall_until = 0.0
        if a.role == "probe" or a.clean:
            a.subscribed = False
        if a.role == "probe":
            pass  # (not in the history)
        elif accepted:
            self._unacked_end(a, now)
            self.h.closed(now, a.name, a.conn_id, False, reason)
        elif reason.startswith("CONNACK"):
            pass  # recorded as a refusal with its code
        else:
            self.h.connect(now, a.name, "fail", a.conn_id, a.node, reason)
        a.retry_at = now + a.rng.uniform(0.1, 0.5)

    def _move(self, a: Actor, now: float) -> None:
        a.moves += 1
        if a.clean:
            a.subscribed = False
        if self.opts.shared and a.role == "sub" and a.rng.random() < 1 / 3:
            # stall, then reset: what it takes meanwhile is not acknowledged
            a.stall_until = now + a.rng.uniform(self.opts.stall_min, self.opts.stall_max)
            if a.out:  # (acknowledgements not written yet: of the last messages received)
                a.unacked.extend(a.pending_ack)
            a.out.clear()
            a.mqtt.data_to_send()
            return
        if a.rng.random() < 0.5:
            a.mqtt.disconnect()
            a.out += a.mqtt.data_to_send()
            self._flush(a)
            self.h.closed(now, a.name, a.conn_id, True, "move")
        else:
            a.mqtt.connection_lost()
            self.h.closed(now, a.name, a.conn_id, False, "move (dropped)")
        self._unacked_end(a, now)
        self._close(a)
        a.retry_at = now

    def _reset(self, a: Actor, now: float) -> None:
        """The end of a stall: the connection is reset (RST), its acknowledgements never written."""
        a.stall_until = 0.0
        a.resets += 1
        a.mqtt.connection_lost()
        self._unacked_end(a, now)
        self.h.closed(now, a.name, a.conn_id, False, "reset (stalled)")
        if a.sock is not None:
            a.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self._close(a)
        a.retry_at = now

    def _unacked_end(self, a: Actor, now: float) -> None:
        """The connection ends: what it received without writing the acknowledgement is recorded."""
        ids = a.unacked + (a.pending_ack if a.out else [])
        if ids:
            record_unacked(self.h, now, a.name, a.conn_id, ids)
        a.unacked = []
        a.pending_ack = []

    def _pump(self, a: Actor) -> None:
        if a.stall_until:
            a.mqtt.data_to_send()  # (stalled: nothing is written)
            return
        data = a.mqtt.data_to_send()
        if data:
            a.out += data
        if a.out:
            self._flush(a)

    def _flush(self, a: Actor) -> None:
        if a.sock is None or not a.out:
            return
        try:
            sent = a.sock.send(a.out)
            del a.out[:sent]
            if not a.out:
                a.pending_ack.clear()
        except BlockingIOError:
            pass
        except OSError as exc:
            if a.mqtt.open:
                self._lost(a, self.now(), f"send: {exc.__class__.__name__}")
            return
        if a.sock is not None:
            want = selectors.EVENT_READ | (selectors.EVENT_WRITE if a.out else 0)
            self.sel.modify(a.sock, want, a)

    def _readable(self, a: Actor) -> None:
        if a.sock is None:
            return
        now = self.now()
        try:
            data = a.sock.recv(65536)
        except BlockingIOError:
            self._flush(a)
            return
        except OSError as exc:
            self._lost(a, now, f"recv: {exc.__class__.__name__}")
            return
        if not data:
            self._lost(a, now, "closed by the server")
            return
        a.last_rx = now
        for ev in a.mqtt.receive_data(data):
            self._event(a, ev, now)
            if a.sock is None:
                return
        self._pump(a)

    def _event(self, a: Actor, ev: tuple[Any, ...], now: float) -> None:
        kind = ev[0]
        h = self.h
        if kind == "connack":
            rc, present = ev[1], ev[2]
            if rc:
                if a.role != "probe":
                    h.connect(now, a.name, "fail", a.conn_id, a.node, rc)
                self._lost(a, now, f"CONNACK {rc}")
                return
            if a.role == "probe":
                a.mqtt.subscribe([(PROBE_FILTER, 0)])
                return
            h.connect(now, a.name, "ok", a.conn_id, a.node, present)
            if a.role == "sub" and not present:
                a.mqtt.subscribe([(self.sub_filter, self._sub_qos(a))])
            for out in a.mqtt.outgoing.values():  # re-sent by the client on this CONNACK
                h.publish(now, a.name, "resend", out.payload.decode(), out.topic, out.qos)
            a.next_move = now + a.rng.uniform(self.opts.move_min, self.opts.move_max)
        elif kind == "suback":
            a.subscribed = True
            if a.role == "sub":
                h.subscribed(now, a.name, [(self.sub_filter, self._sub_qos(a))])
        elif kind == "message":
            topic, payload, qos, dup, pid = ev[1:6]
            if a.role == "probe":
                self._probe_in(a, topic, payload, now)
            else:
                self.last_receive = now
                expiry = ev[6] if len(ev) > 6 else None  # (MQTT 5: what the node said is left)
                h.received(now, a.name, payload.decode(), topic, qos, dup, a.conn_id, pid, expiry)
                (a.unacked if a.stall_until else a.pending_ack).append(payload.decode())
        elif kind == "repeat":
            _, topic, payload, qos, dup, pid = ev
            h.repeated(now, a.name, payload.decode(), topic, qos, dup, a.conn_id, pid)
        elif kind == "acked" and a.role == "pub":
            msg_id = ev[2].decode()
            topic, qos = a.sent.pop(msg_id, ("?", 0))
            h.publish(now, a.name, "ok", msg_id, topic, qos)
        elif kind == "closed":
            self._lost(a, now, str(ev[1]))

    # -- reconvergence probes -----------------------------------------------------------------

    def _take_heals(self, now: float) -> None:
        while True:
            try:
                label, t, alone = self.heals.get_nowait()
            except queue.Empty:
                return
            pairs = {(s, d) for s in self.names for d in self.names if s != d}
            self.measurements.append(Measurement(label, t, pairs, alone))

    def _probe(self, now: float) -> None:
        open_ = [m for m in self.measurements if m.t_done is None and not m.expired]
        for m in open_:
            if now - m.t_heal > self.opts.probe_deadline:
                m.expired = True
        if not open_ or now < self._next_probe:
            return
        self._next_probe = now + self.opts.probe_interval
        for a in self.actors:
            if a.role == "probe" and a.mqtt.connected and a.subscribed:
                a.mqtt.publish(f"chaosprobe/{a.home}", f"{now:.6f}".encode(), 0)
                self._pump(a)

    def _probe_in(self, a: Actor, topic: str, payload: bytes, now: float) -> None:
        src = topic.split("/", 1)[1]
        try:
            sent = float(payload)
        except ValueError:
            return
        for m in self.measurements:
            if m.t_done is None and not m.expired and sent >= m.t_heal:
                m.pending.discard((src, a.home))
                if not m.pending:
                    m.t_done = now


def record_unacked(h: History, t: float, client: str, conn: str, msg_ids: list[str]) -> None:
    """``(t, client, "ok", "unacked", conn, msg_ids)``: messages ``client`` received on ``conn``
    whose PUBACK/PUBREC it never wrote (a stall, or unwritten when the connection ended)."""
    h.ops.append((t, client, "ok", "unacked", conn, sorted(set(msg_ids))))
