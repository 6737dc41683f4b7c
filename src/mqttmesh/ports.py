"""The ports of the pure cores: what they call, given to them, typed as Protocols.

Pure, and nothing but types. A core names here what it needs from whoever builds it (the
server's I/O layer, the simulator, a test), so the constructor says who calls whom and an
implementation only has to have the methods. Issue 14 fills this module step by step
(docs/design.md, "How the code is laid out").
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import TYPE_CHECKING, NamedTuple, Protocol, TypeVar

if TYPE_CHECKING:
    from .message import Entry, Message

__all__ = [
    "Batch",
    "RandomHex",
    "Hits",
    "NO_HITS",
    "Recipient",
    "SentHook",
    "Owner",
    "Pausable",
    "JournalPort",
    "MeshPort",
    "PEER_USERNAME",
    "PeerListener",
    "PeerRefused",
    "ArchivePort",
    "ReadCapture",
    "PeerPort",
    "UnicastPort",
    "PeerLink",
    "MeshIO",
    "Log",
]

# A journal batch that must be durable before an acknowledgement goes out; 0: none.
# (A name of its own so that an acknowledgement can later wait for more than the disk,
# e.g. for replication, by changing what a Batch is in this one place.)
Batch = int

# n random bytes as 2n hex digits (auto ClientIds): os.urandom in the server, a seeded
# generator in the simulator, a counter in tests
RandomHex = Callable[[int], str]

# (session, message, QoS, DUP) of a PUBLISH a session just wrote to its client: the
# the congested sessions (and peer links) one message reached: what its publisher owes
# (flow.Congestion.hold); ``Broker.publish`` returns them, mostly NO_HITS
Hits = Sequence[Hashable]
NO_HITS: Hits = ()

# a Channel (channel.Channel, which imports this module): what an Owner and the PeerPort are
# handed back, typed by who uses them (``Owner[Channel]``)
ChannelT = TypeVar("ChannelT", contravariant=True)


class Recipient(Protocol):
    """Whoever a message was delivered to, as the archive's delivery log names it (a session)."""

    client_id: str


# (session, message, QoS, DUP) of a PUBLISH a session just wrote to its client: the
# archive's delivery log (session.Session.on_sent)
SentHook = Callable[[Recipient, "Message", int, bool], None]


class Owner(Protocol[ChannelT]):
    """A Channel's connection: the socket and timers of one client (server/connection.py)."""

    @property
    def peer(self) -> str:
        """The client's address (asked by a Channel made with "" for it)."""

    def wake(self, channel: ChannelT) -> None:
        """There are bytes in ``channel.data_to_send()``: called at the first frame, and
        again every ``channel_held.SPILL_FRAMES`` frames while they wait, when an owner that
        batches its writes should write them at once (``Channel.pending_frames`` says how
        many wait)."""

    def close(self, channel: ChannelT, reason: str) -> None:
        """Send what is pending, then close."""

    def authenticate(self, channel: ChannelT, username: str | None, password: bytes | None) -> None:
        """Run the slow password check somewhere (throttled and bounded: server/logins.py)
        and answer with ``channel.authenticated(rc, now)``."""

    def connected(self, channel: ChannelT) -> None:
        """A CONNECT finished later than the bytes that carried it (mesh claims)."""

    def pause_reading(self, channel: ChannelT) -> None:
        """Stop feeding this channel for now (flow.py)."""

    def resume_reading(self, channel: ChannelT) -> None:
        """Feed it again."""


class Pausable(Protocol):
    """A publisher that flow control (flow.Congestion) can stop reading: a client's Channel
    or a peer link we dialled (server/mesh_node.py PeerClient)."""

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None:
        """Read again, unless it closed meanwhile."""


class JournalPort(Protocol):
    """Where the cores record what must become durable (store.Journal; store.NullJournal
    when the node keeps everything in memory). The I/O layer commits it and reports the
    batch back (``Broker.committed``)."""

    persistent: bool  # False: nothing recorded is ever written (a node without a store)
    writes: int  # changes recorded, ever (what ``mark`` returns)
    batch: int  # the batch being filled
    committed: int  # the newest batch known to be durable

    def __len__(self) -> int: ...

    def mark(self) -> int:
        """A mark to pass to ``since``."""

    def since(self, mark: int) -> Batch:
        """The batch to wait for if anything was recorded since ``mark``, else 0."""

    def session_put(self, client_id: str, subscriptions: Mapping[str, int], expires: float | None = None) -> None: ...
    def session_delete(self, client_id: str) -> None: ...
    def message_put(self, client_id: str, entry: Entry) -> None: ...
    def message_remove(self, client_id: str, key: int) -> None: ...
    def awaiting_rel_put(self, client_id: str, packet_id: int) -> None: ...
    def awaiting_rel_remove(self, client_id: str, packet_id: int) -> None: ...
    def inbound_put(self, client_id: str, packet_id: int, msg: Message) -> None: ...
    def inbound_remove(self, client_id: str, packet_id: int) -> None: ...
    def version_put(self, client_id: str, epoch: int, version: int) -> None: ...
    def done_put(self, client_id: str, slot: int, number: int, origin: str, seq: int) -> None: ...
    def floor_put(self, client_id: str, origin: str, seq: int) -> None: ...
    def node_seen(self, node: str) -> None: ...
    def custody_put(self, msg: Message, dests: list[str]) -> None: ...
    def custody_remove(self, seq: int) -> None: ...
    def rerouted_put(self, msg: Message, dests: list[str]) -> None: ...
    def rerouted_remove(self, origin: str, seq: int) -> None: ...
    def retained_put(self, topic: str, msg: Message) -> None: ...
    def retained_delete(self, topic: str) -> None: ...
    def will_put(self, client_id: str, due: float, msg: Message, expiry: int | None) -> None: ...
    def will_delete(self, client_id: str) -> None: ...
    def mark_committed(self, number: int) -> None: ...


class MeshPort(Protocol):
    """The mesh, as the Broker sees it (mesh/link/gateway.py MeshGateway). None outside a mesh."""

    def filter_added(self, topic_filter: str) -> None:
        """The first local subscriber of ``topic_filter`` (restored sessions' too)."""

    def filter_removed(self, topic_filter: str) -> None:
        """The last local subscriber of ``topic_filter`` left."""

    def published(self, msg: Message) -> Hits:
        """A message published at this node, after its local dispatch (the hot path); the
        congested links it goes out on (flow.py), NO_HITS mostly."""

    def hold(self, msg: Message, share: str, clean: bool) -> None:
        """A member of the shared group ``share`` here took ``msg`` at QoS 1/2: if another node
        sent it, the acknowledgement to its origin waits for the member's (``settle``); if it
        is this node's and the member's session is ``clean``, the store keeps it meanwhile."""

    def settle(self, msg: Message, share: str) -> None:
        """A member of ``share`` that took ``msg`` acknowledged it, or it went to another
        node's member, or to nobody: nothing waits for it here any more."""

    def online_elsewhere(self, share: str) -> bool:
        """Has another node in reach a connected member of the shared group ``share``
        ("$share/{g}/{f}")?"""

    def first_here(self, msg: Message) -> bool:
        """False when ``msg`` (by its id) reached this node's subscribers before; it has now."""

    def comes_later(self, msg: Message) -> bool:
        """True when ``msg`` (by its id) reached this node and waits for an earlier message of
        its origin (mesh/routing/order.py): it is dispatched here once that one is."""

    def to_group(self, msg: Message, share: str, now: float) -> bool:
        """``msg``, which a member here held when it left, to one member of the shared group
        ``share`` ("$share/{g}/{f}") on another node, and to nothing else there, as a new
        message of this node (shared.py ``redispatch``); False: no other node with a member
        is known."""


class ArchivePort(Protocol):
    """The archive, as the Broker, the sessions and the Channels see it (archive/capture.py
    Capture). None where the archive is off: then each of them tests ``is None`` once, on
    the same paths as before the archive had a port."""

    # given to every session the Broker's factory makes (session_durable.Sessions); None: the
    # delivery log is off, and sessions test for it as for no archive
    sent: SentHook | None

    def published(self, msg: Message) -> None:
        """A message published at this node that no ReadCapture took (Broker.publish)."""

    def other_origin(self, msg: Message) -> None:
        """The same for a message this node publishes under another node's id, its origin
        (``msg.origin`` is not the Broker's ``node_id``): an inbound QoS 2 message routed
        under its agreed id (mesh/cluster/replica.py), a will the registrar publishes for a
        dead node's client. Rare, and kept apart so that ``published`` never looks at a
        message's origin."""

    def read(self, client_id: str) -> ReadCapture | None:
        """The capture of one read from a connected client, or None when messages are
        archived one by one (topic filters: the Broker hands each to ``published``)."""


class ReadCapture(Protocol):
    """One read from one client, archived as the bytes of its packets (archive/reads.py).

    The Channel passes ``keep`` to ``Decoder.packets``, tells which PUBLISH packets of the
    read became messages and which did not, in order, and ends the read."""

    keep: list[bytearray]  # the Decoder appends the read's whole packets

    def message(self, seq: int) -> None:
        """The PUBLISH packet being handled became the message numbered ``seq``."""

    def skip(self) -> None:
        """The PUBLISH packet being handled is no message (denied, a QoS 2 re-send)."""

    def end(self, wall: float) -> None:
        """The read is over; ``wall``: its wall-clock time, every message's timestamp."""


# the user name a dialling node logs in with (its password is the peer handshake's first
# field, mesh/link/peerauth.py); any other CONNECT is a client's
PEER_USERNAME = "mqttmesh-peer"


class PeerRefused(NamedTuple):
    """Why a peer's CONNECT is refused: the CONNACK return code and the reason logged."""

    rc: int
    reason: str


class PeerListener(Protocol):
    """This node's half of one dialling peer's handshake (mesh/link/peerauth.py ListenerAuth)."""

    @property
    def dialler(self) -> str:
        """The node that dials us, as its CONNECT says (not proved until ``proof_refused``)."""

    def challenge(self) -> bytes:
        """Our proof of the cluster secret, and our nonce for the dialler's answer."""

    def proof_refused(self, payload: bytes) -> str | None:
        """None when ``payload`` proves the cluster secret for this handshake; else why not."""


class PeerPort(Protocol[ChannelT]):
    """The mesh, as a Channel of a node that dialled us sees it (mesh/link/links.py PeerLinks)."""

    def listen(self, client_id: str, password: bytes | None, certified: bool) -> PeerListener | PeerRefused:
        """A CONNECT with the peer user name (``certified``: over TLS with a verified client
        certificate): our half of its handshake, with a nonce fresh for this connection, or
        why it is refused."""

    def peer_input(self, channel: ChannelT, msg: Message, now: float) -> tuple[Batch, Hits]:
        """A PUBLISH from the peer; the batch its PUBACK waits for, and the congested local
        sessions it reached (the link owes them: flow.py)."""

    def peer_closed(self, channel: ChannelT, now: float) -> None: ...


class UnicastPort(Protocol):
    """The cluster's messages to other nodes, over the routing engine (mesh/link/gateway.py
    MeshGateway; a test's instant network)."""

    def unicast(self, dest: str, kind: str, payload: bytes, soon: bool = True) -> bool:
        """Route ``payload`` to node ``dest``; False: unreachable now (dropped). ``soon``: it
        goes at the end of this loop iteration; else within ``mesh.batch_delay``, with what
        goes then (an answer nobody waits on: MeshIO.flush_later)."""

    def reachable(self, dest: str) -> bool:
        """Would a unicast to ``dest`` (another node) be routed now?"""

    def routes_to(self, dest: str, topic: str) -> bool:
        """Would a message of ``topic`` published here be routed to node ``dest`` now (a plain
        subscription there, known here, the node in reach)?"""


class PeerLink(Protocol):
    """One link to a peer node, whichever side dialled (mesh/link/links.py AcceptedLink, the
    server's PeerClient, a test's in-memory link)."""

    dialler: str  # node id of the side that dialled
    peer: str  # "" until its hello made it a link
    proved: str  # the node id its handshake proved
    handshake_rtt: float | None  # the dialler's SUBSCRIBE/SUBACK round trip (seconds)
    answers_hello: bool  # True on the listening side: it answers the dialler's hello
    address: str | None  # the far end, for the log and the status

    def send(self, kind: str, payload: bytes, qos: int) -> None: ...

    def close(self, reason: str) -> None: ...

    def congestion_key(self) -> Hashable:
        """What flow control (flow.Congestion) knows this link by when it is congested."""


class MeshIO(Protocol):
    """The pure mesh's calls into the event loop (server/mesh_node.py MeshNode)."""

    def flush_soon(self) -> None:
        """Call ``PeerLinks.flush(now)`` and write the links at the end of this loop iteration."""

    def flush_later(self) -> None:
        """The same, within ``mesh.batch_delay`` (what comes meanwhile goes in the same writes):
        for what nobody waits on at once, the envelopes routed and the end-to-end
        acknowledgements. A ``flush_soon`` meanwhile takes it along."""

    def flush_now(self) -> None:
        """FLUSH_EVERY messages were routed: send and write them now, without waiting."""

    def write_clients_now(self) -> None:
        """A link read brought many batches: write the local clients now."""

    def nonce(self) -> bytes:
        """NONCE_BYTES fresh random bytes."""

    def learned(self, address: str, node: str) -> None:
        """A dialled address belongs to ``node`` (its dialler can yield to a link the other way)."""

    def inquiry(self, frm: str, kind: str, payload: bytes) -> None:
        """An ``ops.*`` unicast from node ``frm``: an operator's question or its answer
        (server/ops.py), which the I/O layer answers from what the node holds."""


class Log(Protocol):
    """Where the pure mesh logs (a logging.Logger; tests record the lines)."""

    def info(self, msg: str, *args: object) -> None: ...

    def warning(self, msg: str, *args: object) -> None: ...

    def exception(self, msg: str, *args: object) -> None: ...
