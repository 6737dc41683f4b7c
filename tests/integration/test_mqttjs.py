"""JavaScript interop: MQTT.js (npm ``mqtt``, pinned in js/package.json) under Node, over
WebSocket and TCP, on one node and across a 3-node mesh (issue 22 point 2).

js/roundtrip.js subscribes on one URL, says so, waits for the word to go (the subscription
has reached the publisher's node), publishes N messages on another URL and prints what
arrived. ``make test`` installs Node (Debian's ``nodejs``, ``npm``) and ``npm ci`` in js/.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from support.mesh import start_mesh, wait_converged, wait_interest
from support.processes import free_port

JS = Path(__file__).resolve().parents[2] / "js"

pytestmark = [
    pytest.mark.process,
    pytest.mark.skipif(shutil.which("node") is None, reason="needs Node (Debian nodejs; scripts/system-deps)"),
    pytest.mark.skipif(
        not (JS / "node_modules" / "mqtt").is_dir(), reason="needs MQTT.js in js/node_modules (make js-deps: npm ci)"
    ),
]


def roundtrip(
    sub_url: str, pub_url: str, topic: str, count: int, qos: int, before_publish=lambda: None, **extra
) -> dict:
    cfg = {"sub": sub_url, "pub": pub_url, "topic": topic, "count": count, "qos": qos, "deadline_ms": 15000, **extra}
    proc = subprocess.Popen(
        ["node", str(JS / "roundtrip.js"), json.dumps(cfg)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        first = json.loads(proc.stdout.readline() or "{}")  # (bounded by the script's deadline)
        assert "subscribed" in first, (first, proc.stderr.read())
        assert first["subscribed"] == [qos]
        before_publish()
        proc.stdin.write("go\n")
        proc.stdin.flush()
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
    result = json.loads(out.strip().splitlines()[-1])
    assert result["error"] is None and proc.returncode == 0, (result, err)
    return result


@pytest.mark.parametrize("qos", [0, 1, 2])
def test_mqttjs_over_websocket_and_tcp_on_one_node(broker_factory, qos):
    ws = free_port()
    b = broker_factory("--ws-port", str(ws))
    result = roundtrip(f"ws://127.0.0.1:{ws}/mqtt", f"mqtt://127.0.0.1:{b.port}", f"js{qos}", 20, qos)
    assert [m["payload"] for m in result["received"]] == [str(i) for i in range(20)]
    assert {m["qos"] for m in result["received"]} == {qos}


def test_mqttjs_across_the_mesh_websocket_on_one_node_tcp_on_another(broker_factory):
    names = ["a", "b", "c"]
    edges = [("b", "a"), ("c", "a"), ("c", "b")]
    ws = free_port()
    nodes = start_mesh(broker_factory, names, edges, connect="all")
    a = nodes["a"]
    a.stop()
    a.args += ["--ws-port", str(ws)]
    a.start()
    wait_converged(nodes, edges)
    result = roundtrip(
        f"ws://127.0.0.1:{ws}/mqtt",
        f"mqtt://127.0.0.1:{nodes['c'].port}",
        "jsmesh",
        50,
        1,
        before_publish=lambda: wait_interest(nodes, "jsmesh/#", "a"),
    )
    assert [m["payload"] for m in result["received"]] == [str(i) for i in range(50)]


def test_mqttjs_mqtt5_properties_across_the_mesh(broker_factory):
    """MQTT.js with protocolVersion 5, publisher on c, subscriber on a (issue 23): User
    Properties (in order, repeated keys too), Content Type, Response Topic and Correlation
    Data arrive unaltered [MQTT-3.3.2-15] [MQTT-3.3.2-16] [MQTT-3.3.2-17] [MQTT-3.3.2-20]."""
    names = ["a", "b", "c"]
    edges = [("b", "a"), ("c", "b")]  # a line: c's messages cross b to reach a
    nodes = start_mesh(broker_factory, names, edges, connect="configured")
    wait_converged(nodes, edges)
    props = {
        "userProperties": {"unit": "celsius", "seq": ["1", "2"]},
        "contentType": "text/plain",
        "responseTopic": "js5/reply",
        "correlationData": "req-7",
    }
    result = roundtrip(
        f"mqtt://127.0.0.1:{nodes['a'].port}",
        f"mqtt://127.0.0.1:{nodes['c'].port}",
        "js5",
        5,
        1,
        before_publish=lambda: wait_interest(nodes, "js5/#", "a"),
        version=5,
        properties=props,
    )
    assert [m["payload"] for m in result["received"]] == [str(i) for i in range(5)]
    for m in result["received"]:
        got = m["properties"]
        assert got["userProperties"] == {"unit": "celsius", "seq": ["1", "2"]}
        assert (got["contentType"], got["responseTopic"], got["correlationData"]) == (
            "text/plain",
            "js5/reply",
            "req-7",
        )


def test_mqttjs_resolves_the_topic_aliases_the_node_sets(broker_factory):
    """An MQTT 5 subscriber with a Topic Alias Maximum: the node sends the long topic once and
    then its alias [MQTT-3.3.2-11]; MQTT.js hands every message up with its topic."""
    b = broker_factory()
    topic = "a/rather/long/topic/name/that/aliases/save/bytes/on"
    result = roundtrip(
        f"mqtt://127.0.0.1:{b.port}",
        f"mqtt://127.0.0.1:{b.port}",
        topic,
        10,
        1,
        version=5,
        sub_properties={"topicAliasMaximum": 4},
    )
    assert [(m["topic"], m["payload"]) for m in result["received"]] == [(topic + "/x", str(i)) for i in range(10)]
    assert {m["properties"].get("topicAlias") for m in result["received"]} == {1}  # (one alias, every time)
