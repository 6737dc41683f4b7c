"""The MQTT 5 Will Delay Interval across the mesh (mesh/cluster/registry.py), on the cluster
cores of five nodes wired by tests/support/cluster_net.py (on one node:
tests/unit/test_will_delay_unit.py).

A will whose session outlives its connection waits for its delay; the ClientId's registrar
keeps it (with its backup), publishes it once when the delay passed, and drops it when a new
connection for the ClientId is made on any node first [MQTT-3.1.3-9] [MQTT-3.1.2-8]. A will
whose session ends with the connection goes at once. Rule ids are MQTT 5.0's.
"""

from __future__ import annotations

import pytest

from mqttmesh import properties as P
from mqttmesh.mesh.cluster.cluster import ClusterSettings
from mqttmesh.packets import Will
from support.cluster_net import FakeChannel, Net, cid_with


def _cid(net: Net, at: str) -> str:
    """A ClientId whose registrar is neither ``at`` nor the node the tests reconnect to."""
    return cid_with(net, lambda regs, holders: at not in regs[:1])


def _wills(net: Net, topic: str) -> list[str]:
    return [n for n in sorted(net.up) for m in net.published[n] if m.topic == topic]


def _will(delay: int, expiry: int | None = None) -> Will:
    props = {P.WILL_DELAY: delay}
    if expiry is not None:
        props[P.MESSAGE_EXPIRY] = expiry
    return Will("w/d", b"gone", 1, False, props)


def test_a_delayed_will_is_published_once_by_the_registrar_when_its_delay_passed():
    """[MQTT-3.1.2-8]: after the connection closed and the delay passed, by the registrar,
    not by the node the client was on; its Message Expiry counts from then."""
    net = Net(settings=ClusterSettings(will_delay=0.5))
    cid = _cid(net, "a")
    registrar = net.clusters["b"].members.registrars(cid)[0]
    ch = net.connect("a", cid, clean=False, will=_will(3, expiry=60))
    net.tick(0.1)
    ch.close("connection lost", delayed=True)
    net.pump()
    net.tick(2.9)
    assert _wills(net, "w/d") == []
    net.tick(0.2)
    assert _wills(net, "w/d") == [registrar]
    [msg] = [m for m in net.published[registrar] if m.topic == "w/d"]
    assert msg.expires == net.t + 60.0  # (counted from its publication)
    net.tick(10.0)
    assert _wills(net, "w/d") == [registrar]  # once
    assert net.clusters[registrar].registry.entries[cid].will is None


def test_a_new_connection_on_another_node_within_the_delay_cancels_the_will():
    """[MQTT-3.1.3-9]: the client comes back at c before the delay passed: never published."""
    net = Net(settings=ClusterSettings(will_delay=0.5))
    cid = _cid(net, "a")
    ch = net.connect("a", cid, clean=False, will=_will(3))
    net.tick(0.1)
    ch.close("connection lost", delayed=True)
    net.pump()
    net.tick(1.0)
    back = net.connect("c", cid, clean=False)
    assert back.state == "connected"
    net.tick(10.0)
    assert _wills(net, "w/d") == []


def test_the_will_of_a_client_whose_node_died_waits_for_its_delay():
    """The connection ended with its node: the will is due its delay after the registrar
    found the node gone, not at once [MQTT-3.1.2-8]."""
    net = Net(settings=ClusterSettings(will_delay=0.5))
    cid = _cid(net, "a")
    registrar = net.clusters["b"].members.registrars(cid)[0]
    net.connect("a", cid, clean=False, will=_will(4))
    net.up.discard("a")
    net.membership()
    net.tick(0.6)  # (will_delay: the registrar takes a's clients for gone)
    net.tick(2.0)
    assert _wills(net, "w/d") == []
    net.tick(3.0)
    assert _wills(net, "w/d") == [registrar]


def test_a_reconnect_elsewhere_after_its_node_died_cancels_the_delayed_will():
    """[MQTT-3.1.3-9]: the client's node died; it connects again on another node within the
    delay: the will is never published."""
    net = Net(settings=ClusterSettings(will_delay=0.5))
    cid = _cid(net, "a")
    net.connect("a", cid, clean=False, will=_will(4))
    net.up.discard("a")
    net.membership()
    net.tick(0.6)
    back = net.connect("c", cid, clean=False)
    for _ in range(10):  # (the claim waits for a, a holder, until it is found gone)
        if back.state == "connected":
            break
        net.tick(0.2)
    assert back.state == "connected" and _wills(net, "w/d") == []
    net.tick(10.0)
    assert _wills(net, "w/d") == []


def test_a_will_whose_session_ends_with_the_connection_goes_at_once():
    """A clean session (Session Expiry 0) ends when the connection does, and with it the
    delay [MQTT-3.1.2-8]: the registrar keeps no delay for it."""
    net = Net(settings=ClusterSettings(will_delay=0.5))
    cid = _cid(net, "a")
    net.connect("a", cid, clean=True, will=_will(30))
    registrar = net.clusters["b"].members.registrars(cid)[0]
    assert net.clusters[registrar].registry.entries[cid].will.delay == 0


def test_a_connection_the_node_closes_itself_counts_its_delay_and_expiry_from_then():
    """A node that loses sight of the majority closes its persistent clients (claimant.py
    ``fence``): the connection ends then, not at its last read, so the delayed will is due its
    Will Delay Interval after the close and the session's expiry counts from it too; a will
    counted from the last read came early, by as long as the client had been quiet (finding
    21 of docs/simulation.md, seed 37: a kick or a fence carried no time; fixed with finding
    24's, which gave a kick the node's time)."""
    from support import mqttraw5 as raw5

    net = Net(settings=ClusterSettings(will_delay=0.5))
    cid = _cid(net, "a")
    ch = net.client("a")  # a real Channel, an MQTT 5 client quiet after its CONNECT
    expiry, delay = raw5.props((0x11, raw5.u32(60))), raw5.props((0x18, raw5.u32(3)))
    ch.receive_data(raw5.connect(cid, clean=False, properties=expiry, will=("w/d", b"gone", 1, False, delay)), net.t)
    net.pump()
    assert ch.state == "connected"
    read = net.t
    for _ in range(8):  # (2 s in the steps of a node's timer: a long jump reads as a pause)
        net.tick(0.25)
    # a is cut off from the others: it fences its persistent clients, and is now the
    # ClientId's registrar on its side (the release goes to itself, with the time it carries)
    net.t += 0.25
    net.clusters["a"].membership(["a"], {"a": 1}, net.t)
    net.pump()
    closed = net.t
    assert ch.state == "closed" and closed - read >= 2.0
    assert ch.session.expires_at == closed + 60
    entry = net.clusters["a"].registry.entries[cid]
    assert entry.will_due == closed + 3 + net.wall_offset
    assert entry.session_due == closed + 60 + net.wall_offset


def test_a_will_dropped_by_disconnect_stays_dropped_when_a_side_that_took_its_node_for_gone_heals():
    """A partition cuts the client's node x and the registrar r from the backup k (and the
    others). The client leaves x with a DISCONNECT: r hears x's release and drops the will
    [MQTT-3.1.2-10]; k, registrar on its side, took x for gone and keeps the will for its
    delay. At the heal k's copy (the same connection, ended, with the will) reached r, which
    took it (an equal epoch, both ended: the copy won) and published the will, x in its sight,
    though the connection had ended by DISCONNECT (fuzzer seed 59, `cluster.will_delay`):
    a copy does not bring back a will the other knew gone."""
    names = ["a", "b", "c", "d", "e"]
    net = Net(names=names, settings=ClusterSettings(will_delay=0.5))
    cid = cid_with(net, lambda regs, holders: not {"a"} & set(regs[:2]))
    members = net.clusters["a"].members
    r, k = members.registrars(cid)
    x = "a"
    ch = net.connect(x, cid, clean=False, will=_will(3))
    assert ch.state == "connected"
    net.tick(0.1)
    assert net.clusters[k].registry.entries[cid].will is not None
    # the cut: {x, r} | the rest; x and r do not know of it yet
    side = sorted(set(names) - {x, r})
    net.up = {x, r}
    ch.close("client sent DISCONNECT")  # (no will: a DISCONNECT deletes it)
    net.pump()
    assert net.clusters[r].registry.entries[cid].will is None
    net.up = set(side)
    for n in side:
        net.clusters[n].membership(side, {m: net.incs[m] for m in side}, net.t)
    net.pump()
    net.tick(0.6)  # (will_delay: k, registrar on its side, takes x's clients for gone)
    held = net.clusters[k].registry.entries[cid]
    assert not held.connected and held.will is not None and held.will_due is not None
    net.up = set(names)  # the heal, before the will is due on k's side
    net.membership()
    net.tick(1.0)
    net.tick(5.0)
    assert _wills(net, "w/d") == []
    assert all(net.clusters[n].registry.entries[cid].will is None for n in (r, k))


def test_a_delayed_will_is_published_on_the_side_of_a_partition_its_registrar_is_not_on():
    """A partition cuts the client's node x and two others from the ClientId's registrar and
    backup. The client leaves x without a DISCONNECT: the registrar on x's side (as they see
    the mesh now) never had a copy of the registration, so the release carries
    the will (mesh protocol 11) and it keeps and publishes it when its delay passed
    [MQTT-3.1.2-8] (finding 8's rule: once per side). Before, the release found no entry and
    the will never came, though the client stayed away (fuzzer seed 133, finding 26 of
    docs/simulation.md). The other side takes x for gone and keeps the will for its delay
    from then; the heal comes before that: the will is not published a second time."""
    names = ["a", "b", "c", "d", "e"]
    net = Net(names=names, settings=ClusterSettings(will_delay=0.5))
    cid = cid_with(net, lambda regs, holders: set(regs[:2]) == {"d", "e"})
    ch = net.connect("a", cid, clean=False, will=_will(2), expiry=30)
    assert ch.state == "connected"
    net.tick(0.1)
    side, other = ["a", "b", "c"], ["d", "e"]
    net.up = set(side)  # (x's side does not know it yet: the release goes nowhere)
    ch.close("connection lost", delayed=True)
    net.pump()
    for n in side:
        net.clusters[n].membership(side, {m: net.incs[m] for m in side}, net.t)
    net.pump()
    ended = net.t
    net.tick(1.9)
    assert _wills(net, "w/d") == []  # (never early)
    net.tick(0.2)
    assert len(_wills(net, "w/d")) == 1 and _wills(net, "w/d")[0] in side
    net.up = set(other)
    for n in other:
        net.clusters[n].membership(other, {m: net.incs[m] for m in other}, net.t)
    net.pump()
    net.tick(0.6)  # (will_delay: the registrar's side takes x's clients for gone)
    r = net.clusters["d"].members.registrars(cid)[0]
    held = net.clusters[r].registry.entries[cid]
    assert not held.connected and held.will is not None and held.will_due > ended + 2 + net.wall_offset
    net.up = set(names)
    net.membership()
    net.tick(1.0)
    net.tick(5.0)
    assert len(_wills(net, "w/d")) == 1


def test_a_release_after_a_partition_settles_the_will_its_registrar_kept_for_a_node_it_took_for_gone():
    """The registrar took the client's node for gone and keeps the delayed will, due its delay
    from then. The node's release, re-sent after the heal, says how the connection ended and
    how long ago (mesh protocol 11): by DISCONNECT, the will goes [MQTT-3.1.2-10] (it was
    published by the registrar though the client had said DISCONNECT, fuzzer seed 119,
    finding 26 of docs/simulation.md); without, it is due its delay after the end itself,
    never before it [MQTT-3.1.2-8]."""
    from mqttmesh.mesh.cluster.cluster_wire import RegRelease

    for delayed in (False, True):
        net = Net(settings=ClusterSettings(will_delay=0.5))
        cid = cid_with(net, lambda regs, holders: "a" not in regs)
        registrar = net.clusters["b"].members.registrars(cid)[0]
        ch = net.connect("a", cid, clean=False, will=_will(10), expiry=60)
        registry = net.clusters[registrar].registry
        conn, epoch = registry.entries[cid].conn, registry.entries[cid].epoch
        net.up = {"b", "c"}  # a and its client gone, as the registrar sees it
        net.clusters[registrar].membership(["b", "c"], {"b": 1, "c": 1}, net.t)
        net.tick(1.0)
        held = registry.entries[cid]
        assert not held.connected and held.will is not None
        wall = net.t + net.wall_offset
        release = RegRelease(cid, conn, epoch, "a", delayed, 60, ago=3_000)  # (ended 3 s ago)
        registry.on_release("a", release, net.t)
        entry = registry.entries[cid]
        assert entry.session_due == pytest.approx(wall - 3 + 60)
        if delayed:
            assert entry.will is not None and entry.will_due == pytest.approx(wall - 3 + 10)
        else:
            assert entry.will is None and entry.will_due is None
            net.tick(12.0)
            assert _wills(net, "w/d") == []
        assert ch.state == "connected"  # (a, cut off, never heard)


class _DelayedWillChannel(FakeChannel):
    """A connection whose will waits for its delay: kicked, it ends so (as Channel._end)."""

    def kick(self, reason: str, now: float) -> None:
        self.close(reason, delayed=True)


def test_a_connection_a_newer_claim_replaced_is_kicked_again_and_its_will_not_brought_back():
    """The client is on x with a will delayed 3 s; it connects on c with Clean Start 1 (a
    takeover): the registrar grants c's claim the next epoch and kicks x's connection
    [MQTT-3.1.4-3], but the kick is lost on the way (a route a partition had cut). c's
    connection ends. Then x registers its connection again (after a membership change, or
    every 5 s): the registrar took that older connection back, the newer one having ended,
    with the newer epoch and its will, and when x closed it the will was published 3 s later,
    though a new connection of the ClientId came before that connection even ended
    [MQTT-3.1.3-9] (fuzzer seed 655, finding 37 of docs/simulation.md). A registration of a
    connection a later claim replaced is kicked again, and its will goes with it."""
    net = Net(names=["x", "b", "c", "d", "e"], settings=ClusterSettings(will_delay=0.5))
    cid = cid_with(net, lambda regs, holders: not {"x", "c"} & set(regs[:2]))
    registrar = net.clusters["b"].members.registrars(cid)[0]
    old = _DelayedWillChannel(net, "x", cid, expiry=600)
    net.clusters["x"].connect(old, cid, False, _will(3), net.t, expiry=600)
    net.pump()
    assert old.state == "connected"
    net.tick(0.1)
    new = FakeChannel(net, "c", cid, expiry=600)  # (Clean Start 1, as in the seed: no gather)
    net.clusters["c"].connect(new, cid, False, None, net.t, fresh=True, expiry=600)
    net.pump_losing(lambda frm, dest, kind: dest == "x" and kind == "reg.kick")
    assert new.state == "connected" and old.state == "connected"  # (the kick never came)
    entry = net.clusters[registrar].registry.entries[cid]
    assert (entry.node, entry.epoch) == ("c", 2)
    new.close("connection lost")
    net.pump()
    for _ in range(22):  # x registers its connection again (register_interval, 5 s; in the
        net.tick(0.25)  # steps of a node's timer: a long jump reads as a pause, and fences)
    entry = net.clusters[registrar].registry.entries[cid]
    assert (entry.node, entry.epoch, entry.connected) == ("c", 2, False)  # (before: x's, at epoch 2)
    assert old.state == "closed" and "connected on node c" in old.reason
    assert net.clusters[registrar].counters["kicked_again"] == 1
    for _ in range(20):  # (its release said the will waits 3 s: gone with the newer connection)
        net.tick(0.25)
    assert _wills(net, "w/d") == []
