"""Message Expiry through a claim whose copies arrive at different times, on the cluster
cores of four nodes wired by tests/support/cluster_net.py (time is an argument: a slow
holder is one whose answer is handed over later).

A claim merges the copies it gathered onto the time the last one came (snapshots.py
``merge_snapshots``): every remaining life a copy carries was measured when that copy was
taken, so it is counted from then, the inbound QoS 2 messages awaiting PUBREL too, which
the node the client moved to routes again under their agreed ids. Rule ids are MQTT 5.0's.
"""

from __future__ import annotations

from collections import deque

import pytest

from mqttmesh import properties as P
from mqttmesh.mesh.cluster.cluster import ClusterSettings
from support import mqttraw5 as r5
from support.cluster_net import Net, cid_with

KEEP = r5.props((P.SESSION_EXPIRY, r5.u32(300)))  # a session that outlives its connection


@pytest.mark.parametrize("slow_answer_at, left", [(1.8, 0.2), (2.2, 0.0)])
def test_a_qos2_message_gathered_from_copies_taken_at_different_times_gets_no_more_life(slow_answer_at, left):
    """A persistent publisher sends a QoS 2 message with a Message Expiry Interval of 2 s at
    t=0 on node a; its holders b, c, d have it awaiting PUBREL, a dies before routing it.
    The client connects to b at t=0.5: c's copy comes at once (1.5 s left of the message),
    d's only at ``slow_answer_at``. b routes the message then, under its agreed id, with what
    is left of its life at that time: 0.2 s, or none (expired: delivered to no one
    [MQTT-3.3.2-5]), never the 1.5 s c's copy had when it came, counted from d's answer."""
    net = Net(names=["a", "b", "c", "d"], settings=ClusterSettings(replication=3, stall=1e9))
    cid = cid_with(net, lambda regs, holders: sorted(holders) == ["b", "c", "d"] and regs[0] == "b", prefix="pub")
    sub = net.connect("b", "sub", clean=True)
    net.brokers["b"].table.subscribe(sub.session, "t/#", 2)
    pub = net.client("a")
    pub.receive_data(r5.connect(cid, clean=False, properties=KEEP), net.t)
    net.pump()
    expiry = r5.props((P.MESSAGE_EXPIRY, r5.u32(2)))
    pub.receive_data(r5.publish("t/1", b"x", qos=2, pid=1, properties=expiry), net.t)
    net.clusters["a"].flush(net.t)  # b, c and d have it with its id; a routes nothing
    for item in [m for m in net.queue if m[0] == "a"]:
        net.queue.remove(item)
        net.clusters[item[1]].receive(item[0], item[2], item[3], net.t)
    assert all(net.brokers[n].sessions[cid].awaiting_rel == {1} for n in "bcd")
    net.up.discard("a")  # kill -9
    net.queue = deque(m for m in net.queue if m[1] != "a")
    net.membership()

    net.t = 0.5
    moved = net.client("b")
    moved.receive_data(r5.connect(cid, clean=False, properties=KEEP), net.t)
    slow = net.pump_holding("sess.state", "d")
    assert [(frm, dest) for frm, dest, _, _ in slow] == [("d", "b")]  # (c answered at 0.5)
    assert moved.state == "claiming" and net.published["b"] == []
    net.t = slow_answer_at
    for frm, dest, kind, payload in slow:
        net.clusters[dest].receive(frm, kind, payload, net.t)
    net.pump()

    assert moved.state != "claiming"
    [routed] = net.published["b"]
    assert (routed.origin, routed.seq) == ("a", 1)
    # (on b's clock: when it expired everywhere, or now for one whose life is over)
    assert routed.expires == pytest.approx(max(2.0, slow_answer_at))
    assert max(routed.ttl, 0.0) == pytest.approx(left)
    assert bool(sub.frames) is (left > 0.0)  # the subscriber on b: only while it lives
