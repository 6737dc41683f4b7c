"""Peer authentication: both nodes of a link prove, to each other and for this link only,
that they hold the cluster secret (design.md 2.6 and "Threat model of the peer protocol").

Pure: no sockets, no clock, no randomness. Each side's nonce is an argument (the I/O
layer, server/mesh_node.py, draws it); the MQTT packets that carry these fields are
mesh/link/client.py's (dialling side) and channel.py's (listening side).

The handshake of the peer protocol since version 2 (``PEER_PROTOCOL``, now 13; the later
versions changed only what travels after it: 3 added settlement versions to session
snapshots, 4 routes a persistent publisher's QoS 2 message under the id its session's
holders agreed on and names, in an envelope, the node to acknowledge it to, issue 15; 5
packs every settled id a snapshot's copy remembers and carries its floors, 6 gives each
QoS 1/2 envelope its predecessor per destination and adds the ``nack`` and ``skip``
messages of ordered delivery, issue 20; 7 to 13 are named at ``PEER_PROTOCOL`` below),
in ordinary MQTT 3.1.1 packets (D dials, L listens):

    D -> L  CONNECT  user mqttmesh-peer, ClientId $mesh-<D>,
                     password "12|<D>|<incarnation D>|<Nd>"
    L -> D  CONNACK 0: D is a provisional peer, nothing is routed to it
    D -> L  SUBSCRIBE $mesh/to/<D>/#
    L -> D  SUBACK, then PUBLISH $mesh/to/<D>/auth   "<L>|<incarnation L>|<Nl>|<MAC L>"
    D -> L  PUBLISH $mesh/from/<D>/auth              "<MAC D>"

Nd and Nl are 16 fresh random bytes (32 hex digits) drawn by D and L for this connection.
MAC x = HMAC-SHA256(secret, the transcript labelled x): the label ("listener" or
"dialler"), the version, both node ids, both incarnations and both nonces, each field
length-prefixed. L proves the secret with D's fresh nonce, D with L's: a recorded
exchange is worth nothing on another connection, and the labels keep one side's proof
from being reflected as the other's. Nothing in it depends on the clocks of the nodes.

Version 1 (up to this one) sent "node|incarnation|unix time|MAC" and nothing else; it is
recognised only to be refused by name (its MAC has 64 hex digits where version 2 has
a 32-digit nonce, so the two never parse as each other).
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Callable
from dataclasses import dataclass

from ...packets import BAD_CREDENTIALS, ID_REJECTED, NOT_AUTHORIZED
from ...ports import PEER_USERNAME, PeerRefused

__all__ = [
    "PEER_PROTOCOL",
    "PEER_USERNAME",
    "NONCE_BYTES",
    "PeerAuthError",
    "PeerConnect",
    "Handshake",
    "parse_connect",
    "DiallerAuth",
    "ListenerAuth",
    "listen",
    "version_mismatch",
]

# the peer protocol's version: a node refuses a peer of another (7: MQTT 5 properties in
# envelopes; 8: what is left of an expiring message's life, issue 23; 9: unicast records
# say how long they were on the way, routing/wire.py; 10: reg.release says when its claim
# was never accepted, "refused", and the session ends as the claim found it, registry.py;
# 11: reg.release says how long ago its connection ended, "ago", with its delayed will,
# and sess.state that the session ended, "ended", claimant.py; 12: envelope batches of
# format 6, which say which shared groups each destination serves, routing/shares.py; 13: a
# snapshot's entries and a forwarded message name the message a shared group's re-send
# re-sends, its root, cluster_values.py)
PEER_PROTOCOL = 13
NONCE_BYTES = 16

_NONCE = re.compile(rf"[0-9a-f]{{{2 * NONCE_BYTES}}}\Z")
_MAC = re.compile(r"[0-9a-f]{64}\Z")
_INT = re.compile(r"(0|[1-9][0-9]{0,19})\Z")
_NODE = re.compile(r"[^|\x00-\x20\x7f]{1,256}\Z")  # what config allows, and more, but never '|'

LISTENER, DIALLER = "listener", "dialler"


def version_mismatch(peer: str, version: int) -> str:
    """Why a peer of another protocol version is refused, both versions named: the same
    words whether its CONNECT (channel.py) or its hello (mesh/link/hello.py) said it."""
    return f"peer {peer!r} speaks mesh protocol {version}, this node {PEER_PROTOCOL}"


class PeerAuthError(ValueError):
    """A peer's authentication field is malformed or its proof is wrong (the message says which)."""


@dataclass(frozen=True)
class PeerConnect:
    """What a dialling node's CONNECT password says (nothing in it is proved yet)."""

    version: int
    node: str
    incarnation: int
    nonce: str  # hex; "" for version 1


@dataclass(frozen=True)
class Handshake:
    """Everything a link's two proofs are bound to."""

    dialler: str
    dialler_incarnation: int
    dialler_nonce: str
    listener: str
    listener_incarnation: int
    listener_nonce: str
    version: int = PEER_PROTOCOL

    def mac(self, secret: bytes, label: str) -> str:
        fields = (
            "mqttmesh-peer",
            label,
            str(self.version),
            self.dialler,
            str(self.dialler_incarnation),
            self.listener,
            str(self.listener_incarnation),
            self.dialler_nonce,
            self.listener_nonce,
        )
        # length-prefixed, so no two different transcripts read as the same bytes
        text = "".join(f"{len(f.encode())}:{f}," for f in fields)
        return hmac.new(secret, text.encode(), hashlib.sha256).hexdigest()


def _text(field: bytes | None, what: str) -> str:
    if not field:
        raise PeerAuthError(f"no {what}")
    try:
        return field.decode("ascii")
    except UnicodeDecodeError:
        raise PeerAuthError(f"{what} is not ASCII") from None


def _nonce_hex(nonce: bytes) -> str:
    if not isinstance(nonce, bytes) or len(nonce) != NONCE_BYTES:
        raise ValueError(f"a nonce is {NONCE_BYTES} random bytes")
    return nonce.hex()


def _node(text: str, what: str) -> str:
    if not _NODE.match(text):
        raise PeerAuthError(f"{what} {text!r} is not a node id")
    return text


def parse_connect(password: bytes | None) -> PeerConnect:
    """The fields of a peer CONNECT's password, of any version; PeerAuthError when malformed.

    The caller compares ``version`` with PEER_PROTOCOL: only a result of this version is usable.
    """
    text = _text(password, "peer credentials")
    parts = text.split("|")
    if len(parts) >= 4 and _INT.match(parts[-3]) and _INT.match(parts[-2]) and _MAC.match(parts[-1]):
        # version 1: node|incarnation|time|mac (its node id could hold '|')
        return PeerConnect(1, _node("|".join(parts[:-3]), "node"), int(parts[-3]), "")
    if not _INT.match(parts[0]):
        raise PeerAuthError("peer credentials do not start with a protocol version")
    version = int(parts[0])
    if version != PEER_PROTOCOL:
        # another version's fields are its own business: the version is all we can name
        return PeerConnect(version, "", 0, "")
    if len(parts) != 4:
        raise PeerAuthError(f"peer credentials have {len(parts)} fields, not 4")
    _, node, incarnation, nonce = parts
    if not _INT.match(incarnation):
        raise PeerAuthError(f"incarnation {incarnation!r} is not a number")
    if not _NONCE.match(nonce):
        raise PeerAuthError(f"nonce is not {2 * NONCE_BYTES} lowercase hex digits")
    return PeerConnect(version, _node(node, "node"), int(incarnation), nonce)


class DiallerAuth:
    """The dialling node's half: its CONNECT password, the check of the listener's proof, its own."""

    def __init__(self, secret: bytes, node: str, incarnation: int, nonce: bytes):
        if not secret:
            raise ValueError("no cluster secret")
        self.secret = secret
        self.node = node
        self.incarnation = incarnation
        self.nonce = _nonce_hex(nonce)

    def password(self) -> bytes:
        return f"{PEER_PROTOCOL}|{self.node}|{self.incarnation}|{self.nonce}".encode()

    def check_listener(self, payload: bytes) -> Handshake:
        """The listener's proof, checked against our nonce: the handshake, or PeerAuthError."""
        parts = _text(payload, "listener proof").split("|")
        if len(parts) != 4:
            raise PeerAuthError(f"listener proof has {len(parts)} fields, not 4")
        listener, incarnation, nonce, mac = parts
        _node(listener, "listener")
        if not _INT.match(incarnation) or not _NONCE.match(nonce) or not _MAC.match(mac):
            raise PeerAuthError("listener proof is malformed")
        if listener == self.node:
            raise PeerAuthError("the listener claims this node's own id")
        hs = Handshake(self.node, self.incarnation, self.nonce, listener, int(incarnation), nonce)
        if not hmac.compare_digest(mac, hs.mac(self.secret, LISTENER)):
            raise PeerAuthError(f"listener {listener!r} failed to prove the cluster secret")
        return hs

    def proof(self, hs: Handshake) -> bytes:
        return hs.mac(self.secret, DIALLER).encode()


class ListenerAuth:
    """The listening node's half for one provisional peer: its challenge and the check of the answer."""

    def __init__(self, secret: bytes, node: str, incarnation: int, nonce: bytes, peer: PeerConnect):
        if not secret:
            raise ValueError("no cluster secret")
        if peer.version != PEER_PROTOCOL:
            raise ValueError("a handshake needs a peer of this protocol version")
        self.secret = secret
        self.handshake = Handshake(peer.node, peer.incarnation, peer.nonce, node, incarnation, _nonce_hex(nonce))

    def challenge(self) -> bytes:
        """Our proof, made with the dialler's nonce, and our nonce for its answer."""
        hs = self.handshake
        return (f"{hs.listener}|{hs.listener_incarnation}|{hs.listener_nonce}|{hs.mac(self.secret, LISTENER)}").encode()

    @property
    def dialler(self) -> str:
        return self.handshake.dialler

    def proof_refused(self, payload: bytes) -> str | None:
        """None when the dialler's proof is right for this handshake; else why not (ports.PeerListener)."""
        try:
            self.check_dialler(payload)
        except PeerAuthError as exc:
            return str(exc)
        return None

    def check_dialler(self, payload: bytes) -> None:
        """PeerAuthError unless the dialler's proof is right for this handshake."""
        mac = _text(payload, "dialler proof")
        if not _MAC.match(mac):
            raise PeerAuthError("dialler proof is not 64 lowercase hex digits")
        hs = self.handshake
        if not hmac.compare_digest(mac, hs.mac(self.secret, DIALLER)):
            raise PeerAuthError(f"peer {hs.dialler!r} failed to prove the cluster secret")


def listen(
    secret: bytes,
    node: str,
    incarnation: int,
    nonce: Callable[[], bytes],
    client_id: str,
    password: bytes | None,
    certified: bool,
    certificate_required: bool,
) -> ListenerAuth | PeerRefused:
    """A dialling node's CONNECT, as ``node`` (the listener) reads it: our half of the
    handshake, with a fresh ``nonce()``, or why it is refused, with its CONNACK code.
    ``certified``: it came over TLS with a verified client certificate, which
    ``certificate_required`` (mesh.tls_mutual) asks for."""
    try:
        peer = parse_connect(password)
    except PeerAuthError as exc:
        return PeerRefused(BAD_CREDENTIALS, f"peer {client_id!r}: {exc}")
    if peer.version != PEER_PROTOCOL:
        # a rolling upgrade meets an older or newer node: say so, both versions named
        who = peer.node or client_id.removeprefix("$mesh-")
        return PeerRefused(BAD_CREDENTIALS, version_mismatch(who, peer.version))
    if client_id != f"$mesh-{peer.node}":
        return PeerRefused(ID_REJECTED, "peer ClientId must be $mesh-<node>")
    if peer.node == node:
        return PeerRefused(BAD_CREDENTIALS, "a peer claims this node's own id")
    if certificate_required and not certified:
        return PeerRefused(
            NOT_AUTHORIZED, "a peer link needs a TLS client certificate signed by tls.ca_file (mesh.tls_mutual)"
        )
    return ListenerAuth(secret, node, incarnation, nonce(), peer)
