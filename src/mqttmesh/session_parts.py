"""What a session is made of and what it works with: its limits, the connection it is
attached to (``Attached``), the gate its frames pass (``Gate``), the values of its
subscriptions, and the empty containers that keep an idle session small.

Pure; session.py's ``Session`` is built of these (and re-exports them).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Protocol, cast

from .message import Entry

if TYPE_CHECKING:
    from .message import Message

__all__ = [
    "Limits",
    "Attached",
    "Gate",
    "OPEN",
    "OneSubscription",
    "FrameFn",
    "Frame0Fn",
    "DeliverFn",
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
]

SENT_PUBLISH, SENT_PUBREL = 1, 2
# a Session Expiry Interval that never ends the session (MQTT 5's 0xFFFFFFFF, 3.1.2.11.2;
# every 3.1.1 CleanSession=0 session)
KEPT = 0xFFFFFFFF

# an empty queue and an empty set of ids that take no memory of their own: most sessions
# never queue a message nor get a QoS 2 PUBLISH (an idle client's costs the broker what its
# containers do: a deque is about 600 bytes, a set 200). Read like the empty ones; whoever
# adds makes the real one first (``Session.queued``, ``Session._awaiting``): the empty
# tuple and frozenset have no ``append`` or ``add``, so a place that forgot fails loudly.
NO_ENTRIES: deque[Entry] = cast("deque[Entry]", ())
NO_IDS: set[int] = cast("set[int]", frozenset())
# the same for the outbound QoS 1/2 window (``Session.in_flight`` makes the dict): a read-only
# empty mapping, which cannot be added to
NO_PACKETS: dict[int, Entry] = cast("dict[int, Entry]", MappingProxyType({}))

FrameFn = Callable[["Message", int, "int | None", bool, bool], bytes]
Frame0Fn = Callable[["Message"], bytes]
DeliverFn = Callable[["Message", int, bool], None]

# A subscription's value in ``Session.subscriptions``: its granted QoS (bits 0-1) and, from an
# MQTT 5 client, its options: No Local (bit 2), Retain As Published (bit 3), Retain Handling
# (bits 4-5), its Subscription Identifier (bits 8 and up). A 3.1.1 subscription's value is its
# QoS. The trie holds the QoS only; the store and the session's copies carry the whole value.
SUB_QOS = 0x03
NO_LOCAL = 0x04
RETAIN_AS_PUBLISHED = 0x08
SUB_ID_SHIFT = 8


@dataclass
class Limits:
    """Per-session limits; every one is a setting (see config.py)."""

    max_inflight: int = 100  # outbound QoS 1/2 messages awaiting acknowledgement
    max_queued: int = 10_000  # messages queued behind the window or while offline
    queue_qos0: bool = False  # queue QoS 0 messages for offline persistent sessions
    drop_policy: str = "oldest"  # which message a full queue drops: "oldest" or "newest"
    max_awaiting_rel: int = 1_000  # inbound QoS 2 packet ids awaiting PUBREL

    @property
    def queue_high(self) -> int:
        """An online session with this many queued messages slows its publishers down."""
        return max(1, self.max_queued // 2)

    @property
    def queue_low(self) -> int:
        return self.max_queued // 4


class Attached(Protocol):
    """The connection a session's client is on, as the session and its owners use it
    (channel.Channel, which imports this module)."""

    @property
    def peer(self) -> str:
        """The client's address (the log line of a takeover)."""

    blocked: bool  # the socket takes no more for now: queue instead of writing

    def write(self, frame: bytes) -> None: ...

    def write_expiring(
        self, msg: Message, qos: int, packet_id: int | None, dup: bool, retain: bool, ticket: int = 0
    ) -> None:
        """The PUBLISH of a message that expires: framed when it leaves, which may be later
        than now (behind frames that wait), with what is left of its life then."""

    # the PUBLISH frame of a message for this client, in its protocol's form: (msg, qos,
    # packet id, dup, retain) -> bytes, and the QoS 0 one of live delivery: (msg) -> bytes.
    # For a 3.1.1 client they are message.Message.frame and .frame_qos0 themselves
    @property
    def frame(self) -> FrameFn: ...

    @property
    def frame0(self) -> Frame0Fn: ...

    def write_gated(self, frame: bytes, ticket: int) -> None:
        """A frame once the session's gate passes ``ticket`` (``Gate``)."""

    def release_acks(self, committed: int, now: float) -> None:
        """Send what waited for journal batch ``committed`` and for the session's gate."""

    def waits_for_gate(self, passed: int) -> bool:
        """Does something wait for a ticket of the session's gate past ``passed``?"""

    def kick(self, reason: str, now: float) -> None:
        """Another connection took the ClientId over [MQTT-3.1.4-2]: the connection ends at
        ``now``."""

    def close(self, reason: str) -> None: ...


class Gate(Protocol):
    """Whether a frame that follows a step of a session (a settlement: PUBREC, PUBREL, PUBCOMP
    after the id changed state) may go out now. A session of one node has nothing to wait
    for (``OPEN``); a session whose copies live on several nodes lets such a frame go once
    its other copies have the step (mesh/cluster/replica.py). The Channel asks the gate of
    its session and holds the frame until then (channel_held.py)."""

    def ticket(self) -> int:
        """What a frame that follows the session's latest step waits for (0: nothing)."""

    def passed(self) -> int:
        """Frames holding tickets up to this one may go."""

    def wait(self, ticket: int) -> None:
        """A frame waits for ``ticket`` (more than ``passed``): what it waits for is hurried."""


class _Open:
    """The gate of a session of one node: every frame goes at once."""

    __slots__ = ()

    def ticket(self) -> int:
        return 0

    def passed(self) -> int:
        return 0

    def wait(self, ticket: int) -> None:
        pass


OPEN: Gate = _Open()


class OneSubscription(Mapping[str, int]):
    """``Session.subscriptions`` while it holds one filter (most sessions: a device's own
    topic): read as a mapping, 48 bytes where a one-entry dict takes 184. ``Session.subscribe``
    makes a dict at the second filter; it cannot be added to."""

    __slots__ = ("filter", "value")

    def __init__(self, topic_filter: str, value: int):
        self.filter = topic_filter
        self.value = value

    def __getitem__(self, key: str) -> int:
        if key == self.filter:
            return self.value
        raise KeyError(key)

    def get(self, key: str, default: Any = None) -> Any:
        return self.value if key == self.filter else default

    def __contains__(self, key: object) -> bool:
        return key == self.filter

    def __iter__(self) -> Iterator[str]:
        yield self.filter

    def __len__(self) -> int:
        return 1

    def __repr__(self) -> str:
        return repr({self.filter: self.value})


# ``Session.subscriptions`` with no filter: a read-only empty mapping (``subscribe`` makes the
# one-filter form, then a dict)
NO_SUBSCRIPTIONS: dict[str, int] = cast("dict[str, int]", MappingProxyType({}))
