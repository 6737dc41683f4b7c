"""The engine's interest index matches exactly as MQTT 3.1.1 section 4.7 and the broker's trie do."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mqttmesh.mesh.routing.interest import InterestIndex
from mqttmesh.topics import SubscriptionTrie, filter_matches

# (filter, topic, matches?) written out by hand from the spec's examples
TABLE = [
    ("sport/tennis/player1/#", "sport/tennis/player1", True),  # 4.7.1.2
    ("sport/tennis/player1/#", "sport/tennis/player1/ranking", True),
    ("sport/tennis/player1/#", "sport/tennis/player1/score/wimbledon", True),
    ("sport/#", "sport", True),
    ("sport/tennis/+", "sport/tennis/player1", True),  # 4.7.1.3
    ("sport/tennis/+", "sport/tennis/player1/ranking", False),
    ("sport/+", "sport", False),
    ("sport/+", "sport/", True),
    ("+/+", "/finance", True),
    ("/+", "/finance", True),
    ("+", "/finance", False),
    ("#", "$SYS/broker", False),  # [MQTT-4.7.2-1]
    ("+/monitor/Clients", "$SYS/monitor/Clients", False),
    ("$SYS/#", "$SYS/monitor/Clients", True),
    ("$SYS/monitor/+", "$SYS/monitor/Clients", True),
    ("#", "a", True),
    ("+/#", "a", True),
    ("a/b", "a/b", True),
    ("a/b", "a/b/c", False),
    ("a/+/c", "a//c", True),
    ("", "", True),
]


@pytest.mark.parametrize("topic_filter,topic,expected", TABLE)
def test_spec_examples(topic_filter, topic, expected):
    index = InterestIndex()
    index.add(topic_filter, "n1")
    index.add("unrelated/filter", "n2")
    assert ("n1" in index.match(topic)) is expected


def test_holders_are_counted_per_filter_and_removed_cleanly():
    index = InterestIndex()
    assert index.add("a/#", "n1") is True
    assert index.add("a/#", "n2") is False
    assert index.add("a/#", "n2") is False
    assert set(index.match("a/x")) == {"n1", "n2"}
    assert index.remove("a/#", "n1") is False
    assert set(index.match("a/x")) == {"n2"}
    assert index.remove("a/#", "n3") is False
    assert index.remove("a/#", "n2") is True
    assert index.match("a/x") == {}
    assert len(index) == 0 and list(index.filters()) == []
    index.add_all(["x/+", "y/#", "x/+"], "n1")
    assert len(index) == 2 and set(index.match("x/1")) == {"n1"}


LEVELS_F = ["a", "b", "", "+", "#", "$s"]
LEVELS_T = ["a", "b", "", "$s", "c"]
filters = st.lists(st.sampled_from(LEVELS_F), min_size=1, max_size=4).map("/".join)
topics = st.lists(st.sampled_from(LEVELS_T), min_size=1, max_size=5).map("/".join)
ops = st.lists(st.tuples(st.booleans(), filters, st.sampled_from(["n1", "n2", "n3"])), max_size=40)


@settings(max_examples=300, deadline=None)
@given(ops, st.lists(topics, min_size=1, max_size=10))
def test_same_matches_as_the_trie_and_the_reference(operations, probe):
    index, trie = InterestIndex(), SubscriptionTrie()
    live: set[tuple[str, str]] = set()
    for add, topic_filter, node in operations:
        if add:
            index.add(topic_filter, node) if len(live) % 2 else index.add_all([topic_filter], node)
            trie.add(topic_filter, node, 0)
            live.add((topic_filter, node))
        else:
            assert index.remove(topic_filter, node) == trie.remove(topic_filter, node)
            live.discard((topic_filter, node))
        for topic in probe:
            got = set(index.match(topic))
            assert got == set(trie.match(topic)), (topic, live)
            # the reference matcher knows valid filters only ('#' last, [MQTT-4.7.1-2]); the
            # trie and the index also agree on invalid ones, which SUBSCRIBE never lets in
            valid = {(f, n) for f, n in live if "#" not in f.split("/")[:-1]}
            assert {n for f, n in valid if filter_matches(f, topic)} <= got, (topic, live)
            if valid == live:
                assert got == {n for f, n in live if filter_matches(f, topic)}, (topic, live)
    assert sorted(index.filters()) == sorted({f for f, _ in live})
