"""The operator's HTTP listener (issue 22 point 3): /metrics in the Prometheus text format,
/api/v1/status, bearer tokens; checked by ``promtool check metrics`` where Debian's
prometheus package is installed."""

from __future__ import annotations

import http.client
import json
import shutil
import socket
import subprocess
from urllib.parse import urlencode

import pytest

from support import mqttraw
from support.integration import Client, connack, make_password_file
from support.mesh import Subscriber, publish, start_mesh, wait_converged, wait_interest
from support.processes import free_port, wait_for

pytestmark = [pytest.mark.process]


def http_broker(broker_factory, *extra: str, name: str | None = None):
    port = free_port()
    b = broker_factory("--http-port", str(port), *extra, name=name)
    b.http_port = port
    return b


def get(b, path: str, token: str | None = None, method: str = "GET") -> tuple[int, dict, bytes]:
    conn = http.client.HTTPConnection(b.host, b.http_port, timeout=5)
    try:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        conn.request(method, path, headers=headers)
        r = conn.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        conn.close()


def samples(text: str) -> dict[str, float]:
    """{name{labels}: value} of a Prometheus text page."""
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, value = line.rsplit(" ", 1)
            out[key] = float(value)
    return out


def test_metrics_count_what_clients_do(broker_factory):
    b = http_broker(broker_factory)
    status, headers, body = get(b, "/metrics")
    assert status == 200 and headers["content-type"].startswith("text/plain; version=0.0.4")
    before = samples(body.decode())
    assert before["mqttmesh_clients_connected"] == 0
    with Client(b.host, b.port) as sub, Client(b.host, b.port) as pub:
        assert connack(sub.connect(client_id="m-sub"))[1] == 0
        assert connack(pub.connect(client_id="m-pub"))[1] == 0
        assert sub.sub(1, ("m/#", 1)) == [1]
        for i in range(5):
            pub.pub("m/x", b"%d" % i, qos=1, pid=i + 1)
        pub.pub("m/y", b"zero-0", qos=0)
        pub.pub("m/z", b"two", qos=2, pid=9)
        sub.publishes(7)
        after = samples(get(b, "/metrics")[2].decode())
    assert after["mqttmesh_clients_connected"] == 2

    def delta(name: str, qos: int) -> float:
        key = f'mqttmesh_{name}_total{{qos="{qos}"}}'
        return after[key] - before[key]

    for name in ("messages_received", "messages_sent"):  # by the QoS the messages were published at
        assert [delta(name, q) for q in range(3)] == [1, 5, 1], name
    assert after["mqttmesh_subscriptions"] == 1
    assert after["mqttmesh_bytes_received_total"] > before["mqttmesh_bytes_received_total"]
    assert 'mqttmesh_messages_dropped_total{reason="queue_full"}' in after
    assert after['mqttmesh_store_commit_seconds_bucket{le="+Inf"}'] == after["mqttmesh_store_commit_seconds_count"]


def test_status_and_the_other_routes(broker_factory):
    b = http_broker(broker_factory)
    status, headers, body = get(b, "/api/v1/status")
    assert status == 200 and headers["content-type"] == "application/json"
    doc = json.loads(body)
    assert doc["clients_connected"] == 0 and "stats" in doc and "mesh" not in doc
    assert get(b, "/healthz")[0] == 200
    assert get(b, "/nope")[0] == 404
    assert get(b, "/metrics", method="POST")[0] == 405
    status, headers, body = get(b, "/metrics", method="HEAD")
    assert status == 200 and body == b"" and int(headers["content-length"]) > 0


def test_tokens(broker_factory):
    b = http_broker(broker_factory, "--http-token", "admin-secret", "--http-read-token", "reader")
    assert get(b, "/metrics")[0] == 401
    status, headers, _ = get(b, "/metrics", token="wrong")
    assert status == 403
    assert get(b, "/metrics", token="admin-secret")[0] == 200
    assert get(b, "/api/v1/status", token="reader")[0] == 200


def test_bad_requests_get_an_answer_and_the_node_goes_on(broker_factory):
    b = http_broker(broker_factory)
    for raw in (b"NOT HTTP\r\n\r\n", b"GET / HTTP/1.1\r\nX: " + b"a" * 20_000 + b"\r\n\r\n"):
        with socket.create_connection((b.host, b.http_port), timeout=5) as s:
            s.sendall(raw)
            answer = s.recv(4096)
            assert answer.startswith(b"HTTP/1.1 4"), answer[:80]
    assert get(b, "/healthz")[0] == 200


def test_a_mesh_node_shows_its_links_and_counters(broker_factory):
    names = ["a", "b", "c"]
    edges = [("b", "a"), ("c", "a"), ("c", "b")]
    nodes = start_mesh(broker_factory, names, edges, connect="all", http=True)
    a = nodes["a"]
    wait_converged(nodes, edges)
    page = wait_for(
        lambda: (lambda s: s if s.get('mqttmesh_mesh_link_up{peer="c"}') == 1 else None)(
            samples(get(a, "/metrics")[2].decode())
        ),
        10,
        what="a's metrics to show its links",
    )
    assert page['mqttmesh_mesh_link_up{peer="b"}'] == 1
    assert page["mqttmesh_mesh_nodes_reachable"] == 3
    # the round trips of the links c dialled (to a and b), as histograms
    page = wait_for(
        lambda: (lambda s: s if s.get('mqttmesh_mesh_link_rtt_sample_seconds_count{peer="a"}', 0) >= 2 else None)(
            samples(get(nodes["c"], "/metrics")[2].decode())
        ),
        10,
        what="a few round trips sampled",
    )
    assert page['mqttmesh_mesh_link_rtt_sample_seconds_bucket{peer="a",le="+Inf"}'] >= 2
    # a loopback round trip may be shorter than the clock's tick on a virtual machine whose
    # clock source is coarse (CI measured 0.0 for two samples): zero is a sample, not an error
    assert 0 <= page['mqttmesh_mesh_link_rtt_sample_seconds_sum{peer="a"}'] < 1
    assert "mqttmesh_mesh_spf_runs_total" in page and "mqttmesh_cluster_claims_total" in page
    doc = json.loads(get(a, "/api/v1/status")[2])
    assert set(doc["mesh"]["nodes"]) == set(names)
    if shutil.which("promtool"):  # (the mesh's metrics too: labels, counters, histograms)
        body = get(a, "/metrics")[2]
        check = subprocess.run(["promtool", "check", "metrics"], input=body, capture_output=True, timeout=30)
        assert check.returncode == 0, check.stdout.decode() + check.stderr.decode()


@pytest.mark.skipif(shutil.which("promtool") is None, reason="needs promtool (Debian prometheus; scripts/system-deps)")
def test_promtool_accepts_the_page(broker_factory):
    b = http_broker(broker_factory)
    body = get(b, "/metrics")[2]
    check = subprocess.run(["promtool", "check", "metrics"], input=body, capture_output=True, timeout=30)
    assert check.returncode == 0, check.stdout.decode() + check.stderr.decode()


@pytest.mark.skipif(
    shutil.which("prometheus") is None, reason="needs prometheus (Debian prometheus; scripts/system-deps)"
)
def test_a_real_prometheus_scrapes_a_mesh_and_computes_a_rate(broker_factory, tmp_path):
    """Prometheus scrapes the three nodes of a mesh every 0.5 s (with the read token); a
    publisher on one node, a subscriber on another; the rate of messages the subscriber's
    node handed out comes back from Prometheus's query API."""
    names = ["a", "b", "c"]
    edges = [("b", "a"), ("c", "a"), ("c", "b")]
    ports = {n: free_port() for n in names}
    nodes = start_mesh(broker_factory, names, edges, connect="all")
    for n in names:
        node = nodes[n]
        node.stop()
        node.args += ["--http-port", str(ports[n]), "--http-token", "admin", "--http-read-token", "scraper"]
        node.start()
        node.http_port = ports[n]
    wait_converged(nodes, edges)
    prom_port = free_port()
    targets = ", ".join(f'"127.0.0.1:{ports[n]}"' for n in names)
    (tmp_path / "prometheus.yml").write_text(
        "global: { scrape_interval: 500ms, evaluation_interval: 500ms }\n"
        "scrape_configs:\n"
        "  - job_name: mqttmesh\n"
        "    authorization: { credentials: scraper }\n"
        f"    static_configs: [{{ targets: [{targets}] }}]\n"
    )
    prom = subprocess.Popen(
        [
            "prometheus",
            f"--config.file={tmp_path / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{prom_port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:

        def query(expr: str):
            conn = http.client.HTTPConnection("127.0.0.1", prom_port, timeout=5)
            try:
                conn.request("GET", "/api/v1/query?" + urlencode({"query": expr}))
                doc = json.loads(conn.getresponse().read())
                return doc["data"]["result"] if doc.get("status") == "success" else None
            except (OSError, ValueError):
                return None
            finally:
                conn.close()

        up = wait_for(lambda: (lambda r: r if r and len(r) == 3 else None)(query("up == 1")), 30, what="3 targets up")
        assert {r["metric"]["instance"] for r in up} == {f"127.0.0.1:{ports[n]}" for n in names}
        sub = Subscriber(nodes["b"], "prom-sub", "prom/#", qos=1)
        try:
            wait_interest(nodes, "prom/#", "b")
            for _ in range(4):
                publish(nodes["a"], "prom/x", [b"m"] * 200, qos=1)
            sub.wait_count(800)
            rate = wait_for(
                lambda: (lambda r: r if r and float(r[0]["value"][1]) > 0 else None)(
                    query(f'sum(rate(mqttmesh_messages_sent_total{{instance="127.0.0.1:{ports["b"]}",qos="1"}}[5s]))')
                ),
                30,
                what="a rate of messages sent at b from Prometheus",
            )
            assert float(rate[0]["value"][1]) > 0
        finally:
            sub.close()
    finally:
        prom.terminate()
        try:
            prom.wait(10)
        except subprocess.TimeoutExpired:
            prom.kill()
            prom.wait(5)


def test_failed_and_held_logins_are_in_the_metrics(broker_factory, tmp_path):
    """Three wrong passwords sent together with --auth-fail-threshold 1 --auth-fail-delay 5:
    all three checked and counted as failed, the answers to the last two held (throttled)."""
    pw = make_password_file(tmp_path / "passwd", {"alice": "wonderland"})
    b = http_broker(broker_factory, "--password-file", str(pw), "--auth-fail-threshold", "1", "--auth-fail-delay", "5")
    bad = [Client(b.host, b.port, source="127.0.0.21") for _ in range(3)]
    try:
        for i, c in enumerate(bad):
            c.send(mqttraw.connect(client_id=f"bad{i}", username="alice", password="nope"))
        page = {}

        def counted() -> bool:
            page.update(samples(get(b, "/metrics")[2].decode()))
            return page['mqttmesh_logins_failed_total{how="bad_credentials"}'] == 3

        wait_for(counted, 10, what="3 failed logins in /metrics")
        assert page['mqttmesh_logins_unanswered{stage="failure_held"}'] == 2
        assert page['mqttmesh_logins_failed_total{how="throttled"}'] == 2
        assert page['mqttmesh_logins_unanswered{stage="checking"}'] == 0
    finally:
        for c in bad:
            c.close()
