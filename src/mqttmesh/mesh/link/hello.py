"""The hello: the first message on a peer link, each side's introduction.

Pure: bytes in, a ``Hello`` out (and back). The dialler sends its hello once the
listener proved the cluster secret, with the SUBSCRIBE/SUBACK round trip it measured
(the link's first cost); the listener answers with its own. JSON, keys ``node``,
``inc``, ``addr``, ``rtt`` (dialler only) and ``proto``, the peer protocol version
(absent in the hellos of nodes older than the key: those speak version 2).

A hello of another version is refused with the same words as a CONNECT of another
version (peerauth.version_mismatch), so a rolling upgrade reads alike on both paths.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from ..routing.wire import MeshProtocolError
from .peerauth import PEER_PROTOCOL, version_mismatch

__all__ = ["Hello", "HelloVersionError", "encode_hello", "parse_hello"]

# what a hello without ``proto`` speaks: the version of the release before the key
_PROTO_ABSENT = 2


class HelloVersionError(MeshProtocolError):
    """The hello is well formed but of another peer protocol version (the message names both)."""


@dataclass(frozen=True)
class Hello:
    node: str
    inc: int
    addresses: list[str] = field(default_factory=list)
    rtt_us: float | None = None  # the dialler's handshake round trip, microseconds
    proto: int = PEER_PROTOCOL


def encode_hello(hello: Hello) -> bytes:
    body: dict[str, object] = {"node": hello.node, "inc": hello.inc, "addr": hello.addresses}
    if hello.rtt_us is not None:
        body["rtt"] = int(hello.rtt_us)
    body["proto"] = hello.proto
    return json.dumps(body).encode()


def _int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def parse_hello(payload: bytes) -> Hello:
    """The hello in ``payload``: MeshProtocolError when it does not parse, HelloVersionError
    when it is of another protocol version."""
    try:
        body = json.loads(payload)
    except ValueError as exc:  # (UnicodeDecodeError and JSONDecodeError are ValueErrors)
        raise MeshProtocolError(f"invalid hello: {exc}") from None
    if not isinstance(body, dict):
        raise MeshProtocolError("invalid hello: not a JSON object")
    node, inc = body.get("node"), body.get("inc")
    if not isinstance(node, str):
        raise MeshProtocolError("invalid hello: 'node' missing or not a string")
    if not isinstance(inc, int):
        raise MeshProtocolError("invalid hello: 'inc' missing or not an integer")
    proto = body.get("proto", _PROTO_ABSENT)
    if not _int(proto):
        raise MeshProtocolError("invalid hello: 'proto' is not an integer")
    if proto != PEER_PROTOCOL:
        raise HelloVersionError(version_mismatch(node, proto))
    addr = body.get("addr")
    # addresses only help the dialler skip a second dial: what is not a string is ignored
    addresses = [a for a in addr if isinstance(a, str)] if isinstance(addr, list) else []
    rtt = body.get("rtt")
    rtt_us = float(rtt) if isinstance(rtt, (int, float)) and not isinstance(rtt, bool) and rtt > 0 else None
    return Hello(node, inc, addresses, rtt_us, proto)
