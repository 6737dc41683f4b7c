"""mqttmesh.auth: password hashes, the password file, the ACL, Auth's decisions."""

from __future__ import annotations

import argparse
import base64
import hashlib
import os
import stat

import pytest

from mqttmesh.auth import (
    DEFAULT_ITERATIONS,
    READ,
    SALT_BYTES,
    SUBSCRIBE,
    WRITE,
    Acl,
    Auth,
    ConfigError,
    LogBudget,
    LoginThrottle,
    PasswordFile,
    filter_covers,
    hash_password,
    verify_password,
)

# pbkdf2-sha512("pw", salt b"0123456789abcdef", 1000 iterations), computed once with hashlib
KNOWN_SALT = b"0123456789abcdef"
KNOWN_HASH = (
    "$pbkdf2-sha512$1000$MDEyMzQ1Njc4OWFiY2RlZg==$bk6AzDNPufwraG/VjmAl+642J4ug0Z1+aNrlKzX8aHwEs63XDUGVJ"
    "TUkvPMmA3adUiWnwISWC+BX0WWY7QuPYQ=="
)


# --------------------------------------------------------------------------- hashes


def test_hash_password_known_vector():
    assert hash_password("pw", 1000, salt=KNOWN_SALT) == KNOWN_HASH


def test_verify_password():
    assert verify_password(b"pw", KNOWN_HASH) is True
    assert verify_password(b"pW", KNOWN_HASH) is False
    assert verify_password(b"", KNOWN_HASH) is False


def test_hash_password_takes_its_salt_from_the_caller():
    # the randomness is the caller's (the passwd command draws it): two salts, two hashes
    a, b = hash_password("pw", 1000, salt=KNOWN_SALT), hash_password("pw", 1000, salt=b"fedcba9876543210")
    assert a != b
    assert verify_password(b"pw", a) and verify_password(b"pw", b)
    with pytest.raises(TypeError):
        hash_password("pw", 1000)  # no hidden os.urandom: the salt is a required argument


def test_passwd_command_draws_a_fresh_salt_for_every_hash(tmp_path):
    from mqttmesh.cli import cmd_passwd

    def passwd(path):
        args = argparse.Namespace(
            file=str(path), user="alice", delete=False, password="pw", stdin=False, iterations=1000
        )
        assert cmd_passwd(args) == 0
        return PasswordFile.load(str(path)).users["alice"]

    a, b = passwd(tmp_path / "a"), passwd(tmp_path / "b")
    assert a != b
    assert a.split("$")[3] != b.split("$")[3]  # the salt field
    assert len(base64.b64decode(a.split("$")[3])) == SALT_BYTES
    assert verify_password(b"pw", a) and verify_password(b"pw", b)


def test_hash_password_non_ascii():
    encoded = hash_password("p\u00e4ss", 1000, salt=KNOWN_SALT)
    assert verify_password("p\u00e4ss".encode("utf-8"), encoded)
    assert not verify_password(b"pass", encoded)


@pytest.mark.parametrize(
    "encoded",
    [
        "",
        "garbage",
        "$md5$1000$MDEy$MDEy",
        "$pbkdf2-sha512$many$MDEy$MDEy",
        "$pbkdf2-sha512$1000$!!!$MDEy",
        "$pbkdf2-sha512$0$MDEy$MDEy",
        "$pbkdf2-sha512$-5$MDEy$MDEy",
        "$pbkdf2-sha512$1000$MDEy",
        KNOWN_HASH + "$extra",
    ],
)
def test_verify_password_malformed_hash_is_false_not_an_error(encoded):
    assert verify_password(b"pw", encoded) is False


# --------------------------------------------------------------------------- password file


def test_password_file_load(tmp_path):
    path = tmp_path / "passwd"
    path.write_text(f"# users\n\nalice:{KNOWN_HASH}\n  bob:{KNOWN_HASH}  \n", encoding="utf-8")
    pf = PasswordFile.load(str(path))
    assert pf.users == {"alice": KNOWN_HASH, "bob": KNOWN_HASH}


@pytest.mark.parametrize(
    "line",
    [
        "alice",
        "alice:",
        ":" + KNOWN_HASH,
        "alice:secret",
        "alice:$pbkdf2-sha512$1000$abc",
        "alice:$md5$1000$MDEy$MDEy",
    ],
)
def test_password_file_bad_line_names_file_and_line(tmp_path, line):
    path = tmp_path / "passwd"
    path.write_text(f"# comment\nbob:{KNOWN_HASH}\n{line}\n", encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        PasswordFile.load(str(path))
    assert f"{path}:3:" in str(info.value)


def test_password_file_missing(tmp_path):
    path = tmp_path / "nope"
    with pytest.raises(ConfigError) as info:
        PasswordFile.load(str(path))
    assert str(path) in str(info.value)
    assert PasswordFile.load(str(path), missing_ok=True).users == {}


def test_password_file_not_utf8(tmp_path):
    path = tmp_path / "passwd"
    path.write_bytes(b"al\xffice:" + KNOWN_HASH.encode() + b"\n")
    with pytest.raises(ConfigError) as info:
        PasswordFile.load(str(path))
    assert str(path) in str(info.value)


def test_password_file_set_save_load(tmp_path):
    path = tmp_path / "passwd"
    pf = PasswordFile(str(path))
    pf.set("alice", "secret", iterations=1000, salt=KNOWN_SALT)
    pf.set("bob", "hunter2", iterations=1000, salt=KNOWN_SALT)
    assert pf.delete("bob") is True
    assert pf.delete("bob") is False
    pf.save()
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    loaded = PasswordFile.load(str(path))
    assert list(loaded.users) == ["alice"]
    assert verify_password(b"secret", loaded.users["alice"])
    assert [p.name for p in tmp_path.iterdir()] == ["passwd"]  # no temporary file left behind


@pytest.mark.parametrize("user", ["", "a:b"])
def test_password_file_set_refuses_bad_names(tmp_path, user):
    with pytest.raises(ConfigError):
        PasswordFile(str(tmp_path / "p")).set(user, "x", iterations=1000, salt=KNOWN_SALT)


# --------------------------------------------------------------------------- ACL parsing


@pytest.mark.parametrize(
    "text, line",
    [
        ("topic read a/#\ntopic readonly b\n", 2),
        ("\n\n# c\ntopic read a/#/b\n", 4),
        ("topic read a+\n", 1),
        ("user\n", 1),
        ("user alice bob\n", 1),
        ("client\n", 1),
        ("topic\n", 1),
        ("topic read a b\n", 1),
        ("allow a\n", 1),
        ("topic read a/# # trailing comment\n", 1),
    ],
)
def test_acl_parse_errors_name_the_line(text, line):
    with pytest.raises(ConfigError) as info:
        Acl.parse(text, "acl.conf")
    assert f"acl.conf:{line}:" in str(info.value)


def test_acl_load_missing(tmp_path):
    with pytest.raises(ConfigError) as info:
        Acl.load(str(tmp_path / "none.acl"))
    assert "none.acl" in str(info.value)


def test_acl_load_file_names_path_in_errors(tmp_path):
    path = tmp_path / "x.acl"
    path.write_text("topic read a\ntopic bogus b\n", encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        Acl.load(str(path))
    assert f"{path}:2:" in str(info.value)


# --------------------------------------------------------------------------- ACL decisions

ACL_TEXT = """
# everybody
topic read $SYS/#
pattern readwrite devices/%c/#
pattern read users/%u/#

user alice
topic readwrite sensors/#
topic deny sensors/secret/#

user bob
topic deny sensors/#
topic readwrite sensors/#

client gateway-*
topic write telemetry/#
topic subscribe cmd/#
"""


@pytest.fixture
def acl():
    return Acl.parse(ACL_TEXT)


@pytest.mark.parametrize(
    "user, client, topic, access, expected",
    [
        (None, "x", "$SYS/load", READ, True),
        (None, "x", "$SYS/load", WRITE, False),
        # %c substitution
        (None, "d1", "devices/d1/temp", WRITE, True),
        (None, "d1", "devices/d1", READ, True),
        (None, "d1", "devices/d2/temp", WRITE, False),
        (None, "d1", "devices/d2/temp", READ, False),
        # %u substitution, and a %u rule is skipped without a user name
        ("carol", "x", "users/carol/inbox", READ, True),
        ("carol", "x", "users/carol/inbox", WRITE, False),
        (None, "x", "users//inbox", READ, False),
        (None, "x", "users/inbox", READ, False),
        # user blocks
        ("alice", "x", "sensors/temp", READ, True),
        ("alice", "x", "sensors/temp", WRITE, True),
        ("carol", "x", "sensors/temp", READ, False),
        # deny wins over a grant, before or after it
        ("alice", "x", "sensors/secret/key", READ, False),
        ("alice", "x", "sensors/secret", READ, False),  # "sensors/secret/#" matches "sensors/secret" (4.7.1.2)
        ("bob", "x", "sensors/temp", READ, False),
        ("bob", "x", "sensors/temp", WRITE, False),
        # client blocks (fnmatch glob on the ClientId)
        (None, "gateway-7", "telemetry/a", WRITE, True),
        (None, "gateway-7", "telemetry/a", READ, False),
        (None, "gateway", "telemetry/a", WRITE, False),
        (None, "my-gateway-7", "telemetry/a", WRITE, False),
        # subscribe-only does not allow receiving
        (None, "gateway-7", "cmd/x", READ, False),
    ],
)
def test_acl_allows(acl, user, client, topic, access, expected):
    assert acl.allows(user, client, topic, access) is expected


@pytest.mark.parametrize(
    "user, client, topic_filter, expected",
    [
        (None, "x", "$SYS/#", True),  # read implies subscribe
        (None, "x", "#", False),  # "#" does not cover $SYS/#, nothing else is granted
        (None, "d1", "devices/d1/#", True),
        (None, "d1", "devices/+/#", False),
        (None, "d1", "devices/#", False),
        ("alice", "x", "sensors/+", True),
        ("alice", "x", "sensors/#", True),  # overlaps the denied sensors/secret/#: filtered at delivery
        ("alice", "x", "sensors/secret/#", False),  # entirely inside it
        ("alice", "x", "sensors/secret/a", False),
        ("alice", "x", "sensors/secret", False),  # the deny rule sensors/secret/# matches it (4.7.1.2)
        (None, "gateway-1", "cmd/#", True),  # subscribe access
        (None, "gateway-1", "telemetry/#", False),  # write access only
    ],
)
def test_acl_allows_subscribe(acl, user, client, topic_filter, expected):
    assert acl.allows_subscribe(user, client, topic_filter) is expected


@pytest.mark.parametrize(
    "client, user, topic",
    [
        ("+", None, "devices/other/temp"),
        ("#", None, "devices/other/temp"),
        ("x", "+", "users/bob/inbox"),
        ("x", "#", "users/bob/inbox"),
    ],
)
def test_acl_pattern_wildcard_client_id_gets_no_extra_access(acl, client, user, topic):
    assert acl.allows(user, client, topic, READ) is False


def test_acl_pattern_wildcard_client_id_cannot_subscribe_to_everything(acl):
    assert acl.allows_subscribe(None, "#", "devices/#") is False


def test_acl_empty_denies_everything():
    acl = Acl.parse("# nothing\n")
    assert acl.allows(None, "c", "a", READ) is False
    assert acl.allows_subscribe(None, "c", "a") is False


def test_acl_topic_without_access_is_readwrite():
    acl = Acl.parse("topic a/#\n")
    assert acl.allows(None, "c", "a/b", READ)
    assert acl.allows(None, "c", "a/b", WRITE)
    assert acl.allows_subscribe(None, "c", "a/+")


def test_access_bits_are_distinct():
    assert len({READ, WRITE, SUBSCRIBE}) == 3


# --------------------------------------------------------------------------- filter_covers


@pytest.mark.parametrize(
    "rule, topic_filter, expected",
    [
        ("#", "a/b", True),
        ("#", "#", True),
        ("#", "+", True),
        ("#", "a/#", True),
        ("a/#", "a", True),
        ("a/#", "a/#", True),
        ("a/#", "a/+/c", True),
        ("a/#", "#", False),
        ("a/#", "b", False),
        ("a/+", "a/b", True),
        ("a/+", "a/+", True),
        ("a/+", "a/#", False),
        ("a/+", "a", False),
        ("a/+", "a/b/c", False),
        ("a/b", "a/+", False),
        ("a/b", "a/b", True),
        ("+/b", "a/b", True),
        ("+", "a/b", False),
        ("+", "#", False),
        ("a", "a/b", False),
        ("a/b/c", "a/b", False),
        # [MQTT-4.7.2-1] leading wildcards never cover $-topics
        ("#", "$SYS/#", False),
        ("+/#", "$SYS/x", False),
        ("+", "$x", False),
        ("$SYS/#", "$SYS/x", True),
        ("$SYS/+", "$SYS/x", True),
        ("$SYS/#", "#", False),
    ],
)
def test_filter_covers(rule, topic_filter, expected):
    assert filter_covers(rule, topic_filter) is expected


# --------------------------------------------------------------------------- Auth


@pytest.fixture
def passwords():
    return PasswordFile("unused", {"alice": hash_password("secret", 1000, salt=KNOWN_SALT)})


@pytest.mark.parametrize(
    "anonymous, user, password, expected",
    [
        (True, None, None, 0),
        (False, None, None, 5),
        (True, "alice", b"secret", None),  # a hash to check: slow path
        (False, "alice", b"secret", None),
        (False, "alice", None, None),  # no quick refusal: it would tell that alice exists
        (False, "mallory", b"secret", None),
    ],
)
def test_check_fast(passwords, anonymous, user, password, expected):
    assert Auth(allow_anonymous=anonymous, passwords=passwords).check_fast(user, password) == expected


def test_check_fast_without_password_file():
    assert Auth(allow_anonymous=True).check_fast("anyone", b"x") == 0
    assert Auth(allow_anonymous=False).check_fast("anyone", b"x") == 5


def test_check_slow(passwords):
    auth = Auth(allow_anonymous=False, passwords=passwords)
    assert auth.check_slow("alice", b"wrong") == 4
    assert auth.check_slow("alice", b"secret") == 0
    assert auth.check_slow("alice", None) == 4
    assert auth.check_slow("mallory", b"secret") == 4


def test_check_slow_no_login_against_the_dummy_hash():
    """The dummy hash's digest is public (zeros): a password hashing to it must not log in
    an unknown user, nor an empty one a known user without a password."""
    auth = Auth(passwords=PasswordFile("unused", {"alice": hash_password("", 1000, salt=KNOWN_SALT)}))
    assert auth.check_slow("alice", None) == 4
    assert auth.check_slow("alice", b"") == 0
    assert auth.check_slow("nobody", b"") == 4


@pytest.fixture
def pbkdf2_calls(monkeypatch):
    """Every PBKDF2 that auth runs: (hash name, salt length, iterations)."""
    calls = []
    real = hashlib.pbkdf2_hmac

    def spy(name, password, salt, iterations, *rest):
        calls.append((name, len(salt), iterations))
        return real(name, password, salt, iterations, *rest)

    monkeypatch.setattr(hashlib, "pbkdf2_hmac", spy)
    return calls


@pytest.mark.parametrize(
    "user, password",
    [
        ("alice", b"wrong"),
        ("alice", b"secret"),
        ("alice", None),
        ("mallory", b"secret"),
        ("", b""),
        ("mallory", None),
    ],
)
def test_every_login_costs_one_pbkdf2_with_the_users_parameters(pbkdf2_calls, user, password):
    """Equal work whoever the user: one PBKDF2-SHA512 with the file's usual iterations and a
    16-byte salt, known user or not, password or not."""
    passwords = PasswordFile(
        "unused",
        {
            "alice": hash_password("secret", 1000, salt=KNOWN_SALT),
            "bob": hash_password("x", 1000, salt=KNOWN_SALT),
            "carol": hash_password("y", 2000, salt=KNOWN_SALT),
        },
    )
    auth = Auth(passwords=passwords)
    pbkdf2_calls.clear()
    assert auth.check_fast(user, password) is None
    auth.check_slow(user, password)
    assert pbkdf2_calls == [("sha512", 16, 1000)]


def test_dummy_hash_without_users_uses_the_default_iterations(pbkdf2_calls):
    Auth(passwords=PasswordFile("unused", {})).check_slow("anyone", b"pw")
    assert pbkdf2_calls == [("sha512", 16, DEFAULT_ITERATIONS)]


def test_only_successes_are_remembered_and_the_cache_is_bounded(passwords):
    auth = Auth(passwords=passwords, cache_size=2)
    assert auth.check_slow("alice", b"wrong") == 4
    assert not auth.remembered("alice", b"wrong")  # a failure is never remembered
    auth.remember("alice", b"secret")
    assert auth.remembered("alice", b"secret")
    assert not auth.remembered("alice", b"secret2")
    assert not auth.remembered("alice", None)
    auth.remember("bob", b"1")
    assert auth.remembered("alice", b"secret")  # touched: bob is now the oldest
    auth.remember("carol", b"2")
    assert not auth.remembered("bob", b"1")
    assert auth.remembered("alice", b"secret") and auth.remembered("carol", b"2")


def test_cache_size_0_remembers_nothing(passwords):
    auth = Auth(passwords=passwords, cache_size=0)
    auth.remember("alice", b"secret")
    assert not auth.remembered("alice", b"secret")


def test_auth_without_acl_allows_everything():
    auth = Auth()
    assert auth.can_publish(None, "c", "a")
    assert auth.can_receive(None, "c", "a")
    assert auth.can_subscribe(None, "c", "#")


def test_auth_with_acl(acl):
    auth = Auth(acl=acl)
    assert auth.can_publish(None, "gateway-1", "telemetry/x")
    assert not auth.can_publish(None, "other", "telemetry/x")
    assert auth.can_receive("alice", "c", "sensors/a")
    assert not auth.can_receive("alice", "c", "sensors/secret/a")
    assert auth.can_subscribe("alice", "c", "sensors/a")
    assert auth.can_subscribe("alice", "c", "sensors/#")  # (sensors/secret/# filtered at delivery)
    assert not auth.can_subscribe("alice", "c", "sensors/secret/+")


# --------------------------------------------------------------------------- $SYS visibility

SYS_ACL = """\
topic read $SYS/#
user admin
topic read $SYS/mesh/clients
user eve
topic read $SYS/mesh/clients
topic deny $SYS/mesh/#
"""


@pytest.mark.parametrize(
    "passwords_file, user, topic, expected",
    [
        (False, None, "$SYS/broker/uptime", True),
        (False, None, "$SYS/mesh/status", True),
        (False, None, "$SYS/mesh/clients", False),  # anonymous: no ClientIds
        (False, "alice", "$SYS/mesh/clients", False),  # a user name nobody checked proves nothing
        (True, None, "$SYS/mesh/clients", False),
        (True, "alice", "$SYS/mesh/clients", True),  # a user the password file verified
    ],
)
def test_sys_without_acl(passwords, passwords_file, user, topic, expected):
    auth = Auth(passwords=passwords if passwords_file else None)
    assert auth.can_read_sys(user, "c", topic) is expected


@pytest.mark.parametrize(
    "user, topic, expected",
    [
        (None, "$SYS/broker/uptime", True),
        (None, "$SYS/mesh/clients", False),  # $SYS/# does not reach the ClientIds
        ("bob", "$SYS/mesh/clients", False),
        ("admin", "$SYS/mesh/clients", True),  # granted by name
        ("admin", "$SYS/mesh/status", True),
        ("eve", "$SYS/mesh/clients", False),  # a deny still wins
        ("eve", "$SYS/mesh/status", False),
    ],
)
def test_sys_with_acl(user, topic, expected):
    auth = Auth(acl=Acl.parse(SYS_ACL))
    assert auth.can_read_sys(user, "c", topic) is expected


def test_sys_with_an_acl_that_grants_no_sys():
    auth = Auth(acl=Acl.parse("topic readwrite #\nuser alice\ntopic readwrite alice/#\n"))
    for topic in ("$SYS/broker/uptime", "$SYS/mesh/status", "$SYS/mesh/clients"):
        assert not auth.can_read_sys("alice", "c", topic)
        assert not auth.can_read_sys(None, "c", topic)


# --------------------------------------------------------------------------- login throttle


def fail(t: LoginThrottle, address: str, user: str | None, now: float) -> float:
    """One login that is admitted, fails, and is answered when its hold is over: the hold."""
    assert t.admit(address, object()) is True
    hold = t.failed(address, user, now)
    assert t.release(address) is None
    return hold


def test_throttle_threshold_then_doubling_holds_up_to_the_cap():
    t = LoginThrottle(threshold=3, delay=0.5, delay_max=30, window=600)
    now, holds = 0.0, []
    for _ in range(11):
        hold = fail(t, "10.0.0.1", "alice", now)
        holds.append(hold)
        now += hold + 0.01
    assert holds == pytest.approx([0, 0, 0, 0.5, 1, 2, 4, 8, 16, 30, 30])


def test_throttle_threshold_is_a_setting():
    t = LoginThrottle(threshold=1, delay=2, delay_max=5)
    assert [fail(t, "a", "u", 10.0 * i) for i in range(4)] == pytest.approx([0, 2, 4, 5])


def test_throttle_forgives_after_the_window():
    t = LoginThrottle(threshold=1, delay=1, delay_max=30, window=100)
    for i in range(3):
        fail(t, "a", "u", i * 10.0)  # failures at 0, 10 and 20
    assert t.failures("a", "a", 119.5) == 3
    assert t.failures("a", "a", 120.5) == 0 and t.failures("u", "u", 120.5) == 0
    assert fail(t, "a", "u", 121.0) == 0  # more than 100 s after the last failure: the first again


def test_throttle_per_address_other_addresses_and_users_unaffected():
    t = LoginThrottle(threshold=2, delay=1)
    for i in range(5):
        fail(t, "10.0.0.1", f"user{i}", i * 100.0)  # one address, many user names
    assert fail(t, "10.0.0.1", "someone", 500.0) > 0
    assert fail(t, "10.0.0.2", "another", 500.0) == 0
    assert fail(t, "10.0.0.3", "user1", 500.0) == 0


def test_throttle_per_user_name_from_any_address():
    t = LoginThrottle(threshold=2, delay=1)
    for i in range(5):
        fail(t, f"10.0.0.{i}", "alice", i * 100.0)  # one user name, many addresses
    assert fail(t, "10.9.9.9", "alice", 500.0) > 0
    assert fail(t, "10.9.9.8", "bob", 500.0) == 0


def test_throttle_holds_only_failures_so_nothing_is_forgiven_by_a_success():
    """A success is answered by the caller as soon as it is checked: the throttle has no say
    in it, and it forgives nothing (behind a NAT, good devices logging in all the time must
    not reset the count of the one that keeps failing)."""
    t = LoginThrottle(threshold=1, delay=1)
    for i in range(3):
        fail(t, "10.0.0.1", "dev17", float(i))
    assert t.admit("10.0.0.1", "good") is True  # a good device's login: checked at once
    assert t.release("10.0.0.1") is None  # (its success answered)
    assert t.failures("a", "10.0.0.1", 5.0) == 3
    assert fail(t, "10.0.0.1", "dev17", 5.0) == pytest.approx(4)


def test_throttle_bounds_the_unanswered_logins_of_an_address_and_queues_the_rest():
    """max_unanswered places per address (a held failure keeps its place until it is due);
    beyond them logins wait in order, as many again; beyond that they are refused. Other
    addresses are not affected."""
    t = LoginThrottle(max_unanswered=3)
    assert [t.admit("nat", f"c{i}") for i in range(8)] == [True] * 3 + [False] * 3 + [None] * 2
    assert t.admit("elsewhere", "x") is True
    assert (t.unanswered("nat"), t.waiting("nat")) == (3, 3)
    assert t.release("nat") == "c3"  # the place passes to the first waiting
    assert t.withdraw("nat", "c4") is True  # c4's client left while it waited
    assert t.withdraw("nat", "c4") is False
    assert t.release("nat") == "c5"
    assert (t.unanswered("nat"), t.waiting("nat")) == (3, 0)
    assert [t.release("nat") for _ in range(3)] == [None] * 3
    assert t.unanswered("nat") == 0 and t.admit("nat", "c9") is True


def test_throttle_a_wave_of_good_logins_from_one_address_is_not_held_back():
    """A gateway logging in 50 devices at once from one address: all checked at once."""
    t = LoginThrottle(threshold=3, delay=0.5, max_unanswered=64)
    assert all(t.admit("gw", f"dev{i}") for i in range(50))
    assert [t.release("gw") for _ in range(50)] == [None] * 50


def test_throttle_is_bounded_and_forgets_idle_addresses():
    t = LoginThrottle(threshold=3, max_entries=100)
    for i in range(50):
        assert t.admit(f"10.0.{i}.1", i) is True
        t.release(f"10.0.{i}.1")
    assert len(t) == 0 and not t._addresses  # nothing to remember about logins without failures
    for i in range(1000):
        fail(t, f"10.1.{i // 250}.{i % 250}", f"v{i}", float(i))
        assert len(t) <= 100
    assert not t._addresses


def test_throttle_least_recently_failed_is_forgotten_first():
    t = LoginThrottle(threshold=1, delay=1, max_entries=4)
    fail(t, "a1", None, 0.0)
    fail(t, "a1", None, 1.0)
    for i in range(3):
        fail(t, f"b{i}", None, 2.0 + i)
    fail(t, "a1", None, 10.0)  # touched: b0 is now the oldest
    fail(t, "c", None, 20.0)
    assert t.failures("a", "a1", 20.0) == 3
    assert t.failures("a", "b0", 20.0) == 0


def test_throttle_anonymous_login_has_only_an_address_key():
    t = LoginThrottle(threshold=1, delay=1)
    for i in range(3):
        fail(t, "a", None, i * 10.0)
    assert fail(t, "a", "bob", 30.0) > 0
    assert t.failures("u", "bob", 30.0) == 1


def test_log_budget():
    b = LogBudget(rate=2, burst=4)
    assert [b.allow(0.0) for _ in range(6)] == [True] * 4 + [False] * 2
    assert b.allow(0.5) is True  # one token back after half a second at 2/s
    assert b.allow(0.5) is False
    assert b.take_suppressed() == 3 and b.take_suppressed() == 0
    assert [b.allow(100.0) for _ in range(5)] == [True] * 4 + [False]  # never more than the burst
