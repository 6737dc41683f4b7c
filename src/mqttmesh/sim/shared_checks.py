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
  it at a QoS that goes with its connection (0, or 2 [MQTT-4.8.2-5]; a CleanSession=0
  member's session keeps a QoS 2 message [MQTT-4.8.2-4]). A CleanSession=0 member is a
  member while its client is away too (its session queues at its home, for QoS 1/2): the
  message must reach some member by the end, maybe that one when it returns. A message with
  a Message Expiry Interval that ends before the end of the run may expire on a fault's
  delay or in a queue [MQTT-3.3.2-5]: only a member connected throughout, no fault near,
  makes its loss a violation (else counted ``may_expire``). A second copy
  to one such member's session (it took the message again after a reconnection) is no
  second member's.
- ``check_sessions_once``: a QoS 2 message reaches a member's session at most once as a new
  message [MQTT-4.3.3-2]: a CleanSession=0 member's session across its connections, a
  CleanSession=1 member's on its connection; a re-send the client took as one (its packet id
  still awaiting PUBREL: the history's ``repeat``) is no new message.
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
  most ``copies_per_link`` copies per link. A CleanSession=0 member whose client leaves stays
  a member of its node's group, queueing if granted QoS 1/2 (the node tells the mesh when
  that is all it has there, shared.py ``QUEUED``), until its client comes back, here or
  elsewhere; its old home lets it go when told (``check_control``'s ``apart``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..topics import filter_matches

__all__ = [
    "Membership",
    "OnceCheck",
    "SessionCheck",
    "SpreadCheck",
    "ControlCheck",
    "memberships",
    "node_at",
    "check_once",
    "check_sessions_once",
    "check_spread",
    "check_control",
    "overlaps",
]

Op = tuple[Any, ...]
Windows = list[tuple[float, float]]
Apart = Callable[[str, str], Windows]  # the windows in which two nodes had no path between them
Cut = Callable[[str], Windows]  # ... in which a message's origin had none to a node
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
    persistent: bool = False  # a CleanSession=0 member's: its session stays a member while its client is away


def filter_of(share: str) -> str:
    return share.split("/", 2)[2]


def memberships(history: Any) -> list[Membership]:
    """Every membership the history shows (a SUBSCRIBE refused: none), in order of begin: a
    CleanSession=0 member has one per connection on which it subscribed or found its session
    with the subscription (``resume``)."""
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
            if what in ("invoke", "resume"):
                m = Membership(client, conn, node, share, qos if what == "resume" else -1, at)
                m.persistent = len(op) > 9 and bool(op[9])
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
    again: int = 0  # copies to a CleanSession=0 member that had the message (its session's re-send)
    queued: int = 0  # QoS 1/2 pairs that reached a member with none connected throughout, a session queueing
    may_expire: int = 0  # pairs with a Message Expiry Interval that reached none and may have expired on the way
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


def _expiries(history: Any) -> dict[str, int]:
    """Msg id -> the Message Expiry Interval its MQTT 5 PUBLISH gave it (history.py ``publish``)."""
    return {op[4]: op[7] for op in history.ops if op[3] == "publish" and op[2] == "invoke" and len(op) > 7}


def check_once(
    history: Any,
    faults: Windows,
    settle: float,
    window: float,
    margin: float,
    lossy: bool = False,
    lost_margin: float | None = None,
    end: float = END,
    apart: Apart | None = None,
) -> OnceCheck:
    """``faults``: the windows a fault disturbed the mesh in; ``margin``: how long after its
    window a fault may still send a message again (detection and ``mesh.shared_reroute``);
    ``lost_margin``: how long after it the mesh may not know yet where the members are
    (detection; default ``margin``); ``lossy``: QoS 0 messages may be lost on the way;
    ``end``: the end of the run (a CleanSession=0 member away at a message is in reach only
    if its client came back ``window`` before it); ``apart``: the windows in which two nodes
    had no path between them (given: a fault excuses a message no more if its origin kept a
    path to a node with a member connected throughout, the path widened by ``lost_margin``)."""
    r = OnceCheck()
    ms = memberships(history)
    widen = margin if lost_margin is None else lost_margin
    origins = _origins(history) if apart is not None else {}
    cut_of: dict[tuple[str, str], Windows] = {}

    def cut(origin: str | None) -> Cut | None:
        if apart is None or origin is None:
            return None

        def windows(node: str) -> Windows:
            key = (origin, node)
            if key not in cut_of:
                cut_of[key] = [(a - 1.0, b + widen) for a, b in apart(origin, node)]
            return cut_of[key]

        return windows

    shares = sorted({m.share for m in ms})
    member_of = {m.client: m.share for m in ms}
    persistent = {m.client for m in ms if m.persistent}
    conns: dict[str, list[Membership]] = {}
    for m in ms:
        conns.setdefault(m.conn, []).append(m)
    invoked, acked = _publications(history)
    expiry = _expiries(history)
    got: dict[tuple[str, str], list[Op]] = {}  # (msg id, share) -> receptions by its members
    for op in history.ops:
        if op[3] == "receive" and op[1] in member_of:
            copies = got.setdefault((op[4], member_of[op[1]]), [])
            if op[1] in persistent and any(o[1] == op[1] for o in copies):
                r.again += 1  # (one member's session again: QoS 1 may come twice [MQTT-4.4.0-1])
                continue
            copies.append(op)
    wide = [(a, b + margin) for a, b in faults]
    near = wide if lost_margin is None else [(a, b + lost_margin) for a, b in faults]
    by_share = {share: [m for m in ms if m.share == share] for share in shares}
    for msg_id, (t_pub, topic, qos) in sorted(invoked.items(), key=lambda kv: (kv[1][0], kv[0])):
        for share in shares:
            if not filter_matches(filter_of(share), topic):
                continue
            r.checked += 1
            copies = got.get((msg_id, share), [])
            if copies and qos and persistent:  # (did it take a session queueing for its client to reach one?)
                reach = _in_reach(by_share[share], t_pub, qos, near, settle, window, end)
                r.queued += reach is not None and reach[1]
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
                origin = node_at(origins.get(msg_id.rpartition(":")[0], []), t_pub)
                why = _must_reach(ms, share, t_pub, qos, msg_id in acked, near, settle, window, lossy, end, cut(origin))
                if why is None:
                    r.unreachable += 1
                    continue
                if msg_id in expiry and t_pub + expiry[msg_id] < end:
                    # its life may have ended on its way [MQTT-3.3.2-5]: a fault's delay, or a
                    # queue waiting for an absent client, may outlast it; only a member connected
                    # throughout with no fault near certainly had it in time (its node takes it
                    # in milliseconds; an expiry is a second at least)
                    why = _must_reach(ms, share, t_pub, qos, msg_id in acked, near, settle, window, lossy, -END)
                    if why is None:
                        r.may_expire += 1
                        continue
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
    end: float = END,
    cut: Cut | None = None,
) -> str | None:
    """Why a message that reached no member of ``share`` should have (None: it may not have)."""
    if (qos and not acked) or (not qos and lossy):
        return None
    mine = [m for m in ms if m.share == share]
    reach = _in_reach(mine, t, qos, faults, settle, window, end, cut)
    if reach is None:
        return None
    for m in mine:  # a member that left with it, at a QoS that goes with its connection
        if t - 1.0 <= m.end <= t + window:
            q = min(qos, max(m.qos, 0))
            if q == 0 or (q == 2 and not m.persistent):  # (a session that lives on keeps QoS 2)
                return None
    left = sorted((m for m in mine if t - settle <= m.end <= t + window), key=lambda m: abs(m.end - t))
    note = ""
    if left:  # (the leave nearest the message: the node its origin chose may have lost its last member)
        m = left[0]
        note = f"; {m.client} left {m.node} at {m.end:.3f}s ({m.how}, {m.end - t:+.3f}s)"
    if reach[1]:  # (a member away too, granted QoS 0: its queue takes no QoS 1/2 message)
        zero = [f"{m.client} on {m.node}" for m in _away_at(mine, t) if m.qos == 0]
        note += f"; away too, granted QoS 0: {', '.join(zero)}" if zero else ""
    return f"published at {t:.3f}s (QoS {qos}), {reach[0]}{note}"


def _away_at(mine: list[Membership], t: float) -> list[Membership]:
    """The last memberships of the CleanSession=0 members whose clients were away at ``t``
    (their sessions members still, queueing)."""
    last: dict[str, Membership] = {}
    for m in mine:
        if m.persistent and m.begin <= t:
            last[m.client] = m
    return [m for _c, m in sorted(last.items()) if m.end < t and m.how != "unsubscribe"]


def _in_reach(
    mine: list[Membership],
    t: float,
    qos: int,
    faults: Windows,
    settle: float,
    window: float,
    end: float,
    cut: Cut | None = None,
) -> tuple[str, bool] | None:
    """A member of the group certainly in reach of a message published at ``t``: (who,
    whether only a CleanSession=0 member's session queueing for its client was), or None. If
    a fault window overlaps the message's window, only a member connected throughout on a
    node its origin kept a path to (``cut``: the windows in which the origin had none to a
    node, widened; None: none is), and for a QoS 1/2 message only (custody keeps it: a QoS 0
    one may be lost on a link that breaks, or go to a node that died)."""
    steady = [m for m in mine if m.qos >= 0 and m.begin <= t - settle and m.end >= t + window]
    if overlaps(faults, t - settle, t + window):
        if cut is not None and qos:
            for m in steady:
                if not overlaps(cut(m.node), t - settle, t + window):
                    return f"{m.client} a member on {m.node} throughout, its node in reach of the origin", False
        return None
    if steady:
        return f"{steady[0].client} a member on {steady[0].node} throughout", False
    queued = _queueing(mine, qos, t - settle, t + window, faults, end - window)
    return None if queued is None else (queued, True)


def _queueing(mine: list[Membership], qos: int, lo: float, hi: float, faults: Windows, back_by: float) -> str | None:
    """A CleanSession=0 member whose session was a member from ``lo`` to ``hi``: connected, or
    its client away and its session queueing at the node it left (a QoS 1/2 message: QoS 0
    is not queued for an absent client), and back by ``back_by``, with no fault window over
    its absence up to ``hi`` (a node restored from its store has the session, but as a member
    of no group until its client is back: docs/design.md 3.8). Who it is, or None."""
    by_client: dict[str, list[Membership]] = {}
    for m in mine:
        if m.persistent and m.qos >= 0:
            by_client.setdefault(m.client, []).append(m)
    for client, spans in sorted(by_client.items()):
        spans.sort(key=lambda m: m.begin)
        start: float | None = None  # the session a member since, without a break
        away: list[str] = []
        for i, m in enumerate(spans):
            if start is None:
                start, away = m.begin, []
            if m.end >= hi:
                if start <= lo:
                    return _away(client, away)
                break
            nxt = spans[i + 1] if i + 1 < len(spans) else None
            if (
                nxt is None
                or m.how == "unsubscribe"
                or min(qos, m.qos) == 0
                or nxt.begin > back_by
                or overlaps(faults, m.end, min(nxt.begin, hi))
            ):
                start = None  # (not queueing for it: left the group, or back too late, or a fault)
                continue
            if m.end <= hi:
                away.append(f"away {m.end:.3f}-{nxt.begin:.3f}s, queueing on {m.node}")
            if nxt.begin >= hi and start <= lo:
                return _away(client, away)
    return None


def _away(client: str, away: list[str]) -> str:
    return f"{client}'s session a member throughout ({'; '.join(away)})" if away else f"{client} a member throughout"


@dataclass
class SessionCheck:
    checked: int = 0  # (QoS 2 message, member session) pairs delivered at QoS 2
    repeats: int = 0  # re-sends a client took as such (its packet id awaiting PUBREL): no new message
    twice: list[tuple[str, str, str]] = field(default_factory=list)  # (msg id, client, why) violations


def check_sessions_once(history: Any) -> SessionCheck:
    """[MQTT-4.3.3-2] for the members' sessions: a QoS 2 message delivered at QoS 2 reaches a
    member's session at most once as a new message. A CleanSession=0 member's session is
    one across its connections (a CONNACK accepting it without a session, after its first,
    begins another: cluster.session_present judges that); a CleanSession=1 member's is its
    connection. The client takes a PUBLISH on a packet id that awaits its PUBREL as a re-send
    (a DUP after a reconnection: acknowledged again, the history's ``repeat``); any other
    reception of the message is a new one."""
    r = SessionCheck()
    members: dict[str, bool] = {}  # client -> CleanSession=0
    for op in history.ops:
        if op[3] == "join":
            members[op[1]] = members.get(op[1], False) or (len(op) > 9 and bool(op[9]))
    lives: dict[str, int] = {}  # a persistent member's sessions so far
    life: dict[str, int] = {}  # connection -> the session it was accepted in
    got: dict[tuple[str, str, str], list[Op]] = {}  # (client, session, msg id) -> receptions
    for op in history.ops:
        kind, client = op[3], op[1]
        if client not in members:
            continue
        if kind == "connect" and op[2] == "ok" and members[client]:
            n = lives.get(client, 0) + (not op[6] or client not in lives)
            lives[client] = life[op[4]] = n
        elif kind == "receive" and op[6] == 2:
            session = f"{client}/{life.get(op[8], 0)}" if members[client] else op[8]
            got.setdefault((client, session, op[4]), []).append(op)
        elif kind == "repeat":
            r.repeats += 1
    for (client, _session, msg_id), ops in sorted(got.items()):
        r.checked += 1
        if len(ops) > 1:
            seen = ", ".join(f"{o[0]:.3f}s on {o[8]} (packet id {o[9]}{', DUP' if o[7] else ''})" for o in ops)
            r.twice.append((msg_id, client, f"QoS 2 message reached {client}'s session {len(ops)} times: {seen}"))
    return r


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


def _told_by(home: str, node: str, back: float, apart: Apart | None, detect: float) -> float | None:
    """When an old home ``home`` has let its member's session go, at the latest, if it may
    have been later than the client's return to ``node`` at ``back``: None when the two nodes
    were in reach of each other then (the CONNACK's copy, or the claim's fetch, tells it at
    once: holders.py ``served``, ``on_fetch``), else ``detect`` after the first time from which
    they stay in reach for ``detect`` (each side's live nodes change, and the old home's
    pooled copy is answered with the newer claim's: holders.py ``on_merge``)."""
    if apart is None:
        return None
    windows = sorted(apart(home, node))
    if not any(a <= back <= b + detect for a, b in windows):
        return None
    at = back  # (the path is back from ``at`` on, unless a window starts within ``detect``)
    for a, b in windows:
        if a <= at + detect and b > at:
            at = b
    return at + detect


def _flips(evs: list[tuple[float, int, int, int]]) -> int:
    """The entries a node's advertisement of a group changes by over ``evs`` (one removed and
    one added for each change: its first member, its last, a power of two, queueing)."""
    count = queued = flips = 0
    for _t, _order, d, q in sorted(evs, key=lambda e: (e[0], e[1])):
        was = _advertised_as(count, queued)
        count += d
        queued += q
        now = _advertised_as(count, queued)
        if was != now:
            flips += (was is not None) + (now is not None)
    return flips


def _placements(
    evs: list[tuple[float, int, int, int]], spans: list[tuple[float, float]], most: int = 4096
) -> list[list[tuple[float, int, int, int]]]:
    """Every order the old homes' losses in ``spans`` (each at some time in its span) may take
    among ``evs``: each at the start of its span or just after one of the events in it (at most
    ``most`` combinations: beyond, each loss at either end of its span)."""
    if not spans:
        return []
    times = sorted({e[0] for e in evs})
    choices = []
    for lo, hi in spans:
        at = [lo, *(t for t in times if lo <= t < hi)]
        choices.append([(t, 4 if t > lo else 2, 0, -1) for t in at] + [(hi, 2, 0, -1)])
    out: list[list[tuple[float, int, int, int]]] = [[]]
    for options in choices:
        if len(out) * len(options) > most:
            options = [options[0], options[-1]]
        out = [[*placed, o] for placed in out for o in options]
    return out


def _advertised_as(members: int, queueing: int = 0) -> int | None:
    """What a node advertises of a group with ``members`` connected members and ``queueing``
    CleanSession=0 ones whose clients are away (shared.py ``advertisement``): the largest
    power of two not above ``members``, 0 for none connected but some queueing (``QUEUED``),
    None for none at all."""
    if members > 0:
        return 1 << (members.bit_length() - 1)
    return 0 if queueing > 0 else None


def check_control(
    history: Any,
    deltas: dict[tuple[str, int, int], tuple[list[str], int]],
    links: int,
    copies_per_link: int = 2,
    apart: Apart | None = None,
    detect: float = 0.0,
) -> ControlCheck:
    """``deltas``: (node, incarnation, version) of each interest delta the simulator saw carry
    a ``$share/`` change -> (its changes, "+share" / "-share", and its copies on the links);
    ``links``: the links of the topology; ``apart``: the windows in which two nodes had no
    path between them, and ``detect``, how long the mesh may take to notice a path's return
    (given: an old home cut off from the node its member came back to lets the session go
    when it is told, some time up to ``detect`` after they are in reach again, docs/design.md
    3.8, "An old home the claim did not reach": the bound takes the worst such time)."""
    r = ControlCheck()
    # (node, share) -> changes (time, order at one time, connected members, members queueing); at
    # one time: a returning session's arrival, then joins, then the old home's loss, then leaves
    # (a join and a leave at once: no flip)
    events: dict[tuple[str, str], list[tuple[float, int, int, int]]] = {}
    # (node, share) -> old homes' losses of a session at a time not known: (earliest, latest)
    unsure: dict[tuple[str, str], list[tuple[float, float]]] = {}
    queueing: dict[tuple[str, str], str] = {}  # (client, share) -> where its session queues, client away
    ms = memberships(history)
    for i, m in enumerate(ms):
        mine = events.setdefault((m.node, m.share), [])
        home = queueing.pop((m.client, m.share), None) if m.persistent else None
        if home is None:
            mine.append((m.begin, 1, 1, 0))
        else:
            # its client is back: the claim makes its session a member here, queueing until the
            # client is attached (SessionTable.regroup, then attached), and none at its old home
            mine += [(m.begin, 0, 0, 1), (m.begin, 1, 1, -1)]
            told = _told_by(home, m.node, m.begin, apart, detect)
            if told is None:
                events.setdefault((home, m.share), []).append((m.begin, 2, 0, -1))
            else:  # (up to its client's next connection: a claim again)
                later = [n.begin for n in ms[i + 1 :] if n.client == m.client]
                unsure.setdefault((home, m.share), []).append((m.begin, min([told, *later])))
        if m.end != END:
            # its session stays a member, queueing (QoS 1/2 only: one granted QoS 0 keeps
            # nothing for an absent client, and its node says so: none, shared.py ``advertisement``)
            away = m.persistent and m.how != "unsubscribe" and m.qos != 0
            mine.append((m.end, 3, -1, int(away)))
            if away:
                queueing[(m.client, m.share)] = m.node
    needed: dict[tuple[str, str], int] = {}
    for key in events.keys() | unsure.keys():
        evs = events.get(key, [])
        r.changes += sum(1 for e in evs if e[2])
        flips = _flips(evs)
        for placed in _placements(evs, unsure.get(key, [])):
            flips = max(flips, _flips([*evs, *placed]))
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
