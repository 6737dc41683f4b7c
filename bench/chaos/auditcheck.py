"""The audit beside the checker (issue 25, point 4): the pipeline's audit job run on the nodes'
archives of a harness run, and its counts reconciled with the checker's, packet by packet.

``read_audit`` runs Spark (the ``audit`` job and its transforms); ``reconcile`` is pure: it
takes the client history, the checker's result and the rows the audit read, and leaves to
its caller the processes, the archives and the SparkSession.

What each side observes. The checker: which publishes were acknowledged to the harness's
publishers, and which PUBLISH packets its subscribers read. The audit: what the nodes
archived, a publish log row per message a node accepted from a client (its origin), a
delivery log row per PUBLISH packet a node wrote to a client. They meet on the workload's
message id, which is the payload (``pubI:n``): one id may have several archived copies (a
QoS 1 PUBLISH re-sent after a reconnection is a new message to MQTT and to the archive).

How they are compared, per (subscriber, message id):

- **packets**: every delivery row is matched to a PUBLISH the subscriber read from that node
  with the same DUP flag, no earlier than ``EARLY`` before the row and at most ``LINGER``
  after it; a row left over is *written, not read*, a read left over *read, not logged*;
- **lost**: of the pairs both judge (the checker's rule: acknowledged, published at least
  ``settle`` after the subscriber's first SUBACK; the audit's: archived at or after that
  moment, ``--expect SUB=chaos/#@SINCE``), the checker's lost (never read) against the
  audit's (no archived copy delivered);
- **QoS 2 duplicates**: the checker's (read as a new message more than once) against the
  audit's (more than one PUBLISH with DUP=0 written; a DUP=1 one is a re-send, which the
  audit counts as ``redelivered``).

Where they may legitimately differ, each counted and each checked against the history and
the nemesis's log (a difference that fits none of these is *unexplained*, a finding):

1. *Written, not read*: the node wrote the PUBLISH on a connection that then ended (the
   client moved, dropped it, or its node was killed or cut off) before the client read it.
   Explained when the subscriber had no connection to that node live at the row's time, or
   the one it had ended within ``LINGER`` of it. The audit counts it delivered; if no other
   copy reached the client, the checker counts it lost (and the mesh did lose it).
2. *Read, not logged*: the node wrote it and died with the row still in its memory: a
   node hands its records to its archive writer every ``flush_interval / 4``, and a kill -9
   loses what it had not handed over (docs/pipeline.md). Explained when the node of the
   connection it was read on was killed at most ``tail`` after the read, or when the
   subscriber has a delivery row of a message the publish log lacks from that node (below).
3. *Acknowledged, not archived*: the same for the publish log: explained when the node that
   acknowledged it was killed at most ``tail`` after the acknowledgement. Such a message is
   judged by the checker only. Its deliveries are rows whose message id the publish log lacks
   (the audit's ``unknown``); they explain reads of it that no row of an archived copy does.
4. *Archived, never acknowledged*: the node took it and the acknowledgement never came (the
   run ended undrained); judged by the audit only.
5. *Boundary*: published before the subscriber's SUBACK + settle, taken by a node after it;
   judged by the audit only.
6. *A re-send taken as new*: a QoS 2 PUBLISH with DUP=1 that the subscriber read as a new
   message (it had released that packet id): a duplicate to the checker, a re-send to the
   audit, which cannot tell it from one the client still held.

One difference is named but never explained: a message *archived under another id* than the
one its delivery rows carry (same sequence number and origin timestamp, another origin). A
node that routes a message under another node's id records that origin (archive/recorder.py
``other_origin``); one that did not (before that, every publish row named the writing node)
is a defect of the archive, counted in ``unexplained``.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

from mqttmesh.sim.history import History

from .checker import ChaosCheck

__all__ = ["Archived", "Reconciliation", "local_spark", "read_audit", "reconcile", "EARLY", "LINGER"]

# a read may come this long before its row's time (the node's clock against the harness's)
EARLY = 0.25
# a client reads a PUBLISH written to a live connection within this (its thread's slack on a
# loaded machine); a connection that ended this soon after a write may not have delivered it
LINGER = 5.0


@dataclass
class Archived:
    """What the audit read, as plain rows; times are wall-clock seconds."""

    publish: list[tuple[str, str, str, float]]  # (archive msg id, workload msg id = payload, origin, t)
    delivery: list[tuple[str, str, str, bool, int, str, float, float]]
    # ^ (archive msg id, client, node, dup, qos, topic, t, published t)
    expected: list[tuple[str, str, bool, int, int]]
    # ^ the audit's rows: (client, archive msg id, delivered, copies, redelivered: copies with DUP)
    summary: dict[str, Any]  # the audit job's totals (jobs.run_audit)
    seconds: float = 0.0


def local_spark():
    """A local SparkSession on loopback, two threads, no UI (a harness run's audit is small)."""
    from mqttmesh.pipeline.session import build_session

    return build_session("chaos-audit", "local[2]", 2, {"spark.ui.enabled": "false"})


def read_audit(spark, roots: list[str], since: dict[str, float], out: str) -> Archived:
    """Run the ``audit`` job on ``roots`` (one expectation per subscriber: ``chaos/#`` from
    ``since[client]``, wall-clock seconds), writing its tables and report under ``out``, and
    read back its per-message rows and both logs."""
    from pyspark.sql import functions as F

    from mqttmesh.archive.schema import DELIVERY, PUBLISH
    from mqttmesh.pipeline import audit as A
    from mqttmesh.pipeline.extract import read_log
    from mqttmesh.pipeline.jobs import job_options, run_audit
    from mqttmesh.pipeline.options import Expectation

    exps = [Expectation(c, ["chaos/#"], dt.datetime.fromtimestamp(t, dt.UTC)) for c, t in sorted(since.items())]
    job = run_audit(spark, job_options(archive=roots, out=out, expect=exps), say=lambda _: None)

    def secs(col: str):
        return (F.unix_micros(F.col(col)) / F.lit(1e6)).alias(col)

    pub = read_log(spark, roots, PUBLISH, say=lambda _: None)
    dlv = read_log(spark, roots, DELIVERY, say=lambda _: None)
    # the job's own rows, by the job's own transforms (its tables hold the totals only)
    rows = A.audit_deliveries(A.expected_from_filters(pub, A.expectations_frame(spark, exps)), A.first_deliveries(dlv))
    return Archived(
        publish=[
            (r.msg_id, r.hid, r.origin, r.timestamp)
            for r in pub.select(
                "msg_id", F.col("payload").cast("string").alias("hid"), "origin", secs("timestamp")
            ).toLocalIterator()
        ],
        delivery=[
            (r.msg_id, r.client_id, r.node, bool(r.dup), int(r.qos), r.topic, r.timestamp, r.published)
            for r in dlv.select(
                "msg_id", "client_id", "node", "dup", "qos", "topic", secs("timestamp"), secs("published")
            ).toLocalIterator()
        ],
        expected=[
            (r.client_id, r.msg_id, bool(r.delivered), int(r.copies), int(r.redelivered))
            for r in rows.select("client_id", "msg_id", "delivered", "copies", "redelivered").toLocalIterator()
        ],
        summary=dict(job.summary),
        seconds=job.seconds,
    )


@dataclass
class Reconciliation:
    # the universe of messages
    acked: int = 0
    archived: int = 0  # workload message ids in the publish log
    archived_copies: int = 0  # its rows (a re-sent QoS 1 message has several)
    acked_not_archived: list[tuple[str, str, float]] = field(default_factory=list)  # (msg id, node, t ack)
    acked_not_archived_unexplained: list[str] = field(default_factory=list)
    archived_not_acked: int = 0
    # packets
    rows: int = 0  # delivery rows of archived messages to the subscribers
    reads: int = 0  # PUBLISH packets the subscribers read (receive and repeat)
    matched: int = 0
    written_not_read: list[tuple[str, str, str, float]] = field(default_factory=list)  # (client, msg, node, t)
    written_not_read_unexplained: list[tuple[str, str, str, float]] = field(default_factory=list)
    read_not_logged: list[tuple[str, str, str, float, str]] = field(default_factory=list)  # (..., why)
    read_not_logged_unexplained: list[tuple[str, str, str, float]] = field(default_factory=list)
    unknown_rows: int = 0  # delivery rows whose message the publish log lacks
    # lost, on the pairs both judge
    pairs_both: int = 0
    pairs_checker_only: int = 0  # acked, not archived (3)
    # of those, the pairs of a message that is archived: none is explained (client, msg)
    pairs_checker_only_unexplained: list[tuple[str, str]] = field(default_factory=list)
    pairs_audit_only: int = 0  # boundary or never acknowledged (4, 5)
    lost_checker: int = 0
    lost_audit: int = 0
    lost_checker_only: list[tuple[str, str]] = field(default_factory=list)  # written, not read (1)
    lost_audit_only: list[tuple[str, str]] = field(default_factory=list)  # read, not logged (2)
    lost_checker_only_unexplained: list[tuple[str, str]] = field(default_factory=list)
    # a defect, unexplained (module doc): messages archived under another id than the one
    # their deliveries carry, (publish row's id, the deliveries', msg id), and the pairs the
    # audit counts lost for that alone
    misattributed: list[tuple[str, str, str]] = field(default_factory=list)
    lost_audit_only_misattributed: list[tuple[str, str]] = field(default_factory=list)
    lost_audit_only_unexplained: list[tuple[str, str]] = field(default_factory=list)
    lost_in_checker_only_pairs: int = 0
    lost_in_audit_only_pairs: int = 0
    # QoS 2 duplicates, on the pairs both judge
    qos2_dup_checker: int = 0
    qos2_dup_audit: int = 0
    qos2_dup_resend_taken_as_new: int = 0  # (6)
    qos2_dup_differing_pairs: list[tuple[str, str, int, int]] = field(default_factory=list)
    qos2_dup_unexplained: list[tuple[str, str, int, int]] = field(default_factory=list)
    # the audit job's own totals against the rows read back
    job: dict[str, Any] = field(default_factory=dict)
    job_rows_agree: bool = True

    @property
    def unexplained(self) -> int:
        return (
            len(self.acked_not_archived_unexplained)
            + len(self.written_not_read_unexplained)
            + len(self.read_not_logged_unexplained)
            + len(self.lost_checker_only_unexplained)
            + len(self.lost_audit_only_unexplained)
            + len(self.qos2_dup_unexplained)
            + len(self.misattributed)
            + len(self.pairs_checker_only_unexplained)
            + (0 if self.job_rows_agree else 1)
        )

    @property
    def agrees(self) -> bool:
        """Lost and QoS 2 duplicates agree, but for differences each explained (module doc)."""
        return self.unexplained == 0 and (
            self.lost_checker - len(self.lost_checker_only) == self.lost_audit - len(self.lost_audit_only)
        )

    def summary(self) -> dict[str, Any]:
        return {
            "agrees": self.agrees,
            "unexplained": self.unexplained,
            "lost": {"checker": self.lost_checker, "audit": self.lost_audit},
            "lost_checker_only_written_not_read": len(self.lost_checker_only),
            "lost_audit_only_read_not_logged": len(self.lost_audit_only),
            "lost_audit_only_misattributed": len(self.lost_audit_only_misattributed),
            "misattributed_messages": len(self.misattributed),
            "qos2_duplicates": {"checker": self.qos2_dup_checker, "audit": self.qos2_dup_audit},
            "qos2_dup_resend_taken_as_new": self.qos2_dup_resend_taken_as_new,
            "qos2_dup_differing_pairs": len(self.qos2_dup_differing_pairs),
            "pairs": {
                "both": self.pairs_both,
                "checker_only": self.pairs_checker_only,
                "audit_only": self.pairs_audit_only,
                "lost_in_checker_only": self.lost_in_checker_only_pairs,
                "lost_in_audit_only": self.lost_in_audit_only_pairs,
            },
            "messages": {
                "acked": self.acked,
                "archived": self.archived,
                "archived_copies": self.archived_copies,
                "acked_not_archived": len(self.acked_not_archived),
                "archived_not_acked": self.archived_not_acked,
            },
            "packets": {
                "rows": self.rows,
                "reads": self.reads,
                "matched": self.matched,
                "written_not_read": len(self.written_not_read),
                "read_not_logged": len(self.read_not_logged),
                "read_not_logged_by_why": dict(sorted(Counter(x[4] for x in self.read_not_logged).items())),
                "unknown_rows": self.unknown_rows,
            },
            "job": self.job,
            "job_rows_agree": self.job_rows_agree,
            "samples": {
                "acked_not_archived": [list(x) for x in self.acked_not_archived[:10]],
                "misattributed": [list(x) for x in self.misattributed[:10]],
                "acked_not_archived_unexplained": self.acked_not_archived_unexplained[:10],
                "written_not_read": [list(x) for x in self.written_not_read[:10]],
                "written_not_read_unexplained": [list(x) for x in self.written_not_read_unexplained[:10]],
                "read_not_logged": [list(x) for x in self.read_not_logged[:10]],
                "read_not_logged_unexplained": [list(x) for x in self.read_not_logged_unexplained[:10]],
                "lost_checker_only_unexplained": [list(x) for x in self.lost_checker_only_unexplained[:10]],
                "pairs_checker_only_unexplained": [list(x) for x in self.pairs_checker_only_unexplained[:10]],
                "lost_audit_only_unexplained": [list(x) for x in self.lost_audit_only_unexplained[:10]],
                "qos2_dup_unexplained": [list(x) for x in self.qos2_dup_unexplained[:10]],
            },
        }


def _killed_within(kills: list[tuple[str, float]], node: str, t: float, tail: float) -> bool:
    """Was ``node`` killed at most ``tail`` after ``t`` (or up to ``EARLY`` before it: the
    client may read what was already on its way)?"""
    return any(n == node and t - EARLY <= tk <= t + tail for n, tk in kills)


def reconcile(
    history: History,
    check: ChaosCheck,
    archived: Archived,
    wall0: float,
    kills: list[tuple[str, float]],
    tail: float,
) -> Reconciliation:
    """Compare ``check`` (the checker's result on ``history``) with what the audit read.
    ``wall0``: the wall-clock time of the history's 0; ``kills``: (node, time) of each kill -9,
    on the history's clock; ``tail``: the longest a node holds a record before its archive
    writer has it (a kill -9 loses what it holds)."""
    r = Reconciliation(job=archived.summary)
    # -- the history ------------------------------------------------------------------------
    node_of: dict[str, str] = {}  # connection -> node
    opened: dict[str, float] = {}
    ended: dict[str, float] = {}
    conns_of: dict[str, list[str]] = defaultdict(list)  # client -> its connections, in order
    current: dict[str, str] = {}  # client -> its connection now (while scanning)
    acked: dict[str, tuple[float, str]] = {}  # msg id -> (t, node that acknowledged it)
    invoked: dict[str, int] = {}  # msg id -> QoS
    reads: dict[tuple[str, str], list[tuple[float, bool, str, str, str]]] = defaultdict(list)
    # ^ (client, msg id) -> (t, dup, node, "receive" | "repeat", topic)
    for op in history.ops:
        t, client, what, kind = op[0], op[1], op[2], op[3]
        if kind == "connect" and what == "invoke":
            node_of[op[4]] = op[5]
            opened[op[4]] = t
            conns_of[client].append(op[4])
            current[client] = op[4]
        elif kind == "close":
            ended.setdefault(op[4], t)
        elif kind == "connect" and what == "fail":
            ended.setdefault(op[4], t)
        elif kind == "publish" and what == "invoke":
            invoked[op[4]] = op[6]
        elif kind == "publish" and what == "ok" and op[4] not in acked:
            acked[op[4]] = (t, node_of.get(current.get(client, ""), ""))
        elif kind in ("receive", "repeat"):
            reads[(client, op[4])].append((t, bool(op[7]), node_of.get(op[8], ""), kind, op[5]))
    acked = {m: v for m, v in acked.items() if invoked.get(m, 0) > 0}
    r.acked = len(acked)
    # -- the archive, on the history's clock ------------------------------------------------
    hid_of = {mid: hid for mid, hid, _, _ in archived.publish}
    # (seq, time at its origin) -> the publish row's msg id: a delivery row naming another
    # origin with both the same is the same message under the id it was routed with (below)
    same = {(mid.rsplit(":", 1)[1], round(t, 6)): mid for mid, _, _, t in archived.publish}
    r.archived_copies = len(archived.publish)
    archived_ids = set(hid_of.values())
    r.archived = len(archived_ids)
    subscribers = {c for _, c in check.judged} | {c for c, _ in reads}
    rows: dict[tuple[str, str], list[tuple[float, bool, str]]] = defaultdict(list)
    unknown: dict[tuple[str, str], list[tuple[float, bool, str]]] = defaultdict(list)  # (client, node)
    misattributed: dict[str, str] = {}  # delivery rows' msg id -> the publish row's
    for mid, client, node, dup, _qos, topic, ts, published in archived.delivery:
        if client not in subscribers:
            continue
        hid = hid_of.get(mid)
        if hid is None:
            origin, seq = mid.rsplit(":", 1)
            twin = same.get((seq, round(published, 6)))
            if twin is not None:
                # a defect, not a legitimate difference: the node that routed a message under
                # another origin's id (a persistent publisher's QoS 2 message its first node had
                # not routed yet, a dead node's client's will) archived it under another: its
                # deliveries do not join it. Matched, so that the rest of the comparison holds,
                # and counted unexplained (module doc)
                misattributed[mid] = twin
                hid = hid_of[twin]
            else:
                r.unknown_rows += 1
                if _killed_within(kills, origin, published - wall0, tail):
                    unknown[(client, node)].append((ts - wall0, dup, topic))
                continue
        rows[(client, hid)].append((ts - wall0, dup, node))
    # -- messages: acknowledged against archived -------------------------------------------
    for m, (t, node) in sorted(acked.items()):
        if m not in archived_ids:
            r.acked_not_archived.append((m, node, round(t, 3)))
            if not _killed_within(kills, node, t, tail):
                r.acked_not_archived_unexplained.append(m)
    r.archived_not_acked = len(archived_ids - set(acked))

    # -- packets: rows against reads ----------------------------------------------------------
    def connection_ended_soon(client: str, node: str, t: float) -> bool:
        live = [
            c
            for c in conns_of.get(client, ())
            if node_of[c] == node and opened[c] - EARLY <= t and ended.get(c, float("inf")) >= t - EARLY
        ]
        return not live or all(ended.get(c, float("inf")) <= t + LINGER for c in live)

    read_left: dict[tuple[str, str], list[tuple[float, bool, str, str, str]]] = {}
    for key in sorted(set(rows) | {k for k in reads if k[1] in archived_ids}):
        client, hid = key
        todo = sorted(reads.get(key, ()))
        r.reads += len(todo)
        r.rows += len(rows.get(key, ()))
        for t, dup, node in sorted(rows.get(key, ())):
            hit = next((x for x in todo if x[2] == node and x[1] == dup and t - EARLY <= x[0] <= t + LINGER), None)
            if hit is not None:
                todo.remove(hit)
                r.matched += 1
                continue
            r.written_not_read.append((client, hid, node, round(t, 3)))
            if not connection_ended_soon(client, node, t):
                r.written_not_read_unexplained.append((client, hid, node, round(t, 3)))
        read_left[key] = todo
        for t, dup, node, _, topic in todo:
            spare = next(
                (
                    u
                    for u in unknown.get((client, node), ())
                    if u[1] == dup and u[2] == topic and u[0] - EARLY <= t <= u[0] + LINGER
                ),
                None,
            )
            if spare is not None:
                unknown[(client, node)].remove(spare)
                why = "its copy's publish row lost with its origin"
            elif _killed_within(kills, node, t, tail):
                why = "delivery row lost with its node"
            else:
                why = ""
            r.read_not_logged.append((client, hid, node, round(t, 3), why or "unexplained"))
            if not why:
                r.read_not_logged_unexplained.append((client, hid, node, round(t, 3)))

    # -- lost, on the pairs both judge -------------------------------------------------------
    delivered_audit: dict[tuple[str, str], bool] = {}
    fresh_audit: dict[tuple[str, str], int] = defaultdict(int)  # PUBLISHes with DUP=0, all copies
    for client, mid, delivered, copies, redelivered in archived.expected:
        key = (client, hid_of[mid])
        delivered_audit[key] = delivered_audit.get(key, False) or delivered
        fresh_audit[key] += copies - redelivered
    misattributed_pairs = {
        (client, hid_of[misattributed[mid]]) for mid, client, *_ in archived.delivery if mid in misattributed
    }
    r.misattributed = sorted({(twin, mid, hid_of[twin]) for mid, twin in misattributed.items()})
    judged = {(c, m) for m, c in check.judged}
    lost_checker = {(c, m) for m, c in check.lost}
    both = judged & set(delivered_audit)
    r.pairs_both = len(both)
    r.pairs_checker_only = len(judged - both)
    not_archived = {m for m, _, _ in r.acked_not_archived}
    r.pairs_checker_only_unexplained = sorted((c, m) for c, m in judged - both if m not in not_archived)
    r.pairs_audit_only = len(set(delivered_audit) - both)
    r.lost_in_checker_only_pairs = len((judged - both) & lost_checker)
    r.lost_in_audit_only_pairs = sum(1 for k in set(delivered_audit) - both if not delivered_audit[k])
    for key in sorted(both):
        c_lost, a_lost = key in lost_checker, not delivered_audit[key]
        r.lost_checker += c_lost
        r.lost_audit += a_lost
        if c_lost and not a_lost:  # written, never read
            r.lost_checker_only.append(key)
            if not any(x[0] == key[0] and x[1] == key[1] for x in r.written_not_read) or any(
                x[0] == key[0] and x[1] == key[1] for x in r.written_not_read_unexplained
            ):
                r.lost_checker_only_unexplained.append(key)
        elif a_lost and not c_lost and key in misattributed_pairs:
            r.lost_audit_only_misattributed.append(key)
        elif a_lost and not c_lost:  # read, never logged
            r.lost_audit_only.append(key)
            left = read_left.get(key, [])
            if not left or any(x[0] == key[0] and x[1] == key[1] for x in r.read_not_logged_unexplained):
                r.lost_audit_only_unexplained.append(key)

    # -- QoS 2 duplicates, on the pairs both judge ------------------------------------------
    qos2_checker = {(c, m) for m, c, _ in check.qos2_dups}
    for key in sorted(both):
        if invoked.get(key[1]) != 2 and key not in qos2_checker:
            continue
        got = [x for x in reads.get(key, ()) if x[3] == "receive"]
        c_dup = max(0, len(got) - 1)
        a_dup = max(0, fresh_audit[key] - 1)
        r.qos2_dup_checker += c_dup
        r.qos2_dup_audit += a_dup
        taken_as_new = sum(1 for x in sorted(got)[1:] if x[1])  # (a first delivery may be DUP=1)
        r.qos2_dup_resend_taken_as_new += taken_as_new
        if c_dup != a_dup:
            r.qos2_dup_differing_pairs.append((*key, c_dup, a_dup))
            # explained: by re-sends read as new, or by fresh rows not read / fresh reads not logged
            unread = sum(1 for x in r.written_not_read if (x[0], x[1]) == key)
            unlogged = sum(1 for x in read_left.get(key, []) if not x[1])
            if not (taken_as_new or unread or unlogged) or key in {
                (x[0], x[1]) for x in r.written_not_read_unexplained + r.read_not_logged_unexplained
            }:
                r.qos2_dup_unexplained.append((*key, c_dup, a_dup))
    # -- the job's totals against its rows read back ----------------------------------------
    job_lost = sum(1 for _, _, d, _, _ in archived.expected if not d)
    r.job_rows_agree = archived.summary.get("lost") == job_lost and archived.summary.get("expected") == len(
        archived.expected
    )
    return r
