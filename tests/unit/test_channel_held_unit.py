"""The held output queue of a Channel (channel_held.HeldFrames), on its own: frames and messages
held behind a journal batch and a ticket of the session's gate leave in order, and what was
held behind a message routed when it reached the head waits for that message's batch."""

from __future__ import annotations

from collections import deque
from types import SimpleNamespace
from typing import Any

from mqttmesh.channel_held import NO_FRAMES, NOTHING_HELD, HeldFrames, held_in_order
from mqttmesh.message import Message


class Host(HeldFrames):
    """What HeldFrames uses of a Channel: the queue's state, a gate, the router."""

    __slots__ = ("broker", "owner", "session", "_out", "_held", "_deferred", "passed", "routes", "routed")

    def __init__(self, routes: dict[str, int]):
        self.broker: Any = SimpleNamespace(held_ack_channels={})
        self.owner: Any = SimpleNamespace(wake=lambda channel: None)
        self.passed = 0
        self.session: Any = SimpleNamespace(gate=SimpleNamespace(passed=lambda: self.passed))
        self._out = NO_FRAMES
        self._held = NOTHING_HELD
        self._deferred = 0
        self.routes = routes  # topic -> the journal batch its routing wrote
        self.routed: list[str] = []

    def _route(self, msg: Message) -> int:
        self.routed.append(msg.topic)
        return self.routes[msg.topic]

    def defer(self, topic: str, ticket: int) -> None:  # (channel_publish._route_after)
        self._hold(Message(topic, b"", 2, False, "n1", len(self.routed) + 1), 0, ticket)
        self._deferred += 1

    def sent(self) -> list[bytes]:
        return list(self.data_to_send().split(b"|"))[:-1]


def test_frames_behind_a_message_routed_at_the_head_wait_for_its_batch() -> None:
    host = Host({"m1": 5, "m2": 7})
    host.defer("m1", 1)
    host.write(b"a|")  # (m1's acknowledgement, say)
    host.defer("m2", 2)
    host.write(b"b|")
    host._send_after(b"c|", 3, 2)
    host.passed = 1
    host.release_acks(3, 0.0)  # the gate passed m1's ticket: m1 routed, writing batch 5
    assert host.routed == ["m1"] and host.sent() == []
    host.passed = 2
    host.release_acks(4, 0.0)  # batch 4 is not m1's 5: nothing behind m1 leaves
    assert host.routed == ["m1"] and host.sent() == []
    host.release_acks(5, 0.0)  # a leaves; m2 routed (batch 7): b and c wait for it
    assert host.routed == ["m1", "m2"] and host.sent() == [b"a"]
    host.release_acks(6, 0.0)
    assert host.sent() == []
    host.release_acks(7, 0.0)
    assert host.sent() == [b"b", b"c"] and not host._held and host._deferred == 0


def test_a_long_queue_of_deferred_messages_leaves_in_order_one_batch_at_a_time() -> None:
    n = 300
    host = Host({f"m{i}": 10 + i for i in range(n)})
    for i in range(n):
        host.defer(f"m{i}", 1)
        host.write(f"ack{i}|".encode())
    host.passed = 1
    for committed in range(9, 10 + n):
        host.release_acks(committed, 0.0)
        # routing m{i} wrote batch 10 + i: its acknowledgement leaves with that commit
        assert host.sent() == ([f"ack{committed - 10}".encode()] if committed >= 10 else [])
        assert len(host.routed) == min(n, committed - 8)
    assert not host._held


def test_a_closed_connection_drops_its_deferred_messages_and_keeps_their_raise() -> None:
    host = Host({"m1": 5, "m2": 6})
    host.defer("m1", 1)
    host.write(b"a|")
    host.defer("m2", 1)
    host.write(b"b|")
    host.passed = 1
    host.release_acks(2, 0.0)  # m1 routed: the head (a) raised to batch 5
    host._drop_deferred()
    assert [(b, f) for b, _, f in host._held] == [(5, b"a|"), (5, b"b|")] and host._deferred == 0
    host.release_acks(5, 0.0)
    assert host.sent() == [b"a", b"b"]


def test_held_in_order_gives_each_entry_the_highest_batch_up_to_it() -> None:
    held = deque([(5, 1, b"x"), (2, 1, b"y"), (7, 2, b"z"), (6, 2, b"w")])
    assert list(held_in_order(held)) == [(5, 1, b"x"), (5, 1, b"y"), (7, 2, b"z"), (7, 2, b"w")]
