"""Peer links are plain MQTT 3.1.1: captured bytes decode, credentials are required, $mesh is closed."""

from __future__ import annotations

import struct

import pytest

from mqttmesh.mesh.link.peerauth import PEER_PROTOCOL as V
from support import mqttraw as raw
from support.mesh import (
    SECRET,
    Subscriber,
    publish,
    relayed_mesh,
    split_packets,
    start_mesh,
    status,
    wait_converged,
    wait_interest,
)
from support.processes import wait_for

pytestmark = pytest.mark.process

CLIENT_TYPES = {
    raw.CONNECT,
    raw.PUBLISH,
    raw.PUBACK,
    raw.PUBREC,
    raw.PUBREL,
    raw.PUBCOMP,
    raw.SUBSCRIBE,
    raw.UNSUBSCRIBE,
    raw.PINGREQ,
    raw.DISCONNECT,
}
SERVER_TYPES = {
    raw.CONNACK,
    raw.PUBLISH,
    raw.PUBACK,
    raw.PUBREC,
    raw.PUBREL,
    raw.PUBCOMP,
    raw.SUBACK,
    raw.UNSUBACK,
    raw.PINGRESP,
}
REQUIRED_FLAGS = {raw.PUBREL: 2, raw.SUBSCRIBE: 2, raw.UNSUBSCRIBE: 2}


def check_valid(packets, allowed):
    for first, body in packets:
        ptype, flags = first >> 4, first & 0x0F
        assert ptype in allowed, f"packet type {ptype} in this direction"
        if ptype == raw.PUBLISH:
            qos = (flags >> 1) & 3
            assert qos in (0, 1, 2)
            tlen = struct.unpack(">H", body[:2])[0]
            topic = body[2 : 2 + tlen].decode("utf-8")
            assert topic.startswith("$mesh/") and "+" not in topic and "#" not in topic
        else:
            assert flags == REQUIRED_FLAGS.get(ptype, 0), f"reserved flags of type {ptype}"
        if ptype in (raw.PINGREQ, raw.PINGRESP):
            assert body == b"", "bytes added to PINGREQ/PINGRESP"
        if ptype == raw.CONNECT:
            assert body[:6] == b"\x00\x04MQTT" and body[6] == 4, "protocol name and level 4"


def test_peer_link_capture_decodes_as_valid_mqtt_311(broker_factory):
    with relayed_mesh(
        broker_factory, ["b", "a"], [("a", "b")], relayed=[("a", "b")], record=True, extra=("--mesh-keepalive", "0.2")
    ) as (nodes, relays):
        relay = relays[("a", "b")]
        wait_converged(nodes, [("a", "b")])
        sub = Subscriber(nodes["b"], "cap-sub", "cap/#", qos=1)
        sub_a = Subscriber(nodes["a"], "cap-sub-a", "back/#", qos=1)
        try:
            wait_interest(nodes, "cap/#", "b")
            wait_interest(nodes, "back/#", "a")
            for qos in (0, 1, 2):
                publish(nodes["a"], "cap/x", [b"payload"] * 5, qos=qos)
                publish(nodes["b"], "back/y", [b"payload"] * 5, qos=qos)
            sub.wait_count(15)
            sub_a.wait_count(15)
            wait_for(
                lambda: status(nodes["a"])["neighbours"]["b"]["srtt_us"] is not None,
                what="a PINGREQ round trip on the link",
            )
        finally:
            sub.close()
            sub_a.close()
        to_server = split_packets(relay.captured(True))
        to_client = split_packets(relay.captured(False))
        check_valid(to_server, CLIENT_TYPES)
        check_valid(to_client, SERVER_TYPES)
        assert to_server[0][0] >> 4 == raw.CONNECT  # [MQTT-3.1.0-1]
        assert to_client[0][0] >> 4 == raw.CONNACK  # [MQTT-3.2.0-1]
        assert any(f >> 4 == raw.PINGREQ for f, _ in to_server)
        assert sum(1 for f, _ in to_server if f >> 4 == raw.PUBLISH) >= 3
        assert sum(1 for f, _ in to_client if f >> 4 == raw.PUBLISH) >= 3


def test_peer_connect_refusals(broker_factory):
    """A peer CONNECT that cannot start the handshake is refused with a CONNACK code."""
    node = broker_factory("--cluster-secret", SECRET)
    nonce = "ab" * 16
    with raw.RawClient(node.host, node.port) as c:
        ack = c.connect(client_id="$mesh-other", username="mqttmesh-peer", password=f"{V}|p|1|{nonce}", clean=False)
        assert ack.body == b"\x00\x02"  # the ClientId must be $mesh-<node>
        c.expect_closed()
    with raw.RawClient(node.host, node.port) as c:
        ack = c.connect(client_id="$mesh-p", username="mqttmesh-peer", password=f"{V}|p|1|short".encode(), clean=False)
        assert ack.body == b"\x00\x04"  # malformed credentials
        c.expect_closed()
    with raw.RawClient(node.host, node.port) as c:
        ack = c.connect(client_id="$mesh-node1", username="mqttmesh-peer", password=f"{V}|node1|1|{nonce}", clean=False)
        assert ack.body == b"\x00\x04"  # a peer with this node's own id
    with raw.RawClient(node.host, node.port) as c:
        ack = c.connect(client_id="$mesh-x", username="someone")
        assert ack.body == b"\x00\x02"  # $mesh ClientIds are reserved for peer links
    plain = broker_factory(name="plain")
    with raw.RawClient(plain.host, plain.port) as c:
        ack = c.connect(client_id="$mesh-p", username="mqttmesh-peer", password=f"{V}|p|1|{nonce}", clean=False)
        assert ack.body == b"\x00\x05"  # not a mesh node: not authorized


def test_ordinary_client_cannot_publish_or_subscribe_to_mesh_topics(broker_factory):
    nodes = start_mesh(broker_factory, ["a", "b"], [("a", "b")])
    wait_converged(nodes, [("a", "b")])
    with raw.RawClient(nodes["b"].host, nodes["b"].port) as c:
        c.connect(client_id="nosy")
        c.send(raw.subscribe(1, ("$mesh/#", 1), ("$mesh/to/a/#", 0), ("ok/#", 0)))
        assert c.expect(raw.SUBACK).body[2:] == b"\x80\x80\x00"
        # publishing into the mesh's topics is acknowledged and dropped [MQTT-3.3.5-2]
        c.send(raw.publish("$mesh/from/a/lsa", b"[]", 1, pid=7))
        assert c.expect(raw.PUBACK).packet_id == 7
    assert set(status(nodes["b"])["nodes"]) == {"a", "b"}


def test_many_subscribers_to_one_filter_cost_one_advertisement(broker_factory):
    nodes = start_mesh(broker_factory, ["a", "b"], [("a", "b")])
    wait_converged(nodes, [("a", "b")])
    before = status(nodes["a"])["counters"]["interest_originated"]
    clients = []
    try:
        for i in range(30):
            c = raw.RawClient(nodes["a"].host, nodes["a"].port)
            c.connect(client_id=f"same-{i}")
            c.send(raw.subscribe(1, ("same/filter/#", 1)))
            c.expect(raw.SUBACK)
            clients.append(c)
        # a storm of 100 distinct filters in one SUBSCRIBE: batched into few advertisements
        storm = raw.RawClient(nodes["a"].host, nodes["a"].port)
        storm.connect(client_id="storm")
        storm.send(raw.subscribe(2, *[(f"storm/{i}", 0) for i in range(100)]))
        storm.expect(raw.SUBACK)
        clients.append(storm)
        wait_for(
            lambda: len(status(nodes["b"])["nodes"]["a"]["filters"]) == 101,
            10,
            what="b to learn a's 101 distinct filters",
        )
        # (a's status document is refreshed every 0.1 s: wait for it to catch up)
        wait_for(lambda: status(nodes["a"])["counters"]["interest_originated"] - before >= 2, what="a's counters")
        after = status(nodes["a"])["counters"]["interest_originated"]
        # one advertisement for the 30 subscribers of one filter, one for the storm
        assert after - before == 2, (before, after)
        # the 30 subscribers of one filter changed the advertised set once
        assert status(nodes["b"])["nodes"]["a"]["filters"].count("same/filter/#") == 1
    finally:
        for c in clients:
            c.close()
