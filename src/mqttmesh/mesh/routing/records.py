"""The records the routing engine's parts keep: advertisements, custody, held messages, routes.

Pure values, in a module of their own below ``engine_base.EngineState`` (which declares the
engine's state in their terms) and the parts that fill them (lsdb.py, custody.py, order.py,
routes.py), so that nothing imports back up.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

from ...message import Message

__all__ = [
    "Lsa",
    "RouterLsa",
    "InterestState",
    "Control",
    "CustodyJournal",
    "Custody",
    "Held",
    "Hold",
    "HopGroup",
    "Route",
]

# -- the advertisement database (lsdb.py)

Lsa = dict[str, Any]  # an advertisement as it travels (JSON)


@dataclass
class RouterLsa:
    node: str
    inc: int
    seq: int
    addresses: list[str]
    links: dict[str, int]
    received: float = 0.0

    def to_json(self) -> Lsa:
        return {
            "t": "router",
            "node": self.node,
            "inc": self.inc,
            "seq": self.seq,
            "addr": self.addresses,
            "links": self.links,
        }


@dataclass
class InterestState:
    node: str
    inc: int
    ver: int
    # a tuple of interned strings, in no particular order: every node holds every other
    # node's filters, and a tuple of shared strings costs a tenth of a set of copies; sorting
    # is left to the rare readers (docs/simulation.md, memory)
    filters: tuple[str, ...] = ()

    def full_json(self) -> Lsa:
        return {"t": "interest", "node": self.node, "inc": self.inc, "ver": self.ver, "full": sorted(self.filters)}


class Control(NamedTuple):
    """A link-local control message waiting for the next flush (dbsum, lsreq, cost)."""

    peer: str
    kind: str
    body: Any  # JSON


# -- custody (custody.py)


class CustodyJournal(Protocol):
    """Where custody is made durable (store.Journal), so a restart keeps it."""

    def custody_put(self, msg: Message, dests: list[str]) -> None: ...

    def custody_remove(self, seq: int) -> None: ...

    def rerouted_put(self, msg: Message, dests: list[str]) -> None: ...

    def rerouted_remove(self, origin: str, seq: int) -> None: ...


class Custody:
    """One message in custody: the destinations that have not acknowledged it yet, and its
    predecessor at each (order.py): one number for a message to one node, a dict for several,
    None when it was sent unordered."""

    __slots__ = ("msg", "dests", "attempt", "due", "since", "prev", "shares")

    def __init__(
        self,
        msg: Message,
        dests: set[str],
        due: float,
        since: float,
        prev: int | dict[str, int] | None = None,
        shares: dict[str, tuple[str, ...]] | None = None,
    ):
        self.msg, self.dests, self.attempt, self.due, self.since, self.prev = msg, dests, 0, due, since, prev
        # the shared groups each destination serves it for (envelope.py Shares), or None
        self.shares = shares

    def predecessors(self) -> dict[str, int] | None:
        prev = self.prev
        if isinstance(prev, int):
            return {next(iter(self.dests)): prev} if prev and self.dests else None
        return prev


# -- ordered delivery (order.py)


class Held:
    """A message waiting for its predecessor: since when, and when the origin was last asked."""

    __slots__ = ("msg", "attempt", "since", "asked")

    def __init__(self, msg: Message, attempt: int, since: float):
        self.msg, self.attempt, self.since, self.asked = msg, attempt, since, since


class Hold:
    """Another node's QoS 1/2 message that members of this node's shared groups took: its
    acknowledgement to the origin waits until ``count`` reaches 0 (custody.py ``hold``):
    one for the node's own delivery (``delivered``), one for each member's (``settle``)."""

    __slots__ = ("msg", "count", "since")

    def __init__(self, msg: Message, since: float):
        self.msg, self.count, self.since = msg, 1, since


# -- routes (routes.py)

# What route_local reads for every message, so plain tuples: CPython 3.11 unpacks an exact
# tuple in a specialised instruction and a NamedTuple in the generic one, about 40 ns more for
# each of the two unpackings per routed message (7 % of route_local + flush in a micro-benchmark).
#   HopGroup: (next hop, the destinations reached through it, "\0".join(those destinations):
#             the batch encoder's string for the list, made once per route)
#   Route:    (hop groups, every node that wants the topic (sorted), how many have no next hop)
HopGroup = tuple[str, list[str], str]
Route = tuple[list[HopGroup], list[str], int]
