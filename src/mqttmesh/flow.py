"""Flow control: a congested session slows the publishers it waits for, for a bounded time.

Pure. A session (or a peer link) is *congested* while it is online and either its queue is
over the high-water mark or its socket's send buffer is full (the I/O layer says so). A
publisher whose message reached a congested session stops being read until every session it
waits for is clear, so TCP pushes back on it and nobody else. No publisher waits longer than
``backpressure_timeout``: a session still congested that long after it first held a
publisher back stops holding anyone back until it is clear again, and what it is sent
meanwhile is queued or dropped by its own limits (session.py), and counted. A session
congested for longer than the slow-consumer ``timeout`` without progress is reported by
``sweep`` for the I/O layer to drop.

It leaves to its caller the clock (``pause``, ``expire`` and ``sweep`` take ``now``; the
caller calls ``expire`` at least every ``backpressure_timeout / 4``) and the sockets: a
paused publisher is a ``ports.Pausable`` (a Channel, a peer link) whose ``pause_reading()``
and ``resume_reading()`` stop and restart reading it.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .ports import Pausable

__all__ = ["Congestion"]


class Congestion:
    def __init__(self, timeout: float = 5.0, backpressure_timeout: float = 1.0):
        self.timeout = timeout  # slow consumer: dropped after this
        self.backpressure_timeout = backpressure_timeout  # longest a publisher waits
        self.reasons: dict[Hashable, set[str]] = {}  # session -> {"queue", "socket"}
        self.since: dict[Hashable, tuple[float, Any]] = {}  # session -> (last progress, marker)
        self.holding: dict[Hashable, float] = {}  # session -> when it first held a publisher back
        self.overrun: set[Hashable] = set()  # congested past the bound: holds no one back
        self.waiting: dict[Hashable, set[Pausable]] = {}  # session -> publishers paused for it
        self.paused: dict[Pausable, tuple[float, set[Hashable]]] = {}  # publisher -> (paused at, sessions it waits for)
        self.hit = False  # the last dispatch reached a congested session ...
        self.hit_sessions: list[Hashable] = []  # ... these ones (valid while ``hit``)
        self.pauses = 0  # publishers paused, ever
        self.released = 0  # publishers read again because the bound passed, ever

    def __bool__(self) -> bool:
        return bool(self.reasons)

    # -- sessions becoming congested and clear -------------------------------------------------

    def add(self, session: Hashable, reason: str) -> None:
        self.reasons.setdefault(session, set()).add(reason)

    def remove(self, session: Hashable, reason: str) -> None:
        reasons = self.reasons.get(session)
        if reasons is None:
            return
        reasons.discard(reason)
        if not reasons:
            del self.reasons[session]
            self._cleared(session)

    def forget(self, session: Hashable) -> None:
        """The session went offline (or the link down): it holds no one back any more."""
        if self.reasons.pop(session, None) is not None:
            self._cleared(session)

    def _cleared(self, session: Hashable) -> None:
        self.since.pop(session, None)
        self.holding.pop(session, None)
        self.overrun.discard(session)
        self._release(session)

    def _release(self, session: Hashable) -> None:
        """Publishers stop waiting for ``session``; those that wait for nothing else resume."""
        for channel in self.waiting.pop(session, ()):
            entry = self.paused.get(channel)
            if entry is not None:
                entry[1].discard(session)
                if not entry[1]:
                    self._resume(channel)

    # -- the hot path: did this message reach a congested session? ------------------------------

    def check(self, sessions: Iterable[Hashable]) -> None:
        """Called by dispatch (only while something is congested) with the sessions reached."""
        reasons = self.reasons
        overrun = self.overrun
        for session in sessions:
            if session in reasons and session not in overrun:
                self.note(session)

    def note(self, session: Hashable) -> None:
        """The message being handled reached ``session``, which is congested."""
        if self.hit:
            self.hit_sessions.append(session)
        else:
            self.hit = True
            self.hit_sessions = [session]

    def pause(self, channel: Pausable, now: float) -> None:
        """Stop reading ``channel``: what it published reached the sessions of the last hit."""
        sessions = self.hit_sessions if self.hit else []
        self.hit = False
        self.hit_sessions = []
        if self.backpressure_timeout <= 0:
            return  # publishers are never held back: congested sessions queue or drop
        entry = self.paused.get(channel)
        fresh = entry is None
        if entry is None:
            entry = self.paused[channel] = (now, set())
        waits = entry[1]
        for session in sessions:
            if session in self.reasons and session not in self.overrun:
                waits.add(session)
                self.waiting.setdefault(session, set()).add(channel)
                self.holding.setdefault(session, now)
        if not waits:
            del self.paused[channel]
            return
        if fresh:
            self.pauses += 1
            channel.pause_reading()

    def unpause(self, channel: Pausable) -> None:
        """``channel`` closed: forget it without touching its socket."""
        entry = self.paused.pop(channel, None)
        if entry is not None:
            for session in entry[1]:
                waiting = self.waiting.get(session)
                if waiting is not None:
                    waiting.discard(channel)

    def _resume(self, channel: Pausable) -> None:
        entry = self.paused.pop(channel, None)
        if entry is None:
            return
        for session in entry[1]:
            waiting = self.waiting.get(session)
            if waiting is not None:
                waiting.discard(channel)
        channel.resume_reading()  # (which a publisher closed meanwhile ignores)

    def resume_all(self) -> None:
        for channel in list(self.paused):
            self._resume(channel)

    # -- time -----------------------------------------------------------------------------------

    def expire(self, now: float) -> int:
        """Sessions that have held publishers back for ``backpressure_timeout`` stop doing so
        (until they are clear again); the number of publishers this resumed."""
        limit = self.backpressure_timeout
        before = len(self.paused)
        for session, start in list(self.holding.items()):
            if now - start >= limit:
                del self.holding[session]
                self.overrun.add(session)
                self._release(session)
        for channel, (paused_at, _) in list(self.paused.items()):
            if now - paused_at >= limit:  # (a session that went away without being cleared)
                self._resume(channel)
        resumed = before - len(self.paused)
        self.released += resumed
        return resumed

    def sweep(self, now: float, progress: Callable[[Any], Any]) -> list[Hashable]:
        """Sessions congested with no progress for longer than ``timeout`` (to be dropped).

        ``progress(session)`` returns a value that changes when the session's
        client takes messages (e.g. acknowledgements and bytes drained).
        """
        expired: list[Hashable] = []
        for session in self.reasons:
            marker = progress(session)
            seen = self.since.get(session)
            if seen is None or seen[1] != marker:
                self.since[session] = (now, marker)
            elif now - seen[0] >= self.timeout:
                expired.append(session)
        return expired
