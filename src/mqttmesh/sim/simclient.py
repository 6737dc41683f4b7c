"""The simulator's MQTT clients as the cluster mode runs them (sim/sessions.py): a client
(``SimClient``: its sans-I/O ``MqttClient``, what it asks for as MQTT 5, ``Mqtt5``, and its
place in the workload) and each of its connections to a node (``SimConnection``, the
Channel's ``ports.Owner``)."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from ..channel import Channel
from .model import Node
from .mqttclient import MqttClient

__all__ = ["Mqtt5", "SimClient", "SimConnection"]


class SimConnection:
    """One client connection to a node; the Channel's owner (ports.Owner)."""

    def __init__(self, sim: Any, conn_id: str, client: SimClient, node: Node, latency: float, now: float):
        self.sim = sim
        self.id = conn_id
        self.client = client
        self.node = node.name
        self.gen = node.gen
        self.latency = latency
        self.to_node = 0.0  # FIFO per direction: the last arrival time
        self.to_client = 0.0
        self.server_open = True
        self.flush_due = False
        self.paused = False
        self.held: list[bytes | None] = []
        self.channel: Channel = node.core.channel(self, f"sim:{client.name}", now)

    # -- ports.Owner ----------------------------------------------------------------
    def wake(self, channel: Channel) -> None:
        if not self.flush_due:
            self.flush_due = True
            self.sim._woken(self)

    def close(self, channel: Channel, reason: str) -> None:
        self.sim._server_closed(self, reason)

    def authenticate(self, channel: Channel, username: str | None, password: bytes | None) -> None:
        channel.authenticated(0, self.sim.now)

    def connected(self, channel: Channel) -> None:
        pass

    def pause_reading(self, channel: Channel) -> None:
        self.paused = True

    def resume_reading(self, channel: Channel) -> None:
        if self.paused:
            self.paused = False
            held, self.held = self.held, []
            for data in held:
                self.sim._to_node_now(self, data)


@dataclass
class Mqtt5:
    """What an MQTT 5 client asks for, and its own random stream (``{seed}/mqtt5/{name}``)."""

    rng: random.Random
    clean_start: bool = False  # a subscriber's every CONNECT: Clean Start 1, with its interval
    expiry: int = 0  # a subscriber's Session Expiry Interval

    def info(self, will_delay: int) -> dict[str, Any]:
        """What its CONNECT asked for, as the history records it (sim/history.py)."""
        return {"clean_start": self.clean_start, "expiry": self.expiry, "will_delay": will_delay}


class SimClient:
    def __init__(
        self,
        name: str,
        persistent: bool,
        keepalive: int,
        home: str,
        v5: Mqtt5 | None = None,
        publisher: bool = False,
    ):
        self.name = name
        self.persistent = persistent
        self.publisher = publisher  # (a persistent one is no subscriber: it has no will, subscribes to nothing)
        self.publishing = False  # a persistent publisher's publications are scheduled
        self.v5 = v5
        if v5 is None:
            self.mqtt = MqttClient(name, clean=not persistent, keepalive=keepalive)
        else:
            clean = v5.clean_start or not persistent
            self.mqtt = MqttClient(name, clean=clean, keepalive=keepalive, version=5, session_expiry=v5.expiry)
        self.conn: SimConnection | None = None
        self.home = home  # the node it connects to next
        self.n = 0  # publications so far
        self.k = 0  # connections so far
        self.subscribed = False
        self.pending: dict[int, str] = {}  # packet id -> message id, not yet acknowledged
        self.connect_due = False
        self.move_at = -1.0  # the one move scheduled (an older one is stale)
        # a shared group's member (sim/members.py): its "$share/..." filter, the QoS it asks for,
        # the nodes of its group, and whether it is a member now; a persistent one's: whether
        # its session has the subscription (a SUBACK said so, no UNSUBSCRIBE since) and its QoS
        self.share: str | None = None
        self.share_qos = 0
        self.share_nodes: list[str] = []
        self.member = False
        self.share_held = False
        self.share_granted = -1
