"""The will check of the cluster simulator (sim/history.py ``check_wills``) under the decided
semantics of finding 8 (docs/design.md 3.3): exactly once, except that a will published by a
node that could not reach the connection's node counts apart, at most once per side. The
check must still catch every other case: these histories are built by hand."""

from __future__ import annotations

from mqttmesh.sim.history import History, check_wills


def _history(end: str | None) -> History:
    """One connection ``s#1`` with a will, accepted on n1; ``end``: "clean", "unclean" or None (open)."""
    h = History()
    h.connect(1.0, "s", "invoke", "s#1", "n1", "will")
    h.connect(1.1, "s", "ok", "s#1", "n1", False)
    if end is not None:
        h.closed(5.0, "s", "s#1", end == "clean", "end")
    return h


def test_an_unclean_end_needs_exactly_one_will_on_its_side():
    h = _history("unclean")
    assert check_wills(h, {}).missing == ["s#1"]
    assert check_wills(h, {"s#1": 1}, {"s#1": [None]}).missing == []
    twice = check_wills(h, {"s#1": 2}, {"s#1": [None, None]})
    assert twice.twice == [("s#1", 2)]


def test_across_a_cut_one_more_per_side_is_allowed_and_no_more():
    h = _history("unclean")
    ok = check_wills(h, {"s#1": 2}, {"s#1": [None, "n4"]})
    assert not ok.twice and not ok.missing
    three_sides = check_wills(h, {"s#1": 3}, {"s#1": [None, "n4", "n7"]})
    assert not three_sides.twice
    same_side_twice = check_wills(h, {"s#1": 3}, {"s#1": [None, "n4", "n4"]})
    assert same_side_twice.twice == [("s#1", 3)]
    # only the registrars across the cut published it (its node never could): not missing
    assert check_wills(h, {"s#1": 1}, {"s#1": ["n4"]}).missing == []


def test_a_clean_end_or_an_open_connection_allows_only_wills_from_across_a_cut():
    for end in ("clean", None):
        h = _history(end)
        assert check_wills(h, {"s#1": 1}, {"s#1": ["n4"]}).unwanted == []
        assert check_wills(h, {"s#1": 1}, {"s#1": [None]}).unwanted != []
        assert check_wills(h, {"s#1": 0}).unwanted == []
