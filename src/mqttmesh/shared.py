"""Shared subscriptions on one node: ``$share/{ShareName}/{filter}`` (MQTT 5.0 section 4.8.2,
offered to MQTT 3.1.1 clients too, as the brokers they come from do).

Pure. A shared subscription is not its session's alone: the sessions that subscribe to one
filter under one share name are the members of one ``SharedGroup``, and the node keeps the
groups in a topic trie of their own (``SharedSubscriptions``, owned by the SessionTable). A
message that matches a group's filter goes to one member of that group, at the QoS that member
was granted [MQTT-4.8.2-3]; a session's ordinary subscriptions, and every other group, get
their own copies. Which member, the strategy says (``STRATEGIES``; on one node every member is
local, so ``local`` rotates like ``round_robin``): a member whose client is connected if there
is one, else one that queues it for its return (a persistent session).

What a member was given and has not acknowledged is not lost with it (``take_entries`` and
``SharedSubscriptions.redispatch``): when its session ends, or its client leaves while another
member is connected, what waited in its queue goes to another member, and a QoS 1 message in
flight too (it may have reached the client: a re-send, counted); a QoS 2 message in flight
stays with the member, whose client must get it when it returns [MQTT-4.8.2-4], and goes with
its session [MQTT-4.8.2-5].

In a mesh (mesh/routing/shares.py) the node says what it serves of each group
(``advertisement``), and tells the mesh of every QoS 1/2 message of another node a member
takes (``hold``) and of its end (``settle``: the member acknowledged it, or it moved on, or
went to nobody), so that the node acknowledges it to its origin only once the member has
(mesh/routing/custody.py).
"""

from __future__ import annotations

import zlib
from collections import deque
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from .message import Entry, Message
from .session import NO_ENTRIES, SENT_PUBREL
from .topics import SubscriptionTrie

if TYPE_CHECKING:
    from .session import Session

__all__ = [
    "SHARE_PREFIX",
    "QUEUED",
    "WEIGHT",
    "STRATEGIES",
    "ShareError",
    "split_share",
    "SharedGroup",
    "SharedSubscriptions",
    "take_entries",
    "settle_entries",
    "rejoin_entries",
    "resend_mark",
    "is_resend_mark",
    "root_of",
]

SHARE_PREFIX = "$share/"
# what a node advertises for a group whose members there are all offline (persistent sessions
# that queue for their clients): "$share/{g}/{f}" + QUEUED; a group with a connected member is
# advertised as itself (mesh/routing/shares.py prefers those). No topic filter has a NUL
# [MQTT-1.5.4-2], so no filter can be taken for it
QUEUED = "\0q"
# and for a group with more than one connected member there: "$share/{g}/{f}" + WEIGHT + the
# largest power of two not above their number (round_robin and the hashes weigh the nodes by
# it; a power of two, so that members come and go with few changes told to the mesh)
WEIGHT = "\0w"
# a re-send for one group only (a member left holding the message, or its node is gone: the
# message goes on as a new message of the node that sends it, mesh/routing/shares.py) says so
# as the first of its groups: SHARE_PREFIX + the id of the message it re-sends, "{origin} {seq}"
# (no "/": never a group), its *root*: a member that had the root does not get it again
# (``SharedSubscriptions.deliver``, Session ``had``)


def resend_mark(root: tuple[str, int]) -> str:
    """The first of a re-send's groups: for these groups only, a re-send of message ``root``."""
    return f"{SHARE_PREFIX}{root[0]} {root[1]}"


def is_resend_mark(group: str) -> bool:
    return group.startswith(SHARE_PREFIX) and "/" not in group[len(SHARE_PREFIX) :]


def root_of(msg: Message) -> tuple[str, int]:
    """The id of the message ``msg`` first was (a re-send's root; else its own id)."""
    root = _resent(msg)
    return (msg.origin, msg.seq) if root is None else root


def _resent(msg: Message) -> tuple[str, int] | None:
    """A re-send's root; None for a message that is none (the common case: one test)."""
    shares: tuple[str, ...] | None = getattr(msg, "shares", None)
    if not shares or not is_resend_mark(shares[0]):
        return None
    origin, _, seq = shares[0][len(SHARE_PREFIX) :].rpartition(" ")
    return (origin, int(seq)) if origin and seq.isdigit() else None


# how a group picks the member of each message (docs/operations.md, mqtt.shared_strategy)
STRATEGIES = ("local", "round_robin", "hash_topic", "hash_clientid", "sticky")


class ShareError(ValueError):
    """A ``$share/`` filter that is no shared subscription (SUBACK 0x80; MQTT 5: 0x8F)."""


def split_share(topic_filter: str) -> tuple[str, str] | None:
    """(share name, topic filter) of a shared subscription; None for an ordinary filter.
    ShareError for a ``$share/`` filter without a share name, with ``+`` or ``#`` in it, or
    without a filter after it [MQTT-4.8.2-1] [MQTT-4.8.2-2]."""
    if not topic_filter.startswith(SHARE_PREFIX):
        return None
    name, slash, inner = topic_filter[len(SHARE_PREFIX) :].partition("/")
    if not name:
        raise ShareError(f"{topic_filter!r}: no share name [MQTT-4.8.2-1]")
    if "+" in name or "#" in name:
        raise ShareError(f"{topic_filter!r}: a share name with a wildcard [MQTT-4.8.2-2]")
    if not slash or not inner:
        raise ShareError(f"{topic_filter!r}: no topic filter after the share name [MQTT-4.8.2-2]")
    return name, inner


Receives = Callable[["Session"], bool]  # whether a member may receive the message at hand (the ACL)


class SharedGroup:
    """The members of one share name's subscription to one filter on this node."""

    __slots__ = ("name", "topic_filter", "share", "strategy", "members", "owner", "advertised", "_turn", "_sticky")

    def __init__(self, name: str, topic_filter: str, strategy: str, owner: SharedSubscriptions | None = None):
        self.name = name
        self.topic_filter = topic_filter
        self.share = f"{SHARE_PREFIX}{name}/{topic_filter}"  # (as subscribed, and advertised in a mesh)
        self.strategy = strategy
        self.members: dict[Session, int] = {}  # session -> its granted QoS, in the order they joined
        self.owner = owner  # (whose ``settle`` hears of what its members settle)
        self.advertised: str | None = None  # what the mesh was told of it (SessionTable.advertise)
        self._turn = 0
        self._sticky: Session | None = None

    def __repr__(self) -> str:
        return f"SharedGroup({self.name!r}, {self.topic_filter!r}, {len(self.members)} members)"

    def choose(self, msg: Message, receives: Receives | None = None, but: Session | None = None) -> Session | None:
        """The member ``msg`` goes to (None: no member may take it): among the members whose
        client is connected, else among all (a persistent session queues it), those the ACL
        lets receive it, ``but`` one that is leaving."""
        members = [s for s in self.members if s is not but and (receives is None or receives(s))]
        if not members:
            return None
        online = [s for s in members if s.channel is not None]
        if online:
            ready = [s for s in online if not s.backlogged]  # (a slow one waits for its turn)
            members = ready or online
        elif msg.qos:
            # every member away: one whose session queues the message at its grant (a member
            # granted QoS 0 takes a QoS 1/2 message at QoS 0, which an absent client's session
            # drops: simulator, finding 32, a message acknowledged and lost); none: nobody here
            # keeps it (in a mesh it goes on to another node's member: finding 34)
            granted = self.members
            members = [s for s in members if granted[s] or s.limits.queue_qos0]
            if not members:
                return None
        strategy = self.strategy
        if strategy == "hash_topic" or strategy == "hash_clientid":
            key = msg.topic if strategy == "hash_topic" else (msg.publisher or msg.origin)
            members.sort(key=_client_id)  # (stable while the membership is)
            return members[zlib.crc32(key.encode()) % len(members)]
        if strategy == "sticky":
            kept = self._sticky
            if kept is not None and kept in members:
                return kept
        # round_robin, local (on one node the same), and a sticky group's next member
        chosen = members[self._turn % len(members)]
        self._turn += 1
        self._sticky = chosen
        return chosen

    def settled(self, msg: Message) -> None:
        """A member acknowledged ``msg`` it got through this group (PUBACK; QoS 2: PUBREC),
        or it expired, or was dropped, while waiting in its queue (Session)."""
        owner = self.owner
        if owner is not None and owner.settle is not None:
            owner.settle(msg, self.share)


def _not_refusing(key: tuple[str, int], qos: int, receives: Receives | None) -> Receives:
    """``receives``, passing over the members that would drop message ``key`` as settled."""
    if receives is None:
        return lambda s: not s.refuses(key, qos)
    return lambda s: not s.refuses(key, qos) and receives(s)


def _client_id(session: Session) -> str:
    return session.client_id


class SharedSubscriptions:
    """This node's shared groups, by (share name, filter), and the trie of their filters."""

    def __init__(self, strategy: str = "local"):
        if strategy not in STRATEGIES:
            raise ValueError(f"shared subscription strategy {strategy!r}: one of {', '.join(STRATEGIES)}")
        self.strategy = strategy
        self.groups: dict[tuple[str, str], SharedGroup] = {}
        self.trie = SubscriptionTrie()  # filter -> {group: 0}
        # whether a session may receive the message at hand (the Broker sets it from its ACL)
        self.receives: Callable[[Session, Message], bool] | None = None
        self.dropped = 0  # messages for a group none of whose members could take them
        self.redispatched = 0  # messages a leaving member had not been sent, given to another
        self.resent = 0  # QoS 1 messages a leaving member may have had, given to another (maybe twice)
        self.abandoned = 0  # QoS 2 messages in flight to a member whose session ended [MQTT-4.8.2-5]
        self.kept_once = 0  # re-sends (``resend_mark``) not delivered: a member had their root
        # messages handed on by a member that left, not given back to one that gave them away
        # before (its session settled their ids): to another member, or another node's
        self.passed_over = 0
        # QoS 2 messages a leaving member kept: the gate held them, a holder may serve them
        # (``Session.keeps``)
        self.kept_sent = 0
        # in a mesh, what a leaving member held when no other member here may take it:
        # (message, "$share/{g}/{f}", now) -> sent to another node's member (the Broker's)
        self.elsewhere: Callable[[Message, str, float], bool] | None = None
        # in a mesh: a member took a QoS 1/2 message (``hold``: the message, the group's
        # "$share/{g}/{f}", whether the member's session is clean), and settled it (``settle``:
        # acknowledged, or it went on to another node's member, or to nobody); another node's
        # message is acknowledged to its origin once the member's wait ended, and one of this
        # node that a clean member holds is kept in the store meanwhile (mesh/routing/custody.py)
        self.hold: Callable[[Message, str, bool], None] | None = None
        self.settle: Callable[[Message, str], None] | None = None
        # in a mesh: does another node in reach have a connected member of the group
        # ("$share/{g}/{f}")? Then a persistent member that goes offline hands its queue on
        self.online_elsewhere: Callable[[str], bool] | None = None

    def __len__(self) -> int:
        return len(self.groups)

    def join(self, session: Session, name: str, topic_filter: str, qos: int) -> bool:
        """``session`` subscribes to ``topic_filter`` under ``name`` (again: its QoS replaced);
        True when the group is new to this node (its first member here)."""
        key = (name, topic_filter)
        group = self.groups.get(key)
        new = group is None
        if group is None:
            group = self.groups[key] = SharedGroup(name, topic_filter, self.strategy, self)
            self.trie.add(topic_filter, group, 0)
        group.members[session] = qos
        return new

    def leave(self, session: Session, name: str, topic_filter: str) -> tuple[SharedGroup | None, bool]:
        """``session`` is no member any more: (its group, whether the group is gone from this
        node with it, its last member here)."""
        group = self.groups.get((name, topic_filter))
        if group is None or group.members.pop(session, None) is None:
            return None, False
        if group.members:
            return group, False
        del self.groups[(name, topic_filter)]
        self.trie.remove(topic_filter, group)
        return group, True

    def match(self, topic: str) -> dict[Any, int]:
        return self.trie.match(topic)

    def deliver(
        self, group: SharedGroup, msg: Message, but: Session | None = None, moved: bool = False
    ) -> Session | None:
        """``msg`` to one member of ``group`` at its granted QoS [MQTT-4.8.2-3]; the member,
        or None (none could take it: counted, unless ``moved``: from a member, redispatch)."""
        root = _resent(msg)
        back = None
        if root is None and moved:
            # handed on by a member that left, under its own id: a member that has it or took
            # it keeps it, as for a re-send; one that gave it away before is passed over, as its
            # session would drop it as settled (``refuses``) and nobody would have it: A -> B -> A
            # when A's client left, then B's (simulator, shared-persistent-publishers-7-harsh
            # seed 35: a QoS 2 message lost; the fault harness's nodes fenced off closing their
            # members one after the other did the same, 7 nodes, MQTT 5, seed 9). With no other
            # member here it goes to another node's, a re-send under a new id (``elsewhere``)
            root = back = (msg.origin, msg.seq)
        if root is not None:
            had = next((s for s in group.members if s is not but and s.had(root)), None)
            if had is not None:
                self.kept_once += 1  # (it has it, or had it: a second copy would be a duplicate)
                if moved and msg.qos:
                    self._settle(msg, group.share)
                return had
        receives = self.receives
        check = None if receives is None else (lambda s: receives(s, msg))
        if back is not None and any(s.refuses(back, msg.qos) for s in group.members if s is not but):
            check = _not_refusing(back, msg.qos, check)
            self.passed_over += 1
        member = group.choose(msg, check, but)
        if member is None:
            if not moved:
                self.dropped += 1
            return None
        granted = group.members[member]
        qos = msg.qos if msg.qos < granted else granted
        if not qos and member.channel is None and not member.limits.queue_qos0:
            self.dropped += 1  # (only members granted QoS 0, all away: it goes to nobody)
        if qos and not moved and self.hold is not None:
            # (before the delivery: a member that drops it at once settles it)
            self.hold(msg, group.share, member.clean)
        member.sharing = group  # (its entry remembers the group; an MQTT 5 No Local does not apply)
        try:
            member.deliver(msg, qos)
        finally:
            member.sharing = None
        if back is None and root is not None and qos:
            member.took_resend(root)
        if not qos and moved and msg.qos:
            self._settle(msg, group.share)  # (a member granted QoS 0 took it: nothing to wait for)
        return member

    def _settle(self, msg: Message, share: str) -> None:
        if self.settle is not None:
            self.settle(msg, share)

    def redispatch(self, session: Session, entries: Iterable[Entry], now: float | None) -> None:
        """What ``take_entries`` took from ``session``, each to another member of its group
        (a message that expired by ``now``, if given, to none [MQTT-3.3.2-5]): one of this
        node, else, in a mesh, one of another node (``elsewhere``), else none (counted)."""
        for entry in entries:
            tag = entry.group
            if tag is None:
                continue
            msg = entry.msg
            if msg.expires is not None and now is not None:
                msg = msg.at(now)
                if msg.ttl <= 0.0:
                    self._settle(msg, tag.share)
                    continue
            # (the group as it is now: a new one if the last member left and another came)
            group = self.groups.get((tag.name, tag.topic_filter))
            member = None
            if group is not None:
                member = self.deliver(group, msg, but=session, moved=True)
            if member is None:
                elsewhere = self.elsewhere
                if elsewhere is None or now is None or not elsewhere(msg, tag.share, now):
                    self.dropped += 1
                    self._settle(msg, tag.share)
                    continue
                # (a new message of this node: the one it came as waits for its acknowledgement)
            if entry.packet_id:
                self.resent += 1
            else:
                self.redispatched += 1

    def online_besides(self, session: Session, group: SharedGroup) -> bool:
        """Is a member other than ``session`` connected, here or (in a mesh) on another node?"""
        if any(s is not session and s.channel is not None for s in group.members):
            return True
        elsewhere = self.online_elsewhere
        return elsewhere is not None and elsewhere(group.share)

    def advertisement(self, group: SharedGroup) -> str | None:
        """What the mesh should know of ``group`` on this node: its share, with the weight of
        its connected members (WEIGHT), or QUEUED if none is connected and one queues QoS 1/2
        messages; None when it has no member that takes a message."""
        members = group.members
        if not members:
            return None
        online = sum(1 for s in members if s.channel is not None)
        if not online:
            # members that queue: one whose session keeps a QoS 1/2 message for its absent
            # client; members granted QoS 0 only keep nothing (an absent client's session drops
            # QoS 0), and a node that said QUEUED for them was chosen for messages it could
            # only drop (simulator, finding 34)
            if any(qos or s.limits.queue_qos0 for s, qos in members.items()):
                return group.share + QUEUED
            return None
        weight = 1 << (online.bit_length() - 1)
        return group.share if weight == 1 else f"{group.share}{WEIGHT}{weight}"


def take_entries(
    session: Session,
    only_if: Callable[[SharedGroup], bool] | None = None,
    inflight: bool = True,
    shared: SharedSubscriptions | None = None,
) -> list[Entry]:
    """The entries of ``session`` that reached it through a shared group and may go to
    another member, taken out of it (and its store): every queued one the session does not
    keep (``Session.keeps``), and QoS 1 ones in flight unless ``inflight`` is False; a QoS 2
    message in flight stays [MQTT-4.8.2-4].
    ``only_if``: of the groups it says yes to; ``shared`` counts what the session keeps."""
    taken: list[Entry] = []
    kept = []
    for entry in session.queue:
        group = entry.group
        if group is not None and (only_if is None or only_if(group)):
            if not session.keeps(entry):
                taken.append(entry)
                continue
            if shared is not None:
                shared.kept_sent += 1
        kept.append(entry)
    if taken:
        session.queue = deque(kept) if kept else NO_ENTRIES
    for pid, entry in list(session.inflight.items()) if inflight else ():
        group = entry.group
        if group is not None and entry.qos == 1 and (only_if is None or only_if(group)):
            del session.inflight[pid]
            taken.append(entry)
    if taken and session.stores:
        for entry in taken:
            session.given_away(entry)
    return taken


def settle_entries(session: Session, untag: bool = False) -> None:
    """``session`` ends with what it got through a group still in it (a QoS 2 message in
    flight [MQTT-4.8.2-5], or what it kept when it left the group), or (``untag``) it is no
    member here any more, its copy gone to its new home with them: nothing waits for them here
    any more (SharedSubscriptions ``settle``). One that its client took (QoS 2, PUBREC) was
    settled then."""
    for entry in [*session.inflight.values(), *session.queue]:
        group = entry.group
        if group is not None:
            if entry.state != SENT_PUBREL:
                group.settled(entry.msg)
            if untag:
                entry.group = None


def rejoin_entries(session: Session, shared: SharedSubscriptions) -> None:
    """``session``, restored from the store, is registered (its "$share/" subscriptions
    joined): each entry that names its group by its share (store.restore_sessions) gets this
    node's group of that share, if ``session`` is a member of it here, else none (a
    subscription gone, or in a mesh a session whose home is elsewhere: as regroup leaves it)."""
    for entry in [*session.inflight.values(), *session.queue]:
        share = entry.group
        if type(share) is str:
            try:
                key = split_share(share)
            except ShareError:
                key = None  # (a share of a form no longer taken: no group has it)
            group = shared.groups.get(key) if key is not None else None
            entry.group = group if group is not None and session in group.members else None
