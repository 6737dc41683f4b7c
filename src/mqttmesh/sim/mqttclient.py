"""A sans-I/O MQTT 3.1.1 (or MQTT 5) client: bytes in, bytes and events out, no socket, no clock.

The simulator drives it over simulated connections to simulated nodes; nothing in
it knows about the simulator, so a harness over real sockets can drive the same
client (issue 15). It encodes and decodes with ``mqttmesh.codec``: the simulator
tests the cluster, not the codec, which has its own tests against independent
bytes (tests/mqttraw.py).

One client object is one MQTT client: its session state (unacknowledged outgoing
QoS 1/2 messages, incoming QoS 2 packet ids awaiting PUBREL, the packet-id
counter) outlives its network connections when it connects with CleanSession=0.
On every such reconnection it sends again, in their original order, each PUBLISH
not yet acknowledged (with DUP=1) and each PUBREL not yet completed, as
[MQTT-4.4.0-1] requires. With CleanSession=1 that state is dropped when the
connection ends [MQTT-3.1.2-6].

Events returned by ``receive_data`` and ``connection_lost`` (tuples, first field the kind):
``("connack", return_code, session_present)``, ``("suback", packet_id, codes)``, ``("unsuback", packet_id)``,
``("message", topic, payload, qos, dup, packet_id)`` (MQTT 5: one more field, the PUBLISH's
Message Expiry Interval or None) (new to this client: a QoS 2
PUBLISH re-sent for an id still awaiting PUBREL is acknowledged, not reported),
``("repeat", topic, payload, qos, dup, packet_id)`` (only with ``report_repeats``: a QoS 2
PUBLISH for an id still awaiting PUBREL, acknowledged again and not delivered; a harness
that checks packet-id reuse compares its payload with the one first taken on that id),
``("acked", packet_id, payload)`` (PUBACK, or PUBREC for QoS 2: the server owns the
message), ``("completed", packet_id)`` (PUBCOMP), ``("closed", reason)``.

With ``version=5`` it speaks MQTT 5 (``mqttmesh.codec5``): its CONNECT asks for
``session_expiry`` seconds (CleanSession=0 is Clean Start 0; a Clean Start 1 client may ask
for an interval too), and ``publish`` may give a message a Message Expiry Interval; the
events are the same (issue 23's fault-harness row). A CONNACK that says no session is
present makes it forget the incoming QoS 2 ids it awaited PUBREL for [MQTT-3.2.2-5].
"""

from __future__ import annotations

from typing import Any

from .. import codec
from .. import properties as P
from ..codec import (
    CONNACK,
    PUBACK,
    PUBCOMP,
    PUBLISH,
    PUBREC,
    PUBREL,
    SUBACK,
    UNSUBACK,
    Decoder,
    MalformedPacket,
    Will,
)
from ..codec5 import encode5

__all__ = ["MqttClient", "Outgoing", "Event"]

Event = tuple[Any, ...]


class Outgoing:
    """An outgoing QoS 1/2 message until it is acknowledged (PUBACK) or completed (PUBCOMP)."""

    __slots__ = ("packet_id", "topic", "payload", "qos", "state", "props")

    def __init__(self, packet_id: int, topic: str, payload: bytes, qos: int, props: dict[int, Any] | None = None):
        self.packet_id, self.topic, self.payload, self.qos = packet_id, topic, payload, qos
        self.props = props  # its MQTT 5 properties, sent again with it
        self.state = "publish"  # QoS 2 after PUBREC: "rel"


class MqttClient:
    def __init__(
        self,
        client_id: str,
        clean: bool,
        keepalive: int = 0,
        pid_range: int = 65535,
        report_repeats: bool = False,
        version: int = 4,
        session_expiry: int = 0,
    ):
        """``pid_range``: outgoing packet ids are taken from 1..pid_range only, an id free again
        as soon as its PUBACK or PUBCOMP arrives (as small embedded clients do; issue 15).
        ``report_repeats``: also return the "repeat" events (above). ``version``: 4 (3.1.1)
        or 5; ``session_expiry``: an MQTT 5 persistent session's interval, in seconds."""
        if version not in (4, 5):
            raise ValueError(f"version must be 4 or 5, not {version}")
        if not 1 <= pid_range <= 65535:
            raise ValueError(f"pid_range must be within 1..65535, not {pid_range}")
        self.client_id = client_id
        self.pid_range = pid_range
        self.report_repeats = report_repeats
        self.clean = clean
        self.keepalive = keepalive
        self.connected = False  # a CONNACK accepted the current connection
        self.open = False  # a network connection exists (CONNECT sent)
        self.outgoing: dict[int, Outgoing] = {}  # packet id -> message, in send order
        self.awaiting_rel: set[int] = set()  # incoming QoS 2 ids, PUBREC sent [MQTT-4.3.3-2]
        self._next_pid = 0
        self.version = version
        self.session_expiry = session_expiry
        self._encode = encode5 if version == 5 else codec.encode
        self._decoder = Decoder(version=version)
        self._out: list[bytes] = []

    # -- connections --------------------------------------------------------------------

    def connect(self, will: Will | None = None) -> None:
        """A new network connection: CONNECT goes out first."""
        self.open = True
        self.connected = False
        self._decoder = Decoder(version=self.version)
        if self.version == 5:
            # (Clean Start 1 may ask for an interval too: the session starts afresh and outlives
            # the connection; Clean Start 0 asks for its own, 0 included)
            props = {P.SESSION_EXPIRY: self.session_expiry} if not self.clean or self.session_expiry else None
            connect = codec.Connect(
                self.client_id, self.clean, self.keepalive, will, protocol_level=5, properties=props
            )
            self._out = [encode5(connect)]
            return
        self._out = [codec.encode(codec.Connect(self.client_id, self.clean, self.keepalive, will))]

    def disconnect(self) -> None:
        """A clean end: DISCONNECT, no will [MQTT-3.14.4-3]."""
        if self.open:
            self._out.append(self._encode(codec.Disconnect()))
        self._ended()

    def connection_lost(self) -> None:
        """The network connection is gone (or abandoned by the client)."""
        self._ended()

    def _ended(self) -> None:
        self.open = False
        self.connected = False
        if self.clean:
            self.outgoing.clear()  # the session ends with the connection [MQTT-3.1.2-6]
            self.awaiting_rel.clear()

    # -- what the application does --------------------------------------------------------

    def publish(self, topic: str, payload: bytes, qos: int, expiry: int | None = None) -> int:
        """Send (or, not connected, keep for the next connection of a persistent session);
        the packet id, 0 for QoS 0. ``expiry``: an MQTT 5 Message Expiry Interval."""
        props = {P.MESSAGE_EXPIRY: expiry} if expiry is not None and self.version == 5 else None
        if qos == 0:
            if self.connected:
                self._out.append(self._encode(codec.Publish(topic, payload, 0, properties=props)))
            return 0
        pid = self._alloc_pid()
        self.outgoing[pid] = Outgoing(pid, topic, payload, qos, props)
        if self.connected:
            self._out.append(self._encode(codec.Publish(topic, payload, qos, False, False, pid, props)))
        return pid

    def subscribe(self, filters: list[tuple[str, int]]) -> int:
        pid = self._alloc_pid()
        self._out.append(self._encode(codec.Subscribe(pid, filters)))
        return pid

    def unsubscribe(self, filters: list[str]) -> int:
        pid = self._alloc_pid()
        self._out.append(self._encode(codec.Unsubscribe(pid, filters)))
        return pid

    def ping(self) -> None:
        if self.connected:
            self._out.append(self._encode(codec.PingReq()))

    def _alloc_pid(self) -> int:
        for _ in range(self.pid_range):
            self._next_pid = self._next_pid % self.pid_range + 1  # ids are 1..65535 [MQTT-2.3.1-1]
            if self._next_pid not in self.outgoing:
                return self._next_pid
        raise RuntimeError("every packet id is in use")

    # -- bytes -------------------------------------------------------------------------------

    def data_to_send(self) -> bytes:
        out, self._out = self._out, []
        return b"".join(out)

    def receive_data(self, data: bytes) -> list[Event]:
        events: list[Event] = []
        self._decoder.feed(data)
        try:
            for pkt in self._decoder.packets():
                self._packet(pkt, events)
        except MalformedPacket as exc:
            events.append(("closed", f"malformed packet from the server: {exc}"))
            self._ended()
        return events

    def _packet(self, pkt: Any, events: list[Event]) -> None:
        t = pkt.type
        if t == PUBLISH:
            qos, pid = pkt.qos, pkt.packet_id
            extra = () if self.version != 5 else ((pkt.properties or {}).get(P.MESSAGE_EXPIRY),)
            if qos == 2:
                if pid not in self.awaiting_rel:
                    self.awaiting_rel.add(pid)
                    events.append(("message", pkt.topic, pkt.payload, qos, pkt.dup, pid, *extra))
                elif self.report_repeats:
                    events.append(("repeat", pkt.topic, pkt.payload, qos, pkt.dup, pid))
                self._out.append(self._encode(codec.PubRec(pid)))
                return
            events.append(("message", pkt.topic, pkt.payload, qos, pkt.dup, pid, *extra))
            if qos == 1:
                self._out.append(self._encode(codec.PubAck(pid)))
        elif t == PUBREL:
            self.awaiting_rel.discard(pkt.packet_id)
            self._out.append(self._encode(codec.PubComp(pkt.packet_id)))  # [MQTT-4.3.3-2]
        elif t == PUBACK:
            out = self.outgoing.pop(pkt.packet_id, None)
            if out is not None:
                events.append(("acked", pkt.packet_id, out.payload))
        elif t == PUBREC:
            out = self.outgoing.get(pkt.packet_id)
            if out is not None and out.qos == 2:
                if out.state == "publish":
                    out.state = "rel"
                    events.append(("acked", pkt.packet_id, out.payload))
                self._out.append(self._encode(codec.PubRel(pkt.packet_id)))
        elif t == PUBCOMP:
            out = self.outgoing.get(pkt.packet_id)
            if out is not None and out.state == "rel":
                del self.outgoing[pkt.packet_id]
                events.append(("completed", pkt.packet_id))
        elif t == CONNACK:
            events.append(("connack", pkt.return_code, pkt.session_present))
            if pkt.return_code == 0:
                self.connected = True
                if self.version == 5 and not pkt.session_present:
                    # the server has no session: the QoS 2 ids it was to release go [MQTT-3.2.2-5]
                    # (else a new message on one of them would be taken for a re-send); what
                    # this side had not got acknowledged is published again, as a new message
                    self.awaiting_rel.clear()
                self._resend()
        elif t == SUBACK:
            events.append(("suback", pkt.packet_id, list(pkt.return_codes)))
        elif t == UNSUBACK:
            events.append(("unsuback", pkt.packet_id))

    def _resend(self) -> None:
        """What the last connection left unacknowledged goes again, in order [MQTT-4.4.0-1]."""
        for out in self.outgoing.values():
            if out.state == "rel":
                self._out.append(self._encode(codec.PubRel(out.packet_id)))
            else:
                self._out.append(
                    self._encode(codec.Publish(out.topic, out.payload, out.qos, False, True, out.packet_id, out.props))
                )
