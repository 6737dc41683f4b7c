"""mqttmesh.flow: back-pressure that paces the publishers a congested session waits for to the
rate it drains (issue 20), local to them (issue 13), and bounded by progress, not by a
timer. Sessions and channels are plain stand-ins; time and progress are arguments. The
last tests drive real Channels and a real Broker: the hits a dispatch leaves must reach
the publisher's pause (between 86ada23 and issue 20 they were cleared before it, and no
publisher was ever held back)."""

from __future__ import annotations

from mqttmesh.flow import FRAME_BYTES, Congestion
from mqttmesh.session import Limits
from support import mqttraw
from support.frames import Net, publishes


class Pub:
    """A publisher as flow control sees it: a ports.Pausable, and nothing else."""

    def __init__(self, name: str):
        self.name = name
        self.paused = 0
        self.resumed = 0

    def pause_reading(self) -> None:
        self.paused += 1

    def resume_reading(self) -> None:
        self.resumed += 1

    @property
    def reading(self) -> bool:
        return self.paused == self.resumed

    def __repr__(self):
        return self.name


def publish(c: Congestion, pub: Pub, now: float, *sessions, size: int = 0) -> None:
    """What Channel._publish does for one message that reached ``sessions``."""
    hits = c.check(sessions)
    if hits:
        c.hold(pub, hits, now, size)


class Progress:
    """progress(session) for flow.Congestion: (acknowledged, bytes drained) per session."""

    def __init__(self):
        self.marks: dict = {}

    def __call__(self, session):
        return self.marks.get(session, (0, 0))

    def ack(self, session, n: int) -> None:
        acked, drained = self(session)
        self.marks[session] = (acked + n, drained)

    def drain(self, session, nbytes: int) -> None:
        acked, drained = self(session)
        self.marks[session] = (acked, drained + nbytes)


def test_publisher_waits_only_for_the_sessions_it_reached():
    c = Congestion(timeout=5, backpressure_timeout=1)
    slow, healthy = object(), object()
    a, b = Pub("a"), Pub("b")
    c.add(slow, "socket")
    publish(c, a, 0.0, slow, healthy)
    publish(c, b, 0.0, healthy)  # b publishes on another topic: never held back
    assert not a.reading and b.reading
    assert c.pauses == 1 and set(c.paused) == {a}


def test_clearing_one_session_resumes_only_its_publishers():
    c = Congestion(backpressure_timeout=10)
    s1, s2 = object(), object()
    a, b, d = Pub("a"), Pub("b"), Pub("d")
    c.add(s1, "queue")
    c.add(s2, "socket")
    publish(c, a, 0.0, s1)
    publish(c, b, 0.0, s2)
    publish(c, d, 0.0, s1, s2)
    c.remove(s1, "queue")
    assert a.reading and not b.reading and not d.reading
    c.remove(s2, "socket")
    assert b.reading and d.reading


def test_a_publisher_is_read_again_once_the_session_drained_what_it_sent():
    """Paced, not stopped: a session that stays congested but takes messages releases a
    publisher once it has taken as many as that publisher sent it while held."""
    c = Congestion(backpressure_timeout=1.0)
    s = object()
    a = Pub("a")
    progress = Progress()
    c.add(s, "queue")
    c.expire(0.0, progress)  # (the first look at its progress)
    for _ in range(10):  # one read of ten messages
        publish(c, a, 0.0, s)
    assert not a.reading and c.pauses == 1
    progress.ack(s, 6)
    assert c.expire(0.1, progress) == 0 and not a.reading
    progress.ack(s, 4)
    assert c.expire(0.2, progress) == 1 and a.reading
    assert c.paced == 1 and c.released == 0
    assert s in c.reasons  # still congested: the next message holds it again
    publish(c, a, 0.3, s)
    assert not a.reading and c.pauses == 2


def test_what_a_session_drains_is_shared_max_min_fairly():
    """A publisher that sends now and then (a canary) owes one message and is read again
    at the session's next progress; a flooder that owes a hundred waits for its share."""
    c = Congestion(backpressure_timeout=1.0)
    s = object()
    canary, flood = Pub("canary"), Pub("flood")
    progress = Progress()
    c.add(s, "queue")
    c.expire(0.0, progress)
    for _ in range(100):
        publish(c, flood, 0.0, s)
    publish(c, canary, 0.01, s)
    progress.ack(s, 2)  # two messages taken: one pays the canary, one goes to the flooder
    assert c.expire(0.1, progress) == 1
    assert canary.reading and not flood.reading
    progress.ack(s, 98)
    c.expire(0.2, progress)
    assert not flood.reading  # 1 + 98 of its 100
    progress.ack(s, 1)
    c.expire(0.3, progress)
    assert flood.reading


def test_equal_publishers_get_equal_shares():
    c = Congestion(backpressure_timeout=1.0)
    s = object()
    pubs = [Pub(f"p{i}") for i in range(4)]
    progress = Progress()
    c.add(s, "queue")
    c.expire(0.0, progress)
    for p in pubs:
        for _ in range(50):
            publish(c, p, 0.0, s)
    progress.ack(s, 196)  # 49 each: nobody is paid in full
    assert c.expire(0.1, progress) == 0
    progress.ack(s, 4)
    assert c.expire(0.2, progress) == 4 and all(p.reading for p in pubs)


def test_socket_progress_counts_bytes_at_the_size_of_the_messages_held():
    """A congested socket drains bytes: as many messages as those bytes hold, at the mean
    size of the messages its publishers sent it."""
    c = Congestion(backpressure_timeout=1.0)
    s = object()
    a = Pub("a")
    progress = Progress()
    c.add(s, "socket")
    c.expire(0.0, progress)
    for _ in range(10):
        publish(c, a, 0.0, s, size=1000)
    progress.drain(s, 9000)  # nine messages' worth
    c.expire(0.1, progress)
    assert not a.reading
    progress.drain(s, 1000)
    c.expire(0.2, progress)
    assert a.reading


def test_a_session_without_progress_for_the_bound_stalls_and_holds_no_one():
    c = Congestion(backpressure_timeout=1.0)
    stuck = object()
    a = Pub("a")
    progress = Progress()
    c.add(stuck, "socket")
    c.expire(10.0, progress)
    publish(c, a, 10.0, stuck)
    assert c.expire(10.5, progress) == 0 and not a.reading
    assert c.expire(11.0, progress) == 1 and a.reading
    assert c.released == 1 and stuck in c.stalled
    # still congested, but stalled: it holds nobody back any more, its own limits apply
    publish(c, a, 11.1, stuck)
    assert a.reading and c.pauses == 1


def test_the_bound_counts_from_the_last_progress():
    """A slow session that keeps taking messages never stalls: its publishers stay paced."""
    c = Congestion(backpressure_timeout=1.0)
    slow = object()
    a = Pub("a")
    progress = Progress()
    c.add(slow, "queue")
    c.expire(0.0, progress)
    for _ in range(100):
        publish(c, a, 0.0, slow)
    for step in range(1, 30):  # one message taken every 0.1 s for 3 s
        progress.ack(slow, 1)
        c.expire(step * 0.1, progress)
    assert not a.reading and slow not in c.stalled and c.released == 0


def test_a_stalled_session_that_progresses_again_holds_again():
    c = Congestion(backpressure_timeout=1.0)
    s = object()
    a = Pub("a")
    progress = Progress()
    c.add(s, "queue")
    c.expire(0.0, progress)
    c.expire(1.0, progress)
    assert s in c.stalled
    publish(c, a, 1.1, s)
    assert a.reading
    progress.ack(s, 1)
    c.expire(1.2, progress)
    assert s not in c.stalled
    publish(c, a, 1.3, s)
    assert not a.reading


def test_a_clear_session_starts_afresh():
    c = Congestion(backpressure_timeout=1.0)
    s = object()
    a = Pub("a")
    progress = Progress()
    c.add(s, "socket")
    c.expire(0.0, progress)
    c.expire(1.0, progress)
    assert s in c.stalled
    c.remove(s, "socket")
    assert s not in c.stalled and s not in c.held
    c.add(s, "socket")
    publish(c, a, 5.0, s)
    assert not a.reading


def test_zero_backpressure_timeout_never_pauses():
    c = Congestion(backpressure_timeout=0)
    s = object()
    a = Pub("a")
    c.add(s, "queue")
    publish(c, a, 0.0, s)
    assert a.reading and c.pauses == 0 and not c.paused and not c.held


def test_closed_publisher_is_forgotten_without_touching_its_socket():
    c = Congestion()
    s = object()
    a = Pub("a")
    c.add(s, "queue")
    publish(c, a, 0.0, s)
    c.unpause(a)  # (what a closing Channel does)
    assert not c.held[s].debts
    c.remove(s, "queue")
    assert a.resumed == 0 and not c.paused


def test_session_going_offline_releases_its_publishers():
    c = Congestion(backpressure_timeout=10)
    s = object()
    a = Pub("a")
    c.add(s, "socket")
    publish(c, a, 0.0, s)
    c.forget(s)
    assert a.reading and not c.reasons and not c.held


def test_hits_list_every_congested_session_reached_but_not_stalled_ones():
    c = Congestion(backpressure_timeout=1.0)
    s1, s2, s3 = object(), object(), object()
    for s in (s1, s2, s3):
        c.add(s, "queue")
    c.stalled.add(s3)
    hits = c.check([s1, object(), s2, s3])
    assert hits == [s1, s2]
    assert c.check([object(), s3]) == ()  # none: the shared empty answer, no list made
    c.hold(None, hits, 0.0)  # a message from no one who can be paused: the hits are dropped
    assert not c.paused and not c.held


def test_sweep_reports_sessions_without_progress_past_the_timeout():
    c = Congestion(timeout=5)
    moving, stuck = object(), object()
    c.add(moving, "socket")
    c.add(stuck, "socket")
    marks = {moving: 0, stuck: 0}
    assert c.sweep(0.0, marks.get) == []
    marks[moving] = 1
    assert c.sweep(5.0, marks.get) == [stuck]


def test_any_pausable_will_do():
    """Flow control only calls pause_reading()/resume_reading() (ports.Pausable): no owner,
    no state; a peer link we dialled is paused the same way as a client's Channel."""

    class Bare:
        __slots__ = ("calls",)

        def __init__(self):
            self.calls = []

        def pause_reading(self):
            self.calls.append("pause")

        def resume_reading(self):
            self.calls.append("resume")

    c = Congestion(backpressure_timeout=1.0)
    s = object()
    link = Bare()
    progress = Progress()
    c.add(s, "socket")
    c.expire(0.0, progress)
    publish(c, link, 0.0, s)
    publish(c, link, 0.1, s)  # already paused: not paused twice
    assert c.expire(1.0, progress) == 1
    assert link.calls == ["pause", "resume"]
    assert c.pauses == 1 and c.released == 1
    assert FRAME_BYTES > 0


# --------------------------------------------------------------------------- real Channels


def test_a_publisher_reaching_a_congested_subscriber_through_a_channel_is_paused():
    """The hits of the dispatch a Channel's PUBLISH caused reach ``hold``: the publisher's
    owner is asked to stop reading it, and to read it again once the subscriber took what
    it was sent while held."""
    net = Net(limits=Limits(max_inflight=1, max_queued=4))  # queue_high 2
    c = net.broker.congestion
    sub = net.subscriber("s", ("t", 1))
    pub = net.connect("p")
    for pid in (1, 2, 3):  # one in flight, two queued: the subscriber is congested
        pub.receive_data(mqttraw.publish("t", b"x", qos=1, pid=pid), 0.0)
    assert sub.session in c.reasons and net.owner.paused == []
    c.expire(0.0, lambda s: (s.acked, 0))
    pub.receive_data(mqttraw.publish("t", b"y", qos=1, pid=4), 0.1)
    assert net.owner.paused == [pub] and c.paused == {pub: {sub.session}}
    assert [p[5] for p in publishes(sub)] == [1]
    sub.receive_data(mqttraw.puback(1), 0.2)  # one taken: the one message "p" owes is paid
    c.expire(0.2, lambda s: (s.acked, 0))
    assert net.owner.resumed == [pub] and not c.paused


def test_a_publisher_on_an_unrelated_topic_is_not_paused_through_a_channel():
    net = Net(limits=Limits(max_inflight=1, max_queued=4))
    c = net.broker.congestion
    net.subscriber("s", ("t", 1))
    net.subscriber("o", ("other", 1))
    pub, other = net.connect("p"), net.connect("q")
    for pid in (1, 2, 3, 4):
        pub.receive_data(mqttraw.publish("t", b"x", qos=1, pid=pid), 0.0)
    other.receive_data(mqttraw.publish("other", b"x", qos=1, pid=1), 0.0)
    assert net.owner.paused == [pub] and list(c.paused) == [pub]


def test_a_peer_link_is_held_for_at_most_the_bound_even_while_the_session_progresses():
    """A link carries every other session's messages and the cluster's: pacing it to one
    slow session's speed would hold them all, so its wait is capped (``bounded``)."""
    c = Congestion(backpressure_timeout=1.0)
    slow = object()
    link, client = Pub("link"), Pub("client")
    progress = Progress()
    c.add(slow, "queue")
    c.expire(0.0, progress)
    for _ in range(100):
        c.hold(link, c.check([slow]), 0.0, bounded=True)
        c.hold(client, c.check([slow]), 0.0)
    for step in range(1, 10):  # one message taken every 0.1 s: progress, never a stall
        progress.ack(slow, 1)
        c.expire(step * 0.1, progress)
    assert not link.reading and not client.reading
    progress.ack(slow, 1)
    c.expire(1.0, progress)
    assert link.reading and not client.reading  # the link: past the bound; the client: paced
    assert c.released == 1 and not c.bounded and link not in c.held[slow].debts
