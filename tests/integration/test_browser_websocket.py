"""MQTT over WebSocket from a real browser (issue 22 point 2): a page in headless Chromium
loads MQTT.js's browser bundle (npm ``mqtt``, js/node_modules), connects to node a's
WebSocket listener, subscribes, receives a message a TCP client publishes on node b, and
publishes one that a TCP subscriber on node b receives."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from support.integration import Client, connack
from support.mesh import start_mesh, wait_converged, wait_interest
from support.processes import free_port, wait_for

BUNDLE = Path(__file__).resolve().parents[2] / "js" / "node_modules" / "mqtt" / "dist" / "mqtt.min.js"

pytestmark = [
    pytest.mark.process,
    pytest.mark.skipif(not BUNDLE.is_file(), reason="needs MQTT.js in js/node_modules (make js-deps: npm ci)"),
]

PAGE = """<!doctype html><html><head><meta charset="utf-8"><script src="{bundle}"></script></head>
<body><script>
window.state = {{ connected: false, subscribed: null, got: [], errors: [], published: false }};
const client = mqtt.connect({url}, {{ clientId: "browser-page", protocolVersion: 4, reconnectPeriod: 0 }});
client.on("connect", () => {{
  window.state.connected = true;
  client.subscribe("browser/#", {{ qos: 1 }}, (err, granted) => {{
    if (err) window.state.errors.push(String(err));
    else window.state.subscribed = granted.map((g) => g.qos);
  }});
}});
client.on("message", (topic, payload) => window.state.got.push([topic, payload.toString()]));
client.on("error", (e) => window.state.errors.push(String(e)));
window.publishNow = () => client.publish("from/browser", "hello from chromium", {{ qos: 1 }},
  (err) => {{ if (err) window.state.errors.push(String(err)); else window.state.published = true; }});
</script></body></html>
"""


def test_a_browser_page_talks_mqtt_over_websocket_across_the_mesh(broker_factory, browser, tmp_path):
    names, edges = ["a", "b"], [("b", "a")]
    ws_port = free_port()
    nodes = start_mesh(broker_factory, names, edges, extra=[])
    a, b = nodes["a"], nodes["b"]
    a.stop()
    a.args += ["--ws-port", str(ws_port)]
    a.start()
    wait_converged(nodes, edges)
    page = tmp_path / "page.html"
    page.write_text(PAGE.format(bundle=BUNDLE.as_uri(), url=json.dumps(f"ws://127.0.0.1:{ws_port}/mqtt")))
    with Client(b.host, b.port) as tcp:
        assert connack(tcp.connect(client_id="tcp-on-b"))[1] == 0
        assert tcp.sub(1, ("from/browser", 1)) == [1]
        browser.get(page.as_uri())
        state = lambda: browser.execute_script("return window.state")  # noqa: E731
        wait_for(lambda: state()["subscribed"] == [1], 15, what=f"the page subscribed ({state()})")
        wait_interest(nodes, "browser/#", "a")
        wait_interest(nodes, "from/browser", "b")
        tcp.pub("browser/news", b"from a TCP client on b", qos=1)
        wait_for(lambda: state()["got"] == [["browser/news", "from a TCP client on b"]], 10, what="the page received")
        browser.execute_script("window.publishNow()")
        wait_for(lambda: state()["published"], 10, what="the page's PUBACK")
        (p,) = tcp.publishes(1)
        assert p.topic == "from/browser" and p.payload == b"hello from chromium"
        assert state()["errors"] == []
