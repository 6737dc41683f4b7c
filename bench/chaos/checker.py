"""The checker: a pure function from a client history to what broke (Jepsen style).

Leaves to its caller: running the clients and recording the ``History``
(mqttmesh.sim.history), and what only the nodes know (connections per ClientId, read
from their status). Nothing here looks at a clock, a socket or a broker's counters.

How a QoS 2 duplicate (a subscriber told twice of one message id) is classified:

- ``inbound`` when its publisher sent it on more than one connection (the PUBLISH with
  DUP=1, or its PUBREL, re-sent after a reconnection): the mesh may have taken it in twice;
- ``outbound`` otherwise, when the repeat came on a later connection of the subscriber
  (DUP=0 or another packet id: a new delivery from a session that had lost track of the
  first; with DUP=1 and the same id after the id's PUBREL: a re-send of a completed one);
- ``other`` otherwise: both copies on one connection of the subscriber (two copies routed).

A message with an MQTT 5 Message Expiry Interval (its topic ends in ``/e<seconds>``, the MQTT 5
workload's) may be dropped, so it is never counted lost; it must not be delivered after its
expiry: a first delivery to a subscriber (DUP=0: a re-send of one in flight may come later,
MQTT-3.3.2-5) later than its acknowledgement to the publisher (the broker had it by then) plus
its interval plus ``EXPIRY_SLACK`` is ``late``, unless the PUBLISH says 0 is left: the node
began its delivery before the expiry and the frame left later (it waited behind what a
persistent session holds back for its holders), which MQTT-3.3.2-5 allows; those are counted
apart (``begun_before_expiry``). So is one whose node was stopped (SIGSTOP, ``pauses``) from
before its deadline until shortly before the delivery (``framed_before_pause``): a node
frames a PUBLISH with what is left of its life and its event loop writes it at the next
turn; a stop that lands in between holds the written frame until the node runs again,
when the client gets it late through no decision of the node's (seen: 0.1 s left when
framed, delivered 2.7 s late after a 2.6 s stop).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from mqttmesh.sim.history import History, Op, OrderCheck, check_order
from mqttmesh.topics import filter_matches

__all__ = ["ChaosCheck", "check", "expiry_of", "EXPIRY_SLACK"]

# what the clients' own thread may add to a delivery's time (it reads all of them in turn)
EXPIRY_SLACK = 1.0
# a delivery this soon after its node ran again is one the stop held back (``pauses``)
RESUMED_WITHIN = 0.5


def expiry_of(topic: str) -> int | None:
    """The Message Expiry Interval the MQTT 5 workload gave a message on ``topic``, if any."""
    last = topic.rsplit("/", 1)[-1]
    return int(last[1:]) if last[:1] == "e" and last[1:].isdigit() else None


@dataclass
class ChaosCheck:
    published: int = 0  # PUBLISHes invoked (QoS 1 and 2)
    acked: int = 0  # of them, acknowledged (PUBACK, or PUBREC for QoS 2)
    checked: int = 0  # (acked message, subscriber whose subscription was in place) pairs
    judged: list[tuple[str, str]] = field(default_factory=list)  # those pairs: (msg id, subscriber)
    lost: list[tuple[str, str]] = field(default_factory=list)  # (msg id, subscriber)
    qos2_dups: list[tuple[str, str, str]] = field(default_factory=list)  # (msg id, subscriber, class)
    qos1_dups: int = 0
    order: OrderCheck = field(default_factory=OrderCheck)  # per (publisher, topic, QoS): sim/history.py
    pid_reuse: list[tuple[str, int, str, str]] = field(default_factory=list)  # (sub, pid, held, new)
    wrong_session_present: list[tuple[str, str]] = field(default_factory=list)  # (client, connection)
    refusals: dict[str, int] = field(default_factory=dict)  # CONNACK code -> count
    connect_errors: dict[str, int] = field(default_factory=dict)  # no CONNACK: why -> count
    connections: dict[str, int] | None = None  # ClientId -> live connections at the end
    not_one_connection: dict[str, int] = field(default_factory=dict)
    expiring: int = 0  # acknowledged messages with a Message Expiry Interval (MQTT 5 workload)
    late: list[tuple[str, str, float]] = field(default_factory=list)  # (msg id, subscriber, s after expiry)
    begun_before_expiry: int = 0  # late first deliveries whose PUBLISH said 0 was left
    framed_before_pause: int = 0  # late first deliveries a stop of their node held back

    def qos2_by_class(self) -> dict[str, int]:
        counts = Counter(c for _, _, c in self.qos2_dups)
        return {k: counts.get(k, 0) for k in ("inbound", "outbound", "other")}

    @property
    def failed(self) -> bool:
        """What gates CI: lost, QoS 2 duplicates, packet-id reuse, wrong session present, a
        message delivered after its expiry, a ClientId on other than one connection at the end
        [MQTT-3.1.4-2] (after the run's ``one_connection_within``)."""
        return bool(
            self.lost
            or self.qos2_dups
            or self.pid_reuse
            or self.wrong_session_present
            or self.late
            or self.not_one_connection
        )

    def summary(self) -> dict[str, Any]:
        return {
            "published": self.published,
            "acked": self.acked,
            "checked": self.checked,
            "lost": len(self.lost),
            "qos2_duplicates": len(self.qos2_dups),
            "qos2_duplicates_by_class": self.qos2_by_class(),
            "qos1_duplicates": self.qos1_dups,
            "reorders": self.order.reorders,
            "reorders_same_connection": len(self.order.same_connection),
            "reorders_across_connections": len(self.order.across_connections),
            "reorders_by_stream": dict(sorted(self.order.by_stream.items())),
            "pid_reuse": len(self.pid_reuse),
            "wrong_session_present": len(self.wrong_session_present),
            "refusals": dict(sorted(self.refusals.items())),
            "connect_errors": dict(sorted(self.connect_errors.items())),
            "connections_per_client": self.connections,
            "not_one_connection": self.not_one_connection,
            "expiring": self.expiring,
            "delivered_after_expiry": len(self.late),
            "begun_before_expiry": self.begun_before_expiry,
            "framed_before_pause": self.framed_before_pause,
            "late": [list(x) for x in self.late[:20]],
            "failed": self.failed,
        }


def check(
    history: History,
    persistent: set[str],
    settle: float = 2.0,
    connections: dict[str, int] | None = None,
    pauses: dict[str, list[tuple[float, float]]] | None = None,
    per_subscriber: bool = True,
) -> ChaosCheck:
    """Judge ``history``. ``persistent``: the ClientIds that connect with CleanSession=0 (each
    must be told session present = 1 from its second accepted connection on). A message must
    reach every subscriber whose first SUBACK came at least ``settle`` seconds before the
    message was invoked (time for the filter to reach every node). ``connections``: live
    connections per ClientId at the end, as the nodes report them (None: not known).
    ``pauses``: node -> the (stop, continue) times of its SIGSTOPs, on the history's clock.
    ``per_subscriber`` False: no message is judged lost here (a shared group's members each get
    some of them: ``sharecheck.check_shared`` judges those)."""
    r = ChaosCheck(connections=connections)
    node_of: dict[str, str] = {}  # connection id -> the node it was made to
    invoked: dict[str, tuple[float, str, str, int]] = {}  # msg id -> (t, publisher, topic, qos)
    acked: dict[str, float] = {}  # msg id -> when its publisher had the acknowledgement
    resent: set[str] = set()
    first_sub: dict[str, tuple[float, list[tuple[str, int]]]] = {}
    got: dict[tuple[str, str], list[Op]] = {}  # (subscriber, msg id) -> receive ops
    held: dict[tuple[str, int], str] = {}  # (subscriber, packet id) -> msg id taken on it (QoS 2)
    had_session: set[str] = set()
    for op in history.ops:
        t, client, what, kind = op[0], op[1], op[2], op[3]
        if kind == "publish":
            msg_id = op[4]
            if what == "invoke":
                invoked[msg_id] = (t, client, op[5], op[6])
            elif what == "ok":
                acked.setdefault(msg_id, t)
            elif what == "resend":
                resent.add(msg_id)
        elif kind == "subscribe":
            first_sub.setdefault(client, (t, op[4]))
        elif kind == "connect":
            if what == "invoke":
                node_of[op[4]] = op[5]
            if what == "ok":
                if client in persistent and client in had_session and not op[6]:
                    r.wrong_session_present.append((client, op[4]))
                had_session.add(client)
            elif what == "fail":
                detail = op[6]
                if isinstance(detail, int):
                    r.refusals[f"0x{detail:02x}"] = r.refusals.get(f"0x{detail:02x}", 0) + 1
                else:
                    r.connect_errors[str(detail)] = r.connect_errors.get(str(detail), 0) + 1
        elif kind == "receive":
            msg_id, topic, qos = op[4], op[5], op[6]
            seen = got.setdefault((client, msg_id), [])
            seen.append(op)
            if qos == 2 and len(op) > 9:
                held[(client, op[9])] = msg_id
        elif kind == "repeat":
            msg_id, pid = op[4], op[9]
            before = held.get((client, pid))
            if before is not None and before != msg_id:
                r.pid_reuse.append((client, pid, before, msg_id))
    r.published = sum(1 for _, _, _, q in invoked.values() if q > 0)
    r.acked = sum(1 for m in acked if m in invoked and invoked[m][3] > 0)
    for (client, msg_id), ops in sorted(got.items()):
        if len(ops) < 2:
            continue
        if all(o[6] == 2 for o in ops):
            for repeat in ops[1:]:
                r.qos2_dups.append((msg_id, client, _classify(msg_id, ops[0], repeat, resent)))
        else:
            r.qos1_dups += len(ops) - 1
    for msg_id in sorted(acked):
        if msg_id not in invoked:
            continue
        t_inv, _, topic, qos = invoked[msg_id]
        if qos == 0:
            continue
        expiry = expiry_of(topic)
        if expiry is not None:
            r.expiring += 1
            deadline = acked[msg_id] + expiry + EXPIRY_SLACK
            for client, _ in first_sub.items():
                ops = got.get((client, msg_id))
                first = next((o for o in ops or () if not o[7]), None)  # (DUP=0: not a re-send)
                if first is not None and first[0] > deadline:
                    if len(first) > 10 and first[10] == 0:
                        r.begun_before_expiry += 1
                    elif _held_by_a_pause(pauses, node_of.get(first[8]), deadline, first[0]):
                        r.framed_before_pause += 1
                    else:
                        r.late.append((msg_id, client, round(first[0] - deadline + EXPIRY_SLACK, 3)))
            continue  # (it may expire: never counted lost)
        if not per_subscriber:
            continue
        for client, (t_sub, filters) in sorted(first_sub.items()):
            if t_inv < t_sub + settle or not any(filter_matches(f, topic) and q > 0 for f, q in filters):
                continue
            r.checked += 1
            r.judged.append((msg_id, client))
            if (client, msg_id) not in got:
                r.lost.append((msg_id, client))
    r.order = check_order(history)
    if connections is not None:
        # a persistent client is connected at the end: on one node; any ClientId on one at most
        clients = sorted(set(persistent) | {c for c, n in connections.items() if n > 1})
        r.not_one_connection = {c: connections.get(c, 0) for c in clients if connections.get(c, 0) != 1}
    return r


def _held_by_a_pause(
    pauses: dict[str, list[tuple[float, float]]] | None, node: str | None, deadline: float, t: float
) -> bool:
    """Was ``node`` stopped from before ``deadline`` until just before ``t`` (a delivery)?"""
    if not pauses or node is None:
        return False
    return any(stop <= deadline and t - RESUMED_WITHIN <= cont <= t for stop, cont in pauses.get(node, ()))


def _classify(msg_id: str, first: Op, repeat: Op, resent: set[str]) -> str:
    if msg_id in resent:
        return "inbound"
    if repeat[8] != first[8]:
        return "outbound"
    return "other"
