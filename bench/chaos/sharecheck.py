"""The shared-subscription checker (issue 24): a pure function from a client history, the
faults as applied and the nodes' connection counts to what broke in one shared group.

Leaves to its caller: running the clients, recording the ``History`` (with the workload's
``unacked`` ops) and the fault windows (``nemesis.windows_of``). Nothing here looks at a
clock, a socket or a broker's counters.

The promise (docs/design.md 3.8, docs/operations.md "Shared subscriptions"): each message
acknowledged to its publisher reaches at least one member of the group (a member *has* a
message once it received it), and a second member gets it only as a re-send after the first
holder lost it: its connection ended (or it never wrote the acknowledgement: ``unacked``),
its node was killed or stopped, or its node was cut off from the message's origin (the
origin re-sends after ``mesh.shared_reroute``) by a fault or by a link the nodes lost on their
own (``link lost``: nodelogs.py); or the publisher itself sent the message on
more than one connection (``inbound``: the mesh took it in twice). Each delivery to a
further member is a *re-send*, classified by the first of these that explains it relative to
an earlier holder's delivery (``CLASSES``, in that order); ``unexplained`` is a finding.
The common checks (QoS 2 twice to the *same* member, packet-id reuse, session present, ...)
are ``checker.check``'s, made per member; a clean member's each connection is its own session,
so what it had on two is a re-send to a second member, not one session's duplicate.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from mqttmesh.sim.history import History
from mqttmesh.sim.shared_checks import node_at  # (a client's session's home at a time)
from mqttmesh.topics import filter_matches

from .checker import ChaosCheck, check, expiry_of

__all__ = ["CLASSES", "LEFT_WITHIN", "BEFORE", "SharedCheck", "check_shared"]

CLASSES = ("unacked", "member left", "node killed", "node paused", "cut off", "link lost", "inbound", "unexplained")
# a holder's connection that ended this soon after it received a message may not have
# delivered its acknowledgement (written in the same turn of the client's loop, read by the
# node later); a later end says nothing of it
LEFT_WITHIN = 2.0
# a connection the node closed (its minority side, a take-over) ended there before its client
# read the end: the node may hand on what it held, and another member get it, that much earlier
# (seen: 12 ms) than the close in the history
SEEN_LATE = 1.0
SERVER_ENDS = ("closed by the server", "recv:")
# a fault on the holder's node explains a re-send when it held at some time from the message's
# publication (less this, the publisher's clock against the nemesis's) to the second delivery:
# the origin may have sent it to the node during the fault, and re-sent it after
# ``mesh.shared_reroute`` while the node delivered the first copy only after the heal
BEFORE = 0.5
# a copy that an origin re-sent after ``mesh.shared_reroute`` (5 s) out of reach comes this long
# after its publication at least (less the clients' and the nodes' slack)
REROUTED_AFTER = 4.0


@dataclass
class SharedCheck:
    base: ChaosCheck  # the common checks, per member (checker.check)
    members: list[str] = field(default_factory=list)
    checked: int = 0  # acknowledged messages the group had to get (a member subscribed in time)
    lost: list[tuple[str, float]] = field(default_factory=list)  # (msg id, acknowledged at)
    # one per delivery to a further member: msg, qos, (first member, conn, node, t), (member, t),
    # class, detail
    resends: list[dict[str, Any]] = field(default_factory=list)
    per_member: dict[str, int] = field(default_factory=dict)  # member -> messages it received
    # per lost message, what the history says around it (``_lost_context``): for the analysis
    lost_context: list[dict[str, Any]] = field(default_factory=list)

    def by_class(self, qos: int | None = None) -> dict[str, int]:
        counts = Counter(r["class"] for r in self.resends if qos is None or r["qos"] == qos)
        return {c: counts.get(c, 0) for c in CLASSES}

    @property
    def unexplained(self) -> list[dict[str, Any]]:
        return [r for r in self.resends if r["class"] == "unexplained"]

    @property
    def qos2_inbound(self) -> list[dict[str, Any]]:
        """QoS 2 messages a second member had only because their publisher sent them again
        (before its PUBREC, on another connection): once-only is the mesh's to keep there, as
        for a plain subscriber (checker.py counts those inbound duplicates against it)."""
        return [r for r in self.resends if r["class"] == "inbound" and r["qos"] == 2]

    def spread(self) -> tuple[float, float] | None:
        """The smallest and largest member's share of the messages over the fair one."""
        if not self.members or not sum(self.per_member.values()):
            return None
        fair = sum(self.per_member.values()) / len(self.members)
        shares = [self.per_member.get(m, 0) / fair for m in self.members]
        return round(min(shares), 2), round(max(shares), 2)

    @property
    def failed(self) -> bool:
        return bool(self.base.failed or self.lost or self.unexplained or self.qos2_inbound)

    def summary(self) -> dict[str, Any]:
        s = self.base.summary()
        s.update(
            {
                "shared": True,
                "members": self.members,
                "checked": self.checked,
                "lost": len(self.lost),
                "resends": len(self.resends),
                "resends_by_class": self.by_class(),
                "resends_qos2": sum(1 for r in self.resends if r["qos"] == 2),
                "resends_qos2_by_class": self.by_class(2),
                "resends_qos2_inbound": len(self.qos2_inbound),
                "unexplained": len(self.unexplained),
                "per_member": dict(sorted(self.per_member.items())),
                "spread": self.spread(),
                "failed": self.failed,
            }
        )
        return s


def check_shared(
    history: History,
    persistent: set[str],
    settle: float = 2.0,
    connections: dict[str, int] | None = None,
    pauses: dict[str, list[tuple[float, float]]] | None = None,
    faults: list[dict[str, Any]] | None = None,
) -> SharedCheck:
    """Judge ``history`` for one shared group: its members are the clients that subscribed a
    ``$share/...`` filter. A message must reach a member when one had its first SUBACK at
    least ``settle`` seconds before the message was invoked. ``faults``: ``nemesis.windows_of``
    (kind, start, end, node, sides, link per fault, on the history's clock)."""
    r = SharedCheck(base=check(history, persistent, settle, connections, pauses, per_subscriber=False))
    share_filters: dict[str, list[str]] = {}  # member -> the filters after $share/{group}/
    first_sub: dict[str, float] = {}
    node_of: dict[str, str] = {}  # connection -> node
    node_now: dict[str, str] = {}  # client -> node of its accepted connection
    invoked: dict[str, tuple[float, str, int]] = {}  # msg id -> (t, topic, qos)
    origins: dict[str, set[str]] = {}  # msg id -> nodes its publisher sent it to
    sent_on: dict[str, set[str]] = {}  # msg id -> the publisher's connections it went on
    acked: dict[str, float] = {}
    firsts: dict[str, list[tuple[float, str, str]]] = {}  # msg id -> (t, member, conn) first receipts
    had: set[tuple[str, str]] = set()  # (member session, msg id): _session
    per_client: dict[tuple[str, str], list[str]] = {}  # (client, msg id) -> connections it came on
    closes: dict[str, tuple[float, str]] = {}  # connection -> (t, reason)
    unacked: dict[str, set[str]] = {}  # connection -> msg ids never acknowledged on it
    conn_now: dict[str, str] = {}  # client -> its accepted connection
    accepted: dict[str, list[tuple[float, str]]] = {}  # client -> (t, node) of its accepted connections
    conns_of: dict[str, list[tuple[float, str]]] = {}  # client -> (t, connection) of the same
    acked_on: dict[str, str] = {}  # msg id -> the publisher's connection that had the acknowledgement
    for op in history.ops:
        t, client, what, kind = op[0], op[1], op[2], op[3]
        if kind == "connect":
            if what == "invoke":
                node_of[op[4]] = op[5]
            elif what == "ok":
                node_now[client] = node_of.get(op[4], op[5])
                conn_now[client] = op[4]
                accepted.setdefault(client, []).append((t, node_now[client]))
                conns_of.setdefault(client, []).append((t, op[4]))
        elif kind == "subscribe":
            shares = [f.split("/", 2)[2] for f, q in op[4] if f.startswith("$share/") and f.count("/") >= 2]
            if shares:
                share_filters.setdefault(client, shares)
                first_sub.setdefault(client, t)
        elif kind == "publish":
            msg_id = op[4]
            if what == "invoke":
                invoked[msg_id] = (t, op[5], op[6])
            elif what == "ok":
                acked.setdefault(msg_id, t)
                acked_on.setdefault(msg_id, conn_now.get(client, ""))
                continue
            elif what != "resend":
                continue
            if client in node_now:
                origins.setdefault(msg_id, set()).add(node_now[client])
            sent_on.setdefault(msg_id, set()).add(conn_now.get(client, ""))
        elif kind == "receive" and client in share_filters:
            per_client.setdefault((client, op[4]), []).append(op[8])
            if (_session(client, op[8], persistent), op[4]) not in had:
                had.add((_session(client, op[8], persistent), op[4]))
                firsts.setdefault(op[4], []).append((t, client, op[8]))
        elif kind == "close":
            closes.setdefault(op[4], (t, op[6]))
        elif kind == "unacked":
            unacked.setdefault(op[4], set()).update(op[5])
    r.members = sorted(share_filters)
    for client, _ in per_client:
        r.per_member[client] = r.per_member.get(client, 0) + 1
    # a clean member's next connection is another session: a QoS 2 message it had on each of
    # two is a re-send to another member (judged below), not one session's duplicate
    # (only repeats on one connection stay: as many as its connections repeat)
    keep = {k: len(conns) - len(set(conns)) for k, conns in per_client.items() if k[0] not in persistent}
    dups = []
    for d in r.base.qos2_dups:
        left = keep.get((d[1], d[0]))
        if left is None or left > 0:
            dups.append(d)
            if left is not None:
                keep[(d[1], d[0])] = left - 1
    r.base.qos2_dups = dups
    t_group = min(first_sub.values(), default=float("inf"))
    for msg_id in sorted(acked):
        if msg_id not in invoked:
            continue
        t_inv, topic, qos = invoked[msg_id]
        if qos == 0 or expiry_of(topic) is not None:  # (one that may expire is never lost)
            continue
        if t_inv < t_group + settle or not any(filter_matches(f, topic) for fs in share_filters.values() for f in fs):
            continue
        r.checked += 1
        if msg_id not in firsts:
            r.lost.append((msg_id, acked[msg_id]))
            conn = acked_on.get(msg_id, "")
            r.lost_context.append(
                _lost_context(msg_id, qos, t_inv, acked[msg_id], conn, node_of, closes, share_filters, faults or [])
            )
    for msg_id, receipts in sorted(firsts.items()):
        if len(receipts) < 2:
            continue
        qos = invoked[msg_id][2] if msg_id in invoked else 0
        for i in range(1, len(receipts)):
            t2, member, conn2 = receipts[i]
            cls, detail, first = "unexplained", "", receipts[0]
            for earlier in receipts[:i]:
                t_inv = invoked[msg_id][0] if msg_id in invoked else earlier[0]
                # where a copy may have been held: the node of a delivery, its member's home
                # when the message was published (a persistent member's queue)
                near, later = (
                    {node_of.get(c), node_at(accepted.get(m, []), t_inv)} - {None}
                    for m, c in ((earlier[1], earlier[2]), (member, conn2))
                )
                # the earlier copy may be the origin's re-send, the later one the first copy,
                # delivered after the heal (a killed node keeps it only in a persistent queue)
                far = later if earlier[0] >= t_inv + REROUTED_AFTER else set()
                handed = _handed_on(member, conn2, t_inv, earlier[0], t2, persistent, conns_of, closes, node_of)
                c, d = _explain(
                    msg_id,
                    earlier,
                    t_inv,
                    t2,
                    near,
                    far,
                    later if member in persistent else set(),
                    sent_on,
                    origins,
                    closes,
                    unacked,
                    faults or [],
                    handed,
                )
                if CLASSES.index(c) < CLASSES.index(cls):
                    cls, detail, first = c, d, earlier
            r.resends.append(
                {
                    "msg": msg_id,
                    "qos": qos,
                    "first": [first[1], first[2], node_of.get(first[2], "?"), round(first[0], 3)],
                    "again": [member, conn2, node_of.get(conn2, "?"), round(t2, 3)],
                    "class": cls,
                    "detail": detail,
                }
            )
    return r


def _lost_context(
    msg_id: str,
    qos: int,
    t_inv: float,
    t_ack: float,
    conn: str,
    node_of: dict[str, str],
    closes: dict[str, tuple[float, str]],
    members: dict[str, list[str]],
    faults: list[dict[str, Any]],
) -> dict[str, Any]:
    """A lost message's surroundings: the node that acknowledged it, how that connection ended,
    the members' connections that ended from its publication to ``mesh.shared_reroute`` (5 s)
    after, and the faults on that node then."""
    node = node_of.get(conn, "?")
    end = closes.get(conn)
    t_end = t_ack + 6.0
    ended = sorted(
        (round(t, 3), c, reason)
        for c, (t, reason) in closes.items()
        if c.split("/")[0] in members and t_inv <= t <= t_end
    )
    touching = [
        f"{f['what']} [{f['start']:.2f}, {f['end']:.2f}]"
        for f in faults
        if f["start"] <= t_end
        and f["end"] >= t_inv - BEFORE
        and (
            f.get("node") == node or any(node in side for side in f.get("sides") or ()) or node in (f.get("link") or ())
        )
    ]
    return {
        "msg": msg_id,
        "qos": qos,
        "invoked": round(t_inv, 3),
        "acked": round(t_ack, 3),
        "acked_by": [conn, node],
        "publisher_conn_ended": None if end is None else [round(end[0], 3), end[1]],
        "members_conns_ended": ended,
        "faults_on_that_node": touching,
    }


def _explain(
    msg_id: str,
    earlier: tuple[float, str, str],
    t_inv: float,
    t2: float,
    near: set[str],
    far: set[str],
    kept: set[str],
    sent_on: dict[str, set[str]],
    origins: dict[str, set[str]],
    closes: dict[str, tuple[float, str]],
    unacked: dict[str, set[str]],
    faults: list[dict[str, Any]],
    handed: tuple[str, str] | None = None,
) -> tuple[str, str]:
    """Why a member may have got ``msg_id`` (published at ``t_inv``) at ``t2`` after ``earlier``
    (t, member, conn) had it. ``near``: where the earlier copy was held; ``far``: where the later
    one may have been held while the earlier was a re-send; ``kept``: where the later one may
    have been kept through a kill or a stop (a persistent member's queue, restored from the
    store, or waiting in a stopped process); ``handed``: (node, node) when the later member is
    a persistent one whose connection on the first node ended around the earlier copy (that
    node handed what the session held on to another member), and which got it on the second:
    a fault between the two kept the session's other copies from hearing of the hand-on."""
    t1, _, conn = earlier
    if msg_id in unacked.get(conn, ()):
        return "unacked", f"{conn} ended without its acknowledgement"
    end = closes.get(conn)
    by_node = end is not None and end[1].startswith(SERVER_ENDS)
    if end is not None and t1 <= end[0] <= min(t2 + (SEEN_LATE if by_node else 0.0), t1 + LEFT_WITHIN):
        return "member left", f"{conn} ended {end[0] - t1:.2f}s after: {end[1]}"
    best: tuple[str, str] = ("unexplained", "")
    src = origins.get(msg_id, set())
    for f in faults:
        if not (f["start"] <= t2 and f["end"] >= t_inv - BEFORE):
            continue
        kind = f["kind"]
        nodes = near | far
        if kind == "kill" and f.get("node") in near | kept:
            cls = "node killed"
        elif kind == "pause" and f.get("node") in nodes | kept:
            cls = "node paused"
        elif kind.startswith("partition") and _apart(nodes, src, f.get("sides") or ((), ())):
            cls = "cut off"
        elif kind == "flap" and _apart(nodes, src, [f["link"][:1], f["link"][1:]]):
            cls = "cut off"
        elif (
            handed is not None
            and kind.startswith("partition")
            and _apart({handed[0]}, {handed[1]}, f.get("sides") or ((), ()))
        ):
            cls = "cut off"
        elif kind == "link lost" and _apart(nodes, src, [f["link"][:1], f["link"][1:]]):
            cls = "link lost"  # (not injected: a node's log, nodelogs.py)
        else:
            continue
        if CLASSES.index(cls) < CLASSES.index(best[0]):
            best = (cls, f"{f['what']} [{f['start']:.2f}, {f['end']:.2f}]")
    if best[0] == "unexplained" and len(sent_on.get(msg_id, ())) > 1:
        return "inbound", f"published on {len(sent_on[msg_id])} connections"
    return best


def _handed_on(
    member: str,
    conn2: str,
    t_inv: float,
    t1: float,
    t2: float,
    persistent: set[str],
    conns_of: dict[str, list[tuple[float, str]]],
    closes: dict[str, tuple[float, str]],
    node_of: dict[str, str],
) -> tuple[str, str] | None:
    """(the node a persistent ``member``'s connection ended on around the earlier copy at
    ``t1``, the node of its connection ``conn2`` that got the message at ``t2``), or None. The
    fault harness, 7 nodes, 3.1.1, seed 1: sub0's node n5, cut off into a minority, closed it
    with a QoS 1 message in flight and handed the message to csub5 there; sub0's copies on the
    majority side never heard, and sent it again (DUP) when sub0 came back on n2."""
    if member not in persistent:
        return None
    for t, conn in conns_of.get(member, []):
        if t > t1 or conn == conn2:
            continue
        end = closes.get(conn)
        if end is not None and t_inv - BEFORE <= end[0] <= min(t2, t1 + SEEN_LATE) and conn2 in node_of:
            return node_of.get(conn, ""), node_of[conn2]
    return None


def _session(client: str, conn: str, persistent: set[str]) -> str:
    """A member's session: a persistent client's is one across its connections, a clean
    client's lasts one connection."""
    return client if client in persistent else conn


def _apart(nodes: set[str], origins: set[str], sides: Any) -> bool:
    """Was one of ``nodes`` on the other side of the partition from one of the message's origins?"""
    a, b = set(sides[0]), set(sides[1])
    return any((n in a and o in b) or (n in b and o in a) for n in nodes for o in origins)
