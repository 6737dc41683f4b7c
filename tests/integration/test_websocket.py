"""MQTT over WebSocket (issue 22 point 2; MQTT 3.1.1 section 6, RFC 6455): paho-mqtt over
``ws://`` and ``wss://``, and a raw WebSocket client (tests/support/wsraw.py) for what a bad
client does. The WebSocket listener feeds the same Channel as TCP: the limits and the will
behave as they do there."""

from __future__ import annotations

import shutil
import time

import paho.mqtt.client as mqtt
import pytest

from support import mqttraw
from support.integration import Client, connack, control_roundtrip
from support.mesh import start_mesh, wait_converged, wait_interest
from support.pki import make_pki
from support.processes import free_port, wait_for
from support.wsraw import BINARY, CLOSE, TEXT, HandshakeRefused, WsClient, frame

pytestmark = [pytest.mark.process]

CONNACK, SUBACK, PINGRESP, PUBLISH = 2, 9, 13, 3


def ws_broker(broker_factory, *extra: str, name: str | None = None):
    port = free_port()
    b = broker_factory("--ws-port", str(port), *extra, name=name)
    b.ws_port = port
    return b


def _ws(broker) -> WsClient:
    return WsClient(broker.host, broker.ws_port)


class MqttStream:
    """MQTT packets out of the binary frames of a WsClient (they may span frames)."""

    def __init__(self, ws: WsClient):
        self.ws = ws
        self.data = b""

    def packets(self, n: int, timeout: float = 5.0) -> list[mqttraw.Packet]:
        deadline = time.monotonic() + timeout
        out: list[mqttraw.Packet] = []
        while True:
            while True:
                parsed = _one(self.data)
                if parsed is None:
                    break
                packet, used = parsed
                self.data = self.data[used:]
                out.append(packet)
                if len(out) == n:
                    return out
            opcode, payload = self.ws.recv_frame(max(0.0, deadline - time.monotonic()))
            assert opcode == BINARY, f"opcode {opcode}: {payload!r} [MQTT-6.0.0-1]"
            self.data += payload


def _one(data: bytes) -> tuple[mqttraw.Packet, int] | None:
    if len(data) < 2:
        return None
    mult, length, i = 1, 0, 1
    while True:
        if i >= len(data):
            return None
        b = data[i]
        length += (b & 0x7F) * mult
        mult *= 128
        i += 1
        if not b & 0x80:
            break
    if len(data) < i + length:
        return None
    return mqttraw.Packet(data[0], data[i : i + length]), i + length


def _paho_ws(broker, client_id: str, port: int | None = None, tls_ca: str | None = None):
    got: list = []
    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id, transport="websockets")
    c.ws_set_options(path="/mqtt")
    if tls_ca:
        c.tls_set(ca_certs=tls_ca)
    c.on_message = lambda cl, u, m: got.append((m.topic, bytes(m.payload), m.qos))
    subacked: list = []
    c.on_subscribe = lambda cl, u, mid, codes, props: subacked.append(mid)
    c.connect(broker.host, port or broker.ws_port, keepalive=30)
    c.loop_start()
    wait_for(c.is_connected, 10, what=f"{client_id} connected over WebSocket")
    return c, got, subacked


def test_paho_over_websocket_and_a_tcp_client_exchange_messages(broker_factory):
    """A browser-like client and a TCP client on one node: QoS 1 both ways."""
    b = ws_broker(broker_factory)
    c, got, subacked = _paho_ws(b, "ws-client")
    try:
        c.subscribe("ws/#", qos=1)
        wait_for(lambda: subacked, what="SUBACK over WebSocket")
        with Client(b.host, b.port) as tcp:
            assert connack(tcp.connect(client_id="tcp-client"))[1] == 0
            assert tcp.sub(1, ("tcp/#", 1)) == [1]
            tcp.pub("ws/in", b"from tcp", qos=1, pid=1)
            wait_for(lambda: got, what="the TCP client's message over WebSocket")
            assert got == [("ws/in", b"from tcp", 1)]
            c.publish("tcp/in", b"from ws", qos=1).wait_for_publish(5)
            (p,) = tcp.publishes(1)
            assert (p.topic, p.payload, p.qos) == ("tcp/in", b"from ws", 1)
    finally:
        c.disconnect()
        c.loop_stop()


def test_the_server_selects_the_mqtt_subprotocol(broker_factory):
    """[MQTT-6.0.0-4] whatever else the client offers beside it."""
    b = ws_broker(broker_factory)
    with _ws(b) as ws:
        assert ws.request(protocols="chat, mqtt").subprotocol == "mqtt"


def test_packets_span_frames_and_frames_hold_several_packets(broker_factory):
    """[MQTT-6.0.0-2]: a CONNECT cut into three frames, then SUBSCRIBE and PINGREQ in one."""
    b = ws_broker(broker_factory)
    with _ws(b) as ws:
        ws.request()
        stream = MqttStream(ws)
        connect = mqttraw.connect(client_id="split")
        for part in (connect[:3], connect[3:9], connect[9:]):
            ws.send_binary(part)
        (p,) = stream.packets(1)
        assert p.type == CONNACK and p.body == b"\x00\x00"
        ws.send_binary(mqttraw.subscribe(1, ("a/b", 0)) + mqttraw.PINGREQ_BYTES)
        suback, pingresp = stream.packets(2)
        assert (suback.type, suback.body) == (SUBACK, b"\x00\x01\x00") and pingresp.type == PINGRESP


@pytest.mark.parametrize(
    "kwargs, status",
    [
        ({"path": "/other"}, 404),
        ({"protocols": None}, 400),  # no "mqtt" offered [MQTT-6.0.0-3]
        ({"protocols": "chat"}, 400),
        ({"version": "8"}, 426),
        ({"raw": b"GET /mqtt HTTP/1.1\r\nHost: x\r\n\r\n"}, 400),  # not an upgrade
        ({"raw": b"NOT HTTP AT ALL\r\n\r\n"}, 400),
        ({"raw": b"GET /mqtt HTTP/1.1\r\nX-Big: " + b"a" * 20_000 + b"\r\n\r\n"}, 400),  # over 16 KiB
    ],
)
def test_a_bad_upgrade_is_refused_and_the_node_goes_on(broker_factory, kwargs, status):
    b = ws_broker(broker_factory)
    with _ws(b) as ws:
        with pytest.raises(HandshakeRefused) as refused:
            ws.request(**kwargs)
        assert refused.value.status == status
        wait_for(lambda: _ended(ws), 5, what="the connection to close after the refusal")
    control_roundtrip(b, "after-bad-upgrade")


def _ended(ws: WsClient) -> bool:
    try:
        return ws.closed(0.2)
    except TimeoutError:
        return False


def _will_watcher(b, topic: str) -> Client:
    watcher = Client(b.host, b.port)
    assert connack(watcher.connect(client_id=f"watch-{topic.replace('/', '-')}"))[1] == 0
    assert watcher.sub(1, (topic, 0)) == [0]
    return watcher


def _connected_ws(b, client_id: str, will_topic: str) -> tuple[WsClient, MqttStream]:
    ws = _ws(b).request()
    stream = MqttStream(ws)
    ws.send_binary(mqttraw.connect(client_id=client_id, will=(will_topic, b"gone", 0, False)))
    (p,) = stream.packets(1)
    assert p.type == CONNACK and p.body == b"\x00\x00"
    return ws, stream


def test_a_text_frame_closes_with_1003_and_the_will_is_published(broker_factory):
    """[MQTT-6.0.0-1]: any other data frame than binary closes the network connection, as a
    protocol error: the will goes out."""
    b = ws_broker(broker_factory)
    with _will_watcher(b, "will/text") as watcher:
        ws, _ = _connected_ws(b, "texter", "will/text")
        with ws:
            ws.send(frame(TEXT, b"\x10\x00"))
            opcode, payload = ws.recv_frame()
            assert opcode == CLOSE and ws.close_code == 1003
            assert ws.closed()
        (p,) = watcher.publishes(1)
        assert (p.topic, p.payload) == ("will/text", b"gone")


def test_an_unmasked_client_frame_is_refused_with_1002(broker_factory):
    """RFC 6455 5.1: a server closes the connection on an unmasked client frame."""
    b = ws_broker(broker_factory)
    with _will_watcher(b, "will/unmasked") as watcher:
        ws, _ = _connected_ws(b, "unmasked", "will/unmasked")
        with ws:
            ws.send(frame(BINARY, mqttraw.PINGREQ_BYTES, masked=False))
            opcode, _ = ws.recv_frame()
            assert opcode == CLOSE and ws.close_code == 1002
            assert ws.closed()
        (p,) = watcher.publishes(1)
        assert p.topic == "will/unmasked"


def test_the_packet_size_limit_holds_over_websocket(broker_factory):
    """limits.max_packet_size, as over TCP: a larger packet closes the connection."""
    b = ws_broker(broker_factory, "--max-packet-size", "1000")
    ws, _ = _connected_ws(b, "big", "will/big")
    with ws:
        ws.send_binary(mqttraw.publish("big/x", b"x" * 2000))
        assert ws.closed()
    control_roundtrip(b, "after-big")


def test_the_connect_timeout_counts_from_accept_without_an_upgrade(broker_factory):
    b = ws_broker(broker_factory, "--connect-timeout", "1")
    with _ws(b) as ws:
        started = time.monotonic()
        assert ws.closed(10.0)  # (nothing sent: not even the HTTP request)
        assert time.monotonic() - started < 5.0


def test_a_client_closing_with_a_close_frame_gets_its_answer(broker_factory):
    """A close frame without DISCONNECT ends the connection as a TCP close would: the
    server answers the close, and the will goes out."""
    b = ws_broker(broker_factory)
    with _will_watcher(b, "will/closed") as watcher:
        ws, _ = _connected_ws(b, "closer", "will/closed")
        with ws:
            ws.send(frame(CLOSE, b"\x03\xe8"))  # 1000
            opcode, _ = ws.recv_frame()
            assert opcode == CLOSE and ws.close_code == 1000
            assert ws.closed()
        (p,) = watcher.publishes(1)
        assert p.topic == "will/closed"


def test_a_websocket_client_and_a_tcp_client_on_different_nodes(broker_factory):
    """Across a 3-node mesh: the WebSocket client on a, the TCP client on c."""
    names = ["a", "b", "c"]
    edges = [("b", "a"), ("c", "a"), ("c", "b")]
    ws_port = free_port()
    nodes = start_mesh(broker_factory, names, edges, connect="all")
    wait_converged(nodes, edges)
    a = nodes["a"]
    a.stop()
    a.args += ["--ws-port", str(ws_port)]
    a.start()
    a.ws_port = ws_port
    wait_converged(nodes, edges)
    c, got, subacked = _paho_ws(a, "ws-mesh")
    try:
        c.subscribe("mesh/ws/#", qos=1)
        wait_for(lambda: subacked, what="SUBACK")
        wait_interest(nodes, "mesh/ws/#", "a")
        with Client(nodes["c"].host, nodes["c"].port) as tcp:
            assert connack(tcp.connect(client_id="tcp-on-c"))[1] == 0
            for i in range(20):
                tcp.pub("mesh/ws/x", b"%d" % i, qos=1, pid=i + 1)
            wait_for(lambda: len(got) >= 20, 10, what="20 messages from c over a's WebSocket")
        assert [p for _, p, _ in got] == [b"%d" % i for i in range(20)]
    finally:
        c.disconnect()
        c.loop_stop()


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
def test_paho_over_secure_websocket(broker_factory, tmp_path):
    pki = make_pki(tmp_path / "pki")
    wss = free_port()
    b = broker_factory("--wss-port", str(wss), "--tls-cert", str(pki / "node.pem"), "--tls-key", str(pki / "node.key"))
    c, got, subacked = _paho_ws(b, "wss-client", port=wss, tls_ca=str(pki / "ca.pem"))
    try:
        c.subscribe("secure/#", qos=1)
        wait_for(lambda: subacked, what="SUBACK over wss")
        c.publish("secure/x", b"over wss", qos=1).wait_for_publish(5)
        wait_for(lambda: got, what="the message back over wss")
        assert got == [("secure/x", b"over wss", 1)]
    finally:
        c.disconnect()
        c.loop_stop()
