"""Helpers for the unit tests of the pure cores (no sockets, no clock, no sleeps).

Frames written by the code under test are split and read here with a parser
of our own (written from section 2.2 of the standard), never with
``mqttmesh.codec``, so a bug mirrored in our encoder and decoder cannot hide.
"""

from __future__ import annotations

import hashlib
import hmac
import struct

from mqttmesh.message import Message
from support import mqttraw


def split_frames(data: bytes) -> list[mqttraw.Packet]:
    """Cut a byte string into whole MQTT packets; leftover bytes are an error."""
    frames = []
    pos = 0
    while pos < len(data):
        first = data[pos]
        length, mult, i = 0, 1, pos + 1
        while True:
            byte = data[i]
            length += (byte & 0x7F) * mult
            mult *= 128
            i += 1
            if not byte & 0x80:
                break
        body = data[i : i + length]
        assert len(body) == length, f"truncated frame in {data!r}"
        frames.append(mqttraw.Packet(first, body))
        pos = i + length
    return frames


def publish_fields(frame: mqttraw.Packet) -> tuple:
    """(topic, payload, qos, retain, dup, packet id or None) of a PUBLISH frame."""
    assert frame.type == mqttraw.PUBLISH, frame
    pid = frame.packet_id if frame.qos else None
    return frame.topic, frame.payload, frame.qos, frame.retain, frame.dup, pid


def ack(first: int, pid: int) -> bytes:
    return bytes([first, 2]) + struct.pack(">H", pid)


class Recorder:
    """The owner of Channels (a ports.Owner): records every call the pure core makes on it."""

    def __init__(self):
        self.wakes = []
        self.closes = []  # (channel, reason)
        self.auth_requests = []  # (channel, user, password)
        self.connects = []  # channels whose CONNECT finished after a mesh claim
        self.paused = []
        self.resumed = []

    def wake(self, channel):
        self.wakes.append(channel)

    def close(self, channel, reason):
        self.closes.append((channel, reason))

    def authenticate(self, channel, user, password):
        self.auth_requests.append((channel, user, password))

    def connected(self, channel):
        self.connects.append(channel)

    def pause_reading(self, channel):
        self.paused.append(channel)

    def resume_reading(self, channel):
        self.resumed.append(channel)

    def reasons(self, channel) -> list[str]:
        return [reason for ch, reason in self.closes if ch is channel]


class FakeChannel:
    """What a Session writes to: records every frame (3.1.1's)."""

    frame = staticmethod(Message.frame)
    frame0 = staticmethod(Message.frame_qos0)

    def __init__(self):
        self.frames: list[bytes] = []
        self.state = "connected"
        self.owner = Recorder()
        self.blocked = False

    def write(self, frame: bytes) -> None:
        self.frames.append(bytes(frame))

    def write_expiring(self, msg, qos, packet_id, dup, retain, ticket=0) -> None:
        self.frames.append(self.frame(msg, qos, packet_id, dup, retain))

    def packets(self) -> list[mqttraw.Packet]:
        return split_frames(b"".join(self.frames))

    def take(self) -> list[mqttraw.Packet]:
        out = self.packets()
        self.frames.clear()
        return out


# --------------------------------------------------------------------------- a broker with channels


class Net:
    """One pure Broker and the Channels of its clients, all driven by explicit times."""

    def __init__(self, journal=None, auth=None, ports=None, peers=None, claims=None, **settings):
        from mqttmesh.broker import Broker, BrokerPorts, BrokerSettings

        settings.setdefault("node_id", "n1")
        self.broker = Broker(BrokerSettings(**settings), auth, journal, ports or BrokerPorts())
        self.owner = Recorder()
        self.peers = peers  # the Channels' PeerPort (a mesh node), None: none
        self.claims = claims  # the Channels' ClaimPort

    @classmethod
    def of(cls, core) -> Net:
        """The channels of an assembled node (assembly.build_core), made by the core."""
        net = cls.__new__(cls)
        net.broker, net.owner, net.peers, net.claims = core.broker, Recorder(), core.links, core.cluster
        return net

    def committed(self, batch: int, now: float = 0.0) -> None:
        """The store committed ``batch`` at ``now``: release what waited for it (as
        assembly.NodeCore.committed does for a standalone node)."""
        for channel in self.broker.committed(batch):
            channel.release_acks(batch, now)

    def channel(self, now: float = 0.0, peer: str = "peer"):
        from mqttmesh.channel import Channel

        return Channel(self.broker, self.owner, peer, now, peers=self.peers, claims=self.claims)

    def connect(self, client_id: str = "c", now: float = 0.0, expect: bytes = b"\x20\x02\x00\x00", **kw):
        """A channel that sent CONNECT (mqttraw.connect keywords) and got ``expect`` back.

        The CONNACK is consumed; what followed it (re-sent messages) is left for ``out``.
        """
        ch = self.channel(now)
        ch.receive_data(mqttraw.connect(client_id, **kw), now)
        data = ch.data_to_send()
        journal = self.broker.journal
        if not data and journal is not None and len(journal):
            # a persistent session was created or discarded: CONNACK waits for the store
            self.committed(journal.batch)
            data = ch.data_to_send()
        assert data[:4] == expect, data
        _LEFTOVER[ch] = data[4:]
        return ch

    def subscriber(self, client_id: str, *filters, now: float = 0.0, pid: int = 1, **kw):
        """A connected client subscribed to ``filters`` ((filter, qos) pairs).

        The CONNACK and SUBACK are consumed; retained messages are left for ``out``.
        """
        ch = self.connect(client_id, now, **kw)
        ch.receive_data(mqttraw.subscribe(pid, *filters), now)
        frames = out(ch)
        assert frames[0].type == mqttraw.SUBACK, frames
        _LEFTOVER[ch] = b"".join(
            bytes([(f.type << 4) | f.flags]) + mqttraw.varint(len(f.body)) + f.body for f in frames[1:]
        )
        return ch


_LEFTOVER: dict = {}  # channel -> frames after a SUBACK, until ``out`` (a Channel takes no weak reference)


def out(channel) -> list[mqttraw.Packet]:
    """The packets a channel has written since the last call."""
    return split_frames(_LEFTOVER.pop(channel, b"") + channel.data_to_send())


def publishes(channel) -> list[tuple]:
    """(topic, payload, qos, retain, dup, pid) of every PUBLISH written since the last call."""
    return [publish_fields(p) for p in out(channel) if p.type == mqttraw.PUBLISH]


def v1_token(secret, node, incarnation, stamp):
    """Version 1's password, as the nodes before version 2 made it."""
    text = f"{node}|{incarnation}|{stamp}"
    mac = hmac.new(secret, f"mqttmesh-peer|{text}".encode(), hashlib.sha256).hexdigest()
    return f"{text}|{mac}".encode()
