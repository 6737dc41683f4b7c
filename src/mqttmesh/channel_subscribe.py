"""A 3.1.1 client's SUBSCRIBE and UNSUBSCRIBE, as part of the Channel (MQTT 5's:
channel5.py).

Pure. A filter is judged (``channel5.refusal``: the ACL, ``$mesh``, a shared subscription
where it is taken), granted at most the node's maximum QoS and recorded in the session table;
the SUBACK or UNSUBACK leaves once the store has what it changed (channel_held.py), and the
retained messages of a plain filter follow [MQTT-3.8.4-3]. ``Subscribing`` holds these
handlers for ``channel.Channel``, which inherits them and keeps the state.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from . import codec
from .channel5 import refusal
from .channel_held import ack_frame

if TYPE_CHECKING:
    from .broker import Broker
    from .ports import Batch
    from .session import Session

__all__ = ["Subscribing"]


class Subscribing:
    """The SUBSCRIBE and UNSUBSCRIBE handlers of a 3.1.1 Channel (a mixin)."""

    __slots__ = ()

    if TYPE_CHECKING:  # what the handlers use of the Channel
        broker: Broker
        session: Session | None
        peer_node: str | None
        username: str | None
        client_id: str

        def _send_after(self, frame: bytes, batch: Batch, ticket: int = 0) -> None: ...

    def _on_subscribe(self, pkt: codec.Subscribe, now: float) -> None:
        broker = self.broker
        session: Session = self.session  # type: ignore[assignment]  # (CONNECTED: it has one)
        journal = broker.journal
        mark = journal.mark()
        codes = []
        granted_filters = []
        for topic_filter, qos in pkt.topics:  # as a sequence of SUBSCRIBEs [MQTT-3.8.4-4]
            if self.peer_node is not None:
                # a peer link may only take its own $mesh/to/<node>/... topics; the client
                # ACL is not about peers (they proved the cluster secret)
                refused = not topic_filter.startswith(f"$mesh/to/{self.peer_node}/")
            else:  # (a shared subscription too, where taken: shared.py)
                refused = refusal(broker, self.username, self.client_id, topic_filter, session.clean) != 0
            if refused:
                codes.append(0x80)
                continue
            granted = min(qos, broker.settings.max_qos)
            broker.table.subscribe(session, topic_filter, granted)
            codes.append(granted)
            if not topic_filter.startswith("$share/"):  # (a shared one gets no retained messages)
                granted_filters.append((topic_filter, granted))
        self._send_after(codec.encode(codec.SubAck(pkt.packet_id, codes)), journal.since(mark))  # [MQTT-3.8.4-1,5]
        for topic_filter, granted in granted_filters:
            broker.send_retained(session, topic_filter, granted, now)  # [MQTT-3.8.4-3]

    def _on_unsubscribe(self, pkt: codec.Unsubscribe, now: float) -> None:
        broker = self.broker
        journal = broker.journal
        mark = journal.mark()
        session: Session = self.session  # type: ignore[assignment]  # (CONNECTED: it has one)
        for topic_filter in pkt.filters:  # [MQTT-3.10.4-6]
            broker.table.unsubscribe(session, topic_filter, now)
        self._send_after(ack_frame(0xB0, pkt.packet_id), journal.since(mark))  # even if nothing matched [MQTT-3.10.4-5]
