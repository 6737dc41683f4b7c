"""A QoS 2 packet id the client may still hold is released, never reused (issue 24).

The fault harness (7 nodes, MQTT 5, shared group, seed 9 after finding 36) saw a persistent
member take a QoS 2 PUBLISH under id 376 from the node it had just reconnected to (DUP=1, the
node's copy had the message in flight), answer PUBREC, and lose the connection. The claim it
made next gathered that copy and another one in which the message was settled: the member's
old home had given it to another member of the group while cut off. "Settled anywhere is
settled" dropped it, id 376 went to a new message, and the client, still awaiting PUBREL for
376, took a later QoS 2 message under it for a re-send of the first and never delivered it
[MQTT-4.3.3-1]. The merged copy now keeps such a message at PUBREL: the node the client is on
sends the PUBREL, the PUBCOMP frees the id, and the mesh still takes the message as settled.
"""

from __future__ import annotations

from mqttmesh.mesh.cluster.cluster_values import Snapshot, SnapshotEntry
from mqttmesh.mesh.cluster.replica_sessions import MeshSession
from mqttmesh.mesh.cluster.snapshots import install, merge_snapshots
from mqttmesh.session import SENT_PUBLISH, SENT_PUBREL, Limits
from support import mqttraw
from support.frames import FakeChannel

KEY = ("n2", 7)


class _Channel(FakeChannel):
    def write_gated(self, frame: bytes, ticket: int) -> None:
        self.frames.append(bytes(frame))  # (the holders confirmed every step at once)


def _entry(seq: int, pid: int, state: int, qos: int = 2) -> SnapshotEntry:
    return SnapshotEntry("n2", seq, "t", "eA==", qos, qos, pid, state, "pub", 1.0)


def _copy(entries, done, epoch: int, version: int, node: str) -> Snapshot:
    return Snapshot("c", {}, 0, entries, done, [], node, epoch, version)


def test_a_message_settled_by_an_older_claim_and_in_flight_under_a_newer_one_is_kept_at_pubrel():
    old_home = _copy([], [KEY], epoch=3, version=90, node="n1")  # (gave it to another member)
    newer = _copy([_entry(7, 376, SENT_PUBLISH)], [], epoch=4, version=12, node="n4")
    for snaps in ([old_home, newer], [newer, old_home]):
        merged = merge_snapshots(snaps)
        assert merged is not None
        assert [(e.seq, e.pid, e.state) for e in merged.entries] == [(7, 376, SENT_PUBREL)]
        assert KEY not in merged.done  # (the entry itself keeps it from coming again)


def test_a_message_completed_under_the_newest_claim_is_not_released_from_a_stale_copy():
    """The usual case: the client completed it on the node it is on; a holder that missed the
    settlement still has it in flight under an older or the same claim. No PUBREL comes of it
    (issue 20's stale copies would bring thousands)."""
    client_node = _copy([], [KEY], epoch=4, version=40, node="n4")
    for stale_epoch in (3, 4):
        stale = _copy([_entry(7, 376, SENT_PUBREL), _entry(8, 377, SENT_PUBLISH)], [], stale_epoch, 30, "n2")
        merged = merge_snapshots([client_node, stale])
        assert merged is not None
        assert KEY in merged.done and all(e.seq != 7 for e in merged.entries)


def test_an_id_given_to_another_message_since_is_not_released():
    """The id went to a new message in the view that settled the old one: the client's flow on
    that id ended (the server reuses an id only after PUBCOMP), nothing to release."""
    newest = _copy([_entry(9, 376, SENT_PUBLISH)], [KEY], epoch=5, version=3, node="n6")
    older = _copy([_entry(7, 376, SENT_PUBLISH)], [], epoch=4, version=12, node="n4")
    third = _copy([], [KEY], epoch=3, version=90, node="n1")
    merged = merge_snapshots([newest, older, third])
    assert merged is not None
    assert [(e.seq, e.pid, e.state) for e in merged.entries] == [(9, 376, SENT_PUBLISH)]
    assert KEY in merged.done


def test_qos1_and_queued_messages_settled_elsewhere_stay_settled():
    """A QoS 1 id is free at PUBACK on both sides, and a queued message has no id: nothing for
    the client to hold."""
    old_home = _copy([], [KEY, ("n2", 8)], epoch=3, version=90, node="n1")
    newer = _copy([_entry(7, 376, SENT_PUBLISH, qos=1), _entry(8, 0, 0)], [], epoch=4, version=12, node="n4")
    merged = merge_snapshots([old_home, newer])
    assert merged is not None
    assert merged.entries == [] and {KEY, ("n2", 8)} <= set(merged.done)


def test_the_node_the_client_comes_to_sends_the_pubrel_and_the_pubcomp_settles_it():
    reports: list[tuple] = []
    s = MeshSession("c", Limits(), on_settled=lambda sess, key, state, pid, m=None: reports.append((key, state, pid)))
    s.settle(KEY, "done", 0)  # (this copy heard that the old home gave it away)
    merged = merge_snapshots(
        [_copy([], [KEY], 3, 90, "n1"), _copy([_entry(7, 376, SENT_PUBLISH), _entry(8, 0, 0)], [], 4, 12, "n4")]
    )
    assert merged is not None
    install(s, merged, 0.0)
    assert s.inflight[376].state == SENT_PUBREL and [e.msg.seq for e in s.queue] == [8]
    ch = _Channel()
    s.attach(ch, 1.0)
    sent = ch.take()
    assert [(p.type, p.packet_id) for p in sent][0] == (mqttraw.PUBREL, 376)
    publish = [p for p in sent if p.type == mqttraw.PUBLISH]
    assert [p.payload for p in publish] == [b"x"] and publish[0].packet_id != 376  # (id 376 not reused)
    assert s.on_pubcomp(376, 2.0)
    assert 376 not in s.inflight and KEY in s.done and (KEY, "done", 0) in reports
    s.deliver(_message(7), 2)  # (a late copy of it: settled, not queued again)
    assert all(e.msg.seq != 7 for e in s.queue)


def test_a_copy_that_remembers_the_message_settled_installs_its_release_only_if_the_id_is_free():
    s = MeshSession("c", Limits())
    s.settle(KEY, "done", 0)
    snap = _copy([_entry(9, 376, SENT_PUBLISH), _entry(7, 376, SENT_PUBREL)], [], 5, 3, "n6")
    install(s, snap, 0.0)
    assert [(e.msg.seq, e.state) for e in s.inflight.values()] == [(9, SENT_PUBLISH)]
    assert not s.queue  # (neither delivered again as new)


def _message(seq: int):
    from mqttmesh.message import Message

    return Message("t", b"x", 2, False, "n2", seq, "pub", 1.0)


def test_an_id_in_flight_stays_released_when_the_copy_that_settled_it_took_the_newer_epoch():
    """Simulator, finding-42's scenario with seed 19 under settle-batch (a trial of issue 26,
    which gave this timeline; the merge rule is main's): the old home n6 held a
    QoS 2 PUBLISH for the gate (its holders had the "sent" of id 123, their answers were lost),
    its client left, detach queued the message again and n6 gave it to its shared group
    ("done", epoch 3). The claim at n5 (epoch 4) re-sent it under 123 (DUP). n6's pooled copy
    met n5's: the merge released the id (PUBREL), but n6 took the epoch 4 with it, and a copy
    of n1's from before replaced n6's, dropping the release: n6 now said "done" at epoch 4.
    The next claim at n5 merged that with the epoch-4 copies that had 123 awaiting PUBREL and
    took the message for completed: the id the client held was free for the next message,
    which the client would take for a re-send and drop (the fault harness's pid reuse)."""
    from mqttmesh.mesh.cluster.cluster_values import Snapshot, SnapshotEntry
    from mqttmesh.mesh.cluster.snapshots import merge_snapshots

    key = ("n0", 268435551)
    at_pubrel = SnapshotEntry(*key, "sh/p001/3", "eA==", 2, 2, 123, 2, "p001", 1.0)
    queued = SnapshotEntry("n6", 268435592, "sh/p001/3", "eA==", 2, 2, 0, 0, "p001", 1.0)
    own = Snapshot("g0m2", {}, 0, [at_pubrel, queued], [], [], "n5", 4, 347)
    old_home = Snapshot("g0m2", {}, 0, [queued], [key], [], "n5", 4, 347)
    holder = Snapshot("g0m2", {}, 0, [at_pubrel, queued], [], [], "n5", 4, 347)
    merged = merge_snapshots([own, old_home, holder])
    assert merged is not None
    assert [(e.seq, e.pid, e.state) for e in merged.entries if (e.origin, e.seq) == key] == [(key[1], 123, 2)]
    # settled by an older epoch's copy only, it is released as before; by a newer one's, not
    older = Snapshot("g0m2", {}, 0, [queued], [key], [], "n6", 3, 422)
    merged = merge_snapshots([own, older])
    assert merged is not None and [(e.pid, e.state) for e in merged.entries if (e.origin, e.seq) == key] == [(123, 2)]
    newer = Snapshot("g0m2", {}, 0, [], [key], [], "n0", 5, 10)
    merged = merge_snapshots([own, newer])
    assert merged is not None and not [e for e in merged.entries if (e.origin, e.seq) == key]
