"""Retained messages across the mesh: owners, lookups, tombstones.

Pure. Each retained topic lives on its owners, the top ``replication`` nodes of the
topic's ranking (membership.py), the newest version (timestamp, origin, seq) winning, so
that after a split the two sides' versions settle on one. The node a message is published
at keeps it too until an owner confirms it (``ret.ack``), and sends it again at the next
rebalance if the confirmation never comes. A new subscription asks the owners (an exact
filter) or every node (a wildcard) and delivers the newest of each topic once all have
answered or ``lookup_timeout`` passed [MQTT-3.3.1-6]. A deletion (an empty payload) stays
as a tombstone for ``tombstone_ttl`` so that an older copy cannot come back [MQTT-3.3.1-10].

The Broker calls it (a ports.RetainedPort) for every non-$ retained message, so it is
built before the Broker: it shares the Broker's retained trie, journal and auth, and holds
no Broker. No ret.* message goes to this node itself (lookups take the local items
directly; retain and rebalance skip this node), so every send is a plain unicast.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from typing import TYPE_CHECKING

from ...message import Message
from .cluster_values import props_b64, props_of, ttl_ms
from .cluster_wire import Outbox, RetAck, RetainedAck, RetainedItem, RetQuery, RetReply, RetSet
from .membership import Membership

if TYPE_CHECKING:
    from ...auth import Auth
    from ...ports import JournalPort, UnicastPort
    from ...session import Session
    from ...topics import RetainedTrie
    from .cluster_values import ClusterSettings

__all__ = ["RetainedOwners"]


def _item(msg: Message, now: float | None) -> RetainedItem:
    """``msg`` on the wire, with what is left of its life at ``now`` (None: as it was handed
    on, ``Message.ttl``)."""
    payload = base64.b64encode(msg.payload).decode()
    props = props_b64(msg.props)
    ttl = None
    if msg.expires is not None:
        ttl = ttl_ms(msg.ttl if now is None else msg.expires - now)
    return RetainedItem(msg.topic, payload, msg.qos, msg.timestamp, msg.origin, msg.seq, msg.publisher, props, ttl)


def _message(item: RetainedItem, now: float) -> Message:
    payload = base64.b64decode(item.payload_b64)
    props = props_of(item.props_b64)
    msg = Message(item.topic, payload, item.qos, True, item.origin, item.seq, item.publisher, item.ts, props)
    return msg if item.ttl_ms is None else msg.expiring(item.ttl_ms / 1000.0, now)


def _topic(msg: Message) -> str:
    return msg.topic  # (one version per topic: the same order on every run)


class _Lookup:
    __slots__ = ("session", "filter", "granted", "waiting", "items", "deadline")

    def __init__(self, session: Session, topic_filter: str, granted: int, deadline: float):
        self.session, self.filter, self.granted = session, topic_filter, granted
        self.waiting: set[str] = set()  # nodes yet to answer
        self.items: dict[str, Message] = {}  # topic -> newest version so far
        self.deadline = deadline


class RetainedOwners:
    def __init__(
        self,
        node_id: str,
        membership: Membership,
        retained: RetainedTrie,
        journal: JournalPort,
        auth: Auth,
        outbox: Outbox,
        net: UnicastPort,
        settings: ClusterSettings,
        ids: Iterator[int],
        wall_offset: float,
    ):
        self.node_id = node_id
        self.membership = membership
        self.retained = retained  # the Broker's trie: this node's copies, $SYS too
        self.journal = journal
        self.auth = auth
        self.out = outbox  # what it says to other nodes (the Cluster sends it)
        self._net = net  # asked who is reachable, never to send
        self.settings = settings
        # what it counts (Cluster.counters adds up every part's)
        self.counters = dict.fromkeys(("retained_lookups", "retained_expired"), 0)
        self._ids = ids  # query ids
        self.wall_offset = wall_offset  # wall-clock seconds minus `now`
        self.lookups: dict[int, _Lookup] = {}
        self._out: dict[str, list[RetainedItem]] = {}  # owner -> versions to send it (flush)

    # -- storing ------------------------------------------------------------------------

    def retain(self, msg: Message) -> None:
        """A retained message (or an empty one, a deletion) published here [MQTT-3.3.1-5, -10]."""
        item = _item(msg, None)
        # kept here too (durable before the PUBACK) until an owner confirms it has it; a
        # copy lost on the way is sent again from here at the next rebalance
        self._store(msg.copy(retain=True))
        for node in self.membership.owners(msg.topic):
            if node != self.node_id:
                self._out.setdefault(node, []).append(item)

    def _store(self, msg: Message) -> None:
        have = self.retained.get(msg.topic)
        if have is not None and (have.timestamp, have.origin, have.seq) >= (msg.timestamp, msg.origin, msg.seq):
            return  # we hold a newer one (the newest wins after a split)
        self.retained.set(msg.topic, msg)  # an empty payload stays as a tombstone
        self.journal.retained_put(msg.topic, msg)

    def on_set(self, frm: str, m: RetSet, now: float) -> None:
        """We own these topics (or hold them for an owner): keep the newest, confirm."""
        for item in m.items:
            self._store(_message(item, now))
        self.out.put(frm, RetAck([RetainedAck(i.topic, i.ts, i.origin, i.seq) for i in m.items]))

    def on_ack(self, frm: str, m: RetAck, now: float) -> None:
        """An owner has these: our interim copies of topics we do not own can go."""
        retained = self.retained
        for topic, ts, origin, seq in m.items:
            if self.node_id in self.membership.owners(topic):
                continue
            have = retained.get(topic)
            if have is not None and (have.timestamp, have.origin, have.seq) == (ts, origin, seq):
                retained.delete(topic)
                self.journal.retained_delete(topic)

    def rebalance(self, now: float) -> None:
        """The live nodes changed: each topic goes to its owners; we keep only ours."""
        retained = self.retained
        for topic, msg in list(retained.items()):
            if topic.startswith("$"):
                continue
            own = self.membership.owners(topic)
            item = _item(msg, now)
            for node in own:
                if node != self.node_id:
                    self._out.setdefault(node, []).append(item)
            if self.node_id not in own:
                retained.delete(topic)
                self.journal.retained_delete(topic)

    def expire_tombstones(self, now: float) -> None:
        """Tombstones older than ``tombstone_ttl`` go, and messages past their expiry: a
        newer version wins over either all the same, and an older one cannot come back
        once the expired one is gone from every owner any more than an expired one may be
        sent [MQTT-3.3.2-5]."""
        horizon = now + self.wall_offset - self.settings.tombstone_ttl
        retained = self.retained
        for topic, msg in list(retained.items()):
            if (not msg.payload and msg.timestamp < horizon) or (msg.expires is not None and msg.expires <= now):
                retained.delete(topic)
                self.journal.retained_delete(topic)

    def flush(self) -> None:
        """Send the owners what accumulated for them."""
        if self._out:
            out, self._out = self._out, {}
            for node, items in out.items():
                self.out.put(node, RetSet(items))

    # -- lookups ------------------------------------------------------------------------------

    def send_retained(self, session: Session, topic_filter: str, granted: int, now: float) -> int:
        """Send a new subscription the retained messages matching it, from their owners."""
        self.counters["retained_lookups"] += 1
        wildcard = "+" in topic_filter or "#" in topic_filter
        targets = set(self.membership.live) if wildcard else set(self.membership.owners(topic_filter))
        qid = next(self._ids)
        lookup = _Lookup(session, topic_filter, granted, now + self.settings.lookup_timeout)
        self.lookups[qid] = lookup
        for node in sorted(targets):  # (sorted: the same sends in the same order on every run)
            if node == self.node_id:
                self._add_items(lookup, self._local(topic_filter))
            elif self._net.reachable(node):
                self.out.put(node, RetQuery(qid, topic_filter))
                lookup.waiting.add(node)
        if not lookup.waiting:
            self._deliver(qid, now)
        return 0

    def _local(self, topic_filter: str) -> list[Message]:
        return [m for _, m in self.retained.match(topic_filter)]

    def on_query(self, frm: str, m: RetQuery, now: float) -> None:
        self.out.put(frm, RetReply(m.qid, [_item(msg, now) for msg in self._local(m.filter)]))

    def on_reply(self, frm: str, m: RetReply, now: float) -> None:
        lookup = self.lookups.get(m.qid)
        if lookup is not None:
            self._add_items(lookup, [_message(item, now) for item in m.items])
            lookup.waiting.discard(frm)
            if not lookup.waiting:
                self._deliver(m.qid, now)

    def _add_items(self, lookup: _Lookup, items: list[Message]) -> None:
        for msg in items:
            have = lookup.items.get(msg.topic)
            if have is None or (msg.timestamp, msg.origin, msg.seq) > (have.timestamp, have.origin, have.seq):
                lookup.items[msg.topic] = msg

    def expire_lookups(self, now: float) -> None:
        """Lookups whose time is up deliver what they have."""
        for qid, lookup in list(self.lookups.items()):
            if now >= lookup.deadline:
                self._deliver(qid, now)

    def _deliver(self, qid: int, now: float) -> None:
        lookup = self.lookups.pop(qid, None)
        if lookup is None:
            return
        session = lookup.session
        if session.subscriptions.get(lookup.filter) is None:
            return  # unsubscribed meanwhile
        auth = self.auth
        for msg in sorted(lookup.items.values(), key=_topic):
            if not msg.payload:
                continue  # a tombstone
            if auth.acl is not None and not auth.can_receive(session.username, session.client_id, msg.topic):
                continue
            msg = msg.at(now)
            if msg.expired:
                self.counters["retained_expired"] += 1  # never sent once expired [MQTT-3.3.2-5]
                continue
            session.deliver(msg, min(msg.qos, lookup.granted), retain=True)  # [MQTT-3.3.1-6, -8]
