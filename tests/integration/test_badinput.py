"""Bad input never crashes the broker or stalls other clients.

Each malformed packet closes only the connection that sent it [MQTT-4.8.0-1];
a bystander connection and a fresh publisher/subscriber pair keep working.
"""

from __future__ import annotations

import socket
import struct
import threading
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from support import mqttraw
from support.integration import Client, Paho, connack, control_roundtrip, log_has, wait_log
from support.mqttraw import packet, s
from support.processes import BrokerProcess

pytestmark = pytest.mark.process

MAX_PACKET = 2048


@pytest.fixture(scope="module")
def shared_broker(tmp_path_factory):
    """One broker for the whole table (--max-packet-size 2048): a crash shows up at once."""
    b = BrokerProcess(tmp_path_factory.mktemp("badinput"), "bad", ["--max-packet-size", str(MAX_PACKET)])
    b.start()
    yield b
    b.stop(timeout=5)


@pytest.fixture(scope="module")
def bystanders(shared_broker):
    """A paho publisher/subscriber pair connected for the whole module."""
    sub = Paho("bystander-sub")
    pub = Paho("bystander-pub")
    try:
        assert not sub.connect(shared_broker).is_failure
        assert not pub.connect(shared_broker).is_failure
        assert [rc.value for rc in sub.subscribe("bystander/t", 1)] == [1]
        yield sub, pub
    finally:
        sub.stop()
        pub.stop()


def assert_others_unaffected(b, bystanders, tag: str) -> None:
    assert b.alive(), f"the broker died:\n{b.log()[-3000:]}"
    sub, pub = bystanders
    assert sub.c.is_connected() and pub.c.is_connected()
    pub.publish("bystander/t", tag.encode(), qos=1)
    assert sub.get() == ("bystander/t", tag.encode(), 1, False)
    control_roundtrip(b, tag)


def pid(n: int) -> bytes:
    return struct.pack(">H", n)


def bad_connect(flags: int = 0x02, payload: bytes = s("bc"), proto=b"MQTT") -> bytes:
    return packet(0x10, s(proto) + bytes([4, flags]) + b"\x00\x3c" + payload)


# (id, needs a CONNECT first, bytes)
CASES = [
    # fixed header
    ("reserved-type-0", True, b"\x00\x00"),
    ("reserved-type-15", True, b"\xf0\x00"),
    ("reserved-type-0-before-connect", False, b"\x00\x00"),
    ("remaining-length-5-bytes", True, b"\x30\xff\xff\xff\xff\x7f"),
    ("remaining-length-5-bytes-before-connect", False, b"\x10\x80\x80\x80\x80\x01"),
    ("over-max-packet-size", True, mqttraw.publish("big", b"x" * (MAX_PACKET + 10))),
    ("over-max-packet-size-header-only", True, b"\x30\xff\xff\x7f"),
    ("over-max-packet-size-connect", False, mqttraw.connect(client_id="x" * (MAX_PACKET + 10))),
    ("pubrel-flags-0 [MQTT-3.6.1-1]", True, b"\x60\x02\x00\x01"),
    ("subscribe-flags-0 [MQTT-3.8.1-1]", True, packet(0x80, pid(1) + s("a") + b"\x00")),
    ("unsubscribe-flags-0 [MQTT-3.10.1-1]", True, packet(0xA0, pid(1) + s("a"))),
    ("disconnect-flags [MQTT-3.14.1-1]", True, b"\xe1\x00"),
    ("pingreq-flags [MQTT-2.2.2-2]", True, b"\xc1\x00"),
    ("puback-flags [MQTT-2.2.2-2]", True, b"\x41\x02\x00\x01"),
    ("connect-flags [MQTT-2.2.2-2]", False, b"\x11" + mqttraw.connect(client_id="f")[1:]),
    ("publish-qos-3 [MQTT-3.3.1-4]", True, packet(0x36, s("a/b") + pid(1) + b"x")),
    ("publish-dup-qos-0 [MQTT-3.3.1-2]", True, packet(0x38, s("a/b") + b"x")),
    # strings [MQTT-1.5.3-1] [MQTT-1.5.3-2]
    ("topic-invalid-utf8", True, packet(0x30, s(b"a/\xff\xfe") + b"x")),
    ("topic-utf8-surrogate", True, packet(0x30, s(b"a/\xed\xa0\x80") + b"x")),
    ("topic-overlong-utf8", True, packet(0x30, s(b"a/\xc0\xaf") + b"x")),
    ("topic-nul [MQTT-4.7.3-2]", True, packet(0x30, s(b"a/\x00b") + b"x")),
    ("filter-invalid-utf8", True, packet(0x82, pid(1) + s(b"\xff/#") + b"\x00")),
    ("filter-nul", True, packet(0x82, pid(1) + s(b"a\x00") + b"\x00")),
    ("unsub-filter-invalid-utf8", True, packet(0xA2, pid(1) + s(b"\xc3"))),
    ("client-id-invalid-utf8 [MQTT-3.1.3-4]", False, bad_connect(payload=s(b"\xff\xff"))),
    ("client-id-nul", False, bad_connect(payload=s(b"a\x00b"))),
    ("username-invalid-utf8 [MQTT-3.1.3-11]", False, bad_connect(0x82, s("u8") + s(b"\xe2\x28\xa1"))),
    ("will-topic-invalid-utf8 [MQTT-3.1.3-10]", False, bad_connect(0x06, s("wt") + s(b"\xff") + s("m"))),
    ("will-topic-wildcard", False, bad_connect(0x06, s("wt") + s("a/#") + s("m"))),
    # topics and filters
    ("publish-wildcard-plus [MQTT-3.3.2-2]", True, mqttraw.publish("a/+/b", b"x")),
    ("publish-wildcard-hash [MQTT-3.3.2-2]", True, mqttraw.publish("a/#", b"x", qos=1, pid=1)),
    ("publish-empty-topic [MQTT-4.7.3-1]", True, mqttraw.publish("", b"x")),
    ("filter-hash-not-last [MQTT-4.7.1-2]", True, mqttraw.subscribe(1, ("a/#/b", 0))),
    ("filter-hash-in-level [MQTT-4.7.1-2]", True, mqttraw.subscribe(1, ("a#", 0))),
    ("filter-plus-in-level [MQTT-4.7.1-3]", True, mqttraw.subscribe(1, ("a+/b", 0))),
    ("filter-empty [MQTT-4.7.3-1]", True, mqttraw.subscribe(1, ("", 0))),
    ("second-filter-invalid", True, mqttraw.subscribe(1, ("ok/#", 0), ("bad/#/x", 0))),
    ("unsub-invalid-filter", True, mqttraw.unsubscribe(1, "a/#/b")),
    ("subscribe-qos-3 [MQTT-3.8.3-4]", True, packet(0x82, pid(1) + s("a") + b"\x03")),
    ("subscribe-reserved-bits [MQTT-3.8.3-4]", True, packet(0x82, pid(1) + s("a") + b"\x81")),
    ("subscribe-no-filters [MQTT-3.8.3-3]", True, packet(0x82, pid(1))),
    ("unsubscribe-no-filters [MQTT-3.10.3-2]", True, packet(0xA2, pid(1))),
    # packet identifiers [MQTT-2.3.1-1]
    ("publish-qos1-pid-0", True, mqttraw.publish("a/b", b"x", qos=1, pid=0)),
    ("publish-qos2-pid-0", True, mqttraw.publish("a/b", b"x", qos=2, pid=0)),
    ("subscribe-pid-0", True, mqttraw.subscribe(0, ("a", 0))),
    ("unsubscribe-pid-0", True, mqttraw.unsubscribe(0, "a")),
    ("puback-pid-0", True, b"\x40\x02\x00\x00"),
    ("pubrel-pid-0", True, b"\x62\x02\x00\x00"),
    # lengths inside the packet
    ("topic-length-overruns-packet", True, packet(0x30, b"\x00\x50a/b")),
    ("publish-qos1-without-pid", True, packet(0x32, s("a/b"))),
    ("puback-too-long", True, b"\x40\x03\x00\x01\x00"),
    ("puback-too-short", True, b"\x40\x01\x00"),
    ("pingreq-with-body", True, b"\xc0\x01\x00"),
    ("disconnect-with-body", True, b"\xe0\x01\x00"),
    ("connect-trailing-bytes [MQTT-3.1.3-1]", False, bad_connect(payload=s("tb") + b"\x00")),
    # packets only a server sends [MQTT-4.8.0-1]
    ("connack-from-client", True, b"\x20\x02\x00\x00"),
    ("suback-from-client", True, b"\x90\x03\x00\x01\x00"),
    ("unsuback-from-client", True, b"\xb0\x02\x00\x01"),
    ("pingresp-from-client", True, b"\xd0\x00"),
]


@pytest.mark.parametrize("needs_connect,data", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_malformed_packet_closes_only_the_offending_connection(shared_broker, bystanders, needs_connect, data, request):
    """[MQTT-4.8.0-1] the sender's connection is closed, before or after CONNECT (then
    without CONNACK [MQTT-3.1.4-1]); the broker and everyone else carry on."""
    b = shared_broker
    with Client(b.host, b.port) as bystander, Client(b.host, b.port) as bad:
        assert connack(bystander.connect(client_id="bystander-raw"))[1] == 0
        if needs_connect:
            assert connack(bad.connect(client_id="offender"))[1] == 0
        bad.send(data)
        got = []
        deadline = time.monotonic() + 5
        while True:
            try:
                got.append(bad.recv(max(0.0, deadline - time.monotonic())))
            except mqttraw.Closed:
                break
            except TimeoutError:
                raise AssertionError(f"not closed; received {got!r}") from None
        assert got == [], f"the broker answered a malformed packet: {got!r}"
        bystander.ping()
    assert_others_unaffected(b, bystanders, request.node.callspec.id.replace(" ", "_"))


TRUNCATED = [
    ("connect-cut", False, mqttraw.connect(client_id="cut")[:9]),
    ("connect-header-only", False, b"\x10"),
    ("publish-cut", True, mqttraw.publish("a/b", b"payload", qos=1, pid=1)[:7]),
    ("subscribe-cut", True, mqttraw.subscribe(1, ("a/#", 1))[:5]),
    ("length-cut", True, b"\x30\xff"),
    ("big-publish-cut", True, mqttraw.publish("a/b", b"z" * 1500, qos=2, pid=4)[:700]),
]


@pytest.mark.parametrize("needs_connect,data", [c[1:] for c in TRUNCATED], ids=[c[0] for c in TRUNCATED])
def test_truncated_packet_then_close_is_harmless(shared_broker, bystanders, needs_connect, data, request):
    """A packet cut short by the client closing the socket: nothing is delivered, the
    connection is cleaned up, nobody else notices.
    No statement covers a half packet; it is a network close like any other."""
    b = shared_broker
    watcher = Client(b.host, b.port)
    try:
        assert connack(watcher.connect(client_id="trunc-watch"))[1] == 0
        assert watcher.sub(1, ("a/#", 2)) == [2]
        with Client(b.host, b.port) as bad:
            if needs_connect:
                assert connack(bad.connect(client_id="truncator"))[1] == 0
            bad.send(data)
        assert_others_unaffected(b, bystanders, "trunc-" + request.node.callspec.id)
        watcher.expect_silence(0.1)
    finally:
        watcher.close()


def test_packet_split_into_single_bytes_is_accepted(shared_broker, bystanders):
    """The byte stream may arrive one byte at a time (TCP gives no framing). [MQTT-7.1.1-1] the
    transport is a byte stream: packets have no boundaries on the wire."""
    b = shared_broker
    with Client(b.host, b.port) as sub, Client(b.host, b.port) as pub:
        data = mqttraw.connect(client_id="bytewise") + mqttraw.subscribe(1, ("bw/t", 1))
        for i in range(len(data)):
            sub.send(data[i : i + 1])
        assert connack(sub.recv()) == (0, 0)
        assert sub.expect_ack(mqttraw.SUBACK, 1).body == b"\x00\x01\x01"
        assert connack(pub.connect(client_id="bytewise-pub"))[1] == 0
        frame = mqttraw.publish("bw/t", b"slow", qos=1, pid=2)
        for i in range(len(frame)):
            pub.send(frame[i : i + 1])
        pub.expect_ack(mqttraw.PUBACK, 2)
        (p,) = sub.publishes(1)
        assert p.payload == b"slow"


def test_max_size_packet_is_still_accepted(shared_broker):
    """The limit is inclusive: a PUBLISH of exactly --max-packet-size bytes goes through. (A
    broker limit, not a statement of the standard.)"""
    b = shared_broker
    with Client(b.host, b.port) as sub, Client(b.host, b.port) as pub:
        assert connack(sub.connect(client_id="max-sub"))[1] == 0
        assert sub.sub(1, ("max/t", 0)) == [0]
        assert connack(pub.connect(client_id="max-pub"))[1] == 0
        overhead = len(mqttraw.publish("max/t", b"", qos=1, pid=1))
        payload = b"m" * (MAX_PACKET - overhead - 1)  # the remaining length takes 2 bytes, not 1
        frame = mqttraw.publish("max/t", payload, qos=1, pid=1)
        assert len(frame) == MAX_PACKET
        pub.send(frame)
        pub.expect_ack(mqttraw.PUBACK, 1)
        (p,) = sub.publishes(1)
        assert p.payload == payload


# --------------------------------------------------------------------------- fuzzing

TEMPLATES = [
    mqttraw.publish("fz/a", b"hello", qos=0),
    mqttraw.publish("fz/a", b"hello", qos=1, pid=1),
    mqttraw.publish("fz/b", b"hello", qos=2, pid=2, retain=True),
    mqttraw.pubrel(2),
    mqttraw.puback(1),
    mqttraw.pubrec(3),
    mqttraw.pubcomp(3),
    mqttraw.subscribe(4, ("fz/#", 2), ("fz/+/x", 1)),
    mqttraw.unsubscribe(5, "fz/#"),
    mqttraw.PINGREQ_BYTES,
    mqttraw.DISCONNECT_BYTES,
    mqttraw.connect(client_id="fz-again"),
]


@st.composite
def mutated(draw):
    data = bytearray(draw(st.sampled_from(TEMPLATES)))
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["flip", "set", "insert", "delete", "truncate"]))
        if not data:
            break
        i = draw(st.integers(0, len(data) - 1))
        if kind == "flip":
            data[i] ^= 1 << draw(st.integers(0, 7))
        elif kind == "set":
            data[i] = draw(st.integers(0, 255))
        elif kind == "insert":
            data[i:i] = draw(st.binary(min_size=1, max_size=8))
        elif kind == "delete":
            del data[i]
        else:
            del data[i:]
    return bytes(data)


streams = st.lists(
    st.one_of(st.binary(min_size=1, max_size=64), mutated(), st.sampled_from(TEMPLATES)), min_size=1, max_size=6
).map(b"".join)


@pytest.fixture(scope="module")
def fuzz_env(tmp_path_factory):
    b = BrokerProcess(tmp_path_factory.mktemp("fuzz"), "fuzz", ["--max-packet-size", "4096", "--connect-timeout", "2"])
    b.start()
    sub = Client(b.host, b.port)
    pub = Client(b.host, b.port)
    try:
        assert connack(sub.connect(client_id="fuzz-ctl-sub"))[1] == 0
        assert sub.sub(1, ("fuzzctl/t", 1)) == [1]
        assert connack(pub.connect(client_id="fuzz-ctl-pub", keepalive=0))[1] == 0
        yield b, sub, pub
    finally:
        sub.close()
        pub.close()
        b.stop(timeout=5)


_counter = iter(range(1, 1 << 30))


@settings(
    max_examples=200,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=streams)
def test_fuzz_random_and_mutated_packets_after_connect(fuzz_env, data):
    """Random bytes and mutated valid packets after a valid CONNECT: whatever the broker
    decides for that connection, it stays alive and a control pub/sub keeps delivering
    [MQTT-4.8.0-1]."""
    b, ctl_sub, ctl_pub = fuzz_env
    with Client(b.host, b.port, timeout=5) as c:
        assert connack(c.connect(client_id="fuzzer", keepalive=0))[1] == 0
        try:
            c.send(data)
            c.sock.shutdown(socket.SHUT_WR)  # the broker reads everything, then sees EOF
            deadline = time.monotonic() + 5
            while True:  # drain until the broker has closed its side
                c.sock.settimeout(max(0.01, deadline - time.monotonic()))
                if not c.sock.recv(65536):
                    break
        except (ConnectionResetError, BrokenPipeError):
            pass
        except TimeoutError:
            raise AssertionError(f"the broker neither closed nor finished after {data!r}") from None
    assert b.alive(), f"broker died after {data!r}:\n{b.log()[-3000:]}"
    n = next(_counter)
    ctl_pub.pub("fuzzctl/t", str(n).encode(), qos=1, pid=n % 65535 + 1)
    (p,) = ctl_sub.publishes(1)
    assert p.payload == str(n).encode()
    ctl_sub.ack(p)


def test_fuzz_leaves_a_working_broker(fuzz_env):
    """After the fuzzing above: a fresh pair still works and nothing crashed in the log.
    [MQTT-4.8.0-1] errors close connections, never the server."""
    b, _, _ = fuzz_env
    assert b.alive()
    control_roundtrip(b, "after-fuzz")
    assert "Traceback" not in b.log(), b.log()[-5000:]


# --------------------------------------------------------------------------- slow consumer


def test_slow_consumer_is_dropped_and_others_continue(broker_factory):
    """A subscriber that never reads its socket while a publisher floods its topic is
    dropped (--max-write-buffer 1 MiB, --slow-consumer-timeout 1 s); the broker, the
    publisher and other clients keep working, also while the slow one is stuck.
    (Broker limits, no statement of the standard; [MQTT-4.8.0-2] a transient error
    closes only that connection.)"""
    b = broker_factory("--max-write-buffer", "1048576", "--slow-consumer-timeout", "1")
    slow = socket.socket()
    slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    slow.settimeout(5)
    slow.connect((b.host, b.port))
    flooder = Client(b.host, b.port, timeout=10)
    errors = []
    try:
        slow.sendall(mqttraw.connect(client_id="slow-reader") + mqttraw.subscribe(1, ("flood/#", 0)))
        head = b""
        while len(head) < 9:  # CONNACK (4) + SUBACK (5), then never read again
            head += slow.recv(9 - len(head))
        assert head == b"\x20\x02\x00\x00\x90\x03\x00\x01\x00"
        assert connack(flooder.connect(client_id="flooder"))[1] == 0
        chunk = b"".join(mqttraw.publish("flood/t", b"F" * 65536) for _ in range(16))  # ~1 MiB

        def flood():
            try:
                for _ in range(24):
                    flooder.send(chunk)
            except OSError as exc:
                errors.append(exc)

        t = threading.Thread(target=flood, daemon=True)
        t.start()
        # while the slow consumer is stuck, other traffic flows
        control_roundtrip(b, "during-flood")
        wait_log(b, "'slow-reader'", "slow consumer", timeout=15)
        t.join(20)
        assert not t.is_alive(), "the flooding publisher is still blocked"
        assert errors == []
        flooder.pub("flood/t", b"after", qos=1, pid=9)  # the publisher is still connected
        control_roundtrip(b, "after-flood")
        assert b.alive()
        # the slow socket was closed by the broker: reading it to the end finds EOF/reset
        slow.settimeout(5)
        try:
            while slow.recv(1 << 20):
                pass
        except ConnectionResetError:
            pass
    finally:
        slow.close()
        flooder.close()


def test_stuck_consumer_dropped_after_slow_consumer_timeout(broker_factory):
    """Default (large) --max-write-buffer, --slow-consumer-timeout 1: a subscriber that
    stops reading makes its publisher wait, and is dropped after about 1 s without
    progress; then the publisher goes on, and other clients were never held up.
    (Broker limits, no statement of the standard.)"""
    b = broker_factory("--slow-consumer-timeout", "1")
    slow = socket.socket()
    slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    slow.settimeout(5)
    slow.connect((b.host, b.port))
    flooder = Client(b.host, b.port, timeout=10)
    errors = []
    try:
        slow.sendall(mqttraw.connect(client_id="stuck-reader") + mqttraw.subscribe(1, ("stuck/#", 0)))
        head = b""
        while len(head) < 9:
            head += slow.recv(9 - len(head))
        assert connack(flooder.connect(client_id="stuck-flooder"))[1] == 0
        chunk = b"".join(mqttraw.publish("stuck/t", b"S" * 1000) for _ in range(1000))  # ~1 MB

        def flood():
            try:
                for _ in range(16):
                    flooder.send(chunk)
            except OSError as exc:
                errors.append(exc)

        t0 = time.monotonic()
        t = threading.Thread(target=flood, daemon=True)
        t.start()
        control_roundtrip(b, "while-stuck")
        wait_log(b, "'stuck-reader'", "slow consumer", timeout=10)
        assert 0.9 <= time.monotonic() - t0 <= 6.0
        t.join(20)
        assert not t.is_alive() and errors == []
        flooder.pub("stuck/t", b"after", qos=1, pid=3)
        control_roundtrip(b, "after-stuck")
    finally:
        slow.close()
        flooder.close()


def test_publisher_held_back_by_flow_control_is_not_timed_out(broker_factory, clients):
    """[MQTT-3.1.2-24] a client whose Control Packets are sent in time (a PINGREQ every
    0.4 s with keepalive 1) must not be disconnected for keepalive, even while the broker
    holds it back because a subscriber of its topic is stuck (--slow-consumer-timeout 3);
    once the stuck subscriber is dropped its PINGREQs are answered, and no will is sent."""
    b = broker_factory("--slow-consumer-timeout", "3")
    watcher = clients(b, client_id="ka-flow-watch")
    assert watcher.sub(1, ("innocent/will", 0)) == [0]
    slow = socket.socket()
    slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    slow.settimeout(5)
    slow.connect((b.host, b.port))
    try:
        slow.sendall(mqttraw.connect(client_id="stuck-sub") + mqttraw.subscribe(1, ("held/#", 0)))
        head = b""
        while len(head) < 9:
            head += slow.recv(9 - len(head))
        pub = clients(b, client_id="innocent", keepalive=1, will=("innocent/will", b"innocent died", 0, False))
        pub.send(b"".join(mqttraw.publish("held/t", b"H" * 1000) for _ in range(8000)))  # ~8 MB
        t0 = time.monotonic()
        answered_after_drop = False
        while time.monotonic() - t0 < 8 and not answered_after_drop:
            dropped = log_has(b, "'stuck-sub'", "slow consumer")
            pub.send(mqttraw.publish("held/t", b"one more") + mqttraw.PINGREQ_BYTES)
            try:
                while True:  # read what arrived within 0.4 s
                    p = pub.recv(0.4)
                    assert p.type == mqttraw.PINGRESP, p
                    answered_after_drop = answered_after_drop or dropped
            except TimeoutError:
                pass
            except mqttraw.Closed:
                raise AssertionError(
                    f"the publisher was disconnected after {time.monotonic() - t0:.1f}s:\n"
                    + "\n".join(ln for ln in b.log().splitlines() if "innocent" in ln)
                ) from None
        assert answered_after_drop, "the stuck subscriber was never dropped"
        watcher.expect_silence(0.2)
    finally:
        slow.close()
