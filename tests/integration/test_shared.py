"""Shared subscriptions with real clients on a real node (issue 24, its single-node part):
paho-mqtt 3.1.1 and 5.0 members in one group, Debian's mosquitto_pub and mosquitto_sub,
raw clients that leave without acknowledging; across a 3-node mesh, members whose sessions
end with their connection (persistent ones are not taken in a mesh yet). Rule ids are MQTT
5.0's (section 4.8.2)."""

from __future__ import annotations

import http.client
import queue
import subprocess
import threading

import pytest

from support import mqttraw
from support.probes import reset
from support.processes import free_port, wait_for

pytestmark = [pytest.mark.process]


def _metrics(node) -> str:
    conn = http.client.HTTPConnection(node.host, node.http_port, timeout=5)
    try:
        conn.request("GET", "/metrics")
        return conn.getresponse().read().decode()
    finally:
        conn.close()


@pytest.fixture
def node(broker_factory):
    """A node with its HTTP listener (/metrics)."""
    port = free_port()
    b = broker_factory("--http-port", str(port))
    b.http_port = port
    return b


def _drain(members, want: int, timeout: float = 10.0) -> dict[str, list[bytes]]:
    """What each of ``members`` (name -> a Paho or Paho5) received, until ``want`` in all."""
    got: dict[str, list[bytes]] = {name: [] for name in members}

    def more() -> bool:
        for name, m in members.items():
            while True:
                try:
                    item = m.messages.get_nowait()
                except queue.Empty:
                    break
                got[name].append(item[1] if isinstance(item, tuple) else bytes(item.payload))
        return sum(len(v) for v in got.values()) >= want

    wait_for(more, timeout, what=f"{want} messages to the members")
    return got


def test_mqtt311_and_mqtt5_members_share_each_message_once(broker, paho, paho5):
    """A group of two 3.1.1 members and one MQTT 5 member: each of 60 QoS 1 messages reaches
    exactly one of them, every member a share [MQTT-4.8.2-3]; a second group and a plain
    subscriber of the filter get every message."""
    members = {"p1": paho("p1"), "p2": paho("p2"), "m5": paho5("m5")}
    other, plain = paho("other"), paho("plain")
    for m in members.values():
        rc = m.connect(broker)
        assert (rc[0] if isinstance(rc, tuple) else rc) == 0
        codes = m.subscribe("$share/workers/jobs/#", 1)
        assert [int(getattr(c, "value", c)) for c in codes] == [1]
    assert other.connect(broker) == 0 and plain.connect(broker) == 0
    other.subscribe("$share/audit/jobs/#", 0)
    plain.subscribe("jobs/#", 1)
    pub = paho("pub")
    assert pub.connect(broker) == 0
    for i in range(60):
        pub.publish(f"jobs/{i % 4}", b"%d" % i, qos=1)
    got = _drain(members, 60)
    everything = sorted(b"%d" % i for i in range(60))
    assert sorted(p for v in got.values() for p in v) == everything
    assert all(len(v) >= 10 for v in got.values()), {k: len(v) for k, v in got.items()}
    assert sorted(_drain({"other": other}, 60)["other"]) == everything
    assert sorted(_drain({"plain": plain}, 60)["plain"]) == everything


def test_mosquitto_clients_in_a_group(node):
    """Debian's mosquitto_sub as two members, mosquitto_pub publishing: 20 messages, each to
    one of them."""
    subs = [
        subprocess.Popen(
            ["mosquitto_sub", "-h", node.host, "-p", str(node.port), "-t", "$share/g/m/t", "-q", "1", "-i", f"ms{i}"],
            stdout=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    # (each member's lines as it prints them: read until both have printed 20 in all, since
    # the node counting a message sent is not the member having printed it)
    outs: list[list[str]] = [[], []]

    def read(proc: subprocess.Popen, into: list[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            into.append(line.strip())

    readers = [threading.Thread(target=read, args=(p, o)) for p, o in zip(subs, outs, strict=True)]
    for t in readers:
        t.start()
    try:
        wait_for(lambda: "mqttmesh_shared_members 2" in _metrics(node), 10, what="both members")
        for i in range(20):
            subprocess.run(
                ["mosquitto_pub", "-h", node.host, "-p", str(node.port), "-t", "m/t", "-q", "1", "-m", f"x{i}"],
                check=True,
                timeout=10,
            )
        wait_for(lambda: len(outs[0]) + len(outs[1]) >= 20, 10, what="20 messages printed by the members")
    finally:
        for p in subs:
            p.terminate()
        for p in subs:
            p.wait(timeout=10)
        for t in readers:
            t.join(timeout=10)
    assert sorted(outs[0] + outs[1]) == sorted(f"x{i}" for i in range(20))
    assert outs[0] and outs[1]
    assert 'mqttmesh_messages_sent_total{qos="1"} 20' in _metrics(node)


def test_a_member_that_drops_unacknowledged_qos1_messages_hands_them_on(node, clients):
    """A raw member takes 10 QoS 1 messages without acknowledging one and its TCP connection
    is reset: the other member gets those 10 too (perhaps twice in the group: counted by the
    node as re-sent)."""
    stays = clients(node, "stays")
    assert stays.sub(1, ("$share/g/q/#", 1)) == [1]
    leaves = clients(node, "leaves")
    assert leaves.sub(1, ("$share/g/q/#", 1)) == [1]
    pub = clients(node, "pub")
    for i in range(20):
        pub.pub("q/t", b"%d" % i, qos=1, pid=i + 1)
    held = leaves.publishes(10)
    kept = stays.publishes(10)
    for p in kept:
        stays.ack(p)
    reset(leaves.sock)  # (an RST, no DISCONNECT)
    again = stays.publishes(10)
    for p in again:
        stays.ack(p)
    assert sorted(p.payload for p in kept + again) == sorted(b"%d" % i for i in range(20))
    assert {p.payload for p in held} == {p.payload for p in again}
    wait_for(lambda: 'mqttmesh_shared_messages_total{what="resent"} 10' in _metrics(node), 10, what="the count")


@pytest.mark.parametrize("how", ["no restart", "kill -9"])
def test_what_a_persistent_member_queued_from_its_group_survives_a_restart_as_the_groups(
    broker_factory, tmp_path, clients, how
):
    """A node with a store. A, a persistent member of $share/g/t (CleanSession=0), offline and
    the group's only member, so it queues the group's 10 QoS 1 messages [MQTT-3.1.2-5] (each
    acknowledged to the publisher once stored). The node is killed with kill -9 and started
    again (or not: the same steps without a restart, for comparison). B joins the group,
    connected: A's queue stays A's, as it would without the restart (a member hands its queue
    on when its client leaves or its session ends, not when another joins). A's client comes
    back with CleanSession=1: its session is discarded [MQTT-3.1.2-6], and what it had queued
    through the group goes to B, once each [MQTT-4.8.2-3]; A's new session gets nothing.
    After the restart this needs the group each stored entry came through (store format 4):
    with format 3 the restored entries named none and ended with A's session, lost."""
    port = free_port()
    node = broker_factory("--data-dir", str(tmp_path / "data"), "--http-port", str(port))
    node.http_port = port
    a = clients(node, "A", clean=False)
    assert a.sub(1, ("$share/g/t", 1)) == [1]
    a.send(mqttraw.DISCONNECT_BYTES)
    a.expect_closed()
    pub = clients(node, "pub")
    for i in range(10):
        pub.pub("t", b"%d" % i, qos=1, pid=i + 1)  # (PUBACK once the store has it)
    if how == "kill -9":
        node.kill()
        node.start()
    b = clients(node, "B")
    assert b.sub(1, ("$share/g/t", 1)) == [1]
    b.expect_silence(0.3)  # (A's queue is A's while its session lasts)
    again = clients(node, "A", clean=True)
    assert again.session_present == 0
    got = b.publishes(10)
    for p in got:
        b.ack(p)
    assert sorted(p.payload for p in got) == sorted(b"%d" % i for i in range(10))
    b.expect_silence(0.5)  # (each once)
    again.expect_silence(0.1)
    metrics = _metrics(node)
    assert 'mqttmesh_shared_messages_total{what="redispatched"} 10' in metrics, metrics


def test_across_a_3_node_mesh_each_message_reaches_one_member_of_each_group(mesh, paho, paho5):
    """Members (sessions that end with their connection) on every node of the line c - b - a,
    3.1.1 and MQTT 5 in one group, and publishers on every node: each message reaches exactly
    one member of the group, and every member gets a share (local strategy: the publisher's
    node has a member, so nothing crosses a link for the group); a plain subscriber on a gets
    every message."""
    from support.mesh import wait_interest

    members = {f"m{n}": (paho5 if n == "b" else paho)(f"m{n}") for n in ("a", "b", "c")}
    for n, m in zip(("a", "b", "c"), members.values(), strict=True):
        rc = m.connect(mesh[n])
        assert (rc[0] if isinstance(rc, tuple) else rc) == 0
        codes = m.subscribe("$share/w/mj/#", 1)
        assert [int(getattr(c, "value", c)) for c in codes] == [1]
    plain = paho("plain")
    assert plain.connect(mesh["a"]) == 0
    plain.subscribe("mj/#", 1)
    for n in ("a", "b", "c"):
        wait_interest(mesh, "$share/w/mj/#", n)
    wait_interest(mesh, "mj/#", "a")
    pubs = {n: paho(f"pub{n}") for n in ("a", "b", "c")}
    for n, p in pubs.items():
        assert p.connect(mesh[n]) == 0
    for i in range(30):
        n = "abc"[i % 3]
        pubs[n].publish(f"mj/{n}", b"%d" % i, qos=1)
    got = _drain(members, 30)
    assert sorted(p for v in got.values() for p in v) == sorted(b"%d" % i for i in range(30))
    assert all(len(v) == 10 for v in got.values()), {k: len(v) for k, v in got.items()}
    assert sorted(_drain({"plain": plain}, 30)["plain"]) == sorted(b"%d" % i for i in range(30))


def test_round_robin_across_the_mesh_crosses_links_and_spreads_evenly(broker_factory, paho):
    """``mqtt.shared_strategy = round_robin``: the node of each message's member in turn over
    the nodes with members (a publisher on a, members on b and c, none on a): half of the
    messages to each node, each once."""
    from support.mesh import start_mesh, wait_converged, wait_interest

    names, edges = ["a", "b", "c"], [("b", "a"), ("c", "b")]
    nodes = start_mesh(broker_factory, names, edges, extra=["--shared-strategy", "round_robin"])
    wait_converged(nodes, edges)
    members = {n: paho(f"rr{n}") for n in ("b", "c")}
    for n, m in members.items():
        assert m.connect(nodes[n]) == 0
        m.subscribe("$share/rr/q/#", 1)
    for n in ("b", "c"):
        wait_interest(nodes, "$share/rr/q/#", n)
    pub = paho("rrpub")
    assert pub.connect(nodes["a"]) == 0
    for i in range(20):
        pub.publish("q/t", b"%d" % i, qos=1)
    got = _drain(members, 20)
    assert sorted(p for v in got.values() for p in v) == sorted(b"%d" % i for i in range(20))
    assert [len(v) for v in got.values()] == [10, 10]


def test_a_member_that_drops_hands_what_it_held_to_a_member_on_another_node(mesh, paho, clients):
    """Line c - b - a, publisher on a, members on b (a raw client that never acknowledges) and
    c: the local strategy serves the group on b, the nearest node with a member, so all 10
    QoS 1 messages go to b's member. Its connection is reset: b has no other member, so b sends
    each again, under its own id, to a member of the group on another node, and to no other
    subscriber there (a re-send: the member on b may have had them)."""
    from support.mesh import wait_interest

    held = clients(mesh["b"], "held")
    assert held.sub(1, ("$share/h/k/#", 1)) == [1]
    other = paho("other")
    assert other.connect(mesh["c"]) == 0
    other.subscribe("$share/h/k/#", 1)
    plain = paho("plainc")  # (a plain subscriber beside it gets each message once)
    assert plain.connect(mesh["c"]) == 0
    plain.subscribe("k/#", 1)
    for n in ("b", "c"):
        wait_interest(mesh, "$share/h/k/#", n)
    wait_interest(mesh, "k/#", "c")
    pub = clients(mesh["a"], "pubk")
    for i in range(10):
        pub.pub("k/t", b"%d" % i, qos=1, pid=i + 1)
    got = held.publishes(10)
    assert sorted(p.payload for p in got) == sorted(b"%d" % i for i in range(10))
    reset(held.sock)
    moved = _drain({"other": other}, 10)["other"]
    assert sorted(moved) == sorted(b"%d" % i for i in range(10))
    assert sorted(_drain({"plain": plain}, 10)["plain"]) == sorted(b"%d" % i for i in range(10))
    with pytest.raises(queue.Empty):
        plain.get(timeout=0.5)  # (the re-sends went to the group only)


def _stalled_member_in_a_triangle(broker_factory, paho, clients, node, n, held, clean=True, **mesh):
    """Triangle a, b, c (``mesh``: start_mesh's keywords); a member of ``$share/w/job/#`` on
    ``node`` that takes its messages and never acknowledges them (a raw client: a stalled
    worker), a Paho member on c, a Paho publisher on a that publishes ``n`` QoS 1 messages,
    each acknowledged by a; the stalled member has taken ``held`` of them. (nodes, c's member)."""
    from support.mesh import start_mesh, wait_converged, wait_interest

    names, edges = ["a", "b", "c"], [("b", "a"), ("c", "b"), ("c", "a")]
    nodes = start_mesh(broker_factory, names, edges, **mesh)
    wait_converged(nodes, edges)
    stalled = clients(nodes[node], "stalled", clean=clean)
    assert stalled.sub(1, ("$share/w/job/#", 1)) == [1]
    worker = paho("worker")
    assert worker.connect(nodes["c"]) == 0
    worker.subscribe("$share/w/job/#", 1)
    for name in (node, "c"):
        wait_interest(nodes, "$share/w/job/#", name)
    pub = paho("jobs")
    assert pub.connect(nodes["a"]) == 0
    for i in range(n):
        pub.publish("job/t", b"%d" % i, qos=1)  # (returns once a's PUBACK came)
    taken = stalled.publishes(held)
    assert len({p.payload for p in taken}) == held
    return nodes, worker


@pytest.mark.parametrize("clean", [True, False], ids=["clean", "persistent"])
def test_a_members_node_killed_holding_acknowledged_messages_loses_none(broker_factory, paho, clients, clean):
    """Triangle a, b, c, round robin; the publisher on a, members on b (a raw client that
    takes its messages and never acknowledges them: a stalled worker) and c. Every one of 40
    QoS 1 messages is acknowledged to the publisher; half went to b's member. b is killed
    with kill -9: the messages its member had not acknowledged were not acknowledged by b to
    a either (custody.py ``hold``), so a sends them again to c's member, whose share is then
    all 40 (b's member's were never acknowledged: re-sends, counted, not losses)."""
    from support.mesh import status

    nodes, worker = _stalled_member_in_a_triangle(
        broker_factory, paho, clients, "b", 40, 20, clean=clean, extra=["--shared-strategy", "round_robin"]
    )  # (b's member has its half, unacknowledged; persistent: b is its home)
    nodes["b"].kill()
    got = _drain({"worker": worker}, 40, timeout=40.0)["worker"]
    assert sorted(got) == sorted(b"%d" % i for i in range(40))
    with pytest.raises(queue.Empty):
        worker.get(timeout=0.5)  # (each once to c's member)
    assert status(nodes["a"])["counters"]["shared_rerouted"] == 20
    assert status(nodes["c"])["counters"]["shared_held"] >= 20  # (c's member's waits, settled)


def test_a_persistent_member_in_a_mesh_hands_its_queue_on_and_keeps_it_when_alone(mesh, paho, paho5, clients):
    """Line c - b - a, publisher on a. P, a persistent 3.1.1 member (CleanSession=0), on b;
    W, a clean one, on c. The local strategy serves the group on b, the nearest node with a
    connected member: P takes 10 QoS 1 messages and leaves without acknowledging them. W is
    connected on c, so b hands P's 10 on to it, and b's group, with no connected member, is
    advertised as queueing: the next 10 go to W directly. W leaves: the group's only member is
    P, offline, whose home b queues the next 5 for it. P comes back on another node, a: the
    claim gathers its session from b, with the 5, which P gets there. MQTT 5: a persistent
    session is told Shared Subscription Available 1 and may subscribe."""
    from support.mesh import wait_interest
    from support.probes import reset as reset_conn

    kept = paho5("kept5")
    rc, _, props = kept.connect(mesh["a"], clean_start=False, SessionExpiryInterval=60)
    assert rc == 0 and props.SharedSubscriptionAvailable == 1
    assert [int(getattr(x, "value", x)) for x in kept.subscribe("$share/k5/other/#", 1)] == [1]
    p = clients(mesh["b"], "P", clean=False)
    assert p.sub(1, ("$share/g/q/#", 1)) == [1]
    w = paho("W")
    assert w.connect(mesh["c"]) == 0
    w.subscribe("$share/g/q/#", 1)
    for n in ("b", "c"):
        wait_interest(mesh, "$share/g/q/#", n)
    pub = clients(mesh["a"], "pubq")
    for i in range(10):
        pub.pub("q/t", b"%d" % i, qos=1, pid=i + 1)
    assert sorted(x.payload for x in p.publishes(10)) == sorted(b"%d" % i for i in range(10))
    reset_conn(p.sock)
    moved = _drain({"W": w}, 10, timeout=15.0)["W"]
    assert sorted(moved) == sorted(b"%d" % i for i in range(10))
    wait_interest(mesh, "$share/g/q/#\0q", "b")  # (b: its member queues)
    for i in range(10, 20):
        pub.pub("q/t", b"%d" % i, qos=1, pid=i + 1)
    assert sorted(_drain({"W": w}, 10)["W"]) == sorted(b"%d" % i for i in range(10, 20))
    w.stop()
    wait_interest(mesh, "$share/g/q/#", "c", present=False)
    for i in range(20, 25):
        pub.pub("q/t", b"%d" % i, qos=1, pid=i + 1)
    back = clients(mesh["a"], "P", clean=False)
    assert back.session_present
    got = back.publishes(5, timeout=10.0)
    assert sorted(x.payload for x in got) == sorted(b"%d" % i for i in range(20, 25))


def _shared_bench(tmp_path, *args: str, timeout: float = 120) -> tuple[list[dict], str]:
    """bench/shared.py run with ``args``, bounded: its JSON rows and what it printed."""
    import json
    import sys

    out = tmp_path / "shared.json"
    run = subprocess.run(
        [sys.executable, "-m", "bench.shared", "--rounds", "1", "--out", str(out), "--logs", str(tmp_path), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    return json.loads(out.read_text()), run.stdout


def test_the_shared_benchmark_runs_beside_mosquitto(tmp_path):
    """bench/shared.py, small: both brokers deliver every message once to the group."""
    rows, _ = _shared_bench(tmp_path, "--messages", "400", "--timeout", "30")
    assert {r["broker"] for r in rows} == {"mqttmesh", "mosquitto"}
    for r in rows:
        assert (r["fraction"], r["twice"]) == (1.0, 0), r
        assert r["msgs_per_s"] > 0 and r["p99_ms"] is not None


def test_the_shared_benchmark_runs_on_a_3_node_mesh(tmp_path):
    """bench/shared.py --nodes 3, small: mqttmesh as 3 nodes (2 members each, publishers
    spread) with two strategies, Mosquitto as one node with the same clients; every message
    once to the group. ``local`` serves each message on its publisher's node (every node has
    members): nothing crosses a link; ``round_robin`` takes the nodes in turn: some do."""
    rows, printed = _shared_bench(
        tmp_path,
        *("--nodes", "3", "--strategy", "local,round_robin", "--publishers-on", "all"),
        *("--messages", "400", "--timeout", "40"),
        timeout=180,
    )
    by_label = {r["label"]: r for r in rows}
    assert set(by_label) == {"mqttmesh x3 local pubs:all", "mqttmesh x3 round_robin pubs:all", "mosquitto"}
    fields = {"msgs_per_s", "fraction", "twice", "spread", "shares", "crossed", "cpu_us_per_msg", "p50_ms", "p99_ms"}
    for r in rows:
        assert fields <= set(r), r
        assert (r["fraction"], r["twice"]) == (1.0, 0), r
        assert sum(r["shares"]) == r["published"] == 400, r
        assert r["p99_ms"] is not None and r["cpu_us_per_msg"] >= 0, r
        assert r["nodes"] == (1 if r["broker"] == "mosquitto" else 3), r
    assert by_label["mqttmesh x3 local pubs:all"]["crossed"] == 0
    assert by_label["mqttmesh x3 round_robin pubs:all"]["crossed"] > 0
    assert by_label["mosquitto"]["crossed"] == 0
    assert "| mqttmesh x3 round_robin pubs:all |" in printed and "| mosquitto |" in printed


def test_an_origin_killed_holding_what_its_own_member_took_sends_it_to_another_member(
    broker_factory, paho, clients, tmp_path
):
    """Triangle a, b, c with stores, local strategy; the publisher and a stalled member (a raw
    clean client that takes its messages and never acknowledges them) on a, another member on
    c. The local strategy serves every one of 20 QoS 1 messages on a; each is acknowledged to
    the publisher. a is killed with kill -9 and started again on its store: the messages its
    member took and never acknowledged were acknowledged to the publisher, so they reach the
    member on c (re-sends after a member's death, not losses)."""
    from support.mesh import status

    nodes, worker = _stalled_member_in_a_triangle(
        broker_factory, paho, clients, "a", 20, 20, data_dirs=tmp_path
    )  # (a's member has them all, unacknowledged)
    wait_for(lambda: status(nodes["a"])["counters"]["shared_held_here"] == 20, 10, what="20 kept in a's store")
    nodes["a"].kill()
    nodes["a"].start()
    got = _drain({"worker": worker}, 20, timeout=40.0)["worker"]
    assert sorted(got) == sorted(b"%d" % i for i in range(20))
    with pytest.raises(queue.Empty):
        worker.get(timeout=0.5)  # (each once to c's member)
