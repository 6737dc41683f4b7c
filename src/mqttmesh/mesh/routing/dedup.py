"""Duplicate filters with bounded memory.

Pure. ``ForwardFilter`` remembers, per copy of a message (origin, sequence,
attempt), the destinations this node already handled, so a copy that comes
round again is not forwarded twice. ``DeliveryFilter`` remembers which
messages were delivered here, so a retransmission reaches local subscribers
once. Both forget the oldest entries beyond their capacity.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

__all__ = ["ForwardFilter", "DeliveryFilter", "NEW", "SEEN", "WAIT"]

NEW, SEEN, WAIT = 0, 1, 2  # DeliveryFilter.seen_after


class ForwardFilter:
    def __init__(self, capacity: int = 65536):
        self.capacity = capacity
        self._seen: OrderedDict[tuple[str, int, int], set[str]] = OrderedDict()  # (origin, seq, attempt)

    def __len__(self) -> int:
        return len(self._seen)

    def claim(self, key: tuple[str, int, int], dests: list[str]) -> list[str]:
        """The destinations of ``dests`` not yet handled for ``key``; they are now."""
        done = self._seen.get(key)
        if done is None:
            self._seen[key] = set(dests)
            if len(self._seen) > self.capacity:
                self._seen.popitem(last=False)
            return dests
        fresh = [d for d in dests if d not in done]
        done.update(fresh)
        return fresh


class DeliveryFilter:
    """Per origin: the sequence numbers delivered recently, and the floor of what was forgotten.

    Two generations of ``window`` entries each: when the newer one is full the older one
    is forgotten, and the highest number it held becomes the floor, so the cost per message
    stays one or two set lookups and one insert. A message at or below the floor cannot be
    told apart any more: a QoS 2 one is taken as seen (exactly once may not become twice),
    anything else as new (at least once may not become never). Retransmissions come within
    seconds, so with the default window this only matters for an origin sending hundreds
    of thousands of messages to this node in that time.
    """

    def __init__(self, window: int = 65536):
        self.window = window
        # origin -> [newer set, older set, floor, highest in newer, highest in older]
        self._origins: dict[str, list[Any]] = {}

    def seen(self, origin: str, seq: int, qos: int = 1) -> bool:
        """True if (origin, seq) was delivered before; otherwise remember it and say False."""
        state = self._origins.get(origin)
        if state is None:
            state = self._origins[origin] = [set(), set(), -1, -1, -1]
        newer = state[0]
        if seq in newer or seq in state[1]:
            return True
        if seq <= state[2]:
            return qos == 2
        newer.add(seq)
        if seq > state[3]:
            state[3] = seq
        if len(newer) >= self.window:
            state[2] = max(state[2], state[4])  # the older generation is forgotten
            state[1], state[4] = newer, state[3]
            state[0], state[3] = set(), -1
        return False

    def seen_after(self, origin: str, seq: int, prev: int, qos: int) -> int:
        """``seen`` for a message delivered only after ``prev`` (order.py), in one call: SEEN
        if it was delivered before, WAIT (remembering nothing) if ``prev`` was not, else NEW,
        remembered as ``seen`` does. This runs once per QoS 1/2 message from another node."""
        state = self._origins.get(origin)
        if state is None:
            return WAIT
        newer = state[0]
        older = state[1]
        if seq in newer or seq in older:
            return SEEN
        floor = state[2]
        if seq <= floor:
            return SEEN if qos == 2 else NEW
        if prev not in newer and prev not in older and prev > floor:
            return WAIT
        newer.add(seq)
        if seq > state[3]:
            state[3] = seq
        if len(newer) >= self.window:
            state[2] = max(floor, state[4])  # the older generation is forgotten
            state[1], state[4] = newer, state[3]
            state[0], state[3] = set(), -1
        return NEW

    def has(self, origin: str, seq: int) -> bool:
        """Was (origin, seq) delivered? At or below the floor nobody can tell: yes, so that
        nothing waits for it (order.py). Remembers nothing."""
        state = self._origins.get(origin)
        if state is None:
            return False
        return seq in state[0] or seq in state[1] or seq <= state[2]

    def __len__(self) -> int:
        return sum(len(s[0]) + len(s[1]) for s in self._origins.values())
