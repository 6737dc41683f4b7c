"""mqttmesh.topics: the reference matcher, the subscription trie and the retained trie (4.7)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mqttmesh.topics import RetainedTrie, SubscriptionTrie, filter_matches

# --------------------------------------------------------------------------- filter_matches

# The examples of sections 4.7.1.2, 4.7.1.3 and 4.7.2, plus edge cases.
MATCHES = [
    ("sport/tennis/player1/#", "sport/tennis/player1", True),
    ("sport/tennis/player1/#", "sport/tennis/player1/ranking", True),
    ("sport/tennis/player1/#", "sport/tennis/player1/score/wimbledon", True),
    ("sport/#", "sport", True),
    ("#", "sport/tennis", True),
    ("#", "/", True),
    ("sport/tennis/+", "sport/tennis/player1", True),
    ("sport/tennis/+", "sport/tennis/player2", True),
    ("sport/tennis/+", "sport/tennis/player1/ranking", False),
    ("sport/+", "sport", False),
    ("sport/+", "sport/", True),
    ("+/+", "/finance", True),
    ("/+", "/finance", True),
    ("+", "/finance", False),
    ("+", "finance", True),
    ("+/tennis/#", "sport/tennis", True),
    ("a/+/c", "a//c", True),
    ("+/+", "/", True),
    ("a/b", "a/b", True),
    ("a/b", "a/b/c", False),
    ("a/b/c", "a/b", False),
    ("a/b", "a", False),
    ("a/#", "ab", False),
    ("a/#", "a/", True),
    # [MQTT-4.7.2-1] topics starting with $
    ("#", "$SYS/broker", False),
    ("#", "$SYS", False),
    ("+/monitor/Clients", "$SYS/monitor/Clients", False),
    ("+/#", "$x", False),
    ("+", "$x", False),
    ("$SYS/#", "$SYS/monitor/Clients", True),
    ("$SYS/#", "$SYS", True),
    ("$SYS/monitor/+", "$SYS/monitor/Clients", True),
    ("$x", "$x", True),
    ("a/#", "a/$b", True),
    ("a/+", "a/$b", True),
    ("+/$b", "a/$b", True),
    # [MQTT-4.7.3-4] no normalization: case, separators and Unicode forms are compared as is
    ("a/b", "A/b", False),
    ("a/b", "a//b", False),
    ("a/b", "a/b/", False),
    ("a/b", "/a/b", False),
    ("\u00e9", "e\u0301", False),
    ("a /b", "a/b", False),
]


@pytest.mark.parametrize("topic_filter, topic, expected", MATCHES)
def test_filter_matches(topic_filter, topic, expected):
    assert filter_matches(topic_filter, topic) is expected


@pytest.mark.parametrize("topic_filter, topic, expected", MATCHES)
def test_subscription_trie_matches_like_the_examples(topic_filter, topic, expected):
    trie = SubscriptionTrie()
    trie.add(topic_filter, "s", 1)
    assert trie.match(topic) == ({"s": 1} if expected else {})


@pytest.mark.parametrize("topic_filter, topic, expected", MATCHES)
def test_retained_trie_matches_like_the_examples(topic_filter, topic, expected):
    trie = RetainedTrie()
    trie.set(topic, "v")
    assert list(trie.match(topic_filter)) == ([(topic, "v")] if expected else [])


# --------------------------------------------------------------------------- SubscriptionTrie


def test_add_reports_new_filters_and_remove_reports_last_subscriber():
    trie = SubscriptionTrie()
    assert trie.add("a/+", "s1", 0) is True
    assert trie.add("a/+", "s2", 1) is False
    assert trie.add("a/+", "s1", 2) is False  # replace, not a new subscription
    assert len(trie) == 1
    assert trie.match("a/b") == {"s1": 2, "s2": 1}
    assert trie.remove("a/+", "s1") is False
    assert trie.remove("a/+", "s1") is False  # not there any more
    assert trie.remove("a/+", "nobody") is False
    assert trie.remove("x/y", "s2") is False
    assert trie.remove("a/+", "s2") is True
    assert len(trie) == 0
    assert trie.match("a/b") == {}


def test_overlapping_filters_give_one_entry_at_the_highest_qos():
    """[MQTT-3.3.5-1] one subscriber, several matching filters: one entry, the maximum QoS."""
    trie = SubscriptionTrie()
    trie.add("a/+", "s", 0)
    trie.add("a/#", "s", 2)
    trie.add("a/b", "s", 1)
    trie.add("#", "s", 0)
    trie.add("a/b", "t", 1)
    assert trie.match("a/b") == {"s": 2, "t": 1}
    trie.remove("a/#", "s")
    assert trie.match("a/b") == {"s": 1, "t": 1}


def test_dollar_topics_do_not_match_leading_wildcards():
    """[MQTT-4.7.2-1]"""
    trie = SubscriptionTrie()
    trie.add("#", "hash", 0)
    trie.add("+/x", "plus", 0)
    trie.add("+", "plus1", 0)
    trie.add("+/#", "plushash", 0)
    trie.add("$SYS/#", "sys", 1)
    trie.add("$SYS/+", "sysplus", 2)
    trie.add("$x", "exact", 0)
    assert trie.match("$SYS/x") == {"sys": 1, "sysplus": 2}
    assert trie.match("$x") == {"exact": 0}
    assert trie.match("$SYS") == {"sys": 1}
    assert trie.match("a/x") == {"hash": 0, "plus": 0, "plushash": 0}
    assert trie.match("a/$x") == {"hash": 0, "plushash": 0}


def test_multi_level_wildcard_matches_the_parent_level():
    """4.7.1.2: "sport/#" also matches "sport"."""
    trie = SubscriptionTrie()
    trie.add("a/#", "s", 1)
    trie.add("a/+/#", "t", 2)
    assert trie.match("a") == {"s": 1}
    assert trie.match("a/b") == {"s": 1, "t": 2}
    assert trie.match("a/b/c/d") == {"s": 1, "t": 2}
    assert trie.match("b") == {}


def test_single_level_wildcard_matches_empty_levels():
    trie = SubscriptionTrie()
    trie.add("+/+", "pp", 0)
    trie.add("a/+", "ap", 0)
    trie.add("+", "p", 0)
    assert trie.match("/") == {"pp": 0}
    assert trie.match("a/") == {"pp": 0, "ap": 0}
    assert trie.match("a") == {"p": 0}


def test_no_normalization():
    """[MQTT-4.7.3-4]"""
    trie = SubscriptionTrie()
    trie.add("a/b", "s", 0)
    trie.add("\u00e9", "composed", 0)
    for topic in ("A/b", "a//b", "a/b/", "/a/b", "a/ b"):
        assert trie.match(topic) == {}, topic
    assert trie.match("e\u0301") == {}
    assert trie.match("\u00e9") == {"composed": 0}


def test_cache_is_invalidated_by_add_and_remove():
    trie = SubscriptionTrie()
    assert trie.match("a/b") == {}
    trie.add("a/+", "s", 1)
    assert trie.match("a/b") == {"s": 1}
    trie.add("a/+", "s", 2)  # QoS change only
    assert trie.match("a/b") == {"s": 2}
    trie.add("#", "t", 0)
    assert trie.match("a/b") == {"s": 2, "t": 0}
    trie.remove("a/+", "s")
    assert trie.match("a/b") == {"t": 0}
    trie.remove("#", "t")
    assert trie.match("a/b") == {}


def test_small_cache_stays_correct():
    trie = SubscriptionTrie(cache_size=2)
    trie.add("+", "s", 0)
    for i in range(10):
        assert trie.match(str(i)) == {"s": 0}
    trie.remove("+", "s")
    for i in range(10):
        assert trie.match(str(i)) == {}


def test_add_then_remove_many_filters_leaves_an_empty_root():
    trie = SubscriptionTrie()
    filters = [f"{a}/{b}/{c}" for a in ("x", "+", "") for b in ("y", "+", "#") for c in ("z", "#") if "#" not in b] + [
        "#",
        "+",
        "x",
        "x/#",
        "/",
        "$SYS/#",
    ]
    for n, f in enumerate(filters):
        trie.add(f, "s1", n % 3)
        trie.add(f, "s2", 0)
    assert sorted(trie.filters()) == sorted(filters)
    for f in reversed(filters):
        trie.remove(f, "s1")
    assert len(trie) == len(filters)  # s2 still holds every one
    for f in filters:
        trie.remove(f, "s2")
    assert len(trie) == 0
    assert list(trie.filters()) == []
    assert trie._root.children == {}
    assert trie.match("x/y/z") == {}


def test_prune_keeps_shared_branches():
    trie = SubscriptionTrie()
    trie.add("a/b/c", "s", 0)
    trie.add("a", "s", 1)
    trie.remove("a/b/c", "s")
    assert trie.match("a") == {"s": 1}
    assert list(trie._root.children) == ["a"]
    assert trie._root.children["a"].children == {}


def test_a_filter_of_one_subscriber_keeps_a_pair_and_a_trailing_hash_no_level_of_its_own():
    # (an idle client's subscription costs what its level of the trie does: issue 26)
    trie = SubscriptionTrie()
    trie.add("d/1/#", "s", 1)
    level = trie._root.children["d"].children["1"]
    assert level.children == {} and level.rest == ("s", 1) and level.subs is None
    trie.add("d/1/#", "s", 2)  # (a new QoS for the same subscriber)
    assert level.rest == ("s", 2)
    trie.add("d/1/#", "t", 0)
    assert level.rest == {"s": 2, "t": 0}
    assert trie.match("d/1/x") == {"s": 2, "t": 0}
    trie.remove("d/1/#", "s")
    assert level.rest == ("t", 0)
    assert trie.match("d/1") == {"t": 0}
    assert trie.remove("d/1/#", "t") is True
    assert trie._root.children == {}


# --------------------------------------------------------------------------- RetainedTrie


def test_retained_set_get_delete():
    trie = RetainedTrie()
    assert trie.get("a/b") is None
    trie.set("a/b", "v1")
    trie.set("a/b", "v2")  # replace, counted once
    trie.set("a", "va")
    assert len(trie) == 2
    assert trie.get("a/b") == "v2"
    assert trie.get("a") == "va"
    assert trie.get("a/b/c") is None
    assert trie.delete("a/b/c") is False
    assert trie.delete("a/b") is True
    assert trie.delete("a/b") is False
    assert trie.get("a/b") is None
    assert len(trie) == 1
    assert trie.delete("a") is True
    assert len(trie) == 0
    assert trie._root.children == {}


def test_retained_delete_of_an_inner_node_keeps_children():
    trie = RetainedTrie()
    trie.set("a", 1)
    trie.set("a/b", 2)
    assert trie.delete("a") is True
    assert trie.get("a/b") == 2
    assert trie.get("a") is None
    assert sorted(trie.items()) == [("a/b", 2)]


RETAINED_TOPICS = ["a", "a/b", "a/b/c", "a/c", "b", "/", "/x", "a/", "$SYS/load", "$SYS", "$x/y", "a/$b", "c/d/e"]

RETAINED_CASES = [
    ("#", {"a", "a/b", "a/b/c", "a/c", "b", "/", "/x", "a/", "a/$b", "c/d/e"}),
    ("+", {"a", "b"}),
    ("+/+", {"a/b", "a/c", "/", "/x", "a/", "a/$b"}),
    ("+/#", {"a", "a/b", "a/b/c", "a/c", "b", "/", "/x", "a/", "a/$b", "c/d/e"}),
    ("a/#", {"a", "a/b", "a/b/c", "a/c", "a/", "a/$b"}),
    ("a/+", {"a/b", "a/c", "a/", "a/$b"}),
    ("a/+/c", {"a/b/c"}),
    ("$SYS/#", {"$SYS", "$SYS/load"}),
    ("$SYS/+", {"$SYS/load"}),
    ("+/load", set()),
    ("/+", {"/", "/x"}),
    ("a/b", {"a/b"}),
    ("nothing/#", set()),
    ("c/+/+", {"c/d/e"}),
    ("c/#", {"c/d/e"}),
]


@pytest.mark.parametrize("topic_filter, expected", RETAINED_CASES)
def test_retained_match_every_filter_shape(topic_filter, expected):
    trie = RetainedTrie()
    for t in RETAINED_TOPICS:
        trie.set(t, "v:" + t)
    got = list(trie.match(topic_filter))
    assert len(got) == len(set(got)), "a retained message was listed twice"
    assert dict(got) == {t: "v:" + t for t in expected}


def test_retained_items_lists_everything_once():
    trie = RetainedTrie()
    for t in RETAINED_TOPICS:
        trie.set(t, t.upper())
    items = list(trie.items())
    assert sorted(items) == sorted((t, t.upper()) for t in RETAINED_TOPICS)


# --------------------------------------------------------------------------- properties

LEVELS = ["", "$x", "a", "b"]
_topic = st.lists(st.sampled_from(LEVELS), min_size=1, max_size=4).map("/".join).filter(bool)


@st.composite
def _filter(draw):
    levels = draw(st.lists(st.sampled_from(LEVELS + ["+"]), min_size=0, max_size=4))
    if not levels or draw(st.booleans()):
        levels.append("#")
    return "/".join(levels) or "#"


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(_filter(), st.integers(0, 3), st.integers(0, 2)), max_size=12),
    st.lists(_topic, min_size=1, max_size=8),
    st.data(),
)
def test_subscription_trie_equals_brute_force(subs, topics, data):
    trie = SubscriptionTrie()
    current: dict[tuple[str, int], int] = {}
    for f, sub, qos in subs:
        trie.add(f, sub, qos)
        current[(f, sub)] = qos

    def brute(topic):
        out: dict[int, int] = {}
        for (f, sub), qos in current.items():
            if filter_matches(f, topic):
                out[sub] = max(qos, out.get(sub, -1))
        return out

    for t in topics:
        assert trie.match(t) == brute(t), t
    gone = data.draw(st.lists(st.sampled_from(sorted(current)), unique=True) if current else st.just([]))
    for f, sub in gone:
        trie.remove(f, sub)
        del current[(f, sub)]
    for t in topics:
        assert trie.match(t) == brute(t), t
    assert sorted(trie.filters()) == sorted({f for f, _ in current})
    if not current:
        assert trie._root.children == {}
        assert trie._root.subs is None and trie._root.rest is None


@settings(max_examples=300, deadline=None)
@given(st.lists(_topic, max_size=10), st.lists(_filter(), min_size=1, max_size=6))
def test_retained_trie_equals_brute_force(topics, filters):
    trie = RetainedTrie()
    for t in topics:
        trie.set(t, t)
    for f in filters:
        got = list(trie.match(f))
        assert sorted(got) == sorted((t, t) for t in set(topics) if filter_matches(f, t)), f
