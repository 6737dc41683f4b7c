"""The held output queue of a Channel (channel_held.HeldFrames), on its own: frames held behind
a journal batch and a ticket of the session's gate leave in order; a deferred message is routed
as soon as the gate passed its ticket and the messages before it were routed, whatever the
frames ahead of it wait for, and what was held behind it waits for its routing's batch."""

from __future__ import annotations

from collections import deque
from types import SimpleNamespace
from typing import Any

from mqttmesh.channel_held import NO_FRAMES, NO_ROUTING, NOTHING_HELD, HeldFrames, held_in_order
from mqttmesh.message import Message


class Host(HeldFrames):
    """What HeldFrames uses of a Channel: the queue's state, a gate, the router."""

    __slots__ = ("broker", "owner", "session", "_out", "_held", "_deferred", "passed", "routes", "routed", "waited")

    def __init__(self, routes: dict[str, int]):
        self.broker: Any = SimpleNamespace(held_ack_channels={})
        self.owner: Any = SimpleNamespace(wake=lambda channel: None)
        self.passed = 0
        self.waited: list[int] = []  # the tickets the gate was told a frame waits for
        self.session: Any = SimpleNamespace(gate=SimpleNamespace(passed=lambda: self.passed, wait=self.waited.append))
        self._out = NO_FRAMES
        self._held = NOTHING_HELD
        self._deferred = NO_ROUTING
        self.routes = routes  # topic -> the journal batch its routing wrote
        self.routed: list[str] = []

    def _route(self, msg: Message) -> int:
        self.routed.append(msg.topic)
        return self.routes[msg.topic]

    def defer(self, topic: str, ticket: int) -> None:  # (channel_publish._route_after)
        self._defer(Message(topic, b"", 2, False, "n1", len(self.routed) + 1), ticket)

    def sent(self) -> list[bytes]:
        return list(self.data_to_send().split(b"|"))[:-1]


def test_frames_behind_a_routed_message_wait_for_its_batch_and_messages_for_their_ticket() -> None:
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
    host.release_acks(4, 0.0)  # m2 routed (batch 7), though a, ahead of it, waits for batch 5
    assert host.routed == ["m1", "m2"] and host.sent() == [] and not host._deferred
    host.release_acks(5, 0.0)  # a leaves; b and c wait for m2's batch
    assert host.sent() == [b"a"]
    host.release_acks(6, 0.0)
    assert host.sent() == []
    host.release_acks(7, 0.0)
    assert host.sent() == [b"b", b"c"] and not host._held


def test_a_window_of_deferred_messages_is_routed_at_once_and_acknowledged_with_one_commit() -> None:
    n = 300  # (a persistent publisher's window of QoS 2 messages, their steps agreed together)
    host = Host({f"m{i}": 10 if i < 200 else 11 for i in range(n)})  # (routed in two turns: a batch each)
    for i in range(n):
        host.defer(f"m{i}", 1 + i // 100)
        host.write(f"ack{i}|".encode())
    host.passed = 2
    host.release_acks(9, 0.0)
    assert host.routed == [f"m{i}" for i in range(200)] and host.sent() == []  # (in order; m200.. wait)
    host.release_acks(10, 0.0)
    assert host.sent() == [f"ack{i}".encode() for i in range(200)]
    host.passed = 3
    host.release_acks(10, 0.0)
    assert len(host.routed) == n and host.sent() == []
    host.release_acks(11, 0.0)
    assert host.sent() == [f"ack{i}".encode() for i in range(200, n)] and not host._held


def test_a_message_waits_for_the_one_deferred_before_it_even_if_its_own_ticket_passed() -> None:
    host = Host({"m1": 5, "m2": 6})
    host.defer("m1", 3)
    host._defer(Message("m2", b"", 1, False, "n1", 9), 0)  # (a QoS 1 one behind it: ticket 0)
    host.passed = 2
    host.release_acks(9, 0.0)
    assert host.routed == [] and len(host._deferred) == 2
    host.passed = 3
    host.release_acks(9, 0.0)
    assert host.routed == ["m1", "m2"]


def test_a_closed_connection_drops_its_deferred_messages_and_keeps_their_raise() -> None:
    host = Host({"m1": 5, "m2": 6})
    host.defer("m1", 1)
    host.write(b"a|")
    host.defer("m2", 2)
    host.write(b"b|")
    host.passed = 1
    host.release_acks(2, 0.0)  # m1 routed: the head (a) raised to batch 5; m2 waits for its ticket
    host._drop_deferred()
    assert [(b, v, f) for b, v, f in host._held] == [(5, 1, b"a|"), (5, 2, b"b|")] and not host._deferred
    host.passed = 2
    host.release_acks(5, 0.0)
    assert host.sent() == [b"a", b"b"] and host.routed == ["m1"]


def test_held_in_order_gives_each_entry_the_highest_batch_up_to_it() -> None:
    held = deque([(5, 1, b"x"), (2, 1, b"y"), (7, 2, b"z"), (6, 2, b"w")])
    assert list(held_in_order(held)) == [(5, 1, b"x"), (5, 1, b"y"), (7, 2, b"z"), (7, 2, b"w")]


def test_the_gate_hears_of_each_frame_that_waits_for_a_ticket_it_has_not_passed() -> None:
    host = Host({})
    host.passed = 2
    host._send_after(b"a|", 0, 2)  # (passed: written at once)
    host._send_after(b"b|", 3, 0)  # (waits for the store only)
    assert host.waited == [] and not host.waits_for_gate(2)
    host._send_after(b"c|", 0, 4)
    assert host.waited == [4] and host.waits_for_gate(3) and not host.waits_for_gate(4)
    host.defer("m1", 1)  # (behind c: it waits for 4 as well)
    assert host.waited == [4, 4]
