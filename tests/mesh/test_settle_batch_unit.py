"""One settlement batch of a session's out at a time (issue 26, holders.py ``flush``): the next
gathers while the holders answer the last, and what gathers never outlives the connection it
was made on, nor is played again on a copy that has it (docs/design.md, "Replicated before
acknowledged")."""

from __future__ import annotations

import json

from mqttmesh.message import Message
from support.cluster_net import FakeChannel, Net, cid_with


def _subscriber(net: Net) -> tuple[str, FakeChannel]:
    cid = cid_with(net, lambda regs, holders: set(holders) == {"a", "b"})
    ch = net.connect("a", cid, clean=False)
    net.brokers["a"].table.subscribe(ch.session, "t/#", 2)
    net.pump()
    return cid, ch


def _publish(net: Net, topic: str) -> Message:
    """A QoS 2 message published at a, brought to every node (nothing pumped)."""
    broker = net.brokers["a"]
    msg = Message(topic, b"x", 2, False, "a", broker.next_seq(), "pub", net.t + 1_000_000.0)
    broker.publish(msg)
    for n in sorted(net.up - {"a"}):
        net.brokers[n].deliver_remote(Message(topic, b"x", 2, False, "a", msg.seq, "pub", msg.timestamp))
    return msg


def _settles(net: Net, since: int) -> list[dict]:
    return [json.loads(p) for frm, _, kind, p in net.sent[since:] if kind == "sess.settle" and frm == "a"]


def _pids(session) -> dict[int, int]:
    """packet id -> message seq of what is in flight."""
    return {pid: e.msg.seq for pid, e in session.inflight.items()}


def test_a_sessions_settlements_gather_while_the_holders_answer_its_last_batch():
    net = Net()
    cid, ch = _subscriber(net)
    mark = len(net.sent)
    _publish(net, "t/1")
    acks = net.pump_holding("sess.ack")  # the batch with its "sent" is out, unanswered
    _publish(net, "t/2")
    _publish(net, "t/3")
    net.pump()
    assert len(_settles(net, mark)) == 1  # (the two "sent" gather)
    assert ch.frames == [] and len(ch.held) == 3  # every PUBLISH waits: b has none of the ids it needs
    for frm, dest, kind, payload in acks:
        net.clusters[dest].receive(frm, kind, payload, net.t)
    assert len(ch.frames) == 1  # the first one's id is at b
    net.pump()  # the gathered batch goes, in one message, and its answer lets the rest out
    batches = _settles(net, mark)
    assert [len(b["items"]) for b in batches] == [1, 2]
    assert len(ch.frames) == 3 and ch.held == []
    held = net.brokers["b"].sessions[cid]
    assert _pids(held) == _pids(ch.session) and held.version == ch.session.version


def test_settlements_gathered_on_a_connection_do_not_reach_the_holders_under_the_next_one():
    """A batch gathered while the holders had not answered the last goes when the client
    leaves (no answer is waited for then), and a copy to every holder says what it gathered.
    Kept back until the same node served the client again (the settle-batch trial: held while
    sent_version > safe_version, which a new claim resets), it went under the new claim's
    epoch and was played on the new claim's copy: the old connection's "done" of the first
    message took out of b's copy the id the new connection has it under at PUBREL (the merge
    releases it), so a claim at b would take that id for free and give it to the next message,
    which the client, holding it awaiting PUBREL, takes for a re-send and drops."""
    net = Net()
    cid, ch = _subscriber(net)
    m1 = _publish(net, "t/1")
    net.pump()
    (pid1,) = ch.session.inflight
    ch.session.on_pubrec(pid1)  # the client's PUBREC: "rel" goes, PUBREL waits for b
    lost = net.pump_holding("sess.ack")  # ... whose answer the links lose
    assert lost
    ch.session.on_pubcomp(pid1, net.t)  # PUBCOMP: "done" gathers
    m2 = _publish(net, "t/2")  # "sent" gathers; its PUBLISH waits
    net.pump()
    assert m1.seq not in {e.msg.seq for e in ch.session.inflight.values()}
    ch.close("gone")  # (Session Expiry Interval kept: no copy when it leaves)
    net.pump()
    again = net.connect("a", cid, clean=False)  # back on the same node: a new claim, a new epoch
    assert again.present is True
    net.pump()
    mine = again.session
    held = net.brokers["b"].sessions[cid]
    seq2 = {seq: pid for pid, seq in _pids(mine).items()}
    assert m2.seq in seq2  # sent again on this connection
    assert _pids(held) == _pids(mine)  # b has it under the id the client has
    assert held.epoch == mine.epoch and held.version == mine.version


def test_a_batch_that_overlaps_a_copy_the_holder_has_is_not_played_again():
    """A copy sent while a batch gathered (settle_retry, a holder back in view) has that batch's
    first settlements: the holder follows on from it (its version is the sender's again, no
    gap, no copy at the next settle_retry) and plays only what the copy lacked."""
    net = Net()
    cid, ch = _subscriber(net)
    _publish(net, "t/1")
    net.clusters["a"].flush(net.t)
    net.queue.clear()  # the batch with its "sent" is lost
    _publish(net, "t/2")
    net.pump()  # ("sent" of t/2 gathers behind the lost batch)
    assert ch.frames == []
    net.tick(0.6)  # settle_retry: b gets a copy, which has both
    assert len(ch.frames) == 2  # b has both ids
    net.pump()
    held = net.brokers["b"].sessions[cid]
    assert held.version == ch.session.version
    assert net.clusters["b"].counters["settle_gaps"] == 0
    (pid1, pid2) = sorted(ch.session.inflight)
    ch.session.on_pubrec(pid1)
    net.pump()
    assert held.version == ch.session.version and _pids(held) == _pids(ch.session)
    assert net.clusters["b"].counters["settle_gaps"] == 0
    assert net.clusters["a"].counters["settle_retries"] == 1
