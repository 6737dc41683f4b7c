"""A connection the mesh ends itself (a kick: the ClientId claimed on another node, a fence)
and the copy of its session the holders get then, on the cluster cores of three nodes wired
by tests/support/cluster_net.py, the connection a real Channel.

The copy says what is left of each message's life and of the Session Expiry Interval as of
when it is made (snapshots.py ``snapshot``), and the holders count it from its arrival: it
must be made with the node's time of the end, not with the connection's last read, which
can be seconds before when its client went quiet (simulator finding 24, fuzz seed 47: a
re-send said 5 s of a message with 0.71 s left). Rule ids are MQTT 5.0's.
"""

from __future__ import annotations

import pytest

from mqttmesh import properties as P
from mqttmesh.codec import ConnAck, Decoder, Publish
from mqttmesh.mesh.cluster.cluster import ClusterSettings
from mqttmesh.message import Message
from support import mqttraw5 as r5
from support.cluster_net import Net, cid_with

DEADLINE = 1.0 + 3.0  # the message: published at t=1 with a Message Expiry Interval of 3 s


def _answers(ch) -> list:
    d = Decoder(version=5)
    d.feed(ch.data_to_send())
    return list(d.packets())


def _quiet_subscriber(net: Net, cid: str, session_expiry: int):
    """A persistent MQTT 5 subscriber on a whose client goes quiet after its SUBSCRIBE (t=0):
    at t=1 a QoS 1 message with 3 s to live reaches it (in flight, never acknowledged)."""
    keep = r5.props((P.SESSION_EXPIRY, r5.u32(session_expiry)))
    sub = net.client("a")
    sub.receive_data(r5.connect(cid, clean=False, keepalive=0, properties=keep), net.t)
    net.pump()
    sub.receive_data(r5.subscribe(1, ("t/#", 1)), net.t)
    net.pump()
    net.t = 1.0
    for n in net.names:  # (the routing engine's part: every node takes it, each on its clock)
        msg = Message("t/1", b"x", 1, False, "c", 1, "pub", net.t).expiring(3.0, net.t)
        (net.brokers[n].publish if n == "c" else net.brokers[n].deliver_remote)(msg)
    net.pump()
    got = [p for p in _answers(sub) if isinstance(p, Publish)]
    assert [(p.payload, p.properties[P.MESSAGE_EXPIRY]) for p in got] == [(b"x", 3)]
    assert sub.last_rx == 0.0
    return sub


def test_a_kicked_connections_copy_gives_no_message_more_life_than_it_has():
    """The client went quiet at t=0 and connects to b at t=3: the registrar kicks its
    connection on a, whose session copy reaches the other holders before the claim gathers.
    Each copy has the message expire when it does (t=4) and the session 10 s after the kick,
    not 3 s later (counted from the connection's last read, t=0, as of the kick at t=3)."""
    net = Net(settings=ClusterSettings(replication=2, will_delay=0.5, stall=1e9))
    cid = cid_with(net, lambda regs, holders: "a" not in holders and regs[0] != "a")
    _quiet_subscriber(net, cid, session_expiry=10)
    net.t = 3.0
    moved = net.connect("b", cid, clean=False, pump=False, expiry=10)
    fetches = net.pump_holding("sess.fetch")
    assert moved.state == "claiming" and fetches
    holders = [n for n in net.names if n != "a" and cid in net.brokers[n].sessions]
    assert holders
    for n in holders:
        copy = net.brokers[n].sessions[cid]
        [entry] = list(copy.inflight.values()) + list(copy.queue)
        assert entry.msg.expires == pytest.approx(DEADLINE, abs=0.002)  # (ttl in whole ms, rounded up)
        assert copy.expires_at == pytest.approx(3.0 + 10, abs=0.002)


def test_a_resend_after_a_kick_says_what_is_left_of_the_message():
    """The shrunk run of fuzz seed 47 on three nodes: the client (Session Expiry 1 s) went
    quiet at t=0 and connects to b at t=3.4. The registrar kicks its connection on a; if a
    counts the session's end from the last read it finds it over at its next tick and drops
    its copy, and the claim gathers only the holders' copies. The re-send (DUP=1) says what
    is left of the message's life, 0.6 s, rounded up to 1 [MQTT-3.3.2-6], never the 4 s a
    copy dated from the last read would give it."""
    net = Net(settings=ClusterSettings(replication=2, will_delay=0.5, stall=1e9))
    cid = cid_with(net, lambda regs, holders: "a" not in holders and "b" in holders and regs[0] not in ("a", "b"))
    _quiet_subscriber(net, cid, session_expiry=1)
    net.t = 3.4
    moved = net.client("b")
    moved.receive_data(r5.connect(cid, clean=False, properties=r5.props((P.SESSION_EXPIRY, r5.u32(1)))), net.t)
    fetches = net.pump_holding("sess.fetch")
    assert fetches
    net.t = 3.45
    net.clusters["a"].tick(net.t)  # (a's timers run before the claim's fetch reaches it)
    for frm, dest, kind, payload in fetches:
        net.clusters[dest].receive(frm, kind, payload, net.t)
    net.pump()
    got = _answers(moved)
    assert isinstance(got[0], ConnAck) and got[0].session_present
    [resent] = [p for p in got if isinstance(p, Publish)]
    assert resent.dup and resent.payload == b"x"
    assert resent.properties[P.MESSAGE_EXPIRY] == 1  # ceil(4.0 - 3.45)
