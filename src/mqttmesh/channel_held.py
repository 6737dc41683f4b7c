"""The frames a Channel writes, in order: at once, or held while one waits for the store.

Pure: frames in, bytes out (``data_to_send``); it leaves the socket to the owner
(ports.Owner, woken when there are bytes to send) and the commits to the store. An
acknowledgement may depend on a journal batch being committed (a durable session's packet
id, a subscription: the group commit) and on the session's gate (session.Gate: for a session
replicated in a mesh, its other holders having the step, mesh/cluster/replica.py). Such a
frame is held, and so is every frame written after it: the client sees them in the order
they were written. ``Broker.committed`` and the gate's owner (mesh/cluster/confirm.py) call
``release_acks``.
``HeldFrames`` holds these steps for ``channel.Channel``, which inherits them and keeps
the state (``_out``, ``_held``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from .broker import Broker
    from .message import Message
    from .ports import Batch, Owner
    from .session import FrameFn, Session

__all__ = [
    "HeldFrames",
    "ProtocolViolation",
    "ack_frame",
    "PUBACK_FIRST",
    "PUBREC_FIRST",
    "PUBREL_FIRST",
    "PUBCOMP_FIRST",
    "NOTHING_HELD",
    "NO_FRAMES",
    "held_in_order",
    "Routing",
    "NO_ROUTING",
]

# the first byte of the four acknowledgements a Channel writes (built without a packet object)
PUBACK_FIRST, PUBREC_FIRST, PUBREL_FIRST, PUBCOMP_FIRST = 0x40, 0x50, 0x62, 0x70


# the owner is woken at the first frame waiting, and again every SPILL_FRAMES frames: one
# read can bring thousands of messages for one client, and an owner that writes them then,
# not at the end of the loop iteration, sees a client that cannot keep up (its socket
# buffer fills) while the publishers are still being read (flow.py)
SPILL_FRAMES = 1024
SPILL_MASK = SPILL_FRAMES - 1

# a Channel's ``_held`` until it holds something (``_hold`` makes the deque): an idle client's
# channel keeps no empty deque (about 600 bytes); an empty tuple, which has no ``append``
NOTHING_HELD: deque[tuple[int, int, Any]] = cast("deque[tuple[int, int, Any]]", ())
# a Channel's ``_out`` while no frame waits to be sent (the first frame makes the list, and
# ``data_to_send`` puts this back): an idle client's channel keeps no empty list
NO_FRAMES: list[bytes] = cast("list[bytes]", ())


def ack_frame(first: int, pid: int) -> bytes:
    return bytes((first, 2, pid >> 8, pid & 0xFF))


def held_in_order(held: Iterable[tuple[int, int, Any]]) -> Iterator[tuple[int, int, Any]]:
    """``held``'s entries with the batch each really waits for: the highest up to it (the head
    raised for a routed message holds all behind it, ``HeldFrames.release_acks``)."""
    top = 0
    for b, v, f in held:
        top = b if b > top else top
        yield top, v, f


class ProtocolViolation(Exception):
    """A packet the standard does not allow here: the connection is closed, naming ``rule``."""

    def __init__(self, rule: str, message: str):
        super().__init__(f"[{rule}] {message}")
        self.rule = rule


class Pending:
    """A PUBLISH of an expiring message held behind what waits (a journal batch, the gate of
    a replicated session): framed when it leaves, with what is left of its life then
    [MQTT-3.3.2-6]; if nothing is, and the client never saw it (not a re-send), it does not
    leave: the session takes it back (``Session.withdraw``) [MQTT-3.3.2-5]."""

    __slots__ = ("msg", "qos", "packet_id", "dup", "retain")

    def __init__(self, msg: Message, qos: int, packet_id: int | None, dup: bool, retain: bool):
        self.msg, self.qos, self.packet_id, self.dup, self.retain = msg, qos, packet_id, dup, retain


class Routing:
    """A message of this client held to be routed (``HeldFrames._defer``): routed as soon as
    the session's gate passed its ticket and every message deferred before it was routed,
    whatever the frames ahead of it wait for; the frames behind it wait for the journal
    batch its routing wrote (``batch``; -1 until routed)."""

    __slots__ = ("msg", "ticket", "batch")

    def __init__(self, msg: Message, ticket: int):
        self.msg, self.ticket, self.batch = msg, ticket, -1


# a Channel's ``_deferred`` while no message waits to be routed (``_defer`` makes the deque)
NO_ROUTING: deque[Routing] = cast("deque[Routing]", ())


class HeldFrames:
    """The output queue of a Channel (a mixin: the Channel keeps the state)."""

    __slots__ = ()

    if TYPE_CHECKING:  # what the queue uses of the Channel
        broker: Broker
        owner: Owner[Any]  # (Owner[Channel]: the Channel mixes this in)
        session: Session | None
        _out: list[bytes]
        # frames waiting for a journal batch and a ticket of the session's gate, in order,
        # and the places of messages routed after a step (a persistent publisher's QoS 2,
        # channel_publish.py ``_route_after``) among them
        _held: deque[tuple[int, int, bytes | Routing | Pending]]
        _deferred: deque[Routing]  # those of them not routed yet, in order
        frame: FrameFn

        def _route(self, msg: Message) -> Batch: ...

    def write(self, frame: bytes) -> None:
        if self._held:
            # an acknowledgement ahead of this frame waits for the store: keep the order
            last = self._held[-1]
            self._held.append((last[0], last[1], frame))
            return
        out = self._out
        if out is NO_FRAMES:  # the first frame
            self._out = [frame]  # type: ignore[misc]  # (a slot of the Channel)
            self.owner.wake(self)
            return
        out.append(frame)
        if len(out) & SPILL_MASK == 1:  # every SPILL_FRAMES more
            self.owner.wake(self)

    def _write_now(self, frame: bytes) -> None:
        out = self._out
        if out is NO_FRAMES:  # the first frame
            self._out = [frame]  # type: ignore[misc]  # (a slot of the Channel)
            self.owner.wake(self)
            return
        out.append(frame)
        if len(out) & SPILL_MASK == 1:  # every SPILL_FRAMES more
            self.owner.wake(self)

    def data_to_send(self) -> bytes:
        out = self._out
        if not out:
            return b""
        self._out = NO_FRAMES  # type: ignore[misc]  # (a slot of the Channel)
        return out[0] if len(out) == 1 else b"".join(out)

    def waits_for_gate(self, passed: int) -> bool:
        """Does a frame (or a message to route) wait for a ticket past ``passed``?"""
        held = self._held
        return bool(held) and held[-1][1] > passed  # (tickets only grow along the queue)

    @property
    def pending_frames(self) -> int:
        return len(self._out)

    def _send_after(self, frame: bytes, batch: Batch, ticket: int = 0) -> None:
        """Write ``frame`` once journal ``batch`` is committed and the session's gate passed
        ``ticket`` (session.Gate; both 0: at once)."""
        if not self._held and not batch and (not ticket or ticket <= self.session.gate.passed()):
            self._write_now(frame)
            return
        self._hold(frame, batch, ticket)

    def _hold(self, item: bytes | Routing | Pending, batch: Batch, ticket: int) -> None:
        """Queue ``item`` (a frame, or a message to route) behind what is held already: it
        waits for journal ``batch``, the gate's ``ticket`` and everything before it."""
        held = self._held
        if held:
            last = held[-1]  # keep acknowledgements in order
            batch, ticket = max(batch, last[0]), max(ticket, last[1])
        elif held is NOTHING_HELD:
            held = self._held = deque()  # type: ignore[misc]  # (a slot of the Channel)
        if ticket:
            gate = self.session.gate  # (attached: it has one)
            if ticket > gate.passed():
                gate.wait(ticket)  # (what it waits for goes now, not within mesh.batch_delay)
        held.append((batch, ticket, item))
        self.broker.held_ack_channels[self] = None

    def write_gated(self, frame: bytes, ticket: int) -> None:
        """A frame for the client once the session's gate passed ``ticket``."""
        self._send_after(frame, 0, ticket)

    def write_expiring(
        self, msg: Message, qos: int, packet_id: int | None, dup: bool, retain: bool, ticket: int = 0
    ) -> None:
        """The PUBLISH of a message with a Message Expiry Interval: at once, or, if it must
        wait (behind held frames, for the gate's ``ticket``), framed when it leaves (Pending)."""
        if not self._held and (not ticket or ticket <= self.session.gate.passed()):  # (attached: it has one)
            self._write_now(self.frame(msg, qos, packet_id, dup, retain))
            return
        self._hold(Pending(msg, qos, packet_id, dup, retain), 0, ticket)

    def _defer(self, msg: Message, ticket: int) -> None:
        """Route ``msg`` once the gate passed ``ticket`` (and whatever is held before it) and
        every message deferred before it was routed; what is held behind it waits for it."""
        held = self._held
        if held and held[-1][1] > ticket:
            ticket = held[-1][1]  # (no earlier than what is held before it, as _hold keeps it)
        routing = Routing(msg, ticket)
        self._hold(routing, 0, ticket)
        deferred = self._deferred
        if deferred is NO_ROUTING:
            deferred = self._deferred = deque()  # type: ignore[misc]  # (a slot of the Channel)
        deferred.append(routing)

    def _drop_deferred(self) -> None:
        """Take the messages not routed yet out of the queue (a closed connection's: its
        session keeps them, and the node the client comes back to routes them)."""
        kept = (e for e in held_in_order(self._held) if type(e[2]) is not Routing or e[2].batch >= 0)
        self._held = deque(kept)  # type: ignore[misc]  # (a slot of the Channel)
        self._deferred = NO_ROUTING  # type: ignore[misc]  # (as is this)

    def release_acks(self, committed: int, now: float) -> None:
        """Route the deferred messages whose ticket the gate passed, in order; write what
        waited for journal batch ``committed`` and the gate, in order, up to the first that
        still waits. An entry's batch counts with every batch before it in the queue
        (``held_in_order``): a routed message raises only the head's when it leaves it."""
        held = self._held
        session = self.session
        passed = session.gate.passed() if session is not None else 0
        deferred = self._deferred
        while deferred and deferred[0].ticket <= passed:
            # routed now, not when it reaches the head: a message waiting for the commit of
            # the one before it made a persistent publisher's QoS 2 messages one commit each
            routing = deferred.popleft()
            routing.batch = self._route(routing.msg.at(now))  # (as it stands now)
        while held and held[0][1] <= passed:
            b, v, item = held[0]
            if type(item) is Routing:
                if item.batch < 0:
                    break  # (not routed yet: its ticket)
                held.popleft()
                # what was held behind the message (its acknowledgement) waits for its batch:
                # the head raised stands for all of it, as nothing leaves before the head
                top = b if b > item.batch else item.batch
                if top > committed and held and held[0][0] < top:
                    held[0] = (top, *held[0][1:])
                continue
            if b > committed:
                break
            held.popleft()
            if type(item) is bytes:
                self._write_now(item)
                continue
            msg = item.msg.at(now)  # (a Pending)
            if msg.ttl <= 0.0 and not item.dup and session is not None and session.withdraw(item.packet_id, now):
                continue  # it expired before it could leave: never sent [MQTT-3.3.2-5]
            self._write_now(self.frame(msg, item.qos, item.packet_id, item.dup, item.retain))
        if held:
            self.broker.held_ack_channels[self] = None
