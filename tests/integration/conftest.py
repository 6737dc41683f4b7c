"""Fixtures of the black-box integration tests: raw clients and paho clients closed at teardown."""

from __future__ import annotations

import pytest

from support.integration import Client, Paho, open_client
from support.mesh import start_mesh, wait_converged
from support.paho5 import Paho5


@pytest.fixture
def clients():
    """``clients(broker, client_id, ...)`` opens raw clients; all are closed at teardown."""
    opened: list[Client] = []

    def make(broker, client_id="c", clean=True, **kw) -> Client:
        c = open_client(broker, client_id, clean, **kw)
        opened.append(c)
        return c

    def raw(broker, timeout=5.0, source=None) -> Client:
        c = Client(broker.host, broker.port, timeout, source)
        opened.append(c)
        return c

    make.raw = raw
    yield make
    for c in opened:
        c.close()


@pytest.fixture
def paho():
    """``paho(client_id)`` makes a Paho client; every one is disconnected at teardown."""
    made: list[Paho] = []

    def make(client_id: str, **kw) -> Paho:
        p = Paho(client_id, **kw)
        made.append(p)
        return p

    yield make
    for p in made:
        p.stop()


@pytest.fixture
def paho5():
    """``paho5(client_id, websocket=False)`` makes paho MQTT 5 clients; all are stopped at teardown."""
    made: list[Paho5] = []

    def make(client_id: str, websocket: bool = False) -> Paho5:
        p = Paho5(client_id, websocket)
        made.append(p)
        return p

    yield make
    for p in made:
        p.stop()


@pytest.fixture
def mesh(broker_factory):
    """Three nodes in a line, c - b - a: what c takes crosses b to reach a (a module that
    needs another shape defines its own ``mesh``)."""
    names = ["a", "b", "c"]
    edges = [("b", "a"), ("c", "b")]
    nodes = start_mesh(broker_factory, names, edges)
    wait_converged(nodes, edges)
    return nodes
