"""The interest index: which nodes subscribe to filters matching a topic.

Pure. It leaves to its caller where the filters come from (interest
advertisements) and what a node id means.

Every node of the mesh holds every other node's distinct filters, so at a
thousand nodes each engine indexes about as many filters as the whole mesh has
(100,000 in the scale simulation). A topic trie (``topics.SubscriptionTrie``)
pays a few hundred bytes and a handful of objects per filter; this index pays
one dict entry. Filters are grouped by *shape* (number of levels, positions of
``+``, trailing ``#``), and a topic is matched by building, for each shape
present, the one filter string of that shape that would match it and looking it
up: tuple space search, as packet classifiers do. The number of shapes in use
is small (a deployment's filters follow a few patterns), so a match costs a few
dict lookups whatever the number of filters. Semantics are those of section 4.7
of MQTT 3.1.1 and of ``SubscriptionTrie`` (tests/mesh/test_interest.py checks
the two against each other and against the reference matcher).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

__all__ = ["InterestIndex"]


# A filter's shape is a function of its text. In one process that runs many engines (the
# simulator) every engine indexes the same filters, so the shapes are remembered once.
_Shape = tuple[int, tuple[int, ...], bool]  # (prefix length, positions of '+', ends with '#')
_SHAPES: dict[str, _Shape] = {}
_SHAPES_LIMIT = 1 << 20


def _shape(topic_filter: str) -> _Shape:
    """(prefix length, positions of '+' in the prefix, ends with '#')."""
    shape = _SHAPES.get(topic_filter)
    if shape is None:
        levels = topic_filter.split("/")
        multi = levels[-1] == "#"
        if multi:
            levels.pop()
        shape = (len(levels), tuple(i for i, level in enumerate(levels) if level == "+"), multi)
        if len(_SHAPES) >= _SHAPES_LIMIT:
            _SHAPES.clear()
        _SHAPES[topic_filter] = shape
    return shape


class InterestIndex:
    """Filters -> {node: 0}; ``match`` gives each node once, like SubscriptionTrie.match."""

    def __init__(self, cache_size: int = 65536):
        # filter -> its one holder (a node id), or a set of them when several nodes share it;
        # a bare string for the common case saves a set per filter
        self._holders: dict[str, str | set[str]] = {}
        self._shapes: dict[_Shape, int] = {}  # shape -> number of filters of that shape
        self._exact: dict[int, list[tuple[int, ...]]] = {}  # levels -> '+' positions (no '#')
        self._multi: list[tuple[int, tuple[int, ...]]] = []  # (prefix length, '+' positions) of '#'
        self._cache: dict[str, dict[str, int]] = {}
        self._cache_size = cache_size

    def __len__(self) -> int:
        return len(self._holders)

    def filters(self) -> Iterator[str]:
        return iter(self._holders)

    def add(self, topic_filter: str, node: str) -> bool:
        """Add ``node`` as a holder of ``topic_filter``; True when the filter is new."""
        holders = self._holders.get(topic_filter)
        if holders is None:
            self._holders[topic_filter] = node
            shape = _shape(topic_filter)
            count = self._shapes.get(shape, 0)
            self._shapes[shape] = count + 1
            if not count:
                self._reshape()
            self._cache.clear()
            return True
        if isinstance(holders, str):
            if holders != node:
                self._holders[topic_filter] = {holders, node}
                self._cache.clear()
        elif node not in holders:
            holders.add(node)
            self._cache.clear()
        return False

    def add_all(self, filters: Iterable[str], node: str) -> None:
        """``add`` for each filter (a node's whole interest arrives at once: one loop, one reshape)."""
        holders = self._holders
        shapes = self._shapes
        known = _SHAPES
        reshape = changed = False
        for topic_filter in filters:
            have = holders.get(topic_filter)
            if have is None:
                holders[topic_filter] = node
                shape = known.get(topic_filter) or _shape(topic_filter)
                count = shapes.get(shape, 0)
                shapes[shape] = count + 1
                reshape = reshape or not count
                changed = True
            elif isinstance(have, str):
                if have != node:
                    holders[topic_filter] = {have, node}
                    changed = True
            elif node not in have:
                have.add(node)
                changed = True
        if reshape:
            self._reshape()
        if changed:
            self._cache.clear()

    def remove(self, topic_filter: str, node: str) -> bool:
        """Remove ``node`` as a holder; True when the filter has no holder left."""
        holders = self._holders.get(topic_filter)
        if holders is None:
            return False
        if isinstance(holders, str):
            if holders != node:
                return False
            del self._holders[topic_filter]
            shape = _shape(topic_filter)
            count = self._shapes[shape] - 1
            if count:
                self._shapes[shape] = count
            else:
                del self._shapes[shape]
                self._reshape()
            self._cache.clear()
            return True
        if node not in holders:
            return False
        holders.discard(node)
        if len(holders) == 1:
            self._holders[topic_filter] = next(iter(holders))
        self._cache.clear()
        return False

    def _reshape(self) -> None:
        exact: dict[int, list[tuple[int, ...]]] = {}
        multi: list[tuple[int, tuple[int, ...]]] = []
        for length, plus, is_multi in sorted(self._shapes):
            if is_multi:
                multi.append((length, plus))
            else:
                exact.setdefault(length, []).append(plus)
        self._exact, self._multi = exact, multi

    def match(self, topic: str) -> dict[str, int]:
        """{node: 0} for every node holding a filter that matches ``topic``.

        The returned dict is shared with the cache: callers must not modify it.
        """
        hit = self._cache.get(topic)
        if hit is not None:
            return hit
        result: dict[str, int] = {}
        holders = self._holders
        levels = topic.split("/")
        n = len(levels)
        dollar = topic[:1] == "$"  # [MQTT-4.7.2-1]: no wildcard at the first level matches it
        for plus in self._exact.get(n, ()):
            if not plus:
                key = topic
            elif dollar and plus[0] == 0:
                continue
            else:
                parts = list(levels)
                for i in plus:
                    parts[i] = "+"
                key = "/".join(parts)
            _merge(result, holders.get(key))
        for length, plus in self._multi:
            if length > n:
                break  # sorted by prefix length
            if dollar and (length == 0 or (plus and plus[0] == 0)):
                continue
            if length == 0:
                key = "#"
            else:
                parts = levels[:length]
                for i in plus:
                    parts[i] = "+"
                key = "/".join(parts) + "/#"  # "a/#" also matches "a" (4.7.1.2)
            _merge(result, holders.get(key))
        if len(self._cache) >= self._cache_size:
            self._cache.clear()
        self._cache[topic] = result
        return result


def _merge(result: dict[str, int], holders: str | set[str] | None) -> None:
    if holders is None:
        return
    if isinstance(holders, str):
        result[holders] = 0
    else:
        for node in sorted(holders):  # sorted: the same order in every run
            result[node] = 0
