"""Topic tries: topic filters -> subscribers, and topic names -> retained values.

Pure data structures (section 4.7 of MQTT 3.1.1). They leave to their caller
what a subscriber is (a session, a mesh node) and what a retained value holds.
"""

from __future__ import annotations

from collections.abc import Iterator
from types import MappingProxyType
from typing import Any, TypeAlias, cast

__all__ = ["filter_matches", "SubscriptionTrie", "RetainedTrie"]


def filter_matches(topic_filter: str, topic: str) -> bool:
    """Reference matcher for one filter and one topic name (section 4.7)."""
    if topic.startswith("$") and topic_filter[:1] in ("+", "#"):
        return False  # [MQTT-4.7.2-1]
    f_levels = topic_filter.split("/")
    t_levels = topic.split("/")
    for i, f in enumerate(f_levels):
        if f == "#":
            return True
        if i >= len(t_levels):
            return False
        if f != "+" and f != t_levels[i]:
            return False
    return len(f_levels) == len(t_levels)


# the children of a leaf (most nodes: a subscription's last level): one read-only empty
# mapping for all of them, so that a leaf keeps no empty dict (``child`` makes one)
NO_CHILDREN: dict[str, Any] = cast("dict[str, Any]", MappingProxyType({}))


class _Node:
    __slots__ = ("children", "subs")

    def __init__(self) -> None:
        self.children: dict[str, _Node] = NO_CHILDREN
        self.subs: dict[Any, int] | None = None

    def child(self, level: str) -> _Node:
        """The child at ``level``, made if missing."""
        children = self.children
        child = children.get(level)
        if child is None:
            if children is NO_CHILDREN:
                children = self.children = {}
            child = children[level] = _Node()
        return child


# The subscribers of one filter (``_Level.subs``, ``_Level.rest``): None, one
# (subscriber, qos) pair, or a dict {subscriber: qos} from the second on. Most filters have a
# single subscriber (a device's own topics): a pair is 56 bytes where a one-entry dict is
# about 220, and an idle client's subscription costs what its level of the trie does.
Subscribers: TypeAlias = "tuple[Any, int] | dict[Any, int] | None"


class _Level:
    """A level of the subscription trie: the filters that end here (``subs``), those that
    end here with a multi-level wildcard, ``<this level>/#`` (``rest``: no child node and no
    children dict for the ``#``), and the levels below."""

    __slots__ = ("children", "subs", "rest")

    def __init__(self) -> None:
        self.children: dict[str, _Level] = NO_CHILDREN
        self.subs: Subscribers = None
        self.rest: Subscribers = None

    def child(self, level: str) -> _Level:
        """The child at ``level``, made if missing."""
        children = self.children
        child = children.get(level)
        if child is None:
            if children is NO_CHILDREN:
                children = self.children = {}
            child = children[level] = _Level()
        return child


def _with(subs: Subscribers, subscriber: Any, qos: int) -> Subscribers:
    """``subs`` with ``subscriber`` at ``qos`` (added, or its QoS replaced in place)."""
    if subs is None:
        return (subscriber, qos)
    if type(subs) is dict:
        subs[subscriber] = qos
        return subs
    one, its_qos = cast("tuple[Any, int]", subs)
    if one == subscriber:
        return (one, qos)  # (the subscriber it had stays, as a dict keeps its key)
    return {one: its_qos, subscriber: qos}


def _has(subs: Subscribers, subscriber: Any) -> bool:
    if subs is None:
        return False
    if type(subs) is dict:
        return subscriber in subs
    return bool(cast("tuple[Any, int]", subs)[0] == subscriber)


def _without(subs: Subscribers, subscriber: Any) -> Subscribers:
    """``subs`` less ``subscriber`` (who is in it); None when nobody is left."""
    if type(subs) is not dict:
        return None  # (a pair: its one subscriber leaves)
    del subs[subscriber]
    if len(subs) == 1:
        return next(iter(subs.items()))
    return subs


class SubscriptionTrie:
    """Maps topic filters to {subscriber: qos}; ``match`` gives each subscriber once.

    Overlapping filters of one subscriber give one entry at the highest QoS
    [MQTT-3.3.5-1]. Results are cached per topic until the next change.
    """

    def __init__(self, cache_size: int = 65536):
        self._root = _Level()
        self._cache: dict[str, dict[Any, int]] = {}
        self._cache_size = cache_size
        self._count = 0  # filters with a subscriber (each level knows its own)

    def __len__(self) -> int:
        return self._count

    def filters(self) -> Iterator[str]:
        stack: list[tuple[_Level, list[str]]] = [(self._root, [])]
        while stack:
            node, path = stack.pop()
            if node.subs is not None:
                yield "/".join(path)
            if node.rest is not None:
                yield "/".join([*path, "#"])
            for level, child in node.children.items():
                stack.append((child, [*path, level]))

    def add(self, topic_filter: str, subscriber: Any, qos: int) -> bool:
        """Add or replace one subscription; True when the filter is new to the trie."""
        node = self._root
        levels = topic_filter.split("/")
        rest = levels[-1] == "#"
        if rest:
            levels.pop()
        for level in levels:
            node = node.child(level)
        subs = node.rest if rest else node.subs
        new_filter = subs is None
        if new_filter:
            self._count += 1
        if rest:
            node.rest = _with(subs, subscriber, qos)
        else:
            node.subs = _with(subs, subscriber, qos)
        self._cache.clear()
        return new_filter

    def remove(self, topic_filter: str, subscriber: Any) -> bool:
        """Remove one subscription; True when the filter has no subscriber left."""
        levels = topic_filter.split("/")
        rest = levels[-1] == "#"
        if rest:
            levels.pop()
        path = [self._root]
        node = self._root
        for level in levels:
            child = node.children.get(level)
            if child is None:
                return False
            node = child
            path.append(node)
        subs = node.rest if rest else node.subs
        if not _has(subs, subscriber):
            return False
        assert subs is not None
        left = _without(subs, subscriber)
        if rest:
            node.rest = left
        else:
            node.subs = left
        self._cache.clear()
        if left is not None:
            return False
        self._count -= 1
        # prune empty branches so the trie does not grow with churn
        for depth in range(len(levels), 0, -1):
            node = path[depth]
            if node.subs is not None or node.rest is not None or node.children:
                break
            parent = path[depth - 1]
            del parent.children[levels[depth - 1]]
            if not parent.children:
                parent.children = NO_CHILDREN
        return True

    def match(self, topic: str) -> dict[Any, int]:
        """{subscriber: highest granted qos} for every filter matching ``topic``.

        The returned dict is shared with the cache: callers must not modify it.
        """
        hit = self._cache.get(topic)
        if hit is not None:
            return hit
        result: dict[Any, int] = {}
        levels = topic.split("/")
        nodes = [self._root]
        skip_wild = topic.startswith("$")  # [MQTT-4.7.2-1]
        for level in levels:
            next_nodes = []
            for node in nodes:
                if not skip_wild:
                    rest = node.rest  # "<node>/#" matches whatever follows
                    if rest is not None:
                        _merge(result, rest)
                children = node.children
                if not children:
                    continue
                if not skip_wild:
                    plus = children.get("+")
                    if plus is not None:
                        next_nodes.append(plus)
                exact = children.get(level)
                if exact is not None:
                    next_nodes.append(exact)
            skip_wild = False
            nodes = next_nodes
            if not nodes:
                break
        for node in nodes:
            if node.subs is not None:
                _merge(result, node.subs)
            if node.rest is not None:  # "a/#" also matches "a" (4.7.1.2)
                _merge(result, node.rest)
        if len(self._cache) >= self._cache_size:
            self._cache.clear()
        self._cache[topic] = result
        return result


def _merge(result: dict[Any, int], subs: Subscribers) -> None:
    if type(subs) is tuple:
        sub, qos = subs
        old = result.get(sub)
        if old is None or qos > old:
            result[sub] = qos
        return
    for sub, qos in cast("dict[Any, int]", subs).items():
        old = result.get(sub)
        if old is None or qos > old:
            result[sub] = qos


class RetainedTrie:
    """Maps topic names to one retained value each; ``match`` walks a filter."""

    def __init__(self) -> None:
        self._root = _Node()
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def get(self, topic: str) -> Any:
        node = self._root
        for level in topic.split("/"):
            child = node.children.get(level)
            if child is None:
                return None
            node = child
        return node.subs

    def set(self, topic: str, value: Any) -> None:
        node = self._root
        for level in topic.split("/"):
            node = node.child(level)
        if node.subs is None:
            self._count += 1
        node.subs = value

    def delete(self, topic: str) -> bool:
        levels = topic.split("/")
        path = [self._root]
        node = self._root
        for level in levels:
            child = node.children.get(level)
            if child is None:
                return False
            node = child
            path.append(node)
        if node.subs is None:
            return False
        node.subs = None
        self._count -= 1
        for depth in range(len(levels), 0, -1):
            node = path[depth]
            if node.subs is not None or node.children:
                break
            del path[depth - 1].children[levels[depth - 1]]
        return True

    def items(self) -> Iterator[tuple[str, Any]]:
        return _walk(self._root, [])

    def match(self, topic_filter: str) -> Iterator[tuple[str, Any]]:
        """Every (topic, value) whose topic matches ``topic_filter``."""
        f_levels = topic_filter.split("/")
        # (node, index into f_levels, levels walked so far, at top level)
        stack: list[tuple[_Node, int, list[str]]] = [(self._root, 0, [])]
        while stack:
            node, i, path = stack.pop()
            if i == len(f_levels):
                if node.subs is not None:
                    yield "/".join(path), node.subs
                continue
            f = f_levels[i]
            top = i == 0
            if f == "#":
                if node.subs is not None and path:  # "a/#" matches "a"
                    yield "/".join(path), node.subs
                for topic, value in _walk(node, path):
                    if not (top and topic.startswith("$")):
                        yield topic, value
            elif f == "+":
                for level, child in node.children.items():
                    if top and level.startswith("$"):
                        continue  # [MQTT-4.7.2-1]
                    stack.append((child, i + 1, path + [level]))
            else:
                exact = node.children.get(f)
                if exact is not None:
                    stack.append((exact, i + 1, path + [f]))


def _walk(node: _Node, prefix: list[str]) -> Iterator[tuple[str, Any]]:
    stack = [(node, prefix)]
    while stack:
        n, p = stack.pop()
        for level, child in n.children.items():
            path = p + [level]
            if child.subs is not None:
                yield "/".join(path), child.subs
            if child.children:
                stack.append((child, path))
