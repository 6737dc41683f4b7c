"""The archive where it meets the broker's hot path: one object the cores are given.

Pure. ``Capture`` is the node's ``ports.ArchivePort``: the Broker hands it each message
published here that a read capture did not take (to ``other_origin`` the rare one that has
another node's id, which the archive records as its origin), every session calls its ``sent`` for
the delivery log, and a Channel asks it for a ``ReadCapture`` at the start of each read
from a connected client. The Recorder (archive/recorder.py) makes the records, chunks
and counts; this module only decides which of its hooks a message goes to.

A ReadCapture is the Channel's half of a captured read (archive/reads.py): the Decoder
appends the read's whole packets to ``keep``, and the Channel says, PUBLISH packet by
PUBLISH packet, which became a message with which seq and which did not. It keeps that
as few numbers as possible, since ``message`` runs once per message: a new segment only
when a seq does not follow the one before (a will, a peer's message or a message of
another client's read came between), and a skip's ordinal.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..message import Message
    from ..ports import SentHook
    from .recorder import Recorder

__all__ = ["Capture", "ReadCapture", "ReadsHook"]

# (publisher, wall time, packets, segments, skips, count): the recorder's capture hook
ReadsHook = Callable[[str, float, list[bytearray], list[tuple[int, int]], "list[int] | tuple[()]", int], None]


class Capture:
    """The ArchivePort of a node with the archive on (built by server/archive.py).

    ``published`` and ``sent`` are the recorder's hooks themselves, not methods that call
    them, so that a message costs the Broker and the sessions one call each, as it did
    when the hooks were attributes of the Broker.
    """

    __slots__ = ("published", "other_origin", "sent", "_reads")

    def __init__(self, recorder: Recorder) -> None:
        self.published: Callable[[Message], None] = recorder.publish_hook
        self.other_origin: Callable[[Message], None] = recorder.other_origin_hook
        # (None unless archive.delivery_log: the recorder made no delivery hook)
        self.sent: SentHook | None = recorder.delivery_hook
        # None with topic filters: the Broker's published() picks the messages one by one
        self._reads: ReadsHook | None = recorder.capture_hook

    def read(self, client_id: str) -> ReadCapture | None:
        reads = self._reads
        return None if reads is None else ReadCapture(reads, client_id)


class ReadCapture:
    """One read from one client: the ordinals of its PUBLISH packets and their seqs.

    Ordinals count the read's PUBLISH packets from 0. ``segments`` are (ordinal, seq)
    pairs: the message of that ordinal got ``seq``, each following one the next number,
    up to the next segment or skip. ``skips`` are ordinals of PUBLISH packets that became
    no message (a tuple until the first, which is rare). ``end`` hands the read to the
    recorder with ``count``, the PUBLISH packets handled (a read cut short by a protocol
    error has packets after them), unless none of them became a message.
    """

    __slots__ = ("keep", "_hook", "_publisher", "_next", "_base", "_segments", "_skips")

    def __init__(self, hook: ReadsHook, publisher: str) -> None:
        self.keep: list[bytearray] = []
        self._hook = hook
        self._publisher = publisher
        self._next = -1  # the seq that continues the last segment; -1: none since the last skip
        self._base = 0  # the ordinal after the last skip
        self._segments: list[tuple[int, int]] = []
        self._skips: list[int] | tuple[()] = ()

    def message(self, seq: int) -> None:
        if seq != self._next:
            self._segments.append((self._ordinal(), seq))
        self._next = seq + 1

    def skip(self) -> None:
        ordinal = self._ordinal()
        if isinstance(self._skips, tuple):
            self._skips = []
        self._skips.append(ordinal)
        self._base = ordinal + 1
        self._next = -1

    def _ordinal(self) -> int:
        """The ordinal of the next PUBLISH packet."""
        if self._next < 0:
            return self._base
        ordinal, seq = self._segments[-1]
        return ordinal + self._next - seq

    def end(self, wall: float) -> None:
        if self._next < 0 and not self._skips:
            return  # no PUBLISH packet was handled
        count = self._ordinal()
        if count > len(self._skips):
            self._hook(self._publisher, wall, self.keep, self._segments, self._skips, count)
