"""archive/capture.py: what the archive gets from a node's Channels and Broker.

A node that archives every topic records a client's messages as whole reads
(archive/reads.py): ``(publisher, timestamp, data, segments, skips, count)``, where
``data`` is the read's whole packets, ``count`` the PUBLISH packets handled, ``skips``
the ordinals of those that became no message and ``segments`` (ordinal, seq) pairs
from which every message's seq follows. Every other message (a will, a message in the
read that carried the CONNECT) is a publish record. The expected records below are
worked out by hand from the packets support.mqttraw builds (written from the
standard, not with mqttmesh.codec): seqs start at 1 on a fresh Broker, and each read
is fed at time 5.0, so its timestamp is 5.0 (the wall offset is 0).
"""

from __future__ import annotations

import pytest

from mqttmesh.archive.capture import Capture, ReadCapture
from mqttmesh.archive.recorder import ArchiveLimits, Recorder
from mqttmesh.archive.schema import PUBLISH
from mqttmesh.auth import Acl, Auth
from mqttmesh.broker import Broker, BrokerPorts, BrokerSettings
from mqttmesh.channel import CLOSED, CONNECTED, Channel
from mqttmesh.codec import Decoder, MalformedPacket
from mqttmesh.mesh.cluster.replica_sessions import ReplicaSessions
from mqttmesh.message import Message
from mqttmesh.session import Limits
from mqttmesh.session_durable import Sessions
from mqttmesh.store import NULL_JOURNAL
from support import mqttraw as raw
from support.frames import Recorder as Owner
from support.frames import split_frames

NOW = 5.0


class ClosingOwner(Owner):
    """An owner whose connection breaks the first time it is woken once armed."""

    armed = False

    def wake(self, channel):
        super().wake(channel)
        if self.armed:
            self.armed = False
            channel.close("connection broke while writing")


class Node:
    """A pure Broker with the archive on; the recorder's chunks land in a list."""

    def __init__(self, filters=("#",), delivery_log=False, auth=None, wall_offset=0.0, **settings):
        self.chunks = []
        self.recorder = Recorder(ArchiveLimits(), self.chunks.append, lambda: 99.0, filters, delivery_log)
        ports = BrokerPorts(archive=Capture(self.recorder))
        self.broker = Broker(BrokerSettings(node_id="n1", **settings), auth, None, ports, wall_offset=wall_offset)
        self.owner = Owner()

    def connect(self, client_id, owner=None, now=0.0, **kw):
        ch = Channel(self.broker, owner or self.owner, "peer", now)
        ch.receive_data(raw.connect(client_id, **kw), now)
        assert ch.data_to_send() == b"\x20\x02\x00\x00"
        return ch

    def records(self):
        """(read records, publish records) the recorder has made so far."""
        self.recorder.flush()
        reads = [r for c in self.chunks if c.reads for r in c.rows]
        published = [r for c in self.chunks if c.kind == PUBLISH and not c.reads for r in c.rows]
        self.chunks.clear()
        return [(p, t, bytes(d), segs, skips, n) for p, t, d, segs, skips, n in reads], published


def feeds(data: bytes, mode: str) -> list[bytes]:
    """The reads that bring ``data``: all at once, a byte at a time, or all but the last
    three bytes and then those (the last packet arrives in two reads)."""
    if mode == "whole":
        return [data]
    if mode == "bytes":
        return [data[i : i + 1] for i in range(len(data))]
    return [data[:-3], data[-3:]]


# --------------------------------------------------------------------------- the scenarios

# 1. a plain run: three messages, with a PINGREQ and a SUBSCRIBE among them (not numbered)
PLAIN = [
    raw.publish("t/1", b"a"),
    raw.PINGREQ_BYTES,
    raw.publish("t/2", b"b", 1, pid=1),
    raw.subscribe(2, ("x/#", 0)),
    raw.publish("t/3", b"c", 2, pid=3),
]


def plain(node):
    return node.connect("dev")


# 2. a QoS 2 PUBLISH sent again before PUBREL is acknowledged again and is no message [MQTT-4.3.3-2]
RESEND = [
    raw.publish("t/1", b"x", 2, pid=7),
    raw.publish("t/1", b"x", 2, dup=True, pid=7),
    raw.publish("t/2", b"y", 1, pid=8),
]

# 3. publishes the server does not authorise are acknowledged and are no message
# [MQTT-3.3.5-2]: a `$` topic (no client may publish there), and one the ACL denies
DENIED = [
    raw.publish("$x/y", b"no", 1, pid=1),
    raw.publish("t/1", b"a"),
    raw.publish("secret/k", b"no"),
    raw.publish("t/2", b"b"),
]


def denied(node):
    return node.connect("dev")


# 4. a seq gap inside a read: delivering t/1 breaks a subscriber's connection, and something
# else takes the next seq before t/2 gets one (a will no longer does: its number is reserved
# at CONNECT, issue 20; the owner stands for any other message numbered meanwhile)
GAP = [raw.publish("t/1", b"a"), raw.publish("t/2", b"b"), raw.publish("t/3", b"c")]


class NumberingOwner(ClosingOwner):
    """A ClosingOwner that, as the connection breaks, numbers one more message at the node."""

    def __init__(self, broker):
        super().__init__()
        self.broker = broker

    def wake(self, channel):
        if self.armed:
            self.broker.next_seq()
        super().wake(channel)


def gap(node):
    owner = NumberingOwner(node.broker)
    node.connect("s", owner, clean=False, will=("w/s", b"gone", 0, False))
    sub = node.broker.sessions["s"].channel
    sub.receive_data(raw.subscribe(1, ("t/1", 0)), 0.0)
    sub.data_to_send()  # (the SUBACK is written: the next output wakes the owner again)
    owner.armed = True
    return node.connect("dev")


# 5. a malformed packet (QoS 3 [MQTT-3.3.1-4]) ends the read: the packets before it were
# handled, it and those after it are not in the read; the will is published afterwards
MALFORMED = [
    raw.publish("t/1", b"1"),
    raw.publish("t/2", b"2", 1, pid=1),
    raw.packet(0x36, raw.s("t/3") + b"\x00\x02" + b"3"),
    raw.publish("t/4", b"4"),
]


def with_will(node):
    return node.connect("dev", will=("will/dev", b"bye", 1, False))


# 6. a PUBLISH the channel refuses (a second QoS 2 id awaiting PUBREL over
# limits.max_awaiting_rel [MQTT-4.8.0-2]): it is in the read's bytes, but not counted
REFUSED = [
    raw.publish("t/1", b"1", 2, pid=1),
    raw.publish("t/2", b"2", 2, pid=2),
    raw.publish("t/3", b"3"),
]


def read(*packets: bytes, segments, skips=(), count):
    return ("dev", NOW, b"".join(packets), segments, skips, count)


P, R, D, G, M, F = PLAIN, RESEND, DENIED, GAP, MALFORMED, REFUSED
# (a will's number is the one reserved at its CONNECT, 1 here: issue 20)
WILL_DEV = (NOW, 1, "dev", "will/dev", 1, False, b"bye")  # dev's last read was at NOW
WILL_S = (0.0, 1, "s", "w/s", 0, False, b"gone")  # s last sent something at 0.0

# (scenario, setup, packets, node settings, {mode: (read records, publish records)})
CASES = {
    "plain run": (
        plain,
        PLAIN,
        {},
        {
            "whole": ([read(*P, segments=[(0, 1)], count=3)], []),
            "bytes": (
                [
                    read(P[0], segments=[(0, 1)], count=1),
                    read(P[2], segments=[(0, 2)], count=1),
                    read(P[4], segments=[(0, 3)], count=1),
                ],
                [],
            ),
            "partial": ([read(*P[:4], segments=[(0, 1)], count=2), read(P[4], segments=[(0, 3)], count=1)], []),
        },
    ),
    "QoS 2 re-send": (
        plain,
        RESEND,
        {},
        {
            "whole": ([read(*R, segments=[(0, 1), (2, 2)], skips=[1], count=3)], []),
            # (the read of the re-send alone holds no message: no record)
            "bytes": ([read(R[0], segments=[(0, 1)], count=1), read(R[2], segments=[(0, 2)], count=1)], []),
            "partial": (
                [read(R[0], R[1], segments=[(0, 1)], skips=[1], count=2), read(R[2], segments=[(0, 2)], count=1)],
                [],
            ),
        },
    ),
    "denied": (
        denied,
        DENIED,
        {"auth": Auth(acl=Acl.parse("topic write t/#\n"))},
        {
            "whole": ([read(*D, segments=[(1, 1), (3, 2)], skips=[0, 2], count=4)], []),
            "bytes": ([read(D[1], segments=[(0, 1)], count=1), read(D[3], segments=[(0, 2)], count=1)], []),
            "partial": (
                [read(*D[:3], segments=[(1, 1)], skips=[0, 2], count=3), read(D[3], segments=[(0, 2)], count=1)],
                [],
            ),
        },
    ),
    "seq gap in a read": (
        gap,
        GAP,
        {},
        {
            "whole": ([read(*G, segments=[(0, 2), (1, 4)], count=3)], [WILL_S]),
            "bytes": (
                [
                    read(G[0], segments=[(0, 2)], count=1),
                    read(G[1], segments=[(0, 4)], count=1),
                    read(G[2], segments=[(0, 5)], count=1),
                ],
                [WILL_S],
            ),
            "partial": (
                [read(G[0], G[1], segments=[(0, 2), (1, 4)], count=2), read(G[2], segments=[(0, 5)], count=1)],
                [WILL_S],
            ),
        },
    ),
    "malformed mid-read": (
        with_will,
        MALFORMED,
        {},
        {
            "whole": ([read(M[0], M[1], segments=[(0, 2)], count=2)], [WILL_DEV]),
            "bytes": ([read(M[0], segments=[(0, 2)], count=1), read(M[1], segments=[(0, 3)], count=1)], [WILL_DEV]),
            # (the second read comes after the close: nothing of it is processed [MQTT-3.1.4-5])
            "partial": ([read(M[0], M[1], segments=[(0, 2)], count=2)], [WILL_DEV]),
        },
    ),
    "refused mid-read": (
        with_will,
        REFUSED,
        {"limits": Limits(max_awaiting_rel=1)},
        {
            # (the refused PUBLISH is in the bytes, after the `count` handled ones)
            "whole": ([read(F[0], F[1], segments=[(0, 2)], count=1)], [WILL_DEV]),
            "bytes": ([read(F[0], segments=[(0, 2)], count=1)], [WILL_DEV]),
            "partial": ([read(F[0], F[1], segments=[(0, 2)], count=1)], [WILL_DEV]),
        },
    ),
}


@pytest.mark.parametrize("mode", ["whole", "bytes", "partial"])
@pytest.mark.parametrize("name", list(CASES))
def test_a_clients_reads_become_these_records(name, mode):
    setup, packets, settings, expected = CASES[name]
    node = Node(**settings)
    dev = setup(node)
    node.records()  # (nothing to compare from the setup: no client published)
    for data in feeds(b"".join(packets), mode):
        dev.receive_data(data, NOW)
    assert node.records() == expected[mode]


def test_the_acknowledgements_of_packets_that_are_no_message_still_go_out():
    node = Node(auth=Auth(acl=Acl.parse("topic write t/#\n")))
    dev = node.connect("dev")
    dev.receive_data(b"".join(RESEND + DENIED), NOW)
    acks = [(f.type, f.packet_id) for f in split_frames(dev.data_to_send())]
    # PUBREC twice for the re-send [MQTT-4.3.3-2], PUBACK for the denied `$` publish [MQTT-3.3.5-2]
    assert acks == [(raw.PUBREC, 7), (raw.PUBREC, 7), (raw.PUBACK, 8), (raw.PUBACK, 1)]


def test_a_gap_between_two_reads_starts_the_second_at_its_own_seq():
    node = Node()
    dev = node.connect("dev")
    dev.receive_data(raw.publish("t/1", b"1") + raw.publish("t/2", b"2"), NOW)
    other = node.connect("other", will=("w/o", b"x", 0, False))  # its will's number: 3
    other.connection_lost(NOW)
    dev.receive_data(raw.publish("t/3", b"3"), NOW)
    reads, published = node.records()
    assert reads == [
        read(raw.publish("t/1", b"1"), raw.publish("t/2", b"2"), segments=[(0, 1)], count=2),
        read(raw.publish("t/3", b"3"), segments=[(0, 4)], count=1),
    ]
    assert published == [(0.0, 3, "other", "w/o", 0, False, b"x")]


def test_publishes_in_the_read_that_carried_the_connect_are_records_of_their_own():
    node = Node()
    dev = Channel(node.broker, node.owner, "peer", 0.0)
    dev.receive_data(raw.connect("dev") + raw.publish("t/1", b"a", 1, pid=1), NOW)
    assert dev.state is CONNECTED
    assert node.records() == ([], [(NOW, 1, "dev", "t/1", 1, False, b"a")])


def test_the_read_timestamp_is_the_broker_clock_plus_the_wall_offset():
    node = Node(wall_offset=1_000.0)
    dev = node.connect("dev")
    dev.receive_data(raw.publish("t/1", b"a"), NOW)
    assert node.records() == ([("dev", 1_005.0, raw.publish("t/1", b"a"), [(0, 1)], (), 1)], [])


def test_with_topic_filters_there_are_no_reads_and_only_matching_messages_are_recorded():
    node = Node(filters=("t/#",))
    dev = node.connect("dev")
    assert node.broker.archive.read("dev") is None
    dev.receive_data(raw.publish("t/1", b"a") + raw.publish("u/1", b"b") + raw.publish("t/2", b"c"), NOW)
    assert node.records() == ([], [(NOW, 1, "dev", "t/1", 0, False, b"a"), (NOW, 3, "dev", "t/2", 0, False, b"c")])


@pytest.mark.parametrize("filters", [("#",), ("t/#",)])
def test_a_message_with_another_nodes_id_is_archived_with_its_origin_and_a_clients_never(filters):
    """Broker.publish hands the archive a message under another node's id apart (a message
    routed under its agreed id, a dead node's client's will: test_inbound_qos2_unit.py,
    test_stale_copy_unit.py); its record names that origin. A client's messages, captured
    or not, are the node's own: no origin recorded, nothing looked at per message."""
    node = Node(filters=filters)
    dev = node.connect("dev")
    dev.receive_data(raw.publish("t/1", b"a"), NOW)
    node.broker.publish(Message("t/2", b"b", 2, False, "n0", 77, "moved", 6.0))
    node.broker.publish(Message("t/3", b"c", 1, False, "".join(["n", "1"]), 78, "stored", 7.0))  # (an equal copy)
    node.recorder.flush()
    records = [(c.origins, [r[1] for r in c.rows]) for c in node.chunks if not c.reads]
    if filters == ("#",):  # (t/1 came in a captured read)
        assert records == [([(0, "n0"), (1, "n1")], [77, 78])]
    else:
        assert records == [([(1, "n0"), (2, "n1")], [1, 77, 78])]


def test_a_closed_channel_ends_its_read_and_drops_it():
    node = Node()
    dev = with_will(node)
    dev.receive_data(raw.publish("t/1", b"a") + raw.DISCONNECT_BYTES + raw.publish("t/2", b"b"), NOW)
    assert dev.state is CLOSED
    assert dev._read is None
    # DISCONNECT discards the will [MQTT-3.14.4-3]; what came after it is not read
    # (the will's number, 1, was reserved at CONNECT: t/1 is 2)
    assert node.records() == ([read(raw.publish("t/1", b"a") + raw.DISCONNECT_BYTES, segments=[(0, 2)], count=1)], [])


# --------------------------------------------------------------------------- the delivery log


def test_every_session_gets_the_delivery_hook_from_the_factory_only_with_the_delivery_log():
    on = Node(delivery_log=True)
    hook = on.recorder.delivery_hook
    assert hook is not None and on.broker.archive.sent is hook
    factory = on.broker.session_factory
    assert factory.new("a", True, True).on_sent is hook
    assert factory.new("b", False, False).on_sent is hook
    assert factory.restored("c").on_sent is hook  # (sessions loaded from the store)
    off = Node()
    assert off.broker.archive.sent is None and off.broker.session_factory.new("a", True, True).on_sent is None
    assert Broker(BrokerSettings()).session_factory.new("a", True, True).on_sent is None  # no archive


@pytest.mark.parametrize("factory", ["plain", "replicated"])
def test_the_factories_hand_on_sent_to_every_kind_of_session(factory):
    def sent(*record):
        pass

    if factory == "plain":
        sessions = Sessions(Limits(), NULL_JOURNAL, None, on_sent=sent)
    else:
        sessions = ReplicaSessions(Limits(), NULL_JOURNAL, None, lambda *a: None, on_sent=sent)
    for session in (sessions.new("a", True, True), sessions.new("b", False, True), sessions.restored("c")):
        assert session.on_sent is sent


def test_deliveries_to_clients_are_logged_through_the_sessions():
    node = Node(delivery_log=True)
    sub = node.connect("s")
    sub.receive_data(raw.subscribe(1, ("t/#", 1)), 0.0)
    dev = node.connect("dev")
    dev.receive_data(raw.publish("t/1", b"a", 1, pid=1), NOW)
    node.recorder.flush()
    deliveries = [r for c in node.chunks if c.kind == "delivery" for r in c.rows]
    # (time from the recorder's clock, origin, seq, topic, published, client, qos, dup)
    assert deliveries == [(99.0, "n1", 1, "t/1", NOW, "s", 1, False)]


# --------------------------------------------------------------------------- the parts alone


def _calls(capture: ReadCapture, calls: str) -> None:
    """``calls``: m<seq> for message(seq), s for skip()."""
    for call in calls.split():
        capture.message(int(call[1:])) if call[0] == "m" else capture.skip()


@pytest.mark.parametrize(
    "calls, record",
    [
        ("m1 m2 m3", ([(0, 1)], (), 3)),
        ("m1 s m2", ([(0, 1), (2, 2)], [1], 3)),
        ("s m1 m2", ([(1, 1)], [0], 3)),
        ("m5 m7 m8", ([(0, 5), (1, 7)], (), 3)),
        ("m1 s s m4", ([(0, 1), (3, 4)], [1, 2], 4)),
        ("m1 m2 s", ([(0, 1)], [2], 3)),
        ("s", None),  # no message: no record
        ("s s", None),
        ("", None),  # no PUBLISH packet at all
    ],
)
def test_read_capture_bookkeeping(calls, record):
    got = []
    capture = ReadCapture(lambda *r: got.append(r), "dev")
    capture.keep.append(bytearray(b"bytes"))
    _calls(capture, calls)
    capture.end(7.0)
    assert got == ([] if record is None else [("dev", 7.0, [bytearray(b"bytes")], *record)])


def test_decoder_keeps_the_whole_packets_it_yielded_and_only_those():
    one, two = raw.publish("t/1", b"a"), raw.PINGREQ_BYTES
    third = raw.publish("t/3", b"c", 1, pid=4)
    decoder = Decoder()
    decoder.feed(one + two + third[:3])
    keep: list[bytearray] = []
    assert len(list(decoder.packets(keep))) == 2
    assert keep == [one + two]  # one piece per iteration, without the partial packet
    decoder.feed(third[3:])
    assert len(list(decoder.packets())) == 1  # (without a list nothing is kept)
    assert keep == [one + two]
    # an iteration stopped early keeps what it yielded
    decoder.feed(one + two)
    it = decoder.packets(keep)
    next(it)
    it.close()
    assert keep == [one + two, one]
    # a malformed packet: what came before it
    decoder = Decoder()
    decoder.feed(one + raw.packet(0x36, raw.s("t") + b"\x00\x01"))
    keep = []
    with pytest.raises(MalformedPacket):
        list(decoder.packets(keep))
    assert keep == [one]
