"""Peer authentication on real nodes over real sockets: a recorded handshake replayed, a
listener that does not know the secret, a peer of another protocol version, and real
nodes that still link, route and reconnect (mesh/link/peerauth.py, design.md 2.6).

The attackers here are raw sockets that build their bytes with tests/support/mqttraw.py.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import socket
import threading
import time

import pytest

from mqttmesh.mesh.link.peerauth import PEER_PROTOCOL
from support import mqttraw as raw
from support.mesh import SECRET, Subscriber, publish, relayed_mesh, split_packets, status, wait_converged, wait_interest
from support.processes import wait_for

pytestmark = pytest.mark.process


def frame(first: int, body: bytes) -> bytes:
    return bytes([first]) + raw.varint(len(body)) + body


def log_lines(node, *needles):
    """The log lines of ``node`` that contain every one of ``needles``."""
    return [line for line in node.log().splitlines() if all(n in line for n in needles)]


def status_after(node, moment: float) -> dict:
    """A status the node published after ``moment`` (wall clock), so it reflects what came before."""
    return wait_for(
        lambda: (lambda s: s if s["time"] > moment + 0.2 else None)(status(node)),
        10,
        interval=0.05,
        what="a fresh status",
    )


def v1_token(secret: bytes, node: str, incarnation: int, stamp: int) -> bytes:
    """The password of peer protocol 1: node|incarnation|unix time|HMAC."""
    text = f"{node}|{incarnation}|{stamp}"
    return f"{text}|{hmac.new(secret, f'mqttmesh-peer|{text}'.encode(), hashlib.sha256).hexdigest()}".encode()


# --------------------------------------------------------------------------- (a) replay


def linked_connection(recorded: bytes):
    """The packets of the connection that made the link (the one that carried a hello) in a
    dialler's recorded bytes; earlier attempts may have reached the relay before the listener."""
    connections = []
    for first, body in split_packets(recorded):
        if first >> 4 == raw.CONNECT:
            connections.append([])
        connections[-1].append((first, body))
    linked = [
        conn
        for conn in connections
        if any(f >> 4 == raw.PUBLISH and raw.Packet(f, b).topic == "$mesh/from/a/hello" for f, b in conn)
    ]
    assert len(linked) == 1, f"{len(linked)} connections of the recorded link said hello"
    return linked[0]


def read_until_closed(client, timeout=5.0):
    """Every packet the node sends until it closes the connection (which it must, in time)."""
    packets, deadline = [], time.monotonic() + timeout
    while True:
        try:
            packets.append(client.recv(max(0.01, deadline - time.monotonic())))
        except raw.Closed:
            return packets
        except TimeoutError:
            raise AssertionError(f"the node did not close the replayed connection; it sent {packets}") from None


def test_recorded_peer_handshake_replayed_to_another_node_or_later_is_refused(broker_factory):
    with relayed_mesh(broker_factory, ["a", "b", "c"], [("a", "b")], relayed=[("a", "b")], record=True) as (
        nodes,
        relays,
    ):
        a, b, c = nodes["a"], nodes["b"], nodes["c"]
        wait_converged({"a": a, "b": b}, [("a", "b")])
        packets = linked_connection(relays[("a", "b")].captured(True))

        # everything the dialler sent, to another node with the same secret, all at once
        with raw.RawClient(c.host, c.port) as replay:
            address = "{}:{}".format(*replay.sock.getsockname())
            replay.send(b"".join(frame(f, body) for f, body in packets))
            answers = read_until_closed(replay)
            closed_at = time.time()
        assert [p.type for p in answers] == [raw.CONNACK, raw.SUBACK, raw.PUBLISH], answers
        assert answers[0].body == b"\x00\x00" and answers[1].body == b"\x00\x01\x01"
        assert answers[2].topic == "$mesh/to/a/auth" and answers[2].payload.startswith(b"c|")
        s = status_after(c, closed_at)
        assert s["links"] == {} and s["neighbours"] == {} and set(s["nodes"]) == {"c"}
        wait_for(
            lambda: log_lines(c, "WARNING", address, "failed to prove the cluster secret"),
            what="c's warning naming the replayer's address",
        )

        # to the node it was recorded at, later, step by step: refused, the live link untouched
        proof = [
            i
            for i, (f, body) in enumerate(packets)
            if f >> 4 == raw.PUBLISH and raw.Packet(f, body).topic == "$mesh/from/a/auth"
        ]
        assert len(proof) == 1
        links_before = status(b)["links"]
        with raw.RawClient(b.host, b.port) as replay:
            address = "{}:{}".format(*replay.sock.getsockname())
            replay.send(frame(*packets[0]))
            assert replay.expect(raw.CONNACK).body == b"\x01\x00"  # session present: the live link's
            replay.send(b"".join(frame(f, body) for f, body in packets[1 : proof[0]]))
            assert replay.expect(raw.SUBACK).body == b"\x00\x01\x01"
            fresh = replay.expect(raw.PUBLISH)
            assert fresh.topic == "$mesh/to/a/auth"
            replay.send(frame(*packets[proof[0]]))
            replay.expect_closed()
            closed_at = time.time()
        wait_for(
            lambda: log_lines(b, "WARNING", address, "failed to prove the cluster secret"),
            what="b's warning naming the replayer's address",
        )
        assert status_after(b, closed_at)["links"] == links_before
        assert not log_lines(b, "link to a down") and not log_lines(a, "link to b down")
        # the listener's nonce differs per connection: so did its challenge
        recorded_challenge = [
            body
            for f, body in split_packets(relays[("a", "b")].captured(False))
            if f >> 4 == raw.PUBLISH and raw.Packet(f, body).topic == "$mesh/to/a/auth"
        ][-1]
        assert raw.Packet(0x30, recorded_challenge).payload != fresh.payload


# --------------------------------------------------------------------------- (b) a listener without the secret


class _Accepted(raw.RawClient):
    def __init__(self, sock):  # a server-side socket, read with RawClient's packet reader
        self.sock = sock
        self.buf = b""
        self.timeout = 5.0


class FakeListener:
    """A raw MQTT server that plays a peer listener without the cluster secret.

    ``behaviour(conn, node)`` runs after the CONNECT is read; afterwards the fake answers
    PINGREQs until the dialler closes. Every connection's packets are kept in ``seen``.
    """

    def __init__(self, behaviour):
        self.behaviour = behaviour
        self.server = socket.create_server(("127.0.0.1", 0))
        self.server.settimeout(0.2)
        self.port = self.server.getsockname()[1]
        self.seen: list[dict] = []
        self.stopped = False
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _serve(self):
        while not self.stopped:
            try:
                sock, _ = self.server.accept()
            except OSError:
                continue
            record = {"packets": [], "closed_by_dialler": False, "opened": time.monotonic(), "closed": None}
            self.seen.append(record)
            conn = _Accepted(sock)
            try:
                connect = conn.recv(5)
                record["packets"].append(connect)
                node = connect.body[14 : 14 + int.from_bytes(connect.body[12:14], "big")].decode()[len("$mesh-") :]
                self.behaviour(conn, node, record)
                deadline = time.monotonic() + 20
                while not self.stopped and time.monotonic() < deadline:
                    try:
                        p = conn.recv(0.2)
                    except TimeoutError:
                        continue
                    record["packets"].append(p)
                    if p.type == raw.PINGREQ:
                        conn.send(b"\xd0\x00")
            except (raw.Closed, ConnectionError):
                record["closed_by_dialler"] = True
                record["closed"] = time.monotonic()
            except (TimeoutError, OSError):
                pass
            finally:
                conn.close()

    def close(self):
        self.stopped = True
        self.thread.join(5)
        self.server.close()


def _subscribe_then(send_after):
    def behaviour(conn, node, record):
        conn.send(b"\x20\x02\x00\x00")
        sub = conn.expect(raw.SUBSCRIBE)
        record["packets"].append(sub)
        conn.send(frame(0x90, sub.body[:2] + b"\x01"))
        send_after(conn, node)

    return behaviour


def _hello(node):
    return raw.publish(f"$mesh/to/{node}/hello", json.dumps({"node": "fake", "inc": 1, "addr": []}), 1, pid=1)


FAKES = {
    # a challenge in the right form, with a MAC it cannot compute, then a hello
    "forged-proof": lambda conn, node: conn.send(
        raw.publish(f"$mesh/to/{node}/auth", f"fake|1|{'ab' * 16}|{'0' * 64}") + _hello(node)
    ),
    # straight to the hello, as a version-1 listener would
    "hello-only": lambda conn, node: conn.send(_hello(node)),
    # nothing at all: it only answers PINGREQ
    "silent": lambda conn, node: None,
}


@pytest.mark.parametrize("kind", sorted(FAKES))
def test_dialler_never_links_to_a_listener_without_the_secret(broker_factory, kind):
    fake = FakeListener(_subscribe_then(FAKES[kind]))
    try:
        d = broker_factory(
            "--cluster-secret",
            SECRET,
            "--connect",
            "configured",
            "--status-interval",
            "0.1",
            "--peer",
            fake.address,
            "--connect-timeout",
            "1",
            name="d",
        )
        wait_for(
            lambda: fake.seen and fake.seen[0]["closed_by_dialler"],
            15,
            what="the dialler to close its connection to the fake listener",
        )
        first = fake.seen[0]
        closed_at = time.time()
        if kind == "silent":
            assert first["closed"] - first["opened"] >= 0.9  # it waited for the connect timeout, no less
        # it never answered with a proof of its own, nor said hello
        topics = [p.topic for rec in fake.seen for p in rec["packets"] if p.type == raw.PUBLISH]
        assert topics == [], topics
        wait_for(lambda: log_lines(d, "WARNING", fake.address), what="a warning naming the fake's address")
        s = status_after(d, closed_at)
        assert s["links"] == {} and s["neighbours"] == {} and set(s["nodes"]) == {"d"}
        assert not log_lines(d, "link to fake")
    finally:
        fake.close()


# --------------------------------------------------------------------------- (c) another protocol version


def test_peer_of_another_protocol_version_is_refused_naming_both_versions(broker_factory):
    node = broker_factory("--cluster-secret", SECRET, "--status-interval", "0.1", name="new")
    # a version-1 node's CONNECT, with a valid token of its time
    with raw.RawClient(node.host, node.port) as old:
        ack = old.connect(
            client_id="$mesh-old",
            username="mqttmesh-peer",
            clean=False,
            keepalive=2,
            password=v1_token(SECRET.encode(), "old", 5, int(time.time())),
        )
        assert ack.body == b"\x00\x04"
        old.expect_closed()
    with raw.RawClient(node.host, node.port) as newer:
        ack = newer.connect(
            client_id="$mesh-next",
            username="mqttmesh-peer",
            clean=False,
            password=b"%d|next|5|" % (PEER_PROTOCOL + 1) + b"ab" * 20,
        )
        assert ack.body == b"\x00\x04"
        newer.expect_closed()
    wait_for(
        lambda: log_lines(node, "WARNING", f"peer 'old' speaks mesh protocol 1, this node {PEER_PROTOCOL}"),
        what="the version-1 refusal in the log",
    )
    wait_for(
        lambda: log_lines(
            node, "WARNING", f"peer 'next' speaks mesh protocol {PEER_PROTOCOL + 1}, this node {PEER_PROTOCOL}"
        ),
        what="the newer version's refusal in the log",
    )
    assert status(node)["links"] == {}


def test_dialler_refused_by_a_listener_of_another_version_says_so(broker_factory):
    # a version-1 listener answers our CONNECT with 0x04 (its token check fails)
    fake = FakeListener(lambda conn, node, record: conn.send(b"\x20\x02\x00\x04"))
    try:
        d = broker_factory("--cluster-secret", SECRET, "--connect", "configured", "--peer", fake.address, name="d")
        wait_for(lambda: fake.seen and fake.seen[0]["closed_by_dialler"], what="the dialler to close")
        lines = wait_for(lambda: log_lines(d, "WARNING", fake.address, "0x04"), what="the refusal logged")
        assert re.search(rf"mesh protocol {PEER_PROTOCOL} credentials were refused.*another protocol version", lines[0])
    finally:
        fake.close()


# --------------------------------------------------------------------------- (d) real nodes


def test_real_nodes_link_route_and_reconnect(broker_factory):
    with relayed_mesh(
        broker_factory, ["a", "b"], [("a", "b")], relayed=[("a", "b")], extra=("--mesh-keepalive", "0.3")
    ) as (nodes, relays):
        wait_converged(nodes, [("a", "b")])
        sub = Subscriber(nodes["b"], "auth-sub", "auth/#", qos=1)
        try:
            wait_interest(nodes, "auth/#", "b")
            publish(nodes["a"], "auth/x", [b"before"], qos=1)
            sub.wait_count(1)
            relays[("a", "b")].cut()
            wait_for(lambda: status(nodes["a"])["links"] == {}, 10, what="a to see the link down")
            relays[("a", "b")].unblock()
            wait_converged(nodes, [("a", "b")])
            wait_interest(nodes, "auth/#", "b")
            publish(nodes["a"], "auth/x", [b"after"], qos=1)
            wait_for(lambda: b"after" in sub.payloads(), what="a message over the new link")
            for node in nodes.values():
                assert not log_lines(node, "failed to prove"), node.log()
                assert not log_lines(node, "handshake")
        finally:
            sub.close()
