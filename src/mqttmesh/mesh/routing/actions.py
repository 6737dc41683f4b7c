"""What the routing engine asks of its caller: sends to neighbours, and what arrived for this node.

Pure data. The caller (server/mesh_node.py, the simulator, the tests) performs them:
writes a ``Send`` on the link to ``peer``, dispatches each delivery to the local
subscribers, hands each ``Unicast`` to the cluster protocols.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from ...message import Message

__all__ = ["Send", "Unicast", "Inbound", "NOTHING"]


class Send(NamedTuple):
    """One message on the link to neighbour ``peer`` (from ``flush`` and ``tick``)."""

    peer: str
    kind: str  # hello, cost, dbsum, lsreq, lsa, fwd, e2e or uni (engine.py)
    payload: bytes
    qos: int  # the PUBLISH QoS on the peer link: 0 only for what needs no link-level ack


class Unicast(NamedTuple):
    """A unicast addressed to this node by node ``frm`` (session and registry protocols)."""

    frm: str
    kind: str
    payload: bytes
    age: float = 0.0  # seconds it was on the way, as far as the wall clocks tell (wire.py)


class Inbound(NamedTuple):
    """What one message from a neighbour brought for this node (from ``receive``).

    A delivery needs an end-to-end acknowledgement (``MeshEngine.delivered``, once the
    delivery is safe) exactly when its QoS is 1 or 2, so the Message alone says it. One
    Inbound per read, not a tuple per message: a ``fwd`` batch brings deliveries only,
    a ``uni`` message unicasts only.
    """

    deliveries: Sequence[Message]
    unicasts: Sequence[Unicast]


# what every other message brings (shared: it is empty and immutable)
NOTHING = Inbound((), ())
