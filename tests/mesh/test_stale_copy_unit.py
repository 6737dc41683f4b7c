"""Issue 20 (7 nodes, 400 msgs/s: 3,265 and 3,559 QoS 2 messages delivered twice): a copy of a
session that missed the settlements of messages it had queued brought them back, as new, to
the node the client moved to, once more ids had been settled since than a snapshot carried
(5,000). A snapshot now carries every settled id its copy remembers (TOMBSTONES, packed),
and past that the copy's floor per origin: a QoS 2 message at or below it that no up-to-date
copy holds is taken as settled, never delivered twice."""

from __future__ import annotations

import pytest

from mqttmesh.mesh import replica
from mqttmesh.mesh.cluster import ClusterSettings
from mqttmesh.mesh.cluster_values import ClusterWireError, Snapshot, SnapshotEntry, pack_ids, unpack_ids
from mqttmesh.mesh.replica import merge_snapshots
from support.cluster_net import Net, cid_with


def _complete_all(ch) -> int:
    """The client acknowledges every message in flight (PUBACK; PUBREC then PUBCOMP); how many."""
    n = 0
    session = ch.session
    while session.inflight:
        for pid, entry in list(session.inflight.items()):
            if entry.qos == 1:
                session.on_puback(pid)
            else:
                session.on_pubrec(pid)
                session.on_pubcomp(pid)
            n += 1
    return n


def _stale_holder(net: Net, qos: int, first: int, then: int):
    """A persistent subscriber on ``a`` (holders a and b); b takes the first ``first``
    messages but never hears that they were settled (a link that lost the batch, or b killed
    before it stored it); ``then`` more are settled with b following again."""
    cid = cid_with(net, lambda regs, holders: set(holders) == {"a", "b"})
    ch = net.connect("a", cid, clean=False)
    net.brokers["a"].subscribe(ch.session, "t/#", qos)
    net.pump()
    early = [net.publish("c", f"t/{i}", b"x", qos=qos) for i in range(first)]
    _complete_all(ch)
    net.clusters["a"].flush(net.t)
    net.queue = type(net.queue)(q for q in net.queue if not (q[1] == "b" and q[2] == "sess.settle"))
    net.pump()
    assert {(m.origin, m.seq) for m in early} <= set(net.brokers["b"].sessions[cid].ids)
    for i in range(then):
        net.publish("c", f"t/n{i}", b"y", qos=qos)
        _complete_all(ch)
    net.tick(0.1)
    ch.close("moved")
    net.pump()
    return cid, {(m.origin, m.seq) for m in early}


def _pending(ch) -> set[tuple[str, int]]:
    session = ch.session
    return {(e.msg.origin, e.msg.seq) for e in list(session.inflight.values()) + list(session.queue)}


def _net() -> Net:
    return Net(names=["a", "b", "c", "d"], settings=ClusterSettings(replication=2, stall=1e9))


@pytest.mark.parametrize("qos", [1, 2])
def test_a_copy_that_missed_settlements_beyond_the_old_5000_does_not_bring_them_back(qos):
    net = _net()
    cid, early = _stale_holder(net, qos, first=5, then=6000)
    moved = net.connect("d", cid, clean=False)  # d, not a holder, gathers a's and b's copies
    assert moved.state == "connected" and moved.present
    assert not _pending(moved) & early, "completed messages came back"
    # and b's copy, replaced by the one the client's node sends, hands none of them over
    assert net.clusters["b"].counters["late_forwarded"] == 0
    assert not set(net.brokers["b"].sessions[cid].ids) & early


def test_past_what_a_copy_remembers_qos2_is_taken_as_settled_and_qos1_as_new(monkeypatch):
    """The last resort, the delivery filter's (mesh/dedup.py): at or below the floor a
    message cannot be told apart; a QoS 2 one never becomes twice, a QoS 1 one never never."""
    monkeypatch.setattr(replica, "TOMBSTONES", 100)
    for qos in (1, 2):
        net = _net()
        cid, early = _stale_holder(net, qos, first=5, then=300)
        floors = net.brokers["a"].sessions[cid].floors
        assert floors and all(seq <= floors["c"] for _, seq in early)
        moved = net.connect("d", cid, clean=False)
        assert moved.state == "connected" and moved.present
        back = _pending(moved) & early
        assert back == (early if qos == 1 else set())


def test_merge_takes_a_qos2_message_below_a_floor_for_settled_unless_the_latest_view_holds_it():
    def entry(seq, qos, state=0):
        return SnapshotEntry("n2", seq, "t", "eA==", qos, qos, 0, state, "p", 1.0)

    stale = Snapshot("c", {}, 0, [entry(5, 2), entry(6, 1), entry(50, 2)], [], [], "n4", 3, 40)
    latest = Snapshot("c", {}, 0, [entry(7, 2)], [("n2", 20)], [], "n0", 3, 90, floors={"n2": 10})
    merged = merge_snapshots([stale, latest])
    assert merged is not None
    # 5: QoS 2, below the floor, not held by the latest view: settled and forgotten
    # 6: QoS 1 below it: new (at least once); 7: the latest view holds it; 50: above the floor
    assert sorted(e.seq for e in merged.entries) == [6, 7, 50]
    assert merged.floors == {"n2": 10} and ("n2", 20) in merged.done


def test_packed_ids_round_trip_and_malformed_lists_name_the_origin():
    ids = [("n2", 8), ("n1", 1 << 40), ("n2", 3), ("n1", (1 << 40) + 300), ("n2", 3)]
    packed = pack_ids(ids)
    assert sorted(unpack_ids(packed, "x")) == sorted(set(ids))
    assert len("".join(packed.values())) < 20  # (two varints a few bytes each, base64)
    assert unpack_ids({}, "x") == []
    for bad, words in (
        ({"n1": "@@"}, "'n1' is not base64"),
        ({"n1": "gA=="}, "'n1' ends inside a number"),
        ({"n1": 5}, "'n1' is not a string"),
        ([], "not a JSON object"),
        ({"n1": "/////////////w=="}, "more than 64 bits"),
    ):
        with pytest.raises(ClusterWireError, match=words):
            unpack_ids(bad, "sess.copy snap done")
