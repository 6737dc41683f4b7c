"""Shared subscriptions judged from the clients' history (issue 24; docs/simulation.md, "Shared groups"):
each message to one member, none lost, and the memberships every check reads.

Pure, and free of simulator imports, as history.py: what it is given is a client history
(``join``, ``leave``, ``close``, ``receive``, ``publish`` ops) and the windows in which the
mesh was disturbed (faults, from the scenario). It leaves to its caller what a fault is and
how long detection takes: ``margin``. How a group spreads over the mesh (its messages over
the members, its membership changes over the links) is judged in shared_spread.py.

- ``check_once``: each message matching a group's filter reaches exactly one member of the
  group. A second copy is allowed only when the history shows why: one of the receivers left
  the group around the two copies (it left holding it: the node hands what a leaving member
  had not acknowledged to another member, maybe before the copy on its way to it arrives),
  or a fault window overlaps the message's way (a chosen node dead or cut off: its origin
  sends it again elsewhere after ``mesh.shared_reroute``). A message that reached no member is a violation only when the
  group certainly had a member to reach: one whose membership spanned the message's window
  (``settle`` before it to ``window`` after), no fault window overlapped that window, the
  publisher had the message acknowledged (QoS 1/2), and no member left in the window holding
  it at a QoS that goes with its connection (0, or 2 [MQTT-4.8.2-5]; a CleanSession=0
  member's session keeps a QoS 2 message [MQTT-4.8.2-4]). A CleanSession=0 member is a
  member while its client is away too (its session queues at its home, for QoS 1/2): the
  message must reach some member by the end, maybe that one when it returns. A message with
  a Message Expiry Interval that ends before the end of the run may expire on a fault's
  delay or in a queue [MQTT-3.3.2-5]: only a member connected throughout, no fault near,
  makes its loss a violation (else counted ``may_expire``). A second copy to one such
  member's session (it took the message again after a reconnection) is no second member's.
  A persistent publisher (CleanSession=0, moving between nodes) sends a message it had not
  had acknowledged again on its next connection (the history's ``resend``): a QoS 1 PUBLISH
  re-sent is a new message to the node that takes it [MQTT-4.4.0-1], so a second member's
  copy after it is allowed (counted ``resent_by_publisher``); a QoS 2 one is routed under the
  id its first node gave it (docs/design.md 3.2, 3.8 "QoS 2, routed twice"), so not. Such a
  message was taken where and when its acknowledgement says (QoS 1: the send on the
  connection its PUBACK came on) or by any node it was sent to (QoS 2: the node that took
  it, or the one its client went to next, which routes what it finds unrouted): it is judged
  lost only if it was owed a member from every such send (``sends``).
- ``check_sessions_once``: a QoS 2 message reaches a member's session at most once as a new
  message [MQTT-4.3.3-2]: a CleanSession=0 member's session across its connections, a
  CleanSession=1 member's on its connection; a re-send the client took as one (its packet id
  still awaiting PUBREL: the history's ``repeat``) is no new message.
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
    "memberships",
    "node_at",
    "client_nodes",
    "publications",
    "sends",
    "check_once",
    "check_sessions_once",
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
    with the subscription (``resume``). A CONNACK its node sent as it closed the connection
    (a fence in the same instant: the client reads the CONNACK after the end) brought the
    session there all the same: a membership from the CONNACK to the end, its session queueing
    there after it (fuzzer-style run of shared-persistent-publishers-7, harsher, seed 14)."""
    out: list[Membership] = []
    open_: dict[tuple[str, str], Membership] = {}  # (conn, share) -> its open membership
    by_conn: dict[str, list[Membership]] = {}
    closed: dict[str, float] = {}  # (a client that has not noticed yet may still write on one)
    for op in history.ops:
        kind = op[3]
        if kind == "join":
            _t, client, what, _k, conn, node, share, qos, at = op[:9]
            if conn in closed:
                if what == "resume" and at <= closed[conn]:
                    m = Membership(client, conn, node, share, qos, at, closed[conn], "close")
                    m.persistent = len(op) > 9 and bool(op[9])
                    out.append(m)
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
            closed.setdefault(op[4], op[0])
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
    resent_by_publisher: int = 0  # second copies of a QoS 1 message its persistent publisher sent again
    republished: int = 0  # (message, group) pairs of messages a persistent publisher sent again
    owed_from_some_send: int = 0  # ... that reached none, owed a member from one send but not another (allowed)
    again: int = 0  # copies to a CleanSession=0 member that had the message (its session's re-send)
    queued: int = 0  # QoS 1/2 pairs that reached a member with none connected throughout, a session queueing
    may_expire: int = 0  # pairs with a Message Expiry Interval that reached none and may have expired on the way
    twice: list[tuple[str, str, str]] = field(default_factory=list)  # (msg id, share, why) violations
    lost: list[tuple[str, str, str]] = field(default_factory=list)  # (msg id, share, why) violations


def publications(history: Any) -> tuple[dict[str, tuple[float, str, int]], set[str]]:
    invoked: dict[str, tuple[float, str, int]] = {}
    acked: set[str] = set()
    for op in history.ops:
        if op[3] == "publish":
            if op[2] == "invoke":
                invoked[op[4]] = (op[0], op[5], op[6])
            elif op[2] == "ok":
                acked.add(op[4])
    return invoked, acked


def sends(history: Any) -> tuple[dict[str, list[float]], dict[str, float]]:
    """When each message was sent: its PUBLISH (``invoke``) and each time its persistent
    publisher sent it again on a new connection (``resend``: the PUBLISH with DUP=1, or its
    PUBREL), in time order; and when its acknowledgement (PUBACK, PUBREC) came, on whichever
    connection."""
    sent: dict[str, list[float]] = {}
    acked: dict[str, float] = {}
    for op in history.ops:
        if op[3] == "publish":
            if op[2] in ("invoke", "resend"):
                sent.setdefault(op[4], []).append(op[0])
            elif op[2] == "ok":
                acked.setdefault(op[4], op[0])
    return sent, acked


def _taken_at(times: list[float], qos: int, acked: float | None) -> list[float]:
    """The sends of a message from which a node may have taken it and routed it (see the
    module's docstring): every send of a QoS 2 message (the node that gave it its id, or a
    later one that found it unrouted); of a QoS 1 one, the last before its PUBACK (that node
    took it as a new message, and certainly routed it)."""
    if len(times) < 2 or qos != 1 or acked is None:
        return times
    return [max((t for t in times if t <= acked), default=times[0])]


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
    held: Cut | None = None,
) -> OnceCheck:
    """``faults``: the windows a fault disturbed the mesh in; ``margin``: how long after its
    window a fault may still send a message again (detection and ``mesh.shared_reroute``);
    ``lost_margin``: how long after it the mesh may not know yet where the members are
    (detection; default ``margin``); ``lossy``: QoS 0 messages may be lost on the way;
    ``end``: the end of the run (a CleanSession=0 member away at a message is in reach only
    if its client came back ``window`` before it); ``apart``: the windows in which two nodes
    had no path between them (given: a fault excuses a message no more if its origin kept a
    path to a node with a member connected throughout, the path widened by ``lost_margin``);
    ``held``: the windows in which a node ran nothing (stalled): a message published to it
    then is taken at the window's end, and judged as published then."""
    r = OnceCheck()
    ms = memberships(history)
    widen = margin if lost_margin is None else lost_margin
    origins = client_nodes(history) if apart is not None or held is not None else {}
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
    invoked, acked = publications(history)
    sent, acked_at = sends(history)
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
            times = sent.get(msg_id, [t_pub])
            r.republished += len(times) > 1
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
                    elif qos == 1 and any(t <= later[0] for t in times[1:]):
                        r.resent_by_publisher += 1  # (a new message to the node its re-send reached)
                    elif overlaps(wide, t_pub, later[0]):
                        r.resent_after_fault += 1
                    else:
                        who = ", ".join(f"{op[1]} ({op[8]}) at {op[0]:.3f}s" for op in copies[: i + 1])
                        r.twice.append((msg_id, share, f"reached {who}; no receiver left, no fault between"))
            else:
                # (owed from every send a node may have taken it from: else not lost)
                verdicts = []
                for t_sent in _taken_at(times, qos, acked_at.get(msg_id)):
                    origin = node_at(origins.get(msg_id.rpartition(":")[0], []), t_sent)
                    if held is not None and origin is not None:
                        # its node stalled: the message is taken, acknowledged and routed when the
                        # node runs again, and must reach a member in reach then (simulator: seeds
                        # 1, 10, 13, 15, 19 and 22 of finding 36's three nodes, the origin killed
                        # 10 ms after its stall with the members it chose)
                        t_sent = max([t_sent, *(b for a, b in held(origin) if a <= t_sent <= b)])
                    why = _must_reach(
                        ms, share, t_sent, qos, msg_id in acked, near, settle, window, lossy, end, cut(origin)
                    )
                    if why is not None and msg_id in expiry and t_sent + expiry[msg_id] < end:
                        # its life may have ended on its way [MQTT-3.3.2-5]: a fault's delay, or a
                        # queue waiting for an absent client, may outlast it; only a member connected
                        # throughout with no fault near certainly had it in time (its node takes it
                        # in milliseconds; an expiry is a second at least)
                        if _must_reach(ms, share, t_sent, qos, msg_id in acked, near, settle, window, lossy, -END):
                            verdicts.append(("lost", why))
                        else:
                            verdicts.append(("may_expire", ""))
                    else:
                        verdicts.append(("unreachable", "") if why is None else ("lost", why))
                kinds = {k for k, _ in verdicts}
                r.owed_from_some_send += "lost" in kinds and len(kinds) > 1
                if "unreachable" in kinds:
                    r.unreachable += 1
                elif "may_expire" in kinds:
                    r.may_expire += 1
                else:
                    why = "; ".join(w for _k, w in verdicts)
                    if len(times) > 1:
                        why += (
                            f" (sent {len(times)} times by its persistent publisher, at "
                            + ", ".join(f"{t:.3f}s" for t in times)
                            + ")"
                        )
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


def client_nodes(history: Any) -> dict[str, list[tuple[float, str]]]:
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
