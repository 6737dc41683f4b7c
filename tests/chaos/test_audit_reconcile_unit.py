"""The audit's reconciliation with the checker (bench/chaos/auditcheck.py ``reconcile``) on small
histories and archive rows written by hand, each with exactly one difference between what the
clients saw and what the nodes archived: the comparison names it, explains it only when the
history and the nemesis's log account for it, and otherwise says the two disagree.

(These rows are made up; tests/pipeline/test_audit_harness.py compares a real run's.)
"""

from __future__ import annotations

from bench.chaos.auditcheck import Archived, reconcile
from bench.chaos.checker import check
from mqttmesh.sim.history import History

WALL0 = 1_000_000.0  # the wall-clock time of the history's 0
SEQ = {"pub0:1": 11, "pub0:2": 12}


def _history(reads: list[tuple[float, str, str, bool]], acked_at: float = 5.1, end: float = 30.0) -> History:
    """pub0 on n0 publishes pub0:1 (QoS 1) and pub0:2 (QoS 2) at 5 s; sub0 is on n1 from 1 s
    until ``end``; ``reads``: (t, msg id, node, dup) of what sub0 read (its connection there)."""
    h = History()
    h.connect(0.5, "pub0", "invoke", "pub0/1", "n0")
    h.connect(0.6, "pub0", "ok", "pub0/1", "n0", False)
    h.connect(1.0, "sub0", "invoke", "sub0/1", "n1")
    h.connect(1.1, "sub0", "ok", "sub0/1", "n1", False)
    h.subscribed(1.2, "sub0", [("chaos/#", 2)])
    h.connect(1.3, "sub0", "invoke", "sub0/2", "n2")  # (its second connection, on n2, never used)
    h.connect(1.4, "sub0", "fail", "sub0/2", "n2", "no CONNACK")
    for m, q in (("pub0:1", 1), ("pub0:2", 2)):
        h.publish(5.0, "pub0", "invoke", m, f"chaos/pub0/q{q}", q)
    for m, q in (("pub0:1", 1), ("pub0:2", 2)):
        h.publish(acked_at, "pub0", "ok", m, f"chaos/pub0/q{q}", q)
    for t, m, node, dup in sorted(reads):
        conn = {"n1": "sub0/1", "n2": "sub0/2"}[node]
        q = 1 if m.endswith(":1") else 2
        h.received(t, "sub0", m, f"chaos/pub0/q{q}", q, dup, conn, 1)
    h.closed(end, "sub0", "sub0/1", True, "end of run")
    return h


def _archived(rows: list[tuple[float, str, str, bool]], archived: tuple[str, ...] = ("pub0:1", "pub0:2")) -> Archived:
    """The publish log has ``archived`` (origin n0, taken at 5.01 s); the delivery log ``rows``:
    (t, msg id, node, dup) to sub0; the audit's rows say which were delivered."""
    publish = [(f"n0:{SEQ[m]}", m, "n0", WALL0 + 5.01) for m in archived]
    delivery = [
        (f"n0:{SEQ[m]}", "sub0", node, dup, 1 if m.endswith(":1") else 2, "chaos/pub0/q", WALL0 + t, WALL0 + 5.01)
        for t, m, node, dup in rows
    ]
    expected = []
    for m in archived:
        mine = [r for r in rows if r[1] == m]
        expected.append(("sub0", f"n0:{SEQ[m]}", bool(mine), len(mine), sum(1 for r in mine if r[3])))
    summary = {"expected": len(expected), "lost": sum(1 for e in expected if not e[2])}
    return Archived(publish, delivery, expected, summary)


def _reconcile(reads, rows, kills=(), **kw):
    h = _history(reads, **{k: v for k, v in kw.items() if k in ("acked_at", "end")})
    a = _archived(rows, **{k: v for k, v in kw.items() if k == "archived"})
    return reconcile(h, check(h, {"pub0", "sub0"}), a, WALL0, list(kills), tail=1.0)


BOTH = [(5.1, "pub0:1", "n1", False), (5.1, "pub0:2", "n1", False)]


def test_what_was_written_and_read_agrees_packet_for_packet() -> None:
    r = _reconcile(BOTH, BOTH)
    assert (r.pairs_both, r.rows, r.reads, r.matched) == (2, 2, 2, 2)
    assert (r.lost_checker, r.lost_audit, r.qos2_dup_checker, r.qos2_dup_audit) == (0, 0, 0, 0)
    assert r.agrees and r.unexplained == 0


def test_a_row_never_read_on_a_connection_that_lived_on_is_unexplained() -> None:
    r = _reconcile(BOTH[:1], BOTH)  # n1 wrote pub0:2 at 5.1 s, sub0 stayed on n1 until 30 s
    assert r.lost_checker == 1 and r.lost_audit == 0
    assert r.written_not_read_unexplained == [("sub0", "pub0:2", "n1", 5.1)]
    assert not r.agrees


def test_a_row_never_read_as_its_connection_ended_is_explained() -> None:
    r = _reconcile(BOTH[:1], BOTH, end=6.0)  # sub0's connection ended 0.9 s after the write
    assert r.lost_checker == 1 and r.lost_audit == 0 and len(r.lost_checker_only) == 1
    assert r.unexplained == 0 and r.agrees


def test_a_read_whose_row_died_with_its_node_is_explained_only_by_the_kill() -> None:
    killed = _reconcile(BOTH, BOTH[:1], kills=[("n1", 5.5)])
    assert killed.lost_checker == 0 and killed.lost_audit == 1
    assert killed.lost_audit_only == [("sub0", "pub0:2")] and killed.agrees
    alive = _reconcile(BOTH, BOTH[:1])
    assert alive.read_not_logged_unexplained == [("sub0", "pub0:2", "n1", 5.1)] and not alive.agrees
    late = _reconcile(BOTH, BOTH[:1], kills=[("n1", 9.0)])  # 3.9 s later: it had been handed over
    assert not late.agrees


def test_an_acknowledged_message_missing_from_the_publish_log_needs_its_nodes_kill() -> None:
    r = _reconcile(BOTH, BOTH[:1], archived=("pub0:1",), kills=[("n0", 5.3)])
    assert r.acked_not_archived == [("pub0:2", "n0", 5.1)] and r.acked_not_archived_unexplained == []
    assert r.pairs_checker_only == 1 and r.agrees
    r = _reconcile(BOTH, BOTH[:1], archived=("pub0:1",))
    assert r.acked_not_archived_unexplained == ["pub0:2"] and not r.agrees


def test_a_qos2_message_written_twice_fresh_is_a_duplicate_to_both() -> None:
    twice = [*BOTH, (6.0, "pub0:2", "n1", False)]
    r = _reconcile(twice, twice)
    assert (r.qos2_dup_checker, r.qos2_dup_audit) == (1, 1) and r.agrees


def test_a_dup_resend_read_as_new_is_a_duplicate_to_the_checker_only() -> None:
    again = [*BOTH, (6.0, "pub0:2", "n1", True)]
    r = _reconcile(again, again)
    assert (r.qos2_dup_checker, r.qos2_dup_audit, r.qos2_dup_resend_taken_as_new) == (1, 0, 1)
    assert r.qos2_dup_differing_pairs and r.unexplained == 0


def test_deliveries_under_another_origins_id_are_a_defect_never_an_explanation() -> None:
    """The archive records the id a message was routed with (archive/recorder.py
    ``other_origin``); a publish row under another one is named, and fails the run."""
    h = _history(BOTH)
    a = _archived(BOTH)
    a.delivery[1] = ("n2:12", *a.delivery[1][1:])  # routed under n2's id, archived as n0's
    a.expected[1] = ("sub0", "n0:12", False, 0, 0)
    a.summary["lost"] = 1  # (the job counted it lost as well)
    r = reconcile(h, check(h, {"pub0", "sub0"}), a, WALL0, [], tail=1.0)
    assert r.misattributed == [("n0:12", "n2:12", "pub0:2")]
    assert r.lost_audit == 1 and r.lost_audit_only_misattributed == [("sub0", "pub0:2")]
    assert r.read_not_logged == []  # (the row is matched to its read once re-keyed)
    assert r.job_rows_agree and r.unexplained == 1 and not r.agrees
    assert r.summary()["misattributed_messages"] == 1 and not r.summary()["agrees"]


def test_a_pair_the_audit_did_not_judge_of_an_archived_message_is_unexplained() -> None:
    """A pair only the checker judged is explained by its message missing from the publish log
    (acknowledged by a node killed before its writer had it); of an archived message it is not."""
    r = _reconcile(BOTH, BOTH[:1], archived=("pub0:1",), kills=[("n0", 5.3)])
    assert r.pairs_checker_only_unexplained == [] and r.agrees
    h = _history(BOTH)
    a = _archived(BOTH)
    a.expected = [e for e in a.expected if e[1] != f"n0:{SEQ['pub0:2']}"]  # (the audit lacks it)
    r = reconcile(h, check(h, {"pub0", "sub0"}), a, WALL0, [], tail=1.0)
    assert r.pairs_checker_only == 1 and r.pairs_checker_only_unexplained == [("sub0", "pub0:2")]
    assert not r.agrees and r.summary()["samples"]["pairs_checker_only_unexplained"] == [["sub0", "pub0:2"]]
