"""Fixtures every test directory shares (real broker processes on loopback), and the
collection hook that checks every test carries the markers of what it starts.

The helpers behind them live in tests/support (``support.processes``,
``support.markers``); conftest files hold fixtures and hooks only.
"""

from __future__ import annotations

import os

import pytest

from support import schedule
from support.markers import refuse_unmarked, skip_missing_tools
from support.processes import BrokerProcess

# the pipeline's commands in the tests start Spark without a class data archive: a JVM that
# makes one writes it for seconds after its command ended (pipeline/session.py class_archive;
# tests/pipeline/test_session_cds.py checks that logic)
os.environ.setdefault("MQTTMESH_SPARK_CDS", "off")

pytest_plugins = ("pytester",)  # tests/test_markers.py runs the hook below on small suites of its own


@pytest.hookimpl(tryfirst=True)  # before -m deselects anything: every collected test is checked
def pytest_collection_modifyitems(items):
    refuse_unmarked(items)
    skip_missing_tools(items)  # (named, never failed: scripts/system-deps installs them)
    schedule.costliest_first(items, schedule.load_costs())  # make test's workers start the long modules first


@pytest.hookimpl(optionalhook=True)  # (a hook of pytest-xdist: absent when it is not installed)
def pytest_xdist_make_scheduler(config, log):
    return schedule.spark_together(config, log)  # the Spark modules in one worker, one JVM


def pytest_addoption(parser):
    schedule.add_option(parser)


def pytest_configure(config):
    schedule.register_recorder(config)


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


@pytest.fixture
def browser():
    """A headless Chromium (selenium), quit at teardown (with its chromedriver)."""
    from support.browser import chromium

    driver = chromium()
    try:
        yield driver
    finally:
        driver.quit()
