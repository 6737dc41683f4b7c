"""Shared subscriptions judged from the clients' history (issue 24; docs/simulation.md, "Shared groups").

Pure, and free of simulator imports, as history.py: what it is given is a client history
(``join``, ``leave``, ``close``, ``receive``, ``publish`` ops), the windows in which the
mesh was disturbed (faults, from the scenario) and, for the control traffic, the interest
deltas the simulator read off the wire. It leaves to its caller what a fault is and how
long detection takes: ``margin``.

- ``check_once``: each message matching a group's filter reaches exactly one member of the
  group. A second copy is allowed only when the history shows why: one of the receivers left
  the group around the two copies (it left holding it: the node hands what a leaving member
  had not acknowledged to another member, maybe before the copy on its way to it arrives),
  or a fault window overlaps the message's way (a chosen node dead or cut off: its origin sends it again elsewhere after
  ``mesh.shared_reroute``). A message that reached no member is a violation only when the
  group certainly had a member to reach: one whose membership spanned the message's window
  (``settle`` before it to ``window`` after), no fault window overlapped that window, the
  publisher had the message acknowledged (QoS 1/2), and no member left in the window holding
  it at a QoS that goes with its connection (0, or 2 [MQTT-4.8.2-5]).
- ``check_spread``: in each interval where a group's membership and the mesh stayed the same
  (less ``settle`` after a change and ``window`` before the next), the members' shares, by
  strategy: ``round_robin``: each node with members gets, from each origin, the node's turns
  of that origin's QoS 0/1 messages, as many as its weight (its members, a power of two), so
  the nodes' counts per unit of weight differ by at most the number of origins (plus the
  messages of the interval no member got); ``round_robin`` and ``local``: the members
  of one node take turns, so their counts differ by at most 1 (plus those missed);
  ``hash_topic``, ``hash_clientid``, ``sticky``: one member per topic, per publisher, per
  origin node.
- ``check_control``: a membership change costs the mesh nothing unless it is its node's first
  member of the group, or its last, or takes the number of its members across a power of two
  (the weight the node advertises with the group, shared.py ``advertisement``); each of those
  is one interest delta (the node's entry added, removed, or one for the other), flooded: at
  most ``copies_per_link`` copies per link.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..topics import filter_matches

__all__ = [
    "Membership",
    "OnceCheck",
    "SpreadCheck",
    "ControlCheck",
    "memberships",
    "node_at",
    "check_once",
    "check_spread",
    "check_control",
    "overlaps",
]

Op = tuple[Any, ...]
Windows = list[tuple[float, float]]
END = float("inf")


@dataclass
class Membership:
    """One member's membership of one group on one connection, in node time."""

    client: str
    conn: str
    node: str
    share: str
    qos: int  # granted (-1: no SUBACK came)
    begin: float  # when its node took the SUBSCRIBE
    end: float = END  # when its node took its leave (UNSUBSCRIBE, DISCONNECT, reset) or its connection ended
    how: str = ""  # how it ended: unsubscribe, disconnect, drop, move, close


def filter_of(share: str) -> str:
    return share.split("/", 2)[2]


def memberships(history: Any) -> list[Membership]:
    """Every membership the history shows (a SUBSCRIBE refused: none), in order of begin."""
    out: list[Membership] = []
    open_: dict[tuple[str, str], Membership] = {}  # (conn, share) -> its open membership
    by_conn: dict[str, list[Membership]] = {}
    closed: set[str] = set()  # (a client that has not noticed yet may still write on one)
    for op in history.ops:
        kind = op[3]
        if kind == "join":
            _t, client, what, _k, conn, node, share, qos, at = op[:9]
            if conn in closed:
                continue
            if what == "invoke":
                m = Membership(client, conn, node, share, -1, at)
                open_[(conn, share)] = m
                by_conn.setdefault(conn, []).append(m)
                out.append(m)
            elif what == "ok" and (conn, share) in open_:
                open_[(conn, share)].qos = qos
            elif what == "fail" and (conn, share) in open_:
                m = open_.pop((conn, share))
                out.remove(m)
                by_conn[conn].remove(m)
        elif kind == "leave":
            gone = open_.pop((op[4], op[6]), None)
            if gone is not None:
                gone.end, gone.how = op[8], op[7]
        elif kind == "close":
            closed.add(op[4])
            for m in by_conn.pop(op[4], []):
                if m.end == END or m.end > op[0]:
                    m.end, m.how = op[0], m.how or "close"
                open_.pop((op[4], m.share), None)
    return out


def overlaps(windows: Windows, t0: float, t1: float) -> bool:
    return any(a <= t1 and b >= t0 for a, b in windows)


@dataclass
class OnceCheck:
    checked: int = 0  # (message, group) pairs judged
    delivered: int = 0  # ... that reached exactly one member
    unreachable: int = 0  # ... that reached none, with no member certainly in reach (allowed, counted)
    resent_after_leave: int = 0  # second copies after a receiver left holding the message
    resent_after_fault: int = 0  # second copies while a fault window overlapped the message's way
    twice: list[tuple[str, str, str]] = field(default_factory=list)  # (msg id, share, why) violations
    lost: list[tuple[str, str, str]] = field(default_factory=list)  # (msg id, share, why) violations


def _publications(history: Any) -> tuple[dict[str, tuple[float, str, int]], set[str]]:
    invoked: dict[str, tuple[float, str, int]] = {}
    acked: set[str] = set()
    for op in history.ops:
        if op[3] == "publish":
            if op[2] == "invoke":
                invoked[op[4]] = (op[0], op[5], op[6])
            elif op[2] == "ok":
                acked.add(op[4])
    return invoked, acked


def check_once(
    history: Any,
    faults: Windows,
    settle: float,
    window: float,
    margin: float,
    lossy: bool = False,
    lost_margin: float | None = None,
) -> OnceCheck:
    """``faults``: the windows a fault disturbed the mesh in; ``margin``: how long after its
    window a fault may still send a message again (detection and ``mesh.shared_reroute``);
    ``lost_margin``: how long after it the mesh may not know yet where the members are
    (detection; default ``margin``); ``lossy``: QoS 0 messages may be lost on the way."""
    r = OnceCheck()
    ms = memberships(history)
    shares = sorted({m.share for m in ms})
    member_of = {m.client: m.share for m in ms}
    conns: dict[str, list[Membership]] = {}
    for m in ms:
        conns.setdefault(m.conn, []).append(m)
    invoked, acked = _publications(history)
    got: dict[tuple[str, str], list[Op]] = {}  # (msg id, share) -> receptions by its members
    for op in history.ops:
        if op[3] == "receive" and op[1] in member_of:
            got.setdefault((op[4], member_of[op[1]]), []).append(op)
    wide = [(a, b + margin) for a, b in faults]
    near = wide if lost_margin is None else [(a, b + lost_margin) for a, b in faults]
    for msg_id, (t_pub, topic, qos) in sorted(invoked.items(), key=lambda kv: (kv[1][0], kv[0])):
        for share in shares:
            if not filter_matches(filter_of(share), topic):
                continue
            r.checked += 1
            copies = got.get((msg_id, share), [])
            if len(copies) == 1:
                r.delivered += 1
            elif copies:
                r.delivered += 1
                for i in range(1, len(copies)):
                    later = copies[i]
                    # a receiver that left holding it: its node re-sent what it had not had
                    # acknowledged, maybe before the copy in flight to it arrived (either order)
                    if any(
                        min(op[0], later[0]) - 1.0 <= m.end <= max(op[0], later[0])
                        for op in copies[:i]
                        for m in (*conns.get(op[8], ()), *conns.get(later[8], ()))
                        if m.share == share
                    ):
                        r.resent_after_leave += 1
                    elif overlaps(wide, t_pub, later[0]):
                        r.resent_after_fault += 1
                    else:
                        who = ", ".join(f"{op[1]} ({op[8]}) at {op[0]:.3f}s" for op in copies[: i + 1])
                        r.twice.append((msg_id, share, f"reached {who}; no receiver left, no fault between"))
            else:
                why = _must_reach(ms, share, t_pub, qos, msg_id in acked, near, settle, window, lossy)
                if why is None:
                    r.unreachable += 1
                else:
                    r.lost.append((msg_id, share, why))
    return r


def _must_reach(
    ms: list[Membership],
    share: str,
    t: float,
    qos: int,
    acked: bool,
    faults: Windows,
    settle: float,
    window: float,
    lossy: bool,
) -> str | None:
    """Why a message that reached no member of ``share`` should have (None: it may not have)."""
    if (qos and not acked) or (not qos and lossy) or overlaps(faults, t - settle, t + window):
        return None
    mine = [m for m in ms if m.share == share]
    steady = [m for m in mine if m.qos >= 0 and m.begin <= t - settle and m.end >= t + window]
    if not steady:
        return None
    for m in mine:  # a member that left with it, at a QoS that goes with its connection
        if t - 1.0 <= m.end <= t + window and min(qos, max(m.qos, 0)) != 1:
            return None
    left = sorted((m for m in mine if t - settle <= m.end <= t + window), key=lambda m: abs(m.end - t))
    note = ""
    if left:  # (the leave nearest the message: the node its origin chose may have lost its last member)
        m = left[0]
        note = f"; {m.client} left {m.node} at {m.end:.3f}s ({m.how}, {m.end - t:+.3f}s)"
    return f"published at {t:.3f}s (QoS {qos}), {steady[0].client} a member on {steady[0].node} throughout{note}"


@dataclass
class SpreadCheck:
    intervals: int = 0  # stable intervals with counted messages
    counted: int = 0  # first receptions counted
    worst_nodes: float = 0.0  # round_robin: the largest spread between two nodes' counts per unit of weight
    worst_members: int = 0  # round_robin, local: the largest spread between members of one node
    broken: list[tuple[str, str]] = field(default_factory=list)  # (share, what)


def _origins(history: Any) -> dict[str, list[tuple[float, str]]]:
    """Client -> (time, node) of each accepted connection."""
    out: dict[str, list[tuple[float, str]]] = {}
    for op in history.ops:
        if op[3] == "connect" and op[2] == "ok":
            out.setdefault(op[1], []).append((op[0], op[5]))
    return out


def node_at(conns: list[tuple[float, str]], t: float) -> str | None:
    """The node of the last of ``conns`` (time, node), in time order, at or before ``t``
    (also the fault harness's: bench/chaos/sharecheck.py)."""
    node = None
    for at, n in conns:
        if at > t:
            break
        node = n
    return node


def check_spread(
    history: Any, strategy: str, faults: Windows, settle: float, window: float, margin: float
) -> SpreadCheck:
    r = SpreadCheck()
    ms = memberships(history)
    invoked, _acked = _publications(history)
    origins = _origins(history)
    first: dict[tuple[str, str], str] = {}  # (msg id, share) -> the member that got it first
    member_of = {m.client: m.share for m in ms}
    for op in history.ops:
        if op[3] == "receive" and op[1] in member_of:
            first.setdefault((op[4], member_of[op[1]]), op[1])
    wide = [(a, b + margin) for a, b in faults]
    for share in sorted({m.share for m in ms}):
        mine = [m for m in ms if m.share == share and m.qos >= 0]
        edges = sorted({m.begin for m in mine} | {m.end for m in mine if m.end != END})
        bounds = [0.0, *edges, END]
        f = filter_of(share)
        for a, b in zip(bounds, bounds[1:], strict=False):
            lo, hi = a + settle, b - window
            if hi <= lo or overlaps(wide, lo - settle, hi + window):
                continue
            present = [m for m in mine if m.begin <= a and m.end >= b]
            if not present:
                continue
            msgs = [
                (mid, t, topic, q)
                for mid, (t, topic, q) in invoked.items()
                if lo <= t <= hi and filter_matches(f, topic)
            ]
            if msgs:
                _judge_interval(r, share, strategy, present, msgs, first, origins)
    return r


def _judge_interval(
    r: SpreadCheck,
    share: str,
    strategy: str,
    present: list[Membership],
    msgs: list[tuple[str, float, str, int]],
    first: dict[tuple[str, str], str],
    origins: dict[str, list[tuple[float, str]]],
) -> None:
    node_of = {m.client: m.node for m in present}
    per_member = {m.client: 0 for m in present}
    turned = {m.client: 0 for m in present}  # (of them, QoS 0/1: the origins' turns chose their node)
    missed = 0
    keys: dict[str, set[str]] = {}  # topic / publisher / origin -> the members that got its messages
    pubs: set[str] = set()
    for mid, t, topic, qos in msgs:
        who = first.get((mid, share))
        publisher = mid.rpartition(":")[0]
        origin = node_at(origins.get(publisher, []), t) or publisher
        pubs.add(origin)
        if who is None or who not in per_member:
            missed += 1
            continue
        per_member[who] += 1
        if qos < 2:
            turned[who] += 1
        key = topic if strategy == "hash_topic" else publisher if strategy == "hash_clientid" else origin
        keys.setdefault(key, set()).add(who)
    r.intervals += 1
    r.counted += sum(per_member.values())
    span = f"{min(m[1] for m in msgs):.3f}-{max(m[1] for m in msgs):.3f}s"
    if strategy in ("hash_topic", "hash_clientid", "sticky"):
        for key, members in sorted(keys.items()):
            if len(members) > 1:
                r.broken.append((share, f"{span}: {strategy} sent the messages of {key} to {sorted(members)}"))
        return
    if strategy not in ("round_robin", "local"):
        return
    by_node: dict[str, list[int]] = {}
    for client, n in per_member.items():
        by_node.setdefault(node_of[client], []).append(n)
    for node, counts in sorted(by_node.items()):
        spread = max(counts) - min(counts)
        r.worst_members = max(r.worst_members, spread)
        if spread > 1 + missed:
            r.broken.append((share, f"{span}: the members on {node} got {sorted(counts)} (bound 1 + {missed} missed)"))
    if strategy == "round_robin" and len(by_node) > 1:
        # each origin's turns weigh a node by its members (a power of two, shared.py
        # ``advertisement``): per unit of weight the nodes' counts differ by at most the number
        # of origins; a QoS 2 message's node goes by its id (mesh/routing/shares.py), not a turn
        totals: dict[str, int] = {}
        for client, n in turned.items():
            totals[node_of[client]] = totals.get(node_of[client], 0) + n
        per_weight = {node: totals[node] / (_advertised_as(len(by_node[node])) or 1) for node in totals}
        uneven = max(per_weight.values()) - min(per_weight.values())
        r.worst_nodes = max(r.worst_nodes, round(uneven, 2))
        if uneven > len(pubs) + missed:
            got = dict(sorted(totals.items()))
            weights = {node: _advertised_as(len(c)) for node, c in sorted(by_node.items())}
            r.broken.append(
                (share, f"{span}: the nodes got {got}, weighed {weights}, from {len(pubs)} origins (+{missed} missed)")
            )


@dataclass
class ControlCheck:
    changes: int = 0  # membership changes (joins and leaves) at the nodes
    needed: int = 0  # of them, a node's first member of a group or its last
    deltas: int = 0  # interest deltas that added or removed a group, per (node, group)
    copies: int = 0  # their copies on the links
    worst_copies: int = 0  # the most copies of one delta
    extra: list[tuple[str, str, str]] = field(default_factory=list)  # (node, share, what): more deltas than needed
    heavy: list[tuple[str, int, int]] = field(default_factory=list)  # (delta, copies, bound)


def _advertised_as(members: int) -> int | None:
    """What a node advertises of a group with ``members`` connected members (shared.py
    ``advertisement``): the largest power of two not above it, None for none."""
    return None if members <= 0 else 1 << (members.bit_length() - 1)


def check_control(
    history: Any, deltas: dict[tuple[str, int, int], tuple[list[str], int]], links: int, copies_per_link: int = 2
) -> ControlCheck:
    """``deltas``: (node, incarnation, version) of each interest delta the simulator saw carry
    a ``$share/`` change -> (its changes, "+share" / "-share", and its copies on the links);
    ``links``: the links of the topology."""
    r = ControlCheck()
    events: dict[tuple[str, str], list[tuple[float, int]]] = {}
    for m in memberships(history):
        events.setdefault((m.node, m.share), []).append((m.begin, 1))
        if m.end != END:
            events.setdefault((m.node, m.share), []).append((m.end, -1))
    needed: dict[tuple[str, str], int] = {}
    for key, evs in events.items():
        count = flips = 0
        for _t, d in sorted(evs, key=lambda e: (e[0], -e[1])):  # (a join and a leave at once: no flip)
            before = count
            count += d
            r.changes += 1
            was, now = _advertised_as(before), _advertised_as(count)
            if was != now:  # (one entry removed, one added: its first member, its last, a power of two)
                flips += (was is not None) + (now is not None)
        needed[key] = flips
        r.needed += flips
    seen: dict[tuple[str, str], int] = {}
    bound = copies_per_link * links
    for (node, inc, ver), (changes, copies) in sorted(deltas.items()):
        r.copies += copies
        r.worst_copies = max(r.worst_copies, copies)
        if copies > bound:
            r.heavy.append((f"{node}/{inc}/{ver}", copies, bound))
        for change in changes:
            key = (node, change[1:].partition("\0")[0])  # (with its weight: the group)
            seen[key] = seen.get(key, 0) + 1
            r.deltas += 1
    for key, n in sorted(seen.items()):
        if n > needed.get(key, 0):
            r.extra.append(
                (
                    key[0],
                    key[1],
                    f"{n} interest changes for {needed.get(key, 0)} needed (first joins, last leaves, powers of two)",
                )
            )
    return r
