"""The MQTT 5 Session Expiry Interval across the mesh, on the cluster cores of three nodes
wired by tests/support/cluster_net.py (on one node: tests/unit/test_channel5_unit.py).

A persistent session whose client left ends its interval later on every node that holds a
copy of it, each counting on its own clock the remaining time the copy carries, and at its
registrar, which from then on keeps no session for the ClientId; a claim that still finds a
copy (a node that did not hear of the end in time) discards it. A connection before the
end resumes the session on any node. Rule ids are MQTT 5.0's.
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from mqttmesh.mesh.cluster.cluster import ClusterSettings
from mqttmesh.mesh.cluster.cluster_wire import RegClaim, RegRelease
from mqttmesh.session import KEPT
from support.cluster_net import FakeChannel, Net, cid_with, holder_of


def _wait(net: Net, seconds: float) -> None:
    """Time passes in the small steps of a node's timers (a long jump reads as a pause)."""
    for _ in range(round(seconds / 0.25)):
        net.tick(0.25)


def _claim(net: Net, node: str, cid: str):
    """A client connects at ``node`` (Clean Start 0) and its claim runs to its end."""
    ch = net.connect(node, cid, clean=False)
    for _ in range(20):
        if ch.state != "claiming":
            break
        net.tick(0.25)
    return ch


def _left(net: Net, node: str, cid: str, expiry: int):
    """A persistent session of ``cid`` with one subscription, served at ``node``, whose
    client then leaves with a Session Expiry Interval of ``expiry`` seconds."""
    ch = net.connect(node, cid, clean=False, expiry=expiry)
    assert ch.state == "connected"
    net.brokers[node].table.subscribe(ch.session, "t/#", 1)
    net.pump()
    ch.close("connection lost")
    net.pump()
    return ch


def test_a_session_ends_at_one_time_on_every_node_that_holds_it():
    """[MQTT-4.1.0-2] [MQTT-3.1.2-23]: kept until its interval passed, everywhere; then gone
    from every node, and the registrar keeps none: a new connection finds no session."""
    net = Net(settings=ClusterSettings(will_delay=0.5))
    cid = cid_with(net, lambda regs, holders: True)
    _left(net, "a", cid, 10)
    holders = holder_of(net, cid)
    assert len(holders) >= 2
    for n in holders:
        assert net.brokers[n].sessions[cid].expires_at is not None
    _wait(net, 9.5)
    assert holder_of(net, cid) == holders
    _wait(net, 1.0)
    assert holder_of(net, cid) == []
    back = _claim(net, "b", cid)
    assert back.state == "connected" and back.present is False


def test_a_connection_before_the_end_resumes_the_session_on_another_node():
    """[MQTT-3.1.2-23]: resumed at c within the interval; its copies no longer end, and the
    time starts again only when that connection ends."""
    net = Net(settings=ClusterSettings(will_delay=0.5))
    cid = cid_with(net, lambda regs, holders: True)
    _left(net, "a", cid, 10)
    _wait(net, 5.0)
    back = _claim(net, "c", cid)
    assert back.state == "connected" and back.present is True
    assert back.session.subscriptions == {"t/#": 1}
    net.pump()
    _wait(net, 20.0)
    assert all(net.brokers[n].sessions[cid].expires_at is None for n in holder_of(net, cid))
    assert "c" in holder_of(net, cid)


def test_a_copy_that_missed_the_end_is_discarded_not_resumed():
    """A holder away while the session ended (its copy never heard when the session ends)
    comes back with it: the registrar's grant says the session expired, and the claim
    discards that copy instead of resuming it [MQTT-4.1.0-2]."""
    net = Net(settings=ClusterSettings(will_delay=0.5))
    cid = cid_with(net, lambda regs, holders: "c" in holders and regs[0] != "c")
    ch = net.connect("a", cid, clean=False, expiry=5)
    net.brokers["a"].table.subscribe(ch.session, "t/#", 1)
    net.pump()
    net.up.discard("c")  # c is cut off with its copy, which has no end
    net.membership()
    ch.close("connection lost")
    net.pump()
    _wait(net, 6.0)
    assert cid not in net.brokers["a"].sessions
    assert net.brokers["c"].sessions[cid].expires_at is None
    net.up.add("c")
    net.membership()
    _wait(net, 1.0)
    back = _claim(net, "b", cid)
    assert back.state == "connected" and back.present is False
    assert back.session.subscriptions == {}
    assert sum(net.clusters[n].counters["expired_copies_discarded"] for n in net.names) == 1


def _connect_ending(net: Net, node: str, cid: str) -> FakeChannel:
    """MQTT 5 Clean Start 0 with a Session Expiry Interval of 0: the session held is resumed,
    and ends with this connection."""
    ch = FakeChannel(net, node, cid, 0)
    net.clusters[node].connect(ch, cid, True, None, net.t, fresh=False, expiry=0)
    net.pump()
    for _ in range(20):
        if ch.state != "claiming":
            break
        net.tick(0.25)
    return ch


@pytest.mark.parametrize("end", ["cut_off_holder", "node_died"])
def test_a_session_that_ended_with_its_connection_is_not_resumed_from_a_copy(end: str):
    """[MQTT-3.1.2-23]: Clean Start 0 and Session Expiry 0 end the session with its
    connection; while it is served its copies live on the holders, and only the discards sent
    at the end say it ended. A copy they missed (a holder cut off then; or no discard at all:
    the connection ended with its node) is discarded by the next claim, not resumed: the
    registrar keeps the end of such a connection, and its grant says expired (finding 22 of
    docs/simulation.md)."""
    net = Net(settings=ClusterSettings(will_delay=0.5))
    cid = cid_with(net, lambda regs, holders: "c" in holders and "a" not in regs)
    ch = _connect_ending(net, "a", cid)
    assert ch.state == "connected" and ch.present is False
    net.brokers["a"].table.subscribe(ch.session, "t/#", 1)
    net.pump()
    net.publish("b", "t/x", b"m", 1)
    _wait(net, 1.0)
    assert holder_of(net, cid) == ["a", "b", "c"]  # (copies while it is served)
    if end == "cut_off_holder":
        net.up.discard("c")
        net.membership()
        ch.close("connection lost")
        net.pump()
        assert holder_of(net, cid) == ["c"]  # c missed the discards
        net.up.add("c")
        net.membership()
    else:
        net.up.discard("a")  # the connection ends with its node: nobody discards the copies
        net.membership()
    _wait(net, 2.0)
    assert "c" in holder_of(net, cid)
    back = _connect_ending(net, "b", cid)
    assert back.state == "connected" and back.present is False
    assert back.session.subscriptions == {}
    assert "c" not in holder_of(net, cid)
    assert sum(net.clusters[n].counters["expired_copies_discarded"] for n in net.up) == 1


def test_a_claim_refused_while_the_sessions_node_is_cut_off_leaves_the_session_ending():
    """The client's node a is cut off with c, a holder, though b, d and e still count them
    live; the client leaves a (Session Expiry 1 s) and the end reaches none of them. Its claim
    on b replaces a's connection at the registrar d, then is refused (too few of the home
    answered, 0x03). That claim resumed nothing, so the session still ends its interval after
    a's connection (counted from the claim that replaced it: d knows no better): after the
    heal, a claim finds d's copy and c's, which never heard of the end, and discards them.
    Before, the refused claim's release said the session never ends, and the copies were
    resumed; and at a heal, the side whose refused claims had the higher epoch made the other
    side forget the end it knew (finding 23 of docs/simulation.md) [MQTT-4.1.0-2]."""
    net = Net(names=["a", "b", "c", "d", "e"], settings=ClusterSettings(will_delay=0.5))
    members = net.clusters["a"].members
    cid = next(
        c
        for c in (f"client-{i}" for i in range(10_000))
        if members.registrars(c)[0] not in "abc" and {"a", "c"} <= set(members.home(c)) and "b" not in members.home(c)
    )
    registrar = members.registrars(cid)[0]
    ch = net.connect("a", cid, clean=False, expiry=1)
    net.brokers["a"].table.subscribe(ch.session, "t/#", 1)
    net.pump()
    _wait(net, 1.0)
    net.up -= {"a", "c"}  # (cut off: no membership change yet)
    ch.close("connection lost")
    net.pump()
    refused = _claim(net, "b", cid)
    assert refused.state == "closed" and refused.refused_rc == 3
    entry = net.clusters[registrar].registry.entries[cid]
    assert not entry.connected and entry.node == "b" and entry.session_due is not None
    _wait(net, 2.0)
    net.up |= {"a", "c"}
    net.membership()
    _wait(net, 1.0)
    assert {"c", registrar} <= set(holder_of(net, cid))  # (copies that never heard of the end)
    back = _claim(net, "b", cid)
    assert back.state == "connected" and back.present is False
    assert back.session.subscriptions == {}


def test_a_refused_claim_keeps_the_end_it_found_refined_by_the_release_of_the_connection_it_replaced():
    """At the registrar: a claim that replaces a live connection carries that session's end,
    its interval from the claim; when the connection's release comes, from its end; and the
    claim's release, refused, leaves it so (a served connection's release sets its own)."""
    net = Net(settings=ClusterSettings(will_delay=0.5))
    cid = cid_with(net, lambda regs, holders: regs[0] == "c")
    net.connect("a", cid, clean=False, expiry=5)
    registry = net.clusters["c"].registry
    conn = registry.entries[cid].conn
    wall, t = net.wall_offset, net.t
    registry.on_claim("b", RegClaim(cid, "b", 1, "b/1/99", False, None, t + wall, 5), t)
    assert registry.entries[cid].session_due == t + 5 + wall
    registry.on_release("a", RegRelease(cid, conn, 1, "a", False, 5), t + 0.2)  # a closed it on the kick
    assert registry.entries[cid].connected and registry.entries[cid].session_due == t + 0.2 + 5 + wall
    registry.on_release("b", RegRelease(cid, "b/1/99", 2, "b", False, KEPT, refused=True), t + 1.0)
    entry = registry.entries[cid]
    assert not entry.connected and entry.session_due == t + 0.2 + 5 + wall
    grant = registry.on_claim("a", RegClaim(cid, "a", 1, "a/1/98", False, None, t + 6 + wall, 5), t + 6.0)
    assert grant[-1].msg.expired is True


def test_a_snapshot_carries_the_interval_and_what_is_left_of_it():
    """On the wire: the interval and the remaining milliseconds; a session that never expires
    and is not running out writes neither (the JSON of before)."""
    from mqttmesh.mesh.cluster.cluster_values import Snapshot

    plain = Snapshot("c", {}, 0, [], [], [], None, 1, 1)
    assert "expiry" not in plain.to_json() and "expires" not in plain.to_json()
    for expiry, left in ((30, 12_500), (30, None), (0xFFFFFFFF, 4_000)):
        snap = Snapshot("c", {}, 0, [], [], [], None, 1, 1, expiry=expiry, expires_ms=left)
        back = Snapshot.from_json(json.loads(json.dumps(snap.to_json(), default=list)), "sess.copy")
        assert (back.expiry, back.expires_ms) == (expiry, left)


def test_a_session_whose_clients_node_died_ends_its_interval_later_everywhere():
    """The client was connected at a when a died: no release ever comes, yet its copies end
    the interval after the mesh noticed (the holders start it when a leaves the mesh, the
    registrar when it finds a gone, both from the interval the claim carried), and a new
    connection then finds no session and is not refused for a copy it cannot reach."""
    net = Net(settings=ClusterSettings(will_delay=0.5))
    cid = cid_with(net, lambda regs, holders: regs[0] != "a" and len([h for h in holders if h != "a"]) >= 1)
    ch = net.connect("a", cid, clean=False, expiry=5)
    net.brokers["a"].table.subscribe(ch.session, "t/#", 1)
    net.pump()
    registrar = net.clusters["b"].members.registrars(cid)[0]
    net.up.discard("a")
    net.membership()
    survivors = [n for n in holder_of(net, cid) if n != "a"]
    assert survivors and all(net.brokers[n].sessions[cid].expires_at is not None for n in survivors)
    _wait(net, 4.0)
    assert [n for n in holder_of(net, cid) if n != "a"] == survivors
    _wait(net, 2.0)
    assert [n for n in holder_of(net, cid) if n != "a"] == []
    assert net.clusters[registrar].registry.entries[cid].clean
    back = _claim(net, "b", cid)
    assert back.state == "connected" and back.present is False


def test_a_release_that_comes_after_a_partition_counts_the_interval_from_the_end():
    """The client's node a is cut off and its client leaves (no DISCONNECT): the release
    cannot reach the registrar, whose side takes a's clients for gone a moment later and
    counts the interval from then. At the heal a sends the release again, saying how long ago
    the connection ended (reg.release "ago", mesh protocol 11): the registrar counts from the
    end itself, so a claim after the end plus the interval, though before the moment of the
    loss of sight plus the interval, finds the session expired [MQTT-4.1.0-2], and not a
    resumed copy of a holder that never heard of the end (fuzzer seed 119, finding 26 of
    docs/simulation.md)."""
    net = Net(settings=ClusterSettings(will_delay=0.5))
    cid = cid_with(net, lambda regs, holders: "a" not in regs)
    registrar = net.clusters["b"].members.registrars(cid)[0]
    ch = net.connect("a", cid, clean=False, expiry=3)
    assert ch.state == "connected"
    net.tick(0.25)
    net.up = {"a"}  # (a does not know it yet: its release goes nowhere)
    ch.close("connection lost")
    net.pump()
    ended = net.t
    net.up = {"b", "c"}
    for n in ("b", "c"):
        net.clusters[n].membership(["b", "c"], {"b": 1, "c": 1}, net.t)
    net.pump()
    _wait(net, 1.0)
    entry = net.clusters[registrar].registry.entries[cid]
    assert not entry.connected and entry.session_due is not None
    assert entry.session_due > ended + 3 + net.wall_offset + 0.4  # (from the loss of sight)
    net.up = {"a", "b", "c"}  # the heal: a's nodes re-register, and release again
    net.membership()
    entry = net.clusters[registrar].registry.entries[cid]
    assert entry.session_due == pytest.approx(ended + 3 + net.wall_offset, abs=0.002)
    _wait(net, ended + 3.25 - net.t)  # (past the end plus 3 s, before the other count)
    assert net.t < ended + 3 + 0.5
    back = _claim(net, "b", cid)
    assert back.state == "connected" and back.present is False


def _reg(conn: str, epoch: int, connected: bool, at: float, **kw):
    from mqttmesh.mesh.cluster.cluster_wire import Registration

    return Registration("c1", conn.split("/")[0], 1, conn, epoch, False, None, connected, at, expiry=10, **kw)


@pytest.mark.parametrize(
    ("have", "copy", "kept"),
    [
        # a live connection claimed later, against the copy of an ended (refused) claim of
        # the other side (fuzzer seed 141): the live one stays, its will and session with it
        (
            _reg("b/1/11", 3, True, 9.18),
            _reg("b/1/10", 3, False, 8.75, refused=True, session_due=18.2),
            ("b/1/11", True),
        ),
        (_reg("b/1/11", 3, True, 9.18), _reg("b/1/10", 3, False, 8.75, session_due=18.2), ("b/1/11", True)),
        # the copy of a later live claim takes the place of an ended earlier one
        (_reg("b/1/10", 3, False, 8.75, session_due=18.2), _reg("b/1/11", 3, True, 9.18), ("b/1/11", True)),
        # a claim never accepted (by a registrar that had restarted and knew nothing: it found
        # no end) does not take the place of an accepted connection's end (fuzzer seed 133)...
        (
            _reg("a/1/4", 1, False, 2.09, session_due=8.57),
            _reg("a/1/9", 1, False, 8.15, refused=True),
            ("a/1/4", False),
        ),
        # ...and gives way to it
        (
            _reg("a/1/9", 1, False, 8.15, refused=True),
            _reg("a/1/4", 1, False, 2.09, session_due=8.57),
            ("a/1/4", False),
        ),
        # one connection: its end takes the place of its start, never the other way
        (_reg("a/1/4", 1, True, 2.09), _reg("a/1/4", 1, False, 2.09, session_due=8.57), ("a/1/4", False)),
        (_reg("a/1/4", 1, False, 2.09, session_due=8.57), _reg("a/1/4", 1, True, 2.09), ("a/1/4", False)),
        # a larger epoch, whatever else
        (_reg("b/1/11", 3, True, 9.18), _reg("a/1/2", 4, False, 1.0, refused=True), ("a/1/2", False)),
    ],
)
def test_of_two_registrations_the_copy_keeps_the_current_one(have, copy, kept):
    """Two registrars of one ClientId across a split hand out one epoch twice: at the heal,
    the registration of the claim that was accepted over one never accepted, else of the
    later claim (finding 26 of docs/simulation.md: an ended connection's copy took the place
    of a live one claimed later, seed 141; a refused claim's, which knew no end, the place of
    the end of the session it did not resume, seed 133)."""
    from mqttmesh.mesh.cluster.cluster_wire import RegCopy

    net = Net()
    registry = net.clusters["a"].registry
    registry.entries["c1"] = have
    registry.on_copy("b", RegCopy([copy]), net.t)
    entry = registry.entries["c1"]
    assert (entry.conn, entry.connected) == kept


def test_the_copy_of_the_connection_a_claim_replaced_says_when_the_session_ended():
    """The registrar grants a claim that replaces a live connection (it kicks it) and counts
    the session's end from the claim. That connection's release went to another registrar
    (a view of the mesh that left this one out while a node stalled): its copy, ended, of a
    lower epoch, comes here instead. It says when the session really ended; before, the copy
    only dropped the kick's record, the release that came after found nothing to refine,
    and the claim's (then refused) registration resumed the session 2.88 s after it expired
    (fuzzer seed 498, finding 27 of docs/simulation.md). The release after a refusal refines
    it too."""
    from mqttmesh.mesh.cluster.cluster_wire import RegCopy

    for release_first in (False, True):
        net = Net(settings=ClusterSettings(will_delay=0.5))
        cid = cid_with(net, lambda regs, holders: regs[0] == "c")
        net.connect("a", cid, clean=False, expiry=5)
        registry = net.clusters["c"].registry
        old = registry.entries[cid]
        wall, t = net.wall_offset, net.t
        registry.on_claim("b", RegClaim(cid, "b", 1, "b/1/99", False, None, t + wall, 5), t + 6.0)
        assert registry.entries[cid].session_due == t + 6.0 + 5 + wall  # (from the claim)
        ended = dataclasses.replace(old, connected=False, session_due=t + 1.0 + 5 + wall)  # (it ended at t + 1)
        if release_first:
            registry.on_release("b", RegRelease(cid, "b/1/99", 2, "b", False, KEPT, refused=True), t + 6.1)
            registry.on_release("a", RegRelease(cid, old.conn, 1, "a", False, 5, ago=5_200), t + 6.2)
        else:
            registry.on_copy("d", RegCopy([ended]), t + 6.1)
            registry.on_release("b", RegRelease(cid, "b/1/99", 2, "b", False, KEPT, refused=True), t + 6.2)
        entry = registry.entries[cid]
        assert entry.conn == "b/1/99" and entry.session_due == pytest.approx(t + 1.0 + 5 + wall)
        grant = registry.on_claim("a", RegClaim(cid, "a", 1, "a/1/98", False, None, t + 6.5 + wall, 5), t + 6.5)
        assert grant[-1].msg.expired is True


def test_the_node_of_the_connection_a_claim_replaces_says_its_session_ended():
    """Clean Start 0 and Session Expiry 0 on a; the client leaves, and neither a's release
    (to the registrar) nor its discard (to a holder, c) arrives (routes flapping: fuzzer seed
    501, finding 28 of docs/simulation.md; re-sent releases were lost the same way). The
    registrar still holds a's connection as live, so the next claim, on b, replaces it as a
    takeover and gathers c's copy; a, the node of that connection, answers that its session
    ended with it (SessState.ended, peer protocol 11): the copy is discarded, not resumed
    [MQTT-3.1.2-23]."""
    net = Net(settings=ClusterSettings(will_delay=0.5))
    cid = cid_with(net, lambda regs, holders: "c" in holders and "a" not in regs and regs[0] != "c")
    ch = _connect_ending(net, "a", cid)
    net.brokers["a"].table.subscribe(ch.session, "t/#", 1)
    net.pump()
    _wait(net, 1.0)
    assert "c" in holder_of(net, cid)
    ch.close("connection lost")
    held = net.pump_holding(("reg.release", "sess.discard"), frm="a")
    assert held  # (lost on the way)
    registrar = net.clusters["b"].members.registrars(cid)[0]
    assert net.clusters[registrar].registry.entries[cid].connected  # (it never heard)
    assert "c" in holder_of(net, cid)
    net.t += 0.1
    back = _connect_ending(net, "b", cid)
    assert back.state == "connected" and back.present is False
    assert back.session.subscriptions == {}
    assert sum(net.clusters[n].counters["expired_copies_discarded"] for n in net.up) == 1


def test_a_claim_that_gathers_longer_than_the_interval_keeps_what_came_meanwhile():
    """A client moves from a to b (Session Expiry 1 s): its connection on a ends when b's
    claim is granted, and the copies learn that the session ends 1 s later. A holder, e, cut
    off but still counted live, never answers the gather, which waits for it until the
    membership drops it, 1.5 s on. A QoS 1 message published meanwhile reaches b's own copy
    (pooled from a, which is no holder) and the holders', which forward it to b. The claim,
    granted before the end, resumes the session with that message: before, the copies
    expired at the end of the interval, the message with them, and the claim resumed only
    what it had gathered (fuzzer seed 621, finding 29 of docs/simulation.md) [MQTT-3.1.2-23]."""
    net = Net(names=["a", "b", "c", "d", "e"], settings=ClusterSettings(will_delay=0.5))
    members = net.clusters["a"].members
    cid = next(
        c
        for c in (f"client-{i}" for i in range(10_000))
        if "e" in members.home(c)
        and not {"a", "b"} & set(members.home(c))
        and members.registrars(c)[0] not in ("a", "b", "e")
    )
    ch = net.connect("a", cid, clean=False, expiry=1)
    assert ch.state == "connected"
    net.brokers["a"].table.subscribe(ch.session, "t/#", 1)
    net.pump()
    _wait(net, 1.0)
    back = net.connect("b", cid, clean=False, expiry=1, pump=False)
    fetches = net.pump_holding("sess.fetch", frm="b")
    assert "e" in {dest for _, dest, _, _ in fetches}
    net.up.discard("e")  # e is cut off with its fetch (no membership change yet)
    net.queue.extend(item for item in fetches if item[1] != "e")
    net.pump()
    assert ch.state == "closed" and back.state == "claiming"
    net.tick(0.25)
    net.publish("c", "t/x", b"published while the claim gathers", 1)
    _wait(net, 1.5)  # past the session's interval, within the gather's time
    assert back.state == "claiming"
    net.membership()  # e is gone: the claim ends with the copies it has
    assert back.state == "connected" and back.present is True
    assert any(b"published while the claim gathers" in f for f in back.frames)


def test_a_take_over_is_not_told_that_the_session_ended_with_the_connection_it_ends():
    """Clean Start 0 and Session Expiry 0: the client is on a, then connects on b while a's
    connection is open (a take-over [MQTT-3.1.4-3]), then on c while b's is open. The kick
    ends a's connection before b's gather reaches a; a's answer must not say the session
    ended with it (that end is the take-over's own): it did (finding 28's answer), b's claim
    then discarded the session as expired and served a fresh one that its holders did not
    keep, and c's take-over of b's open connection found no session (fuzzer seed 939,
    finding 30 of docs/simulation.md)."""
    net = Net(settings=ClusterSettings(will_delay=0.5))
    cid = cid_with(net, lambda regs, holders: "a" not in regs)
    first = _connect_ending(net, "a", cid)
    net.brokers["a"].table.subscribe(first.session, "t/#", 1)
    net.pump()
    _wait(net, 1.0)
    second = _connect_ending(net, "b", cid)
    assert first.state == "closed" and second.state == "connected"
    assert sum(net.clusters[n].counters["expired_copies_discarded"] for n in net.up) == 0
    net.brokers["b"].table.subscribe(second.session, "u/#", 1)
    net.pump()
    _wait(net, 1.0)
    third = _connect_ending(net, "c", cid)
    assert second.state == "closed"
    assert third.state == "connected" and third.present is True
    assert "u/#" in third.session.subscriptions
