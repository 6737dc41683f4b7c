"""The listening side of a peer link's handshake, as part of the Channel (ports.PeerPort).

Pure. A node that dials us connects like a client, with the peer user name: it gets CONNACK
at once, may then subscribe once, to its own topic, which brings it our challenge, and must
answer with the proof of the cluster secret. Until then the Channel is in PEER_AUTH: the
ClientId is not taken over and nothing is routed to it. ``PeerListening`` holds those steps
for ``channel.Channel``, which inherits them; the Channel's TRANSITIONS name them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from . import codec
from .packets import ACCEPTED, NOT_AUTHORIZED
from .ports import PeerRefused

if TYPE_CHECKING:
    from .broker import Broker
    from .channel import Opening
    from .ports import PeerPort

__all__ = ["PEER_AUTH", "PeerListening"]

PEER_AUTH = "peer-auth"  # a provisional peer: CONNACK sent, the proofs of the secret pending


class PeerListening:
    """The peer handshake's packet handlers of a Channel (a mixin: the Channel keeps the state)."""

    __slots__ = ()

    if TYPE_CHECKING:  # what the handlers use of the Channel
        broker: Broker
        peers: PeerPort[Any] | None  # (PeerPort[Channel])
        state: str
        _opening: Opening | None

        def _accept(self, rc: int, now: float, why: str = "") -> None: ...
        def write(self, frame: bytes) -> None: ...
        def close(self, reason: str, now: float | None = None) -> None: ...
        def _peer_proved(self, dialler: str, now: float) -> None: ...

    def _on_peer_connect(self, pkt: codec.Connect, now: float) -> None:
        mesh = self.peers
        if mesh is None:
            return self._accept(NOT_AUTHORIZED, now, "this node is not part of a mesh")
        # the mesh checks the CONNECT's fields (mesh/link/links.py PeerLinks.listen)
        opening = self._opening
        assert opening is not None  # (AUTHENTICATING)
        answer = mesh.listen(pkt.client_id, pkt.password, opening.certified)
        if isinstance(answer, PeerRefused):
            return self._accept(answer.rc, now, answer.reason)
        # CONNACK now, so that the dialler can subscribe and take our challenge; but the
        # ClientId is not taken over (that would let anyone close a peer's link) and nothing
        # is routed here until the dialler has proved the secret (_on_peer_proof)
        self.state = PEER_AUTH  # type: ignore[misc]  # (a slot of the Channel)
        opening.peer_auth = answer
        old = self.broker.sessions.get(pkt.client_id)
        present = old is not None and not old.clean and not pkt.clean_session  # as open_session will say
        self.write(bytes((0x20, 2, 1 if present else 0, ACCEPTED)))

    def _on_peer_subscribe(self, pkt: codec.Subscribe, now: float) -> None:
        opening = self._opening
        assert opening is not None and opening.peer_auth is not None  # (PEER_AUTH)
        dialler = opening.peer_auth.dialler
        wanted = f"$mesh/to/{dialler}/#"
        if opening.peer_filter is not None or len(pkt.topics) != 1 or pkt.topics[0][0] != wanted:
            self.broker.stats.connections_refused += 1
            return self.close(f"provisional peer {dialler!r} may only subscribe once, to {wanted}")
        granted = min(pkt.topics[0][1], self.broker.settings.max_qos)
        opening.peer_filter = (wanted, granted)
        self.write(codec.encode(codec.SubAck(pkt.packet_id, [granted])))  # [MQTT-3.8.4-1]
        self.write(codec.encode_publish(f"$mesh/to/{dialler}/auth".encode(), opening.peer_auth.challenge()))

    def _on_peer_proof(self, pkt: codec.Publish, now: float) -> None:
        opening = self._opening
        assert opening is not None and opening.peer_auth is not None  # (PEER_AUTH)
        auth = opening.peer_auth
        dialler = auth.dialler
        if opening.peer_filter is None or pkt.qos or pkt.retain or pkt.topic != f"$mesh/from/{dialler}/auth":
            why: str | None = (
                f"provisional peer {dialler!r} sent a PUBLISH on {pkt.topic!r} before proving the cluster secret"
            )
        else:
            why = auth.proof_refused(pkt.payload)
        if why is not None:
            self.broker.stats.connections_refused += 1
            return self.close(why)
        self._peer_proved(dialler, now)
