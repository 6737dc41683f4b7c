"""The admin API's mesh-wide listings (server/ops.py): each node answers its first
``limit`` keys after the cursor, the answers are merged by key, and paging through them
yields every item of the mesh once, in order, whatever the nodes hold."""

from __future__ import annotations

import asyncio

from hypothesis import given, settings
from hypothesis import strategies as st

from mqttmesh.server.ops import MERGES, Inquiries, _page, decode_cursor, encode_cursor


class FakeInquiries(Inquiries):
    """Inquiries whose nodes hold the given clients (no mesh: ``ask_all`` answers from them)."""

    def __init__(self, held: dict[str, list[str]], sessions: bool = False):
        self.held = held
        self.sessions = sessions

    async def ask_all(self, what, args):
        answers = {}
        for node, cids in self.held.items():
            if self.sessions:
                items = [
                    {
                        "client_id": c,
                        "held_by": [node],
                        "connected_here": False,
                        "clean_session": False,
                        "subscriptions": 0,
                        "queued": 0,
                        "inflight": 0,
                    }
                    for c in cids
                ]
            else:
                items = [{"client_id": c, "node": node} for c in cids]
            answers[node] = _page(items, MERGES[what][0], args["after"], args["limit"])
        return answers, []


def page_all(inq: Inquiries, what: str, limit: int) -> list[dict]:
    out, after = [], ""
    for _ in range(1000):
        page = asyncio.run(inq.page(what, {"limit": limit, "after": after}))
        out += page["items"]
        if page["next"] is None:
            return out
        after = decode_cursor(page["next"])
    raise AssertionError("paging does not end")


ids = st.text(alphabet="abcxyz/\x00é0", min_size=1, max_size=4)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.sampled_from(["a", "b", "c"]), st.sets(ids, max_size=12), min_size=1), st.integers(1, 5))
def test_paging_clients_yields_every_client_once_in_order(held, limit):
    inq = FakeInquiries({n: sorted(c) for n, c in held.items()})
    got = [i["client_id"] for i in page_all(inq, "clients", limit)]
    assert got == sorted({c for cids in held.values() for c in cids})


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.sampled_from(["a", "b", "c"]), st.sets(ids, max_size=12), min_size=1), st.integers(1, 5))
def test_paging_sessions_folds_the_copies_of_one_session(held, limit):
    inq = FakeInquiries({n: sorted(c) for n, c in held.items()}, sessions=True)
    items = page_all(inq, "sessions", limit)
    assert [i["client_id"] for i in items] == sorted({c for cids in held.values() for c in cids})
    for i in items:
        assert i["held_by"] == sorted(n for n, cids in held.items() if i["client_id"] in cids)


def test_the_newest_retained_version_wins():
    merge = MERGES["retained"][1]
    old = {"topic": "t", "version": [1.0, "a", 5], "payload": "old"}
    new = {"topic": "t", "version": [2.0, "b", 1], "payload": "new"}
    assert merge([old, new]) == [new] and merge([new, old]) == [new]


def test_cursors_round_trip_and_garbage_is_refused():
    for key in ("", "a", "client\x00filter/#", "é/ü"):
        assert decode_cursor(encode_cursor(key)) == key
    for bad in ("%%%", "a", "!!!!"):
        try:
            decode_cursor(bad)
        except ValueError:
            continue
        raise AssertionError(f"{bad!r} taken for a cursor")
