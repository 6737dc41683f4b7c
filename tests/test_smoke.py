"""The broker process starts, accepts a paho client and relays one message."""

import queue

import paho.mqtt.client as mqtt
import pytest

from support.processes import wait_for

pytestmark = pytest.mark.process


def test_paho_roundtrip(broker):
    got = queue.Queue()
    sub = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="smoke-sub")
    sub.on_message = lambda c, u, m: got.put((m.topic, m.payload, m.qos, m.retain))
    subacked = []
    sub.on_subscribe = lambda c, u, mid, codes, props: subacked.append(mid)
    sub.connect(broker.host, broker.port)
    sub.loop_start()
    try:
        wait_for(lambda: sub.is_connected(), what="subscriber connected")
        sub.subscribe("smoke/#", qos=1)
        wait_for(lambda: subacked, what="SUBACK")
        pub = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="smoke-pub")
        pub.connect(broker.host, broker.port)
        pub.loop_start()
        info = pub.publish("smoke/a", b"hello", qos=1)
        info.wait_for_publish(5)
        assert got.get(timeout=5) == ("smoke/a", b"hello", 1, False)
        pub.disconnect()
        pub.loop_stop()
    finally:
        sub.disconnect()
        sub.loop_stop()
