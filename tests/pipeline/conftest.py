"""Fixtures of the pipeline tests: one local SparkSession for the whole run (helpers: support.pipeline).

The session is ``local[2]`` with two shuffle partitions and no UI: the inputs are a
handful of rows, so Spark's defaults (200 partitions) would only add scheduling time.
"""

from __future__ import annotations

import os
import sys

import pytest

pyspark = pytest.importorskip("pyspark", reason="the pipeline tests need pyspark (pip install '.[test]')")


@pytest.fixture(scope="session")
def spark():
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # (loopback only, as every network test)
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
