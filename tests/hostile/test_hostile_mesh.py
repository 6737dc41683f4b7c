"""Hostile peers and the mesh's own namespaces: a replayed peer handshake, a listener that
does not know the cluster secret, ClientIds in $SYS, the reserved $mesh namespace.

These assert black-box outcomes only (what `$SYS/mesh/status` lists, which connections a
node keeps), not the peer protocol, which issue 13 replaces with a challenge-response.
"""

from __future__ import annotations

import socket
import struct
import threading
import time

import pytest

from mqttmesh.mesh.link.hello import Hello, encode_hello
from support import mqttraw, probes
from support.faultrelay import FaultRelay
from support.hostile import SECRET, check, run, target_of
from support.mesh import status, wait_converged
from support.processes import wait_for

pytestmark = [pytest.mark.hostile, pytest.mark.process]

MESH = ["--cluster-secret", SECRET, "--connect", "configured", "--status-interval", "0.1"]


def linked_peers(node) -> set[str]:
    """The peers a node lists as linked (its links and its neighbours), or () when it does
    not answer."""
    try:
        s = status(node, timeout=2.0)
    except (ConnectionError, OSError, ValueError):
        return set()
    return set(s.get("links", {})) | set(s.get("neighbours", {}))


def watch_links(node, unwanted: str, duration: float, interval: float = 0.1) -> list[float]:
    """Poll the node's status for ``duration`` seconds; the times (from now) at which it
    listed ``unwanted`` as a linked peer."""
    t0 = time.monotonic()
    seen = []
    while time.monotonic() - t0 < duration:
        if unwanted in linked_peers(node):
            seen.append(round(time.monotonic() - t0, 2))
        time.sleep(interval)
    return seen


# --------------------------------------------------------------------------- f. replay


def test_replayed_peer_handshake_is_refused(nodes):
    """Node a dials b through a recording relay. What a sent is replayed, byte for byte, to a
    third node c that has the same cluster secret: c must not list a as a linked peer (for
    4 s) and must close the replayed connection within 5 s. A captured handshake must be
    useless on another link."""
    b = nodes(*MESH, name="b")
    relay = FaultRelay("127.0.0.1", b.port)
    try:
        relay.record()
        a = nodes(*MESH, "--peer", relay.address, name="a")
        c = nodes(*MESH, name="c")
        wait_converged({"a": a, "b": b}, [("a", "b")])
        outcome = run(target_of(a, sub_port=b.port), _replay, relay, c)
    finally:
        relay.close()
    check(outcome)


def _replay(target, canary, relay, c):
    out = probes.Outcome("replayed peer handshake")
    captured = relay.captured(from_dialler=True)
    out.figures["replayed_bytes"] = len(captured)
    sock = probes.open_socket(c.host, c.port, source=probes.loopback(7))
    closed = [None]
    t0 = time.monotonic()

    def read():
        ok, _, how = probes.closed_within(sock, 5.0)
        closed[0] = time.monotonic() - t0 if ok else None

    try:
        sock.sendall(captured)
        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        seen = watch_links(c, "a", 4.0)
        reader.join(6.0)
    finally:
        probes.reset(sock)
    out.figures["closed_after_s"] = round(closed[0], 2) if closed[0] is not None else None
    if seen:
        out.problems.append(
            f"c accepted the replayed handshake: it listed a as a linked peer "
            f"{len(seen)} times, from {seen[0]}s to {seen[-1]}s after the replay"
        )
    if closed[0] is None:
        out.problems.append("c kept the replayed connection open for 5 s")
    return out


# --------------------------------------------------------------------------- g. fake listener


class FakeListener:
    """A listener that plays a mesh peer without knowing the cluster secret: CONNACK 0 to
    any CONNECT, SUBACK to any SUBSCRIBE, PUBACK/PINGRESP as asked, and, after the first
    SUBSCRIBE, a syntactically valid hello of a made-up node on $mesh/to/<dialler>/hello."""

    def __init__(self, node_id: str = "fake-node"):
        self.node_id = node_id
        self.hello = encode_hello(Hello(node_id, 1, ["127.0.0.1:9"]))
        self.srv = socket.socket()
        self.srv.bind(("127.0.0.1", 0))
        self.srv.listen(16)
        self.srv.settimeout(0.2)
        self.port = self.srv.getsockname()[1]
        self.connections: list[dict] = []
        self.lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._accept, daemon=True, name="fake-listener")]
        self._threads[0].start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _accept(self):
        while not self._stop.is_set():
            try:
                sock, _ = self.srv.accept()
            except (TimeoutError, OSError):
                continue
            info = {"opened": time.monotonic(), "closed": None, "client_id": None, "hello_sent": False}
            with self.lock:
                self.connections.append(info)
            t = threading.Thread(target=self._serve, args=(sock, info), daemon=True)
            self._threads.append(t)
            t.start()

    def _serve(self, sock, info):
        c = mqttraw.RawClient.__new__(mqttraw.RawClient)
        c.sock, c.buf, c.timeout = sock, b"", 5.0
        dialler = None
        try:
            while not self._stop.is_set():
                try:
                    p = c.recv(0.2)
                except TimeoutError:
                    continue
                if p.type == mqttraw.CONNECT:
                    body = p.body
                    n = struct.unpack(">H", body[:2])[0]
                    at = 2 + n + 4  # protocol name, level, flags, keepalive
                    m = struct.unpack(">H", body[at : at + 2])[0]
                    info["client_id"] = body[at + 2 : at + 2 + m].decode(errors="replace")
                    if info["client_id"].startswith("$mesh-"):
                        dialler = info["client_id"][len("$mesh-") :]
                    c.send(b"\x20\x02\x00\x00")
                elif p.type == mqttraw.SUBSCRIBE:
                    pid = p.packet_id
                    body, i, codes = p.body, 2, []
                    while i < len(body):
                        n = struct.unpack(">H", body[i : i + 2])[0]
                        flt = body[i + 2 : i + 2 + n].decode(errors="replace")
                        codes.append(body[i + 2 + n] & 3)
                        i += 3 + n
                        if flt.startswith("$mesh/to/"):
                            dialler = flt.split("/")[2]
                    c.send(mqttraw.packet(0x90, struct.pack(">H", pid) + bytes(codes)))
                    if not info["hello_sent"] and dialler:
                        info["hello_sent"] = True
                        c.send(mqttraw.publish(f"$mesh/to/{dialler}/hello", self.hello, qos=1, pid=1))
                elif p.type == mqttraw.PUBLISH and p.qos == 1:
                    c.send(mqttraw.puback(p.packet_id))
                elif p.type == mqttraw.PUBLISH and p.qos == 2:
                    c.send(mqttraw.pubrec(p.packet_id))
                elif p.type == mqttraw.PUBREL:
                    c.send(mqttraw.pubcomp(p.packet_id))
                elif p.type == mqttraw.PINGREQ:
                    c.send(b"\xd0\x00")
        except (mqttraw.Closed, OSError):
            pass
        finally:
            info["closed"] = time.monotonic()
            sock.close()

    def first(self) -> dict | None:
        with self.lock:
            return self.connections[0] if self.connections else None

    def close(self):
        self._stop.set()
        for t in self._threads:
            t.join(2)
        self.srv.close()


def test_dialler_does_not_link_to_a_listener_without_the_secret(nodes):
    """A node dials a listener that answers like a peer but does not know the cluster
    secret (the fake accepts any CONNECT and introduces itself as fake-node): the node must
    not list fake-node as a linked peer (for 5 s), and must close the connection within
    10 s. The dialler authenticates the listener too."""
    fake = FakeListener()
    try:
        d = nodes(*MESH, "--peer", fake.address, name="d")
        outcome = run(target_of(d), _fake_listener, fake, d)
    finally:
        fake.close()
    check(outcome)


def _fake_listener(target, canary, fake, d):
    out = probes.Outcome("dialler vs. a listener without the secret")
    first = wait_for(fake.first, 10.0, what="the node to dial the fake listener")
    seen = watch_links(d, fake.node_id, 5.0)
    closed = probes.wait_until(lambda: first["closed"], max(0.0, first["opened"] + 10.0 - time.monotonic()))
    out.figures.update(
        hello_sent=first["hello_sent"],
        connections=len(fake.connections),
        first_closed_after_s=round(closed - first["opened"], 2) if closed else None,
    )
    if seen:
        out.problems.append(
            f"the node linked to {fake.node_id}, a listener that does not know the "
            f"secret: listed {len(seen)} times in 5 s, from {seen[0]}s"
        )
    if not closed:
        out.problems.append("the node kept its connection to the fake listener open for 10 s")
    return out


# --------------------------------------------------------------------------- l. $SYS and ClientIds


def test_sys_shows_no_client_ids_to_anonymous_clients(nodes):
    """A two-node mesh (--sys-interval 1, --status-interval 0.2) with a persistent client on
    each node: anonymous clients subscribed to `$SYS/#` on either node see no payload (nor
    topic) naming those ClientIds within 3 s."""
    extra = ["--sys-interval", "1", "--status-interval", "0.2"]
    a = nodes("--cluster-secret", SECRET, "--connect", "configured", *extra, name="a")
    b = nodes("--cluster-secret", SECRET, "--connect", "configured", *extra, "--peer", f"127.0.0.1:{a.port}", name="b")
    wait_converged({"a": a, "b": b}, [("b", "a")])
    check(run(target_of(a, sub_port=b.port), _client_ids_in_sys, a, b))


def _client_ids_in_sys(target, canary, a, b):
    out = probes.Outcome("ClientIds in $SYS")
    secret_ids = ["device-7f3a9c-on-a", "device-51be02-on-b"]
    devices = [
        probes.connect_client(n.host, n.port, cid, clean=False, keepalive=0)
        for n, cid in zip((a, b), secret_ids, strict=False)
    ]
    watchers = []
    try:
        for n in (a, b):
            w = probes.connect_client(n.host, n.port, f"anon-sys-{n.name}", keepalive=0)
            assert probes.subscribe(w, 1, ("$SYS/#", 0)) in ([0], [0x80])
            watchers.append((n.name, w))
        leaks = {}
        count = 0
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline:
            for name, w in watchers:
                try:
                    p = w.recv(0.05)
                except TimeoutError:
                    continue
                if p.type != mqttraw.PUBLISH:
                    continue
                count += 1
                for cid in secret_ids:
                    if cid.encode() in p.body:
                        leaks.setdefault((name, p.topic), cid)
        out.figures["sys_messages"] = count
        if leaks:
            out.problems.append(
                "anonymous $SYS readers see ClientIds: "
                + "; ".join(f"node {n} {topic} names {cid}" for (n, topic), cid in sorted(leaks.items()))
            )
    finally:
        for _, w in watchers:
            w.close()
        for dev in devices:
            dev.send(mqttraw.DISCONNECT_BYTES)
            dev.close()
    return out


# --------------------------------------------------------------------------- the $mesh namespace


def test_mesh_namespace_is_closed_to_clients(nodes):
    """On a mesh node: ordinary clients cannot subscribe to $mesh/... (SUBACK 0x80), what
    they publish there reaches no peer machinery (the node lists no new peer), ClientIds
    starting with $mesh are refused (CONNACK 0x02), and the peer user name with a made-up
    token is refused."""
    n = nodes(*MESH, name="m")
    check(run(target_of(n), _mesh_namespace, n))


def _mesh_namespace(target, canary, n):
    out = probes.Outcome("$mesh namespace")
    c = probes.connect_client(n.host, n.port, "mesh-snoop", keepalive=0)
    try:
        codes = probes.subscribe(c, 1, ("$mesh/#", 1), ("$mesh/to/+/hello", 1), ("$mesh/from/m/#", 1))
        if any(code != 0x80 for code in codes):
            out.problems.append(f"a client subscribed to $mesh topics: SUBACK {codes}")
        hello = encode_hello(Hello("intruder", 1, ["127.0.0.1:9"]))
        for topic in ("$mesh/from/intruder/hello", "$mesh/to/m/hello", "$mesh/from/m/adv"):
            c.send(mqttraw.publish(topic, hello, qos=1, pid=5))
            p = c.recv(5.0)
            if p.type != mqttraw.PUBACK:
                out.problems.append(f"publish to {topic}: expected a PUBACK [MQTT-3.3.5-2], got {p!r}")
    finally:
        c.close()
    for cid in ("$mesh-intruder", "$mesh", "$meshy"):
        rc, _ = probes.try_connect(n.host, n.port, cid, timeout=3.0)
        if rc != 0x02:
            out.problems.append(f"ClientId {cid!r}: CONNACK {rc}, expected 0x02 (identifier rejected)")
    rc, _ = probes.try_connect(
        n.host,
        n.port,
        "$mesh-intruder",
        timeout=3.0,
        username="mqttmesh-peer",
        password=f"intruder|1|{int(time.time())}|{'0' * 64}",
    )
    if rc == 0:
        out.problems.append("a made-up peer token was accepted")
    peers = linked_peers(n)
    if peers:
        out.problems.append(f"the node lists linked peers after the intrusion attempts: {sorted(peers)}")
    return out
