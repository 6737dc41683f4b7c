"""Fixtures every test directory shares: real broker processes on loopback.

The helpers behind them live in tests/support (``support.processes``); conftest
files hold fixtures and hooks only.
"""

from __future__ import annotations

import pytest

from support.processes import BrokerProcess


@pytest.fixture
def broker_factory(tmp_path):
    """Start brokers with extra command-line arguments; all are stopped at teardown."""
    started: list[BrokerProcess] = []

    def make(*args: str, name: str | None = None, start: bool = True) -> BrokerProcess:
        b = BrokerProcess(tmp_path, name or f"node{len(started) + 1}", list(args))
        started.append(b)
        return b.start() if start else b

    yield make
    for b in started:
        b.stop(timeout=5)


@pytest.fixture
def broker(broker_factory):
    """One in-memory broker with default settings."""
    return broker_factory()
