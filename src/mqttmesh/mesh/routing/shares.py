"""Shared subscriptions across the mesh: which node serves each message of a group.

Pure. A part of ``MeshEngine`` (engine.py, a mixin over engine_base.EngineState). A node
with members of a shared group (shared.py) advertises the group's filter, ``$share/{g}/{f}``,
in its interest like any filter (once per group and node, whatever its number of members);
the plain interest index never matches it (its first level is ``$share``). Here every
node's groups are indexed by their filter ``f``: ``_choose_shares`` gives, for a message
published here, the one node that serves it for each group that has a member anywhere in
reach, by ``MeshSettings.shared_strategy``:

- ``local``: this node if it has a member, else the nearest node that has one (by route
  cost, then by name): no message crosses a link for a group that is served here;
- ``round_robin``: the nodes with members in turn (each node's members then in turn);
- ``hash_topic``, ``hash_clientid``: the node at the topic's (or the publisher's) CRC-32
  among the nodes with members, sorted: one topic, or one publisher, always to the same
  node while the membership is stable (and to the same member there, shared.py);
- ``sticky``: the node chosen last while it is in reach and has members.

The envelopes then say, per destination, the groups it serves (envelope.py ``shares``),
and a node serves a group only for the messages that say so (``Message.shares``).
"""

from __future__ import annotations

import zlib

from ...message import Message
from ...shared import QUEUED, SHARE_PREFIX, ShareError, split_share
from .engine_base import EngineState
from .envelope import Shares

__all__ = ["SharesMixin", "ONLY"]

# first of a destination's groups in an envelope: the message is for these groups only, not
# for the node's other subscribers (a member left holding it: route_to_group); never a group
# ("$share/" has no share name)
ONLY = SHARE_PREFIX


class SharesMixin(EngineState):
    def _share_added(self, share: str, node: str) -> None:
        """``node`` has members of the group ``share`` ("$share/{g}/{f}"; with QUEUED, only
        members that queue: offline persistent sessions)."""
        online = not share.endswith(QUEUED)
        if not online:
            share = share[: -len(QUEUED)]
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
        nodes[node] = online

    def _share_removed(self, share: str, node: str) -> None:
        online = not share.endswith(QUEUED)
        if not online:
            share = share[: -len(QUEUED)]
        nodes = self._share_nodes.get(share)
        if nodes is None or nodes.get(node) is not online:
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
        return any(online and n in next_hop for n, online in nodes.items())

    def _choose_shares(self, msg: Message) -> Shares | None:
        """Node -> the groups it serves ``msg`` for (this node's too); None when no group
        matches its topic."""
        matched = self._share_trie.match(msg.topic)
        if not matched:
            return None
        self._ensure_spf()
        out: dict[str, list[str]] = {}
        for share in matched:
            node = self._pick(share, msg)
            if node is None:
                self.counters["shared_unreachable"] += 1
                continue
            out.setdefault(node, []).append(share)
        return {node: tuple(groups) for node, groups in out.items()}

    def _pick(self, share: str, msg: Message, exclude: str | None = None) -> str | None:
        me = self.node_id
        self._ensure_spf()
        next_hop = self.next_hop
        nodes = self._share_nodes.get(share)
        if not nodes:
            return None
        # the nodes in reach with a connected member; else those whose members queue
        reach = sorted(n for n, on in nodes.items() if on and n != exclude and (n == me or n in next_hop))
        if not reach:
            reach = sorted(n for n in nodes if n != exclude and (n == me or n in next_hop))
            if not reach:
                return None
        strategy = self.settings.shared_strategy
        if strategy == "local" or (strategy == "sticky" and share not in self._share_last):
            # (sticky: the first node is the local one's, not the first by name everywhere)
            if me in reach:
                chosen = me
            else:
                distance = self.distance
                chosen = min(reach, key=lambda n: (distance.get(n, 1 << 62), n))
            if strategy == "sticky":
                self._share_last[share] = chosen
            return chosen
        if strategy == "hash_topic" or strategy == "hash_clientid":
            key = msg.topic if strategy == "hash_topic" else (msg.publisher or msg.origin)
            return reach[zlib.crc32(key.encode()) % len(reach)]
        if strategy == "sticky":
            last = self._share_last.get(share)
            if last is not None and last in reach:
                return last
        turn = self._share_turn.get(share, 0)
        self._share_turn[share] = turn + 1
        chosen = reach[turn % len(reach)]
        self._share_last[share] = chosen
        return chosen

    def _served_elsewhere(self, deliveries: list[Message], now: float) -> None:
        """Messages this node was chosen to serve a group for that has no member here any more
        (its last one left while they were on the way, or the node restarted before their
        origin heard of it): each to a member on another node, for that group only, a new
        message of ours (a re-send, counted ``shared_rerouted``; custody.py
        ``_to_group_again``). Not one that is such a re-send already (``ONLY``): that one
        ends here, its group's interest is on its way to its sender."""
        local = self._local_filters
        for msg in deliveries:
            shares = msg.shares
            if not shares or shares[0] == ONLY or self.new_seq is None:
                continue
            for share in shares:
                if share not in local and share + QUEUED not in local:
                    self._to_group_again(msg, share, now)
