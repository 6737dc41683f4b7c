"""The listening side of a peer link's handshake, as part of the Channel (mesh/link/peerauth.py).

Pure. A node that dials us connects like a client, with the peer user name: it gets CONNACK
at once, may then subscribe once, to its own topic, which brings it our challenge, and must
answer with the proof of the cluster secret. Until then the Channel is in PEER_AUTH: the
ClientId is not taken over and nothing is routed to it. ``PeerListening`` holds those steps
for ``channel.Channel``, which inherits them; the Channel's TRANSITIONS name them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import codec
from .mesh.link.peerauth import PEER_PROTOCOL, ListenerAuth, PeerAuthError, parse_connect, version_mismatch
from .packets import ACCEPTED, BAD_CREDENTIALS, ID_REJECTED, NOT_AUTHORIZED

if TYPE_CHECKING:
    from .broker import Broker
    from .ports import PeerPort

__all__ = ["PEER_AUTH", "PeerListening"]

PEER_AUTH = "peer-auth"  # a provisional peer: CONNACK sent, the proofs of the secret pending


class PeerListening:
    """The peer handshake's packet handlers of a Channel (a mixin: the Channel keeps the state)."""

    __slots__ = ()

    if TYPE_CHECKING:  # what the handlers use of the Channel
        broker: Broker
        peers: PeerPort | None
        certified: bool
        state: str
        _peer_auth: ListenerAuth | None
        _peer_filter: tuple[str, int] | None

        def _accept(self, rc: int, now: float, why: str = "") -> None: ...
        def write(self, frame: bytes) -> None: ...
        def close(self, reason: str, now: float | None = None) -> None: ...
        def _peer_proved(self, dialler: str, now: float) -> None: ...

    def _on_peer_connect(self, pkt: codec.Connect, now: float) -> None:
        mesh = self.peers
        if mesh is None:
            return self._accept(NOT_AUTHORIZED, now, "this node is not part of a mesh")
        try:
            peer = parse_connect(pkt.password)
        except PeerAuthError as exc:
            return self._accept(BAD_CREDENTIALS, now, f"peer {pkt.client_id!r}: {exc}")
        if peer.version != PEER_PROTOCOL:
            # a rolling upgrade meets an older or newer node: say so, both versions named
            who = peer.node or pkt.client_id.removeprefix("$mesh-")
            return self._accept(BAD_CREDENTIALS, now, version_mismatch(who, peer.version))
        if pkt.client_id != f"$mesh-{peer.node}":
            return self._accept(ID_REJECTED, now, "peer ClientId must be $mesh-<node>")
        if peer.node == self.broker.node_id:
            return self._accept(BAD_CREDENTIALS, now, "a peer claims this node's own id")
        if mesh.certificate_required and not self.certified:
            return self._accept(
                NOT_AUTHORIZED,
                now,
                "a peer link needs a TLS client certificate signed by tls.ca_file (mesh.tls_mutual)",
            )
        # CONNACK now, so that the dialler can subscribe and take our challenge; but the
        # ClientId is not taken over (that would let anyone close a peer's link) and nothing
        # is routed here until the dialler has proved the secret (_on_peer_proof)
        self.state = PEER_AUTH  # type: ignore[misc]  # (a slot of the Channel)
        self._peer_auth = mesh.handshake(peer)  # type: ignore[misc]
        old = self.broker.sessions.get(pkt.client_id)
        present = old is not None and not old.clean and not pkt.clean_session  # as open_session will say
        self.write(bytes((0x20, 2, 1 if present else 0, ACCEPTED)))

    def _on_peer_subscribe(self, pkt: codec.Subscribe, now: float) -> None:
        dialler = self._peer_auth.handshake.dialler
        wanted = f"$mesh/to/{dialler}/#"
        if self._peer_filter is not None or len(pkt.topics) != 1 or pkt.topics[0][0] != wanted:
            self.broker.stats.connections_refused += 1
            return self.close(f"provisional peer {dialler!r} may only subscribe once, to {wanted}")
        granted = min(pkt.topics[0][1], self.broker.settings.max_qos)
        self._peer_filter = (wanted, granted)  # type: ignore[misc]
        self.write(codec.encode(codec.SubAck(pkt.packet_id, [granted])))  # [MQTT-3.8.4-1]
        self.write(codec.encode_publish(f"$mesh/to/{dialler}/auth".encode(), self._peer_auth.challenge()))

    def _on_peer_proof(self, pkt: codec.Publish, now: float) -> None:
        auth = self._peer_auth
        dialler = auth.handshake.dialler
        try:
            if self._peer_filter is None or pkt.qos or pkt.retain or pkt.topic != f"$mesh/from/{dialler}/auth":
                raise PeerAuthError(
                    f"provisional peer {dialler!r} sent a PUBLISH on {pkt.topic!r} before proving the cluster secret"
                )
            auth.check_dialler(pkt.payload)
        except PeerAuthError as exc:
            self.broker.stats.connections_refused += 1
            return self.close(str(exc))
        self._peer_proved(dialler, now)
