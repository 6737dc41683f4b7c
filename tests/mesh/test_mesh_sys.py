"""$SYS on mesh nodes: the status documents name no clients; the ClientIds have a topic of
their own ($SYS/mesh/clients) that anonymous clients never receive."""

from __future__ import annotations

import json
import time

import pytest

from support import mqttraw as raw
from support.mesh import ADMIN_PASSWORD, ADMIN_USER, SECRET, _tolerant, start_mesh, status, wait_converged
from support.processes import wait_for

pytestmark = pytest.mark.process

EDGES = [("b", "a")]


def sys_reader(node, client_id, **kw) -> raw.RawClient:
    c = raw.RawClient(node.host, node.port)
    assert c.connect(client_id=client_id, **kw).body == b"\x00\x00"
    c.send(raw.subscribe(1, ("$SYS/#", 0)))
    return c


def drain(c: raw.RawClient, seen: list, seconds: float) -> None:
    """Append (topic, payload) of what arrives within ``seconds`` (SUBACKs are skipped)."""
    deadline = time.monotonic() + seconds
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return
        try:
            p = c.recv(remaining)
        except TimeoutError:
            return
        if p.type == raw.PUBLISH:
            seen.append((p.topic, p.payload))


def test_anonymous_sys_subscriber_on_a_two_node_mesh_never_sees_a_client_id(broker_factory):
    """Clients with distinctive ClientIds on both nodes; an anonymous '$SYS/#' subscriber
    on each node gets the status documents (retained and live) but no ClientId, and never
    $SYS/mesh/clients; a user the password file verified gets $SYS/mesh/clients with them.
    `mqttmesh mesh status` shows the registrations only to that user."""
    nodes = start_mesh(broker_factory, ["a", "b"], EDGES, admin=True)
    wait_converged(nodes, EDGES)
    ids = {"a": "zq-device-a-4711", "b": "zq-device-b-0815"}
    devices = []
    for name, cid in ids.items():
        d = raw.RawClient(nodes[name].host, nodes[name].port)
        assert d.connect(client_id=cid).body == b"\x00\x00"
        devices.append(d)
    watchers = {name: sys_reader(nodes[name], f"zq-watcher-{name}") for name in nodes}
    admins = {
        name: sys_reader(nodes[name], f"zq-admin-{name}", username=ADMIN_USER, password=ADMIN_PASSWORD)
        for name in nodes
    }
    anon_seen = {name: [] for name in nodes}
    admin_seen = {name: [] for name in nodes}

    def admins_see_everyone():
        for name in nodes:
            drain(admins[name], admin_seen[name], 0.2)
            drain(watchers[name], anon_seen[name], 0.05)
        docs = [json.loads(p) for name in nodes for t, p in admin_seen[name][-20:] if t == "$SYS/mesh/clients"]
        local = set()
        for doc in docs:
            local.update(doc["local_clients"])
        return set(ids.values()) <= local

    wait_for(_tolerant(admins_see_everyone), 15, what="the admins to see both devices")
    for name in nodes:  # a few more live rounds for the anonymous ones
        drain(watchers[name], anon_seen[name], 0.5)
    forbidden = [*ids.values(), "zq-watcher", "zq-admin"]
    for seen in anon_seen.values():
        topics = {t for t, _ in seen}
        assert "$SYS/mesh/status" in topics and "$SYS/mesh/nodes" in topics, topics
        assert "$SYS/mesh/clients" not in topics
        leaks = [(t, cid) for t, p in seen for cid in forbidden if cid.encode() in p]
        assert not leaks, leaks
        assert sum(t == "$SYS/mesh/status" for t in topics) >= 1
    # the CLI's document: without a verified user, no registrations
    anonymous = status(nodes["a"])
    assert "registrations" not in anonymous["cluster"] and "local_clients" not in anonymous["cluster"]
    assert "counters" in anonymous["cluster"]
    assert not any(cid in json.dumps(anonymous) for cid in ids.values())
    wait_for(
        _tolerant(lambda: ids["a"] in status(nodes["a"], admin=True)["cluster"]["local_clients"]),
        10,
        what="the admin's status to list the device",
    )
    for c in [*devices, *watchers.values(), *admins.values()]:
        c.close()


ACL = """\
topic read $SYS/#
topic readwrite #
user admin
topic read $SYS/mesh/clients
"""


def test_with_an_acl_client_ids_need_a_grant_by_name(broker_factory, tmp_path):
    """'topic read $SYS/#' for everybody does not reach $SYS/mesh/clients; 'topic read
    $SYS/mesh/clients' for admin does (a user name is enough here: no password file)."""
    acl = tmp_path / "acl"
    acl.write_text(ACL)
    node = broker_factory("--cluster-secret", SECRET, "--status-interval", "0.1", "--acl-file", str(acl))
    device = raw.RawClient(node.host, node.port)
    assert device.connect(client_id="zq-acl-device").body == b"\x00\x00"
    anon = sys_reader(node, "zq-acl-anon")
    admin = sys_reader(node, "zq-acl-admin", username="admin")
    anon_seen, admin_seen = [], []

    def admin_sees_device():
        drain(admin, admin_seen, 0.2)
        drain(anon, anon_seen, 0.05)
        return any(t == "$SYS/mesh/clients" and b"zq-acl-device" in p for t, p in admin_seen)

    wait_for(admin_sees_device, 10, what="admin to get $SYS/mesh/clients")
    drain(anon, anon_seen, 0.3)
    topics = {t for t, _ in anon_seen}
    assert "$SYS/mesh/status" in topics and "$SYS/mesh/clients" not in topics
    assert not [t for t, p in anon_seen if b"zq-acl-" in p]
    for c in (device, anon, admin):
        c.close()
