"""A paho-mqtt 2.x MQTT 5 client for the integration tests: blocking connect and subscribe,
every message with its properties in a queue (the ``paho5`` fixture: tests/integration/conftest.py)."""

from __future__ import annotations

import queue

from support.processes import wait_for

__all__ = ["Paho5"]


class Paho5:
    """A paho-mqtt MQTT 5 client: blocking connect and subscribe, every message with its
    properties in a queue."""

    def __init__(self, client_id: str, websocket: bool = False):
        import paho.mqtt.client as mqtt
        from paho.mqtt.packettypes import PacketTypes
        from paho.mqtt.properties import Properties

        self.mqtt, self.Properties, self.PacketTypes = mqtt, Properties, PacketTypes
        transport = "websockets" if websocket else "tcp"
        self.c = mqtt.Client(
            mqtt.CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv5, transport=transport
        )
        if websocket:
            self.c.ws_set_options(path="/mqtt")
        self.messages: queue.Queue = queue.Queue()
        self.connacks: queue.Queue = queue.Queue()
        self.subacks: dict[int, list] = {}
        self.disconnects: queue.Queue = queue.Queue()
        self.c.on_message = lambda c, u, m: self.messages.put(m)
        self.c.on_connect = lambda c, u, flags, rc, props: self.connacks.put((rc, flags, props))
        self.c.on_subscribe = lambda c, u, mid, codes, props: self.subacks.__setitem__(mid, codes)
        self.c.on_disconnect = lambda c, u, flags, rc, props: self.disconnects.put(rc)
        self.started = False

    def props(self, packet: str, **values):
        p = self.Properties(getattr(self.PacketTypes, packet))
        for name, value in values.items():
            setattr(p, name, value)
        return p

    def connect(self, node, clean_start: bool = True, timeout: float = 5.0, port: int | None = None, **props):
        self.c.connect(
            node.host,
            port or node.port,
            60,
            clean_start=clean_start,
            properties=self.props("CONNECT", **props) if props else None,
        )
        self.c.loop_start()
        self.started = True
        return self.connacks.get(timeout=timeout)

    def subscribe(self, topic: str, qos: int = 1, timeout: float = 5.0, sub_id: int | None = None, **options):
        from paho.mqtt.subscribeoptions import SubscribeOptions

        props = self.props("SUBSCRIBE", SubscriptionIdentifier=sub_id) if sub_id else None
        result, mid = self.c.subscribe((topic, SubscribeOptions(qos=qos, **options)), properties=props)
        assert result == self.mqtt.MQTT_ERR_SUCCESS
        return wait_for(lambda: self.subacks.get(mid), timeout, what=f"SUBACK for {topic}")

    def publish(self, topic: str, payload: bytes, qos: int = 1, timeout: float = 5.0, **props):
        info = self.c.publish(topic, payload, qos, properties=self.props("PUBLISH", **props) if props else None)
        info.wait_for_publish(timeout)
        assert info.is_published()

    def get(self, timeout: float = 10.0):
        return self.messages.get(timeout=timeout)

    def stop(self) -> None:
        if self.started:
            self.started = False
            try:
                self.c.disconnect()
            finally:
                self.c.loop_stop()
