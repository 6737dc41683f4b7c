"""Authentication (password file with salted hashes) and authorization (ACL file).

Pure apart from reading the two files at load time. It leaves to its caller
when to reload them, where to run a slow password check (a hash takes tens of
milliseconds, so the server runs it off the event loop), the salt of a new hash
(random bytes: ``SALT_BYTES`` of them), and the clock, the client addresses and the
answers that ``LoginThrottle`` decides on.

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
or ``deny``. ``read`` also allows subscribing. A deny rule wins over a grant. As in
Mosquitto, a subscription whose filter only overlaps a denied topic is granted, and the
denied topics are filtered out of what it receives; a filter entirely inside a denied
subtree is refused (SUBACK 0x80).
"""

from __future__ import annotations

import base64
import fnmatch
import hashlib
import hmac
import os
from collections import Counter, OrderedDict, deque
from collections.abc import Iterator
from dataclasses import dataclass, field

from .codec import MalformedPacket, validate_topic_filter
from .topics import filter_matches

__all__ = [
    "ConfigError",
    "hash_password",
    "SALT_BYTES",
    "verify_password",
    "PasswordFile",
    "Acl",
    "Auth",
    "LoginThrottle",
    "LogBudget",
    "CLIENT_ID_TOPICS",
    "filter_covers",
    "READ",
    "WRITE",
    "SUBSCRIBE",
]

READ, WRITE, SUBSCRIBE = 1, 2, 4
_ACCESS = {
    "read": READ | SUBSCRIBE,
    "write": WRITE,
    "subscribe": SUBSCRIBE,
    "readwrite": READ | WRITE | SUBSCRIBE,
    "deny": 0,
}
DEFAULT_ITERATIONS = 100_000
SALT_BYTES = 16  # of a new password hash: fresh random bytes each time (the caller's os.urandom)


class ConfigError(Exception):
    """A configuration problem, with the file, line or key it comes from."""


# --------------------------------------------------------------------------- passwords


def hash_password(password: str, iterations: int = DEFAULT_ITERATIONS, *, salt: bytes) -> str:
    digest = hashlib.pbkdf2_hmac("sha512", password.encode("utf-8"), salt, iterations)
    return f"$pbkdf2-sha512${iterations}${base64.b64encode(salt).decode()}${base64.b64encode(digest).decode()}"


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
    def load(cls, path: str, missing_ok: bool = False) -> PasswordFile:
        users = {}
        try:
            with open(path, encoding="utf-8") as fh:
                for n, line in enumerate(fh, 1):
                    line = line.strip()
                    if not line or line.startswith("#"):
                        continue
                    user, sep, encoded = line.partition(":")
                    if not sep or not user or not encoded.startswith("$pbkdf2-sha512$") or encoded.count("$") != 4:
                        raise ConfigError(
                            f"{path}:{n}: expected 'user:$pbkdf2-sha512$...' (create entries with 'mqttmesh passwd')"
                        )
                    users[user] = encoded
        except FileNotFoundError:
            if not missing_ok:
                raise ConfigError(f"{path}: password file not found") from None
        except UnicodeDecodeError:
            raise ConfigError(f"{path}: password file is not UTF-8") from None
        return cls(path, users)

    def set(self, user: str, password: str, iterations: int = DEFAULT_ITERATIONS, *, salt: bytes) -> None:
        if not user or ":" in user:
            raise ConfigError(f"user name {user!r} must be non-empty and contain no ':'")
        self.users[user] = hash_password(password, iterations, salt=salt)

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
    access: int  # bit set; 0 for deny
    topic: str  # a topic filter, maybe with %c/%u
    pattern: bool  # substitute %c and %u


@dataclass
class _Block:
    user: str | None = None
    client: str | None = None  # fnmatch pattern on the ClientId
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
    def parse(cls, text: str, source: str = "<acl>") -> Acl:
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
                    raise ConfigError(
                        f"{where}: unknown access {access_word!r} (read, write, subscribe, readwrite or deny)"
                    )
                topic = words[-1]
                try:
                    validate_topic_filter(topic)
                except MalformedPacket as exc:
                    raise ConfigError(f"{where}: invalid topic filter {topic!r}: {exc.detail}") from None
                blocks[-1].rules.append(_Rule(_ACCESS[access_word], topic, keyword == "pattern"))
            else:
                raise ConfigError(
                    f"{where}: cannot parse {raw.strip()!r} (expected 'user NAME', "
                    f"'client PATTERN', 'topic [ACCESS] FILTER' or 'pattern [ACCESS] FILTER')"
                )
        return cls(blocks)

    @classmethod
    def load(cls, path: str) -> Acl:
        try:
            with open(path, encoding="utf-8") as fh:
                return cls.parse(fh.read(), path)
        except FileNotFoundError:
            raise ConfigError(f"{path}: ACL file not found") from None

    def _rules(self, username: str | None, client_id: str) -> Iterator[tuple[int, str]]:
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

    def allows_exactly(self, username: str | None, client_id: str, topic: str, access: int) -> bool:
        """Like ``allows``, but only a rule naming ``topic`` itself (no wildcard) grants it."""
        granted = False
        for bits, rule_filter in self._rules(username, client_id):
            if filter_matches(rule_filter, topic) or rule_filter == topic:
                if bits == 0:
                    return False
                if bits & access and rule_filter == topic:
                    granted = True
        return granted

    def allows_subscribe(self, username: str | None, client_id: str, topic_filter: str) -> bool:
        """Subscribe to ``topic_filter``: a grant covers it and no deny rule covers all of it.
        As in Mosquitto, a deny rule that covers only part of the filter (``deny a/secret``
        under a subscription to ``a/#``) does not refuse it: the denied topics are filtered
        out at delivery (``allows`` with READ, asked for every message)."""
        granted = False
        for bits, rule_filter in self._rules(username, client_id):
            if bits == 0:
                if filter_covers(rule_filter, topic_filter):
                    return False  # every topic of the filter is denied
            elif bits & SUBSCRIBE and filter_covers(rule_filter, topic_filter):
                granted = True
        return granted


# the $SYS topics that name clients: anonymous clients never receive them, and an ACL
# grants them only by name (see Auth.can_read_sys)
CLIENT_ID_TOPICS = frozenset({"$SYS/mesh/clients"})
# the dummy hash an unknown user's password is checked against: its salt and digest are
# public, which is harmless since a check against it never succeeds
_DUMMY_SALT = base64.b64encode(bytes(16)).decode()
_DUMMY_DIGEST = base64.b64encode(bytes(64)).decode()


class Auth:
    """What the broker asks: may this user connect, publish, subscribe, receive?

    Every login with a user name checked against the password file takes the same path and
    the same work, whether the user exists or not (``check_fast`` defers them all, and
    ``check_slow`` hashes an unknown user's password against a dummy hash with the
    iterations most users have), so neither the answer nor its timing tells which user
    names exist. Successful checks are remembered (``remember``, bounded, least recently
    used forgotten first); failures are not: a remembered failure would answer a repeated
    guess faster, telling its sender that someone tried the same pair recently.
    """

    def __init__(
        self,
        allow_anonymous: bool = True,
        passwords: PasswordFile | None = None,
        acl: Acl | None = None,
        cache_size: int = 10_000,
    ):
        self.allow_anonymous = allow_anonymous
        self.passwords = passwords
        self.acl = acl
        self.cache_size = cache_size
        self._verified: OrderedDict[tuple[str, bytes], None] = OrderedDict()
        self._dummy = f"$pbkdf2-sha512${_usual_iterations(passwords)}${_DUMMY_SALT}${_DUMMY_DIGEST}"

    def reload(self, passwords: PasswordFile | None, acl: Acl | None) -> None:
        """New password file and ACL (SIGHUP): the next login and the next delivery use them.
        Remembered logins are forgotten: a changed password must be checked again."""
        self.passwords = passwords
        self.acl = acl
        self._verified.clear()
        self._dummy = f"$pbkdf2-sha512${_usual_iterations(passwords)}${_DUMMY_SALT}${_DUMMY_DIGEST}"

    def check_fast(self, username: str | None, password: bytes | None) -> int | None:
        """CONNACK return code, or None when a password check must run (``check_slow``).

        None for every user name once there is a password file, known or not, with a
        password or without: a quick refusal would tell which names exist.
        """
        if username is None or self.passwords is None:
            return 0 if self.allow_anonymous else 5
        return None

    def check_slow(self, username: str, password: bytes | None) -> int:
        """0 or 4, after one PBKDF2 whatever the user; safe to call on any thread."""
        encoded = self.passwords.users.get(username) if self.passwords is not None else None
        ok = verify_password(password or b"", encoded or self._dummy)
        return 0 if ok and encoded is not None and password is not None else 4

    def remembered(self, username: str, password: bytes | None) -> bool:
        """This user logged in with this password recently: no need to hash it again."""
        if password is None or not self._verified:
            return False
        key = (username, hashlib.sha256(password).digest())
        if key not in self._verified:
            return False
        self._verified.move_to_end(key)
        return True

    def remember(self, username: str, password: bytes) -> None:
        """A successful ``check_slow``: the next login with the same pair skips the hash."""
        if self.cache_size <= 0:
            return
        verified = self._verified
        verified[(username, hashlib.sha256(password).digest())] = None
        while len(verified) > self.cache_size:
            verified.popitem(last=False)

    def can_publish(self, username: str | None, client_id: str, topic: str) -> bool:
        return self.acl is None or self.acl.allows(username, client_id, topic, WRITE)

    def can_receive(self, username: str | None, client_id: str, topic: str) -> bool:
        return self.acl is None or self.acl.allows(username, client_id, topic, READ)

    def can_read_sys(self, username: str | None, client_id: str, topic: str) -> bool:
        """May this client receive the ``$SYS`` message on ``topic``?

        With an ACL, as any topic, except that the topics naming clients
        (CLIENT_ID_TOPICS) need a grant of that very topic (a ``$SYS/#`` grant does not
        reach them). Without an ACL, everything but those, which go only to users the
        password file verified.
        """
        if topic in CLIENT_ID_TOPICS:
            if self.acl is None:
                return username is not None and self.passwords is not None
            return self.acl.allows_exactly(username, client_id, topic, READ)
        return self.acl is None or self.acl.allows(username, client_id, topic, READ)

    def can_subscribe(self, username: str | None, client_id: str, topic_filter: str) -> bool:
        return self.acl is None or self.acl.allows_subscribe(username, client_id, topic_filter)


def _usual_iterations(passwords: PasswordFile | None) -> int:
    """The iteration count most users of the file have (the dummy hash's)."""
    counts: Counter[int] = Counter()
    for encoded in passwords.users.values() if passwords is not None else ():
        try:
            counts[int(encoded.split("$")[2])] += 1
        except (IndexError, ValueError):
            continue
    return counts.most_common(1)[0][0] if counts else DEFAULT_ITERATIONS


# --------------------------------------------------------------------------- failed logins


class _Failures:
    __slots__ = ("count", "last")

    def __init__(self) -> None:
        self.count = 0  # failures since the window last forgave this key
        self.last = 0.0  # time of the last failure


class _Address:
    __slots__ = ("unanswered", "waiting")

    def __init__(self) -> None:
        self.unanswered = 0  # logins admitted and not yet answered (checking, or a failure held)
        self.waiting: deque[object] = deque()  # logins waiting for one of them to be answered


class LoginThrottle:
    """Logins slowed where an attacker needs them and never where a good client does.

    Pure: the caller passes the time, runs the checks, reports each result and answers when
    told to. Two things are throttled, never the check of a login nor its success:

    - **The answer to a failure.** Up to ``threshold`` failures of an address or a user name
      are answered at once; after that each failure's answer (CONNACK 0x04) is held back
      ``delay`` seconds, doubling with each further failure up to ``delay_max`` (``failed``
      says how long). A key is forgiven ``window`` seconds after its last failure. A right
      password is answered as soon as it is checked, however many failures came before it
      from its address or for its user name: a device retrying a wrong password behind a NAT
      slows itself, not the site, and nobody can keep ``alice`` out by failing as ``alice``.
    - **The logins of one address not yet answered**: at most ``max_unanswered`` (a held
      failure keeps its place until its answer is due, even if its client hung up, so
      hanging up after a second of silence buys no extra guesses). Beyond that a login waits
      its turn (``admit`` says False and queues it, ``release`` hands it back when a place
      frees); beyond another ``max_unanswered`` waiting it is refused at once. An attacker
      behind one address thus makes at most ``max_unanswered`` guesses per ``delay_max``.

    Logins the node remembers as good (``Auth.remembered``) need none of this: the caller
    answers them before asking. Memory is bounded: at most ``max_entries`` failure keys,
    least recently used forgotten first; an address with nothing unanswered is forgotten.
    """

    def __init__(
        self,
        threshold: int = 3,
        delay: float = 0.5,
        delay_max: float = 30.0,
        window: float = 600.0,
        max_entries: int = 50_000,
        max_unanswered: int = 64,
    ):
        self.threshold = threshold
        self.delay = delay
        self.delay_max = delay_max
        self.window = window
        self.max_entries = max_entries
        self.max_unanswered = max_unanswered
        self._keys: OrderedDict[tuple[str, str], _Failures] = OrderedDict()
        self._addresses: dict[str, _Address] = {}

    def __len__(self) -> int:
        return len(self._keys)

    def delay_after(self, failures: int) -> float:
        """How long the answer to a failure waits when its key had ``failures`` before it."""
        excess = failures - self.threshold
        if excess < 0:
            return 0.0
        if excess >= 64 or self.delay * 2.0**excess >= self.delay_max:
            return self.delay_max
        return self.delay * 2.0**excess

    # -- the logins of one address ----------------------------------------------------------

    def admit(self, address: str, login: object) -> bool | None:
        """May this login be checked now? True: it holds one of its address's places until
        ``release``. False: it waits (``release`` returns it when its turn comes). None: the
        address has as many waiting already; refuse it."""
        entry = self._addresses.get(address)
        if entry is None:
            entry = self._addresses[address] = _Address()
        if entry.unanswered < self.max_unanswered:
            entry.unanswered += 1
            return True
        if len(entry.waiting) >= self.max_unanswered:
            return None
        entry.waiting.append(login)
        return False

    def release(self, address: str) -> object | None:
        """A login of this address was answered (or its held failure came due): its place
        goes to the first waiting login, which is returned (it now holds the place), if any."""
        entry = self._addresses.get(address)
        if entry is None:
            return None
        if entry.waiting:
            return entry.waiting.popleft()
        entry.unanswered -= 1
        if not entry.unanswered:
            del self._addresses[address]
        return None

    def withdraw(self, address: str, login: object) -> bool:
        """A waiting login left (its client hung up, or it waited too long)."""
        entry = self._addresses.get(address)
        if entry is None or login not in entry.waiting:
            return False
        entry.waiting.remove(login)
        return True

    def unanswered(self, address: str) -> int:
        entry = self._addresses.get(address)
        return entry.unanswered if entry is not None else 0

    def waiting(self, address: str) -> int:
        entry = self._addresses.get(address)
        return len(entry.waiting) if entry is not None else 0

    # -- failures ---------------------------------------------------------------------------

    def failed(self, address: str, user: str | None, now: float) -> float:
        """A login failed its check: counted against its address and user name. Returns how
        long its answer waits (its place is released when that is over)."""
        entries = [self._entry(key, now) for key in _keys(address, user)]
        hold = self.delay_after(max(e.count for e in entries))
        for e in entries:
            e.count += 1
            e.last = now
        return hold

    def failures(self, key_kind: str, name: str, now: float) -> int:
        """Failures remembered for an address (``"a"``) or a user name (``"u"``)."""
        entry = self._keys.get((key_kind, name))
        if entry is None or now - entry.last > self.window:
            return 0
        return entry.count

    def _entry(self, key: tuple[str, str], now: float) -> _Failures:
        keys = self._keys
        entry = keys.get(key)
        if entry is not None:
            if now - entry.last > self.window:
                entry.count = 0  # forgiven
            keys.move_to_end(key)
            return entry
        entry = keys[key] = _Failures()
        while len(keys) > self.max_entries:
            keys.popitem(last=False)
        return entry


def _keys(address: str, user: str | None) -> list[tuple[str, str]]:
    return [("a", address), ("u", user)] if user is not None else [("a", address)]


class LogBudget:
    """At most ``rate`` lines a second on average, in bursts of up to ``burst``; pure.

    ``allow(now)`` says whether to log a line; the lines it refused are counted in
    ``suppressed`` until the caller reports them (``take_suppressed``).
    """

    def __init__(self, rate: float, burst: float):
        self.rate = rate
        self.burst = max(1.0, burst)
        self._tokens = self.burst
        self._at: float | None = None
        self.suppressed = 0

    def allow(self, now: float) -> bool:
        if self._at is not None:
            self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
        self._at = now
        if self._tokens >= 1:
            self._tokens -= 1
            return True
        self.suppressed += 1
        return False

    def take_suppressed(self) -> int:
        n, self.suppressed = self.suppressed, 0
        return n
