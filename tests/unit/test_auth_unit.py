"""mqttmesh.auth: password hashes, the password file, the ACL, Auth's decisions."""

from __future__ import annotations

import os
import stat

import pytest

from mqttmesh.auth import (READ, SUBSCRIBE, WRITE, Acl, Auth, ConfigError, PasswordFile, filter_covers,
                           hash_password, verify_password)

# pbkdf2-sha512("pw", salt b"0123456789abcdef", 1000 iterations), computed once with hashlib
KNOWN_SALT = b"0123456789abcdef"
KNOWN_HASH = ("$pbkdf2-sha512$1000$MDEyMzQ1Njc4OWFiY2RlZg==$bk6AzDNPufwraG/VjmAl+642J4ug0Z1+aNrlKzX8aHwEs63XDUGVJ"
              "TUkvPMmA3adUiWnwISWC+BX0WWY7QuPYQ==")


# --------------------------------------------------------------------------- hashes


def test_hash_password_known_vector():
    assert hash_password("pw", 1000, salt=KNOWN_SALT) == KNOWN_HASH


def test_verify_password():
    assert verify_password(b"pw", KNOWN_HASH) is True
    assert verify_password(b"pW", KNOWN_HASH) is False
    assert verify_password(b"", KNOWN_HASH) is False


def test_hash_password_uses_a_fresh_salt():
    a, b = hash_password("pw", 1000), hash_password("pw", 1000)
    assert a != b
    assert verify_password(b"pw", a) and verify_password(b"pw", b)


def test_hash_password_non_ascii():
    encoded = hash_password("p\u00e4ss", 1000)
    assert verify_password("p\u00e4ss".encode("utf-8"), encoded)
    assert not verify_password(b"pass", encoded)


@pytest.mark.parametrize("encoded", [
    "", "garbage", "$md5$1000$MDEy$MDEy", "$pbkdf2-sha512$many$MDEy$MDEy",
    "$pbkdf2-sha512$1000$!!!$MDEy", "$pbkdf2-sha512$0$MDEy$MDEy", "$pbkdf2-sha512$-5$MDEy$MDEy",
    "$pbkdf2-sha512$1000$MDEy", KNOWN_HASH + "$extra",
])
def test_verify_password_malformed_hash_is_false_not_an_error(encoded):
    assert verify_password(b"pw", encoded) is False


# --------------------------------------------------------------------------- password file


def test_password_file_load(tmp_path):
    path = tmp_path / "passwd"
    path.write_text(f"# users\n\nalice:{KNOWN_HASH}\n  bob:{KNOWN_HASH}  \n", encoding="utf-8")
    pf = PasswordFile.load(str(path))
    assert pf.users == {"alice": KNOWN_HASH, "bob": KNOWN_HASH}


@pytest.mark.parametrize("line", [
    "alice", "alice:", ":" + KNOWN_HASH, "alice:secret", "alice:$pbkdf2-sha512$1000$abc",
    "alice:$md5$1000$MDEy$MDEy",
])
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
    pf.set("alice", "secret", iterations=1000)
    pf.set("bob", "hunter2", iterations=1000)
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
        PasswordFile(str(tmp_path / "p")).set(user, "x", iterations=1000)


# --------------------------------------------------------------------------- ACL parsing


@pytest.mark.parametrize("text, line", [
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
])
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


@pytest.mark.parametrize("user, client, topic, access, expected", [
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
])
def test_acl_allows(acl, user, client, topic, access, expected):
    assert acl.allows(user, client, topic, access) is expected


@pytest.mark.parametrize("user, client, topic_filter, expected", [
    (None, "x", "$SYS/#", True),            # read implies subscribe
    (None, "x", "#", False),                 # "#" does not cover $SYS/#, nothing else is granted
    (None, "d1", "devices/d1/#", True),
    (None, "d1", "devices/+/#", False),
    (None, "d1", "devices/#", False),
    ("alice", "x", "sensors/+", True),
    ("alice", "x", "sensors/#", False),      # overlaps the denied sensors/secret/#
    ("alice", "x", "sensors/secret/a", False),
    ("alice", "x", "sensors/secret", False),  # the deny rule sensors/secret/# matches it (4.7.1.2)
    (None, "gateway-1", "cmd/#", True),      # subscribe access
    (None, "gateway-1", "telemetry/#", False),  # write access only
])
def test_acl_allows_subscribe(acl, user, client, topic_filter, expected):
    assert acl.allows_subscribe(user, client, topic_filter) is expected


@pytest.mark.parametrize("client, user, topic", [
    ("+", None, "devices/other/temp"),
    ("#", None, "devices/other/temp"),
    ("x", "+", "users/bob/inbox"),
    ("x", "#", "users/bob/inbox"),
])
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


@pytest.mark.parametrize("rule, topic_filter, expected", [
    ("#", "a/b", True), ("#", "#", True), ("#", "+", True), ("#", "a/#", True),
    ("a/#", "a", True), ("a/#", "a/#", True), ("a/#", "a/+/c", True), ("a/#", "#", False),
    ("a/#", "b", False), ("a/+", "a/b", True), ("a/+", "a/+", True), ("a/+", "a/#", False),
    ("a/+", "a", False), ("a/+", "a/b/c", False), ("a/b", "a/+", False), ("a/b", "a/b", True),
    ("+/b", "a/b", True), ("+", "a/b", False), ("+", "#", False), ("a", "a/b", False),
    ("a/b/c", "a/b", False),
    # [MQTT-4.7.2-1] leading wildcards never cover $-topics
    ("#", "$SYS/#", False), ("+/#", "$SYS/x", False), ("+", "$x", False),
    ("$SYS/#", "$SYS/x", True), ("$SYS/+", "$SYS/x", True), ("$SYS/#", "#", False),
])
def test_filter_covers(rule, topic_filter, expected):
    assert filter_covers(rule, topic_filter) is expected


# --------------------------------------------------------------------------- Auth


@pytest.fixture
def passwords():
    return PasswordFile("unused", {"alice": hash_password("secret", 1000)})


@pytest.mark.parametrize("anonymous, user, password, expected", [
    (True, None, None, 0),
    (False, None, None, 5),
    (True, "alice", b"secret", None),   # a hash to check: slow path
    (False, "alice", b"secret", None),
    (False, "alice", None, 4),
    (False, "mallory", b"secret", 4),
])
def test_check_fast(passwords, anonymous, user, password, expected):
    assert Auth(allow_anonymous=anonymous, passwords=passwords).check_fast(user, password) == expected


def test_check_fast_without_password_file():
    assert Auth(allow_anonymous=True).check_fast("anyone", b"x") == 0
    assert Auth(allow_anonymous=False).check_fast("anyone", b"x") == 5


def test_check_slow_and_cache(passwords):
    auth = Auth(allow_anonymous=False, passwords=passwords)
    assert auth.check_slow("alice", b"wrong") == 4
    assert auth.check_slow("alice", b"secret") == 0
    assert auth.check_slow("mallory", b"secret") == 4
    assert auth.check_fast("alice", b"secret") == 0
    assert auth.check_fast("alice", b"wrong") == 4
    assert auth.check_fast("alice", b"other") is None


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
    assert not auth.can_subscribe("alice", "c", "sensors/#")
