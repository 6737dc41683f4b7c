"""Flow control: a congested session paces the publishers that feed it to the rate it drains.

Pure. A session (or a peer link) is *congested* while it is online and either its queue is
over the high-water mark or its socket's send buffer is full (the I/O layer says so). A
publisher whose message reached a congested session stops being read: it owes that session
the messages it sent it meanwhile (its *debt*). What the session drains pays the debts of
the publishers it holds back, shared out max-min fairly (water-filling), and a publisher is
read again once it owes nothing to any session. So the node reads the publishers that feed a
congested session no faster than that session drains, and never accepts what it would have
to drop; a publisher that sends now and then (a canary) owes little and goes through at once.
A session that becomes clear releases everyone it holds at once. A peer link is held like a
publisher, but for at most ``backpressure_timeout`` at a time (``hold(..., bounded=True)``):
what it carries for every other session waits with it.

No guarantee rests on a timer firing: a session that makes no progress at all for
``backpressure_timeout`` is *stalled*; it stops holding anyone back until it makes progress
again, and what it is sent meanwhile is queued or dropped by its own limits (session.py),
and counted. A session congested without progress for longer than the slow-consumer
``timeout`` is reported by ``sweep`` for the I/O layer to drop.

It leaves to its caller the clock (``hold``, ``expire`` and ``sweep`` take ``now``; the
caller calls ``expire`` often, every few tens of milliseconds while anything is congested),
the measure of progress (``expire`` and ``sweep`` take ``progress(session)``: messages the
client acknowledged and bytes the kernel took), and the sockets: a paused publisher is a
``ports.Pausable`` (a Channel, a peer link) whose ``pause_reading()`` and
``resume_reading()`` stop and restart reading it.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable
from typing import TYPE_CHECKING, Any

from .ports import NO_HITS, Hits

if TYPE_CHECKING:
    from .ports import Pausable

__all__ = ["NO_HITS", "Congestion", "Hits", "Progress"]

# what ``progress(session)`` returns: (messages acknowledged, bytes the kernel took), ever
Progress = Callable[[Any], tuple[int, int]]

FRAME_BYTES = 80  # a message's size on the wire, until a session has seen its own


class _Held:
    """A congested session's account: what it drained, and what each publisher owes it."""

    __slots__ = ("marker", "progressed_at", "debts", "msgs", "bytes")

    def __init__(self) -> None:
        self.marker: tuple[int, int] | None = None  # the last progress(session) seen
        self.progressed_at = 0.0  # when it last changed
        self.debts: dict[Pausable, float] = {}  # publisher -> messages it sent here while held
        self.msgs = 0  # messages the held publishers sent it, and their bytes: the mean
        self.bytes = 0  # size converts bytes drained into messages drained


class Congestion:
    def __init__(self, timeout: float = 5.0, backpressure_timeout: float = 1.0):
        self.timeout = timeout  # slow consumer: dropped after this without progress
        self.backpressure_timeout = backpressure_timeout  # longest a publisher waits for no progress
        self.reasons: dict[Hashable, set[str]] = {}  # session -> {"queue", "socket"}
        self.held: dict[Hashable, _Held] = {}  # congested session -> its account
        self.stalled: set[Hashable] = set()  # congested, no progress for the bound: hold no one
        self.paused: dict[Pausable, set[Hashable]] = {}  # publisher -> sessions it owes
        # publishers whose wait is capped at backpressure_timeout -> when they were paused: the
        # peer links, whose other traffic (every other session's, the cluster's) waits with them
        self.bounded: dict[Pausable, float] = {}
        self.since: dict[Hashable, tuple[float, Any]] = {}  # sweep: session -> (last progress, marker)
        self.pauses = 0  # publishers paused, ever
        self.paced = 0  # publishers read again because their debts were paid, ever
        self.released = 0  # publishers read again because a session stalled, ever

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
        self.stalled.discard(session)
        held = self.held.pop(session, None)
        if held is not None:
            for publisher in held.debts:
                self._paid(publisher, session)

    def _paid(self, publisher: Pausable, session: Hashable) -> bool:
        """``publisher`` owes ``session`` nothing more; read again if it owes no one (True)."""
        owed = self.paused.get(publisher)
        if owed is None:
            return False
        owed.discard(session)
        if owed:
            return False
        del self.paused[publisher]
        self.bounded.pop(publisher, None)
        publisher.resume_reading()  # (which a publisher closed meanwhile ignores)
        return True

    # -- the hot path: did this message reach a congested session? ------------------------------

    def check(self, sessions: Iterable[Hashable]) -> Hits:
        """The congested sessions (or links) among ``sessions``, those a message reached,
        but not the stalled ones (called by dispatch only while something is congested)."""
        reasons = self.reasons
        stalled = self.stalled
        return [session for session in sessions if session in reasons and session not in stalled] or NO_HITS

    def hold(self, publisher: Pausable | None, hits: Hits, now: float, size: int = 0, bounded: bool = False) -> None:
        """The message (or read) just handled came from ``publisher`` and reached the
        congested sessions ``hits`` (``check``, ``Broker.publish``): it owes each of them one
        message per hit, and is not read until it has paid (``size``: the message's bytes, 0
        if unknown; ``bounded``: nor longer than ``backpressure_timeout``, a peer link).
        ``None``: the message came from no one who can be paused (a closing client)."""
        if publisher is None or self.backpressure_timeout <= 0:
            return  # publishers are never held back: congested sessions queue or drop
        reasons = self.reasons
        owed = self.paused.get(publisher)
        fresh = owed is None
        for session in hits:
            if session not in reasons or session in self.stalled:
                continue
            held = self.held.get(session)
            if held is None:
                held = self.held[session] = _Held()
                held.progressed_at = now
            held.debts[publisher] = held.debts.get(publisher, 0.0) + 1.0
            held.msgs += 1
            held.bytes += size or FRAME_BYTES
            if owed is None:
                owed = self.paused[publisher] = set()
            owed.add(session)
        if fresh and owed:
            self.pauses += 1
            if bounded:
                self.bounded[publisher] = now
            publisher.pause_reading()

    def unpause(self, publisher: Pausable) -> None:
        """``publisher`` closed: forget it without touching its socket."""
        self.bounded.pop(publisher, None)
        for session in self.paused.pop(publisher, ()):
            held = self.held.get(session)
            if held is not None:
                held.debts.pop(publisher, None)

    def resume_all(self) -> None:
        self.bounded.clear()
        for publisher in list(self.paused):
            del self.paused[publisher]
            publisher.resume_reading()
        for held in self.held.values():
            held.debts.clear()

    # -- time -----------------------------------------------------------------------------------

    def expire(self, now: float, progress: Progress) -> int:
        """What each congested session drained since the last call pays the debts of the
        publishers it holds; one that made no progress for ``backpressure_timeout`` stalls
        and releases them all (until it progresses again). The number of publishers resumed."""
        resumed = 0
        limit = self.backpressure_timeout
        for publisher, paused_at in list(self.bounded.items()):
            if now - paused_at >= limit:  # a peer link waited as long as it may
                for session in list(self.paused.get(publisher, ())):
                    held = self.held.get(session)
                    if held is not None:
                        held.debts.pop(publisher, None)
                    if self._paid(publisher, session):
                        self.released += 1
                        resumed += 1
        for session, reasons in list(self.reasons.items()):
            marker = progress(session)
            held = self.held.get(session)
            if held is None:
                held = self.held[session] = _Held()
            if held.marker is None:
                held.marker, held.progressed_at = marker, now
                continue
            acked = marker[0] - held.marker[0]
            drained = marker[1] - held.marker[1]
            if acked <= 0 and drained <= 0:
                if now - held.progressed_at >= limit and session not in self.stalled:
                    self.stalled.add(session)  # it holds no one back until it progresses
                    for publisher in list(held.debts):
                        if self._paid(publisher, session):
                            self.released += 1
                            resumed += 1
                    held.debts.clear()
                continue
            held.marker, held.progressed_at = marker, now
            self.stalled.discard(session)
            if "queue" in reasons:
                taken = float(acked)  # messages leave the queue as the client acknowledges
            else:
                taken = drained / (held.bytes / held.msgs if held.msgs else FRAME_BYTES)
            resumed += self._pay(session, held, taken)
        return resumed

    def _pay(self, session: Hashable, held: _Held, taken: float) -> int:
        """Share ``taken`` messages out among the publishers ``session`` holds, max-min
        fairly: the smallest debts are paid in full, the rest get equal shares."""
        debts = held.debts
        if not debts:
            return 0  # drained with no one waiting: the backlog shrank, nobody owes anything
        credit = taken
        resumed = 0
        waiting = sorted(debts.items(), key=lambda kv: kv[1])
        left = len(waiting)
        for publisher, debt in waiting:
            share = credit / left
            left -= 1
            if debt <= share:
                credit -= debt
                del debts[publisher]
                if self._paid(publisher, session):
                    resumed += 1
            else:
                debts[publisher] = debt - share
                credit -= share
        self.paced += resumed
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
