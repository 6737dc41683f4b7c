"""mqttmesh.server.deadlines.Deadlines: the connections' deadlines on one timer of the loop,
with a loop whose clock the test moves (no real timers)."""

from __future__ import annotations

import logging

from mqttmesh.server.deadlines import COMPACT_AT, Deadlines


class Handle:
    def __init__(self, loop, when, callback):
        self.loop, self.when, self.callback = loop, when, callback
        self.cancelled = False

    def cancel(self):
        self.cancelled = True


class Loop:
    """call_at and time, as the Deadlines use them; ``run_until`` fires what is due, in order."""

    def __init__(self):
        self.now = 0.0
        self.handles: list[Handle] = []

    def time(self):
        return self.now

    def call_at(self, when, callback):
        handle = Handle(self, when, callback)
        self.handles.append(handle)
        return handle

    def pending(self):
        return sorted(h.when for h in self.handles if not h.cancelled)

    def run_until(self, t):
        while True:
            due = [h for h in self.handles if not h.cancelled and h.when <= t]
            if not due:
                break
            first = min(due, key=lambda h: h.when)
            self.handles.remove(first)
            self.now = max(self.now, first.when)
            first.callback()
        self.now = t


class Target:
    def __init__(self, name, calls, then=None):
        self.name, self.calls, self.then = name, calls, then

    def on_deadline(self):
        self.calls.append((self.name, self.calls_now()))
        if self.then is not None:
            self.then(self)

    def calls_now(self):
        return LOOP.now


LOOP = Loop()


def fresh():
    global LOOP
    LOOP = Loop()
    return LOOP, Deadlines(LOOP), []


def test_called_at_their_times_in_deadline_order_ties_first_added_first():
    loop, deadlines, calls = fresh()
    deadlines.add(5.0, Target("c", calls))
    deadlines.add(2.0, Target("a", calls))
    deadlines.add(5.0, Target("d", calls))
    deadlines.add(3.0, Target("b", calls))
    assert loop.pending() == [2.0]  # one loop timer, at the earliest
    loop.run_until(4.0)
    assert calls == [("a", 2.0), ("b", 3.0)]
    assert loop.pending() == [5.0]
    loop.run_until(10.0)
    assert calls == [("a", 2.0), ("b", 3.0), ("c", 5.0), ("d", 5.0)]
    assert loop.pending() == []
    assert len(deadlines) == 0


def test_an_earlier_deadline_moves_the_loop_timer():
    loop, deadlines, calls = fresh()
    deadlines.add(10.0, Target("late", calls))
    deadlines.add(1.0, Target("early", calls))
    assert loop.pending() == [1.0]
    loop.run_until(1.0)
    assert calls == [("early", 1.0)]
    assert loop.pending() == [10.0]


def test_a_cancelled_deadline_is_not_called_and_lets_go_of_its_target():
    loop, deadlines, calls = fresh()
    target = Target("x", calls)
    entry = deadlines.add(1.0, target)
    deadlines.add(2.0, Target("y", calls))
    deadlines.cancel(entry)
    deadlines.cancel(entry)  # (twice: nothing more)
    assert entry[2] is None
    assert len(deadlines) == 1
    loop.run_until(5.0)
    assert calls == [("y", 2.0)]
    assert len(deadlines) == 0


def test_a_timer_that_fires_early_calls_nothing_and_waits_again():
    loop, deadlines, calls = fresh()
    deadlines.add(3.0, Target("x", calls))
    (handle,) = loop.handles
    loop.handles.remove(handle)
    loop.now = 2.999  # (a loop timer's precision is a millisecond)
    handle.callback()
    assert calls == []
    assert loop.pending() == [3.0]
    loop.run_until(3.0)
    assert calls == [("x", 3.0)]


def test_a_target_arms_its_next_deadline_when_called():
    loop, deadlines, calls = fresh()

    def again(target):
        if sum(1 for name, _ in calls if name == "k") < 3:
            deadlines.add(loop.now + 1.5, target)

    deadlines.add(1.0, Target("k", calls, then=again))
    deadlines.add(2.0, Target("other", calls))
    loop.run_until(10.0)
    assert calls == [("k", 1.0), ("other", 2.0), ("k", 2.5), ("k", 4.0)]
    assert loop.pending() == []


def test_one_called_may_cancel_another_due_at_the_same_time():
    loop, deadlines, calls = fresh()
    second = Target("second", calls)
    entries = {}

    def cancel_second(_):
        deadlines.cancel(entries["second"])

    deadlines.add(1.0, Target("first", calls, then=cancel_second))
    entries["second"] = deadlines.add(1.0, second)
    deadlines.add(3.0, Target("third", calls))
    loop.run_until(1.0)
    assert calls == [("first", 1.0)]
    assert len(deadlines) == 1  # (the second was due: it is not counted as cancelled in the heap)
    loop.run_until(5.0)
    assert calls == [("first", 1.0), ("third", 3.0)]
    assert len(deadlines) == 0


def test_a_failing_target_does_not_stop_the_others(caplog):
    loop, deadlines, calls = fresh()

    def fail(_):
        raise RuntimeError("boom")

    deadlines.add(1.0, Target("bad", calls, then=fail))
    deadlines.add(1.0, Target("good", calls))
    deadlines.add(2.0, Target("later", calls))
    with caplog.at_level(logging.ERROR, logger="mqttmesh.connection"):
        loop.run_until(5.0)
    assert calls == [("bad", 1.0), ("good", 1.0), ("later", 2.0)]
    assert "deadline failed" in caplog.text


def test_cancelled_entries_are_dropped_once_they_are_a_fifth_of_the_heap():
    loop, deadlines, calls = fresh()
    live = [deadlines.add(100.0 + i, Target(f"live{i}", calls)) for i in range(10)]
    dead = [deadlines.add(50.0 + i, Target(f"dead{i}", calls)) for i in range(COMPACT_AT + 10)]
    for entry in dead:
        deadlines.cancel(entry)
    assert len(deadlines) == 10
    assert len(deadlines._heap) < COMPACT_AT  # (compacted on the way)
    loop.run_until(1000.0)
    assert calls == [(f"live{i}", 100.0 + i) for i in range(10)]
    assert all(entry[2] is None for entry in live)


def test_with_many_live_deadlines_the_cancelled_stay_a_small_part_of_the_heap():
    # (every connect cancels its connect timeout's entry and adds its keepalive's)
    loop, deadlines, calls = fresh()
    for i in range(5000):
        first = deadlines.add(10.0 + i / 1000, Target(f"c{i}", calls))
        deadlines.cancel(first)
        deadlines.add(90.0 + i / 1000, Target(f"k{i}", calls))
        dead = len(deadlines._heap) - len(deadlines)
        assert dead < COMPACT_AT or dead * 5 <= len(deadlines._heap)
    assert len(deadlines) == 5000
    loop.run_until(200.0)
    assert [name for name, _ in calls] == [f"k{i}" for i in range(5000)]


def test_close_cancels_the_loop_timer():
    loop, deadlines, calls = fresh()
    deadlines.add(1.0, Target("x", calls))
    deadlines.close()
    loop.run_until(5.0)
    assert calls == []
