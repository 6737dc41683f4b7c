"""Password logins that cost an attacker, not the node: throttling per address and user name,
a bounded queue of checks, failed logins counted in $SYS and logged with the address; and
$SYS topics that follow the ACL (the mesh side: tests/mesh/test_mesh_sys.py).

Clients connect from several loopback addresses (127.0.0.2, 127.0.0.3, ...) so that the node
counts their failures apart. Time bounds are lower bounds the node must respect (it may not
answer a throttled login before its delay) or generous upper ones.
"""

from __future__ import annotations

import time

import pytest

from support import mqttraw
from support.integration import Client, connack, make_password_file, run_cli, wait_log
from support.mqttraw import CONNACK
from support.processes import wait_for

pytestmark = pytest.mark.process

PASSWORDS = {"alice": "wonderland", "bob": "builder"}


@pytest.fixture
def pwfile(tmp_path):
    return make_password_file(tmp_path / "passwd", PASSWORDS)


def login(c: Client, user: str, password: str | None, client_id: str = "c") -> tuple[int, float]:
    """CONNECT; (CONNACK return code, seconds until it came)."""
    t0 = time.monotonic()
    c.send(mqttraw.connect(client_id=client_id, username=user, password=password))
    p = c.recv(60)
    assert p.type == CONNACK, p
    return p.body[1], time.monotonic() - t0


def sys_value(broker, clients, topic: str, source: str = "127.0.0.9") -> bytes:
    """The retained $SYS value on ``topic``, read by an anonymous client."""
    c = clients.raw(broker, source=source)
    assert connack(c.connect(client_id=f"sys-reader-{time.monotonic_ns()}"))[1] == 0
    assert c.sub(1, (topic, 0)) == [0]
    (p,) = c.publishes(1)
    c.close()
    return p.payload


def test_failures_from_one_address_wait_longer_each_time_while_another_logs_in_promptly(
    broker_factory, pwfile, clients
):
    """--auth-fail-threshold 2 --auth-fail-delay 1: from 127.0.0.2, two failures are answered
    at once, then each login waits 1, 2, 4 s before its check (and is still refused with
    0x04 [MQTT-3.2.2-5]); meanwhile a client on 127.0.0.3 logs in without delay."""
    b = broker_factory(
        "--password-file",
        str(pwfile),
        "--auth-fail-threshold",
        "2",
        "--auth-fail-delay",
        "1",
        "--auth-fail-delay-max",
        "30",
    )
    waits = []
    for i in range(4):
        c = clients.raw(b, source="127.0.0.2")
        rc, took = login(c, f"guess{i}", "nope", f"g{i}")  # a new user name each time: the address counts
        assert rc == 0x04
        c.expect_closed()
        waits.append(took)
    assert waits[0] < 5 and waits[1] < 5
    assert waits[2] >= 0.95 and waits[3] >= 1.95, waits
    # the fifth waits 4 s; a client elsewhere is served meanwhile
    slow = clients.raw(b, source="127.0.0.2")
    t0 = time.monotonic()
    slow.send(mqttraw.connect(client_id="g5", username="guess5", password="nope"))
    good = clients.raw(b, source="127.0.0.3")
    rc, took = login(good, "alice", "wonderland", "alice-1")
    assert rc == 0 and took < 3.0
    good.ping()
    other = clients.raw(b, source="127.0.0.3")
    assert login(other, "nobody", "x", "n1")[0] == 0x04  # its first failure: answered at once
    p = slow.recv(30)
    assert (p.type, p.body) == (CONNACK, b"\x00\x04")
    assert time.monotonic() - t0 >= 3.95


def test_a_success_forgives_its_address(broker_factory, pwfile, clients):
    """After a successful login from an address, its earlier failures no longer delay it."""
    b = broker_factory("--password-file", str(pwfile), "--auth-fail-threshold", "1", "--auth-fail-delay", "1")
    assert login(clients.raw(b, source="127.0.0.5"), "x1", "bad", "f1")[0] == 0x04
    rc, took = login(clients.raw(b, source="127.0.0.5"), "bob", "builder", "ok1")
    assert rc == 0 and took >= 0.95  # over the threshold: the success waited too
    rc, took = login(clients.raw(b, source="127.0.0.5"), "x2", "bad", "f2")
    assert rc == 0x04 and took < 0.9  # forgiven: the first failure again


def test_many_logins_at_once_from_a_throttled_address_are_spaced_or_refused_unchecked(broker_factory, pwfile, clients):
    """Over the threshold, three logins sent together from one address: the first waits
    the delay, the others would wait past --auth-fail-delay-max and get CONNACK 0x03 (server
    unavailable) at once, unchecked; all three count as throttled in $SYS."""
    b = broker_factory(
        "--password-file",
        str(pwfile),
        "--auth-fail-threshold",
        "1",
        "--auth-fail-delay",
        "1",
        "--auth-fail-delay-max",
        "2",
        "--sys-interval",
        "0.2",
    )
    assert login(clients.raw(b, source="127.0.0.6"), "alice", "bad", "p0")[0] == 0x04
    conns = [clients.raw(b, source="127.0.0.6") for _ in range(3)]
    t0 = time.monotonic()
    for i, c in enumerate(conns):
        c.send(mqttraw.connect(client_id=f"p{i + 1}", username="alice", password="bad"))
    answers = {}
    for i, c in enumerate(conns):
        p = c.recv(30)
        answers[i] = (p.body[1], time.monotonic() - t0)
    codes = sorted(rc for rc, _ in answers.values())
    assert codes == [0x03, 0x03, 0x04], answers
    (checked,) = [t for rc, t in answers.values() if rc == 0x04]
    assert checked >= 0.95
    wait_log(b, "login refused unchecked from 127.0.0.6:", "user 'alice'", "auth.fail_delay_max")
    wait_for(
        lambda: sys_value(b, clients, "$SYS/broker/connections/auth_throttled") == b"3",
        10,
        interval=0.2,
        what="auth_throttled = 3",
    )


def test_max_pending_refuses_with_0x03_and_counts(broker_factory, tmp_path, clients):
    """--auth-max-pending 1: while one slow hash is being checked, the next login is refused
    at once with CONNACK 0x03 (server unavailable) [MQTT-3.2.2-5]; the first is then accepted.
    $SYS/broker/connections/auth_busy counts the refusal."""
    pw = tmp_path / "slow-passwd"
    r = run_cli("passwd", str(pw), "slow", "-b", "s3cret", "--iterations", "2000000")
    assert r.returncode == 0, r.stderr
    b = broker_factory(
        "--password-file", str(pw), "--auth-max-pending", "1", "--auth-hash-workers", "1", "--sys-interval", "0.2"
    )
    first = clients.raw(b, source="127.0.0.7")
    first.send(mqttraw.connect(client_id="slow-1", username="slow", password="s3cret"))
    first.expect_silence(0.1)  # its check runs
    second = clients.raw(b, source="127.0.0.8")
    rc, took = login(second, "slow", "s3cret", "slow-2")
    assert rc == 0x03
    second.expect_closed()
    assert connack(first.recv(30)) == (0, 0)
    first.ping()
    wait_log(b, "login refused unchecked from 127.0.0.8:", "auth.max_pending (1)")
    wait_for(
        lambda: sys_value(b, clients, "$SYS/broker/connections/auth_busy") == b"1",
        10,
        interval=0.2,
        what="auth_busy = 1",
    )


def test_failed_logins_counted_in_sys_and_logged_with_the_address(broker_factory, pwfile, clients):
    """Every failed check counts in $SYS/broker/connections/auth_failures and logs one
    WARNING line naming the client's address, the user name escaped (no control characters
    reach the log)."""
    b = broker_factory("--password-file", str(pwfile), "--sys-interval", "0.2")
    users = ["alice", "nobody", "eve\x1b[31m\nINJECTED"]
    for i, user in enumerate(users):
        assert login(clients.raw(b, source="127.0.0.10"), user, "wrong", f"f{i}")[0] == 0x04
    wait_log(b, "WARNING", "login failed from 127.0.0.10:", "user 'alice'")
    wait_log(b, "login failed from 127.0.0.10:", "user 'nobody'")
    wait_log(b, "login failed from 127.0.0.10:", r"user 'eve\x1b[31m\nINJECTED'")
    assert "\x1b" not in b.log()
    assert not any(line.startswith("INJECTED") for line in b.log().splitlines())
    wait_for(
        lambda: sys_value(b, clients, "$SYS/broker/connections/auth_failures") == b"3",
        10,
        interval=0.2,
        what="auth_failures = 3",
    )


def test_failure_log_lines_are_rate_limited(broker_factory, pwfile, clients):
    """--auth-log-rate 0.1 (a burst of one line): four failures in a row log one line; the
    counter has them all."""
    b = broker_factory(
        "--password-file",
        str(pwfile),
        "--auth-log-rate",
        "0.1",
        "--auth-fail-threshold",
        "100",
        "--sys-interval",
        "0.2",
    )
    for i in range(4):
        assert login(clients.raw(b, source="127.0.0.11"), "alice", "wrong", f"r{i}")[0] == 0x04
    wait_for(
        lambda: sys_value(b, clients, "$SYS/broker/connections/auth_failures") == b"4",
        10,
        interval=0.2,
        what="auth_failures = 4",
    )
    assert sum("login failed from" in line for line in b.log().splitlines()) == 1


def test_unknown_and_known_users_get_the_same_answer(broker_factory, pwfile, clients):
    """No quick refusal for unknown names: a wrong password, an unknown user and a missing
    password all get CONNACK 0x04 from the same path (each goes through a hash check, so
    each is counted as a failed check)."""
    b = broker_factory("--password-file", str(pwfile), "--sys-interval", "0.2", "--auth-fail-threshold", "100")
    for i, (user, password) in enumerate([("alice", "wrong"), ("mallory", "wrong"), ("alice", None)]):
        assert login(clients.raw(b, source="127.0.0.12"), user, password, f"u{i}")[0] == 0x04
    wait_for(
        lambda: sys_value(b, clients, "$SYS/broker/connections/auth_failures") == b"3",
        10,
        interval=0.2,
        what="auth_failures = 3",
    )


# --------------------------------------------------------------------------- $SYS and the ACL

ACL_NO_SYS = """\
user alice
topic readwrite #
user bob
topic subscribe $SYS/#
topic readwrite bob/#
user carol
topic read $SYS/broker/uptime
"""


def test_acl_without_sys_grants_gives_nothing_under_sys(broker_factory, tmp_path, clients):
    """With an ACL that grants no read under $SYS: alice (readwrite #) cannot subscribe to
    $SYS/# (0x80 [MQTT-3.9.3-1]) and her '#' gets no $SYS [MQTT-4.7.2-1]; bob may subscribe
    to $SYS/# but not read: he receives nothing, neither retained nor live; carol reads the
    one topic granted to her."""
    acl = tmp_path / "acl"
    acl.write_text(ACL_NO_SYS)
    b = broker_factory("--acl-file", str(acl), "--sys-interval", "0.2")
    alice = clients(b, client_id="alice-1", username="alice")
    assert alice.sub(1, ("$SYS/#", 0), ("#", 0)) == [0x80, 0]
    bob = clients(b, client_id="bob-1", username="bob")
    assert bob.sub(1, ("$SYS/#", 0)) == [0]
    carol = clients(b, client_id="carol-1", username="carol")
    assert carol.sub(1, ("$SYS/#", 0)) == [0x80]
    assert carol.sub(2, ("$SYS/broker/uptime", 0)) == [0]
    (p,) = carol.publishes(1)
    assert p.topic == "$SYS/broker/uptime" and p.retain
    wait_for(lambda: carol.recv(2).topic == "$SYS/broker/uptime", 5, what="a live $SYS update")
    alice.pub("x/y", b"marker", qos=1)  # alice's '#' gets her own message, nothing under $SYS
    (own,) = alice.publishes(1)
    assert own.topic == "x/y"
    alice.ack(own)
    alice.expect_silence(0.5)
    bob.expect_silence(0.5)


def test_a_refused_login_gets_its_connack_and_a_clean_close_not_a_reset(broker_factory, pwfile):
    """Issue 20: a node closed a connection it refused while the client's later bytes (a
    PINGREQ sent while the CONNECT was checked, when the node does not read) were unread,
    so the kernel answered with a TCP reset, which can destroy the CONNACK on its way (a
    persistent client reconnecting after a kill -9 saw ConnectionResetError instead of
    CONNACK 0x03). The node now half-closes, reads and drops what still comes, then closes."""
    import socket

    b = broker_factory("--password-file", str(pwfile), "--auth-fail-threshold", "100000")
    for i in range(20):
        sock = socket.create_connection((b.host, b.port), timeout=10)
        try:
            sock.sendall(mqttraw.connect(client_id=f"r{i}", username="alice", password="wrong"))
            sock.setblocking(False)
            got = b""
            deadline = time.monotonic() + 10
            while len(got) < 4 and time.monotonic() < deadline:  # pings until the CONNACK comes
                sock.sendall(mqttraw.packet(0xC0, b""))
                try:
                    got += sock.recv(64)
                except BlockingIOError:
                    time.sleep(0.002)  # (a pause between pings, not a wait for an event)
            assert got[:4] == b"\x20\x02\x00\x04", got
            sock.setblocking(True)
            rest = got[4:]
            while chunk := sock.recv(64):  # ConnectionResetError here was the bug
                rest += chunk
            assert rest == b""  # nothing after the refusal, then the node's FIN
        finally:
            sock.close()
