"""The admin API (issue 22 point 3): every node, client, session, subscription, route and
retained message of the mesh from any node's HTTP listener, paged; DELETE disconnects a
client wherever it is; tokens; the OpenAPI document; `mqttmesh ctl` built on it.

A 3-node mesh (a, b, c, fully connected), each node with an HTTP listener; clients are raw
MQTT clients (tests/support/mqttraw.py) on different nodes.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
from urllib.parse import quote

import pytest

from support.integration import Client, connack, run_cli
from support.mesh import start_mesh, wait_converged, wait_interest
from support.processes import wait_for

pytestmark = [pytest.mark.process]

NAMES = ["a", "b", "c"]
EDGES = [("b", "a"), ("c", "a"), ("c", "b")]
ADMIN, READER = "admin-secret", "read-only"


def call(node, method: str, path: str, token: str | None = ADMIN) -> tuple[int, dict]:
    conn = http.client.HTTPConnection(node.host, node.http_port, timeout=10)
    try:
        conn.request(method, path, headers={"Authorization": f"Bearer {token}"} if token else {})
        r = conn.getresponse()
        body = r.read()
        try:
            return r.status, json.loads(body)
        except ValueError:
            return r.status, {"text": body.decode(errors="replace")}
    finally:
        conn.close()


@pytest.fixture
def mesh(broker_factory):
    nodes = start_mesh(
        broker_factory,
        NAMES,
        EDGES,
        connect="all",
        http=True,
        extra=["--http-token", ADMIN, "--http-read-token", READER],
    )
    wait_converged(nodes, EDGES)
    return nodes


def connect(node, cid: str, clean: bool = True, will: tuple[str, bytes] | None = None) -> Client:
    c = Client(node.host, node.port)
    kw = {"will": (will[0], will[1], 1, False)} if will else {}
    assert connack(c.connect(client_id=cid, clean=clean, keepalive=60, **kw))[1] == 0
    return c


def test_nodes_clients_sessions_subscriptions_retained_and_routes_mesh_wide(mesh):
    a, b, c = (mesh[n] for n in NAMES)
    clients = [connect(a, "alpha"), connect(b, "bravo"), connect(c, "charlie", clean=False)]
    try:
        assert clients[2].sub(1, ("plant/+/temp", 1), ("alarms/#", 2)) == [1, 2]
        wait_interest(mesh, "plant/+/temp", "c")
        clients[0].pub("plant/1/temp", b"21.5", qos=1, retain=True)
        clients[1].pub("plant/2/temp", b"\xff\xfe", qos=1, retain=True)

        # every node, up, with its links and their costs, and its counters
        status, doc = call(b, "GET", "/api/v1/nodes")
        assert status == 200 and doc["node"] == "b"
        assert [n["id"] for n in doc["nodes"]] == NAMES
        for n in doc["nodes"]:
            assert n["status"] == "up" and n["stats"] is not None
            assert {lk["peer"] for lk in n["links"]} == set(NAMES) - {n["id"]}
            assert all(lk["up"] and lk["cost"] > 0 for lk in n["links"])
        assert doc["missing"] == []

        # clients anywhere in the mesh, asked of any node, paged
        status, doc = call(a, "GET", "/api/v1/clients")
        assert status == 200
        got = {i["client_id"]: i for i in doc["items"]}
        assert {k: v["node"] for k, v in got.items()} == {"alpha": "a", "bravo": "b", "charlie": "c"}
        assert got["charlie"]["subscriptions"] == 2 and got["charlie"]["clean_session"] is False
        assert got["alpha"]["transport"] == "tcp" and got["alpha"]["address"].startswith("127.0.0.1:")
        assert got["alpha"]["connected_since"] > 1.7e9
        status, first = call(c, "GET", "/api/v1/clients?limit=2")
        assert [i["client_id"] for i in first["items"]] == ["alpha", "bravo"] and first["next"]
        status, second = call(c, "GET", f"/api/v1/clients?limit=2&after={quote(first['next'])}")
        assert [i["client_id"] for i in second["items"]] == ["charlie"] and second["next"] is None

        status, one = call(c, "GET", "/api/v1/clients/bravo")
        assert status == 200 and one["node"] == "b"
        assert call(c, "GET", "/api/v1/clients/nobody")[0] == 404

        # charlie's persistent session, held on more than one node, connected on c
        status, doc = call(a, "GET", "/api/v1/sessions")
        sessions = {i["client_id"]: i for i in doc["items"]}
        assert sessions["charlie"]["connected_here"] is True and len(sessions["charlie"]["held_by"]) >= 2
        assert sessions["charlie"]["clean_session"] is False

        status, doc = call(b, "GET", "/api/v1/subscriptions")
        subs = {(i["client_id"], i["filter"]): i["qos"] for i in doc["items"]}
        assert subs[("charlie", "plant/+/temp")] == 1 and subs[("charlie", "alarms/#")] == 2
        status, page = call(b, "GET", "/api/v1/subscriptions?limit=1")
        status, rest = call(b, "GET", f"/api/v1/subscriptions?limit=10&after={quote(page['next'])}")
        assert [(i["client_id"], i["filter"]) for i in page["items"] + rest["items"]] == sorted(subs)

        # retained messages wherever their owners are; text as text, bytes as base64
        def retained():
            doc = call(c, "GET", "/api/v1/retained?filter=plant/%2B/temp")[1]
            return {i["topic"]: i for i in doc["items"]} if len(doc["items"]) == 2 else None

        items = wait_for(retained, 10, what="both retained messages listed")
        assert items["plant/1/temp"]["payload"] == "21.5" and items["plant/1/temp"]["qos"] == 1
        assert items["plant/2/temp"]["payload_base64"] == "//4="

        # the shortest-path tree from b: every other node's parent on it
        status, doc = call(a, "GET", "/api/v1/routes?from=b")
        assert status == 200 and doc["from"] == "b" and set(doc["parent"]) == {"a", "c"}
        assert doc["distance"]["b"] == 0 and doc["unreachable"] == []
        assert call(a, "GET", "/api/v1/routes?from=zulu")[0] == 404
    finally:
        for cl in clients:
            cl.close()


def test_delete_disconnects_a_client_wherever_it_is_and_its_will_goes_out(mesh):
    """DELETE on node a for a client of node c: c closes it (server side: its will is
    published [MQTT-3.1.2-8]), the answer names c; a second DELETE gets 404."""
    a, b, c = (mesh[n] for n in NAMES)
    watcher = connect(b, "watcher")
    try:
        assert watcher.sub(1, ("wills/#", 1)) == [1]
        wait_interest(mesh, "wills/#", "b")
        victim = connect(c, "victim", will=("wills/victim", b"gone"))
        status, doc = call(a, "DELETE", "/api/v1/clients/victim")
        assert (status, doc) == (200, {"client_id": "victim", "disconnected_on": ["c"]})
        victim.expect_closed()
        (p,) = watcher.publishes(1)
        assert p.topic == "wills/victim" and p.payload == b"gone"
        assert call(a, "DELETE", "/api/v1/clients/victim")[0] == 404
    finally:
        watcher.close()


def test_tokens_roles_and_bad_requests(mesh):
    a = mesh["a"]
    assert call(a, "GET", "/api/v1/clients", token=None)[0] == 401
    assert call(a, "GET", "/api/v1/clients", token="wrong")[0] == 403
    assert call(a, "GET", "/api/v1/clients", token=READER)[0] == 200
    status, doc = call(a, "DELETE", "/api/v1/clients/anyone", token=READER)
    assert status == 403 and "only read" in doc["error"]
    assert call(a, "POST", "/api/v1/reload", token=READER)[0] == 403
    assert call(a, "GET", "/api/v1/clients?limit=0")[0] == 400
    assert call(a, "GET", "/api/v1/clients?limit=x")[0] == 400
    assert call(a, "GET", "/api/v1/clients?after=%%%")[0] == 400
    assert call(a, "PUT", "/api/v1/clients")[0] == 405
    assert call(a, "GET", "/api/v1/nothing")[0] == 404
    # the console's own files need no token (they hold no data); /healthz neither
    assert call(a, "GET", "/", token=None)[0] == 200
    assert call(a, "GET", "/healthz", token=None)[0] == 200


def test_openapi_document_lists_every_route_and_each_answers(mesh):
    a = mesh["a"]
    status, doc = call(a, "GET", "/api/v1/openapi.json")
    assert status == 200 and doc["openapi"].startswith("3.")
    assert set(doc["paths"]) == {
        "/api/v1/status",
        "/api/v1/nodes",
        "/api/v1/routes",
        "/api/v1/clients",
        "/api/v1/clients/{client_id}",
        "/api/v1/sessions",
        "/api/v1/subscriptions",
        "/api/v1/retained",
        "/api/v1/reload",
        "/api/v1/openapi.json",
    }
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            assert op["summary"] and "200" in op["responses"]
            if method == "get":
                status, _ = call(a, "GET", path.replace("{client_id}", "nobody"))
                assert status in (200, 404), (path, status)


def test_a_killed_node_is_down_and_missing_from_listings(mesh):
    a, c = mesh["a"], mesh["c"]
    cl = connect(c, "on-c")
    try:
        os.kill(c.pid, signal.SIGKILL)

        def c_down():
            doc = call(a, "GET", "/api/v1/nodes")[1]
            return {n["id"]: n["status"] for n in doc["nodes"]}.get("c") == "down"

        wait_for(c_down, 30, what="c shown down")
        items = call(a, "GET", "/api/v1/clients")[1]["items"]
        assert "on-c" not in {i["client_id"] for i in items}
    finally:
        cl.close()


def test_ctl_status_clients_kick_and_reload(mesh, tmp_path):
    a, b = mesh["a"], mesh["b"]
    url = f"http://{a.host}:{a.http_port}"
    (tmp_path / "token").write_text(ADMIN + "\n")
    cl = connect(b, "ctl-target")
    try:
        r = run_cli("ctl", "status", "--url", url, "--token-file", str(tmp_path / "token"))
        assert r.returncode == 0, r.stderr
        lines = r.stdout.splitlines()
        assert lines[0].split()[:2] == ["NODE", "STATUS"]
        assert {ln.split()[0] for ln in lines[1:]} == set(NAMES) and all(" up " in ln for ln in lines[1:])
        r = run_cli("ctl", "clients", "--url", url, "--token", ADMIN)
        assert r.returncode == 0 and any(ln.split()[:2] == ["ctl-target", "b"] for ln in r.stdout.splitlines())
        r = run_cli("ctl", "kick", "ctl-target", "--url", url, "--token", ADMIN)
        assert r.returncode == 0 and "disconnected on b" in r.stdout
        cl.expect_closed()
        r = run_cli("ctl", "kick", "ctl-target", "--url", url, "--token", ADMIN)
        assert r.returncode == 1 and "404" in r.stderr
        r = run_cli("ctl", "kick", "x", "--url", url, "--token", READER)
        assert r.returncode == 1 and "403" in r.stderr
        r = run_cli("ctl", "reload", "--url", url, "--token", ADMIN)
        assert r.returncode == 0 and r.stdout.strip() == "reloaded"
        r = run_cli("ctl", "status", "--url", "http://127.0.0.1:1", "--token", ADMIN)
        assert r.returncode == 2 and "cannot reach" in r.stderr
    finally:
        cl.close()


def test_without_a_mesh_the_api_answers_for_the_one_node(broker_factory):
    from support.processes import free_port

    port = free_port()
    b = broker_factory("--http-port", str(port))
    b.http_port = port
    cl = connect(b, "solo")
    try:
        status, doc = call(b, "GET", "/api/v1/nodes", token=None)
        assert status == 200 and [n["id"] for n in doc["nodes"]] == [doc["node"]]
        assert doc["nodes"][0]["status"] == "up"
        assert [i["client_id"] for i in call(b, "GET", "/api/v1/clients", token=None)[1]["items"]] == ["solo"]
        assert call(b, "DELETE", "/api/v1/clients/solo", token=None)[1]["disconnected_on"] == [doc["node"]]
        cl.expect_closed()
    finally:
        cl.close()
