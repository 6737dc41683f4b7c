"""Shared subscriptions across the mesh: which node serves each message of a group.

Pure. A part of ``MeshEngine`` (engine.py, a mixin over engine_base.EngineState). A node
with members of a shared group (shared.py) advertises the group in its interest like a
filter, once per group and node: ``$share/{g}/{f}``, with WEIGHT and a power of two for
several connected members, with QUEUED when its members all queue (offline persistent
sessions: shared.py ``advertisement``); the plain interest index never matches it (its first
level is ``$share``). Here every node's groups are indexed by their filter ``f``, each node
with its weight (0: it queues): ``_choose_shares`` gives, for a message published here, the
one node that serves it for each group that has a member anywhere in reach (a node with a
connected member first; one that queues only when there is none), by
``MeshSettings.shared_strategy``:

- ``local``: this node if it has a member, else the nearest node that has one (by route
  cost, then by name): no message crosses a link for a group that is served here;
- ``round_robin``: the nodes with members in turn, each as many times as its weight (each
  node's members then in turn);
- ``hash_topic``, ``hash_clientid``: the node at the topic's (or the publisher's) CRC-32
  among the nodes with members, sorted and weighed: one topic, or one publisher, always to
  the same node while the membership is stable (and to the same member there, shared.py);
- ``sticky``: ``local``'s choice first, then the node chosen last while it is in reach.

The envelopes then say, per destination, the groups it serves (envelope.py ``shares``),
and a node serves a group only for the messages that say so (``Message.shares``); one that
has no member of it any more sends the message on (``_served_elsewhere``). Its members'
acknowledgements hold the node's own (custody.py ``hold``).
"""

from __future__ import annotations

import zlib

from ...message import Message
from ...shared import QUEUED, SHARE_PREFIX, WEIGHT, ShareError, is_resend_mark, resend_mark, root_of, split_share
from .engine_base import EngineState
from .envelope import Shares
from .spf import shortest_paths

__all__ = ["SharesMixin", "only", "share_entries", "split_entries"]


def only(msg: Message, share: str) -> tuple[str, str]:
    """A destination's groups in the envelope of ``msg``, a re-send for the group ``share``
    alone, not for the node's other subscribers (a member left holding it, its node is gone:
    route_to_group): first a mark that names the message it re-sends (shared.py
    ``resend_mark``; custody.py ``_group_copy`` set it), then the group."""
    return (resend_mark(root_of(msg)), share)


def share_entries(smap: Shares) -> list[str]:
    """The groups each destination serves a message for, as entries of its custody's
    destinations in the store ("=node=group": no node id has a "=", config.py), so that a
    restart still knows them (``split_entries``); node "" for a message kept (``_park``)."""
    return [f"={node}={share}" for node, shares in smap.items() for share in shares]


def split_entries(entries: list[str]) -> tuple[list[str], Shares]:
    """(the destinations, the groups each serves) of a custody's stored entries."""
    dests: list[str] = []
    groups: dict[str, list[str]] = {}
    for entry in entries:
        if entry.startswith("="):
            node, _, share = entry[1:].partition("=")
            groups.setdefault(node, []).append(share)
        elif entry:
            dests.append(entry)
    return dests, {node: tuple(shares) for node, shares in groups.items()}


def _advertised(share: str) -> tuple[str, int]:
    """(the group, its weight) of what a node advertises for it (shared.py ``advertisement``):
    connected members by power of two (1 for the group's share alone), 0 for members that
    queue (QUEUED); -1 for a form this node cannot read (not served)."""
    base, nul, tag = share.partition("\0")
    if not nul:
        return share, 1
    if share.endswith(QUEUED) and tag == QUEUED[1:]:
        return base, 0
    if tag[:1] == WEIGHT[1:] and tag[1:].isdigit() and len(tag) < 9:
        return base, max(1, int(tag[1:]))
    return base, -1


class SharesMixin(EngineState):
    def _share_added(self, share: str, node: str) -> None:
        """``node`` has members of the group ``share`` ("$share/{g}/{f}", with their weight
        or QUEUED: only members that queue, offline persistent sessions)."""
        share, weight = _advertised(share)
        if weight < 0:
            return
        try:
            parsed = split_share(share)
        except ShareError:
            return  # (a malformed one from a peer: not served)
        if parsed is None:
            return
        nodes = self._share_nodes.get(share)
        if nodes is None:
            nodes = self._share_nodes[share] = {}
            self._share_trie.add(parsed[1], share, 0)
        nodes[node] = weight

    def _share_removed(self, share: str, node: str) -> None:
        share, weight = _advertised(share)
        nodes = self._share_nodes.get(share)
        if nodes is None or nodes.get(node) != weight:
            return  # (what replaced it came first: added before the old one's removal)
        del nodes[node]
        if not nodes:
            del self._share_nodes[share]
            parsed = split_share(share)
            if parsed is not None:
                self._share_trie.remove(parsed[1], share)
            self._share_turn.pop(share, None)
            self._share_last.pop(share, None)

    def _shares_of(self, node: str, old: tuple[str, ...], new: tuple[str, ...]) -> None:
        """``node``'s advertised filters changed from ``old`` to ``new``: its groups too."""
        before = {f for f in old if f.startswith(SHARE_PREFIX)}
        after = {f for f in new if f.startswith(SHARE_PREFIX)}
        for share in before - after:
            self._share_removed(share, node)
        for share in after - before:
            self._share_added(share, node)

    def shared_online_elsewhere(self, share: str) -> bool:
        """Has a node in reach other than this one a connected member of ``share``?"""
        nodes = self._share_nodes.get(share)
        if not nodes:
            return False
        self._ensure_spf()
        next_hop = self.next_hop
        return any(weight > 0 and n in next_hop for n, weight in nodes.items())

    def _choose_shares(self, msg: Message, now: float) -> Shares | None:
        """Node -> the groups it serves ``msg`` for (this node's too); None when no group
        matches its topic. A QoS 1/2 message for a group whose nodes are all out of reach is
        kept for them (``_park``), as a new message of ours for that group alone."""
        matched = self._share_trie.match(msg.topic)
        if not matched:
            return None
        self._ensure_spf()
        out: dict[str, list[str]] = {}
        for share in matched:
            node = self._pick(share, msg)
            if node is None:
                copy = self._group_copy(msg, now) if msg.qos and self.new_seq is not None else None
                if copy is not None:
                    self._park(copy, share, now)
                else:
                    self.counters["shared_unreachable"] += 1
                continue
            out.setdefault(node, []).append(share)
        return {node: tuple(groups) for node, groups in out.items()}

    def _park(self, msg: Message, share: str, now: float) -> None:
        """``msg``, a QoS 1/2 message of ours for ``share`` alone, whose nodes with members
        are all out of reach (a partition, a node that restarts and has not heard of them
        yet): kept, and sent to one of them once it is in reach (``_unpark``, at each tick),
        for at most ``custody_timeout`` (as custody would hold it); in the store, with custody,
        where custody is (``restore_custody``)."""
        parked = self._parked
        if len(parked) >= self.settings.custody_limit:
            old = parked.popleft()
            self.counters["shared_parked_dropped"] += 1
            self._unpark_one(old[0])
        parked.append((msg, share, now))
        self.counters["shared_parked"] += 1
        journal = self.custody_journal
        if journal is not None:
            journal.custody_put(msg, share_entries({"": only(msg, share)}))  # (a restart keeps it)

    def _unpark_one(self, msg: Message) -> None:
        """``msg`` leaves the kept ones for nobody (expired, given up)."""
        self._settle_after(msg.seq)
        if self.custody_journal is not None:
            self.custody_journal.custody_remove(msg.seq)

    def _unpark(self, now: float) -> None:
        parked = self._parked
        for _ in range(len(parked)):
            msg, share, since = parked.popleft()
            if msg.expires is not None and msg.expires <= now:
                self._unpark_one(msg)  # (its life ended: to nobody [MQTT-3.3.2-5])
                continue
            node = self._pick(share, msg)
            if node == self.node_id:
                # a member joined here since (none was when it was kept, or the one that left
                # holding it was the last here): this node's broker serves it, for the group
                # alone (``served_here``), and it leaves what is kept
                msg.shares = only(msg, share)
                self._here.append(msg)
                self.counters["shared_unparked_here"] += 1
                self._unpark_one(msg)
            elif node is not None:
                self.route_local(msg, now, {node: only(msg, share)})  # (in custody: journaled anew)
            elif self.synced and not self._share_nodes.get(share, {}).keys() - {self.node_id}:
                self.counters["shared_unreachable"] += 1  # (no member anywhere any more)
                self._unpark_one(msg)
            elif now - since > self.settings.custody_timeout:
                self.counters["shared_parked_expired"] += 1
                self._unpark_one(msg)
            else:
                parked.append((msg, share, since))

    def _pick(self, share: str, msg: Message, exclude: str | None = None) -> str | None:
        me = self.node_id
        self._ensure_spf()
        next_hop = self.next_hop
        nodes = self._share_nodes.get(share)
        if not nodes:
            return None
        # the nodes in reach with a connected member, by weight; else those whose members queue
        reach = sorted((n, w) for n, w in nodes.items() if w and n != exclude and (n == me or n in next_hop))
        if not reach:
            reach = sorted((n, 1) for n in nodes if n != exclude and (n == me or n in next_hop))
            if not reach:
                return None
        strategy = self.settings.shared_strategy
        if msg.qos == 2:
            # a QoS 2 message of a persistent publisher may be routed twice, by the node that
            # took it and by the one its client moved to before its PUBREC, under one id
            # (mesh/cluster/replica.py): both must choose the same node, whose duplicate
            # filter keeps it to one member. So its choice depends on the message alone: as
            # its origin sees the mesh, and by its id where a strategy would take turns
            if strategy == "local" or (strategy == "sticky" and msg.origin != me):
                return self._nearest(reach, msg.origin)  # (sticky at its origin: the node kept)
            if strategy == "round_robin":
                return _weighted(reach, zlib.crc32(f"{msg.origin}:{msg.seq}".encode()))
        if strategy == "local" or (strategy == "sticky" and share not in self._share_last):
            # (sticky: the first node is the local one's, not the first by name everywhere)
            chosen = self._nearest(reach, me)
            if strategy == "sticky":
                self._share_last[share] = chosen
            return chosen
        if strategy == "sticky":
            last = self._share_last[share]
            if any(n == last for n, _ in reach):
                return last
        if strategy == "hash_topic" or strategy == "hash_clientid":
            key = msg.topic if strategy == "hash_topic" else (msg.publisher or msg.origin)
            return _weighted(reach, zlib.crc32(key.encode()))
        turn = self._share_turn.get(share, 0)
        self._share_turn[share] = turn + 1
        chosen = _weighted(reach, turn)
        self._share_last[share] = chosen
        return chosen

    def _nearest(self, reach: list[tuple[str, int]], origin: str) -> str:
        """``origin`` if it is among ``reach``, else the nearest of them to it (route cost, then
        name): from this node's routes, or, for another origin, from the same link map."""
        names = [n for n, _ in reach]
        if origin in names:
            return origin
        if origin == self.node_id:
            distance = self.distance
        else:
            distance = shortest_paths(origin, self._link_map())[1]
        return min(names, key=lambda n: (distance.get(n, 1 << 62), n))

    def _served_elsewhere(self, deliveries: list[Message], now: float) -> None:
        """Messages this node was chosen to serve a group for that has no member here any more
        (its last one left while they were on the way, or the node restarted before their
        origin heard of it), or none that takes a message (all away, granted QoS 0: shared.py
        ``advertisement``): each to a member on another node, for that group only, a new
        message of ours (a re-send, counted ``shared_rerouted``; custody.py
        ``_to_group_again``). A re-send already (``only``) goes on too, naming the same root:
        dropped here, it would be lost, its sender's wait ended by our acknowledgement (the
        fault harness, 7 nodes, seed 2: a member's node re-sent what its leaving member held
        to a node whose member had just left too). It goes to a node other than this one, by
        a view that has one member fewer at each step, so it does not go round for long."""
        me, groups = self.node_id, self._share_nodes
        if self.new_seq is None:
            return
        for msg in deliveries:
            shares = msg.shares
            if not shares:
                continue
            gone = [s for s in shares if not is_resend_mark(s) and me not in groups.get(s, ())]
            if not gone:
                continue
            for share in gone:
                # (QoS 1/2: its acknowledgement waits for the copy's; issue 24, finding 35)
                self._to_group_again(msg, share, now, held=True)
            # (not served here as well: a group that is here but advertised as none, its
            # members all away and granted QoS 0, would only drop it, counted; finding 34)
            msg.shares = tuple(s for s in shares if s not in gone)


def _weighted(reach: list[tuple[str, int]], n: int) -> str:
    """The node at ``n`` (modulo their total weight) of ``reach``, each node as many times as
    its weight: round robin and the hashes give a node with four connected members four
    times the messages of a node with one (shared.py gives each member there its turn)."""
    at = n % sum(w for _, w in reach)
    for node, weight in reach:
        if at < weight:
            return node
        at -= weight
    return reach[-1][0]  # (not reached)
