"""Password logins: checked off the event loop, throttled, bounded, counted and logged.

The I/O side of ``auth.LoginThrottle`` and ``Auth.check_slow``. A login with a user name
(once there is a password file) goes: throttle (wait, or refuse unchecked), then the
remembered successes, then a queue of at most ``auth.max_pending`` checks run by
``auth.hash_workers`` threads at a lower CPU priority than the event loop. The connection
reads nothing meanwhile (the Channel holds it in AUTHENTICATING) and still counts against
``limits.max_connections``; a client that leaves while it waits is never checked.
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
        )
        self.max_pending = config.get("auth.max_pending")
        self.workers = config.get("auth.hash_workers")
        self.nice = config.get("auth.hash_nice")
        rate = config.get("auth.log_rate")
        self.budget = LogBudget(rate, burst=rate * SUMMARY_AFTER)
        self.pending = 0  # checks handed to the pool and not finished
        self._pool: ThreadPoolExecutor | None = None
        self._summary = None

    def stop(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
        if self._summary is not None:
            self._summary.cancel()

    # -- one login ------------------------------------------------------------------------

    def authenticate(self, conn, username: str, password: bytes | None) -> None:
        now = self.loop.time()
        address = address_key(conn.transport.get_extra_info("peername") if conn.transport else conn.peer)
        wait = self.throttle.wait(address, username, now)
        if wait is None:
            # waiting would take longer than auth.fail_delay_max: refused without a check,
            # so the answer tells nothing about the password
            self.stats.auth_throttled += 1
            why = f"too many failed logins from {address} or as this user; try again later (auth.fail_delay_max)"
            self._warn(now, "login refused unchecked from %s: user %s: %s", conn.peer, quote_user(username), why)
            self._answer(conn, UNAVAILABLE, why)
            return
        if wait > 0:
            self.stats.auth_throttled += 1
            self.loop.call_later(wait, self._check, conn, address, username, password)
        else:
            self._check(conn, address, username, password)

    def _check(self, conn, address: str, username: str, password: bytes | None) -> None:
        now = self.loop.time()
        channel = conn.channel
        if channel is None or channel.state is not AUTHENTICATING:
            self.throttle.abandoned(address, username, now)  # it left while it waited
            return
        if self.auth.remembered(username, password):
            self.throttle.succeeded(address, username, now)
            self._answer(conn, ACCEPTED)
            return
        if self.pending >= self.max_pending:
            self.stats.auth_busy += 1
            self.throttle.abandoned(address, username, now)
            why = f"auth.max_pending ({self.max_pending}) password checks waiting"
            self._warn(now, "login refused unchecked from %s: user %s: %s", conn.peer, quote_user(username), why)
            self._answer(conn, UNAVAILABLE, why)
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
            self.throttle.abandoned(address, username, now)
            self._answer(conn, UNAVAILABLE, "password check failed")
            return
        rc = future.result()
        if rc == ACCEPTED:
            self.throttle.succeeded(address, username, now)
            self.auth.remember(username, password)
        else:
            # counted even when the client already left: hanging up early buys no guesses
            self.throttle.failed(address, username, now)
            self.stats.auth_failures += 1
            throttle = self.throttle
            self._warn(
                now,
                "login failed from %s: user %s (failures: %d from %s, %d for this user name)",
                conn.peer,
                quote_user(username),
                throttle.failures("a", address, now),
                address,
                throttle.failures("u", username, now),
            )
        self._answer(conn, rc)

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
