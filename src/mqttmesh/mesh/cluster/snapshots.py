"""A persistent session's state as one holder sends it to another, and what is done with it.

Pure. ``snapshot`` takes a copy's messages, settled ids and floors; ``merge_snapshots`` makes
one view of several holders' (an id settled anywhere is settled; a message only moves forward);
``unknown_to`` names what a copy holds that a snapshot lacks; ``install`` replaces a copy's
messages with a snapshot's. The wire form is in ``cluster_wire.py``; who sends and merges them,
and when, is claimant.py's and holders.py's business.
"""

from __future__ import annotations

import base64
import math
from collections.abc import Container
from dataclasses import replace

from ...message import Message, in_origin_order
from ...session import NO_ENTRIES, NO_PACKETS, SENT_PUBLISH, SENT_PUBREL, Entry
from .cluster_values import Forwarded, Snapshot, SnapshotEntry, props_b64, props_of, resent_root, ttl_ms, with_root
from .replica import _Replicated, released_id

__all__ = ["snapshot", "merge_snapshots", "merged_away", "unknown_to", "install"]


def snapshot(session: _Replicated, now: float) -> Snapshot:
    """The session's state at ``now``, as a holder sends it to another
    (mesh/cluster/cluster_wire.py)."""
    entries = []
    for entry in list(session.inflight.values()) + list(session.queue):
        if entry.retain:
            continue  # retained copies are re-sent from the retained store, not carried
        m = entry.msg
        payload = base64.b64encode(m.payload).decode()
        entries.append(
            SnapshotEntry(
                m.origin,
                m.seq,
                m.topic,
                payload,
                m.qos,
                entry.qos,
                entry.packet_id,
                entry.state,
                m.publisher,
                m.timestamp,
                props_b64(m.props),
                None if m.expires is None else ttl_ms(m.expires - now),
                resent_root(m),
            )
        )
    return Snapshot(
        session.client_id,
        dict(session.subscriptions),
        session.subs_version,
        entries,
        list(session.done),  # every id it remembers (packed: about two bytes each)
        sorted(session.awaiting_rel),
        session.active_node,
        session.epoch,
        session.version,
        [(o, s, state, pid) for (o, s), (state, pid) in session.reserved.items()],
        [(pid, Forwarded.of(m, now)) for pid, m in session.inbound.items() if pid in session.awaiting_rel],
        dict(session.floors),
        now,
        session.expiry,
        None if session.expires_at is None else ttl_ms(session.expires_at - now),
        session.routed_ids(),
    )


def merge_snapshots(snaps: list[Snapshot]) -> Snapshot | None:
    """Several holders' views in one. Message ids: an id settled anywhere is settled, and the
    furthest state wins (a message only moves forward). Inbound QoS 2 ids awaiting PUBREL
    come and go (an id is released, then reused by a new message): each is the latest
    view's, the one with the highest (epoch, version), never a union, unless that view has
    it awaiting PUBREL for a message another copy saw released: that view is behind for the
    id, and the next one decides (``_awaiting_rel``). A QoS 2 message at or below a copy's
    floor that the latest view does not hold cannot be told from one settled and forgotten:
    it is taken as settled (``_Replicated.forgotten``)."""
    if not snaps:
        return None
    snaps = _from_one_time(snaps)
    # settled id -> the newest (epoch, version) of a copy settling it
    done: dict[tuple[str, int], tuple[int, int]] = {}
    floors: dict[str, int] = {}
    for s in sorted(snaps, key=lambda s: (s.epoch, s.version)):
        done.update(dict.fromkeys(s.done, (s.epoch, s.version)))
        for origin, floor in s.floors.items():
            if floor > floors.get(origin, -1):
                floors[origin] = floor
    ranked = sorted(snaps, key=lambda s: (s.epoch, s.version), reverse=True)  # (stable: max's pick first)
    latest = ranked[0]
    in_latest = {(e.origin, e.seq) for e in latest.entries} | {(o, q) for o, q, _, _ in latest.reserved}
    best: dict[tuple[str, int], SnapshotEntry] = {}
    came: dict[tuple[str, int], int] = {}  # id -> the rank of the view its entry is from (0: latest)
    order: list[tuple[str, int]] = []
    release: dict[tuple[str, int], SnapshotEntry] = {}  # settled, but maybe held by the client
    # the views latest first: where two have a message at one state under two packet ids (one
    # copy missed a "sent" that sent it again after its client left and came back: detach
    # queues an unconfirmed PUBLISH again), the latest view's id is the one the client may
    # have; the other one would be a second PUBLISH of it (fault harness, 7 nodes, seed 14:
    # a QoS 2 message twice to one subscriber, DUP re-sends under two ids)
    for rank, s in enumerate(ranked):
        for e in s.entries:
            key = (e.origin, e.seq)
            if key in done:
                # (or settled by a copy of this view's epoch and version, no later: the epoch a
                # copy has is its newest, not the one it settled under; an old home that gave the
                # message away while cut off took a newer claim's copy, which had it in flight,
                # epoch and version with it: simulator, finding-42's scenario, seed 19 with
                # settle-batch. At worst a PUBREL the client answers with PUBCOMP. A copy of
                # the same claim further on, the client's node's, completed it: no PUBREL)
                if e.qos == 2 and e.state and e.pid and (s.epoch, s.version) >= done[key] and key not in release:
                    release[key] = e  # (the latest such view's: ranked first)
                continue
            if e.qos == 2 and key not in in_latest and e.seq <= floors.get(e.origin, -1):
                continue  # (settled and forgotten, as far as anyone can tell)
            if e.state and s.epoch < latest.epoch and key not in in_latest:
                # in flight under an older claim, gone from the newest copy: at QoS 2 every step
                # of it reached the nodes the newer claim gathered from (the gate), so it was
                # completed since (its settled id may be older than the TOMBSTONES a copy
                # remembers). A QoS 1 PUBLISH has no step before it leaves: a message only its
                # old node had (a shared group's, whose copy to the other holders, sess.fwd,
                # was lost) may never have been acknowledged, so it is kept, unless at or
                # below a floor (forgotten); a duplicate at worst (fault harness, 7 nodes,
                # MQTT 5, seed 9: 29 QoS 1/2 messages of a stalled member lost)
                if e.qos == 2 or e.seq <= floors.get(e.origin, -1):
                    continue
            have = best.get(key)
            if have is None:
                best[key] = e
                came[key] = rank
                order.append(key)
            else:
                if e.state > have.state:
                    best[key] = e
                    came[key] = rank
                if have.ttl_ms is not None and e.ttl_ms is not None and e.ttl_ms != best[key].ttl_ms:
                    # copies that took the message at different times (one read it late, or
                    # heard of it through the cluster) disagree on its remaining life: the
                    # shortest is the one that cannot outlive it [MQTT-3.3.2-5]
                    best[key] = best[key]._replace(ttl_ms=min(e.ttl_ms, have.ttl_ms))
    # ids settled for messages a copy did not have yet: the furthest state wins, an entry's too
    reserved: dict[tuple[str, int], tuple[int, int]] = {}
    reserved_came: dict[tuple[str, int], int] = {}
    for rank, s in enumerate(ranked):
        for origin, seq, state, pid in s.reserved:
            key = (origin, seq)
            if key not in done and (key not in reserved or reserved[key][0] < state):
                reserved[key] = (state, pid)
                reserved_came[key] = rank
    for key, (state, pid) in list(reserved.items()):
        entry = best.get(key)
        if entry is not None:
            del reserved[key]
            if entry.state < state or (entry.state == state and reserved_came[key] < came[key]):
                best[key] = entry._replace(pid=pid, state=state)
    released = _released(release, best, order, reserved, done) if release else {}
    _one_per_root(best, order, released, done, (latest.epoch, latest.version))
    subs_from = max(snaps, key=lambda s: (s.subs_version, s.epoch))
    rel, inbound = _awaiting_rel(ranked, done, floors)
    # in flight first (in packet-id send order), then queued, each in arrival order
    entries = [best[k] for k in order]
    entries.sort(key=lambda e: 0 if e.state else 1)
    # (copies that got one origin's messages in different orders, or not all of them)
    in_origin_order(entries, lambda e: None if e.state else (e.origin, e.seq))
    return Snapshot(
        snaps[0].cid,
        subs_from.subs,
        subs_from.subs_version,
        entries,
        # (a set's order, as before issue 14: it depends on the hash seed, which decides
        # which ids are kept only when there are more than the snapshot and TOMBSTONES keep)
        list(done),
        rel,
        subs_from.active,
        max(s.epoch for s in snaps),
        latest.version,
        [(o, s, state, pid) for (o, s), (state, pid) in reserved.items()],
        inbound,
        floors,
        snaps[0].taken_at,
        latest.expiry,  # (the session's own, as of its latest step)
        latest.expires_ms,
        _routed(snaps, inbound),
    )


def merged_away(snaps: list[Snapshot], merged: Snapshot) -> int:
    """How many QoS 2 messages in flight in a copy of ``snaps`` the ``merged`` one neither
    holds nor settled: those ``merge_snapshots`` took for completed (in flight under an older
    claim, gone from the newest copy), which loses them, unsettled anywhere, should a copy of
    a newer epoch lack them for another reason (counted: ``merged_away_in_flight``; the fault
    harness's pub3:1442/1444, 7 nodes, MQTT 5, seed 9, vanished with no settlement in any
    store)."""
    gone = {(e.origin, e.seq) for s in snaps for e in s.entries if e.qos == 2 and e.state}
    if not gone:
        return 0
    gone.difference_update((e.origin, e.seq) for e in merged.entries)
    gone.difference_update((o, q) for o, q, _, _ in merged.reserved)
    if gone:
        gone.difference_update(merged.done)
    return len(gone)


def _released(
    release: dict[tuple[str, int], SnapshotEntry],
    best: dict[tuple[str, int], SnapshotEntry],
    order: list[tuple[str, int]],
    reserved: dict[tuple[str, int], tuple[int, int]],
    done: dict[tuple[str, int], tuple[int, int]],
) -> dict[tuple[str, int], tuple[SnapshotEntry, tuple[int, int]]]:
    """A QoS 2 message settled by one copy and in flight under a newer claim's: the copy that
    settled it could not know that the newer claim's node sent it to the client (it gave it
    to another member of its group, or withdrew it expired, while cut off, or while the claim
    gathered), so the client may hold its packet id awaiting PUBREL, and take a new message
    under that id for a re-send of it, never delivered [MQTT-4.3.3-1]. It stays settled for
    the mesh, and its id is released, not reused: the merged copy has it at PUBREL, which the
    node the client is on sends again (``Session.attach``) and the PUBCOMP settles (fault
    harness, 7 nodes, MQTT 5, seed 9: sub0 kept id 376 for a message its home gave away; a
    QoS 2 message sent under 376 later was taken for a repeat and lost). The ids released,
    each with its view's entry and when it was settled."""
    used = {e.pid for e in best.values() if e.state} | {pid for _, pid in reserved.values()}
    released = {}
    for key, e in release.items():
        if e.pid in used:
            continue  # (the id went to another message since: nothing left to release)
        used.add(e.pid)
        best[key] = e._replace(state=SENT_PUBREL)
        order.append(key)
        released[key] = (e, done.pop(key))
    return released


def _one_per_root(
    best: dict[tuple[str, int], SnapshotEntry],
    order: list[tuple[str, int]],
    released: dict[tuple[str, int], tuple[SnapshotEntry, tuple[int, int]]],
    done: dict[tuple[str, int], tuple[int, int]],
    at: tuple[int, int],
) -> None:
    """One message of each root for the session (a shared group's re-send of a message is
    another message id, which a member that had the root, or another re-send of it, does not
    take: shared.py ``had``): views that took a message and a re-send of it apart (an old home
    gave away what its gate held, the client got it from a claim elsewhere, and the group's
    re-send came back to the old home) leave both in the merge. What is in flight stays (the
    client may hold its packet id) and the copies of it that are queued are settled. Where the
    only one in flight is a release (``_released``) of a PUBLISH the client may never have
    had, the first queued copy takes its packet id, in flight (a DUP PUBLISH: a re-send to a
    client that holds the id, one delivery to one that does not) and the release is settled
    again. Else the first queued copy stays (simulator, finding 42's scenario, seed 19 with
    settle-batch: a QoS 2 message twice to one session, under two ids)."""
    roots: dict[tuple[str, int], list[tuple[str, int]]] = {}
    for key in order:
        e = best.get(key)
        if e is not None:
            roots.setdefault(e.root or key, []).append(key)
    gone: list[tuple[str, int]] = []
    for keys in roots.values():
        if len(keys) < 2:
            continue
        queued = [k for k in keys if not best[k].state]
        if not queued:
            continue  # (each went out under its own id: nothing to undo)
        # (the client has one: in flight under a claim, or PUBREC'd before its release)
        had = any(best[k].state and (k not in released or released[k][0].state == SENT_PUBREL) for k in keys)
        if not had:
            held = [k for k in keys if k in released]
            if held:
                k, q = held[0], queued[0]
                best[q] = best[q]._replace(pid=best[k].pid, state=SENT_PUBLISH)
                gone.append(k)
                done[k] = released[k][1]
            else:
                queued = queued[1:]  # (none went out: the first one goes)
        for k in queued:
            if best[k].state:
                continue  # (the one that took a released id)
            gone.append(k)
            done[k] = at
    if gone:
        for k in gone:
            del best[k]
        order[:] = [k for k in order if k in best]


def _routed(snaps: list[Snapshot], inbound: list[tuple[int, Forwarded]]) -> list[tuple[str, int]]:
    """The ids of the merged ``inbound`` messages that any view says a node routed."""
    if not any(s.routed for s in snaps):
        return []
    ids = {(f.origin, f.seq) for _, f in inbound}
    routed = {key for s in snaps for key in s.routed}
    return [(f.origin, f.seq) for _, f in inbound if (f.origin, f.seq) in routed and (f.origin, f.seq) in ids]


def _awaiting_rel(
    ranked: list[Snapshot], done: Container[tuple[str, int]], floors: dict[str, int]
) -> tuple[list[int], list[tuple[int, Forwarded]]]:
    """The inbound QoS 2 ids awaiting PUBREL of views ``ranked`` latest first, with their
    messages. Each id is as the first view has it, awaiting PUBREL or not, unless that view
    has it for a message some copy saw released (``done``, replica.released_id): that view
    missed the release and what came after, and the next view decides. The latest view is
    not always the furthest for an id: a copy cut off before the release can rank first with
    an epoch larger than the later claims' that did not gather it (a registrar's grant it then
    forgot in a restart), and the client's next PUBLISH on the id would be taken for a re-send
    and never routed. Below a copy's floor of releases (forgotten) a message of a later view
    counts as released."""
    rels = [set(s.rel) for s in ranked]
    views = [{pid: fwd for pid, fwd in s.inbound} for s in ranked]
    pending: dict[int, Forwarded | None] = {}
    for pid in sorted({p for rel in rels for p in rel}):
        for i, rel in enumerate(rels):
            if pid not in rel:
                break  # free in this view
            fwd = views[i].get(pid)
            if fwd is not None:
                key = released_id((fwd.origin, fwd.seq))
                if key in done or (i and key[1] <= floors.get(key[0], -1)):
                    continue  # this view is behind for the id
            pending[pid] = fwd
            break
    # their messages in the order the views took them (the oldest unrouted goes first)
    inbound: dict[int, Forwarded] = {}
    for s in ranked:
        for pid, fwd in s.inbound:
            if pid not in inbound and pending.get(pid) is fwd:
                inbound[pid] = fwd
    return sorted(pending), list(inbound.items())


def _from_one_time(snaps: list[Snapshot]) -> list[Snapshot]:
    """``snaps`` with every remaining life they carry counted from one time, the latest
    they were taken or arrived at (what merge_snapshots makes counts from it): their
    messages', their inbound QoS 2 messages' and their Session Expiry's (``Snapshot.aged``)."""
    times = [s.taken_at for s in snaps if s.taken_at is not None]
    if not times or all(t == times[0] for t in times) and len(times) == len(snaps):
        return snaps
    base = max(times)
    out = []
    for s in snaps:
        gone = 0 if s.taken_at is None else math.ceil((base - s.taken_at) * 1000.0)
        out.append(replace(s.aged(gone) if gone else s, taken_at=base))
    return out


def unknown_to(session: _Replicated, snap: Snapshot) -> list[Entry]:
    """The entries of ``session`` whose messages ``snap`` neither has nor settled (as far as
    either knows): a copy about to be replaced by ``snap`` must not drop them."""
    known = {(e.origin, e.seq) for e in snap.entries}
    known.update(snap.done)
    known.update((o, q) for o, q, _, _ in snap.reserved)
    done = session.done
    floors = snap.floors
    out = []
    for entry in list(session.inflight.values()) + list(session.queue):
        key = (entry.msg.origin, entry.msg.seq)
        if entry.retain or key in known or key in done:
            continue
        if entry.qos == 2 and key[1] <= floors.get(key[0], -1):
            continue  # settled and forgotten there, as far as anyone can tell (forgotten)
        out.append(entry)
    return out


def install(session: _Replicated, snap: Snapshot, now: float) -> None:
    """Replace the session's messages with the snapshot's (subscriptions are the caller's job);
    ``now``: when it is installed (its messages' lives count from ``snap.taken_at``, or then)."""
    taken = now if snap.taken_at is None else snap.taken_at
    base = super(_Replicated, session)  # storage only: these are not settlements
    settled = set(snap.done)
    groups: dict[tuple[str, int], Entry] = {}  # message id -> an entry that came through a shared group
    for entry in list(session.inflight.values()) + list(session.queue):
        base._stored_remove(entry)  # type: ignore[attr-defined]  # (a Session method, reached past _Replicated)
        key = (entry.msg.origin, entry.msg.seq)
        if key in settled:
            session._stored_done(key)  # (a message this copy had: its settlement is stored too)
        if entry.group is not None:
            groups[key] = entry
    session.inflight = NO_PACKETS
    session.queue = NO_ENTRIES
    session.ids.clear()
    for key in snap.done:
        session._remember_done(key)
    for origin, floor in snap.floors.items():
        session._raise_floor(origin, floor)
    used = set()
    done = session.done
    for origin, seq, topic, payload, msg_qos, qos, pid, state, publisher, ts, props, ttl, root in snap.entries:
        if (origin, seq) in done and (state != SENT_PUBREL or not pid or pid in used):
            # settled here before (this copy remembers TOMBSTONES ids, a snapshot carries
            # those of its copy): a copy that was away, or paused, must not bring it back;
            # at PUBREL it brings back no message, only the release of an id the client may
            # hold (``_released``)
            continue
        msg = with_root(
            Message(topic, base64.b64decode(payload), msg_qos, False, origin, seq, publisher, ts, props_of(props)), root
        )
        if ttl is not None:
            msg.expiring(ttl / 1000.0 + taken - now, now)
        entry = session._new_entry(msg, qos, False)
        had = groups.pop((origin, seq), None) if groups else None
        if had is not None:
            if state != SENT_PUBREL:
                entry.group = had.group  # (still waited for through it: settled when the client has it)
            elif had.state != SENT_PUBREL:
                had.group.settled(had.msg)  # (its client has it: PUBREC'd elsewhere)
        if state and pid and pid not in used:
            entry.packet_id, entry.state = pid, state
            session.in_flight()[pid] = entry
            used.add(pid)
        else:
            session.queued().append(entry)
        session._stored_put(entry)
    for entry in groups.values():  # (settled elsewhere, or gone: waited for no more)
        if entry.state != SENT_PUBREL:
            entry.group.settled(entry.msg)
    old, new = set(session.awaiting_rel), set(snap.rel)
    for pid in sorted(old - new):
        base.awaiting_rel_remove(pid)  # type: ignore[attr-defined]  # (journaled by a DurableMeshSession)
    for pid in sorted(new - old):
        base.awaiting_rel_add(pid)  # type: ignore[attr-defined]
    inbound = {pid: fwd.message(taken) for pid, fwd in snap.inbound if pid in new}
    session.expiry = snap.expiry
    # (None while a client is attached: the node it is on says when it ends, once it left)
    expires_at = None if snap.expires_ms is None else taken + snap.expires_ms / 1000.0
    if expires_at != session.expires_at:
        session.expires_at = expires_at
        if session.durable:
            session._stored_subscriptions()  # (a restart keeps counting: the store has it)
    ids = {(m.origin, m.seq) for m in inbound.values()}
    # routed by this node, or by a node a copy names: the node the client is on does not route
    # them again (channel_publish.py ``_route_unrouted``)
    session.routed_here = {key for key in session.routed_here if key in ids}
    routed = {key: b for key, b in session.routed_batch.items() if key in ids}
    for key in snap.routed:
        if key in ids:
            routed.setdefault(key, 0)
            session.routed_here.add(key)
    session.routed_batch = routed
    for pid in session.inbound.keys() - inbound.keys():
        session._stored_inbound(pid, None)
    for pid, msg in inbound.items():
        have = session.inbound.get(pid)
        if have is None or (have.origin, have.seq) != (msg.origin, msg.seq):
            session._stored_inbound(pid, msg)
    session.inbound = inbound
    session.reserved = {(o, s): (state, pid) for o, s, state, pid in snap.reserved if (o, s) not in session.ids}
    session.subs_version = max(session.subs_version, snap.subs_version)
    session.epoch = max(session.epoch, snap.epoch)
    session.version = snap.version
    session._stored_version()
    session.restore_done()  # (new packet ids after the highest in flight)
