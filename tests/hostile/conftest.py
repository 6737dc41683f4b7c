"""Fixtures of the hostile suite: nodes under attack, registered so that their logs are checked.

``log_guard`` is autouse: after every test here, no node may have logged an unhandled
exception during it (support.hostile.REGISTRY).
"""

from __future__ import annotations

import pytest

from support.hostile import REGISTRY, node_factory


@pytest.fixture(autouse=True)
def log_guard():
    """After each test: no unhandled exception in what any node logged during it."""
    marks = REGISTRY.marks()
    yield
    problems = REGISTRY.problems_since(marks)
    if problems:
        pytest.fail("unhandled exceptions in the node logs:\n" + "\n".join(problems), pytrace=False)


@pytest.fixture
def nodes(tmp_path):
    """``nodes(*args, name=None, start=True)`` starts a node for this test (same signature
    as ``broker_factory``, so support.mesh helpers take it); all are stopped at
    teardown, and their logs checked by ``log_guard``."""
    make, started = node_factory(lambda: tmp_path, "node")
    yield make
    for b in started:
        b.stop(timeout=5)  # log_guard, set up before this fixture, checks what they wrote


@pytest.fixture(scope="module")
def module_nodes(tmp_path_factory):
    """Nodes shared by the tests of one module; their logs are checked after each test
    and once more after they stop."""
    d = tmp_path_factory.mktemp("hostile")
    make, started = node_factory(lambda: d, "shared")
    yield make
    marks = {id(b): REGISTRY.checked.get(id(b), 0) for b in started}
    for b in started:
        b.stop(timeout=5)
    problems = REGISTRY.problems_since(marks)
    for b in started:
        REGISTRY.remove(b)
    if problems:
        pytest.fail("unhandled exceptions in the node logs at shutdown:\n" + "\n".join(problems), pytrace=False)
