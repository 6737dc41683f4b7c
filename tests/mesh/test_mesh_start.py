"""A mesh that is starting serves its first clients (issue 22 point 8).

Three nodes are started and, at once, before anyone waits for the links, a persistent client
connects to each. A node still forming its links waits for them (up to claim_timeout) before
it decides; before, such a client was refused with CONNACK 0x03 in 2 of 6 tries.
"""

from __future__ import annotations

import pytest

from support.integration import Client, connack
from support.mesh import start_mesh
from support.processes import wait_for

pytestmark = [pytest.mark.process]


@pytest.mark.parametrize("attempt", range(4))
def test_persistent_clients_of_a_mesh_that_is_starting_are_served(broker_factory, attempt):
    names = ["a", "b", "c"]
    edges = [("b", "a"), ("c", "a"), ("c", "b")]
    nodes = start_mesh(broker_factory, names, edges, connect="all")
    codes = {}
    for name, node in reversed(nodes.items()):  # the node started last first: its links are youngest
        # as soon as the node accepts connections: no wait for the mesh
        c = wait_for(lambda node=node: _open(node), 10, what=f"{name} to accept connections")
        with c:
            present, rc = connack(c.connect(client_id=f"early-{name}-{attempt}", clean=False, keepalive=30))
            codes[name] = rc
    assert codes == {name: 0 for name in names}, codes


def _open(node):
    try:
        return Client(node.host, node.port, 5.0)
    except OSError:
        return None
