"""The fault harness's pure parts on hand-made inputs (no processes, milliseconds): the
checker (bench/chaos/checker.py) finds each anomaly in a history written to have exactly
that one, the nemesis schedule is a function of its seed, and the MqttClient options the
harness uses (pid_range, report_repeats) do what they say."""

from __future__ import annotations

import random

import pytest

from bench.chaos.checker import EXPIRY_SLACK, check, expiry_of
from bench.chaos.nemesis import KINDS, schedule, windows_of
from bench.chaos.report import SHARED_COLUMNS, row, table_header
from bench.chaos.sharecheck import check_shared
from bench.chaos.workload import record_unacked
from mqttmesh import codec
from mqttmesh.codec5 import encode5
from mqttmesh.sim.history import History
from mqttmesh.sim.mqttclient import MqttClient

PERSISTENT = {"pub", "sub", "sub2"}
TOPIC = "chaos/pub/q2"


def _base(subs: tuple[str, ...] = ("sub",)) -> History:
    """Subscribers connected and subscribed at t=0..1; nothing published yet."""
    h = History()
    for s in subs:
        h.connect(0.0, s, "invoke", f"{s}/1", "n0")
        h.connect(0.1, s, "ok", f"{s}/1", "n0", False)
        h.subscribed(0.2, s, [("chaos/#", 2)])
    h.connect(1.0, "pub", "invoke", "pub/1", "n1")
    h.connect(1.1, "pub", "ok", "pub/1", "n1", False)
    return h


def _publish(h: History, t: float, n: int, qos: int = 2, topic: str = TOPIC) -> str:
    msg = f"pub:{n}"
    h.publish(t, "pub", "invoke", msg, topic, qos)
    h.publish(t + 0.01, "pub", "ok", msg, topic, qos)
    return msg


def test_a_clean_history_passes() -> None:
    h = _base()
    for n in range(1, 4):
        msg = _publish(h, 5.0 + n, n)
        h.received(5.5 + n, "sub", msg, TOPIC, 2, False, "sub/1", n)
    r = check(h, PERSISTENT, settle=2.0, connections={"pub": 1, "sub": 1, "sub2": 1})
    assert (r.acked, r.checked, r.failed) == (3, 3, False)
    assert r.summary()["lost"] == 0 and r.summary()["reorders"] == 0


def test_lost_an_acknowledged_message() -> None:
    h = _base()
    _publish(h, 5.0, 1)
    r = check(h, PERSISTENT, settle=2.0)
    assert r.lost == [("pub:1", "sub")]
    assert r.failed


def test_not_lost_when_published_before_the_subscription_was_in_place() -> None:
    h = _base()
    _publish(h, 1.5, 1)  # 1.3 s after the SUBACK, settle is 2 s
    h.publish(6.0, "pub", "invoke", "pub:2", TOPIC, 2)  # never acknowledged: no promise
    r = check(h, PERSISTENT, settle=2.0)
    assert (r.lost, r.checked, r.acked) == ([], 0, 1)


def test_qos2_duplicate_outbound() -> None:
    h = _base()
    msg = _publish(h, 5.0, 1)
    h.received(5.1, "sub", msg, TOPIC, 2, False, "sub/1", 7)
    h.connect(6.0, "sub", "ok", "sub/2", "n2", True)
    h.received(6.1, "sub", msg, TOPIC, 2, False, "sub/2", 3)  # new id, DUP=0: a new delivery
    r = check(h, PERSISTENT)
    assert r.qos2_dups == [("pub:1", "sub", "outbound")]
    assert r.qos2_by_class() == {"inbound": 0, "outbound": 1, "other": 0}
    assert r.failed


def test_qos2_duplicate_inbound() -> None:
    h = _base()
    msg = _publish(h, 5.0, 1)
    h.connect(5.5, "pub", "ok", "pub/2", "n2", True)
    h.publish(5.5, "pub", "resend", msg, TOPIC, 2)  # the PUBREL went again on the new connection
    h.received(5.6, "sub", msg, TOPIC, 2, False, "sub/1", 1)
    h.received(5.7, "sub", msg, TOPIC, 2, False, "sub/1", 2)
    r = check(h, PERSISTENT)
    assert r.qos2_by_class() == {"inbound": 1, "outbound": 0, "other": 0}


def test_qos2_duplicate_on_one_connection() -> None:
    h = _base()
    msg = _publish(h, 5.0, 1)
    h.received(5.1, "sub", msg, TOPIC, 2, False, "sub/1", 1)
    h.received(5.2, "sub", msg, TOPIC, 2, False, "sub/1", 2)
    assert check(h, PERSISTENT).qos2_by_class() == {"inbound": 0, "outbound": 0, "other": 1}


def test_qos1_duplicate_is_counted_and_allowed() -> None:
    h = _base()
    topic = "chaos/pub/q1"
    msg = _publish(h, 5.0, 1, qos=1, topic=topic)
    h.received(5.1, "sub", msg, topic, 1, False, "sub/1", 1)
    h.received(5.2, "sub", msg, topic, 1, True, "sub/1", 1)
    r = check(h, PERSISTENT)
    assert (r.qos1_dups, r.qos2_dups, r.failed) == (1, [], False)


def test_reorder_per_publisher_and_topic() -> None:
    h = _base()
    for n in (1, 2, 3):
        _publish(h, 5.0 + n, n)
    for n in (1, 3, 2):
        h.received(9.0 + n, "sub", f"pub:{n}", TOPIC, 2, False, "sub/1", n)
    other = "chaos/pub/q1"  # another topic of the same publisher: its own order
    _publish(h, 9.0, 4, qos=1, topic=other)
    h.received(9.5, "sub", "pub:4", other, 1, False, "sub/1", 9)
    r = check(h, PERSISTENT)
    assert r.order.by_stream == {f"pub {TOPIC} 2": 1}
    assert r.order.same_connection == [("sub", "pub:2", "pub:3")] and r.order.across_connections == []
    assert r.summary()["reorders"] == 1
    assert not r.failed  # reported, not gated


def test_packet_id_reused_while_the_subscriber_awaits_pubrel() -> None:
    h = _base()
    a, b = _publish(h, 5.0, 1), _publish(h, 5.1, 2)
    h.received(5.2, "sub", a, TOPIC, 2, False, "sub/1", 9)
    h.repeated(5.3, "sub", a, TOPIC, 2, True, "sub/1", 9)  # a re-send of the same message: fine
    h.repeated(5.4, "sub", b, TOPIC, 2, False, "sub/1", 9)  # another message on the held id
    r = check(h, PERSISTENT)
    assert r.pid_reuse == [("sub", 9, a, b)]
    assert r.lost == [(b, "sub")]  # the strict receiver dropped it: a loss too
    assert r.failed


def test_wrong_session_present() -> None:
    h = _base()
    h.closed(3.0, "sub", "sub/1", False, "move")
    h.connect(3.1, "sub", "invoke", "sub/2", "n2")
    h.connect(3.2, "sub", "ok", "sub/2", "n2", False)  # it had a session: 0 is wrong
    h.connect(3.3, "cleanclient", "ok", "c/2", "n2", False)  # not persistent: not judged
    r = check(h, PERSISTENT)
    assert r.wrong_session_present == [("sub", "sub/2")]
    assert r.failed


def test_refusals_by_code_and_connect_errors() -> None:
    h = _base()
    h.connect(3.0, "sub", "fail", "sub/2", "n1", 3)
    h.connect(3.5, "sub", "fail", "sub/3", "n2", 3)
    h.connect(4.0, "sub", "fail", "sub/4", "n0", 5)
    h.connect(4.5, "sub", "fail", "sub/5", "n1", "no CONNACK")
    r = check(h, PERSISTENT)
    assert r.refusals == {"0x03": 2, "0x05": 1}
    assert r.connect_errors == {"no CONNACK": 1}
    assert not r.failed


def test_connections_per_client_id() -> None:
    """[MQTT-3.1.4-2] at the end of a run: a persistent client on one node, any ClientId (a
    clean probe too) on one at most; otherwise the run fails."""
    r = check(_base(), PERSISTENT, connections={"pub": 1, "sub": 2})
    assert r.not_one_connection == {"sub": 2, "sub2": 0} and r.failed
    r = check(_base(), PERSISTENT, connections={"pub": 1, "sub": 1, "sub2": 1, "probe-n0": 2})
    assert r.not_one_connection == {"probe-n0": 2} and r.failed
    ok = check(_base(), PERSISTENT, connections={"pub": 1, "sub": 1, "sub2": 1, "probe-n0": 1})
    assert ok.not_one_connection == {} and not ok.failed
    assert check(_base(), PERSISTENT).not_one_connection == {}  # unknown: not judged


def test_every_subscriber_is_judged() -> None:
    h = _base(("sub", "sub2"))
    msg = _publish(h, 5.0, 1)
    h.received(5.1, "sub", msg, TOPIC, 2, False, "sub/1", 1)
    assert check(h, PERSISTENT).lost == [(msg, "sub2")]


# -- the nemesis schedule ---------------------------------------------------------------------

NAMES = ["n0", "n1", "n2", "n3", "n4"]
PAIRS = [(a, b) for a in NAMES for b in NAMES if a < b]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_schedule_is_a_function_of_its_seed(seed: int) -> None:
    one = schedule(random.Random(seed), NAMES, PAIRS, 90.0)
    two = schedule(random.Random(seed), NAMES, PAIRS, 90.0)
    assert [f.as_dict() for f in one] == [f.as_dict() for f in two]
    assert [f.toggles for f in one] == [f.toggles for f in two]
    assert [f.as_dict() for f in schedule(random.Random(seed + 100), NAMES, PAIRS, 90.0)] != [f.as_dict() for f in one]


@pytest.mark.parametrize("seed", range(8))
def test_schedule_covers_every_kind_then_overlaps_and_heals_in_time(seed: int) -> None:
    faults = schedule(random.Random(seed), NAMES, PAIRS, 90.0, max_pause=5.0)
    first = faults[: len(KINDS)]
    assert sorted(f.kind for f in first) == sorted(KINDS)
    for f, g in zip(first, first[1:], strict=False):
        assert f.end < g.start, "phase 1 is one fault at a time"
    assert any(f.overlapping for f in faults)
    assert all(f.end <= 88.0 for f in faults)
    for f in faults:
        if f.kind == "pause":
            assert f.end - f.start <= 5.0
        if f.kind.startswith("partition"):
            assert set(f.sides[0]) | set(f.sides[1]) == set(NAMES) and not set(f.sides[0]) & set(f.sides[1])
        if f.kind == "flap":
            assert len(f.toggles) >= 2 and all(f.start < t < f.end for t in f.toggles)
    for f in faults:  # never one node under two node faults, never more than 2 of 5 at once
        if f.kind in ("kill", "pause"):
            at = [g for g in faults if g.kind in ("kill", "pause") and g.start <= f.start < g.end]
            assert len({g.node for g in at}) == len(at) <= 2


# -- the MqttClient options the harness uses ------------------------------------------------------


def test_pid_range_reuses_ids_once_acknowledged() -> None:
    c = MqttClient("p", clean=False, pid_range=2)
    c.connect()
    c.receive_data(codec.encode(codec.ConnAck(False, 0)))
    assert [c.publish("t", b"a", 1), c.publish("t", b"b", 1)] == [1, 2]
    with pytest.raises(RuntimeError):
        c.publish("t", b"c", 1)
    c.receive_data(codec.encode(codec.PubAck(1)))
    assert c.publish("t", b"c", 1) == 1
    with pytest.raises(ValueError):
        MqttClient("p", clean=False, pid_range=0)


def test_report_repeats() -> None:
    quiet, loud = MqttClient("s", clean=False), MqttClient("s", clean=False, report_repeats=True)
    first = codec.encode(codec.Publish("t", b"m1", 2, False, False, 5))
    again = codec.encode(codec.Publish("t", b"m2", 2, False, True, 5))
    for c in (quiet, loud):
        c.connect()
        c.receive_data(codec.encode(codec.ConnAck(False, 0)))
        assert c.receive_data(first) == [("message", "t", b"m1", 2, False, 5)]
    assert quiet.receive_data(again) == []
    assert loud.receive_data(again) == [("repeat", "t", b"m2", 2, True, 5)]


# --------------------------------------------------------------------------- the MQTT 5 workload's check


def test_expiry_is_read_from_the_topic() -> None:
    assert [expiry_of(t) for t in ("chaos/pub0/q1/e2", "chaos/pub0/q1", "chaos/e/q1", "chaos/p/q2/e")] == [
        2,
        None,
        None,
        None,
    ]


def test_a_message_delivered_after_its_expiry_is_late_and_one_dropped_is_not_lost() -> None:
    """[MQTT-3.3.2-5]: a first delivery later than the acknowledgement plus the interval (plus
    the harness's slack) fails the run; an expiring message never delivered is no loss; a
    re-send (DUP=1) of one whose delivery began may come later."""
    h = _base(("sub", "sub2"))
    topic = "chaos/pub/q1/e2"
    late = _publish(h, 5.0, 1, qos=1, topic=topic)  # acknowledged at 5.01
    h.received(5.01 + 2 + EXPIRY_SLACK + 0.5, "sub", late, topic, 1, False, "sub/1", 1)
    dropped = _publish(h, 6.0, 2, qos=1, topic=topic)
    resent = _publish(h, 7.0, 3, qos=1, topic=topic)
    h.received(7.1, "sub", resent, topic, 1, False, "sub/1", 2)
    h.received(20.0, "sub2", resent, topic, 1, True, "sub2/1", 2)  # (DUP=1: its delivery began before)
    r = check(h, PERSISTENT)
    assert r.expiring == 3 and r.lost == [] and dropped not in {m for m, _ in r.lost}
    assert [(m, c) for m, c, _ in r.late] == [(late, "sub")]
    assert r.late[0][2] == pytest.approx(0.5 + EXPIRY_SLACK, abs=0.01) and r.failed
    assert r.summary()["delivered_after_expiry"] == 1


def test_the_mqtt5_client_asks_for_its_session_expiry_and_sends_message_expiry() -> None:
    """The harness's MQTT 5 client: CONNECT level 5 with Clean Start 0 and the Session Expiry
    Interval, a PUBLISH with the Message Expiry Interval, sent again with it (DUP=1)."""
    from mqttmesh import properties as P

    c = MqttClient("p5", clean=False, keepalive=5, version=5, session_expiry=120)
    c.connect()
    d = codec.Decoder()
    d.feed(c.data_to_send())
    [connect] = list(d.packets())
    assert (connect.protocol_level, connect.clean_session, connect.properties) == (5, False, {P.SESSION_EXPIRY: 120})
    assert c.receive_data(bytes((0x20, 3, 0, 0, 0))) == [("connack", 0, False)]
    pid = c.publish("t/e2", b"x", 1, expiry=2)
    sent = codec.Decoder(version=5)
    sent.feed(c.data_to_send())
    [pub] = list(sent.packets())
    assert (pub.packet_id, pub.properties[P.MESSAGE_EXPIRY], pub.dup) == (pid, 2, False)
    c.connection_lost()
    c.connect()
    c.receive_data(bytes((0x20, 3, 1, 0, 0)))
    again = codec.Decoder(version=5)
    again.feed(c.data_to_send()[len(encode5(connect)) :])
    [dup] = list(again.packets())
    assert (dup.packet_id, dup.properties[P.MESSAGE_EXPIRY], dup.dup) == (pid, 2, True)


def test_a_late_delivery_that_says_nothing_was_left_began_before_the_expiry() -> None:
    """The node began the delivery in time and the frame left later (held back behind what a
    persistent session's holders had to confirm): it says 0 is left, MQTT-3.3.2-5 allows it,
    and it is counted apart, not failed; one that says time is left fails."""
    h = _base(("sub", "sub2"))
    topic = "chaos/pub/q2/e2"
    m = _publish(h, 5.0, 1, qos=2, topic=topic)
    h.received(9.0, "sub", m, topic, 2, False, "sub/1", 1, 0)
    h.received(9.0, "sub2", m, topic, 2, False, "sub2/1", 1, 1)
    r = check(h, PERSISTENT)
    assert r.begun_before_expiry == 1 and [c for _, c, _ in r.late] == ["sub2"]


def test_a_late_delivery_held_back_by_a_stop_of_its_node_is_counted_apart() -> None:
    """A PUBLISH framed with a little life left whose node was stopped (SIGSTOP) before it was
    written reaches the client after the stop: counted apart (``framed_before_pause``), not
    failed. It must be the delivering connection's node, stopped before the deadline and
    running again just before the delivery; otherwise the delivery is late."""
    h = _base(("sub", "sub2", "sub3"))  # (all on n0)
    topic = "chaos/pub/q1/e2"
    m = _publish(h, 5.0, 1, qos=1, topic=topic)  # acknowledged at 5.01: deadline 5.01 + 2 + slack
    for s in ("sub", "sub2", "sub3"):
        h.received(10.2, s, m, topic, 1, False, f"{s}/1", 1, 1)
    held = {"n0": [(7.5, 10.0)]}
    assert check(h, PERSISTENT, pauses=held).framed_before_pause == 3
    r = check(h, PERSISTENT, pauses=held)
    assert r.late == [] and not r.failed and r.summary()["framed_before_pause"] == 3
    for pauses in (
        {"n1": [(7.5, 10.0)]},  # another node was stopped
        {"n0": [(8.5, 10.0)]},  # stopped only after the deadline (8.01): the node framed it late
        {"n0": [(7.5, 9.0)]},  # running again well before the delivery
        None,
    ):
        r = check(h, PERSISTENT, pauses=pauses)
        assert len(r.late) == 3 and r.failed and r.framed_before_pause == 0


def test_the_pauses_are_read_from_the_nemesis_events_as_they_happened() -> None:
    """The times of a pause are those of its steps (a step may come after its schedule, behind
    a restart), from the Faults or from their saved form; other kinds are not pauses."""
    from bench.chaos.nemesis import Fault, pauses_of

    faults = [
        Fault(0, "pause", 1.0, 3.0, node="n2"),
        Fault(1, "kill", 2.0, 4.0, node="n1"),
        Fault(2, "pause", 5.0, 6.0, node="n2"),
    ]
    events = [
        {"t": 1.01, "step": "start", "fault": 0},
        {"t": 2.0, "step": "start", "fault": 1},
        {"t": 3.02, "step": "end", "fault": 0},
        {"t": 4.5, "step": "end", "fault": 1},
        {"t": 5.6, "step": "start", "fault": 2},  # (late: the restart before it took a while)
        {"t": 6.0, "step": "end", "fault": 2},
    ]
    want = {"n2": [(1.01, 3.02), (5.6, 6.0)]}
    assert pauses_of(events, faults) == want
    assert pauses_of(events, [f.as_dict() for f in faults]) == want
    assert pauses_of([], faults) == {}


# -- the shared-subscription workload (issue 24): bench/chaos/sharecheck.py -----------------

SHARE = [("$share/chaos/chaos/#", 2)]
MEMBERS_PERSISTENT = {"pub", "sub"}  # csub is a clean member


def _group() -> History:
    """Members sub (on n0) and csub (on n1) subscribed at t=0.2; pub connected to n2 at 1.1."""
    h = History()
    for m, node in (("sub", "n0"), ("csub", "n1")):
        h.connect(0.0, m, "invoke", f"{m}/1", node)
        h.connect(0.1, m, "ok", f"{m}/1", node, False)
        h.subscribed(0.2, m, SHARE)
    h.connect(1.0, "pub", "invoke", "pub/1", "n2")
    h.connect(1.1, "pub", "ok", "pub/1", "n2", False)
    return h


def _window(kind: str, start: float, end: float, **where: object) -> dict[str, object]:
    what = {"node": "", "sides": [[], []], "link": ["", ""]}
    what.update(where)
    return {"id": 0, "kind": kind, "start": start, "end": end, "what": kind, "overlapping": False, **what}


def test_shared_a_clean_history_passes_and_has_its_spread() -> None:
    h = _group()
    for n in range(1, 5):
        msg = _publish(h, 5.0 + n, n)
        member = "sub" if n % 2 else "csub"
        h.received(5.5 + n, member, msg, TOPIC, 2, False, f"{member}/1", n)
    r = check_shared(h, MEMBERS_PERSISTENT, settle=2.0, connections={"pub": 1, "sub": 1, "csub": 1})
    assert (r.base.acked, r.checked, r.lost, r.resends, r.failed) == (4, 4, [], [], False)
    assert r.members == ["csub", "sub"] and r.per_member == {"sub": 2, "csub": 2}
    assert r.spread() == (1.0, 1.0)
    assert r.base.lost == []  # (not judged per member: each member gets some)


def test_shared_an_acknowledged_message_no_member_got_is_lost() -> None:
    h = _group()
    got = _publish(h, 5.0, 1)
    h.received(5.1, "sub", got, TOPIC, 2, False, "sub/1", 1)
    lost = _publish(h, 6.0, 2)
    h.publish(7.0, "pub", "invoke", "pub:3", TOPIC, 2)  # never acknowledged: no promise
    r = check_shared(h, MEMBERS_PERSISTENT, settle=2.0)
    assert r.lost == [(lost, 6.01)] and r.checked == 2
    assert r.lost_context[0]["acked_by"] == ["pub/1", "n2"] and r.lost_context[0]["members_conns_ended"] == []
    assert r.failed and r.summary()["lost"] == 1


def test_shared_a_message_a_member_received_is_not_lost_though_its_connection_then_ended() -> None:
    h = _group()
    msg = _publish(h, 5.0, 1, qos=1, topic="chaos/pub/q1")
    h.received(5.1, "csub", msg, "chaos/pub/q1", 1, False, "csub/1", 1)
    record_unacked(h, 5.2, "csub", "csub/1", [msg])
    h.closed(5.2, "csub", "csub/1", False, "reset (stalled)")
    r = check_shared(h, MEMBERS_PERSISTENT, settle=2.0)
    assert (r.lost, r.failed) == ([], False)


def test_shared_not_judged_before_a_member_subscribed_in_time() -> None:
    h = _group()
    _publish(h, 1.5, 1)  # 1.3 s after the first SUBACK, settle is 2 s
    r = check_shared(h, MEMBERS_PERSISTENT, settle=2.0)
    assert (r.lost, r.checked) == ([], 0)


def test_shared_a_second_member_without_a_reason_is_an_unexplained_duplicate() -> None:
    h = _group()
    msg = _publish(h, 5.0, 1)
    h.received(5.1, "sub", msg, TOPIC, 2, False, "sub/1", 1)
    h.received(9.0, "csub", msg, TOPIC, 2, False, "csub/1", 4)  # sub never lost its connection
    r = check_shared(h, MEMBERS_PERSISTENT, settle=2.0, faults=[_window("kill", 20.0, 22.0, node="n0")])
    assert [(x["msg"], x["qos"], x["first"][0], x["again"][0], x["class"]) for x in r.resends] == [
        (msg, 2, "sub", "csub", "unexplained")
    ]
    assert r.failed and r.summary()["unexplained"] == 1 and r.summary()["resends_qos2"] == 1
    assert r.base.qos2_dups == []  # (two members, not one member twice)


@pytest.mark.parametrize(
    ("events", "expected"),
    [
        ("unacked", "unacked"),  # the holder never wrote its PUBREC before the reset
        ("left soon", "member left"),  # its connection ended 0.5 s after: the PUBREC may not have arrived
        ("left late", "unexplained"),  # ended 5 s after it had acknowledged: no reason
        ("closed by the node", "member left"),  # the client read the node's close 0.1 s after t2
        ("left after", "unexplained"),  # its own move, 0.1 s after t2, did not cause it
        ("kill", "node killed"),
        ("pause", "node paused"),
        ("kill elsewhere", "unexplained"),
        ("partition apart", "cut off"),  # the holder's node n0 apart from the origin n2
        ("partition together", "unexplained"),
        ("flap", "cut off"),
        ("link lost", "link lost"),  # a link n0 lost on its own (keepalive: nodelogs.py), not injected
        ("link lost elsewhere", "unexplained"),
        ("inbound", "inbound"),  # the publisher sent it on two connections: QoS 2, the mesh's to dedupe
    ],
)
def test_shared_a_second_member_is_explained(events: str, expected: str) -> None:
    h = _group()
    msg = _publish(h, 5.0, 1)
    h.received(5.1, "sub", msg, TOPIC, 2, False, "sub/1", 1)
    faults = []
    if events == "unacked":
        record_unacked(h, 5.6, "sub", "sub/1", [msg])
        h.closed(5.6, "sub", "sub/1", False, "reset (stalled)")
    elif events.startswith("left"):
        at = {"left soon": 5.6, "left late": 10.1, "left after": 5.6}[events]
        h.closed(at, "sub", "sub/1", True, "move")
    elif events == "closed by the node":
        h.closed(5.6, "sub", "sub/1", False, "closed by the server")
    elif events == "inbound":
        h.connect(5.3, "pub", "invoke", "pub/2", "n1")
        h.connect(5.4, "pub", "ok", "pub/2", "n1", True)
        h.publish(5.4, "pub", "resend", msg, TOPIC, 2)
    elif events in ("kill", "pause"):
        faults.append(_window(events, 5.5, 8.0, node="n0"))
    elif events == "kill elsewhere":
        faults.append(_window("kill", 5.5, 8.0, node="n1"))
    elif events == "partition apart":
        faults.append(_window("partition-cut", 4.0, 7.0, sides=[["n0", "n1"], ["n2"]]))
    elif events == "partition together":
        faults.append(_window("partition-blackhole", 4.0, 7.0, sides=[["n0", "n2"], ["n1"]]))
    elif events == "flap":
        faults.append(_window("flap", 5.0, 7.0, link=["n2", "n0"]))
    elif events == "link lost":
        faults.append(_window("link lost", 5.2, 5.9, link=["n0", "n2"]))
    elif events == "link lost elsewhere":
        faults.append(_window("link lost", 5.2, 5.9, link=["n1", "n3"]))
    t2 = 5.5 if events in ("closed by the node", "left after") else 11.0
    h.received(t2, "csub", msg, TOPIC, 2, False, "csub/1", 4)
    r = check_shared(h, MEMBERS_PERSISTENT, settle=2.0, faults=faults)
    assert [x["class"] for x in r.resends] == [expected]
    assert r.failed == (expected in ("unexplained", "inbound"))
    assert r.by_class(2)[expected] == 1


def test_shared_a_qos1_message_its_publisher_sent_twice_may_reach_two_members() -> None:
    h = _group()
    msg = _publish(h, 5.0, 1, qos=1, topic="chaos/pub/q1")
    h.received(5.1, "sub", msg, "chaos/pub/q1", 1, False, "sub/1", 1)
    h.connect(5.3, "pub", "invoke", "pub/2", "n1")
    h.connect(5.4, "pub", "ok", "pub/2", "n1", True)
    h.publish(5.4, "pub", "resend", msg, "chaos/pub/q1", 1)
    h.received(5.6, "csub", msg, "chaos/pub/q1", 1, False, "csub/1", 4)
    r = check_shared(h, MEMBERS_PERSISTENT, settle=2.0)
    assert ([x["class"] for x in r.resends], r.qos2_inbound, r.failed) == (["inbound"], [], False)


def test_shared_qos2_twice_to_the_same_member_is_still_caught() -> None:
    h = _group()
    msg = _publish(h, 5.0, 1)
    h.received(5.1, "sub", msg, TOPIC, 2, False, "sub/1", 1)
    h.connect(6.0, "sub", "ok", "sub/2", "n1", True)
    h.received(6.1, "sub", msg, TOPIC, 2, False, "sub/2", 3)
    r = check_shared(h, MEMBERS_PERSISTENT, settle=2.0)
    assert r.base.qos2_dups == [(msg, "sub", "outbound")] and r.resends == []
    assert r.failed


def test_shared_row_of_the_table() -> None:
    h = _group()
    msg = _publish(h, 5.0, 1, qos=1, topic="chaos/pub/q1")
    h.received(5.1, "sub", msg, "chaos/pub/q1", 1, False, "sub/1", 1)
    h.received(9.0, "csub", msg, "chaos/pub/q1", 1, False, "csub/1", 1)
    _publish(h, 6.0, 2)
    r = check_shared(h, MEMBERS_PERSISTENT, settle=2.0, connections={"pub": 1, "sub": 1, "csub": 1})
    result = {
        "broker": "mqttmesh",
        "seed": 3,
        "nodes": 3,
        "rate": 120.0,
        "duration": 30.0,
        "completed": True,
        "shared": True,
        "check": r.summary(),
        "clients": {"sub": {"clean": False}, "csub": {"clean": True}, "pub": {"clean": False}},
        "reconvergence_alone_median_s": 0.5,
        "reconvergence_alone_max_s": 1.0,
        "reconvergence_median_s": 0.5,
        "reconvergence_max_s": 2.0,
        "reconvergence_unmeasured": 0,
    }
    cells = [c.strip() for c in row(result).strip("|").split("|")]
    assert len(cells) == len(SHARED_COLUMNS) and table_header(shared=True).count("|---") == len(SHARED_COLUMNS)
    assert cells[6:12] == ["1 + 1", "2", "1", "1: 0 / 0 / 0 / 0 / 0 / 0 / 0", "0 (0, 0)", "1"]
    assert cells[16] == "1.00 / 1.00"


def test_the_fault_windows_are_read_from_the_nemesis_events_as_they_happened() -> None:
    faults = [_window("kill", 1.0, 2.0, node="n1"), {**_window("pause", 3.0, 4.0, node="n0"), "id": 1}]
    events = [
        {"t": 1.05, "step": "start", "fault": 0},
        {"t": 2.4, "step": "end", "fault": 0},
        {"t": 3.01, "step": "start", "fault": 1},
    ]
    w = windows_of(events, faults)
    assert [(x["kind"], x["start"], x["end"]) for x in w] == [("kill", 1.05, 2.4), ("pause", 3.01, float("inf"))]


@pytest.mark.parametrize(
    ("kind", "where", "expected"),
    [
        ("partition-blackhole", [["n0"], ["n1", "n2"]], "cut off"),
        ("kill", "n0", "node killed"),  # (its queue restored from the store)
        ("none", "", "unexplained"),
    ],
)
def test_shared_a_persistent_members_home_cut_off_explains_its_later_copy(
    kind: str, where: object, expected: str
) -> None:
    """Seen in seed 2: the origin chose sub's home n0 as the partition began, re-sent to csub on
    n1 after mesh.shared_reroute; n0 queued its copy for sub, which got it on its return."""
    h = _group()
    msg = _publish(h, 5.0, 1, qos=1, topic="chaos/pub/q1")
    h.closed(6.0, "sub", "sub/1", False, "closed by the server")
    h.received(10.5, "csub", msg, "chaos/pub/q1", 1, False, "csub/1", 1)
    h.connect(12.0, "sub", "invoke", "sub/2", "n1")
    h.connect(12.05, "sub", "ok", "sub/2", "n1", True)
    h.received(12.1, "sub", msg, "chaos/pub/q1", 1, False, "sub/2", 1)
    faults = [_window(kind, 4.9, 7.0, **({"node": where} if kind == "kill" else {"sides": where}))]
    r = check_shared(h, MEMBERS_PERSISTENT, settle=2.0, faults=faults if kind != "none" else [])
    assert [(x["first"][0], x["again"][0], x["class"]) for x in r.resends] == [("csub", "sub", expected)]


def test_shared_a_clean_members_node_killed_keeps_no_copy_for_it() -> None:
    h = _group()
    msg = _publish(h, 5.0, 1, qos=1, topic="chaos/pub/q1")
    h.received(9.5, "sub", msg, "chaos/pub/q1", 1, False, "sub/1", 1)  # the re-send, say
    h.received(12.1, "csub", msg, "chaos/pub/q1", 1, False, "csub/1", 1)  # csub's node n1 was killed
    r = check_shared(h, MEMBERS_PERSISTENT, settle=2.0, faults=[_window("kill", 4.9, 7.0, node="n1")])
    assert [x["class"] for x in r.resends] == ["unexplained"]
    r = check_shared(h, MEMBERS_PERSISTENT, settle=2.0, faults=[_window("pause", 4.9, 7.0, node="n1")])
    assert [x["class"] for x in r.resends] == ["node paused"]  # (it held its copy through the stop)


def test_shared_a_clean_members_next_connection_is_another_member() -> None:
    """Seen at 7 nodes: csub3's node killed while it held QoS 2 messages unacknowledged; the
    origin's re-send reached csub3's next (clean) session: a re-send, not one session's twice."""
    h = _group()
    msg = _publish(h, 5.0, 1)
    h.received(5.1, "csub", msg, TOPIC, 2, False, "csub/1", 1)
    record_unacked(h, 5.2, "csub", "csub/1", [msg])
    h.closed(5.2, "csub", "csub/1", False, "closed by the server")
    h.connect(6.0, "csub", "invoke", "csub/2", "n0")
    h.connect(6.1, "csub", "ok", "csub/2", "n0", False)
    h.received(10.2, "csub", msg, TOPIC, 2, False, "csub/2", 7)
    r = check_shared(h, MEMBERS_PERSISTENT, settle=2.0)
    assert r.base.qos2_dups == [] and [x["class"] for x in r.resends] == ["unacked"]
    assert r.per_member == {"csub": 1} and not r.failed
    h.received(10.3, "csub", msg, TOPIC, 2, False, "csub/2", 8)  # twice on one connection: still caught
    assert check_shared(h, MEMBERS_PERSISTENT, settle=2.0).base.qos2_dups == [(msg, "csub", "outbound")]


def test_the_links_nodes_lost_on_their_own_are_read_from_their_logs() -> None:
    """A window per (node, peer) from a "down" line to the next "up" of that peer on that node
    (or the run's end), on the history's clock; other lines, and an "up" with nothing down,
    are ignored."""
    from datetime import datetime

    from bench.chaos.nodelogs import link_losses

    wall0 = datetime(2026, 11, 30, 8, 0, 0).timestamp()
    logs = {
        "n0": [
            "2026-11-30 08:00:01,250 INFO mqttmesh.mesh: link to n1 up (dialled by n0)",
            "2026-11-30 08:00:05,500 WARNING mqttmesh.mesh: link to n1 down: keepalive: nothing received for 1.5 x 2s",
            "2026-11-30 08:00:05,600 INFO mqttmesh.broker: client c1 connected",
            "2026-11-30 08:00:07,000 INFO mqttmesh.mesh: link to n1 switched to the one dialled by n1",
            "2026-11-30 08:00:07,750 INFO mqttmesh.mesh: link to n1 up (dialled by n1)",
            "2026-11-30 08:00:09,000 WARNING mqttmesh.mesh: link to n2 down: connection lost",
        ],
        "n1": ["not a log line"],
    }
    windows = link_losses(logs, wall0, end=20.0)
    assert [(w["link"], w["start"], w["end"], w["reason"]) for w in windows] == [
        (["n0", "n1"], 5.5, 7.75, "keepalive: nothing received for 1.5 x 2s"),
        (["n0", "n2"], 9.0, 20.0, "connection lost"),
    ]
    assert all(w["kind"] == "link lost" for w in windows)


@pytest.mark.parametrize(
    ("paused", "expected"),
    [
        ("n0", "node paused"),  # sub's home held the message through its stop; csub got the re-send
        ("n4", "unexplained"),  # another node's stop explains nothing here
    ],
)
def test_shared_a_persistent_members_home_stopped_explains_the_copy_another_got_first(
    paused: str, expected: str
) -> None:
    """The fault harness (7 nodes, seed 1, pub0:298): the message went to persistent member
    sub on its node, which was stopped (SIGSTOP) before sub had it; the publisher's re-send
    elsewhere reached csub, and sub had its copy when it came back: the node's stop explains
    the earlier copy, as a kill of that node does (its queue restored from the store)."""
    h = _group()
    msg = _publish(h, 5.0, 1)
    h.closed(7.0, "sub", "sub/1", False, "closed by the server")
    h.received(6.0, "csub", msg, TOPIC, 2, False, "csub/1", 4)
    h.connect(9.0, "sub", "invoke", "sub/2", "n3")
    h.connect(9.1, "sub", "ok", "sub/2", "n3", True)
    h.received(9.2, "sub", msg, TOPIC, 2, False, "sub/2", 1)
    r = check_shared(h, MEMBERS_PERSISTENT, settle=2.0, faults=[_window("pause", 5.2, 6.9, node=paused)])
    assert [(x["again"][0], x["class"]) for x in r.resends] == [("sub", expected)]


@pytest.mark.parametrize(
    ("sides", "expected"),
    [
        ([["n0", "n1", "n2"], ["n3", "n4"]], "cut off"),  # sub's old node apart from its new one
        ([["n0", "n3"], ["n1", "n2", "n4"]], "unexplained"),  # together: its copies heard of it
        (None, "unexplained"),
    ],
)
def test_shared_a_persistent_member_whose_node_handed_its_message_on_while_cut_off(
    sides: list[list[str]] | None, expected: str
) -> None:
    """The fault harness (7 nodes, 3.1.1, seed 1, pub0:2053): sub's node, cut off into a
    minority, closed sub's connection with a QoS 1 message in flight that sub never read, and
    handed the message to csub (the hand-on goes to the session's other copies, which the
    partition kept from hearing of it); sub came back on a node of the other side, whose copy
    still had the message in flight, and got it again (DUP)."""
    h = _group()
    msg = _publish(h, 5.0, 1, qos=1, topic="chaos/pub/q1")
    h.received(5.2, "csub", msg, "chaos/pub/q1", 1, False, "csub/1", 1)
    h.closed(5.21, "sub", "sub/1", False, "closed by the server")
    h.connect(5.8, "sub", "invoke", "sub/2", "n3")
    h.connect(5.9, "sub", "ok", "sub/2", "n3", True)
    h.received(5.9, "sub", msg, "chaos/pub/q1", 1, True, "sub/2", 29)
    faults = [] if sides is None else [_window("partition-cut", 5.1, 7.0, sides=sides)]
    r = check_shared(h, MEMBERS_PERSISTENT, settle=2.0, faults=faults)
    assert [(x["first"][0], x["again"][0], x["class"]) for x in r.resends] == [("csub", "sub", expected)]
