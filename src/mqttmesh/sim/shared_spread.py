"""How a shared group spreads over the mesh, judged from the clients' history (issue 24;
docs/simulation.md, "Shared groups"): its messages over the members, its membership changes
over the links.

Pure, and free of simulator imports, as shared_checks.py (whose memberships it reads): what
it is given is a client history, the windows in which the mesh was disturbed (faults, from
the scenario) and, for the control traffic, the interest deltas the simulator read off the
wire and the windows in which two nodes had no path between them. It leaves to its caller
what a fault is and how long detection takes (``margin``, ``detect``).

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

from dataclasses import dataclass, field
from typing import Any

from ..topics import filter_matches
from .shared_checks import (
    END,
    Apart,
    Membership,
    Windows,
    client_nodes,
    filter_of,
    memberships,
    node_at,
    overlaps,
    publications,
    sends,
)

__all__ = ["SpreadCheck", "ControlCheck", "check_spread", "check_control"]


@dataclass
class SpreadCheck:
    intervals: int = 0  # stable intervals with counted messages
    counted: int = 0  # first receptions counted
    worst_nodes: float = 0.0  # round_robin: the largest spread between two nodes' counts per unit of weight
    worst_members: int = 0  # round_robin, local: the largest spread between members of one node
    broken: list[tuple[str, str]] = field(default_factory=list)  # (share, what)


def check_spread(
    history: Any, strategy: str, faults: Windows, settle: float, window: float, margin: float
) -> SpreadCheck:
    r = SpreadCheck()
    ms = memberships(history)
    invoked, _acked = publications(history)
    # (a message a persistent publisher sent again may have been taken by two nodes, or by
    # another than its first: neither origin's turns can be told; left out)
    again = {mid for mid, times in sends(history)[0].items() if len(times) > 1}
    origins = client_nodes(history)
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
                if lo <= t <= hi and filter_matches(f, topic) and mid not in again
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
    ``most`` combinations: beyond, each loss at either end of its span, and beyond four times
    ``most``, the losses left all at the start of their spans or all at the end: many spans
    cost a bounded number of combinations, not two to the power of their number)."""
    if not spans:
        return []
    times = sorted({e[0] for e in evs})
    choices = []
    for lo, hi in spans:
        at = [lo, *(t for t in times if lo <= t < hi)]
        choices.append([(t, 4 if t > lo else 2, 0, -1) for t in at] + [(hi, 2, 0, -1)])
    out: list[list[tuple[float, int, int, int]]] = [[]]
    for i, options in enumerate(choices):
        if len(out) * len(options) > most:
            if len(out) * 2 > 4 * most:
                firsts = [o[0] for o in choices[i:]]
                lasts = [o[-1] for o in choices[i:]]
                return [[*placed, *firsts] for placed in out] + [[*placed, *lasts] for placed in out]
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
    # (client, share) -> where its session queues, client away, and since when
    queueing: dict[tuple[str, str], tuple[str, float]] = {}
    attempts: dict[str, list[float]] = {}  # client -> when it sent each CONNECT
    for op in history.ops:
        if op[3] == "connect" and op[2] == "invoke":
            attempts.setdefault(op[1], []).append(op[0])
    ms = memberships(history)
    for i, m in enumerate(ms):
        mine = events.setdefault((m.node, m.share), [])
        away_at = queueing.pop((m.client, m.share), None) if m.persistent else None
        if away_at is None:
            mine.append((m.begin, 1, 1, 0))
        else:
            # its client is back: the claim makes its session a member here, queueing until the
            # client is attached (SessionTable.regroup, then attached), and none at its old home,
            # from the first claim that fetched it there: a claim refused after its fetch took
            # the session out of the old home's groups before this one (holders.py ``on_fetch``)
            home, since = away_at
            first = min((t for t in attempts.get(m.client, ()) if since <= t < m.begin), default=m.begin)
            mine += [(m.begin, 0, 0, 1), (m.begin, 1, 1, -1)]
            told = _told_by(home, m.node, m.begin, apart, detect)
            if told is None and first == m.begin:
                events.setdefault((home, m.share), []).append((m.begin, 2, 0, -1))
            else:  # (up to its client's next connection: a claim again)
                later = [n.begin for n in ms[i + 1 :] if n.client == m.client]
                unsure.setdefault((home, m.share), []).append((first, min([m.begin if told is None else told, *later])))
        if m.end != END:
            # its session stays a member, queueing (QoS 1/2 only: one granted QoS 0 keeps
            # nothing for an absent client, and its node says so: none, shared.py ``advertisement``)
            away = m.persistent and m.how != "unsubscribe" and m.qos != 0
            mine.append((m.end, 3, -1, int(away)))
            if away:
                queueing[(m.client, m.share)] = (m.node, m.end)
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
