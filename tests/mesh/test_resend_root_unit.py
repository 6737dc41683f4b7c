"""A shared group's re-send names the message it re-sends, its root, wherever it goes.

A member that left holding a message hands it on; with no other member on its node the node
sends it again as a new message of its own, for the group alone, naming the root
(custody.py ``_group_copy``), so that a member that had the root, or another re-send of it,
does not take it again (shared.py ``had``). The simulator (finding 42's scenario with
settle-batch) found two places where the name was lost and one session got a QoS 2 message
twice: a re-send that custody re-routed again named the first re-send, not the root (seed
62), and copies of a session sent between nodes (``Snapshot`` entries, ``sess.fwd``) named
nothing, so a merge kept the root, in flight under a newer claim, and a re-send of it that
came back to the old home that had given it away (seed 19).
"""

from __future__ import annotations

import json

import pytest

from mqttmesh.mesh.cluster.cluster_values import ClusterWireError, Forwarded, Snapshot, SnapshotEntry
from mqttmesh.mesh.cluster.replica import given_id
from mqttmesh.mesh.cluster.replica_sessions import MeshSession
from mqttmesh.mesh.cluster.snapshots import install, merge_snapshots, snapshot
from mqttmesh.mesh.routing.engine import MeshSettings
from mqttmesh.message import Message
from mqttmesh.session import SENT_PUBLISH, SENT_PUBREL, Limits
from mqttmesh.shared import resend_mark, root_of
from support.engine_net import Net

ROOT = ("n0", 551)  # the message a publisher sent (its id, origin and sequence)
RESEND = ("n6", 592)  # the group's re-send of it, a new message of n6


def _entry(key, pid: int, state: int, root=None) -> SnapshotEntry:
    return SnapshotEntry(key[0], key[1], "sh/p/1", "eA==", 2, 2, pid, state, "p001", 1.0, None, None, root)


def _copy(entries, done, epoch: int, version: int) -> Snapshot:
    return Snapshot("g0m2", {"$share/g0/sh/#": 2}, 1, entries, done, [], None, epoch, version)


# -- custody: a re-send re-routed again names the same root ----------------------------------


def test_a_resend_that_custody_routes_again_names_its_root_not_itself():
    """a sends its re-send of ROOT (a new message 5 of a's) to b's member; b dies before it
    arrives. After ``shared_reroute`` out of reach a's custody sends it once more, to a's own
    member: that copy names ROOT, as the re-send did. Routing had left the message in custody
    naming only this node's groups (none), and the next copy named the re-send, 5: a member
    that had ROOT took it again (seed 62: n1's own re-send of a re-send, under a second id)."""
    settings = MeshSettings(shared_strategy="round_robin", retransmit_after=1.0, shared_reroute=2.0)
    net = Net(["a", "b"], [("a", "b")], settings=settings)
    for n in ("a", "b"):
        net.subscribe(n, "$share/g/t/#")
    a = net.engines["a"]
    own = iter(range(900, 1000))
    a.new_seq = lambda: next(own)
    resend = Message("t/x", b"x", 2, False, "a", 5, "p", net.t)
    resend.shares = (resend_mark(ROOT),)
    assert a.route_to_group(resend, "$share/g/t/#", net.t)  # (to b: another node's member)
    assert a.custody[5].shares == {"b": ("$share/n0 551", "$share/g/t/#")}
    net.cut("a", "b")
    net.settle()
    for step in range(1, 7):
        net.t = step * 0.5
        net._pump("a", a.tick(net.t))
        net.settle()
    here = a.served_here()
    assert [(m.origin, m.seq, m.shares) for m in here] == [("a", 900, ("$share/n0 551", "$share/g/t/#"))]
    assert root_of(here[0]) == ROOT


# -- the cluster's wire: Snapshot entries and forwarded messages carry the root ----------------


def test_a_snapshot_entry_carries_its_root():
    """Arrays built by hand, not by the encoder: 13 elements, the root last (null for a
    message that is no re-send); peer protocol 12's 12 (no root: its nodes are refused at
    the handshake) and a root of another shape are refused."""
    with_root = ["n6", 592, "sh/p/1", "eA==", 2, 2, 0, 0, "p001", 1.0, None, None, ["n0", 551]]
    assert SnapshotEntry.from_json(with_root, "e") == _entry(RESEND, 0, 0, ROOT)
    assert json.loads(json.dumps(_entry(RESEND, 0, 0, ROOT))) == with_root
    plain = [*with_root[:12], None]
    assert SnapshotEntry.from_json(plain, "e") == _entry(RESEND, 0, 0)
    assert json.loads(json.dumps(_entry(RESEND, 0, 0))) == plain
    older = with_root[:12]
    for bad in (older, [*with_root, 1], [*older, ["n0"]], [*older, ["n0", "551"]], [*older, "n0 551"]):
        with pytest.raises(ClusterWireError):
            SnapshotEntry.from_json(bad, "e")


def test_a_forwarded_message_carries_its_root():
    msg = Message("sh/p/1", b"x", 2, False, *RESEND, "p001", 1.0)
    msg.shares = (resend_mark(ROOT), "$share/g0/sh/#")
    fwd = Forwarded.of(msg)
    wire = json.loads(json.dumps(fwd))
    assert wire == ["sh/p/1", "eA==", 2, False, "n6", 592, "p001", 1.0, None, None, ["n0", 551]]
    got = Forwarded.from_json(wire, "f").message(5.0)
    assert root_of(got) == ROOT and got.shares == ("$share/n0 551",)  # (the group's own name: not needed)
    plain = Message("sh/p/1", b"x", 2, False, *ROOT, "p001", 1.0)
    plain.shares = ("$share/g0/sh/#",)
    assert json.loads(json.dumps(Forwarded.of(plain)))[10] is None  # (no re-send: its own root)
    got = Forwarded.from_json([*wire[:10], None], "f").message(5.0)
    assert root_of(got) == RESEND and getattr(got, "shares", None) is None  # (as before)
    with pytest.raises(ClusterWireError):
        Forwarded.from_json(wire[:10], "f")  # (peer protocol 12's)


def test_a_copy_installed_from_a_snapshot_still_had_the_root_of_its_resend():
    """Seed 19's old home: its copy gave the root away (settled, with the mark ``given_id``)
    and took a re-send of it back. A holder that installs a snapshot of it knows the session
    has the root, so a third copy of it is not the session's to take (shared.py ``had``); the
    holder took the re-send for a message of its own before."""
    home = MeshSession("g0m2", Limits())
    home._settled_id(ROOT)
    home._settled_id(given_id(ROOT))
    msg = Message("sh/p/1", b"x", 2, False, *RESEND, "p001", 1.0)
    msg.shares = (resend_mark(ROOT), "$share/g0/sh/#")
    home.deliver(msg, 2)
    assert home.had(ROOT)
    snap = snapshot(home, 1.0)
    assert [e.root for e in snap.entries] == [ROOT]
    holder = MeshSession("g0m2", Limits())
    install(holder, Snapshot.from_json(json.loads(json.dumps(snap.to_json())), "copy"), 2.0)
    assert holder.had(ROOT)
    assert [root_of(e.msg) for e in holder.queue] == [ROOT]


# -- merges: one message of each root -------------------------------------------------------


def test_a_resend_queued_at_the_old_home_takes_the_id_its_root_is_released_under():
    """Seed 19. g0m2's home n6 sent ROOT (id 123), its gate waiting for holders cut off; the
    client left and n6 gave ROOT away (settled, ``given_away``), its group re-sent it (RESEND),
    which came back to g0m2 at n6, queued. Meanwhile a claim across the cut merged the holders'
    copies, which had ROOT "sent" under 123, and sent it to the client (DUP). At the heal the
    merge keeps ROOT at PUBREL (the client may hold 123: ``_released``) and, before, RESEND
    queued as another message: the client had it twice. Now RESEND takes 123, in flight: a DUP
    PUBLISH a client that holds 123 takes for a re-send, and one that does not for the
    message, once; ROOT stays settled."""
    old_home = _copy([_entry(RESEND, 0, 0, ROOT)], [ROOT, ("gave/n0", 551)], epoch=3, version=404)
    claim = _copy([_entry(ROOT, 123, SENT_PUBLISH)], [], epoch=4, version=347)
    for snaps in ([old_home, claim], [claim, old_home]):
        merged = merge_snapshots(snaps)
        assert merged is not None
        assert [(e.origin, e.seq, e.pid, e.state) for e in merged.entries] == [(*RESEND, 123, SENT_PUBLISH)]
        assert ROOT in merged.done and RESEND not in merged.done


def test_a_resend_is_settled_where_its_root_is_in_flight_or_was_pubreced():
    """The client has the root (or gets it again, DUP) under its id: the queued re-send is
    settled, and stays settled for a copy that still has it."""
    for state, done in ((SENT_PUBLISH, []), (SENT_PUBREL, [ROOT])):
        # (SENT_PUBREL with ROOT settled elsewhere: a release of an id the client PUBREC'd)
        old_home = _copy([_entry(RESEND, 0, 0, ROOT)], done, epoch=3, version=404)
        claim = _copy([_entry(ROOT, 123, state)], [], epoch=4, version=347)
        merged = merge_snapshots([old_home, claim])
        assert merged is not None
        assert [(e.origin, e.seq, e.pid, e.state) for e in merged.entries] == [(*ROOT, 123, state)]
        assert RESEND in merged.done


def test_of_a_root_and_its_resends_all_queued_one_stays_and_each_sent_one_stays():
    """Queued only: the first one stays (the others settled). Each one the client may have
    had under its own id stays: nothing can undo that."""
    second = ("n1", 672)
    a = _copy([_entry(RESEND, 0, 0, ROOT), _entry(("n2", 9), 0, 0)], [], epoch=3, version=10)
    b = _copy([_entry(second, 0, 0, ROOT), _entry(ROOT, 0, 0)], [], epoch=3, version=9)
    merged = merge_snapshots([a, b])
    assert merged is not None
    assert [(e.origin, e.seq) for e in merged.entries] == [RESEND, ("n2", 9)]
    assert {second, ROOT} <= set(merged.done)
    sent = _copy([_entry(RESEND, 16, SENT_PUBLISH, ROOT), _entry(second, 22, SENT_PUBLISH, ROOT)], [], 4, 3)
    merged = merge_snapshots([sent, b])
    assert merged is not None
    assert sorted((e.seq, e.pid) for e in merged.entries) == [(592, 16), (672, 22)]


def test_a_copy_without_roots_merges_as_before():
    """Entries of a node of protocol 12 (no root) are each their own root."""
    a = _copy([_entry(RESEND, 0, 0), _entry(ROOT, 123, SENT_PUBLISH)], [], epoch=3, version=10)
    merged = merge_snapshots([a])
    assert merged is not None
    assert sorted((e.seq, e.state) for e in merged.entries) == [(551, SENT_PUBLISH), (592, 0)]
    assert merged.entries[1].state == 0 and SENT_PUBREL not in {e.state for e in merged.entries}
