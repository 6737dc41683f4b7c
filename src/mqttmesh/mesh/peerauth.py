"""Peer credentials: how a node proves it holds the cluster secret in an MQTT CONNECT.

Pure. The dialling node sends user name ``PEER_USERNAME`` and, as password,
``node|incarnation|time|hmac`` where hmac = HMAC-SHA256(secret, the first three
fields). The listening node checks the HMAC and that the time is within the
allowed clock skew. Without TLS the secret never crosses the wire, but a
recorded CONNECT can be replayed within the window: use TLS between sites.
"""

from __future__ import annotations

import hashlib
import hmac

__all__ = ["PEER_USERNAME", "make_token", "check_token"]

PEER_USERNAME = "mqttmesh-peer"


def _mac(secret: bytes, text: str) -> str:
    return hmac.new(secret, f"mqttmesh-peer|{text}".encode(), hashlib.sha256).hexdigest()


def make_token(secret: bytes, node_id: str, incarnation: int, now: float) -> bytes:
    text = f"{node_id}|{incarnation}|{int(now)}"
    return f"{text}|{_mac(secret, text)}".encode()


def check_token(secret: bytes, token: bytes | None, now: float, skew: float = 300.0) -> tuple[str, int] | None:
    """(node id, incarnation) when the token is valid, else None."""
    if not secret or not token:
        return None
    try:
        node_id, incarnation, stamp, mac = token.decode().rsplit("|", 3)
        incarnation_n = int(incarnation)
        stamp_n = int(stamp)
    except (UnicodeDecodeError, ValueError):
        return None
    if not node_id or abs(now - stamp_n) > skew:
        return None
    if not hmac.compare_digest(mac, _mac(secret, f"{node_id}|{incarnation}|{stamp}")):
        return None
    return node_id, incarnation_n
