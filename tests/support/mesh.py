"""Helpers for mesh tests: start wired nodes, wait for convergence, count what flowed."""

from __future__ import annotations

import contextlib
import threading
import time
from pathlib import Path

from mqttmesh.admin import fetch_status
from mqttmesh.auth import PasswordFile
from support import mqttraw as raw
from support.faultrelay import FaultRelay
from support.processes import free_port, wait_for

SECRET = "test-secret"


# a user of the password file ``admin=True`` gives the nodes: the ClientIds in the status
# (``$SYS/mesh/clients``) are for users the password file verified (docs/operations.md)
ADMIN_USER, ADMIN_PASSWORD = "mesh-admin", "mesh-admin-pw"


def admin_password_file(directory: Path) -> Path:
    path = Path(directory) / "admin-passwd"
    if not path.exists():
        passwords = PasswordFile(str(path))
        passwords.set(ADMIN_USER, ADMIN_PASSWORD, iterations=1000, salt=b"mesh-admin-salt!")
        passwords.save()
    return path


def start_mesh(
    broker_factory,
    names,
    edges,
    extra=(),
    connect="configured",
    peers_via=None,
    data_dirs=None,
    admin=False,
    http=False,
):
    """Start one node per name; ``edges`` (a, b) means a dials b. Returns {name: BrokerProcess}.

    ``peers_via[(a, b)]`` gives the address a dials instead of b's own (e.g. a FaultRelay).
    ``admin``: the nodes know ADMIN_USER (``status(node, admin=True)`` then has the ClientIds).
    ``http``: each node has an HTTP listener too, on ``node.http_port``.
    """
    nodes = {}
    for name in names:
        b = broker_factory(name=name, start=False)
        b.port = free_port()
        b.http_port = free_port() if http else 0
        nodes[name] = b
    for name in names:
        args = ["--cluster-secret", SECRET, "--connect", connect, "--status-interval", "0.1", *extra]
        if http:
            args += ["--http-port", str(nodes[name].http_port)]
        if admin:
            args += ["--password-file", str(admin_password_file(nodes[name].workdir))]
        for a, b in edges:
            if a == name:
                addr = (peers_via or {}).get((a, b)) or f"127.0.0.1:{nodes[b].port}"
                args += ["--peer", addr]
        if data_dirs:
            args += ["--data-dir", str(data_dirs / name)]
        nodes[name].args = args
        nodes[name].start()
    return nodes


@contextlib.contextmanager
def relayed_mesh(broker_factory, names, edges, relayed=(), extra=(), per_node=None, record=False):
    """Like start_mesh, with the links in ``relayed`` going through a FaultRelay each.

    Yields (nodes, relays); relays[(a, b)] is the relay a dials to reach b. The relays are
    closed on exit (the nodes by the fixture).
    """
    ports = {n: free_port() for n in names}
    relays = {}
    try:
        for a, b in relayed:
            relays[(a, b)] = FaultRelay("127.0.0.1", ports[b])
            if record:
                relays[(a, b)].record()  # from the first byte of the link
        nodes = {}
        for name in names:
            node = broker_factory(name=name, start=False)
            node.port = ports[name]
            node.args = [
                "--cluster-secret",
                SECRET,
                "--connect",
                "configured",
                "--status-interval",
                "0.1",
                *extra,
                *((per_node or {}).get(name, ())),
            ]
            for a, b in edges:
                if a == name:
                    node.args += ["--peer", relays[(a, b)].address if (a, b) in relays else f"127.0.0.1:{ports[b]}"]
            nodes[name] = node
        for name in names:
            nodes[name].start()
        yield nodes, relays
    finally:
        for relay in relays.values():
            relay.close()


def status(node, timeout=5.0, admin=False):
    """The node's mesh status; with ``admin``, as ADMIN_USER, so with its ClientIds."""
    if admin:
        return fetch_status(node.host, node.port, timeout, ADMIN_USER, ADMIN_PASSWORD.encode())
    return fetch_status(node.host, node.port, timeout)


def _tolerant(predicate):
    """A wait_for predicate that counts a node not answering (yet) as 'not yet'."""

    def check():
        try:
            return predicate()
        except (ConnectionError, OSError):
            return False

    return check


def neighbours_of(name, edges):
    return {b for a, b in edges if a == name} | {a for a, b in edges if b == name}


def wait_converged(nodes, edges, timeout=20.0):
    def ok():
        for name, node in nodes.items():
            s = status(node)
            if {n for n, i in s["nodes"].items() if i["reachable"]} != set(nodes):
                return False
            if set(s["neighbours"]) != neighbours_of(name, edges):
                return False
        return True

    wait_for(_tolerant(ok), timeout, interval=0.1, what="the mesh to converge")


def wait_interest(nodes, topic_filter, at, timeout=10.0, present=True):
    """Every node knows that node ``at`` subscribes to ``topic_filter`` (``present=False``:
    no longer does), every node of ``nodes`` that is alive."""

    def ok():
        return all(
            (topic_filter in status(n)["nodes"].get(at, {}).get("filters", [])) == present
            for n in nodes.values()
            if n.alive()
        )

    wait_for(_tolerant(ok), timeout, interval=0.05, what=f"{at}'s interest in {topic_filter} to spread")


def envelopes(nodes):
    """{(node, peer): envelopes sent} over every link (from the nodes' own counters)."""
    out = {}
    for name, node in nodes.items():
        for peer, n in status(node)["neighbours"].items():
            out[(name, peer)] = n["envelopes_out"]
    return out


def envelopes_in(node):
    return sum(n["envelopes_in"] for n in status(node)["neighbours"].values())


class Subscriber:
    """A raw MQTT subscriber on its own thread that acknowledges and records everything."""

    def __init__(self, node, client_id, topic_filter, qos=1, clean=True):
        self.client = raw.RawClient(node.host, node.port)
        ack = self.client.connect(client_id=client_id, clean=clean)
        assert ack.body[1] == 0, ack
        self.client.send(raw.subscribe(1, (topic_filter, qos)))
        self.client.expect(raw.SUBACK)
        self.received: list[tuple[str, bytes, int, bool]] = []
        self.lock = threading.Lock()
        self.stopped = False
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        while not self.stopped:
            try:
                p = self.client.recv(0.2)
            except TimeoutError:
                continue
            except (raw.Closed, OSError):
                return
            if p.type == raw.PUBLISH:
                with self.lock:
                    self.received.append((p.topic, p.payload, p.qos, p.dup))
                if p.qos == 1:
                    self.client.send(raw.puback(p.packet_id))
                elif p.qos == 2:
                    self.client.send(raw.pubrec(p.packet_id))
            elif p.type == raw.PUBREL:
                self.client.send(raw.pubcomp(p.packet_id))

    def payloads(self):
        with self.lock:
            return [r[1] for r in self.received]

    def wait_count(self, n, timeout=10.0):
        wait_for(lambda: len(self.payloads()) >= n, timeout, what=f"{n} messages (have {len(self.payloads())})")

    def close(self, disconnect=True):
        self.stopped = True
        self.thread.join(2)
        if disconnect:
            try:
                self.client.send(raw.DISCONNECT_BYTES)
            except OSError:
                pass
        self.client.close()


def publish(node, topic, payloads, qos=1, client_id=None, retain=False):
    """Publish each payload and wait for its acknowledgement (QoS 1: PUBACK, QoS 2: PUBCOMP)."""
    with raw.RawClient(node.host, node.port) as c:
        c.connect(client_id=client_id or f"pub-{time.monotonic_ns()}")
        for i, payload in enumerate(payloads):
            pid = i % 65535 + 1
            c.send(raw.publish(topic, payload, qos, retain, pid=pid))
            if qos == 1:
                assert c.expect(raw.PUBACK).packet_id == pid
            elif qos == 2:
                assert c.expect(raw.PUBREC).packet_id == pid
                c.send(raw.pubrel(pid))
                assert c.expect(raw.PUBCOMP).packet_id == pid
        if qos == 0:
            c.send(raw.PINGREQ_BYTES)  # the broker answers after it handled everything before
            c.expect(raw.PINGRESP)
        c.send(raw.DISCONNECT_BYTES)


def split_packets(stream: bytes):
    """Split a captured byte stream into (first byte, body) with the standard's framing rules."""
    pos, out = 0, []
    while pos < len(stream):
        first = stream[pos]
        mult, length, i = 1, 0, pos + 1
        while True:
            b = stream[i]
            length += (b & 0x7F) * mult
            mult *= 128
            i += 1
            if not b & 0x80:
                break
            assert mult <= 128**4, "remaining length over four bytes"
        out.append((first, stream[i : i + length]))
        pos = i + length
    assert pos == len(stream), "trailing bytes"
    return out
