"""MQTT 5 with real clients, on one node and across a 3-node mesh (issue 23): paho-mqtt 2.x
with ``protocol=MQTTv5`` and Debian's ``mosquitto_pub``/``mosquitto_sub -V mqttv5``.
(MQTT.js with protocolVersion 5: tests/integration/test_mqttjs.py.)"""

from __future__ import annotations

import queue
import subprocess
import threading

import pytest

from support.mesh import wait_interest

pytestmark = [pytest.mark.process]


def test_mqtt5_over_websocket_beside_tcp(broker_factory, paho5):
    """The same MQTT 5 on the WebSocket listener (path /mqtt, subprotocol mqtt) as on TCP."""
    from support.processes import free_port

    ws = free_port()
    node = broker_factory("--ws-port", str(ws))
    sub, pub = paho5("ws5", websocket=True), paho5("tcp5")
    assert sub.connect(node, port=ws)[0] == 0 and pub.connect(node)[0] == 0
    assert sub.subscribe("ws5/#", 1, sub_id=3) == [1]
    pub.publish("ws5/t", b"x", 1, UserProperty=[("via", "tcp")])
    m = sub.get()
    assert (m.payload, m.properties.UserProperty, m.properties.SubscriptionIdentifier) == (b"x", [("via", "tcp")], [3])


def test_paho5_connack_tells_what_the_node_holds_the_client_to(broker, paho5):
    c = paho5("c5")
    rc, flags, props = c.connect(broker)
    assert rc == 0 and flags.session_present is False
    assert props.ReceiveMaximum >= 1 and props.TopicAliasMaximum >= 1
    assert props.SharedSubscriptionAvailable == 1  # (one node; a mesh node: tests/integration/test_shared.py)
    c2 = paho5("")
    rc, _, props = c2.connect(broker)
    assert rc == 0 and props.AssignedClientIdentifier  # [MQTT-3.1.3-7]


def test_connack_says_which_session_expiry_is_served(broker, broker_factory, mesh, paho5):
    """CONNACK's Session Expiry Interval (3.2.2.3.2): absent when the interval asked is served,
    on one node and in a mesh, whatever Clean Start says; the one served when
    ``mqtt.max_session_expiry`` caps it (a session that never expires too)."""
    one = paho5("one")
    _, _, props = one.connect(broker, clean_start=False, SessionExpiryInterval=60)
    assert getattr(props, "SessionExpiryInterval", None) is None
    fresh = paho5("fresh")
    _, _, props = fresh.connect(mesh["a"], clean_start=True, SessionExpiryInterval=60)
    assert getattr(props, "SessionExpiryInterval", None) is None
    kept = paho5("kept")
    rc, _, props = kept.connect(mesh["a"], clean_start=False, SessionExpiryInterval=60)
    assert rc == 0 and getattr(props, "SessionExpiryInterval", None) is None
    capped = broker_factory("--max-session-expiry", "30")
    for asked in (60, 0xFFFFFFFF):
        c = paho5(f"capped-{asked}")
        rc, _, props = c.connect(capped, clean_start=False, SessionExpiryInterval=asked)
        assert rc == 0 and props.SessionExpiryInterval == 30
        c.stop()


def test_properties_across_the_mesh_unaltered_and_in_order(mesh, paho5):
    """[MQTT-3.3.2-4] [MQTT-3.3.2-15] [MQTT-3.3.2-16] [MQTT-3.3.2-17] [MQTT-3.3.2-18]
    [MQTT-3.3.2-20]; the subscriber's Subscription Identifier [MQTT-3.3.4-3]."""
    sub, pub = paho5("sub-a"), paho5("pub-c")
    assert sub.connect(mesh["a"])[0] == 0 and pub.connect(mesh["c"])[0] == 0
    assert sub.subscribe("m5/#", 1, sub_id=42) == [1]
    wait_interest(mesh, "m5/#", "a")
    users = [("unit", "celsius"), ("seq", "1"), ("seq", "2"), ("a", "z")]
    pub.publish(
        "m5/t",
        b"21.5",
        1,
        PayloadFormatIndicator=1,
        ContentType="text/plain",
        ResponseTopic="m5/reply",
        CorrelationData=b"\x00req\xff",
        UserProperty=users,
    )
    m = sub.get()
    assert (m.topic, m.payload, m.qos) == ("m5/t", b"21.5", 1)
    p = m.properties
    assert p.UserProperty == users
    assert (p.PayloadFormatIndicator, p.ContentType, p.ResponseTopic, p.CorrelationData) == (
        1,
        "text/plain",
        "m5/reply",
        b"\x00req\xff",
    )
    assert p.SubscriptionIdentifier == [42]


def test_request_response_between_clients_on_different_nodes(mesh, paho5):
    """A requester on a, a responder on c: the Response Topic and Correlation Data cross the
    mesh both ways (4.10)."""
    requester, responder = paho5("requester"), paho5("responder")
    assert requester.connect(mesh["a"])[0] == 0 and responder.connect(mesh["c"])[0] == 0
    responder.subscribe("svc/add", 1)
    requester.subscribe("replies/requester", 1)
    wait_interest(mesh, "svc/add", "c")
    wait_interest(mesh, "replies/requester", "a")

    def serve():
        req = responder.get()
        a, b = (int(x) for x in req.payload.split(b"+"))
        responder.publish(
            req.properties.ResponseTopic, str(a + b).encode(), 1, CorrelationData=req.properties.CorrelationData
        )

    server = threading.Thread(target=serve, daemon=True)
    server.start()
    for n, corr in ((1, b"c-1"), (2, b"c-2")):
        requester.publish("svc/add", f"{n}+40".encode(), 1, ResponseTopic="replies/requester", CorrelationData=corr)
        reply = requester.get()
        assert (reply.payload, reply.properties.CorrelationData) == (str(n + 40).encode(), corr)
        if n == 1:
            server.join(10)
            server = threading.Thread(target=serve, daemon=True)
            server.start()
    server.join(10)


def test_mixing_versions_across_the_mesh(mesh, paho5, paho):
    """A 3.1.1 subscriber gets an MQTT 5 publish without properties; an MQTT 5 subscriber a
    3.1.1 publish with none."""
    s311, s5 = paho("s311"), paho5("s5")
    assert s311.connect(mesh["a"]) == 0 and s5.connect(mesh["a"])[0] == 0
    s311.subscribe("mix/#", 1)
    s5.subscribe("mix/#", 1)
    wait_interest(mesh, "mix/#", "a")
    p5, p311 = paho5("p5"), paho("p311")
    assert p5.connect(mesh["c"])[0] == 0 and p311.connect(mesh["c"]) == 0
    p5.publish("mix/5", b"from5", 1, UserProperty=[("k", "v")])
    assert s311.get(10) == ("mix/5", b"from5", 1, False)
    m = s5.get()
    assert m.properties.UserProperty == [("k", "v")]
    p311.publish("mix/4", b"from311", 1)
    m = s5.get()
    assert m.payload == b"from311" and not hasattr(m.properties, "UserProperty")
    assert s311.get(10) == ("mix/4", b"from311", 1, False)


def test_no_local_and_retain_as_published(broker, paho5):
    """[MQTT-3.8.3-3]; [MQTT-3.3.1-12] RETAIN kept on live delivery when asked."""
    c = paho5("self")
    assert c.connect(broker)[0] == 0
    c.subscribe("nl/#", 1, noLocal=True, retainAsPublished=True)
    other = paho5("other")
    assert other.connect(broker)[0] == 0
    c.publish("nl/mine", b"mine", 1)
    other.publish("nl/theirs", b"theirs", 1, ContentType="x")
    c.publish("nl/retained", b"kept", 1)
    m = c.get()
    assert (m.topic, m.retain) == ("nl/theirs", False)
    other.c.publish("nl/r", b"r", 1, retain=True).wait_for_publish(5)
    m = c.get()
    assert (m.topic, m.retain) == ("nl/r", True)
    with pytest.raises(queue.Empty):
        c.messages.get(timeout=0.5)  # (its own messages never came)


def test_server_topic_aliases_to_paho(broker, paho5):
    """The node sets aliases for a client that takes them [MQTT-3.3.2-11]: the first PUBLISH
    carries the topic and sets the alias, the next ones only the alias (paho 2.2 hands them up
    as they came: it does not resolve aliases itself; MQTT.js does, test_mqttjs.py)."""
    sub = paho5("alias-sub")
    assert sub.connect(broker, TopicAliasMaximum=4)[0] == 0
    sub.subscribe("very/long/topic/name/#", 1)
    pub = paho5("alias-pub")
    assert pub.connect(broker)[0] == 0
    for i in range(3):
        pub.publish("very/long/topic/name/x", str(i).encode(), 1)
    got = [sub.get() for _ in range(3)]
    assert [(m.topic, m.payload, m.properties.TopicAlias) for m in got] == [
        ("very/long/topic/name/x", b"0", 1),
        ("", b"1", 1),
        ("", b"2", 1),
    ]


def test_mosquitto_clients_v5_across_the_mesh(mesh):
    """``mosquitto_pub -V mqttv5 -D publish user-property`` on c, ``mosquitto_sub -V mqttv5``
    on a printing the properties (-F %P user properties, %C content type, %R response topic)."""
    a, c = mesh["a"], mesh["c"]
    sub = subprocess.Popen(
        ["mosquitto_sub", "-V", "mqttv5", "-h", a.host, "-p", str(a.port), "-t", "mq5/#", "-q", "1", "-C", "1"]
        + ["-W", "20", "-F", "%t|%p|%P|%C|%R"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_interest(mesh, "mq5/#", "a")
        pub = subprocess.run(
            ["mosquitto_pub", "-V", "mqttv5", "-h", c.host, "-p", str(c.port), "-t", "mq5/x", "-q", "1", "-m", "hello"]
            + ["-D", "publish", "user-property", "site", "north"]
            + ["-D", "publish", "content-type", "text/plain"]
            + ["-D", "publish", "response-topic", "mq5/back"],
            capture_output=True,
            text=True,
            timeout=15,
        )
        assert pub.returncode == 0, pub.stderr
        out, err = sub.communicate(timeout=25)
    finally:
        if sub.poll() is None:
            sub.kill()
            sub.wait(5)
    assert sub.returncode == 0, err
    assert out.strip() == "mq5/x|hello|site:north|text/plain|mq5/back"
