"""Client histories and the checks made on them (Jepsen style): what clients saw, judged.

Pure, and free of simulator imports: a harness over real sockets (issue 15) can
record the same history and judge it with the same checks.

A history is a list of operations in time order, each a tuple whose first fields
are ``(time, client, op)``:

- ``publish``: ``(t, client, "invoke"|"ok"|"info", "publish", msg_id, topic, qos)``: ok is
  the PUBACK (QoS 1) or PUBREC (QoS 2); info: the connection ended before either came; an
  MQTT 5 invoke with a Message Expiry Interval has it as one more field;
- ``connect``: ``(t, client, "invoke"|"ok"|"fail", "connect", conn, node, detail)``: detail is
  "will" on an invoke whose CONNECT carries a will, session present (ok) or the return code
  (fail); an MQTT 5 invoke has one more field, what it asked for (``History.connect``);
- ``subscribe``: ``(t, client, "ok", "subscribe", filters)`` (the SUBACK);
- ``publish`` re-sent: ``(t, client, "resend", "publish", msg_id, topic, qos)``: a new
  connection of a persistent session sent the PUBLISH (DUP=1) or its PUBREL again;
- ``receive``: ``(t, client, "ok", "receive", msg_id, topic, qos, dup, conn, packet_id)``
  (packet_id 0 when the recorder does not say; MQTT 5: the Message Expiry Interval the
  PUBLISH said is left, when it said one, as one more field);
- ``repeat``: ``(t, client, "ok", "repeat", msg_id, topic, qos, dup, conn, packet_id)``: a QoS 2
  PUBLISH for an id the client still held awaiting PUBREL (acknowledged, not delivered);
- ``close``: ``(t, client, "ok", "close", conn, clean, reason)``: clean when the server
  read our DISCONNECT.
- ``join``: ``(t, client, "invoke"|"ok"|"fail"|"resume", "join", conn, node, share, qos, at)``:
  a shared subscription ("$share/{g}/{f}"): its SUBSCRIBE sent (invoke, ``at`` when its node
  takes it), its SUBACK (ok with the QoS granted, fail with the code); a CleanSession=0
  member's connection that found its session, subscription and all (resume, at its CONNACK,
  with the QoS granted before; ``at`` when its node sent the CONNACK). A CleanSession=0
  member's invoke and resume have one more field, True;
- ``leave``: ``(t, client, "ok", "leave", conn, node, share, how, at)``: a member leaves its
  group (``how``: unsubscribe, disconnect, drop, move), ``at`` when its node takes it; a
  member also leaves with its connection (``close``). Members' deliveries are judged by
  sim/shared_checks.py, not here.

Message ids are unique per publication (``client:n``); a will's payload is the id of
the connection it belongs to.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..topics import filter_matches

__all__ = [
    "History",
    "HandoverCheck",
    "OrderCheck",
    "WillCheck",
    "check_handover",
    "check_order",
    "check_wills",
    "check_sessions_resumed",
    "session_of",
]

Op = tuple[Any, ...]


class History:
    def __init__(self) -> None:
        self.ops: list[Op] = []

    def publish(
        self, t: float, client: str, what: str, msg_id: str, topic: str, qos: int, expiry: int | None = None
    ) -> None:
        """``expiry``: the Message Expiry Interval an MQTT 5 PUBLISH gave it (invoke), recorded last."""
        op = (t, client, what, "publish", msg_id, topic, qos)
        self.ops.append(op if expiry is None else (*op, expiry))

    def connect(
        self,
        t: float,
        client: str,
        what: str,
        conn: str,
        node: str,
        detail: object = None,
        v5: dict[str, Any] | None = None,
    ) -> None:
        """``v5``: what an MQTT 5 CONNECT asked for (invoke), recorded last: ``clean_start``,
        ``expiry`` (its Session Expiry Interval), ``will_delay`` (its will's, 0 for none)."""
        op = (t, client, what, "connect", conn, node, detail)
        self.ops.append(op if v5 is None else (*op, v5))

    def subscribed(self, t: float, client: str, filters: list[tuple[str, int]]) -> None:
        self.ops.append((t, client, "ok", "subscribe", list(filters)))

    def joined(
        self,
        t: float,
        client: str,
        conn: str,
        node: str,
        share: str,
        qos: int,
        at: float,
        what: str = "invoke",
        persistent: bool = False,
    ) -> None:
        """A shared subscription: its SUBSCRIBE sent ("invoke", ``at`` when its node takes it),
        its SUBACK ("ok", ``qos`` granted; "fail", the code), or found again with its session
        ("resume"); ``persistent``: a CleanSession=0 member's, recorded last."""
        op = (t, client, what, "join", conn, node, share, qos, at)
        self.ops.append((*op, True) if persistent else op)

    def left(self, t: float, client: str, conn: str, node: str, share: str, how: str, at: float) -> None:
        """A member leaves its group (``how``: unsubscribe, disconnect, drop, move), recorded
        when it sends; ``at``: when its node takes it (its UNSUBSCRIBE, DISCONNECT or reset)."""
        self.ops.append((t, client, "ok", "leave", conn, node, share, how, at))

    def received(
        self,
        t: float,
        client: str,
        msg_id: str,
        topic: str,
        qos: int,
        dup: bool,
        conn: str,
        packet_id: int = 0,
        expiry: int | None = None,
    ) -> None:
        """``expiry``: the Message Expiry Interval the PUBLISH carried (MQTT 5), recorded last."""
        op = (t, client, "ok", "receive", msg_id, topic, qos, dup, conn, packet_id)
        self.ops.append(op if expiry is None else (*op, expiry))

    def repeated(
        self, t: float, client: str, msg_id: str, topic: str, qos: int, dup: bool, conn: str, packet_id: int
    ) -> None:
        self.ops.append((t, client, "ok", "repeat", msg_id, topic, qos, dup, conn, packet_id))

    def closed(self, t: float, client: str, conn: str, clean: bool, reason: str) -> None:
        self.ops.append((t, client, "ok", "close", conn, clean, reason))

    def of_kind(self, kind: str) -> list[Op]:
        return [op for op in self.ops if op[3] == kind]


@dataclass
class HandoverCheck:
    """Messages a persistent subscriber must get after moving, and what happened to them."""

    checked: int = 0  # (message, subscriber) pairs the invariant covers
    lost: list[tuple[str, str, float]] = field(default_factory=list)  # (msg_id, subscriber, acked at)
    qos2_twice: list[tuple[str, str]] = field(default_factory=list)  # a QoS 2 message delivered twice
    qos1_again: int = 0  # QoS 1 redeliveries (allowed by MQTT)
    not_moved: int = 0  # pairs without a reconnection after the ack (routing, not hand-over)
    not_moved_lost: int = 0
    # MQTT 5: pairs not judged, because the message may expire before the end (its
    # Message Expiry Interval), or the subscriber's session ended after it (a CONNACK said
    # no session: its expiry, or Clean Start 1; cluster.session_expiry judges that)
    may_expire: int = 0
    session_ended: int = 0


def session_of(history: History) -> tuple[dict[str, dict[str, Any]], dict[str, int]]:
    """What MQTT 5 clients asked for, and the sessions of their connections.

    ``v5``: connection id -> what its CONNECT asked for (``History.connect``'s ``v5``), for
    the MQTT 5 clients' connections; ``life``: connection id -> the number of the client's
    session it was accepted in (1 for the first; one more at every CONNACK that says no
    session is present), for the accepted connections of MQTT 5 clients."""
    v5: dict[str, dict[str, Any]] = {}
    life: dict[str, int] = {}
    lives: dict[str, int] = {}
    clients: set[str] = set()
    for op in history.ops:
        if op[3] != "connect":
            continue
        if op[2] == "invoke" and len(op) > 7:
            v5[op[4]] = op[7]
            clients.add(op[1])
        elif op[2] == "ok" and op[1] in clients:
            n = lives.get(op[1], 0) + (not op[6])
            lives[op[1]] = life[op[4]] = max(n, 1)
    return v5, life


def check_handover(history: History, settle: float, end: float | None = None) -> HandoverCheck:
    """Invariant 2 (cluster.handover_loss): a QoS 1/2 message acknowledged to its publisher
    while a persistent subscriber's subscription existed (``settle`` seconds after its
    SUBACK, time for the filter to reach the publisher's node), with the subscriber
    reconnecting at least once afterwards, reaches that subscriber by the end, once
    for QoS 2.

    MQTT 5 (issue 23): a message with a Message Expiry Interval may expire [MQTT-3.3.2-5],
    so it counts only if it still lives at ``end`` (the end of the run: its invoke plus its
    interval, for the node took it later; None: never counted). An MQTT 5 subscriber's
    session may end (it expired, or Clean Start 1 began another): a message counts for the
    session it was published in (the SUBACK since the last CONNACK without a session), and
    not if a later CONNACK says that session is gone; QoS 2 is once per session."""
    result = HandoverCheck()
    life = session_of(history)[1]
    subs: dict[str, tuple[float, list[tuple[str, int]]]] = {}  # 3.1.1: the first SUBACK
    subs5: dict[str, list[tuple[float, list[tuple[str, int]]]]] = {}  # MQTT 5: every SUBACK
    fresh: dict[str, list[float]] = {}  # MQTT 5: the CONNACKs without a session
    clients5 = {op[1] for op in history.ops if op[3] == "connect" and op[2] == "invoke" and len(op) > 7}
    connects: dict[str, list[float]] = {}
    got: dict[tuple[str, str], list[Op]] = {}
    invoked: dict[str, tuple[float, str, int, int | None]] = {}
    acked: list[tuple[str, float]] = []
    members = {op[1] for op in history.ops if op[3] == "join"}  # (judged by sim/shared_checks.py)
    for op in history.ops:
        t, client, what, kind = op[0], op[1], op[2], op[3]
        if client in members:
            continue
        if kind == "subscribe":
            if client in clients5:
                subs5.setdefault(client, []).append((t, op[4]))
            else:
                subs.setdefault(client, (t, op[4]))
        elif kind == "connect" and what == "ok":
            connects.setdefault(client, []).append(t)
            if client in clients5 and not op[6]:
                fresh.setdefault(client, []).append(t)
        elif kind == "receive":
            got.setdefault((client, op[4]), []).append(op)
        elif kind == "publish":
            if what == "invoke":
                invoked[op[4]] = (t, op[5], op[6], op[7] if len(op) > 7 else None)
            elif what == "ok":
                acked.append((op[4], t))
    for (client, msg_id), ops in got.items():
        if client in clients5:
            per_life: dict[int, list[Op]] = {}
            for o in ops:
                per_life.setdefault(life.get(o[8], 0), []).append(o)
            groups = list(per_life.values())
        else:
            groups = [ops]
        for same in groups:
            if len(same) > 1:
                if same[0][6] == 2 and sum(1 for o in same if o[6] == 2) > 1:
                    result.qos2_twice.append((msg_id, client))
                else:
                    result.qos1_again += len(same) - 1
    for msg_id, t_ack in acked:
        t_inv, topic, qos, expiry = invoked[msg_id]
        if qos == 0:
            continue
        in_force = [*subs.items()] + [(c, _subscription_at(subs5[c], fresh.get(c, []), t_inv)) for c in subs5]
        for client, sub in in_force:
            if sub is None:
                continue
            t_sub, filters = sub
            if t_inv < t_sub + settle or not any(filter_matches(f, topic) and q > 0 for f, q in filters):
                continue
            if expiry is not None and (end is None or t_inv + expiry < end):
                result.may_expire += 1
                continue
            if client in subs5 and any(t > t_inv for t in fresh.get(client, ())):
                result.session_ended += 1
                continue
            delivered = (client, msg_id) in got
            if not any(t > t_ack for t in connects.get(client, ())):
                result.not_moved += 1
                result.not_moved_lost += not delivered
                continue
            result.checked += 1
            if not delivered:
                result.lost.append((msg_id, client, t_ack))
    return result


def _subscription_at(
    subs: list[tuple[float, list[tuple[str, int]]]], fresh: list[float], t: float
) -> tuple[float, list[tuple[str, int]]] | None:
    """The SUBACK of the session an MQTT 5 subscriber had at ``t``: the first one since its
    last CONNACK without a session before ``t`` (None: none yet)."""
    since = max((f for f in fresh if f <= t), default=float("-inf"))
    return next((sub for sub in subs if since <= sub[0] <= t), None)


@dataclass
class OrderCheck:
    """Each publisher's messages on one topic and QoS, as one subscriber got them."""

    checked: int = 0  # first deliveries of a message id "publisher:n"
    # (subscriber, msg id, the id it came after): a first delivery below one already delivered
    same_connection: list[tuple[str, str, str]] = field(default_factory=list)
    across_connections: list[tuple[str, str, str]] = field(default_factory=list)  # the other on an earlier one
    by_stream: dict[str, int] = field(default_factory=dict)  # "publisher topic qos" -> reorders

    @property
    def reorders(self) -> int:
        return len(self.same_connection) + len(self.across_connections)


def check_order(history: History) -> OrderCheck:
    """[MQTT-4.6.0-5, MQTT-4.6.0-6]: the messages of one publisher on one topic at one QoS
    (the QoS it published at) reach each subscriber in the order they were published. Message ids are "publisher:n"
    with n counting up per publisher; a first delivery (re-sends and repeats of one id do
    not count) whose n is below one already delivered on that stream is a reorder, counted
    apart when the earlier delivery came on another connection of the subscriber (a session
    that moved: MQTT orders the messages of a session, the mesh moved it between nodes)."""
    r = OrderCheck()
    first: set[tuple[str, str]] = set()
    high: dict[tuple[str, str, str, int], tuple[int, str, str]] = {}  # stream -> (n, msg id, conn)
    published: dict[str, int] = {}  # msg id -> the QoS it was published at
    for op in history.ops:
        if op[3] == "publish" and op[2] == "invoke":
            published[op[4]] = op[6]
        if op[3] != "receive":
            continue
        client, msg_id, topic, conn = op[1], op[4], op[5], op[8]
        # (the publication's QoS orders; a subscription may lower it)
        qos = published[msg_id] if msg_id in published else int(op[6])
        if (client, msg_id) in first:
            continue
        first.add((client, msg_id))
        publisher, _, n_text = msg_id.rpartition(":")
        if not n_text.isdigit():
            continue
        r.checked += 1
        n = int(n_text)
        key = (client, publisher, topic, qos)
        top = high.get(key)
        if top is None or n > top[0]:
            high[key] = (n, msg_id, conn)
            continue
        (r.same_connection if top[2] == conn else r.across_connections).append((client, msg_id, top[1]))
        stream = f"{publisher} {topic} {qos}"
        r.by_stream[stream] = r.by_stream.get(stream, 0) + 1
    return r


@dataclass
class WillCheck:
    """Wills against the connections they belong to."""

    checked: int = 0
    missing: list[str] = field(default_factory=list)  # ended without DISCONNECT, no will
    twice: list[tuple[str, int]] = field(default_factory=list)  # (conn, publications) over 1
    unwanted: list[tuple[str, str]] = field(default_factory=list)  # (conn, why): clean end or still open


def check_wills(
    history: History,
    published: dict[str, int],
    sides: dict[str, list[str | None]] | None = None,
    delayed: set[str] | None = None,
) -> WillCheck:
    """Invariant 3 (cluster.wills_once): a connection accepted and ended without a
    DISCONNECT the server read has its will published exactly once mesh-wide; one ended
    by DISCONNECT, or still open at the end, has none [MQTT-3.1.2-8, MQTT-3.14.4-3].
    ``published``: will publications counted at their source, by connection id.

    Across a partition (docs/simulation.md, finding 8, decided): a registrar cannot tell a
    node that died from one cut off, so the registrar of each side that loses sight of the
    connection's node publishes its will, while the connection may go on, or end, on its
    own side. So a will published by a node that could not reach the connection's node
    counts apart: at most one per side, and such a one is allowed for a connection that went
    on or ended cleanly (a crashed node's wills are all of that kind: its registrar publishes
    them, once). ``sides``: for each publication, the publisher's side when it could not
    reach the connection's node, or None (the exactly-once rule). ``delayed``: connections
    whose will waits for a Will Delay Interval (MQTT 5), judged by history5.check_will_delay
    instead."""
    sides = sides or {}
    delayed = delayed or set()
    result = WillCheck()
    accepted: set[str] = set()
    with_will: set[str] = set()
    ended: dict[str, bool] = {}
    for op in history.ops:
        if op[3] == "connect" and op[2] == "invoke" and op[6] == "will":
            with_will.add(op[4])
        elif op[3] == "connect" and op[2] == "ok" and op[4] in with_will:
            accepted.add(op[4])
        elif op[3] == "close":
            ended.setdefault(op[4], op[5])
    for conn in sorted(accepted - delayed):
        result.checked += 1
        n = published.get(conn, 0)
        across = [s for s in sides.get(conn, []) if s is not None]
        if len(set(across)) == len(across):  # at most one per side across a cut: allowed
            n -= len(across)
        clean = ended.get(conn)
        if clean is None:
            if n:
                result.unwanted.append((conn, f"still connected, will published {n}x"))
        elif clean:
            if n:
                result.unwanted.append((conn, f"ended by DISCONNECT, will published {n}x"))
        elif n == 0 and not across:
            result.missing.append(conn)
        elif n > 1:
            result.twice.append((conn, n))
    for conn, n in sorted(published.items()):
        if conn not in accepted and conn not in delayed and n > 1:
            result.twice.append((conn, n))  # never accepted: at most once
    return result


def check_sessions_resumed(history: History, persistent: set[str]) -> list[tuple[float, str, str, str]]:
    """Invariant 4 (cluster.session_present): a CleanSession=0 client accepted once has a
    session from then on [MQTT-3.1.2-4], so every later CONNACK that accepts it says session
    present [MQTT-3.2.2-2]. A refusal (0x03: the cluster cannot serve the session now) is
    not an answer about the session. ``persistent``: the ClientIds that connect with
    CleanSession=0. The (time, client, connection, node) of each acceptance without it."""
    accepted: set[str] = set()
    fresh = []
    for op in history.ops:
        if op[3] == "connect" and op[2] == "ok" and op[1] in persistent:
            if op[1] in accepted and not op[6]:
                fresh.append((op[0], op[1], op[4], op[5]))
            accepted.add(op[1])
    return fresh
