"""A node flooded by publishers handles their input a slice per turn of its loop (issue 20).

``limits.read_slice`` bounds the clients' input one turn of the event loop handles: what was
read beyond waits, in order, for a later turn, with reading that client paused. Under load a
turn took 1.4 s on two nodes with 50 persistent subscribers each (make bench,
p2p-persistent): the cluster took the gap between its ticks for a pause, closed every
persistent client and refused them (0x03) for 3 s. These tests make the slice tiny so that
nearly every large read waits, and check that nothing waiting is lost, reordered or left
behind, across nodes and for persistent sessions.
"""

from __future__ import annotations

import threading

import pytest

from support import mqttraw as raw
from support.mesh import Subscriber, start_mesh, wait_converged, wait_interest
from support.processes import wait_for

pytestmark = pytest.mark.process

PUBLISHERS = 3
MESSAGES = 3000  # per publisher, sent in bursts of BURST without waiting for acknowledgements
BURST = 250


def _reads_waited(node) -> int:
    """The node's ``$SYS/broker/load/reads_waited`` (published every --sys-interval)."""
    with raw.RawClient(node.host, node.port) as c:
        c.connect(client_id="sys-reader")
        c.send(raw.subscribe(1, ("$SYS/broker/load/reads_waited", 0)))
        c.expect(raw.SUBACK)
        return int(c.expect(raw.PUBLISH).payload)


def _flood(node, index: int, acked: dict[int, int], errors: list[str]) -> None:
    """One publisher: MESSAGES QoS 1 messages numbered in their payload, written BURST at a
    time (large reads at the node), every PUBACK counted."""
    try:
        with raw.RawClient(node.host, node.port, timeout=30.0) as c:
            c.connect(client_id=f"flood-{index}")
            seq = 0
            while seq < MESSAGES:
                burst = b"".join(
                    raw.publish(f"flood/{index}", str(seq + k).encode(), 1, pid=(seq + k) % 65535 + 1)
                    for k in range(min(BURST, MESSAGES - seq))
                )
                c.send(burst)
                for _ in range(min(BURST, MESSAGES - seq)):
                    c.expect(raw.PUBACK)
                    acked[index] = acked.get(index, 0) + 1
                seq += BURST
            c.send(raw.DISCONNECT_BYTES)
    except (OSError, AssertionError, TimeoutError) as exc:  # reported by the test, not lost
        errors.append(f"publisher {index}: {exc!r}")


def test_every_waiting_read_is_handled_in_order_across_nodes_and_persistent_sessions(broker_factory):
    nodes = start_mesh(
        broker_factory, ["a", "b"], [("a", "b")], extra=["--read-slice", "0.001", "--sys-interval", "0.2"]
    )
    wait_converged(nodes, [("a", "b")])
    far = Subscriber(nodes["b"], "far-persistent", "flood/#", qos=1, clean=False)
    near = Subscriber(nodes["a"], "near", "flood/#", qos=1)
    try:
        wait_interest(nodes, "flood/#", "b")
        acked: dict[int, int] = {}
        errors: list[str] = []
        threads = [threading.Thread(target=_flood, args=(nodes["a"], i, acked, errors)) for i in range(PUBLISHERS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not errors and acked == {i: MESSAGES for i in range(PUBLISHERS)}
        for sub in (near, far):
            sub.wait_count(PUBLISHERS * MESSAGES, timeout=60)
            with sub.lock:
                got = [(topic, int(payload)) for topic, payload, _q, dup in sub.received if not dup]
            for i in range(PUBLISHERS):
                seqs = [s for topic, s in got if topic == f"flood/{i}"]
                assert seqs == list(range(MESSAGES)), (
                    f"flood/{i}: {len(seqs)} messages, in order: {seqs == sorted(seqs)}"
                )
        # the slice was spent and reads waited: the path under test ran
        wait_for(lambda: _reads_waited(nodes["a"]) > 0, 10, what="reads that waited")
        for node in nodes.values():
            assert "majority" not in node.log()
    finally:
        near.close()
        far.close()
