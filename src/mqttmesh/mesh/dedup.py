"""Duplicate filters with bounded memory.

Pure. ``ForwardFilter`` remembers, per copy of a message (origin, sequence,
attempt), the destinations this node already handled, so a copy that comes
round again is not forwarded twice. ``DeliveryFilter`` remembers which
messages were delivered here, so a retransmission reaches local subscribers
once. Both forget the oldest entries beyond their capacity.
"""

from __future__ import annotations

from collections import OrderedDict

__all__ = ["ForwardFilter", "DeliveryFilter"]


class ForwardFilter:
    def __init__(self, capacity: int = 65536):
        self.capacity = capacity
        self._seen: OrderedDict[tuple, set] = OrderedDict()

    def __len__(self) -> int:
        return len(self._seen)

    def claim(self, key: tuple, dests: list[str]) -> list[str]:
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
    """Per origin: the recent sequence numbers delivered, and the floor of what was forgotten.

    The set is trimmed to the ``window`` newest entries whenever it doubles, so
    the cost per message stays one set lookup and one insert. A message older
    than the floor cannot be told apart any more: a QoS 2 one is taken as seen
    (exactly once may not become twice), anything else as new (at least once may
    not become never). Retransmissions come within seconds, so with the default
    window this only matters for an origin sending hundreds of thousands of
    messages to this node in that time.
    """

    def __init__(self, window: int = 65536):
        self.window = window
        self._origins: dict[str, list] = {}   # origin -> [members, floor]

    def seen(self, origin: str, seq: int, qos: int = 1) -> bool:
        """True if (origin, seq) was delivered before; otherwise remember it and say False."""
        state = self._origins.get(origin)
        if state is None:
            state = self._origins[origin] = [set(), -1]
        members = state[0]
        if seq in members:
            return True
        if seq <= state[1]:
            return qos == 2
        members.add(seq)
        if len(members) > 2 * self.window:
            newest = sorted(members)
            state[1] = newest[-self.window - 1]
            state[0] = set(newest[-self.window:])
        return False

    def forget_origin(self, origin: str) -> None:
        self._origins.pop(origin, None)

    def __len__(self) -> int:
        return sum(len(s[0]) for s in self._origins.values())
