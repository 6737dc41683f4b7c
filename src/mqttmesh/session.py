"""Session state of one ClientId: subscriptions, outbound QoS 1/2 window, offline queue.

Pure (section 4.1 of MQTT 3.1.1). It leaves to its caller the connection
(it writes frames through the attached Channel), the clock, and storage:
``Session`` lives in memory; ``DurableSession`` is the second implementation
that also records every change in a store journal, which the I/O layer commits.
``Sessions`` makes the right one (the Broker's SessionFactory).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Protocol

from .codec import PubRel, encode
from .message import Entry, in_origin_order
from .session_parts import (
    KEPT,
    NO_ENTRIES,
    NO_IDS,
    NO_LOCAL,
    NO_PACKETS,
    NO_SUBSCRIPTIONS,
    OPEN,
    RETAIN_AS_PUBLISHED,
    SENT_PUBLISH,
    SENT_PUBREL,
    SUB_ID_SHIFT,
    SUB_QOS,
    Attached,
    DeliverFn,
    Frame0Fn,
    FrameFn,
    Gate,
    Limits,
    OneSubscription,
)

if TYPE_CHECKING:
    from .flow import Congestion
    from .message import Message
    from .ports import Batch, SentHook

__all__ = [
    "Limits",
    "Entry",
    "Attached",
    "Gate",
    "OPEN",
    "SessionFactory",
    "Session",
    "SENT_PUBLISH",
    "SENT_PUBREL",
    "SUB_QOS",
    "NO_LOCAL",
    "RETAIN_AS_PUBLISHED",
    "SUB_ID_SHIFT",
    "KEPT",
    "NO_ENTRIES",
    "NO_IDS",
    "NO_PACKETS",
    "NO_SUBSCRIPTIONS",
    "FrameFn",
    "Frame0Fn",
    "DeliverFn",
]


class SessionFactory(Protocol):
    """Makes the Broker's sessions (session_durable.Sessions; mesh/replica.ReplicaSessions in a mesh)."""

    def new(self, client_id: str, clean: bool, durable: bool) -> Session:
        """A session for a CONNECT; ``durable=False`` keeps even CleanSession=0 in memory
        (peer links). A persistent one is recorded in the journal as it is made."""

    def restored(self, client_id: str) -> Session:
        """An empty persistent session for the store to fill (store.restore_sessions)."""

    def restore_replicated(
        self,
        restored: Mapping[str, Session],
        inbound: Iterable[tuple[Any, ...]],
        versions: Iterable[tuple[str, int, int]],
        tombstones: Iterable[tuple[str, int, str, int]],
        floors: Iterable[tuple[str, str, int]],
    ) -> None:
        """The rows of the sessions ``restored`` that only a session replicated in a mesh has
        (store.restore_sessions says what each is); nothing to do outside a mesh."""


class Session:
    # Slotted, with a ``__dict__`` made only when something sets what is no slot: a
    # counter of rare events (``dropped``, ``dropped_qos0``, ``expired``: class-level 0 until
    # the first), ``adapt``'s per-connection ``deliver`` and window, a shared group's
    # ``sharing``, and the subclasses' own fields. An idle session keeps no dict (issue 26).
    __slots__ = (
        "client_id",
        "clean",
        "limits",
        "subscriptions",
        "sub_changes",
        "inflight",
        "queue",
        "awaiting_rel",
        "channel",
        "username",
        "expiry",
        "expires_at",
        "congestion",
        "backlogged",
        "acked",
        "on_sent",
        "_next_pid",
        "__dict__",
    )
    durable = False
    # its _stored_* hooks do something (DurableSession journals, a replicated session keeps
    # ids): the per-message paths call them only then, not as no-ops
    stores = False
    # what a frame that follows one of its steps waits for (a replicated session is its own)
    gate: Gate = OPEN
    # the shared group (shared.py) of the delivery in progress, if any: its entry remembers it
    sharing: Any = None
    # counters of rare events, in the instance once one happens
    dropped = 0  # messages a full queue dropped
    dropped_qos0 = 0  # QoS 0 messages dropped: output over its limit
    expired = 0  # messages whose Message Expiry passed while they were queued
    _adapted = False  # ``adapt`` changed ``deliver`` or the window (in the instance then)

    def __init__(
        self,
        client_id: str,
        clean: bool,
        limits: Limits,
        congestion: Congestion | None = None,
        on_sent: SentHook | None = None,
    ):
        self.client_id = client_id
        self.clean = clean
        self.limits = limits
        # filter -> value (``NO_SUBSCRIPTIONS``, ``OneSubscription`` for one filter, then a
        # dict: ``subscribe``); read it as a mapping, change it with ``subscribe``/``unsubscribe``
        self.subscriptions: Mapping[str, int] = NO_SUBSCRIPTIONS
        self.sub_changes = 0  # subscribe and unsubscribe calls, ever (what remembers a match knows it is stale)
        self.inflight: dict[int, Entry] = NO_PACKETS  # packet id -> entry, in send order
        # (an idle client's session keeps no empty containers: ``NO_PACKETS``, ``NO_ENTRIES``
        # and ``NO_IDS`` until the first entry or id; ``in_flight``, ``queued`` and
        # ``_awaiting`` make them)
        self.queue: deque[Entry] = NO_ENTRIES
        self.awaiting_rel: set[int] = NO_IDS  # inbound QoS 2 ids between PUBREC and PUBREL
        self.channel: Attached | None = None  # the Channel the client is connected on
        self.username: str | None = None
        # MQTT 5 Session Expiry: its interval in seconds (KEPT: never; a 3.1.1 persistent
        # session's), and while no client is attached, when it ends on the node's clock
        # (SessionTable.close_session sets it, the table's expire_sessions ends it)
        self.expiry = KEPT
        self.expires_at: float | None = None
        self.congestion = congestion  # the broker's Congestion tracker (flow.py)
        self.backlogged = False  # online, with the queue over queue_high
        self.acked = 0  # acknowledgements received, ever (progress)
        # hook(session, msg, qos, dup) for every PUBLISH written: the archive's delivery log
        self.on_sent = on_sent
        self._next_pid = 1

    # -- delivery (the hot path) -------------------------------------------------

    def deliver(self, msg: Message, qos: int, retain: bool = False) -> None:
        """Add one message at ``qos`` (already min(publish, granted)) [MQTT-4.5.0-1]."""
        channel = self.channel
        if channel is not None:
            if qos == 0:
                if channel.blocked:
                    # its output is over limits.max_write_buffer: QoS 0 may be lost [MQTT-4.3.1]
                    self.dropped_qos0 += 1
                    return
                if msg.expires is None:
                    channel.write(channel.frame(msg, 0, None, False, True) if retain else channel.frame0(msg))
                else:
                    channel.write_expiring(msg, 0, None, False, retain)
                if self.on_sent is not None:
                    self.on_sent(self, msg, 0, False)
                return
            if not self.queue and len(self.inflight) < self.limits.max_inflight:
                self._send_new(self._new_entry(msg, qos, retain))
                return
            self._enqueue(self._new_entry(msg, qos, retain))
        elif qos or self.limits.queue_qos0:
            self._enqueue(self._new_entry(msg, qos, retain))  # [MQTT-3.1.2-5]

    def _new_entry(self, msg: Message, qos: int, retain: bool) -> Entry:
        return Entry(msg, qos, retain, 0, self.sharing)

    def queue_in_origin_order(self) -> None:
        """The queue in each origin's order (what reached it from copies of the session and
        from the mesh, mesh/cluster/holders.py); what is in flight keeps its packet ids and order."""
        items = list(self.queue)
        in_origin_order(items, lambda e: (e.msg.origin, e.msg.seq))
        self.queue = deque(items) if items else NO_ENTRIES

    def in_flight(self) -> dict[int, Entry]:
        """The window, to add to (made at the first entry: ``NO_PACKETS`` takes nothing)."""
        inflight = self.inflight
        if inflight is NO_PACKETS:
            inflight = self.inflight = {}
        return inflight

    def queued(self) -> deque[Entry]:
        """The queue, to add to (made at the first entry: ``NO_ENTRIES`` takes nothing)."""
        queue = self.queue
        if queue is NO_ENTRIES:
            queue = self.queue = deque()
        return queue

    def _awaiting(self) -> set[int]:
        """The inbound QoS 2 ids, to add to (made at the first: ``NO_IDS`` takes nothing)."""
        ids = self.awaiting_rel
        if ids is NO_IDS:
            ids = self.awaiting_rel = set()
        return ids

    def _enqueue(self, entry: Entry) -> None:
        queue = self.queue
        if queue is NO_ENTRIES:
            queue = self.queue = deque()
        if len(queue) >= self.limits.max_queued:
            self.dropped += 1
            if self.limits.drop_policy == "newest" or not queue:
                if entry.group is not None:
                    entry.group.settled(entry.msg)  # (a shared group's: to nobody, shared.py)
                return
            oldest = queue.popleft()
            self._stored_remove(oldest)
            if oldest.group is not None:
                oldest.group.settled(oldest.msg)
        queue.append(entry)
        if self.stores:
            self._stored_put(entry)
        if (
            not self.backlogged
            and self.channel is not None
            and self.congestion is not None
            and len(queue) >= self.limits.queue_high
        ):
            self.backlogged = True
            self.congestion.add(self, "queue")

    def _send_new(self, entry: Entry) -> None:
        pid = self._alloc_pid()
        entry.packet_id = pid
        entry.state = SENT_PUBLISH
        inflight = self.inflight
        if inflight is NO_PACKETS:  # (``in_flight``, inline: the hot path)
            inflight = self.inflight = {}
        inflight[pid] = entry
        if self.stores:
            self._stored_put(entry)
        channel = self.channel
        msg = entry.msg
        if msg.expires is None:
            channel.write(channel.frame(msg, entry.qos, pid, False, entry.retain))  # type: ignore[union-attr]  # (sent only while attached)
        else:
            channel.write_expiring(msg, entry.qos, pid, False, entry.retain)  # type: ignore[union-attr]
        if self.on_sent is not None:
            self.on_sent(self, entry.msg, entry.qos, False)

    def _alloc_pid(self) -> int:
        pid = self._next_pid
        inflight = self.inflight
        while pid in inflight:  # [MQTT-2.3.1-2]: a currently unused identifier
            pid = pid + 1 if pid < 65535 else 1
        self._next_pid = pid + 1 if pid < 65535 else 1
        return pid

    def _refill(self, now: float) -> None:
        queue = self.queue
        limit = self.limits.max_inflight
        channel = self.channel
        while queue and channel is not None and len(self.inflight) < limit:
            entry = queue.popleft()
            if entry.msg.expires is not None:
                msg = entry.msg.at(now)
                if msg.ttl <= 0.0:  # it expired while it waited: never sent [MQTT-3.3.2-5]
                    self.expired += 1
                    if self.stores:
                        self._stored_remove(entry)
                    if entry.group is not None:
                        entry.group.settled(msg)
                    continue
                entry.msg = msg  # (sent with what is left of its life [MQTT-3.3.2-6])
            if entry.qos == 0:
                if self.stores:
                    self._stored_remove(entry)
                if channel.blocked:
                    self.dropped_qos0 += 1
                    continue
                if entry.msg.expires is None:
                    channel.write(channel.frame(entry.msg, 0, None, False, entry.retain))
                else:
                    channel.write_expiring(entry.msg, 0, None, False, entry.retain)
                if self.on_sent is not None:
                    self.on_sent(self, entry.msg, 0, False)
            else:
                self._send_new(entry)
        if self.backlogged and len(queue) <= self.limits.queue_low:
            self.backlogged = False
            self.congestion.remove(self, "queue")  # type: ignore[union-attr]  # (the broker sets it before any delivery)

    # -- acknowledgements from the client ------------------------------------------

    def on_puback(self, pid: int, now: float) -> bool:
        entry = self.inflight.get(pid)
        if entry is None or entry.qos != 1:
            return False
        self._settled(pid, entry, now)
        return True

    def _settled(self, pid: int, entry: Entry, now: float) -> None:
        """The client acknowledged ``entry`` for good: free its id, move the queue on."""
        del self.inflight[pid]
        self.acked += 1
        if entry.group is not None and entry.state == SENT_PUBLISH:  # (QoS 2: at its PUBREC)
            entry.group.settled(entry.msg)  # a shared group's: the member has it (shared.py)
        if self.stores:
            self._stored_remove(entry)
        if self.queue:
            self._refill(now)

    def withdraw(self, pid: int | None, now: float) -> bool:
        """A PUBLISH that expired before its frame could leave (it waited behind the store or
        the session's holders: channel_held.Pending) is not sent: its id is freed and the
        message settled as gone, here and at the session's copies; False when it cannot be
        (the client may have it: acknowledged since, or re-sent)."""
        if pid is None:
            self.expired += 1  # (QoS 0: nothing to settle)
            return True
        entry = self.inflight.get(pid)
        if entry is None or entry.state != SENT_PUBLISH:
            return False
        self.expired += 1
        self._settled(pid, entry, now)
        return True

    def on_pubrec(self, pid: int) -> bool:
        entry = self.inflight.get(pid)
        if entry is None or entry.qos != 2:
            return False
        if entry.state == SENT_PUBLISH:
            entry.state = SENT_PUBREL  # [MQTT-4.3.3-1]: never re-send this PUBLISH
            self._stored_put(entry)
            if entry.group is not None:
                entry.group.settled(entry.msg)  # the member owns it now (shared.py)
        return True

    def on_pubcomp(self, pid: int, now: float) -> bool:
        entry = self.inflight.get(pid)
        if entry is None or entry.state != SENT_PUBREL:
            return False
        self._settled(pid, entry, now)
        return True

    # -- connection life -------------------------------------------------------------

    def attach(self, channel: Attached, now: float) -> None:
        """Bind to a new connection and re-send what was unacknowledged [MQTT-4.4.0-1]; what
        is in flight is re-sent even if it expired since, as its delivery began [MQTT-3.3.2-5]."""
        self.channel = channel
        if self.expires_at is not None:  # resumed before it expired: it no longer ends then
            self.expires_at = None
            if self.durable:
                self._stored_subscriptions()
        for entry in list(self.inflight.values()) if self.inflight else ():  # original order [MQTT-4.6.0-1]
            if entry.state == SENT_PUBREL:
                channel.write(encode(PubRel(entry.packet_id)))
            else:
                if entry.msg.expires is None:
                    channel.write(channel.frame(entry.msg, entry.qos, entry.packet_id, True, entry.retain))
                else:
                    channel.write_expiring(entry.msg.at(now), entry.qos, entry.packet_id, True, entry.retain)
                if self.on_sent is not None:
                    self.on_sent(self, entry.msg, entry.qos, True)
        self._refill(now)

    def adapt(self, max_inflight: int | None = None, deliver: DeliverFn | None = None) -> None:
        """What an MQTT 5 client's connection asks of the session while it is attached
        (channel5.py): a smaller window (its Receive Maximum [MQTT-3.3.4-9]), and ``deliver``
        in place of ``Session.deliver`` (No Local, Maximum Packet Size), which passes on to
        the class's own. ``adapt()`` undoes both; ``detach`` calls it."""
        own = self.__dict__
        configured = own.pop("_configured", None)
        if configured is not None:
            self.limits = configured
        own.pop("deliver", None)
        own.pop("_adapted", None)
        if max_inflight is not None and max_inflight < self.limits.max_inflight:
            own["_configured"] = self.limits
            self.limits = replace(self.limits, max_inflight=max_inflight)
        if deliver is not None:
            own["deliver"] = deliver  # (found before the class's method: broker.py calls it)
        if "deliver" in own or "_configured" in own:
            own["_adapted"] = True

    def detach(self) -> None:
        if self._adapted:  # (asks no ``__dict__``, which reading it would make)
            self.adapt()
        self.channel = None
        self.backlogged = False
        if self.congestion is not None:
            self.congestion.forget(self)  # offline: the queue limit and drop policy apply

    def subscribe(self, topic_filter: str, qos: int) -> None:
        subs = self.subscriptions
        if type(subs) is dict:
            subs[topic_filter] = qos
        elif not subs or topic_filter in subs:
            self.subscriptions = OneSubscription(topic_filter, qos)
        else:
            self.subscriptions = {**subs, topic_filter: qos}
        self.sub_changes += 1
        self._stored_subscriptions()

    def unsubscribe(self, topic_filter: str) -> bool:
        subs = self.subscriptions
        if topic_filter not in subs:
            return False
        if type(subs) is dict:
            del subs[topic_filter]
            if len(subs) == 1:  # (back to the one-filter form)
                self.subscriptions = OneSubscription(*next(iter(subs.items())))
        else:
            self.subscriptions = NO_SUBSCRIPTIONS
        self.sub_changes += 1
        self._stored_subscriptions()
        return True

    def unsubscribe_all(self) -> list[str]:
        """Forget every subscription (the session table has taken them out of the trie);
        the filters it had."""
        had = list(self.subscriptions)
        self.subscriptions = NO_SUBSCRIPTIONS
        return had

    @property
    def pending(self) -> int:
        return len(self.queue) + len(self.inflight)

    # -- replication: what a session replicated across a mesh does differently ------------
    # (mesh/cluster/replica.py implements these; a session of one node has nothing to replicate)

    @property
    def routes_when_agreed(self) -> bool:
        """A QoS 2 message of its client is routed only once the session's other holders have
        it with its id, and acknowledged after that (channel_publish.py); False here."""
        return False

    def awaiting_rel_agreed(self, packet_id: int, msg: Message) -> Batch:
        """A new QoS 2 PUBLISH whose message is routed under an id the session's copies agree
        on; here just ``awaiting_rel_add``."""
        return self.awaiting_rel_add(packet_id)

    def route_here(self, msg: Message) -> bool:
        """May this node route ``msg``, an inbound QoS 2 message of this session, now? False
        when it did already (a client that came back while it waited); always True here."""
        return True

    def routed_in(self, msg: Message, batch: int) -> None:
        """This node routed ``msg`` (``route_here``), kept by journal batch ``batch``."""

    def unrouted(self) -> list[Message]:
        """The inbound QoS 2 messages awaiting PUBREL that no node may have routed yet (this
        session's copy on a node that died): none here."""
        return []

    # -- inbound QoS 2: packet ids between PUBREC and PUBREL [MQTT-4.3.3-2] -------------

    def awaiting_rel_add(self, packet_id: int) -> Batch:
        """Remember ``packet_id`` until its PUBREL; the batch the PUBREC waits for (0: none)."""
        self._awaiting().add(packet_id)
        return 0

    def awaiting_rel_remove(self, packet_id: int) -> Batch:
        """PUBREL: forget ``packet_id``; the batch the PUBCOMP waits for (0: none)."""
        if packet_id in self.awaiting_rel:
            self.awaiting_rel.remove(packet_id)
        return 0

    def _stored_inbound(self, packet_id: int, msg: Message | None) -> None:
        """The message of inbound QoS 2 id ``packet_id`` changed (None: gone); a store keeps
        it (a session replicated in a mesh has them: mesh/cluster/replica.py)."""

    def restore_entry(self, entry: Entry) -> None:
        """An entry loaded from the store: in flight if it had been sent, else queued."""
        if entry.packet_id and entry.state:
            self.in_flight()[entry.packet_id] = entry
        else:
            self.queued().append(entry)

    def restore_done(self) -> None:
        """Every entry of the store is in (``restore_entry``): new packet ids follow the
        highest one in flight."""
        if self.inflight:
            self._next_pid = max(self.inflight) % 65535 + 1

    def discarded(self) -> None:
        """The broker dropped this session for good (clean start, or a clean session ended)."""

    # -- storage hooks: no-ops in memory, journaled by DurableSession ----------------

    def _stored_put(self, entry: Entry) -> None:
        pass

    def keeps(self, entry: Entry) -> bool:
        """Must queued ``entry`` stay with this member of its shared group, not go to another
        (shared.py ``take_entries``)? Only a replicated session says so (mesh/cluster/replica.py)."""
        return False

    def given_away(self, entry: Entry) -> None:
        """``entry`` left the session for another member of its shared group (shared.py
        ``take_entries``): as settled, but by no client of its own."""
        self._stored_remove(entry)

    def had(self, root: tuple[str, int]) -> bool:
        """Has this session (a member of a shared group) message ``root``, or had it and not
        given it away (shared.py ``resend_mark``)? Known of a session that keeps its ids (a
        replicated one, mesh/cluster/replica.py); a clean session is never asked twice."""
        return False

    def refuses(self, key: tuple[str, int], qos: int) -> bool:
        """Would this session drop message ``key`` at ``qos`` as one it settled (a replicated
        session remembers the ids it settled, given away included: mesh/cluster/replica.py)?
        A shared group does not hand such a message back to it (shared.py ``deliver``)."""
        return False

    def took_resend(self, root: tuple[str, int]) -> None:
        """It took a re-send of message ``root``: should ``root`` itself come (late, or
        through another holder), it is no new message (mesh/cluster/replica.py)."""

    def _stored_remove(self, entry: Entry) -> None:
        pass

    def _stored_subscriptions(self) -> None:
        pass
