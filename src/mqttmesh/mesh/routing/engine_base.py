"""The routing engine's settings and typed state, shared by the parts it is made of.

Pure. ``MeshEngine`` (engine.py) is one object built from four mixins over
``EngineState``: the advertisement database (lsdb.py), routes (routes.py), the
data plane (dataplane.py) and custody (custody.py). They share about fifteen
attributes, and the data plane reads them once per message, so they stay
attributes of one object rather than of four objects one hop apart. This class
declares every one of them with its type; ``MeshEngine.__init__`` sets them.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from ...message import Message
    from ...topics import SubscriptionTrie
    from .dedup import DeliveryFilter, ForwardFilter
    from .envelope import Envelope, Shares
    from .interest import InterestIndex
    from .records import Control, Custody, CustodyJournal, Held, Hold, InterestState, Route, RouterLsa
    from .wire import AckGroup

__all__ = ["MeshSettings", "PeerStats", "JsonCodec", "EngineState"]


@dataclass
class MeshSettings:
    hop_limit: int = 255  # a safety net: the duplicate filter is what stops loops
    refresh_interval: float = 30.0  # re-originate our router advertisement this often
    max_age: float = 3600.0  # forget an unreachable node's advertisements after this
    min_cost: int = 1000  # link cost floor, microseconds of round-trip time
    cost_change: float = 0.25  # re-advertise a link when its cost moves by this fraction
    dedup_window: int = 262144  # recent message ids remembered per origin
    custody_limit: int = 100_000  # QoS 1/2 messages held at their origin until acknowledged
    custody_timeout: float = 3600.0  # give up on a destination after this long
    retransmit_after: float = 2.0  # first end-to-end retransmission; doubles up to 30 s
    max_batch_bytes: int = 16 * 1024
    # a QoS 1/2 message whose predecessor from its origin has not arrived waits for it at
    # most this long (order.py); the origin is asked for the predecessor at once
    reorder_wait: float = 10.0
    reorder_limit: int = 50_000  # messages waiting for a predecessor, per node
    # how the node that serves a shared group's message is chosen where it enters the mesh
    # (shares.py; shared.STRATEGIES)
    shared_strategy: str = "local"
    # a node chosen for a shared group's QoS 1/2 message and out of reach this long (with its
    # members, most likely): the group's member is chosen again on another node (custody.py)
    shared_reroute: float = 5.0


class PeerStats:
    __slots__ = (
        "envelopes_out",
        "envelopes_in",
        "batches_out",
        "batches_in",
        "control_out",
        "control_in",
        "control_bytes_out",
    )
    # (annotations only: __init__ sets every slot to 0)
    envelopes_out: int
    envelopes_in: int
    batches_out: int
    batches_in: int
    control_out: int
    control_in: int
    control_bytes_out: int

    def __init__(self) -> None:
        for name in self.__slots__:
            setattr(self, name, 0)

    def as_dict(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in self.__slots__}


class JsonCodec(Protocol):
    """How advertisements and link control are read and written: the ``json`` module, or the
    simulator's decoding shared by the engines of one process (sim/model.py SharedDecoding)."""

    def loads(self, s: bytes, /) -> Any: ...

    def dumps(self, obj: Any, /) -> str: ...


class EngineState:
    # identity and ports (engine.py)
    node_id: str
    incarnation: int
    addresses: list[str]
    settings: MeshSettings
    codec: JsonCodec
    custody_journal: CustodyJournal | None  # where custody is made durable, or None (in memory)
    spf_timer: Callable[[], float] | None  # a clock to time SPF runs with (the simulator), or None
    spf_seconds: float
    wall_offset: float  # wall-clock seconds minus `now` (an envelope batch says when it was made)
    changes: int  # bumps whenever the map or interest changes (status refresh, membership)
    peer_stats: dict[str, PeerStats]
    counters: dict[str, int]
    # the advertisement database (lsdb.py)
    _seq: int  # our router advertisement's sequence
    _links: dict[str, int]  # live neighbours -> advertised cost
    _measured: dict[str, float]  # neighbour -> smoothed rtt (us)
    _local_filters: set[str]
    _interest_ver: int
    _pending_add: set[str]
    _pending_del: set[str]
    routers: dict[str, RouterLsa]  # what we know of everybody, ourselves included
    # we hold the whole database of a neighbour (every advertisement its summary named came):
    # until then a message published here would miss the subscribers we have not heard of
    synced: bool
    _wanted: dict[str, set[tuple[str, str]]]  # neighbour -> advertisements asked of it, not yet come
    interests: dict[str, InterestState]
    remote: InterestIndex  # filter -> nodes (every node's, ours included)
    _flood_out: dict[str, list[dict[str, Any]]]  # neighbour -> advertisements to send
    _control_out: list[Control]  # other link-local control messages
    _last_refresh: float
    _next_refresh: float
    # routes (routes.py)
    next_hop: dict[str, str]
    distance: dict[str, int]
    parent: dict[str, str]
    _spf_dirty: bool
    _route_cache: dict[str, Route]  # topic -> where its messages go
    # the data plane (dataplane.py)
    _outbox: dict[str, list[Envelope]]  # next hop -> envelopes to batch
    _unicast_out: dict[str, list[bytes]]  # next hop -> encoded unicast records
    forward_filter: ForwardFilter
    delivery_filter: DeliveryFilter
    # custody and end-to-end acknowledgements (custody.py)
    # our QoS 1/2 messages by seq (another origin's that we route again: by (origin, seq)),
    # until every destination acked
    custody: dict[int | tuple[str, int], Custody]
    _acks_out: dict[str, list[int]]  # origin -> seqs delivered here
    _acks_for: dict[tuple[str, str], list[int]]  # (node routing for the origin, origin) -> seqs
    _acks_relay: dict[str, list[AckGroup]]  # next hop -> acknowledgements to pass on
    _acked_hi: dict[str, int]  # destination -> the highest seq of ours it acknowledged
    _heard: dict[str, float]  # destination -> when it last acknowledged one of ours
    _links_changed_at: float  # when a link last came up or went down (custody resends all due)
    # ordered delivery (order.py)
    _last_to: dict[str, int]  # destination -> seq of our last QoS 1/2 message routed to it
    _held: dict[str, dict[int, Held]]  # origin -> predecessor waited for -> the message waiting
    _held_ids: set[tuple[str, int]]  # (origin, seq) of every held message
    _order_out: dict[tuple[str, str], list[int]]  # (nack or skip, node) -> our seqs for it
    _order_relay: dict[tuple[str, str], list[AckGroup]]  # (nack or skip, next hop) -> groups
    # shared groups (shares.py): "$share/{g}/{f}" -> the nodes with members; f -> the groups;
    # round-robin turns and the last node chosen, per group
    _share_nodes: dict[str, dict[str, int]]  # (node -> its weight: connected members; 0: they queue)
    _shares_in: bool
    _share_trie: SubscriptionTrie
    _share_turn: dict[str, int]
    _share_last: dict[str, str]
    # (origin, seq) -> another node's message members of this node's groups took and have not
    # acknowledged: its end-to-end acknowledgement waits for them (custody.py), oldest first
    _holds: dict[tuple[str, int], Hold]
    # our seq -> a held message that went on as it (custody.py ``hold_until_acked``)
    _after: dict[int, Message]
    # (our seq, group) -> the seq of the copy the store keeps for that group while a clean
    # member of it here has our message and has not acknowledged it (custody.py ``hold_own``)
    _own_holds: dict[tuple[int, str], int]
    # (message, group, since): QoS 1/2 messages of ours for a group whose nodes are all out of
    # reach, sent once one is (shares.py ``_park``)
    _parked: deque[tuple[Message, str, float]]
    # messages of ours re-routed to this node's own members of a group, for its broker
    # (dataplane.py ``route_to_group``, ``served_here``)
    _here: list[Message]
    # this node's next message number (the Broker's), for what custody sends again under a
    # new id (a shared group's message chosen again elsewhere); None: never done
    new_seq: Callable[[], int] | None

    def _stats(self, peer: str) -> PeerStats:
        # not setdefault(peer, PeerStats()): that builds a PeerStats for every message
        stats = self.peer_stats.get(peer)
        if stats is None:
            stats = self.peer_stats[peer] = PeerStats()
        return stats

    if TYPE_CHECKING:
        # what one part calls in another (each defined once, in the module named)

        def _ensure_spf(self) -> None: ...  # routes

        def _link_map(self) -> dict[str, dict[str, int]]: ...  # routes

        def _compute_route(self, topic: str) -> Route: ...  # routes

        def _originate_router(self, now: float) -> None: ...  # lsdb

        def _send_control(self, peer: str, kind: str, body: Any) -> None: ...  # lsdb

        def _send_envelope(self, env: Envelope) -> None: ...  # dataplane

        def _ack(self, msg: Message) -> None: ...  # custody

        def _reack(self, msg: Message) -> None: ...  # custody

        def _deliver_ordered(  # order
            self, msg: Message, prev: int, attempt: int, now: float, out: list[Message]
        ) -> None: ...

        def _deliver_one(self, msg: Message, attempt: int, out: list[Message]) -> None: ...  # order

        def _release_after(self, origin: str, seq: int, out: list[Message]) -> None: ...  # order

        def _retransmit_soon(self, now: float) -> None: ...  # custody

        def _release_custody(self, node: str) -> None: ...  # custody

        def _unjournal(self, key: int | tuple[str, int]) -> None: ...  # custody

        def _choose_shares(self, msg: Message, now: float) -> Shares | None: ...  # shares

        def _park(self, msg: Message, share: str, now: float) -> None: ...  # shares

        def _group_copy(self, msg: Message, now: float) -> Message | None: ...  # custody

        def _settle_after(self, key: int | tuple[str, int]) -> None: ...  # custody

        def _share_added(self, share: str, node: str) -> None: ...  # shares

        def _share_removed(self, share: str, node: str) -> None: ...  # shares

        def _shares_of(self, node: str, old: tuple[str, ...], new: tuple[str, ...]) -> None: ...  # shares

        def _pick(self, share: str, msg: Message, exclude: str | None = None) -> str | None: ...  # shares

        def route_to_group(self, msg: Message, share: str, now: float, here: bool = False) -> bool: ...  # dataplane

        def route_local(self, msg: Message, now: float, only: Shares | None = None) -> bool: ...  # dataplane

        def _served_elsewhere(self, deliveries: list[Message], now: float) -> None: ...  # shares

        def _to_group_again(  # custody
            self, msg: Message, share: str, now: float, held: bool = False, here: bool = False
        ) -> None: ...
