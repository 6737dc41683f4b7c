"""The dialling side of a peer link: a plain MQTT 3.1.1 client state machine.

Pure: bytes and times in, bytes and events out. A node that dials a peer is an
ordinary MQTT client of the peer's listener [MQTT-7.0.0-1]: CONNECT with the
cluster credentials, SUBSCRIBE to its own ``$mesh/to/<node>/#`` topic, then
PUBLISH (QoS 0/1) both ways, PINGREQ for keepalive and round-trip time. It
leaves to its caller the socket, the clock and what the messages mean.

Unacknowledged QoS 1 PUBLISH packets survive a reconnect and are re-sent with
DUP=1 and their packet ids after the new CONNACK [MQTT-4.4.0-1].
"""

from __future__ import annotations

from collections import deque

from ..codec import (CONNACK, PINGRESP, PUBACK, PUBLISH, SUBACK, Connect, Decoder, MalformedPacket,
                     PubAck, Subscribe, encode, encode_publish)

__all__ = ["LinkClient"]

_PINGREQ = b"\xc0\x00"


class LinkClient:
    def __init__(self, client_id: str, username: str, password_fn, keepalive: float,
                 subscribe_filter: str, max_inflight: int = 100, max_queued: int = 100_000):
        self.client_id = client_id
        self.username = username
        self.password_fn = password_fn     # called at each CONNECT: tokens carry a timestamp
        self.keepalive = keepalive          # seconds between PINGREQs; dead after 3 x this
        self.subscribe_filter = subscribe_filter
        self.max_inflight = max_inflight
        self.max_queued = max_queued
        self.inflight: dict[int, bytes] = {}   # packet id -> frame, in send order
        self.queue: deque[tuple[bytes, bytes, int]] = deque()
        self.dropped = 0
        self._next_pid = 1
        self._reset()

    def _reset(self) -> None:
        self.state = "idle"
        self.decoder = Decoder()
        self._out: list[bytes] = []
        self.last_rx = 0.0
        self._last_ping = 0.0
        self._ping_sent: float | None = None
        self._subscribe_sent = 0.0
        self.session_present = False

    # -- connection life -------------------------------------------------------------

    def connection_made(self, now: float) -> None:
        self._reset()
        self.state = "connecting"
        self.last_rx = self._last_ping = now
        # CONNECT's keepalive is twice our ping interval, so the peer drops a dead
        # link after 1.5 x 2 = 3 ping intervals, as we do [MQTT-3.1.2-24]
        self._out.append(encode(Connect(self.client_id, clean_session=False,
                                        keepalive=max(1, int(round(2 * self.keepalive))),
                                        username=self.username, password=self.password_fn())))

    def connection_lost(self) -> None:
        self.state = "idle"

    def receive_data(self, data: bytes, now: float) -> list[tuple]:
        """Events: ("ready", rtt), ("refused", rc), ("message", topic, payload), ("rtt", seconds).

        The rtt of "ready" is the SUBSCRIBE/SUBACK round trip: the link's first cost sample.
        """
        self.last_rx = now
        self.decoder.feed(data)
        events: list[tuple] = []
        try:
            for pkt in self.decoder.packets():
                t = pkt.type
                if t == PUBLISH:
                    if pkt.qos:
                        self._out.append(encode(PubAck(pkt.packet_id)))
                    events.append(("message", pkt.topic, pkt.payload))
                elif t == PUBACK:
                    if self.inflight.pop(pkt.packet_id, None) is not None:
                        self._refill()
                elif t == PINGRESP:
                    if self._ping_sent is not None:
                        events.append(("rtt", now - self._ping_sent))
                        self._ping_sent = None
                elif t == CONNACK and self.state == "connecting":
                    if pkt.return_code != 0:
                        events.append(("refused", pkt.return_code))
                        self.state = "refused"
                        return events
                    self.session_present = pkt.session_present
                    self.state = "subscribing"
                    self._subscribe_sent = now
                    self._out.append(encode(Subscribe(1, [(self.subscribe_filter, 1)])))
                elif t == SUBACK and self.state == "subscribing":
                    if pkt.return_codes[0] == 0x80:
                        events.append(("refused", 0x80))
                        self.state = "refused"
                        return events
                    self.state = "ready"
                    for pid, frame in self.inflight.items():  # [MQTT-4.4.0-1], DUP=1
                        self._out.append(bytes((frame[0] | 0x08,)) + frame[1:])
                    self._refill()
                    events.append(("ready", now - self._subscribe_sent))
                else:
                    events.append(("protocol_error", f"unexpected packet type {t} in state {self.state}"))
                    self.state = "refused"
                    return events
        except MalformedPacket as exc:
            events.append(("protocol_error", str(exc)))
            self.state = "refused"
        return events

    # -- sending -------------------------------------------------------------------------

    def publish(self, topic: bytes, payload: bytes, qos: int) -> None:
        if qos == 0:
            if self.state == "ready":
                self._out.append(encode_publish(topic, payload))
            return  # QoS 0 on a link that is down is lost, as MQTT says
        if self.state == "ready" and not self.queue and len(self.inflight) < self.max_inflight:
            self._send(topic, payload)
        elif len(self.queue) < self.max_queued:
            self.queue.append((topic, payload, qos))
        else:
            self.dropped += 1

    def _send(self, topic: bytes, payload: bytes) -> None:
        pid = self._next_pid
        while pid in self.inflight:
            pid = pid % 65535 + 1
        self._next_pid = pid % 65535 + 1
        frame = encode_publish(topic, payload, 1, False, False, pid)
        self.inflight[pid] = frame
        self._out.append(frame)

    def _refill(self) -> None:
        while self.queue and len(self.inflight) < self.max_inflight and self.state == "ready":
            topic, payload, qos = self.queue.popleft()
            self._send(topic, payload)

    def data_to_send(self) -> bytes:
        out = self._out
        if not out:
            return b""
        self._out = []
        return b"".join(out)

    # -- time ---------------------------------------------------------------------------------

    def tick(self, now: float) -> str | None:
        """Send a PINGREQ when due; a reason string when the link is to be declared dead."""
        if self.state in ("idle", "refused"):
            return None
        if now - self.last_rx > 3 * self.keepalive:
            return f"nothing received for {now - self.last_rx:.1f}s (3 x keepalive {self.keepalive:g}s)"
        # a PINGREQ every keepalive, busy or not, answered or not (we may have stopped
        # reading for flow control): it keeps the link alive and measures it
        if now - self._last_ping >= self.keepalive * 0.999:
            self._last_ping = now
            if self._ping_sent is None:
                self._ping_sent = now
            self._out.append(_PINGREQ)
        return None
