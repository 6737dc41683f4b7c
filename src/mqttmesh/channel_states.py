"""The states of a Channel (channel.py, whose TRANSITIONS say what each one reads), named
once for it and for the mixins that hold its parts (channel_publish.py). PEER_AUTH, the
state of a peer's handshake, is channel_peer.py's."""

from __future__ import annotations

__all__ = ["AWAIT_CONNECT", "AUTHENTICATING", "CLAIMING", "CONNECTED", "CLOSED"]

AWAIT_CONNECT = "await-connect"
AUTHENTICATING = "authenticating"
CLAIMING = "claiming"  # in a mesh: the ClientId is being claimed, the session gathered
CONNECTED = "connected"
CLOSED = "closed"
