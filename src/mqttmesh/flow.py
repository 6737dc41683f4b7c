"""Flow control: publishers wait while the sessions they feed cannot keep up.

Pure. A session is congested while it is online and either its queue is over
the high-water mark or its socket's send buffer is full (the I/O layer says
so). A publisher whose message reached a congested session stops being read
until no session is congested; a session congested for longer than the
slow-consumer timeout *without making progress* (acknowledging messages,
draining its socket) is disconnected, so one stuck reader cannot hold the
publishers back for long. It leaves to its caller the clock (``sweep(now)``)
and the sockets (``owner.pause_reading``/``resume_reading`` of a Channel).
"""

from __future__ import annotations

__all__ = ["Congestion"]


class Congestion:
    def __init__(self, timeout: float = 5.0):
        self.timeout = timeout
        self.reasons: dict = {}     # session -> set of reasons ("queue", "socket")
        self.since: dict = {}       # session -> (time of last progress, progress marker)
        self.paused: set = set()    # publisher channels not being read
        self.hit = False            # the last dispatch reached a congested session
        self.pauses = 0             # publishers paused, ever (for stats)

    def __bool__(self) -> bool:
        return bool(self.reasons)

    def add(self, session, reason: str) -> None:
        self.reasons.setdefault(session, set()).add(reason)

    def remove(self, session, reason: str) -> None:
        reasons = self.reasons.get(session)
        if reasons is None:
            return
        reasons.discard(reason)
        if not reasons:
            del self.reasons[session]
            self.since.pop(session, None)
            if not self.reasons:
                self.resume_all()

    def forget(self, session) -> None:
        if self.reasons.pop(session, None) is not None:
            self.since.pop(session, None)
            if not self.reasons:
                self.resume_all()

    def check(self, sessions) -> None:
        """Called by dispatch with the sessions a message reached."""
        reasons = self.reasons
        for session in sessions:
            if session in reasons:
                self.hit = True
                return

    def pause(self, channel) -> None:
        if channel not in self.paused:
            self.paused.add(channel)
            self.pauses += 1
            channel.owner.pause_reading(channel)

    def resume_all(self) -> None:
        paused, self.paused = self.paused, set()
        for channel in paused:
            if channel.state == "connected":
                channel.owner.resume_reading(channel)

    def sweep(self, now: float, progress) -> list:
        """Sessions congested with no progress for longer than the timeout (to be dropped).

        ``progress(session)`` returns a value that changes when the session's
        client takes messages (e.g. acknowledgements and bytes drained).
        """
        expired = []
        for session in self.reasons:
            marker = progress(session)
            seen = self.since.get(session)
            if seen is None or seen[1] != marker:
                self.since[session] = (now, marker)
            elif now - seen[0] >= self.timeout:
                expired.append(session)
        return expired
