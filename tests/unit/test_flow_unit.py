"""mqttmesh.flow: back-pressure that is local to the publishers a congested session waits
for, and bounded in time (issue 13). Sessions and channels are plain stand-ins; time is
an argument."""

from __future__ import annotations

from mqttmesh.flow import Congestion


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


def publish(c: Congestion, pub: Pub, now: float, *sessions) -> None:
    """What Channel._publish does for one message that reached ``sessions``."""
    c.hit = False
    c.check(sessions)
    if c.hit:
        c.pause(pub, now)


def test_publisher_waits_only_for_the_sessions_it_reached():
    c = Congestion(timeout=5, backpressure_timeout=1)
    slow, healthy = object(), object()
    a, b = Pub("a"), Pub("b")
    c.add(slow, "socket")
    publish(c, a, 0.0, slow, healthy)
    publish(c, b, 0.0, healthy)  # b publishes on another topic: never held back
    assert not a.reading and b.reading
    assert c.pauses == 1


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
    # today's code resumed publishers only once *no* session anywhere was congested
    assert a.reading and not b.reading and not d.reading
    c.remove(s2, "socket")
    assert b.reading and d.reading


def test_a_publisher_is_held_back_at_most_backpressure_timeout():
    c = Congestion(backpressure_timeout=1.0)
    stuck = object()
    a = Pub("a")
    c.add(stuck, "socket")
    publish(c, a, 10.0, stuck)
    assert c.expire(10.5) == 0 and not a.reading
    assert c.expire(11.0) == 1 and a.reading
    assert c.released == 1
    # still congested, but past the bound: it holds nobody back any more
    publish(c, a, 11.1, stuck)
    assert a.reading and c.pauses == 1
    assert stuck in c.overrun


def test_bound_counts_from_when_the_session_first_held_someone_back():
    c = Congestion(backpressure_timeout=1.0)
    stuck = object()
    a, b = Pub("a"), Pub("b")
    c.add(stuck, "queue")
    publish(c, a, 0.0, stuck)
    publish(c, b, 0.8, stuck)  # b waits only the 0.2 s left of the bound
    c.expire(1.0)
    assert a.reading and b.reading


def test_a_clear_session_starts_a_new_bound():
    c = Congestion(backpressure_timeout=1.0)
    s = object()
    a = Pub("a")
    c.add(s, "socket")
    publish(c, a, 0.0, s)
    c.expire(1.0)
    assert s in c.overrun
    c.remove(s, "socket")
    assert s not in c.overrun
    c.add(s, "socket")
    publish(c, a, 5.0, s)
    assert not a.reading


def test_zero_backpressure_timeout_never_pauses():
    c = Congestion(backpressure_timeout=0)
    s = object()
    a = Pub("a")
    c.add(s, "queue")
    publish(c, a, 0.0, s)
    assert a.reading and c.pauses == 0 and not c.paused


def test_closed_publisher_is_forgotten_without_touching_its_socket():
    c = Congestion()
    s = object()
    a = Pub("a")
    c.add(s, "queue")
    publish(c, a, 0.0, s)
    c.unpause(a)  # (what a closing Channel does)
    c.remove(s, "queue")
    assert a.resumed == 0 and not c.paused and not c.waiting


def test_session_going_offline_releases_its_publishers():
    c = Congestion(backpressure_timeout=10)
    s = object()
    a = Pub("a")
    c.add(s, "socket")
    publish(c, a, 0.0, s)
    c.forget(s)
    assert a.reading and not c.reasons and not c.holding


def test_hit_lists_every_congested_session_reached_but_not_overrun_ones():
    c = Congestion(backpressure_timeout=1.0)
    s1, s2, s3 = object(), object(), object()
    for s in (s1, s2, s3):
        c.add(s, "queue")
    c.overrun.add(s3)
    c.hit = False
    c.check([s1, object(), s2, s3])
    assert c.hit and c.hit_sessions == [s1, s2]


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
    c.add(s, "socket")
    publish(c, link, 0.0, s)
    publish(c, link, 0.1, s)  # already paused: not paused twice
    assert c.expire(1.0) == 1
    assert link.calls == ["pause", "resume"]
    assert c.pauses == 1 and c.released == 1
