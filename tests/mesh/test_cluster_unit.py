"""The cluster protocols (mesh/cluster/cluster.py and its parts) on an instant in-memory network.

N Broker+Cluster pairs; a unicast is queued and handed over by ``pump`` in order; a
published message reaches every broker at once (the routing engine's job, tested in
test_engine.py). ``FakeChannel`` stands for the Channel of one client connection (the
``ClaimingChannel`` the cluster answers). No process, no clock, no socket: these pin
today's claims, hand-overs, wills and retained messages, and the bytes of every message.
"""

from __future__ import annotations

import base64
import json
import random

import pytest

from mqttmesh.mesh.cluster.cluster import HANDLERS, ClusterSettings
from mqttmesh.mesh.cluster.cluster_values import (
    ClusterWireError,
    Forwarded,
    RetainedAck,
    RetainedItem,
    Settlement,
    Snapshot,
    SnapshotEntry,
)
from mqttmesh.mesh.cluster.cluster_wire import (
    KINDS,
    RegClaim,
    RegCopy,
    RegGrant,
    Registration,
    RegKick,
    RegRegister,
    RegRelease,
    RetAck,
    RetQuery,
    RetReply,
    RetSet,
    SessAck,
    SessCopy,
    SessDiscard,
    SessFetch,
    SessFwd,
    SessMerge,
    SessSettle,
    SessState,
    SessSubs,
    WireWill,
    decode,
)
from mqttmesh.mesh.cluster.hrw import owners
from mqttmesh.mesh.cluster.membership import Membership
from mqttmesh.mesh.cluster.replica import released_id
from mqttmesh.mesh.cluster.snapshots import merge_snapshots
from mqttmesh.message import Message
from mqttmesh.packets import Will
from support.cluster_net import NAMES, FakeChannel, Net, cid_with, holder_of

# --------------------------------------------------------------------------- membership


def test_membership_places_ids_on_the_live_nodes_and_suspects_who_left_or_restarted():
    m = Membership("a", 1, replication=2, will_delay=0.5)
    assert m.update(["b", "c", "d"], {"b": 1, "c": 1, "d": 1}, 10.0) == {"a"}
    assert m.live == ["a", "b", "c", "d"]
    cid = "some-client"
    regs = m.registrars(cid)
    assert len(regs) == 2 and regs == m.holders(cid)[:2]
    last = next(n for n in m.live if n not in regs)
    assert m.holders(cid, last) == regs + [last]  # the node the client was last on, too
    assert m.holders(cid, "gone") == regs  # (not a live node)
    m.update(["b", "c"], {"b": 1, "c": 1}, 11.0)  # d left
    assert m.dead(11.4) == set() and m.dead(11.5) == {"d"}
    m.update(["b", "c", "d"], {"b": 2, "c": 1, "d": 1}, 12.0)  # d is back; b restarted
    assert m.dead(12.0) == {"b"}  # its old connections are gone at once


def test_membership_remembers_rankings_only_while_the_nodes_stay():
    """registrars, keepers and home are remembered per key (asked several times a message)
    and made again once the live or the known nodes change: always hrw's answer for the
    nodes of the moment."""
    m = Membership("a", 1, replication=3, will_delay=0.5)
    m.update(["b", "c"], {"b": 1, "c": 1}, 1.0)
    cids = [f"client-{i}" for i in range(40)]

    def agree() -> None:
        for cid in cids:
            assert m.registrars(cid) == owners(cid, m.live, 2)
            assert m.keepers(cid, "a")[:2] == owners(cid, m.live, 2)
            assert m.home(cid) == owners(cid, m.known, 3)

    agree()
    agree()  # (from the cache)
    m.update(["b", "c", "d", "e"], {"b": 1, "c": 1, "d": 1, "e": 1}, 2.0)  # two more, known and live
    agree()
    m.update(["b", "d"], {}, 3.0)  # c and e out of reach: live changes, known does not
    agree()
    m.remember(["f"])  # seen before a restart: known grows
    agree()
    assert any(m.home(cid) != owners(cid, ["a", "b", "c"], 3) for cid in cids)  # (they did move)


# --------------------------------------------------------------------------- claims


def test_a_claim_at_the_registrar_grants_epoch_1_and_the_same_id_elsewhere_kicks_the_first():
    net = Net()
    cid = cid_with(net, lambda regs, holders: regs[0] == "c")
    first = net.connect("a", cid, clean=True)
    assert first.state == "connected" and first.present is False
    entry = net.clusters["c"].registry.entries[cid]
    assert (entry.node, entry.epoch, entry.connected) == ("a", 1, True)
    kinds = net.kinds()
    assert kinds.index(("a", "c", "reg.claim")) < kinds.index(("c", "a", "reg.grant"))
    second = net.connect("b", cid, clean=True)
    # one ClientId, one connection, mesh-wide [MQTT-3.1.4-2]
    assert first.state == "closed" and "connected on node b" in first.reason
    assert second.state == "connected"
    entry = net.clusters["c"].registry.entries[cid]
    assert (entry.node, entry.epoch) == ("b", 2)
    assert net.clusters["c"].counters["kicks"] == 1
    assert net.clusters["c"].clients()["registrations"][cid] == {"node": "b", "epoch": 2, "connected": True}


def test_a_registrar_out_of_reach_does_not_stop_a_connect():
    net = Net()
    cid = cid_with(net, lambda regs, holders: regs[0] == "c")
    net.up.discard("c")  # (not yet noticed by the membership)
    ch = net.connect("a", cid, clean=True)
    assert ch.state == "connected"
    assert net.clusters["a"].claimant.local[cid].epoch == 0


def test_a_claim_unanswered_goes_on_after_claim_timeout():
    net = Net(settings=ClusterSettings(claim_timeout=1.0))
    cid = cid_with(net, lambda regs, holders: regs[0] == "c")
    ch = net.connect("a", cid, clean=True, pump=False)
    net.queue.clear()  # the claim is lost on the way
    net.tick(0.5)
    assert ch.state == "claiming"
    net.tick(0.6)
    assert ch.state == "connected"
    assert net.clusters["a"].counters["claim_timeouts"] == 1


def test_100_client_ids_racing_on_3_nodes_end_with_one_live_holder_each():
    seed = 1414
    print("seed", seed)
    rnd = random.Random(seed)
    net = Net()
    channels: dict[str, list[FakeChannel]] = {}
    cids = [f"race-{i}" for i in range(100)]
    order = [(node, cid) for cid in cids for node in NAMES]
    rnd.shuffle(order)
    for node, cid in order:
        channels.setdefault(cid, []).append(net.connect(node, cid, clean=rnd.random() < 0.5, pump=False))
        if rnd.random() < 0.3:
            net.pump()
    net.pump()
    net.tick(10.0)  # periodic re-registration: nothing changes any more
    for cid in cids:
        live = [ch for ch in channels[cid] if ch.state == "connected"]
        assert len(live) == 1, (cid, [(c.node, c.state) for c in channels[cid]])  # [MQTT-3.1.4-2]
        registrar = net.clusters["a"].members.registrars(cid)[0]
        entry = net.clusters[registrar].registry.entries[cid]
        assert entry.connected and entry.node == live[0].node
        assert all(ch.state in ("connected", "closed") for ch in channels[cid])


# --------------------------------------------------------------------------- sessions


def test_a_persistent_session_moves_with_its_queued_and_in_flight_messages():
    net = Net()
    cid = cid_with(net, lambda regs, holders: "c" not in holders and regs[0] != "a")
    ch = net.connect("a", cid, clean=False)
    assert ch.present is False
    net.brokers["a"].table.subscribe(ch.session, "t/#", 2)  # the holders subscribe too (sess.subs)
    net.pump()
    for n in net.clusters["a"].members.holders(cid, "a"):
        assert net.brokers[n].sessions[cid].subscriptions == {"t/#": 2}
    sent = [net.publish("b", f"t/{i}", b"x%d" % i, qos=1 + i % 2) for i in range(3)]
    inflight = {pid: (e.msg.origin, e.msg.seq) for pid, e in ch.session.inflight.items()}
    assert len(inflight) == 3  # written to the client, not acknowledged
    ch.close("connection lost")
    queued = [net.publish("c", f"t/q{i}", b"q", qos=1) for i in range(2)]
    assert len(net.brokers["a"].sessions[cid].queue) == 2
    net.tick(0.1)
    moved = net.connect("c", cid, clean=False)
    assert moved.state == "connected"
    assert moved.present is True  # [MQTT-3.2.2-2]
    session = moved.session
    now_inflight = {pid: (e.msg.origin, e.msg.seq) for pid, e in session.inflight.items()}
    # the in-flight ones keep their packet ids; the queued ones follow, in order
    assert {pid: now_inflight[pid] for pid in inflight} == inflight
    later = [now_inflight[pid] for pid in sorted(set(now_inflight) - set(inflight))]
    later += [(e.msg.origin, e.msg.seq) for e in session.queue]
    assert later == [(m.origin, m.seq) for m in queued]
    assert session.subscriptions == {"t/#": 2}
    # the in-flight ones are sent again first, as duplicates [MQTT-4.4.0-1]
    assert all(f[0] & 0x08 for f in moved.frames[:3])
    assert not any(f[0] & 0x08 for f in moved.frames[3:])
    assert sorted(inflight.values()) == [(m.origin, m.seq) for m in sent]
    assert net.clusters["c"].counters["sessions_gathered"] == 1
    # the old node forwards what still reaches it for a while
    assert cid in net.clusters["a"].replication.redirects


def test_a_released_inbound_qos2_id_stays_released_when_the_client_moves_on():
    """Issue 15: a QoS 2 id the client released (PUBREL) must not come back as awaiting
    PUBREL on the next node, or a new PUBLISH that reuses the id is taken for a re-send and
    never delivered. The holders follow the id's release; the merge takes the latest view."""
    net = Net()
    cid = cid_with(net, lambda regs, holders: set(holders) == {"a", "b"})
    ch = net.connect("a", cid, clean=False)
    ch.session.awaiting_rel_add(5)  # a QoS 2 PUBLISH with id 5 came: PUBREC is due
    net.pump()
    assert net.brokers["b"].sessions[cid].awaiting_rel == {5}  # the holder follows ("in")
    ch.close("connection lost")
    moved = net.connect("b", cid, clean=False)
    assert moved.session.awaiting_rel == {5}  # a re-sent PUBLISH 5 here is no new message
    moved.session.awaiting_rel_remove(5)  # PUBREL 5: the client may reuse the id at once
    net.pump()
    assert net.brokers["a"].sessions[cid].awaiting_rel == set()  # ("free")
    moved.close("connection lost")
    last = net.connect("c", cid, clean=False)
    assert last.present is True
    assert last.session.awaiting_rel == set()  # so a new PUBLISH 5 here is delivered


def test_a_holder_knows_an_accepted_qos2_id_when_the_clients_node_dies():
    """Issue 15: the id of a QoS 2 PUBLISH answered with PUBREC reaches the other holders,
    so the client's re-send (DUP=1, same id) to another node after its node died is
    acknowledged there without a second delivery [MQTT-4.3.3-2]."""
    net = Net()
    cid = cid_with(net, lambda regs, holders: "a" not in holders and "a" not in regs)
    ch = net.connect("a", cid, clean=False)
    ch.session.awaiting_rel_add(7)
    net.pump()
    net.up.discard("a")  # killed: no goodbye, no fetch answered
    net.membership()
    moved = net.connect(net.clusters["b"].members.holders(cid)[0], cid, clean=False)
    assert moved.session.awaiting_rel == {7}


def test_the_latest_view_decides_the_ids_awaiting_pubrel_never_their_union():
    old = Snapshot("c", {}, 0, [], [], [1, 2], "a", 2, 5)
    new = Snapshot("c", {}, 0, [], [], [2, 3], "b", 2, 7)
    merged = merge_snapshots([new, old])
    assert merged is not None and (merged.rel, merged.version) == ([2, 3], 7)
    # a newer epoch wins over more settlements made under an older one
    newer_epoch = Snapshot("c", {}, 0, [], [], [], "c", 3, 1)
    merged = merge_snapshots([old, new, newer_epoch])
    assert merged is not None and (merged.rel, merged.epoch, merged.version) == ([], 3, 1)


def test_a_view_that_has_an_id_awaiting_pubrel_for_a_released_message_does_not_decide_it():
    """The 7-node MQTT 5 run of seed 1 (c03b0d5): a copy cut off before the client released
    id 1 ranked first by (epoch, version) and brought the id back as awaiting PUBREL; the
    client's next message on it was taken for a re-send and never routed. A copy that has
    the id awaiting PUBREL for a message another copy saw released is behind for that id."""
    x = Forwarded("t/1", "eA==", 2, False, "n4", 38, "pub", 1.0)
    z = Forwarded("t/1", "eg==", 2, False, "n4", 42, "pub", 2.0)
    stale = Snapshot("c", {}, 0, [], [], [1, 2], "n2", 9, 4, inbound=[(1, x)])  # (2: no message)
    behind_it = Snapshot("c", {}, 0, [], [released_id(("n4", 38))], [1], "n4", 7, 90, inbound=[(1, z)])
    merged = merge_snapshots([behind_it, stale])
    assert merged is not None and merged.epoch == 9
    assert (merged.rel, merged.inbound) == ([1, 2], [(1, z)])  # id 1 as the copy that saw X released has it
    free = Snapshot("c", {}, 0, [], [released_id(("n4", 38))], [], "n4", 7, 91)
    merged = merge_snapshots([stale, free])
    assert merged is not None and (merged.rel, merged.inbound) == ([2], [])  # free there: a new message is new
    # without a copy that saw the release, the latest view decides, as before
    merged = merge_snapshots([Snapshot("c", {}, 0, [], [], [], "n4", 7, 91), stale])
    assert merged is not None and (merged.rel, merged.inbound) == ([1, 2], [(1, x)])


def test_copies_merge_into_each_origins_order_and_in_flight_messages_stay_first():
    """Issue 20 (ordered delivery): two holders that got one origin's messages in different
    orders, or not all of them, merge into that origin's order [MQTT-4.6.0-6]; another
    origin's messages keep their places, and in-flight ones stay first in send order."""

    def entry(origin: str, seq: int, state: int = 0, pid: int = 0) -> SnapshotEntry:
        return SnapshotEntry(origin, seq, "t/1", "eA==", 1, 1, pid, state, "pub", 1.0)

    one = Snapshot(
        "c", {}, 0, [entry("n2", 30, 1, 4), entry("n1", 5), entry("n1", 9), entry("n2", 12)], [], [], "a", 3, 7
    )
    other = Snapshot("c", {}, 0, [entry("n1", 7), entry("n2", 11), entry("n1", 6)], [], [], "b", 3, 6)
    merged = merge_snapshots([one, other])
    assert merged is not None
    got = [(e.origin, e.seq) for e in merged.entries]
    assert got == [("n2", 30), ("n1", 5), ("n1", 6), ("n2", 11), ("n1", 7), ("n2", 12), ("n1", 9)]


def test_a_message_that_reached_only_a_holder_goes_to_the_node_the_client_is_on():
    """Issue 15 (harness, losses during moves): a message routed before the node the client
    moved to wanted its topic, or retransmitted to a holder after a partition, reached a
    holder only, after the hand-over's redirect; the next copy from the client's node
    replaced that holder's messages and the message was gone. The holder now hands such a
    message to the client's node, which takes it unless it settled it."""
    net = Net()
    cid, ch = _persistent_subscriber(net, lambda regs, holders: set(holders) == {"a", "b"})
    net.tick(11.0)  # (the redirect of the client's arrival is over: redirect_grace)
    late = Message("t/late", b"x", 1, False, "c", 77, "pub", 1e6)
    net.brokers["b"].deliver_remote(late)  # (reached b only)
    net.pump()
    assert not any(b"t/late" in f for f in ch.frames)
    done = Message("t/old", b"y", 1, False, "c", 78, "pub", 1e6)
    net.brokers["b"].deliver_remote(done)
    ch.session._remember_done(("c", 78))  # (completed at a already)
    net.clusters["a"].holders._copy_to_holders(ch.session, net.t)
    net.pump()
    assert net.clusters["b"].counters["late_forwarded"] == 1  # (the settled one is known as such)
    assert any(b"t/late" in f for f in ch.frames) and not any(b"t/old" in f for f in ch.frames)
    held = net.brokers["b"].sessions[cid]
    assert ("c", 77) in held.ids and ("c", 78) not in held.ids  # (b keeps its copy of the late one)
    # a holder's late message that the client's node had settled: it tells the holder so
    stale = Message("t/stale", b"z", 1, False, "c", 79, "pub", 1e6)
    net.brokers["b"].deliver_remote(stale)
    ch.session._remember_done(("c", 79))  # (settled at a, its id no longer in a's snapshots)
    net.clusters["a"].holders.forwarded(SessFwd(cid, Forwarded.of(stale)), net.t)
    net.pump()
    assert ("c", 79) not in held.ids and ("c", 79) in held.done
    assert not any(b"t/stale" in f for f in ch.frames)


def test_a_claim_is_newer_than_every_copy_it_gathered_whatever_the_registrar_granted():
    """Issue 15 (harness, seed 3): a registrar that took over without the ClientId's entry
    granted a small epoch; the session's copies of an earlier claim had a larger one and won
    the next merge, whose stale inbound QoS 2 message was routed a second time."""
    net = Net()
    cid, ch = _persistent_subscriber(net, lambda regs, holders: set(holders) == {"a", "b"})
    for n in ("a", "b"):
        net.brokers[n].sessions[cid].epoch = 40  # (as after many claims a new registrar never saw)
    ch.close("moved")
    net.pump()
    moved = net.connect("b", cid, clean=False)
    granted = net.clusters["b"].claimant.local[cid].epoch
    assert granted < 40 and moved.session.epoch == 41


def test_the_node_a_client_leaves_keeps_no_copy_unless_it_is_a_holder():
    """Issue 15 (harness, 400/s, seed 3): the node the client had been on kept its copy after
    the client moved (no settlements reach it any more) until the membership changed; when
    the client came back there, that stale copy was merged in. Answering the new node's
    fetch, it hands its copy to the holders and keeps none."""
    net = Net()
    members = net.clusters["a"].members
    cid = cid_with(net, lambda regs, holders: "a" not in holders)  # (holders: the home, all live)
    first = net.connect("a", cid, clean=False)
    assert cid in net.brokers["a"].sessions  # (the node the client is on holds a copy)
    home = members.home(cid)
    moved = net.connect(home[0], cid, clean=False)
    assert first.state == "closed" and moved.state == "connected" and moved.present
    assert cid not in net.brokers["a"].sessions
    assert all(cid in net.brokers[n].sessions for n in home)


def test_an_in_flight_message_of_an_older_claim_gone_from_the_newest_copy_was_completed():
    """Issue 15 (harness, 400/s, seed 3): a node paused while its client had a QoS 2 message in
    flight kept that copy; the client completed the message elsewhere, came back 30 s later
    and got it again (DUP=1, the old id), the settled id being older than the 5,000 a snapshot
    carries. Every step of an in-flight message reached the copies a newer claim gathered from,
    so one that the newest copy no longer has was completed; a queued one may be new."""
    in_flight = SnapshotEntry("n2", 9, "t/1", "eA==", 2, 2, 1173, 1, "pub", 1.0)
    queued = SnapshotEntry("n2", 10, "t/1", "eQ==", 2, 2, 0, 0, "pub", 1.5)
    stale = Snapshot("c", {}, 0, [in_flight, queued], [], [], "n4", 3, 40)
    newest = Snapshot("c", {}, 0, [], [], [], "n0", 5, 2)
    merged = merge_snapshots([stale, newest])
    assert merged is not None and [(e.seq, e.state) for e in merged.entries] == [(10, 0)]
    # the same epoch: nothing is known to be newer, both are kept
    same = merge_snapshots([stale, Snapshot("c", {}, 0, [], [], [], "n0", 3, 41)])
    assert same is not None and [e.seq for e in same.entries] == [9, 10]
    # still in flight in the newest copy (or reserved there): kept, the furthest state winning
    kept = merge_snapshots([stale, Snapshot("c", {}, 0, [], [], [], "n0", 5, 2, [("n2", 9, 2, 1173)])])
    assert kept is not None and [(e.seq, e.state) for e in kept.entries] == [(9, 2), (10, 0)]


def test_a_merge_counts_the_qos2_messages_it_takes_for_completed():
    """What the rule above drops leaves no settlement anywhere: counted, so that a run shows
    when it fired (the fault harness's pub3:1442/1444, MQTT 5, 7 nodes, seed 9, vanished from
    every copy of their member's session with none)."""
    from mqttmesh.mesh.cluster.snapshots import merged_away

    in_flight = SnapshotEntry("n2", 9, "t/1", "eA==", 2, 2, 1173, 1, "pub", 1.0)
    queued = SnapshotEntry("n2", 10, "t/1", "eQ==", 2, 2, 0, 0, "pub", 1.5)
    stale = Snapshot("c", {}, 0, [in_flight, queued], [], [], "n4", 3, 40)
    newest = Snapshot("c", {}, 0, [], [], [], "n0", 5, 2)
    merged = merge_snapshots([stale, newest])
    assert merged is not None and merged_away([stale, newest], merged) == 1
    settled = Snapshot("c", {}, 0, [], [("n2", 9)], [], "n0", 5, 2)  # (completed: it says so)
    merged = merge_snapshots([stale, settled])
    assert merged is not None and merged_away([stale, settled], merged) == 0
    same = Snapshot("c", {}, 0, [], [], [], "n0", 3, 41)  # (kept: nothing is newer)
    merged = merge_snapshots([stale, same])
    assert merged is not None and merged_away([stale, same], merged) == 0


def test_a_qos1_message_in_flight_under_an_older_claim_is_kept_unless_settled_or_forgotten():
    """The fault harness (7 nodes, MQTT 5, seed 9): 29 QoS 1/2 messages a shared group gave a
    persistent member whose client was stalled were lost: only its node had them (the copy
    to the other holders, sess.fwd, did not arrive), a newer claim elsewhere never had them,
    and the merge took the in-flight ones for completed. A QoS 1 PUBLISH leaves with no step
    the other holders confirm, so nothing says the client had it: kept (a duplicate at worst)
    unless settled (a copy remembers its id) or at or below a floor (forgotten)."""
    one = SnapshotEntry("n2", 9, "t/1", "eA==", 1, 1, 17, 1, "pub", 1.0)
    done = SnapshotEntry("n2", 10, "t/1", "eQ==", 1, 1, 18, 1, "pub", 1.1)
    low = SnapshotEntry("n3", 4, "t/1", "eg==", 1, 1, 19, 1, "pub", 1.2)
    stale = Snapshot("c", {}, 0, [one, done, low], [], [], "n4", 3, 40)
    newest = Snapshot("c", {}, 0, [], [("n2", 10)], [], "n0", 5, 2, floors={"n3": 4})
    merged = merge_snapshots([stale, newest])
    assert merged is not None and [(e.seq, e.pid, e.state) for e in merged.entries] == [(9, 17, 1)]


def test_a_holder_that_missed_settlements_is_not_the_latest_view():
    net = Net()
    cid = cid_with(net, lambda regs, holders: set(holders) == {"a", "b"})
    ch = net.connect("a", cid, clean=False)
    ch.session.awaiting_rel_add(1)
    net.clusters["a"].flush(net.t)
    net.queue.clear()  # the settlement batch is lost on the way
    ch.session.awaiting_rel_add(2)
    net.pump()  # (gathered: one batch of a session's is out at a time, and none answered it)
    assert net.brokers["b"].sessions[cid].awaiting_rel == frozenset()
    ch.close("gone")  # the next batch goes without an answer to wait for
    net.pump()
    held = net.brokers["b"].sessions[cid]
    assert held.awaiting_rel == {2}
    assert held.version < ch.session.version  # behind: a merge prefers any complete view
    assert net.clusters["b"].counters["settle_gaps"] == 1


def _persistent_subscriber(net: Net, cid_pred) -> tuple[str, FakeChannel]:
    cid = cid_with(net, cid_pred)
    ch = net.connect("a", cid, clean=False)
    net.brokers["a"].table.subscribe(ch.session, "t/#", 2)
    net.pump()
    return cid, ch


def _local_publish(net: Net, node: str, topic: str) -> Message:
    """Net.publish at QoS 2 with nothing pumped afterwards (the routing engine brought the
    message to every node; the cluster's messages wait in the queue)."""
    broker = net.brokers[node]
    msg = Message(topic, b"x", 2, False, node, broker.next_seq(), "pub", net.t + 1_000_000.0)
    broker.publish(msg)
    for n in sorted(net.up - {node}):
        net.brokers[n].deliver_remote(Message(topic, b"x", 2, False, node, msg.seq, "pub", msg.timestamp))
    return msg


def test_a_qos2_publish_waits_until_the_other_holder_has_its_packet_id():
    """Issue 15: the PUBLISH is written once the other holder acknowledged the "sent"
    settlement, so a holder taking over re-sends it with the same id [MQTT-4.3.3-1]."""
    net = Net()
    cid, ch = _persistent_subscriber(net, lambda regs, holders: set(holders) == {"a", "b"})
    msg = _local_publish(net, "a", "t/1")
    assert ch.frames == [] and len(ch.held) == 1  # held: b does not have the id yet
    net.pump()  # sess.settle to b, sess.ack back
    assert len(ch.frames) == 1 and ch.held == []
    pid = next(iter(ch.session.inflight))
    held = net.brokers["b"].sessions[cid]
    assert held.inflight[pid].msg.seq == msg.seq  # b would re-send it with this id
    assert ch.session.safe_version == ch.session.version == held.version


def test_frames_held_for_a_holder_out_of_reach_go_out_when_the_membership_drops_it():
    net = Net(settings=ClusterSettings(replication=3, stall=1e9))  # (a majority of 3 stays)
    cid, ch = _persistent_subscriber(net, lambda regs, holders: regs[0] != "b")
    net.up.discard("b")  # (not yet noticed by the membership: sends to b are lost)
    _local_publish(net, "a", "t/1")
    net.pump()
    assert ch.frames == [] and len(ch.held) == 1
    net.membership()  # b is gone: a and c are the majority of the session's home
    assert len(ch.frames) == 1 and ch.held == []
    assert net.brokers["c"].sessions[cid].version == ch.session.version


def test_a_lost_settlement_batch_is_made_good_by_a_copy_after_settle_retry():
    net = Net()
    cid, ch = _persistent_subscriber(net, lambda regs, holders: set(holders) == {"a", "b"})
    _local_publish(net, "a", "t/1")
    net.clusters["a"].flush(net.t)
    net.queue.clear()  # the sess.settle is lost on the way
    net.pump()
    assert ch.frames == [] and len(ch.held) == 1
    net.tick(0.2)
    assert ch.frames == []  # (not yet: settle_retry is 0.5 s)
    net.tick(0.4)
    assert len(ch.frames) == 1
    assert net.clusters["a"].counters["settle_retries"] == 1
    assert net.brokers["b"].sessions[cid].version == ch.session.version


def test_a_holder_that_knows_a_newer_epoch_fences_the_old_node_off():
    """Issue 15: a node still serving a client that has claimed its ClientId again elsewhere
    (its holders know the newer epoch) stops serving it at its next settlement."""
    net = Net()
    cid, ch = _persistent_subscriber(net, lambda regs, holders: set(holders) == {"a", "b"})
    net.brokers["b"].sessions[cid].epoch += 5  # (as after a claim at another node)
    _local_publish(net, "a", "t/1")
    net.pump()
    assert ch.state == "closed" and "active elsewhere" in ch.reason
    assert ch.frames == []  # the PUBLISH was never written
    assert net.clusters["a"].counters["fenced"] == 1


def test_quorum_needs_a_majority_of_the_nodes_ever_seen_and_a_fresh_view():
    m = Membership("a", 1, replication=2, will_delay=0.5, stall=1.0, grace=3.0)
    assert not m.quorum(0.0)  # just started, no tick yet, and no peer known
    early = Membership("e", 1, replication=2, will_delay=0.5, stall=1.0, grace=3.0)
    early.update(["e", "f", "g"], {"e": 1, "f": 1, "g": 1}, 0.01)
    assert early.quorum(0.02)  # just started, its first links up: a fresh view, served
    m.ticked(0.0)
    assert not m.quorum(0.1)  # just started, no peer heard of: maybe they come
    m.update(["a", "b", "c"], {"a": 1, "b": 1, "c": 1}, 0.2)
    assert m.quorum(0.2)  # peers known: the majority rule alone
    m.update(["a"], {"a": 1}, 0.3)
    assert not m.quorum(0.3)  # 1 of the 3 nodes seen: the minority side
    m.update(["a", "b"], {"a": 1, "b": 1}, 0.4)
    assert m.quorum(0.4)
    m.ticked(0.5)
    assert not m.quorum(2.0)  # no tick for 1.5 s: paused, or about to find out
    m.ticked(2.0)  # resumed after a stall: the view is stale for quorum_grace
    assert not m.quorum(2.1) and not m.quorum(4.9)
    for t in (2.25, 2.5, 2.75, 3.0, 3.25, 3.5, 3.75, 4.0, 4.25, 4.5, 4.75, 5.0):
        m.ticked(t)
    assert m.quorum(5.0)
    alone = Membership("z", 1, replication=2, will_delay=0.5, stall=1.0, grace=3.0)
    for t in (0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0, 2.25, 2.5, 2.75, 3.0):
        alone.ticked(t)
        assert alone.quorum(t) == (t >= 3.0)  # a mesh of one serves after the grace


def test_a_busy_loop_shorter_than_a_links_death_keeps_the_persistent_clients():
    """Issue 20 (make bench, p2p-persistent across two nodes): under load one iteration of a
    node's loop took 1.4 s; the cluster's stall bound was 1 s, so the node took itself for
    paused, closed its 50 persistent clients and refused them with 0x03 for 3 s. A peer
    gives a link up after 3 keepalives of silence, counted from what it last heard, at most
    a keepalive before the gap: a gap under 2 keepalives (less a tick) cannot have cost a
    link, and the view stays trusted. A longer gap still distrusts it."""
    keepalive, tick = 1.0, 0.25
    stall = ClusterSettings().stall
    assert stall == 2 * keepalive - tick  # (what server/mesh_node.py derives from mesh.keepalive)
    m = Membership("a", 1, replication=2, will_delay=0.5, stall=stall, grace=3 * keepalive)
    m.update(["a", "b"], {"a": 1, "b": 1}, 0.0)
    m.ticked(0.0)
    m.ticked(1.4)  # one iteration of 1.4 s: busy, not paused
    assert m.quorum(1.4) and m.quorum(1.5)
    m.ticked(1.5)
    m.ticked(3.3)  # 1.8 s: a peer may have heard nothing for 2.8 s and be about to close
    assert not m.quorum(3.3) and not m.quorum(6.2)


def test_a_node_that_starts_beside_nodes_out_of_reach_counts_them_in_quorum_and_homes():
    """Issue 15 (harness, seed 1): a node restarted on the majority side of a partition knew
    only the nodes it could reach, so it placed a session's home among them and served the
    session from stale copies while its latest state was across the partition."""
    everyone = {n: 1 for n in ("n0", "n1", "n2", "n3", "n4")}
    m = Membership("n2", 1, replication=3, will_delay=0.5)
    m.update(["n1", "n2", "n3"], everyone, 0.0)  # n0 and n4: in the database, out of reach
    assert m.known == sorted(everyone) and m.quorum(0.0)
    cid = next(f"s{i}" for i in range(1000) if {"n0", "n4"} <= set(m.home(f"s{i}")))
    assert m.home(cid) == owners(cid, sorted(everyone), 3)
    assert not m.home_quorum(cid)  # two of its three home nodes are out of reach: not served here


def test_a_persistent_connect_on_the_minority_side_is_refused_with_0x03():
    """Issue 15: at most one live copy of a persistent session. A node cut off from the
    majority answers CONNACK 0x03 (server unavailable) to a persistent connect; a clean one
    is served on both sides, as before [MQTT-3.2.2-5]."""
    net = Net()
    net.tick(10.0)  # (past the start: a node still forming its links waits, test below)
    away_from_c = cid_with(net, lambda regs, holders: "c" not in holders, "p")
    net.up.discard("c")
    net.membership()  # a and b see each other, c sees only itself
    net.clusters["c"].membership(["c"], {"c": 1}, net.t)
    refused = net.connect("c", "p1", clean=False)
    assert refused.state == "closed" and refused.refused_rc == 0x03
    assert net.clusters["c"].counters["refused_no_quorum"] == 1
    assert net.connect("c", "k1", clean=True).state == "connected"
    # the majority side serves a session whose home (a and b) is in reach; one whose home
    # includes c is not served anywhere until c is back (a majority of 2 is 2)
    assert net.connect("a", away_from_c, clean=False).state == "connected"
    members = net.clusters["a"].members
    with_c = next(f"q-{i}" for i in range(1000) if "c" in members.home(f"q-{i}"))
    refused = net.connect("a", with_c, clean=False)
    assert refused.refused_rc == 0x03


def test_a_node_fenced_off_by_a_newer_epoch_lets_the_session_go_at_once():
    """The simulator's finding 41: a claim at c reached neither a (the client's node, cut off)
    nor, after its CONNACK, told it; a's next settlement is answered with the newer epoch and a
    closes its client, but its copy still took itself for the session's home (a member of its
    groups, queueing for a client that is not there) until the next change of the live nodes
    pooled it. It pools it at once: a holder that knows the newer claim answers with its copy,
    and a lets go."""
    net = Net()
    cid, ch = _persistent_subscriber(net, lambda regs, holders: set(holders) == {"a", "b"})
    newer = net.brokers["b"].sessions[cid]
    newer.epoch += 5  # (as after a claim at c that a never heard of)
    newer.active_node = "c"
    _local_publish(net, "a", "t/1")
    net.pump()
    assert ch.state == "closed" and "active elsewhere" in ch.reason
    assert net.brokers["a"].sessions[cid].active_node == "c"
    assert net.clusters["b"].counters["old_homes_told"] == 1


def test_an_offline_homes_pooled_copy_goes_again_until_a_holder_answers():
    """The simulator's finding 42 (seed 10): the client left a, which stays the session's home;
    a claim at c (a newer epoch) reached b but not a, and a's copy, pooled at the next change
    of the live nodes, was lost with the links the heal reset: a stayed a member of the
    session's groups, queueing for a client that is not there. A pooled copy goes again, every
    settle_retry and then less often, until each holder answered; b knows the newer claim
    and answers with its copy: a lets go."""
    net = Net()
    cid, ch = _persistent_subscriber(net, lambda regs, holders: set(holders) == {"a", "b"})
    ch.close("connection lost")
    net.pump()
    newer = net.brokers["b"].sessions[cid]
    newer.epoch += 5  # (as after a claim at c that a never heard of)
    newer.active_node = "c"
    net.clusters["a"].membership(sorted(net.up), dict(net.incs), net.t)  # a pools its copy ...
    lost = net.pump_holding("sess.merge", frm="a")  # ... and the links lose it
    assert [dest for _, dest, _, _ in lost] == ["b"]
    home = net.brokers["a"].sessions[cid]
    assert home.active_node == "a"  # (still the session's home: the finding)
    net.tick(0.1)
    assert home.active_node == "a" and net.clusters["a"].counters["pools_resent"] == 0  # (not yet due)
    net.tick(0.5)  # settle_retry: it goes again
    assert net.clusters["a"].counters["pools_resent"] == 1
    assert net.brokers["a"].sessions[cid].active_node == "c"
    assert net.clusters["b"].counters["old_homes_told"] == 1
    net.tick(10.0)
    assert net.clusters["a"].counters["pools_resent"] == 1  # (answered: not again)


def test_a_pooled_copy_a_holder_took_is_not_sent_again():
    """The answer to a pooled copy (sess.ack at an epoch not newer than the copy's) ends its
    re-sending: a home whose holders took its copy stays the home, quietly."""
    net = Net()
    cid, ch = _persistent_subscriber(net, lambda regs, holders: set(holders) == {"a", "b"})
    ch.close("connection lost")
    net.pump()
    net.clusters["a"].membership(sorted(net.up), dict(net.incs), net.t)
    net.pump()
    assert net.clusters["a"].holders.pools == {}  # (b answered)
    for _ in range(4):
        net.tick(1.0)
    assert net.clusters["a"].counters["pools_resent"] == 0
    assert net.brokers["a"].sessions[cid].active_node == "a"


def test_a_holder_tells_the_old_home_a_refused_claim_had_hidden():
    """The simulator's finding 42 (seed 12): the client left c, not a home node (a and b),
    which stayed its home. A claim at b fetched the copies, which re-pointed a's to b, and
    was refused (its fetch to c was lost); the next claim, at b again, had b for the
    ClientId's last node and gathered copies that named b, so b told no old home after its
    CONNACK, and c, which neither claim reached, stayed the home, a member of the session's
    groups. The holder whose copy a fetch re-pointed remembers the node it named and tells it
    when the claim's copy comes: c lets go."""
    net = Net()
    cid = cid_with(net, lambda regs, holders: set(holders) == {"a", "b"})
    ch = net.connect("c", cid, clean=False)
    net.brokers["c"].table.subscribe(ch.session, "t/#", 1)
    net.pump()
    ch.close("connection lost")
    net.pump()
    assert net.brokers["a"].sessions[cid].active_node == "c"
    refused = net.connect("b", cid, clean=False, pump=False)
    net.pump_losing(lambda frm, dest, kind: dest == "c" and kind == "sess.fetch")
    net.tick(net.settings.gather_timeout + 0.1)
    assert refused.state == "closed" and refused.refused_rc == 0x03
    assert net.brokers["a"].sessions[cid].active_node == "b"  # (re-pointed by the fetch)
    assert net.brokers["c"].sessions[cid].active_node == "c"  # (c heard nothing)
    told = net.clusters["a"].counters["old_homes_told"]
    moved = net.connect("b", cid, clean=False)
    assert moved.state == "connected" and moved.present
    assert net.brokers["c"].sessions[cid].active_node == "b"  # (a told c: it let go)
    assert net.clusters["a"].counters["old_homes_told"] == told + 1


def test_an_old_home_out_of_reach_is_told_when_it_is_back():
    """The simulator's finding 42 (seed 31): c, the client's node and no node of the session's
    home, was cut off without noticing (its links stayed up from its side), and its client
    left during the cut; the claim at b could not tell it, and c, whose view of the live
    nodes never changed, never pooled its copy: it stayed the session's home, a member of its
    groups. The claim's node and the holders remember the old home out of reach and tell it
    when it is back."""
    net = Net()
    cid = cid_with(net, lambda regs, holders: set(holders) == {"a", "b"})
    ch = net.connect("c", cid, clean=False)
    net.brokers["c"].table.subscribe(ch.session, "t/#", 1)
    net.pump()
    without_c = lambda frm, dest, kind: "c" in (frm, dest)  # noqa: E731  # (c's unicasts are lost)
    live = {n: net.incs[n] for n in ("a", "b")}
    for n in ("a", "b"):  # a and b lose c; c notices nothing
        net.clusters[n].membership(sorted(live), live, net.t)
    net.pump_losing(without_c)
    ch.close("connection lost")
    net.pump_losing(without_c)
    moved = net.connect("b", cid, clean=False, pump=False)
    net.pump_losing(without_c)
    assert moved.state == "connected" and moved.present
    assert net.brokers["c"].sessions[cid].active_node == "c"  # (c heard nothing)
    told = sum(net.clusters[n].counters["old_homes_told"] for n in ("a", "b"))
    for n in ("a", "b"):  # c is back for them
        net.clusters[n].membership(sorted(net.up), dict(net.incs), net.t)
    net.pump()
    assert net.brokers["c"].sessions[cid].active_node == "b"  # (told: it let go)
    assert sum(net.clusters[n].counters["old_homes_told"] for n in ("a", "b")) >= told + 1


def test_losing_the_majority_closes_the_persistent_clients_only():
    net = Net()
    persistent = net.connect("a", "p1", clean=False)
    clean = net.connect("a", "k1", clean=True)
    net.up -= {"b", "c"}
    net.clusters["a"].membership(["a"], {"a": 1}, net.t)
    assert persistent.state == "closed" and "majority" in persistent.reason
    assert clean.state == "connected"
    assert net.clusters["a"].counters["fenced"] == 1


def test_a_persistent_claim_without_the_registrars_answer_is_refused_not_served_anyway():
    net = Net()
    cid = cid_with(net, lambda regs, holders: regs[0] == "b")
    ch = net.connect("a", cid, clean=False, pump=False)
    net.queue.clear()  # the claim is lost on the way
    assert ch.state == "claiming"
    net.tick(1.1)  # claim_timeout
    assert ch.state == "closed" and ch.refused_rc == 0x03
    clean = net.connect("a", cid, clean=True, pump=False)
    net.queue.clear()
    net.tick(1.1)
    assert clean.state == "connected"  # (a clean session is served anyway, as before)
    net.up.discard("b")  # out of reach (not yet noticed): the claim cannot even go out
    assert net.connect("a", cid, clean=False).refused_rc == 0x03


def test_a_holder_with_a_store_answers_once_the_settlement_is_stored():
    """Issue 15 (harness, seed 2): a holder answered before its store had the settlement, was
    killed and restarted without it; the next node gathered that copy and served a stale
    session. The answer (and so the frame the client waits for) now follows the commit."""
    from mqttmesh.store import Journal

    journal = Journal()
    net = Net(journals={"b": journal})
    cid, ch = _persistent_subscriber(net, lambda regs, holders: set(holders) == {"a", "b"})
    net.committed("b", journal.take()[0])  # (b stored its copy of the session)
    counters = net.clusters["b"].holders.counters  # (its own, live)
    before = counters["acks_after_commit"]
    _local_publish(net, "a", "t/1")
    net.pump()  # the "sent" settlement reaches b, which journals it
    assert ch.frames == [] and len(journal)  # b has not answered: not stored yet
    assert counters["acks_after_commit"] == before + 1
    net.committed("b", journal.take()[0])  # (b's store committed the batch)
    net.pump()
    assert len(ch.frames) == 1  # the PUBLISH, now that b has its packet id in its store


def test_a_holders_copy_of_a_session_without_subscriptions_is_in_its_store():
    """Issue 15 (harness, 400/s): a holder stored the copy of a publisher's session (no
    subscriptions) only as rows of messages and ids, which a restart skips without the
    session's own row; the holder came back without it and the client was told session
    present = 0."""
    from mqttmesh.store import Journal

    journal = Journal()
    net = Net(journals={"b": journal})
    cid = cid_with(net, lambda regs, holders: set(holders) == {"a", "b"})
    net.connect("a", cid, clean=False)
    assert ("session_put", cid, {}, None) in journal.take()[1]


def test_a_holder_that_gets_the_message_after_its_packet_id_keeps_that_id():
    """Issue 15: the node the client is on settled a QoS 2 message ("sent", then "rel")
    before the mesh brought the message to another holder. That holder reserves the id; when
    the message comes, it takes it in that state, so after the first node dies the client
    gets PUBREL for the id, not the message again under a new one [MQTT-4.3.3-1]."""
    net = Net(settings=ClusterSettings(replication=3, stall=1e9))
    cid, ch = _persistent_subscriber(net, lambda regs, holders: regs[0] != "a")
    broker = net.brokers["a"]
    msg = Message("t/1", b"x", 2, False, "a", broker.next_seq(), "pub", net.t + 1_000_000.0)
    broker.publish(msg)  # (reaches a only, for now)
    net.pump()
    pid = next(iter(ch.session.inflight))
    assert len(ch.frames) == 1  # b and c acknowledged the id without having the message
    ch.session.on_pubrec(pid)  # the client's PUBREC: PUBREL is due
    net.pump()
    held = net.brokers["b"].sessions[cid]
    assert held.reserved[("a", msg.seq)] == (2, pid)  # (session.SENT_PUBREL)
    net.up.discard("a")  # a dies before the PUBCOMP
    net.membership()
    net.brokers["b"].deliver_remote(Message("t/1", b"x", 2, False, "a", msg.seq, "pub", msg.timestamp))
    assert held.inflight[pid].msg.seq == msg.seq and not held.queue
    moved = net.connect("b", cid, clean=False)
    assert moved.present is True
    assert moved.frames[:1] == [bytes((0x62, 2, pid >> 8, pid & 0xFF))]  # PUBREL, same id
    assert not any(f[0] >> 4 == 3 for f in moved.frames)  # and no PUBLISH of it again


def test_a_clean_start_discards_the_holders_copies():
    net = Net()
    cid = cid_with(net, lambda regs, holders: "c" not in holders)
    ch = net.connect("a", cid, clean=False)
    net.brokers["a"].table.subscribe(ch.session, "t", 1)
    net.pump()
    ch.close("bye")
    net.publish("b", "t", b"kept", qos=1)
    holders = holder_of(net, cid)
    assert len(holders) >= 2
    fresh = net.connect("c", cid, clean=True)
    # a clean start discards any previous session [MQTT-3.1.2-6]
    assert fresh.present is False
    assert holder_of(net, cid) == ["c"]
    assert not fresh.session.queue and not fresh.session.subscriptions
    discards = [(f, d) for f, d, k in net.kinds() if k == "sess.discard"]
    assert sorted(d for _, d in discards) == sorted(set(holders) - {"c"})


def test_fetches_and_discards_go_to_the_holders_in_sorted_order():
    """Finding 0.2 of the issue 14 plan: these loops ran over sets (hash-seed order)."""
    names = ["n1", "n2", "n3", "n4", "n5"]
    net = Net(names, settings=ClusterSettings(replication=4))
    cid = cid_with(net, lambda regs, holders: "n1" not in holders)
    ch = net.connect("n1", cid, clean=False)
    ch.close("bye")
    mark = len(net.sent)
    net.connect("n2", cid, clean=False)
    fetches = [d for f, d, k in net.kinds(mark) if f == "n2" and k == "sess.fetch"]
    assert len(fetches) >= 3 and fetches == sorted(fetches)
    mark = len(net.sent)
    net.connect("n3", cid, clean=True)
    discards = [d for f, d, k in net.kinds(mark) if f == "n3" and k == "sess.discard"]
    assert len(discards) >= 3 and discards == sorted(discards)


# --------------------------------------------------------------------------- wills


def _will_cid(net: Net, at: str) -> str:
    return cid_with(net, lambda regs, holders: regs[0] != at)


def test_the_clients_of_a_node_that_left_get_their_will_published_once_by_the_registrar():
    net = Net(settings=ClusterSettings(will_delay=0.5))
    cid = _will_cid(net, "a")
    registrar = net.clusters["b"].members.registrars(cid)[0]
    net.connect("a", cid, clean=True, will=Will("w/a", b"gone", 1, False))
    net.up.discard("a")
    net.membership()
    net.tick(0.4)
    assert not any(m.topic == "w/a" for n in net.up for m in net.published[n])
    net.tick(0.2)  # will_delay passed [MQTT-3.1.2-8]
    net.tick(5.0)
    wills = [(n, m) for n in sorted(net.up) for m in net.published[n] if m.topic == "w/a"]
    assert [(n, m.payload, m.qos, m.publisher) for n, m in wills] == [(registrar, b"gone", 1, cid)]
    assert wills[0][1].timestamp == pytest.approx(net.t - 4.9 + 1_000_000.0, abs=1.0)  # now + wall_offset
    assert net.clusters[registrar].counters["wills_published"] == 1


def test_a_new_incarnation_of_a_node_publishes_its_old_clients_wills_at_once():
    net = Net(settings=ClusterSettings(will_delay=0.5))
    cid = _will_cid(net, "a")
    registrar = net.clusters["b"].members.registrars(cid)[0]
    net.connect("a", cid, clean=True, will=Will("w/r", b"restarted", 0, False))
    net.incs["a"] = 2  # a restarted: its connections are gone
    net.membership()
    net.tick(0.01)
    wills = [n for n in sorted(net.up) for m in net.published[n] if m.topic == "w/r"]
    assert wills == [registrar]


def test_a_client_of_a_restarted_node_keeps_its_will_while_connected():
    """Simulator finding 10: a restarted node stayed suspect at the registrars until the
    next membership change, so the will of every client connected to its new incarnation
    was published, and again at each re-registration."""
    net = Net(settings=ClusterSettings(will_delay=0.5, register_interval=5.0))
    old = _will_cid(net, "a")
    net.connect("a", old, clean=True, will=Will("w/old", b"gone", 0, False))
    net.restart("a")
    fresh = cid_with(net, lambda regs, holders: regs[0] != "a", prefix="fresh")
    ch = net.connect("a", fresh, clean=True, will=Will("w/fresh", b"still here", 0, False))
    for _ in range(12):
        net.tick(1.0)  # two re-registrations of the connected client
    published = [m.topic for n in sorted(net.up) for m in net.published[n]]
    assert published.count("w/old") == 1  # the old incarnation's client is gone
    assert "w/fresh" not in published  # [MQTT-3.1.2-8]: only when the connection ends
    assert ch.state == "connected"


def test_a_registration_is_kept_by_two_nodes_besides_the_connections_own():
    """Finding 19 (issue 20): a connection whose own node is its registrar or backup is kept
    by the next node of the ranking too, so its will outlives its node and one other."""
    m = Membership("a", 1, replication=2, will_delay=0.5)
    m.update(["b", "c", "d"], {"b": 1, "c": 1, "d": 1}, 10.0)
    cid = "some-client"
    regs = m.registrars(cid)
    other = next(n for n in m.live if n not in regs)
    assert m.keepers(cid, other) == regs
    third = m.keepers(cid, regs[0])
    assert third[:2] == regs and len(third) == 3 and regs[0] not in third[2:]
    assert m.keepers(cid, regs[1]) == third


def test_a_will_outlives_its_node_when_that_node_was_its_registrar_and_the_backup_dies_too():
    """Finding 19 (fuzzer seeds 176, 693): the node holding the connection was also its
    registrar, and its backup died before that node was found dead: both copies of the will
    were gone. The next node of the ranking keeps a third."""
    net = Net(names=["a", "b", "c", "d"], settings=ClusterSettings(will_delay=0.5))
    cid = cid_with(net, lambda regs, holders: regs[0] == "a")
    backup = net.clusters["a"].members.registrars(cid)[1]
    net.connect("a", cid, clean=True, will=Will("w/double", b"gone", 1, False))
    net.pump()
    third = net.clusters["a"].members.keepers(cid, "a")[2]
    assert cid in net.clusters[third].registry.entries
    net.up.discard("a")
    net.up.discard(backup)
    net.membership()
    net.tick(0.6)
    net.tick(5.0)
    wills = [(n, m.payload) for n in sorted(net.up) for m in net.published[n] if m.topic == "w/double"]
    assert len(wills) == 1 and wills[0][1] == b"gone"


def test_a_client_that_left_normally_has_no_will_at_the_registrar():
    net = Net(settings=ClusterSettings(will_delay=0.5))
    cid = _will_cid(net, "a")
    ch = net.connect("a", cid, clean=True, will=Will("w/n", b"x", 0, False))
    ch.close("DISCONNECT")
    net.up.discard("a")
    net.membership()
    net.tick(1.0)
    assert not any(m.topic == "w/n" for n in net.up for m in net.published[n])


# --------------------------------------------------------------------------- split brain


def test_two_live_registrations_after_a_split_keep_the_larger_epoch_at_node_and_kick_the_other():
    net = Net()
    registrar = "a"
    cid = cid_with(net, lambda regs, holders: regs[0] == registrar)
    ra = net.clusters[registrar]
    first = RegRegister(cid, "b", 1, "b/1/7", 2, True, None, 100.0)
    ra.receive("b", first.KIND, first.encode(), 0.0)
    net.queue.clear()
    # the same epoch, claimed later, on the other side of the split: that one stays
    later = RegRegister(cid, "c", 1, "c/1/3", 2, True, None, 101.0)
    mark = len(net.sent)
    ra.receive("c", later.KIND, later.encode(), 0.0)
    kicks = [decode(k, p) for f, d, k, p in net.sent[mark:] if k == "reg.kick"]
    assert kicks == [RegKick(cid, "b/1/7", 2, "c")]
    assert ra.registry.entries[cid].conn == "c/1/3"
    # a larger epoch wins over a later claim
    newer = RegRegister(cid, "b", 1, "b/1/8", 3, True, None, 50.0)
    mark = len(net.sent)
    ra.receive("b", newer.KIND, newer.encode(), 0.0)
    kicks = [decode(k, p) for f, d, k, p in net.sent[mark:] if k == "reg.kick"]
    assert kicks == [RegKick(cid, "c/1/3", 3, "b")]
    assert ra.registry.entries[cid].conn == "b/1/8"


def test_a_healed_split_leaves_one_connection_of_a_client_id():
    net = Net()
    cid = cid_with(net, lambda regs, holders: regs[0] == "a")
    # b cannot reach a and c, and they cannot reach b
    net.up = {"a", "c"}
    net.membership()
    left = net.connect("c", cid, clean=True)
    net.up = {"b"}
    net.clusters["b"].membership(["b"], {"b": 1}, net.t)
    right = net.connect("b", cid, clean=True)
    assert left.state == right.state == "connected"
    net.up = set(NAMES)
    net.t += 1.0
    net.membership()
    # (the registrar's copy from the other side can land first and replace its entry, so
    # the two registrations may meet only at the next periodic re-registration)
    net.tick(ClusterSettings().register_interval)
    assert sorted(ch.state for ch in (left, right)) == ["closed", "connected"]  # [MQTT-3.1.4-2]
    # the (epoch, at, node) rule: same epoch and time, the larger node id stays
    assert left.state == "connected" and "connected on node c" in right.reason


# --------------------------------------------------------------------------- retained


def test_a_retained_message_is_stored_at_its_owners_and_the_interim_copy_released_on_ret_ack():
    net = Net()
    topic = next(
        f"r/{i}" for i in range(1000) if "a" not in net.clusters["a"].members.owners(f"r/{i}")
    )  # published at a node that does not own it
    owners = net.clusters["a"].members.owners(topic)
    msg = Message(topic, b"v1", 1, True, "a", net.brokers["a"].next_seq(), "pub", 1_000_000.0)
    net.brokers["a"].publish(msg)  # [MQTT-3.3.1-5]
    assert net.brokers["a"].retained.get(topic) is not None  # until an owner confirms
    net.pump()
    for n in NAMES:
        assert (net.brokers[n].retained.get(topic) is not None) == (n in owners), n
    acks = [decode(k, p) for f, d, k, p in net.sent if k == "ret.ack"]
    assert RetAck([RetainedAck(topic, 1_000_000.0, "a", msg.seq)]) in acks


def _subscriber(net: Net, node: str, cid: str) -> FakeChannel:
    return net.connect(node, cid, clean=True)


def test_a_lookup_asks_the_owners_for_an_exact_filter_and_everyone_for_a_wildcard():
    net = Net()
    topic = "look/here"
    owners = net.clusters["a"].members.owners(topic)
    asker = next(n for n in NAMES if n not in owners)
    net.brokers["a"].publish(Message(topic, b"kept", 1, True, "a", 1, "pub", 1_000_000.0))
    net.pump()
    ch = _subscriber(net, asker, "sub-1")
    mark = len(net.sent)
    net.brokers[asker].table.subscribe(ch.session, topic, 1)
    net.brokers[asker].send_retained(ch.session, topic, 1, net.t)
    net.pump()
    queries = [(d, k) for f, d, k in net.kinds(mark) if k == "ret.query"]
    assert queries == [(n, "ret.query") for n in sorted(owners)]
    assert len(ch.frames) == 1 and b"kept" in ch.frames[0]  # sent once [MQTT-3.3.1-6]
    mark = len(net.sent)
    net.brokers[asker].table.subscribe(ch.session, "look/#", 1)
    net.brokers[asker].send_retained(ch.session, "look/#", 1, net.t)
    net.pump()
    queries = [d for f, d, k in net.kinds(mark) if k == "ret.query"]
    assert queries == sorted(set(NAMES) - {asker})  # (sorted: finding 0.2 of the plan)
    assert len(ch.frames) == 2


def test_an_unanswered_lookup_delivers_what_it_has_after_lookup_timeout():
    net = Net(settings=ClusterSettings(lookup_timeout=1.0))
    ch = _subscriber(net, "a", "sub-2")
    net.brokers["a"].table.subscribe(ch.session, "x/#", 0)
    net.brokers["a"].send_retained(ch.session, "x/#", 0, net.t)
    net.queue.clear()  # the queries are lost
    assert net.clusters["a"].retained.lookups
    net.tick(1.1)
    assert not net.clusters["a"].retained.lookups


def test_a_deletion_stays_as_a_tombstone_until_tombstone_ttl_past_now_plus_wall_offset():
    wall = 1_000_000.0
    net = Net(settings=ClusterSettings(tombstone_ttl=100.0), wall_offset=wall)
    topic = "gone/t"
    owners = net.clusters["a"].members.owners(topic)
    net.brokers["a"].publish(Message(topic, b"v", 0, True, "a", 1, "pub", wall))
    net.brokers["a"].publish(Message(topic, b"", 0, True, "a", 2, "pub", wall + 1))  # [MQTT-3.3.1-10]
    net.pump()
    for n in owners:
        assert net.brokers[n].retained.get(topic).payload == b""  # a tombstone, never sent
    net.tick(100.5)  # wall + 100.5 - 100 < wall + 1: kept
    assert all(net.brokers[n].retained.get(topic) is not None for n in owners)
    net.tick(1.0)
    assert all(net.brokers[n].retained.get(topic) is None for n in owners)


# --------------------------------------------------------------------------- the wire

WILL = WireWill("w", base64.b64encode(b"bye").decode(), 1, True)
WILL_JSON = {"topic": "w", "payload": "Ynll", "qos": 1, "retain": True}
REG = Registration("c1", "n1", 7, "n1/7/3", 4, False, WILL, True, 1700000000.25)
REG_JSON = {
    "cid": "c1",
    "node": "n1",
    "inc": 7,
    "conn": "n1/7/3",
    "epoch": 4,
    "clean": False,
    "will": WILL_JSON,
    "connected": True,
    "at": 1700000000.25,
}
ENTRY = SnapshotEntry("n2", 9, "t/1", "eA==", 2, 1, 5, 1, "pub", 1700000001.5)
FWD = Forwarded("t/2", "eQ==", 2, False, "n1", 12, "pub", 1700000001.75)
# (mesh protocol 7, issue 23: a message's MQTT 5 properties last, base64, null when none; 8: then
# what is left of its life in milliseconds, null when it does not expire; 13: then the message a
# shared group's re-send re-sends, its root, [origin, seq], null for any other message)
FWD_JSON = ["t/2", "eQ==", 2, False, "n1", 12, "pub", 1700000001.75, None, None, None]
SNAP = Snapshot(
    "c1", {"t/#": 1}, 3, [ENTRY], [("n2", 3), ("n2", 8)], [4], "n1", 4, 17, [("n2", 10, 1, 6)], [(4, FWD)], {"n2": 2}
)
SNAP_JSON = {
    "cid": "c1",
    "subs": {"t/#": 1},
    "subs_version": 3,
    "entries": [["n2", 9, "t/1", "eA==", 2, 1, 5, 1, "pub", 1700000001.5, None, None, None]],
    # (mesh protocol 5, issue 20: every settled id the copy remembers, packed: per origin the
    # sorted sequence numbers as LEB128 varints of their differences, 3 and 5; and the floors)
    "done": {"n2": "AwU="},
    "floors": {"n2": 2},
    "rel": [4],
    "active": "n1",
    "epoch": 4,
    "version": 17,  # (mesh protocol 3, issue 15: "version" and "reserved")
    "reserved": [["n2", 10, 1, 6]],
    "inbound": [[4, FWD_JSON]],  # (mesh protocol 4: inbound QoS 2 messages with their agreed ids)
}
ITEM = RetainedItem("r/1", "dg==", 1, 1700000002.0, "n3", 11, "pub")
ITEM_JSON = ["r/1", "dg==", 1, 1700000002.0, "n3", 11, "pub", None, None]

# each kind: the typed message, and the dict the cluster wrote before issue 14 S3 (with the
# fields mesh protocol 3 added for issue 15: a snapshot's and a settlement batch's "version")
GOLDEN = [
    (
        RegClaim("c1", "n1", 7, "n1/7/3", False, WILL, 1700000000.25),
        {"cid": "c1", "node": "n1", "inc": 7, "conn": "n1/7/3", "clean": False, "will": WILL_JSON, "at": 1700000000.25},
    ),
    (RegGrant("c1", "n1/7/3", 4, None), {"cid": "c1", "conn": "n1/7/3", "epoch": 4, "prev": None, "kept": 0}),
    (
        RegGrant("c1", "n1/7/3", 5, "n2", 4),  # ("kept": mesh protocol 3)
        {"cid": "c1", "conn": "n1/7/3", "epoch": 5, "prev": "n2", "kept": 4},
    ),
    (RegKick("c1", "n1/7/3", 5, "n2"), {"cid": "c1", "conn": "n1/7/3", "epoch": 5, "by": "n2"}),
    (
        RegRelease("c1", "n1/7/3", 4, "n1", True, 600),
        {"cid": "c1", "conn": "n1/7/3", "epoch": 4, "node": "n1", "delayed": True, "expiry": 600},
    ),
    (
        RegRelease("c1", "n1/7/3", 4, "n1", False, 600, refused=True),  # ("refused": mesh protocol 10)
        {"cid": "c1", "conn": "n1/7/3", "epoch": 4, "node": "n1", "delayed": False, "expiry": 600, "refused": True},
    ),
    (
        RegRelease("c1", "n1/7/3", 4, "n1", True, 600, ago=4_250, will=WILL),  # ("ago", "will": mesh protocol 11)
        {
            "cid": "c1",
            "conn": "n1/7/3",
            "epoch": 4,
            "node": "n1",
            "delayed": True,
            "expiry": 600,
            "ago": 4_250,
            "will": WILL_JSON,
        },
    ),
    (
        RegRegister("c1", "n1", 7, "n1/7/3", 4, True, None, 1700000000.25),
        {
            "cid": "c1",
            "node": "n1",
            "inc": 7,
            "conn": "n1/7/3",
            "epoch": 4,
            "clean": True,
            "will": None,
            "at": 1700000000.25,
        },
    ),
    (RegCopy([REG]), {"entries": [REG_JSON]}),
    (SessFetch("c1", "n1/7/3", 4, "n1"), {"cid": "c1", "conn": "n1/7/3", "epoch": 4, "to": "n1"}),
    (SessState("c1", "n1/7/3", SNAP), {"cid": "c1", "conn": "n1/7/3", "snap": SNAP_JSON}),
    (SessState("c1", "n1/7/3", None, ended=True), {"cid": "c1", "conn": "n1/7/3", "snap": None, "ended": True}),
    (SessCopy(SNAP), SNAP_JSON),
    (SessMerge(SNAP), SNAP_JSON),
    (
        SessSettle("c1", 4, [Settlement("n2", 9, "sent", 5), Settlement("n2", 8, "done", 0)], 17),
        {"cid": "c1", "epoch": 4, "items": [["n2", 9, "sent", 5], ["n2", 8, "done", 0]], "version": 17},
    ),
    (
        # an "in" carries its message (mesh protocol 4); the others keep their four fields
        SessSettle("c1", 4, [Settlement("n1", 12, "in", 4, FWD), Settlement("", 0, "free", 3)], 19),
        {"cid": "c1", "epoch": 4, "items": [["n1", 12, "in", 4, FWD_JSON], ["", 0, "free", 3]], "version": 19},
    ),
    (SessAck("c1", 4, 17), {"cid": "c1", "epoch": 4, "version": 17}),  # (new in mesh protocol 3)
    (SessSubs("c1", 3, {"a/+": 0, "b": 2}), {"cid": "c1", "version": 3, "subs": {"a/+": 0, "b": 2}}),
    (SessDiscard("c1", 4), {"cid": "c1", "epoch": 4}),
    (
        SessFwd("c1", Forwarded("t/1", "eA==", 1, False, "n2", 9, "pub", 1700000001.5)),
        {"cid": "c1", "msg": ["t/1", "eA==", 1, False, "n2", 9, "pub", 1700000001.5, None, None, None]},
    ),
    (
        SessFwd("c1", Forwarded("t/1", "eA==", 1, False, "n2", 9, "pub", 1700000001.5, root=("n0", 4))),
        {"cid": "c1", "msg": ["t/1", "eA==", 1, False, "n2", 9, "pub", 1700000001.5, None, None, ["n0", 4]]},
    ),
    (RetSet([ITEM]), {"items": [ITEM_JSON]}),
    (RetAck([RetainedAck("r/1", 1700000002.0, "n3", 11)]), {"items": [["r/1", 1700000002.0, "n3", 11]]}),
    (RetQuery(12, "r/#"), {"qid": 12, "filter": "r/#"}),
    (RetReply(12, [ITEM]), {"qid": 12, "items": [ITEM_JSON]}),
]


def test_the_golden_set_covers_every_kind_and_every_kind_has_a_handler():
    assert sorted({type(m).KIND for m, _ in GOLDEN}) == sorted(KINDS) == sorted(HANDLERS)
    assert len(KINDS) == 19
    assert all(HANDLERS[k][0] is KINDS[k] for k in KINDS)


@pytest.mark.parametrize("msg, body", GOLDEN, ids=[type(m).KIND for m, _ in GOLDEN])
def test_each_kind_encodes_to_the_bytes_of_before_and_decodes_back(msg, body):
    assert msg.encode() == json.dumps(body).encode()
    assert decode(type(msg).KIND, msg.encode()) == msg


def test_a_release_is_older_by_its_way_and_says_so_to_the_next():
    """A release's "ago" (when its connection ended) grows by the time it was on the way, at
    each relay: the registrar counts the session's interval and the will's delay from the
    end, not from when it came (mesh protocol 11, finding 26 of docs/simulation.md)."""
    msg = RegRelease("c1", "n1/7/3", 4, "n1", True, 600, ago=4_250, will=WILL)
    came = decode("reg.release", msg.encode(), 30)
    assert came == RegRelease("c1", "n1/7/3", 4, "n1", True, 600, ago=4_280, will=WILL)
    assert decode("reg.release", came.encode(), 12).ago == 4_292
    assert decode(
        "reg.release", b'{"cid": "c", "conn": "x", "epoch": 1, "node": "n", "delayed": false, "expiry": 5}'
    ) == (RegRelease("c", "x", 1, "n", False, 5))


def test_a_sess_state_without_a_session_carries_null():
    msg = SessState("c1", "n1/7/3", None)
    assert msg.encode() == b'{"cid": "c1", "conn": "n1/7/3", "snap": null}'
    assert decode("sess.state", msg.encode()) == msg


def test_a_kick_without_by_is_read_as_before():
    assert decode("reg.kick", b'{"cid": "c", "conn": "x", "epoch": 1}') == RegKick("c", "x", 1, None)


@pytest.mark.parametrize(
    "kind, body, names",
    [
        ("reg.claim", {"cid": "c"}, ["reg.claim", "'node'"]),
        ("reg.grant", {"cid": "c", "conn": "x", "epoch": "1", "prev": None}, ["reg.grant", "'epoch'"]),
        ("sess.copy", {**SNAP_JSON, "entries": [["n2", 9]]}, ["sess.copy entries[0]", "array of 13"]),
        ("sess.settle", {"cid": "c", "epoch": 1, "items": [["n", 1, "sent", None]]}, ["sess.settle items[0]", "'pid'"]),
        ("reg.copy", {"entries": [{**REG_JSON, "will": {"topic": "w"}}]}, ["reg.copy entries[0] will", "'payload'"]),
        ("ret.set", {"items": "no"}, ["ret.set", "'items'"]),
        ("sess.subs", {"cid": "c", "version": 1, "subs": {"a": "x"}}, ["sess.subs subs", "'a'"]),
        ("ret.query", [1, 2], ["ret.query", "not a JSON object"]),
    ],
)
def test_a_malformed_body_names_its_kind_and_key(kind, body, names):
    with pytest.raises(ClusterWireError) as err:
        decode(kind, json.dumps(body).encode())
    for name in names:
        assert name in str(err.value)


def test_a_body_that_is_not_json_and_an_unknown_kind_raise_value_errors():
    with pytest.raises(ClusterWireError, match="reg.claim: not JSON"):
        decode("reg.claim", b"\xff{")
    net = Net()
    with pytest.raises(ValueError, match="unknown cluster message kind 'reg.nope'"):
        net.clusters["a"].receive("b", "reg.nope", b"{}", 0.0)
    with pytest.raises(ValueError, match="reg.grant"):
        net.clusters["a"].receive("b", "reg.grant", b'{"cid": 1}', 0.0)


def test_a_node_still_forming_its_links_waits_for_them_before_it_decides():
    """Issue 22: a 3-node mesh started and connected to at once refused a persistent client
    (CONNACK 0x03) in 2 of 6 tries, its node not seeing the others yet. A node that has just
    started waits for its links, up to claim_timeout: the client is served once they are up,
    and refused as before if they do not come."""
    net = Net(settings=ClusterSettings(replication=2, stall=1e9, claim_timeout=1.0))
    # node c has just started (first tick) and has heard of nobody yet
    net.up.discard("c")
    net.membership()
    net.clusters["c"].membership(["c"], {"c": 1}, net.t)
    waiting = net.connect("c", "p1", clean=False)
    assert waiting.state == "claiming" and net.clusters["c"].counters["waited_no_quorum"] == 1
    net.tick(0.5)
    assert waiting.state == "claiming"  # still within claim_timeout
    net.up.add("c")
    net.membership()  # its links are up: the claim goes on to the registrar
    assert waiting.state == "connected" and waiting.refused_rc is None
    assert net.clusters["c"].counters["refused_no_quorum"] == 0

    alone = Net(settings=ClusterSettings(replication=2, stall=1e9, claim_timeout=1.0))
    alone.up.discard("c")
    alone.membership()
    alone.clusters["c"].membership(["c"], {"c": 1}, alone.t)
    refused = alone.connect("c", "p1", clean=False)
    assert refused.state == "claiming"
    c = alone.clusters["c"]  # (cut off: Net.tick ticks only the nodes in reach)
    alone.t += 0.9
    c.tick(alone.t)
    assert refused.state == "claiming"
    alone.t += 0.1
    c.tick(alone.t)  # claim_timeout: the links did not come, refused as before
    assert refused.state == "closed" and refused.refused_rc == 0x03
    assert alone.clusters["c"].counters["refused_no_quorum"] == 1
    assert not alone.clusters["c"].claimant.claims  # nothing left behind


def test_mqtt5_properties_travel_in_every_cluster_message_that_carries_a_message():
    """A forwarded message, a snapshot entry, a retained item and a will keep the message's
    MQTT 5 properties (message.Message.props) across nodes, byte for byte; a value that is not
    base64 is refused naming where."""
    props = b"\x03\x00\x04json&\x00\x01k\x00\x01v"
    msg = Message("t", b"x", 1, False, "n1", 5, "pub", 1.0, props)
    fwd = Forwarded.of(msg)
    back = SessFwd.from_json(json.loads(SessFwd("c1", fwd).encode()))
    assert back.msg.message(0.0).props == props
    item = RetainedItem("r", "dg==", 1, 2.0, "n3", 1, "pub", base64.b64encode(props).decode())
    assert RetainedItem.from_json(json.loads(json.dumps(item)), "ret.set") == item
    will = WireWill("w", "Ynll", 1, False, 3, base64.b64encode(props).decode())
    assert WireWill.from_json(will.to_json(), "reg.claim") == will
    with pytest.raises(ClusterWireError, match="props is not base64"):
        Forwarded.from_json(["t", "eA==", 1, False, "n", 1, "p", 1.0, "not base64!", None, None], "sess.fwd msg")


def test_a_message_in_flight_under_two_packet_ids_takes_the_latest_views_id():
    """The fault harness (7 nodes, 3.1.1, seed 14): a subscriber got one QoS 2 message twice,
    both DUP re-sends, under packet ids 866 and 864. A copy that missed the later "sent"
    (the message queued again when the client left before the gate let its first PUBLISH
    out, then sent under a new id) still had the older id, at the same state: the merge kept
    whichever view came first. The latest view's id wins a tie, as an entry and as an id
    reserved for a message that view did not have."""
    older = SnapshotEntry("n1", 9, "t/1", "eA==", 2, 2, 864, 1, "pub", 1.0)
    newer = older._replace(pid=866)
    stale = Snapshot("c", {}, 0, [older], [], [], "n4", 3, 40)
    latest = Snapshot("c", {}, 0, [newer], [], [], "n0", 3, 41)
    for views in ([stale, latest], [latest, stale]):
        merged = merge_snapshots(views)
        assert merged is not None and [(e.seq, e.pid, e.state) for e in merged.entries] == [(9, 866, 1)]
    reserving = Snapshot("c", {}, 0, [], [], [], "n0", 3, 42, [("n1", 9, 1, 870)])
    merged = merge_snapshots([stale, reserving])
    assert merged is not None and [(e.seq, e.pid, e.state) for e in merged.entries] == [(9, 870, 1)]
    # a further state wins whatever its view (a message only moves forward)
    rel = Snapshot("c", {}, 0, [older._replace(state=2)], [], [], "n4", 2, 7)
    merged = merge_snapshots([latest, rel])
    assert merged is not None and [(e.pid, e.state) for e in merged.entries] == [(864, 2)]


def test_settlements_no_frame_waits_for_go_and_are_answered_within_the_batch_delay():
    """Issue 26: a QoS 1 subscriber's PUBACKs ("done") hold up no frame of its client: the
    holders are told, and answer, within mesh.batch_delay, with what else goes then. A QoS 2
    PUBLISH waits for its "sent" step: that batch and its answer go this loop iteration, and
    so does one gathered while a batch sent so is out (it does not wait behind it)."""
    net = Net()
    cid, ch = _persistent_subscriber(net, lambda regs, holders: set(holders) == {"a", "b"})
    session = ch.session
    msg = net.publish("b", "t/1", b"x", qos=1)
    assert len(ch.frames) == 1 and not session.hurry  # (a QoS 1 PUBLISH waits for nothing)
    mark = len(net.sent)
    session.on_puback(next(iter(session.inflight)), net.t)
    net.pump()
    told = [(f, d, k, json.loads(p)) for f, d, k, p in net.sent[mark:]]
    assert [(f, d, k) for f, d, k, _ in told] == [("a", "b", "sess.settle"), ("b", "a", "sess.ack")]
    assert told[0][3]["later"] is True and told[0][3]["items"][0][:3] == ["b", msg.seq, "done"]
    assert net.later[-2:] == net.sent[mark:]  # (both within the batch delay)
    assert session.safe_version == session.version  # (answered all the same)
    # a QoS 2 PUBLISH waits for its "sent": hurried, beside a "done" batch still out
    mark, later = len(net.sent), len(net.later)
    net.publish("b", "t/2", b"y", qos=1)
    session.on_puback(next(iter(session.inflight)), net.t)
    net.clusters["a"].flush(net.t)  # ("done" out, within the batch delay; not answered yet)
    assert session.sent_version > session.safe_version and session.sent_later
    frames = len(ch.frames)
    net.publish("b", "t/3", b"z", qos=2)  # (pumped: the "sent" goes beside the "done")
    assert not session.hurry and len(ch.frames) == frames + 1  # (written once b had "sent")
    assert session.safe_version == session.version
    settles = [json.loads(p) for f, d, k, p in net.sent[mark:] if k == "sess.settle"]
    assert [([i[2] for i in m["items"]], m.get("later", False)) for m in settles] == [
        (["done"], True),
        (["sent"], False),
    ]
    assert [k for f, d, k, p in net.later[later:] if k != "sess.fwd"] == ["sess.settle", "sess.ack"]  # ("done")


def test_a_redirect_forwards_what_the_mesh_would_not_take_to_the_clients_new_node():
    """Issue 26: for redirect_grace after a claim elsewhere, a holder forwards what reaches its
    copy (sess.fwd). A message published at the holder that the mesh routes to the new node
    anyway (its subscription is known here: custody takes it there) is not forwarded too;
    one from another node is, as is one the mesh would not route there."""
    from types import SimpleNamespace

    from mqttmesh.mesh.cluster.cluster_wire import Outbox
    from mqttmesh.mesh.cluster.replication import Redirect, Replication

    routed = {("c", "t/known")}
    net = SimpleNamespace(routes_to=lambda dest, topic: (dest, topic) in routed)
    outbox = Outbox()
    replication = Replication("a", Membership("a", 1, 2, 5.0), outbox, net=net)  # type: ignore[arg-type]
    replication.redirects["k"] = Redirect("c", 10.0)
    session = SimpleNamespace(client_id="k")
    for origin, topic in (("a", "t/known"), ("b", "t/known"), ("a", "t/new")):
        replication.forward(session, Message(topic, b"x", 1, False, origin, 1, "pub", 1.0))  # type: ignore[arg-type]
    sent = outbox.take()
    assert [(t.dest, t.msg.msg.topic, t.msg.msg.origin, t.later) for t in sent] == [
        ("c", "t/known", "b", True),
        ("c", "t/new", "a", True),
    ]
    assert replication.counters["redirected"] == 2 and replication.counters["redirect_routed"] == 1
