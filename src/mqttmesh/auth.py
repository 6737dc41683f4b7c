"""Authentication (password file with salted hashes) and authorization (ACL file).

Pure apart from reading the two files at load time. It leaves to its caller
when to reload them and where to run a slow password check (a hash takes
tens of milliseconds, so the server runs it off the event loop).

Password file: one ``user:$pbkdf2-sha512$ITERATIONS$SALT$HASH`` line per user
(salt and hash in base64). ACL file, one rule per line::

    # rules before any "user"/"client" line apply to everybody
    topic read $SYS/#
    # %c is the ClientId, %u the user name
    pattern readwrite devices/%c/#
    # the rules that follow apply to alice
    user alice
    topic readwrite sensors/#
    topic deny sensors/secret/#
    # the rules that follow apply to ClientIds matching the glob
    client gateway-*
    topic write telemetry/#

Comments are whole lines starting with '#' (inside a rule '#' is a wildcard).

Access is one of ``read``, ``write``, ``subscribe``, ``readwrite`` (all three)
or ``deny``. ``read`` also allows subscribing. A deny rule wins over a grant.
"""

from __future__ import annotations

import base64
import fnmatch
import hashlib
import hmac
import os
from dataclasses import dataclass, field

from .codec import MalformedPacket, validate_topic_filter
from .topics import filter_matches

__all__ = ["ConfigError", "hash_password", "verify_password", "PasswordFile", "Acl", "Auth",
           "filter_covers", "READ", "WRITE", "SUBSCRIBE"]

READ, WRITE, SUBSCRIBE = 1, 2, 4
_ACCESS = {"read": READ | SUBSCRIBE, "write": WRITE, "subscribe": SUBSCRIBE,
           "readwrite": READ | WRITE | SUBSCRIBE, "deny": 0}
DEFAULT_ITERATIONS = 100_000


class ConfigError(Exception):
    """A configuration problem, with the file, line or key it comes from."""


# --------------------------------------------------------------------------- passwords


def hash_password(password: str, iterations: int = DEFAULT_ITERATIONS, salt: bytes | None = None) -> str:
    salt = salt if salt is not None else os.urandom(16)
    digest = hashlib.pbkdf2_hmac("sha512", password.encode("utf-8"), salt, iterations)
    return "$pbkdf2-sha512${}${}${}".format(
        iterations, base64.b64encode(salt).decode(), base64.b64encode(digest).decode())


def verify_password(password: bytes, encoded: str) -> bool:
    try:
        _, scheme, iterations, salt, digest = encoded.split("$")
        if scheme != "pbkdf2-sha512":
            return False
        expected = base64.b64decode(digest)
        got = hashlib.pbkdf2_hmac("sha512", password, base64.b64decode(salt), int(iterations))
    except (ValueError, TypeError):
        return False
    return hmac.compare_digest(expected, got)


class PasswordFile:
    """The users and password hashes of one file; ``save`` writes it atomically."""

    def __init__(self, path: str, users: dict[str, str] | None = None):
        self.path = path
        self.users: dict[str, str] = users or {}

    @classmethod
    def load(cls, path: str, missing_ok: bool = False) -> "PasswordFile":
        users = {}
        try:
            with open(path, encoding="utf-8") as fh:
                for n, line in enumerate(fh, 1):
                    line = line.strip()
                    if not line or line.startswith("#"):
                        continue
                    user, sep, encoded = line.partition(":")
                    if not sep or not user or not encoded.startswith("$pbkdf2-sha512$") \
                            or encoded.count("$") != 4:
                        raise ConfigError(f"{path}:{n}: expected 'user:$pbkdf2-sha512$...' "
                                          f"(create entries with 'mqttmesh passwd')")
                    users[user] = encoded
        except FileNotFoundError:
            if not missing_ok:
                raise ConfigError(f"{path}: password file not found") from None
        except UnicodeDecodeError:
            raise ConfigError(f"{path}: password file is not UTF-8") from None
        return cls(path, users)

    def set(self, user: str, password: str, iterations: int = DEFAULT_ITERATIONS) -> None:
        if not user or ":" in user:
            raise ConfigError(f"user name {user!r} must be non-empty and contain no ':'")
        self.users[user] = hash_password(password, iterations)

    def delete(self, user: str) -> bool:
        return self.users.pop(user, None) is not None

    def save(self) -> None:
        tmp = f"{self.path}.tmp{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as fh:
            for user, encoded in sorted(self.users.items()):
                fh.write(f"{user}:{encoded}\n")
        os.chmod(tmp, 0o600)
        os.replace(tmp, self.path)


# --------------------------------------------------------------------------- ACL


def filter_covers(rule: str, topic_filter: str) -> bool:
    """True when every topic matching ``topic_filter`` also matches ``rule``."""
    if topic_filter.startswith("$") != rule.startswith("$") and rule[:1] in ("+", "#"):
        return False
    r_levels = rule.split("/")
    f_levels = topic_filter.split("/")
    for i, r in enumerate(r_levels):
        if r == "#":
            return True
        if i >= len(f_levels):
            return False
        f = f_levels[i]
        if f == "#":
            return False
        if r == "+":
            continue
        if f == "+" or f != r:
            return False
    return len(r_levels) == len(f_levels)


@dataclass
class _Rule:
    access: int           # bit set; 0 for deny
    topic: str            # a topic filter, maybe with %c/%u
    pattern: bool         # substitute %c and %u


@dataclass
class _Block:
    user: str | None = None
    client: str | None = None   # fnmatch pattern on the ClientId
    rules: list[_Rule] = field(default_factory=list)

    def applies(self, username: str | None, client_id: str) -> bool:
        if self.user is not None:
            return username == self.user
        if self.client is not None:
            return fnmatch.fnmatchcase(client_id, self.client)
        return True


def _unsafe(name: str | None) -> bool:
    return not name or "+" in name or "#" in name or "/" in name


class Acl:
    def __init__(self, blocks: list[_Block]):
        self.blocks = blocks

    @classmethod
    def parse(cls, text: str, source: str = "<acl>") -> "Acl":
        blocks = [_Block()]
        for n, raw in enumerate(text.splitlines(), 1):
            line = raw.strip()  # only whole-line comments: '#' is also a wildcard
            if not line or line.startswith("#"):
                continue
            words = line.split()
            keyword = words[0]
            where = f"{source}:{n}"
            if keyword == "user" and len(words) == 2:
                blocks.append(_Block(user=words[1]))
            elif keyword == "client" and len(words) == 2:
                blocks.append(_Block(client=words[1]))
            elif keyword in ("topic", "pattern") and len(words) in (2, 3):
                access_word = words[1] if len(words) == 3 else "readwrite"
                if access_word not in _ACCESS:
                    raise ConfigError(f"{where}: unknown access {access_word!r} "
                                      f"(read, write, subscribe, readwrite or deny)")
                topic = words[-1]
                try:
                    validate_topic_filter(topic)
                except MalformedPacket as exc:
                    raise ConfigError(f"{where}: invalid topic filter {topic!r}: {exc.detail}") from None
                blocks[-1].rules.append(_Rule(_ACCESS[access_word], topic, keyword == "pattern"))
            else:
                raise ConfigError(f"{where}: cannot parse {raw.strip()!r} (expected 'user NAME', "
                                  f"'client PATTERN', 'topic [ACCESS] FILTER' or 'pattern [ACCESS] FILTER')")
        return cls(blocks)

    @classmethod
    def load(cls, path: str) -> "Acl":
        try:
            with open(path, encoding="utf-8") as fh:
                return cls.parse(fh.read(), path)
        except FileNotFoundError:
            raise ConfigError(f"{path}: ACL file not found") from None

    def _rules(self, username: str | None, client_id: str):
        for block in self.blocks:
            if block.applies(username, client_id):
                for rule in block.rules:
                    topic = rule.topic
                    if rule.pattern:
                        if "%u" in topic and username is None:
                            continue
                        # a ClientId or user name with wildcards or levels would widen
                        # the rule to other clients' topics (cf. CVE-2017-7650): no grant
                        if "%c" in topic and _unsafe(client_id):
                            continue
                        if "%u" in topic and _unsafe(username):
                            continue
                        topic = topic.replace("%c", client_id).replace("%u", username or "")
                    yield rule.access, topic

    def allows(self, username: str | None, client_id: str, topic: str, access: int) -> bool:
        """Publish (WRITE) or receive (READ) on a topic name."""
        granted = False
        for bits, rule_filter in self._rules(username, client_id):
            if filter_matches(rule_filter, topic) or (rule_filter == topic):
                if bits == 0:
                    return False
                if bits & access:
                    granted = True
        return granted

    def allows_subscribe(self, username: str | None, client_id: str, topic_filter: str) -> bool:
        granted = False
        for bits, rule_filter in self._rules(username, client_id):
            if bits == 0:
                # a deny rule that overlaps the filter refuses it
                if filter_covers(rule_filter, topic_filter) or filter_covers(topic_filter, rule_filter):
                    return False
            elif bits & SUBSCRIBE and filter_covers(rule_filter, topic_filter):
                granted = True
        return granted


class Auth:
    """What the broker asks: may this user connect, publish, subscribe, receive?"""

    def __init__(self, allow_anonymous: bool = True, passwords: PasswordFile | None = None,
                 acl: Acl | None = None):
        self.allow_anonymous = allow_anonymous
        self.passwords = passwords
        self.acl = acl
        self._verified: dict[tuple[str, bytes], bool] = {}

    def check_fast(self, username: str | None, password: bytes | None) -> int | None:
        """CONNACK return code, or None when a slow hash check must run (``check_slow``)."""
        if username is None:
            return 0 if self.allow_anonymous else 5
        if self.passwords is None:
            return 0 if self.allow_anonymous else 5
        encoded = self.passwords.users.get(username)
        if encoded is None or password is None:
            return 4
        known = self._verified.get((username, hashlib.sha256(password).digest()))
        if known is not None:
            return 0 if known else 4
        return None

    def check_slow(self, username: str, password: bytes) -> int:
        encoded = self.passwords.users.get(username) if self.passwords else None
        ok = encoded is not None and verify_password(password, encoded)
        if len(self._verified) > 10_000:
            self._verified.clear()
        self._verified[(username, hashlib.sha256(password).digest())] = ok
        return 0 if ok else 4

    def can_publish(self, username: str | None, client_id: str, topic: str) -> bool:
        return self.acl is None or self.acl.allows(username, client_id, topic, WRITE)

    def can_receive(self, username: str | None, client_id: str, topic: str) -> bool:
        return self.acl is None or self.acl.allows(username, client_id, topic, READ)

    def can_subscribe(self, username: str | None, client_id: str, topic_filter: str) -> bool:
        return self.acl is None or self.acl.allows_subscribe(username, client_id, topic_filter)
