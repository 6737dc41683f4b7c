"""Custody's retransmission (mesh/routing/custody.py): a message is sent again when it is
likely lost, not because its acknowledgement is late (issue 20: under load every QoS 1
message across two nodes was sent twice, 119,576 retransmissions for 80,000 messages).

Lost: the destination acknowledged a later message of ours, or has said nothing for a
whole ``retransmit_after``, or a link came up or went down. In the pipe: the destination
acknowledges our messages in order and has not got this far yet.
"""

from __future__ import annotations

from mqttmesh.mesh.routing.engine import MeshSettings
from mqttmesh.message import Message
from support.engine_net import Net


def _send(net: Net, seq: int, qos: int = 1) -> None:
    net.engines["a"].route_local(Message("t/1", b"x", qos, False, "a", seq, "c", net.t), net.t)
    for name, e in net.engines.items():
        net._pump(name, e.flush(net.t))


def _deliver(net: Net, keep) -> None:
    """Deliver what is queued, dropping the fwd messages ``keep`` refuses."""
    while net.queue:
        frm, to, kind, payload = net.queue.popleft()
        if kind == "fwd" and not keep(frm, to):
            continue
        net._take(to, net.engines[to].receive(frm, kind, payload, net.t))
        for name, e in net.engines.items():
            net._pump(name, e.flush(net.t))


def _tick(net: Net, t: float) -> None:
    net.t = t
    for name, e in net.engines.items():
        net._pump(name, e.tick(t))


def test_a_message_still_in_the_pipe_is_not_sent_again_while_its_destination_acknowledges():
    net = Net(["a", "b"], [("a", "b")], MeshSettings(retransmit_after=2.0))
    net.subscribe("b", "t/#")
    a = net.engines["a"]
    _send(net, 1)
    _deliver(net, lambda f, t: True)  # 1 delivered and acknowledged at t=0
    _send(net, 2)
    net.queue.clear()  # 2 is "in the pipe": sent, not arrived yet
    _tick(net, 2.1)  # 2 is due; b was heard 2.1 s ago: silent for a whole timer, so it may be lost
    assert a.counters["custody_retransmits"] == 1
    net.queue.clear()
    # now b acknowledges steadily (3 arrives) while 4 is still on its way
    net.t = 4.0
    _send(net, 3)
    _deliver(net, lambda f, t: True)
    _send(net, 4)
    net.queue.clear()
    _tick(net, 6.05)  # 4 due; b acknowledged 3 (before 4) 2.05 s ago: silent, may be lost
    assert a.counters["custody_retransmits"] == 2
    net.queue.clear()
    net.t = 8.0
    _send(net, 5)
    net.queue.clear()
    _send(net, 6)
    _deliver(net, lambda f, t: True)  # b takes 6 (5 was lost): it holds 6 for 5, asks for it
    assert a.counters["reorder_resent"] >= 1  # (order.py: 5 again at once, on b's nack)


def test_a_due_message_waits_while_later_ones_are_not_acknowledged_yet_and_goes_when_one_is():
    net = Net(["a", "b"], [("a", "b")], MeshSettings(retransmit_after=2.0))
    net.subscribe("b", "t/#")
    a = net.engines["a"]
    _send(net, 1)
    _deliver(net, lambda f, t: True)
    pending = []
    _send(net, 2)
    pending += list(net.queue)
    net.queue.clear()
    net.t = 1.5
    _send(net, 3)
    _deliver(net, lambda f, t: True)  # 3 arrives before 2: held at b (not acknowledged)
    _tick(net, 1.9)
    assert a.counters["custody_retransmits"] == 0
    # b was heard at 0 (1's ack) and 1.5 (its nack, not an ack): at 2.1, 2 is due and b has
    # acknowledged nothing later for a whole timer: 2 goes again
    _tick(net, 2.1)
    _deliver(net, lambda f, t: True)
    assert [seq for _, seq, _ in net.delivered["b"]] == [1, 2, 3]
    assert not a.custody


def test_a_link_that_changed_sends_everything_due_at_once():
    net = Net(["a", "b", "c"], [("a", "b"), ("b", "c"), ("a", "c")], MeshSettings(retransmit_after=2.0))
    net.subscribe("c", "t/#")
    a = net.engines["a"]
    _send(net, 1)
    _deliver(net, lambda f, t: True)
    _send(net, 2)
    net.queue.clear()  # lost with the link a-c
    net.t = 0.5
    net.cut("a", "c")  # a's link to c went down: what it carried may be lost
    _tick(net, 0.5)
    assert a.counters["custody_retransmits"] == 1  # at once, through b
    _deliver(net, lambda f, t: True)
    assert [seq for _, seq, _ in net.delivered["c"]] == [1, 2] and not a.custody


def test_acknowledgements_in_the_pipe_do_not_cause_a_second_copy_under_load():
    """Many messages in flight, acknowledgements flowing but 2.5 s late (longer than the
    timer): what was due before the first acknowledgement came goes again (the destination
    had said nothing for a whole timer), nothing after it."""
    net = Net(["a", "b"], [("a", "b")], MeshSettings(retransmit_after=2.0))
    net.subscribe("b", "t/#")
    a = net.engines["a"]
    backlog = []
    first_ack = None
    for i in range(1, 801):
        net.t = i * 0.01  # 100 messages a second; the link delivers each 2.5 s late
        _send(net, i)
        backlog += [(net.t + 2.5, q) for q in net.queue]
        net.queue.clear()
        while backlog and backlog[0][0] <= net.t:
            net.queue.append(backlog.pop(0)[1])
        _deliver(net, lambda f, t: True)
        if first_ack is None and a.custody and min(a.custody) > 1:
            first_ack = a.counters["custody_retransmits"]
        if i % 25 == 0:
            _tick(net, net.t)
    assert first_ack is not None and first_ack <= 50  # (sent in the first 0.5 s: due before any ack)
    assert a.counters["custody_retransmits"] == first_ack and a.counters["custody_waited"] > 0
