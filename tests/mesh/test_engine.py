"""The routing engine on an instant in-memory network: loop freedom, exactly once, no flooding.

The network here delivers every Send at once, in order; the discrete-event
simulator (mqttmesh.sim) adds latency, loss and faults on top of the same engine.
"""

from __future__ import annotations

import json
import random
from collections import deque

import pytest

from mqttmesh.mesh.custody import Custody
from mqttmesh.mesh.engine import MeshEngine, MeshSettings
from mqttmesh.mesh.lsdb import newest_only
from mqttmesh.message import Message


class Net:
    def __init__(self, names, edges, settings=None):
        self.t = 0.0
        self.engines = {n: MeshEngine(n, 1, [f"{n}:1883"], settings or MeshSettings()) for n in names}
        self.links = set()
        self.queue = deque()
        self.delivered = {n: [] for n in names}
        self.fwd_per_link = {}
        self.seq = {n: 0 for n in names}
        for e in self.engines.values():
            e.start(self.t)
        for a, b in edges:
            self.connect(a, b)
        self.settle()

    def connect(self, a, b):
        self.links.add(frozenset((a, b)))
        self.engines[a].link_up(b, self.t)
        self.engines[b].link_up(a, self.t)

    def cut(self, a, b):
        self.links.discard(frozenset((a, b)))
        self.engines[a].link_down(b, self.t)
        self.engines[b].link_down(a, self.t)

    def _pump(self, name, sends):
        for peer, kind, payload, _qos in sends:
            if frozenset((name, peer)) in self.links:
                self.queue.append((name, peer, kind, payload))

    def _take(self, name, inbound):
        for msg in inbound.deliveries:
            self.delivered[name].append((msg.origin, msg.seq, msg.topic))
            if msg.qos:  # QoS 1/2: acknowledged end to end, as the broker does once it is safe
                self.engines[name].delivered(msg)

    def settle(self, limit=100_000):
        steps = 0
        while True:
            for name, e in self.engines.items():
                self._pump(name, e.flush(self.t))
            if not self.queue:
                return steps
            while self.queue:
                frm, to, kind, payload = self.queue.popleft()
                if kind == "fwd":
                    self.fwd_per_link[(frm, to)] = self.fwd_per_link.get((frm, to), 0) + 1
                self._take(to, self.engines[to].receive(frm, kind, payload, self.t))
                steps += 1
                assert steps < limit, "the network does not settle: a loop?"

    def subscribe(self, node, topic_filter):
        self.engines[node].local_filter_added(topic_filter)
        self.settle()

    def publish(self, node, topic, qos=0):
        self.seq[node] += 1
        msg = Message(topic, b"x", qos, False, node, self.seq[node], "c", self.t)
        self.engines[node].route_local(msg, self.t)
        self.settle()
        return (node, self.seq[node], topic)


def ring(n):
    names = [f"n{i}" for i in range(n)]
    return names, [(names[i], names[(i + 1) % n]) for i in range(n)]


def test_full_mesh_one_hop_and_only_to_interested_nodes():
    names = ["a", "b", "c"]
    net = Net(names, [("a", "b"), ("b", "c"), ("a", "c")])
    net.subscribe("c", "sensors/#")
    m = net.publish("a", "sensors/t")
    assert net.delivered["c"] == [m]
    assert net.delivered["b"] == []
    assert net.fwd_per_link == {("a", "c"): 1}  # b wants nothing and receives nothing


@pytest.mark.parametrize("n", [5, 8])
def test_ring_delivers_exactly_once_along_tree_edges(n):
    names, edges = ring(n)
    net = Net(names, edges)
    subscribers = names[1::2]
    for s in subscribers:
        net.subscribe(s, "t/#")
    for publisher in names:
        net.fwd_per_link.clear()
        for s in names:
            net.delivered[s].clear()
        m = net.publish(publisher, "t/x", qos=1)
        for s in names:
            expected = [m] if s in subscribers and s != publisher else []
            assert net.delivered[s] == expected, (publisher, s)
        # every link carries at most one copy, and exactly the edges of the union of paths
        assert all(v == 1 for v in net.fwd_per_link.values())
        net.engines[publisher].route_to(publisher)
        tree = net.engines[publisher].parent
        used = set()
        for s in subscribers:
            node = s
            while node != publisher:
                used.add((tree[node], node))
                node = tree[node]
        assert set(net.fwd_per_link) == used


def test_random_graph_with_cycles_no_loops_exactly_once():
    rng = random.Random(7)
    names = [f"r{i}" for i in range(8)]
    edges = {(names[i], names[i + 1]) for i in range(7)}
    while len(edges) < 14:
        a, b = rng.sample(names, 2)
        if (b, a) not in edges:
            edges.add((a, b))
    net = Net(names, sorted(edges))
    subs = rng.sample(names, 4)
    for s in subs:
        net.subscribe(s, "+/room/#")
    for publisher in names:
        for s in names:
            net.delivered[s].clear()
        net.fwd_per_link.clear()
        m = net.publish(publisher, "home/room/1")
        for s in names:
            assert net.delivered[s] == ([m] if s in subs and s != publisher else [])
        assert all(v == 1 for v in net.fwd_per_link.values())
        assert len(net.fwd_per_link) == len({e for e in net.fwd_per_link})


def test_link_failure_reroutes_and_custody_retransmits():
    # a - b - d and a - c - d; b is cheaper
    net = Net(["a", "b", "c", "d"], [("a", "b"), ("b", "d"), ("a", "c"), ("c", "d")])
    for x, y in [("a", "c"), ("c", "d")]:
        for u, v in [(x, y), (y, x)]:
            net.engines[u]._set_cost(v, 50_000, net.t)
    net.settle()
    net.subscribe("d", "q/#")
    assert net.engines["a"].route_to("d") == "b"
    # b dies silently with a message in its hands: a keeps it in custody
    net.links.discard(frozenset(("b", "d")))
    net.links.discard(frozenset(("a", "b")))
    m = net.publish("a", "q/1", qos=1)
    assert net.delivered["d"] == []
    assert len(net.engines["a"].custody) == 1
    net.t += 1
    net.engines["a"].link_down("b", net.t)
    net.engines["d"].link_down("b", net.t)
    net.settle()
    assert net.engines["a"].route_to("d") == "c"
    net.t += 0.1
    net._pump("a", net.engines["a"].tick(net.t))
    net.settle()
    assert net.delivered["d"] == [m]
    assert net.engines["a"].custody == {}


def test_duplicate_retransmission_is_delivered_once_and_acked_again():
    net = Net(["a", "b"], [("a", "b")])
    net.subscribe("b", "x")
    a = net.engines["a"]
    m = net.publish("a", "x", qos=2)
    assert net.delivered["b"] == [m] and a.custody == {}
    # resend the same message as a retransmission: delivered once, acked again
    msg = Message("x", b"x", 2, False, "a", m[1], "c", 0)
    a.custody[m[1]] = Custody(msg, {"b"}, 0.0, 0.0)
    net.t = 10
    net._pump("a", a.tick(net.t))
    net.settle()
    assert net.delivered["b"] == [m]
    assert a.custody == {}


def test_partition_and_heal_resynchronise_interest():
    net = Net(["a", "b", "c", "d"], [("a", "b"), ("b", "c"), ("c", "d"), ("d", "a")])
    net.cut("b", "c")
    net.cut("d", "a")
    net.settle()
    net.subscribe("c", "late/#")  # made during the split: a and b cannot know yet
    assert net.engines["a"].nodes_wanting("late/1") == []
    assert net.engines["d"].nodes_wanting("late/1") == ["c"]
    net.connect("b", "c")
    net.connect("d", "a")
    net.settle()
    assert net.engines["a"].nodes_wanting("late/1") == ["c"]
    m = net.publish("a", "late/1")
    assert net.delivered["c"] == [m]


def test_restart_with_higher_incarnation_replaces_old_state():
    net = Net(["a", "b"], [("a", "b")])
    net.subscribe("b", "old/#")
    net.cut("a", "b")
    fresh = MeshEngine("b", 2, ["b:1883"])
    fresh.start(net.t)
    net.engines["b"] = fresh
    net.connect("a", "b")
    net.settle()
    assert net.engines["a"].nodes_wanting("old/x") == []  # the new b has no subscribers
    assert net.engines["a"].routers["b"].inc == 2


def test_unicast_is_routed_hop_by_hop_to_its_destination():
    names, edges = ring(5)
    net = Net(names, edges)
    got = []
    original = net._take

    def take(name, inbound):
        got.extend((name, *unicast) for unicast in inbound.unicasts)
        original(name, inbound)

    net._take = take
    assert net.engines["n0"].send_unicast("n2", "claim", b"\x00binary\xff")
    net.settle()
    assert got == [("n2", "n0", "claim", b"\x00binary\xff")]
    assert not net.engines["n0"].send_unicast("nobody", "x", b"")


def test_delivery_filter_forgets_by_generations_and_fails_safe_per_qos():
    from mqttmesh.mesh.dedup import DeliveryFilter

    f = DeliveryFilter(window=4)
    assert not f.seen("o", 1) and f.seen("o", 1)
    for seq in range(2, 20):
        assert not f.seen("o", seq)
    assert f.seen("o", 19) and f.seen("o", 13)  # the two generations still known
    # 3 was forgotten: QoS 1 may be delivered again (at least once), QoS 2 may not
    assert f.seen("o", 4, qos=2)
    assert not f.seen("o", 3, qos=1)
    assert not f.seen("other-origin", 3)  # origins are independent


# --- what the simulator found (docs/simulation.md, "Findings"), each fixed and kept fixed


def test_only_the_newest_version_of_an_advertisement_leaves_in_a_flush():
    # finding 3: a burst of link events queued several versions of a's router advertisement
    # for the same neighbour; only the newest goes, and each full interest only once
    a = MeshEngine("a", 1)
    a.start(0.0)
    a.link_up("b", 0.0)
    for peer in ("c", "d", "e"):
        a.link_up(peer, 0.0)
        a.link_down(peer, 0.0)
    sent = [json.loads(p) for peer, kind, p, _q in a.flush(0.0) if peer == "b" and kind == "lsa"]
    routers = [lsa for batch in sent for lsa in batch if lsa["t"] == "router" and lsa["node"] == "a"]
    assert [r["seq"] for r in routers] == [a.routers["a"].seq]
    assert routers[0]["links"] == {"b": 1000}


def test_newest_only_keeps_deltas_after_a_full_interest():
    lsas = [
        {"t": "interest", "node": "x", "inc": 1, "ver": 2, "base": 1, "add": ["a"], "del": []},
        {"t": "interest", "node": "x", "inc": 1, "ver": 3, "full": ["a", "b"]},
        {"t": "interest", "node": "x", "inc": 1, "ver": 3, "full": ["a", "b"]},
        {"t": "interest", "node": "x", "inc": 1, "ver": 4, "base": 3, "add": ["c"], "del": []},
        {"t": "router", "node": "x", "inc": 1, "seq": 7, "links": {}},
        {"t": "router", "node": "x", "inc": 1, "seq": 5, "links": {}},
        {"t": "interest", "node": "y", "inc": 2, "ver": 1, "base": 0, "add": ["q"], "del": []},
    ]
    kept = newest_only(lsas)
    assert kept == [lsas[1], lsas[3], lsas[4], lsas[6]]


def test_refreshes_are_jittered_and_deterministic():
    # finding 7: nodes whose last origination coincided must not refresh together for ever
    settings = MeshSettings(refresh_interval=30.0)
    due = []
    for name in ("a", "b", "c", "d"):
        e = MeshEngine(name, 1, settings=settings)
        e.start(0.0)
        due.append(e._next_refresh)
        again = MeshEngine(name, 1, settings=settings)
        again.start(0.0)
        assert again._next_refresh == e._next_refresh  # no hidden randomness
    assert all(22.5 <= d <= 30.0 for d in due)
    assert len(set(due)) == 4


def test_the_handshake_rtt_is_the_first_cost_of_a_link():
    # finding 2: a link is advertised once, at its measured cost, not at the floor first
    a = MeshEngine("a", 1)
    a.start(0.0)
    a.link_up("b", 0.0, cost=40_000)
    assert a.routers["a"].links == {"b": 40_000}
    a.link_rtt("b", 41_000, 1.0)  # the first PINGRESP agrees: nothing to re-advertise
    assert a.routers["a"].seq == 2
    assert json.loads(a.hello(rtt_us=40_000.4)) == {"node": "a", "inc": 1, "addr": [], "rtt": 40_000}


def test_custody_lets_go_of_a_node_that_aged_out():
    # finding 4: a destination gone for good no longer pins messages in custody
    settings = MeshSettings(max_age=10.0)
    net = Net(["a", "b", "c"], [("a", "b"), ("b", "c")], settings)
    net.subscribe("b", "t/#")
    net.subscribe("c", "t/#")
    net.links.discard(frozenset(("b", "c")))
    net.t = 1.0
    net.engines["b"].link_down("c", net.t)
    net.settle()
    net.publish("a", "t/1", qos=1)  # b acknowledges, c is unreachable
    assert [c.dests for c in net.engines["a"].custody.values()] == [{"c"}]
    net.t = 20.0
    net._pump("a", net.engines["a"].tick(net.t))
    assert net.engines["a"].custody == {}
    assert net.engines["a"].counters["custody_expired"] == 1


def test_a_full_custody_gives_up_on_the_oldest_message():
    settings = MeshSettings(custody_limit=3)
    net = Net(["a", "b"], [("a", "b")], settings)
    net.subscribe("b", "t/#")
    net.links.clear()  # b stops answering
    seqs = [net.publish("a", "t/1", qos=1)[1] for _ in range(5)]
    assert list(net.engines["a"].custody) == seqs[2:]
    assert net.engines["a"].counters["custody_overflow"] == 2
