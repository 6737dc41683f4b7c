"""Password logins: checked off the event loop, throttled, bounded, counted and logged.

The I/O side of ``auth.LoginThrottle`` and ``Auth.check_slow``. A login with a user name
(once there is a password file) goes: the remembered successes (answered at once), then a
place among its address's unanswered logins (``auth.max_unanswered``; it waits its turn
when they are taken), then a queue of at most ``auth.max_pending`` checks run by
``auth.hash_workers`` threads at a lower CPU priority than the event loop. A success is
answered when its check ends; a failure's answer may be held back (``LoginThrottle.failed``)
and keeps its place until it is due. The connection reads nothing meanwhile (the Channel
holds it in AUTHENTICATING) and still counts against ``limits.max_connections``; a client
that leaves while it waits for a place is never checked.
"""

from __future__ import annotations

import functools
import ipaddress
import logging
import os
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

from ..auth import LogBudget, LoginThrottle
from ..channel import AUTHENTICATING, CONNECTED
from ..config import Config

log = logging.getLogger("mqttmesh.auth")

ACCEPTED, UNAVAILABLE = 0, 3
SUMMARY_AFTER = 10.0  # seconds after the first suppressed line before the count of them is logged
USER_SHOWN = 64  # characters of a user name a log line shows


def address_key(peername) -> str:
    """What failures are counted against: the IPv4 address, or the IPv6 /64 (one host's share)."""
    host = peername[0] if isinstance(peername, tuple) else str(peername)
    try:
        ip = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return host
    if ip.version == 6:
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.ip_network(f"{ip}/64", strict=False))
    return str(ip)


def quote_user(user: str | None) -> str:
    """A user name as a log line shows it: escaped (no control characters) and cut short."""
    if user is None:
        return "-"
    if len(user) <= USER_SHOWN:
        return repr(user)
    return f"{user[:USER_SHOWN]!r}... ({len(user)} characters)"


def _lower_priority(nice: int) -> None:
    # Linux gives each thread its own nice value: hashing yields to the event loop
    if nice and sys.platform.startswith("linux"):
        tid = threading.get_native_id()
        try:
            os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + nice))
        except OSError as exc:  # pragma: no cover (a sandbox may forbid it)
            log.warning("cannot lower the priority of the password check thread: %s", exc)


class Logins:
    def __init__(self, node, config: Config):
        self.node = node
        self.loop = node.loop
        self.auth = node.broker.auth
        self.stats = node.broker.stats
        self.throttle = LoginThrottle(
            threshold=config.get("auth.fail_threshold"),
            delay=config.get("auth.fail_delay"),
            delay_max=config.get("auth.fail_delay_max"),
            window=config.get("auth.fail_window"),
            max_entries=config.get("auth.fail_entries"),
            max_unanswered=config.get("auth.max_unanswered"),
        )
        self.max_pending = config.get("auth.max_pending")
        self.workers = config.get("auth.hash_workers")
        self.nice = config.get("auth.hash_nice")
        rate = config.get("auth.log_rate")
        self.budget = LogBudget(rate, burst=rate * SUMMARY_AFTER)
        self.pending = 0  # checks handed to the pool and not finished
        self.held = 0  # failures whose answer is held back
        self.waiting: dict[object, tuple[str, str, bytes | None]] = {}  # conn -> (address, user, password)
        self._pool: ThreadPoolExecutor | None = None
        self._summary = None

    def stop(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
        if self._summary is not None:
            self._summary.cancel()

    # -- one login ------------------------------------------------------------------------

    def authenticate(self, conn, username: str, password: bytes | None) -> None:
        if self.auth.remembered(username, password):
            self._answer(conn, ACCEPTED)  # a right password seen before: no hash, no wait
            return
        now = self.loop.time()
        address = address_key(conn.transport.get_extra_info("peername") if conn.transport else conn.peer)
        admitted = self.throttle.admit(address, conn)
        if admitted is None:
            self.stats.auth_throttled += 1
            why = f"too many logins from {address} waiting for an answer (auth.max_unanswered); try again later"
            self._warn(now, "login refused unchecked from %s: user %s: %s", conn.peer, quote_user(username), why)
            self._answer(conn, UNAVAILABLE, why)
        elif admitted:
            self._check(conn, address, username, password)
        else:
            self.stats.auth_throttled += 1  # it waits for a place among its address's logins
            self.waiting[conn] = (address, username, password)

    def left(self, conn) -> None:
        """The connection closed: if its login was waiting for a place, it gives it up."""
        waiting = self.waiting.pop(conn, None)
        if waiting is not None:
            self.throttle.withdraw(waiting[0], conn)

    def _check(self, conn, address: str, username: str, password: bytes | None) -> None:
        """The login holds a place of its address: check it (or refuse it if the checks are full)."""
        channel = conn.channel
        if channel is None or channel.state is not AUTHENTICATING:
            self._release(address)  # it left meanwhile
            return
        if self.pending >= self.max_pending:
            self.stats.auth_busy += 1
            why = f"auth.max_pending ({self.max_pending}) password checks waiting"
            self._warn(
                self.loop.time(), "login refused unchecked from %s: user %s: %s", conn.peer, quote_user(username), why
            )
            self._answer(conn, UNAVAILABLE, why)
            self._release(address)
            return
        self.pending += 1
        future = self.loop.run_in_executor(self._executor(), self.auth.check_slow, username, password)
        future.add_done_callback(functools.partial(self._checked, conn, address, username, password))

    def _checked(self, conn, address: str, username: str, password: bytes | None, future) -> None:
        self.pending -= 1
        now = self.loop.time()
        if future.cancelled():
            return  # the node is stopping
        error = future.exception()
        if error is not None:  # pragma: no cover (check_slow catches what it expects)
            log.error("password check failed: %r", error)
            self._answer(conn, UNAVAILABLE, "password check failed")
            self._release(address)
            return
        rc = future.result()
        if rc == ACCEPTED:
            self.auth.remember(username, password)
            self._answer(conn, ACCEPTED)
            self._release(address)
            return
        # counted even when the client already left: hanging up early buys no guesses
        hold = self.throttle.failed(address, username, now)
        self.stats.auth_failures += 1
        throttle = self.throttle
        self._warn(
            now,
            "login failed from %s: user %s (failures: %d from %s, %d for this user name; answer held %gs)",
            conn.peer,
            quote_user(username),
            throttle.failures("a", address, now),
            address,
            throttle.failures("u", username, now),
            hold,
        )
        if hold <= 0:
            self._answer(conn, rc)
            self._release(address)
            return
        self.stats.auth_throttled += 1
        self.held += 1
        self.loop.call_later(hold, self._due, conn, address, rc)

    def _due(self, conn, address: str, rc: int) -> None:
        """A held failure's answer is due (sent if its client is still there); its place frees."""
        self.held -= 1
        self._answer(conn, rc)
        self._release(address)

    def _release(self, address: str) -> None:
        """A place of the address frees: the first login still waiting for one is checked."""
        while True:
            conn = self.throttle.release(address)
            if conn is None:
                return
            waiting = self.waiting.pop(conn, None)
            if waiting is not None:
                self._check(conn, *waiting)
                return
            # (a connection that left without ``left``: it gives its place straight back)

    def _answer(self, conn, rc: int, why: str = "") -> None:
        channel = conn.channel
        if channel is None or channel.state is not AUTHENTICATING:
            return  # the connection ended meanwhile
        channel.authenticated(rc, self.loop.time(), why)
        if channel.state is CONNECTED:
            conn.connected()

    def _executor(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(
                self.workers, thread_name_prefix="mqttmesh-auth", initializer=_lower_priority, initargs=(self.nice,)
            )
        return self._pool

    # -- logging, bounded ------------------------------------------------------------------

    def _warn(self, now: float, fmt: str, *args) -> None:
        if self.budget.allow(now):
            log.warning(fmt, *args)
        elif self._summary is None:
            self._summary = self.loop.call_later(SUMMARY_AFTER, self._log_summary)

    def _log_summary(self) -> None:
        self._summary = None
        n = self.budget.take_suppressed()
        if n:
            log.warning(
                "%d more login failures or refusals not logged (auth.log_rate %g lines/s); "
                "$SYS/broker/connections/auth_failures and auth_throttled count them all",
                n,
                self.budget.rate,
            )
