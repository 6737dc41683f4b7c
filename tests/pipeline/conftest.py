"""Fixtures of the pipeline tests: one local SparkSession for the whole run, archive helpers.

The session is ``local[2]`` with two shuffle partitions and no UI: the inputs are a
handful of rows, so Spark's defaults (200 partitions) would only add scheduling time.
"""

from __future__ import annotations

import datetime as dt
import importlib.util
import os
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(TESTS))
sys.path.insert(0, str(TESTS / "mesh"))

# This file is also imported as `conftest`, which shadows tests/conftest.py for the helpers that
# do `from conftest import wait_for, free_port` (tests/mesh/meshutil.py): give them the same ones.
_spec = importlib.util.spec_from_file_location("mqttmesh_tests_top_conftest", TESTS / "conftest.py")
_top = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_top)
wait_for = _top.wait_for
free_port = _top.free_port

pyspark = pytest.importorskip("pyspark", reason="the pipeline tests need pyspark (pip install '.[test]')")

UTC = dt.timezone.utc


def ts(text: str) -> dt.datetime:
    """An aware UTC datetime from 'HH:MM:SS[.ffffff]' on 2026-01-31, or a full ISO string."""
    if "T" not in text and "-" not in text:
        text = "2026-01-31T" + text
    t = dt.datetime.fromisoformat(text)
    return t if t.tzinfo else t.replace(tzinfo=UTC)


@pytest.fixture(scope="session")
def spark():
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    session = (
        SparkSession.builder.master("local[2]")
        .appName("mqttmesh-tests")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.memory", "1g")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()
