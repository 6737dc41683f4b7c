"""The SparkSession of a job: ``local[*]`` by default, any master with --master, or what
spark-submit configured."""

from __future__ import annotations

import os
import sys

__all__ = ["build_session"]


def build_session(app: str, master: str | None = None, shuffle_partitions: int | None = None, conf: dict | None = None):
    """A session for ``app``. Under spark-submit (``PYSPARK_GATEWAY_PORT`` is set) the master
    and resources come from spark-submit unless ``master`` is given."""
    from pyspark.sql import SparkSession

    # executors' Python workers must be this interpreter (the one with pyarrow), not `python3`
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.appName(app)
    if master:
        builder = builder.master(master)
    elif "PYSPARK_GATEWAY_PORT" not in os.environ:
        builder = builder.master("local[*]")
        master = "local[*]"
    if master and master.startswith("local"):
        # a local Spark's driver and block manager listen on loopback only (by default Spark
        # binds the address the host name resolves to, or the first non-loopback interface)
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    settings = {
        "spark.sql.session.timeZone": "UTC",  # windows and dates are UTC, as in the archive
        "spark.ui.showConsoleProgress": "false",
        # a job's shuffles and cached results are small (rollups): Spark's 200 shuffle
        # partitions are coalesced to what the data needs, cached ones too (measured, 1 M rows on
        # local[2]: traffic 116 s without these, 20 s with them)
        "spark.sql.adaptive.coalescePartitions.parallelismFirst": "false",
        "spark.sql.optimizer.canChangeCachedPlanOutputPartitioning": "true",
    }
    if shuffle_partitions:
        settings["spark.sql.shuffle.partitions"] = str(shuffle_partitions)
    settings.update(conf or {})
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(os.environ.get("MQTTMESH_SPARK_LOG_LEVEL", "ERROR"))
    return spark
