"""The MQTT 5 checks on a client history (sim/history.py): expiry of messages and sessions, delayed wills.

Pure, and free of simulator imports, as history.py: a harness over real sockets can judge
its history with them. Their caller gives what the history cannot say, each a plain
observation, never a node's own view: when a node took each message (``taken``), when each
will was published (``wills``), and bounds on the time in flight (``slack``) and on the
time the mesh takes to find a node dead (``detect``).

- ``check_message_expiry`` (cluster.message_expiry): no message reaches a subscriber after
  its Message Expiry Interval [MQTT-3.3.2-5]; (cluster.message_expiry_left) no PUBLISH says
  it has more life left than it has [MQTT-3.3.2-6];
- ``check_session_expiry`` (cluster.session_expiry, cluster.session_present): a session is
  resumed (session present 1) by a Clean Start 0 connection before its Session Expiry
  Interval has passed, and not after [MQTT-4.1.0-2] [MQTT-3.2.2-3]; a Clean Start 1
  connection, and the first of a ClientId, get session present 0 [MQTT-3.2.2-2];
- ``check_will_delay`` (cluster.will_delay): a will with a Will Delay Interval is published
  at most once mesh-wide, never before the earlier of its delay and its session's expiry,
  never once a new connection of the ClientId was accepted within that time, and surely
  when none came [MQTT-3.1.2-8] [MQTT-3.1.3-9].
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from ..topics import filter_matches
from .history import History, Op, session_of

__all__ = [
    "ExpiryCheck",
    "SessionExpiryCheck",
    "WillDelayCheck",
    "check_message_expiry",
    "check_session_expiry",
    "check_will_delay",
    "delayed_wills",
]

# a will published this long before its due time is early: the nodes of a simulated run share
# one clock, and the registrar counts the delay from when it hears of the end, later still
EARLY = 0.001


@dataclass
class ExpiryCheck:
    """Deliveries of messages with a Message Expiry Interval, against their expiry."""

    checked: int = 0  # (message, subscriber) first deliveries judged
    late: list[tuple[str, str, float]] = field(default_factory=list)  # (msg id, subscriber, s after expiry)
    # a first delivery after the expiry whose PUBLISH said 0 is left: its delivery began
    # before the expiry and the frame left later (MQTT-3.3.2-5 allows it)
    begun_before_expiry: int = 0
    overlong: list[tuple[str, str, float]] = field(default_factory=list)  # (msg id, subscriber, s too long)
    dropped: int = 0  # (message, subscriber) pairs of an expiring message never delivered (allowed)


def check_message_expiry(history: History, taken: dict[str, float], slack: float) -> ExpiryCheck:
    """A message with a Message Expiry Interval ``E``, taken by its node at ``taken[msg_id]``
    (else: at its acknowledgement, later), expires ``E`` seconds after. A subscriber's first
    delivery of it (DUP=0: a re-send of one already begun may come later, MQTT-3.3.2-5)
    must come by then plus ``slack``, the time in flight from the node to the client, unless
    the PUBLISH said 0 is left (``begun_before_expiry``). A PUBLISH that says ``R`` > 0
    seconds are left must leave no more than that: received at ``t``, ``t + R`` is at most
    the expiry plus 1 (R is rounded up to whole seconds) plus ``slack``."""
    r = ExpiryCheck()
    expiry: dict[str, int] = {}
    acked: dict[str, float] = {}
    got: dict[tuple[str, str], list[Op]] = {}
    topics: dict[str, str] = {}
    filters: dict[str, set[str]] = {}  # subscriber -> every filter it subscribed to
    for op in history.ops:
        kind = op[3]
        if kind == "publish":
            if op[2] == "invoke" and len(op) > 7:
                expiry[op[4]] = op[7]
                topics[op[4]] = op[5]
            elif op[2] == "ok":
                acked.setdefault(op[4], op[0])
        elif kind == "receive":
            got.setdefault((op[1], op[4]), []).append(op)
        elif kind == "subscribe":
            filters.setdefault(op[1], set()).update(f for f, _ in op[4])
    for (client, msg_id), ops in sorted(got.items()):
        if msg_id not in expiry:
            continue
        start = taken.get(msg_id, acked.get(msg_id))
        if start is None:
            continue  # (neither taken nor acknowledged: nothing to count from)
        deadline = start + expiry[msg_id]
        r.checked += 1
        first = next((o for o in ops if not o[7]), None)
        if first is not None and first[0] > deadline + slack:
            if len(first) > 10 and first[10] == 0:
                r.begun_before_expiry += 1
            else:
                r.late.append((msg_id, client, round(first[0] - deadline, 3)))
        for o in ops:
            left = o[10] if len(o) > 10 else None
            if left and o[0] + left > deadline + 1 + slack:
                r.overlong.append((msg_id, client, round(o[0] + left - deadline - 1, 3)))
                break
    r.dropped = sum(
        1
        for m in expiry
        for c, fs in filters.items()
        if (c, m) not in got and any(filter_matches(f, topics[m]) for f in fs)
    )
    return r


@dataclass
class SessionExpiryCheck:
    """MQTT 5 clients' acceptances, against what their session's expiry allows."""

    resumed: int = 0  # acceptances whose session had to be present (it had not expired)
    expired: int = 0  # acceptances whose session had to be gone (it had expired)
    either: int = 0  # acceptances near the expiry, or within the time to find a node dead: not judged
    lost: list[tuple[float, str, str, str]] = field(default_factory=list)  # (t, client, conn, node)
    # (t, client, conn, node, why): an expired session resumed, or present on a Clean Start 1
    # or a first connection
    wrongly_present: list[tuple[float, str, str, str, str]] = field(default_factory=list)


Apart = Callable[[str, str], list[tuple[float, float]]]


def check_session_expiry(
    history: History, detect: float, slack: float, apart: Apart | None = None
) -> SessionExpiryCheck:
    """Each acceptance of an MQTT 5 client's connection ``C`` after an earlier one ``P``:

    - Clean Start 1 (and the first acceptance of the ClientId): session present 0;
    - Clean Start 0, ``P`` still open (a takeover), or ``C`` accepted before ``P``'s end
      plus ``P``'s Session Expiry Interval: the session is present (every copy of it was
      alive through the whole claim), else it is ``lost``;
    - Clean Start 0, ``C``'s CONNECT sent later than ``P``'s end plus its interval plus
      ``slack`` (the end's news on its way to the session's other holders and its
      registrar), or ``detect`` if ``P`` ended with its node (the mesh counts the interval
      from when it finds the node dead, docs/design.md 3.7): no session is present;
    - between the two, either answer is right.

    Across a cut (finding 8's rule, as for wills): ``apart(a, b)`` gives the windows in
    which nodes ``a`` and ``b`` could not reach each other (a partition, a link down that
    splits the graph, one of them down). The side of ``C`` cannot tell ``P``'s node cut off
    from dead: it counts the interval from when it finds that node gone. So if ``P`` ended
    while its node and ``C``'s were apart, no session may be present only from the start of
    that cut plus ``detect`` plus the interval (or the usual bound, if later); and if they
    were apart at any time between ``P``'s acceptance and ``C``'s, a session not found
    before the expiry is not called lost."""
    r = SessionExpiryCheck()
    v5 = session_of(history)[0]
    invoked: dict[str, float] = {}
    closed: dict[str, tuple[float, str]] = {}
    last: dict[str, tuple[str, float, str]] = {}  # client -> its last accepted connection, when, where
    for op in history.ops:
        kind = op[3]
        if kind == "close":
            closed.setdefault(op[4], (op[0], op[6]))
            continue
        if kind != "connect" or op[4] not in v5:
            continue
        t, client, what, conn, node = op[0], op[1], op[2], op[4], op[5]
        if what == "invoke":
            invoked[conn] = t
            continue
        if what != "ok":
            continue
        present = bool(op[6])
        before = last.get(client)
        last[client] = (conn, t, node)
        if before is None or v5[conn]["clean_start"]:
            if present:
                why = "Clean Start 1" if before is not None else "the first connection of its ClientId"
                r.wrongly_present.append((t, client, conn, node, f"session present 1 on {why}"))
            continue
        prev, t_prev, prev_node = before
        windows = apart(prev_node, node) if apart is not None and prev_node != node else []
        interval = v5[prev]["expiry"]
        end = closed.get(prev)
        if end is None or end[0] > t or t < end[0] + interval:
            if any(a < t and b > t_prev for a, b in windows):
                r.either += 1  # (the other side may have counted from when it lost sight of it)
                continue
            r.resumed += 1
            if not present:
                r.lost.append((t, client, conn, node))
            continue
        start = end[0] + (detect if _with_its_node(end[1]) else slack)
        cut = next((a for a, b in windows if a <= end[0] < b), None)
        if cut is not None:
            start = max(start, cut + detect)
        bound = start + interval
        if invoked[conn] <= bound:
            r.either += 1
            continue
        r.expired += 1
        if present:
            why = f"session present 1, {invoked[conn] - end[0] - interval:.3f}s after its session expired"
            if cut is not None:
                why += f" (its node was cut off from {node} from {cut:.3f}s)"
            r.wrongly_present.append((t, client, conn, node, why))
    return r


def _with_its_node(reason: str) -> bool:
    """A connection that ended because its node crashed (sim/sessions.py's reason)."""
    return reason.startswith("node ") and reason.endswith(" crashed")


def delayed_wills(history: History) -> dict[str, int]:
    """Connection id -> how long its will waits after the connection (MQTT 5): the earlier
    of its Will Delay Interval and its Session Expiry Interval; none with a delay of 0 or a
    session that ends with the connection (published at once, history.check_wills)."""
    out = {}
    for conn, asked in session_of(history)[0].items():
        delay = min(asked["will_delay"], asked["expiry"])
        if delay > 0:
            out[conn] = delay
    return out


@dataclass
class WillDelayCheck:
    """Delayed wills against their connections and the ClientId's next connections."""

    checked: int = 0  # connections accepted with a delayed will
    cancelled: int = 0  # of them, a new connection was accepted within the delay: no will
    due: int = 0  # no new connection within the delay: published once
    early: list[tuple[str, float]] = field(default_factory=list)  # (conn, s before its due time)
    after_reconnect: list[tuple[str, int]] = field(default_factory=list)  # (conn, publications)
    twice: list[tuple[str, int]] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    unwanted: list[tuple[str, str]] = field(default_factory=list)  # (conn, why): a clean end, or still open


def check_will_delay(
    history: History,
    wills: dict[str, list[float]],
    sides: dict[str, list[str | None]],
    end: float,
    detect: float,
    slack: float,
    publishers: dict[str, list[str]] | None = None,
    apart: Apart | None = None,
) -> WillDelayCheck:
    """A connection ``C`` accepted with a will that waits ``D`` (``delayed_wills``) and
    ended at ``t`` without a DISCONNECT the server read: its will is never published before
    ``t + D``; if a later connection of the ClientId was accepted before ``t + D``, it is not
    published at all [MQTT-3.1.3-9]; if none was even asked for before ``t + D`` plus
    ``slack`` (``detect`` when ``C`` ended with its node: the registrar counts the delay from
    when it finds the node dead) and that is before ``end``, it is published once
    [MQTT-3.1.2-8]; between the two, at most once. A connection ended by DISCONNECT, or open
    at the end, has none. ``wills``: connection id -> the times its will was published, once
    per message; ``sides``: as history.check_wills (a registrar that lost sight of the
    connection's node publishes its will: at most once per side, finding 8's rule; such a
    publication counts its delay from when it lost sight, so it is not judged early).
    Likewise a will published by a node (``publishers``: connection id -> the node of each
    publication) that could not reach the node of the client's new connection (``apart``,
    as check_session_expiry's) at some time from that connection's CONNECT to the
    publication may not have heard of it: published once on its side despite it, it is not
    judged published after a reconnection."""
    r = WillDelayCheck()
    delays = delayed_wills(history)
    accepted: list[tuple[str, str]] = []  # (client, conn) in the order they were accepted
    asked: dict[str, list[tuple[str, float]]] = {}  # client -> (conn, CONNECT sent) in order
    ok: dict[str, float] = {}
    with_will: set[str] = set()
    closed: dict[str, tuple[float, bool, str]] = {}
    for op in history.ops:
        if op[3] == "connect":
            if op[2] == "invoke":
                asked.setdefault(op[1], []).append((op[4], op[0]))
                if op[6] == "will":
                    with_will.add(op[4])
            elif op[2] == "ok":
                ok.setdefault(op[4], op[0])
                accepted.append((op[1], op[4]))
        elif op[3] == "close":
            closed.setdefault(op[4], (op[0], op[5], op[6]))
    where: dict[str, str] = {}
    for op in history.ops:
        if op[3] == "connect" and op[2] == "invoke":
            where[op[4]] = op[5]
    for client, conn in accepted:
        if conn not in delays or conn not in with_will:
            continue
        r.checked += 1
        times = wills.get(conn, [])
        across = [s for s in sides.get(conn, []) if s is not None]
        n = len(times) - (len(across) if len(set(across)) == len(across) else 0)
        end_of = closed.get(conn)
        if end_of is None or end_of[1]:
            if n > 0:
                why = "still connected" if end_of is None else "ended by DISCONNECT"
                r.unwanted.append((conn, f"{why}, delayed will published {len(times)}x"))
            continue
        due = end_of[0] + delays[conn]
        mine = [t for t, side in zip(times, sides.get(conn, [None] * len(times)), strict=False) if side is None]
        early = [due - t for t in mine if t < due - EARLY]
        if early:
            r.early.append((conn, round(max(early), 3)))
        later = _after(asked.get(client, []), conn)
        first_ok = min((ok[c] for c, _ in later if c in ok), default=None)
        first_asked = min((t for _, t in later), default=None)
        bound = due + (detect if _with_its_node(end_of[2]) else slack)
        if first_ok is not None and first_ok < due:
            r.cancelled += 1
            back = next(c for c, _ in later if ok.get(c) == first_ok)
            t_back = dict(later)[back]
            nodes = (publishers or {}).get(conn, [])
            unheard = [
                t
                for i, t in enumerate(times)
                if i < len(nodes)
                and apart is not None
                and nodes[i] != where[back]
                and any(a <= t and b >= t_back for a, b in apart(nodes[i], where[back]))
            ]
            if n - len(unheard) > 0:
                r.after_reconnect.append((conn, len(times)))
        elif (first_asked is None or first_asked > bound) and bound < end:
            r.due += 1
            if n == 0 and not across:
                r.missing.append(conn)
            elif n > 1:
                r.twice.append((conn, n))
        elif n > 1:
            r.twice.append((conn, n))
    return r


def _after(conns: list[tuple[str, float]], conn: str) -> list[tuple[str, float]]:
    """The connections a client asked for after ``conn``."""
    names = [c for c, _ in conns]
    return conns[names.index(conn) + 1 :] if conn in names else []
