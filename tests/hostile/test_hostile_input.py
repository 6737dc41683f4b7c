"""Hostile input on one node: malformed, random and trickled bytes, huge legal inputs, many
connections, and fixed headers that can never start a valid packet.

Each attack runs with the canary (tests/support/attacks.py): a QoS 1 round trip every
100 ms before, during and after it, each within 2 s.
"""

from __future__ import annotations

import random

import pytest

from support import attacks
from support.hostile import check, run, target_of

pytestmark = [pytest.mark.hostile, pytest.mark.process]

CONNECT_TIMEOUT = 2.0


@pytest.fixture(scope="module")
def node(module_nodes):
    """One node for the attacks that leave nothing behind (--connect-timeout 2)."""
    b = module_nodes("--connect-timeout", str(CONNECT_TIMEOUT), name="input")
    return b


@pytest.fixture
def target(node):
    return target_of(node, connect_timeout=CONNECT_TIMEOUT)


def test_malformed_packets_close_only_their_connection(target):
    """Packets that break the standard ([MQTT-3.1.2-3], [MQTT-3.1.3-4], [MQTT-3.3.2-2],
    [MQTT-3.8.3-3], [MQTT-4.8.0-1], ...), before and after CONNECT: each connection is
    closed without an answer; the node's sockets come back to what they were."""
    check(run(target, attacks.malformed_packets))


def test_random_bytes_at_and_after_connect(target):
    """Seeded random byte strings, at connect and after a valid CONNECT."""
    seed = random.randrange(1 << 32)
    print(f"seed {seed}")
    check(run(target, attacks.random_bytes, random.Random(seed)))


def test_slowloris_is_closed_by_the_connect_timeout(target):
    """40 sockets trickle a CONNECT one byte every 0.5 s: each is closed by the connect
    timeout (2 s, + 1.5 s margin) and the canary does not notice."""
    check(run(target, attacks.slowloris))


def test_huge_legal_inputs(target):
    """A PUBLISH of exactly the packet-size limit, 5,000 subscriptions on one client and a
    65,000-byte topic [MQTT-1.5.3-1 allows 65,535 bytes] all work, with the canary fine."""
    check(run(target, attacks.huge_inputs))


def test_2000_connections_cost_little_memory(nodes):
    """2,000 connected clients: the RSS per connection stays small (about 4 kB today; the
    bound is a generous 50 kB)."""
    b = nodes()
    outcome = run(target_of(b), attacks.many_connections, n=2000, max_kb=50.0)
    check(outcome)


def test_bad_first_byte_or_reserved_flags_close_at_once(nodes):
    """A first packet that is not a CONNECT [MQTT-3.1.0-1], or a fixed header with wrong
    reserved flags [MQTT-2.2.2-2] (before or after CONNECT), announcing 500,000 bytes: the
    node closes the connection within 1 s, without waiting for the body, the connect
    timeout (10 s) or the keepalive (60 s)."""
    b = nodes("--connect-timeout", "10")
    check(run(target_of(b, connect_timeout=10.0), attacks.bad_first_bytes, limit=1.0))
