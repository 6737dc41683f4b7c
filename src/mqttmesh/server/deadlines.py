"""The connections' deadlines (each one's connect timeout, then its keepalive) on one timer of
the event loop, not on a timer each.

A timer of the loop for every connection costs an idle client more than its Channel and its
Session together (under uvloop a TimerHandle, a libuv timer and its context: about 660 bytes
a client with a keep alive); an entry here is a three-item list. The times are the ones the
connections ask for, to the loop's precision, as with a timer each: the earliest deadline
is the loop timer's, and whatever is due when it fires is called in deadline order.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
from typing import Any, Protocol

log = logging.getLogger("mqttmesh.connection")

# dead entries (cancelled before they were due: every connect cancels its connect timeout's)
# are dropped from the heap once they are a fifth of it, and at least this many: a deadline
# cancelled keeps no connection alive in the meantime (``cancel`` lets go of it at once), only
# its three-item list, and rebuilding the heap costs a few steps per cancel
COMPACT_AT = 256

Entry = list[Any]  # [when, sequence number (ties: first added, first called), target or None]


class Due(Protocol):
    def on_deadline(self) -> None:
        """Its deadline came (the target arms the next one itself, if it wants one)."""


class Deadlines:
    __slots__ = ("_loop", "_heap", "_handle", "_at", "_dead", "_seq", "_firing")

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self._loop = loop
        self._heap: list[Entry] = []
        self._handle: asyncio.TimerHandle | None = None
        self._at = 0.0  # when the loop timer fires (while there is one)
        self._dead = 0  # cancelled entries still in the heap
        self._seq = itertools.count()
        self._firing = False  # (what is added meanwhile is scheduled once the due ones are called)

    def __len__(self) -> int:
        """Deadlines pending (cancelled ones not counted)."""
        return len(self._heap) - self._dead

    def add(self, when: float, target: Due) -> Entry:
        """``target.on_deadline()`` at ``when`` (loop time), unless the entry returned is
        cancelled first."""
        entry = [when, next(self._seq), target]
        heapq.heappush(self._heap, entry)
        if not self._firing and (self._handle is None or when < self._at):
            self._schedule(when)
        return entry

    def cancel(self, entry: Entry) -> None:
        if entry[2] is None:
            return  # (called already, or cancelled)
        entry[2] = None
        if entry[1] < 0:
            return  # (taken from the heap as due, not called yet: ``_fire`` skips it)
        self._dead += 1
        heap = self._heap
        if self._dead >= COMPACT_AT and self._dead * 5 > len(heap):
            live = [e for e in heap if e[2] is not None]
            heapq.heapify(live)
            self._heap = live
            self._dead = 0

    def close(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _schedule(self, when: float) -> None:
        if self._handle is not None:
            self._handle.cancel()
        self._at = when
        self._handle = self._loop.call_at(when, self._fire)

    def _fire(self) -> None:
        self._handle = None
        now = self._loop.time()
        heap = self._heap
        due = []
        while heap and heap[0][0] <= now:
            entry = heapq.heappop(heap)
            if entry[2] is None:
                self._dead -= 1
            else:
                entry[1] = -1  # (out of the heap)
                due.append(entry)
        self._firing = True
        try:
            for entry in due:  # in deadline order; what they arm comes after now
                target = entry[2]
                if target is None:
                    continue  # cancelled by one called before it
                entry[2] = None
                try:
                    target.on_deadline()
                except Exception:  # one connection's failure is its own: the others go on
                    log.exception("a connection's deadline failed")
        finally:
            self._firing = False
        heap = self._heap  # (``cancel`` may have compacted it meanwhile)
        while heap and heap[0][2] is None:
            heapq.heappop(heap)
            self._dead -= 1
        if heap:
            self._schedule(heap[0][0])
