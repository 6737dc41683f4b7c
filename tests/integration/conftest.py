"""Fixtures of the black-box integration tests: raw clients and paho clients closed at teardown."""

from __future__ import annotations

import pytest

from support.integration import Client, Paho, open_client


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
def browser():
    """A headless Chromium (selenium), quit at teardown (with its chromedriver)."""
    from support.browser import chromium

    driver = chromium()
    try:
        yield driver
    finally:
        driver.quit()
