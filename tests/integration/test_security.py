"""Authentication (password file made by `mqttmesh passwd`), ACLs, connection limits."""

from __future__ import annotations

import time

import pytest

from support import mqttraw
from support.integration import Client, connack, make_password_file, run_cli, wait_log
from support.mqttraw import CONNACK
from support.processes import wait_for

pytestmark = pytest.mark.process


@pytest.fixture
def pwfile(tmp_path):
    return make_password_file(tmp_path / "passwd", {"alice": "wonderland", "bob": "builder"})


@pytest.fixture
def auth_broker(broker_factory, pwfile):
    """Password file and no anonymous access."""
    return broker_factory("--password-file", str(pwfile), "--allow-anonymous", "false")


def refused(c: Client, rc: int) -> None:
    """CONNACK with ``rc`` and session present 0 [MQTT-3.2.2-4], then close [MQTT-3.2.2-5]."""
    p = c.recv()
    assert (p.type, p.body) == (CONNACK, bytes([0, rc])), p
    c.expect_closed()


def test_passwd_tool_writes_salted_hashes(tmp_path):
    """`mqttmesh passwd FILE USER -b PW --iterations N`: one line per user, no clear text.
    (Operations.)"""
    f = make_password_file(tmp_path / "pw", {"alice": "wonderland", "bob": "wonderland"})
    lines = f.read_text().splitlines()
    assert [line.split(":", 1)[0] for line in lines] == ["alice", "bob"]
    assert "wonderland" not in f.read_text()
    assert lines[0].split(":", 1)[1] != lines[1].split(":", 1)[1]  # salted
    r = run_cli("passwd", str(f), "bob", "-D")
    assert r.returncode == 0, r.stderr
    assert [line.split(":", 1)[0] for line in f.read_text().splitlines()] == ["alice"]


def test_correct_password_accepted(auth_broker, clients):
    """[MQTT-3.1.4-4] valid credentials: CONNACK 0."""
    c = clients(auth_broker, client_id="a1", username="alice", password="wonderland")
    c.ping()


@pytest.mark.parametrize(
    "username,password",
    [
        ("alice", "wrong"),
        ("alice", "builder"),  # another user's password
        ("nobody", "wonderland"),  # unknown user
        ("alice", None),  # user name without password
        ("alice", ""),
    ],
)
def test_bad_credentials_get_0x04(auth_broker, clients, username, password):
    """CONNACK 0x04 (bad user name or password), session present 0 [MQTT-3.2.2-4], then
    the connection is closed [MQTT-3.2.2-5]."""
    c = clients.raw(auth_broker)
    c.send(mqttraw.connect(client_id="bad", username=username, password=password))
    refused(c, 0x04)


def test_anonymous_refused_with_0x05_when_not_allowed(auth_broker, clients):
    """--allow-anonymous false: no user name -> CONNACK 0x05 (not authorized) and close.
    [MQTT-3.2.2-4] [MQTT-3.2.2-5]"""
    c = clients.raw(auth_broker)
    c.send(mqttraw.connect(client_id="anon"))
    refused(c, 0x05)


def test_anonymous_allowed_next_to_a_password_file(broker_factory, pwfile, clients):
    """--allow-anonymous true (default) with a password file: anonymous clients connect,
    named ones must still give the right password.
    [MQTT-3.1.4-4] [MQTT-3.2.2-5]"""
    b = broker_factory("--password-file", str(pwfile))
    clients(b, client_id="anon-ok").ping()
    clients(b, client_id="alice-ok", username="alice", password="wonderland").ping()
    c = clients.raw(b)
    c.send(mqttraw.connect(client_id="alice-bad", username="alice", password="nope"))
    refused(c, 0x04)


def test_refused_connect_does_not_process_what_follows(auth_broker, clients):
    """[MQTT-3.1.4-5] nothing sent after a refused CONNECT is processed (here a PUBLISH
    right behind it), and [MQTT-3.1.2-8] its will is not published (not accepted)."""
    watcher = clients(auth_broker, client_id="rf-watch", username="bob", password="builder")
    assert watcher.sub(1, ("rf/#", 1)) == [1]
    c = clients.raw(auth_broker)
    c.send(
        mqttraw.connect(
            client_id="rf", username="alice", password="wrong", will=("rf/will", b"will of a refused client", 1, False)
        )
        + mqttraw.publish("rf/data", b"must not be delivered", qos=1, pid=1)
    )
    refused(c, 0x04)
    marker = clients(auth_broker, client_id="rf-marker", username="bob", password="builder")
    marker.pub("rf/marker", b"m", qos=1)
    (p,) = watcher.publishes(1)
    assert p.topic == "rf/marker"
    watcher.expect_silence(0.3)


def test_packets_sent_before_connack_during_slow_password_check(broker_factory, tmp_path, clients):
    """Clients need not wait for CONNACK (3.1.4): a SUBSCRIBE sent while the broker is
    still checking a slow password hash must be processed after the CONNECT is accepted
    [MQTT-3.1.4-4] (and only then [MQTT-3.1.4-5])."""
    pw = tmp_path / "slow-passwd"
    # (slow enough to be still running 0.1 s later; not so slow that a loaded machine's
    # turn at it outlasts the wait for the CONNACK: 2,000,000 timed out once in a full run)
    r = run_cli("passwd", str(pw), "slow", "-b", "s3cret", "--iterations", "500000")
    assert r.returncode == 0, r.stderr
    b = broker_factory("--password-file", str(pw), "--allow-anonymous", "false")
    c = clients.raw(b)
    c.send(mqttraw.connect(client_id="slowpw", username="slow", password="s3cret"))
    c.expect_silence(0.1)  # the hash check is still running: no CONNACK yet
    c.send(mqttraw.subscribe(5, ("slow/#", 1)) + mqttraw.PINGREQ_BYTES)
    assert connack(c.recv(30)) == (0, 0)
    p = c.recv()
    assert (p.type, p.body) == (mqttraw.SUBACK, b"\x00\x05\x01")
    assert c.recv().type == mqttraw.PINGRESP


def test_paho_accepted_and_refused_by_password(auth_broker, paho):
    """paho-mqtt sees the same decisions: accepted with the right password, 'Bad user name
    or password' (0x04) with a wrong one, 'Not authorized' (0x05) without credentials.
    [MQTT-3.2.2-5]"""
    ok = paho("paho-ok")
    ok.c.username_pw_set("alice", "wonderland")
    assert not ok.connect(auth_broker).is_failure
    assert [rc.value for rc in ok.subscribe("paho/t", 1)] == [1]
    ok.publish("paho/t", b"hello", qos=1)
    assert ok.get() == ("paho/t", b"hello", 1, False)

    wrong = paho("paho-wrong")
    wrong.c.username_pw_set("alice", "nope")
    rc = wrong.connect(auth_broker)
    assert rc.is_failure and rc.getName() == "Bad user name or password"

    anon = paho("paho-anon")
    rc = anon.connect(auth_broker)
    assert rc.is_failure and rc.getName() == "Not authorized"


# --------------------------------------------------------------------------- ACL

ACL = """\
# everybody: their own device tree (%c) and their own user tree (%u)
pattern readwrite devices/%c/#
pattern readwrite users/%u/#
topic read public/#

user admin
topic readwrite #

user alice
topic subscribe sensors/#
topic read sensors/public/#
topic write sensors/#

user carol
topic readwrite sensors/#
topic deny sensors/secret/#

client gateway-*
topic write telemetry/#
"""


@pytest.fixture
def acl_broker(broker_factory, tmp_path):
    acl = tmp_path / "acl"
    acl.write_text(ACL)
    return broker_factory("--acl-file", str(acl))


def test_acl_client_id_pattern_publish_denied_silently(acl_broker, clients):
    """%c: dev1 may publish under devices/dev1/ only; a denied PUBLISH is positively
    acknowledged [MQTT-3.3.5-2] and not delivered."""
    admin = clients(acl_broker, client_id="admin-watch", username="admin")
    assert admin.sub(1, ("devices/#", 1)) == [1]
    dev = clients(acl_broker, client_id="dev1")
    dev.pub("devices/dev2/temp", b"spoofed", qos=1, pid=1)  # denied, still PUBACK
    dev.pub("devices/dev2/temp", b"spoofed", qos=2, pid=2)  # denied, still PUBREC/PUBCOMP
    dev.pub("devices/dev1/temp", b"21.5", qos=1, pid=3)  # allowed
    (p,) = admin.publishes(1)
    assert (p.topic, p.payload) == ("devices/dev1/temp", b"21.5")
    admin.expect_silence(0.3)


def test_acl_user_pattern(acl_broker, clients):
    """%u: alice may publish under users/alice/ only, and read only her own tree. Denied
    publishes are acknowledged [MQTT-3.3.5-2]; the refused filter gets 0x80 [MQTT-3.9.3-1]."""
    admin = clients(acl_broker, client_id="admin-u", username="admin")
    assert admin.sub(1, ("users/#", 1)) == [1]
    alice = clients(acl_broker, client_id="alice-1", username="alice")
    assert alice.sub(1, ("users/alice/#", 1), ("users/bob/#", 1)) == [1, 0x80]
    alice.pub("users/bob/inbox", b"no", qos=1, pid=1)
    alice.pub("users/alice/inbox", b"yes", qos=1, pid=2)
    (p,) = admin.publishes(1)
    assert (p.topic, p.payload) == ("users/alice/inbox", b"yes")
    (own,) = alice.publishes(1)
    assert own.topic == "users/alice/inbox"
    anon = clients(acl_broker, client_id="anon-u")  # no user name: %u rules do not apply
    anon.pub("users/alice/inbox", b"anon", qos=1)
    admin.expect_silence(0.3)


def test_acl_forbidden_filter_gets_0x80_in_its_place(acl_broker, clients):
    """[MQTT-3.9.3-1] one code per filter in order, 0x80 for the refused one
    [MQTT-3.8.4-5]; the accepted subscriptions work."""
    dev = clients(acl_broker, client_id="dev7")
    codes = dev.sub(
        3, ("devices/dev7/#", 1), ("devices/dev8/#", 1), ("public/news", 2), ("#", 0), ("devices/+/temp", 0)
    )
    assert codes == [1, 0x80, 2, 0x80, 0x80]
    admin = clients(acl_broker, client_id="admin-s", username="admin")
    admin.pub("devices/dev8/x", b"other", qos=1, pid=1)
    admin.pub("devices/dev7/x", b"mine", qos=1, pid=2)
    admin.pub("public/news", b"news", qos=1, pid=3)
    got = dev.publishes(2)
    assert [(p.topic, p.payload) for p in got] == [("devices/dev7/x", b"mine"), ("public/news", b"news")]
    dev.expect_silence(0.3)


def test_acl_read_denied_topics_not_delivered(acl_broker, clients):
    """alice may subscribe to sensors/# but read only sensors/public/#: the rest is not
    delivered, live or retained.
    (Authorization is the server's policy, section 5.4.2; [MQTT-3.3.5-2] for the writes.)"""
    admin = clients(acl_broker, client_id="admin-r", username="admin")
    admin.pub("sensors/private/door", b"retained secret", qos=1, retain=True, pid=1)
    admin.pub("sensors/public/temp", b"retained public", qos=1, retain=True, pid=2)
    assert admin.sub(1, ("sensors/private/#", 1)) == [1]
    (ar,) = admin.publishes(1)
    assert (ar.payload, ar.retain) == (b"retained secret", True)
    admin.ack(ar)
    alice = clients(acl_broker, client_id="alice-r", username="alice")
    assert alice.sub(1, ("sensors/#", 1)) == [1]
    (r,) = alice.publishes(1)
    assert (r.topic, r.retain) == ("sensors/public/temp", True)
    alice.ack(r)
    writer = clients(acl_broker, client_id="alice-w", username="alice")
    writer.pub("sensors/private/door", b"open", qos=1, pid=3)  # write allowed for alice
    writer.pub("sensors/public/temp", b"22", qos=1, pid=4)
    (p,) = alice.publishes(1)
    assert (p.topic, p.payload, p.retain) == ("sensors/public/temp", b"22", False)
    alice.expect_silence(0.3)
    # the private write itself went through: admin, who may read it, got it live
    (a,) = admin.publishes(1)
    assert (a.topic, a.payload, a.retain) == ("sensors/private/door", b"open", False)


def test_acl_will_is_subject_to_publish_rules(acl_broker, clients):
    """A will is published as its client: denied topics are not delivered. [MQTT-3.3.5-2] (the
    will of dev3 is not authorized, so it is dropped)."""
    admin = clients(acl_broker, client_id="admin-w", username="admin")
    assert admin.sub(1, ("devices/#", 1)) == [1]
    bad = clients(acl_broker, client_id="dev3", will=("devices/dev4/status", b"spoof", 1, False))
    good = clients(acl_broker, client_id="dev5", will=("devices/dev5/status", b"gone", 1, False))
    bad.close()
    good.close()
    (p,) = admin.publishes(1)
    assert (p.topic, p.payload) == ("devices/dev5/status", b"gone")
    admin.expect_silence(0.3)


def test_acl_deny_rule_wins_over_a_grant(acl_broker, clients):
    """carol: readwrite sensors/# but deny sensors/secret/#: she can neither publish there
    (acknowledged, dropped [MQTT-3.3.5-2]) nor receive from there through a wildcard."""
    admin = clients(acl_broker, client_id="admin-d", username="admin")
    assert admin.sub(1, ("sensors/#", 1)) == [1]
    carol = clients(acl_broker, client_id="carol-1", username="carol")
    assert carol.sub(1, ("sensors/+/x", 1)) == [1]
    carol.pub("sensors/secret/x", b"leak", qos=1, pid=1)
    carol.pub("sensors/open/x", b"fine", qos=1, pid=2)
    (p,) = admin.publishes(1)
    assert (p.topic, p.payload) == ("sensors/open/x", b"fine")
    admin.ack(p)
    (own,) = carol.publishes(1)
    assert own.topic == "sensors/open/x"
    carol.ack(own)
    admin.pub("sensors/secret/x", b"classified", qos=1, pid=3)
    admin.pub("sensors/open/x", b"public", qos=1, pid=4)
    (q,) = carol.publishes(1)
    assert (q.topic, q.payload) == ("sensors/open/x", b"public")
    carol.expect_silence(0.3)


def test_acl_client_glob_block(acl_broker, clients):
    """'client gateway-*' rules apply to ClientIds matching the glob only. [MQTT-3.3.5-2]
    [MQTT-3.9.3-1]"""
    admin = clients(acl_broker, client_id="admin-g", username="admin")
    assert admin.sub(1, ("telemetry/#", 1)) == [1]
    gw = clients(acl_broker, client_id="gateway-17")
    other = clients(acl_broker, client_id="gw-17")
    other.pub("telemetry/a", b"not a gateway", qos=1, pid=1)
    gw.pub("telemetry/a", b"gateway", qos=1, pid=2)
    (p,) = admin.publishes(1)
    assert p.payload == b"gateway"
    admin.expect_silence(0.3)
    assert gw.sub(1, ("telemetry/#", 0)) == [0x80]  # write only: no subscribe


# --------------------------------------------------------------------------- connection limits


def try_send(c: Client, data: bytes) -> None:
    """Send, unless the broker already reset a connection it refused at accept time."""
    try:
        c.send(data)
    except (ConnectionResetError, BrokenPipeError):
        pass


def test_max_connections_refuses_extra_connections_and_says_why(broker_factory, clients):
    """--max-connections 2: a third connection is closed (no CONNACK), the log says why;
    once one leaves, a new one is accepted.
    [MQTT-3.2.2-6] no return code applies, so no CONNACK."""
    b = broker_factory("--max-connections", "2")
    a = clients(b, client_id="mc1")
    c2 = clients(b, client_id="mc2")
    try:
        third = clients.raw(b)  # it may be reset before create_connection returns ...
    except ConnectionResetError:
        pass
    else:
        try_send(third, mqttraw.connect(client_id="mc3"))  # ... or before this
        third.expect_closed()
    wait_log(b, "refused connection from 127.0.0.1:", "max_connections")
    a.ping()
    c2.ping()
    a.close()
    wait_log(b, "'mc1'", "connection closed by client")
    clients(b, client_id="mc4").ping()


def test_connection_rate_limit(broker_factory, clients):
    """--connection-rate 2: a burst of connections beyond the rate is refused, later
    ones are accepted again.
    [MQTT-3.2.2-6] refused connections get no CONNACK."""
    b = broker_factory("--connection-rate", "2")
    outcomes = []
    for i in range(6):
        try:
            c = clients.raw(b)  # (a refused connection may be reset before this returns)
        except ConnectionResetError:
            outcomes.append(False)
            continue
        try_send(c, mqttraw.connect(client_id=f"cr{i}"))
        try:
            p = c.recv(2)
            outcomes.append(p.type == CONNACK and p.body == b"\x00\x00")
        except mqttraw.Closed:
            outcomes.append(False)
    assert outcomes[:2] == [True, True]
    assert False in outcomes
    wait_log(b, "connection_rate")
    t0 = time.monotonic()

    def accepted_again():
        try:
            # (a connection over the rate may be reset before create_connection returns)
            c = clients.raw(b)
            try_send(c, mqttraw.connect(client_id="cr-later"))
            return c.recv(2).type == CONNACK
        except (mqttraw.Closed, ConnectionResetError):
            return False

    wait_for(accepted_again, 5, interval=0.3, what="a connection accepted after the burst")
    assert time.monotonic() - t0 < 3
