"""The states of a Channel (channel.py, whose TRANSITIONS say what each one reads), named
once for it and for the mixins that hold its parts (channel_publish.py), and the rule a
packet out of its state breaks. PEER_AUTH, the state of a peer's handshake, is
channel_peer.py's."""

from __future__ import annotations

from .channel_held import ProtocolViolation
from .packets import CONNACK, CONNECT, PACKET_NAMES, PINGRESP, SUBACK, UNSUBACK

__all__ = ["AWAIT_CONNECT", "AUTHENTICATING", "CLAIMING", "CONNECTED", "CLOSED", "violation"]

AWAIT_CONNECT = "await-connect"
AUTHENTICATING = "authenticating"
CLAIMING = "claiming"  # in a mesh: the ClientId is being claimed, the session gathered
CONNECTED = "connected"
CLOSED = "closed"


def violation(state: str, ptype: int) -> ProtocolViolation:
    """Why a packet of type ``ptype`` may not come in ``state`` (no TRANSITIONS entry)."""
    name = PACKET_NAMES.get(ptype, str(ptype))
    if state is AWAIT_CONNECT:
        return ProtocolViolation("MQTT-3.1.0-1", f"first packet must be CONNECT, got {name}")
    if ptype == CONNECT:
        return ProtocolViolation("MQTT-3.1.0-2", "second CONNECT on one connection")
    if ptype in (CONNACK, SUBACK, UNSUBACK, PINGRESP):
        return ProtocolViolation("MQTT-4.8.0-1", f"{name} is only sent by a server")
    return ProtocolViolation("MQTT-4.8.0-1", f"{name} not allowed in state {state}")
