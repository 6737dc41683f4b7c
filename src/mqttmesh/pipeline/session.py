"""The SparkSession of a job: ``local[*]`` by default, any master with --master, or what
spark-submit configured."""

from __future__ import annotations

import glob
import hashlib
import os
import shutil
import sys
import time

__all__ = ["build_session", "class_archive", "quick_jit", "archive_bytes"]

# where the driver JVM's class data archive is kept (JDK class data sharing: the classes Spark
# loads at start, mapped from one file instead of read from its jars and verified, one by one);
# MQTTMESH_SPARK_CDS=off turns it off
CDS_DIR = os.path.join(os.path.expanduser("~"), ".cache", "mqttmesh")
# seconds an archive's file has not changed before it is taken for whole (its JVM writes it
# as it exits, after the Python process that named it)
CDS_SETTLED = 20.0
# the JVM's own log: errors only (making or mapping an archive warns of every class it skips)
QUIET = "-Xlog:disable -Xlog:all=error:stderr"


def class_archive(java_version: str | None = None, cache: str | None = None) -> str | None:
    """The JVM option that maps the driver's class data archive, or makes it: a first run
    writes ``spark-cds-KEY.jsa.tmp-PID`` as its JVM exits (KEY: ``java_version``, by default the
    Java binary's place, size and time, and PySpark's version and place), a later one names
    the finished file ``spark-cds-KEY.jsa`` (once its writer is gone) and maps it. Measured,
    1 M rows on local[2]: the session starts in 2.9-4.1 s instead of 6.2-6.7 s; the archive is
    about 180 MB. None when turned off or Java is missing."""
    if os.environ.get("MQTTMESH_SPARK_CDS", "on").lower() in ("off", "0", "no", "false"):
        return None
    import pyspark

    if java_version is None:
        # (the Java binary's place, size and time: another Java, or the same upgraded, differs)
        home = os.environ.get("JAVA_HOME")
        java = os.path.join(home, "bin", "java") if home else shutil.which("java")
        try:
            st = os.stat(os.path.realpath(java or ""))
        except OSError:
            return None
        java_version = f"{os.path.realpath(java or '')}|{st.st_size}|{st.st_mtime_ns}"
    key = hashlib.sha256(f"{java_version}|{pyspark.__version__}|{pyspark.__file__}".encode()).hexdigest()[:16]
    cache = cache or os.environ.get("MQTTMESH_SPARK_CDS_DIR", CDS_DIR)
    final = os.path.join(cache, f"spark-cds-{key}.jsa")
    if not os.path.exists(final):
        for tmp in glob.glob(final + ".tmp-*"):
            pid = tmp.rsplit("-", 1)[-1]
            try:
                settled = time.time() - os.path.getmtime(tmp) > CDS_SETTLED and os.path.getsize(tmp) > 0
            except OSError:
                continue
            if pid.isdigit() and not os.path.exists(f"/proc/{pid}") and settled:
                os.replace(tmp, final)  # (its run ended, and its JVM, which wrote it at exit)
                break
    if os.path.exists(final):
        return f"-XX:SharedArchiveFile={final} {QUIET}"
    try:
        os.makedirs(cache, exist_ok=True)
    except OSError:
        return None
    if glob.glob(final + ".tmp-*"):
        return None  # (another run is making it)
    # (the JVM writes it at exit; the Python process's PID names it, the JVM being its child)
    return f"-XX:ArchiveClassesAtExit={final}.tmp-{os.getpid()} {QUIET}"


# a local job over less than this many bytes of archive compiles with the JVM's quick compiler
# only (C1): its run is too short for the optimising one (C2) to pay back its compiling
QUICK_JIT_BYTES = 64 << 20
QUICK_JIT = "-XX:TieredStopAtLevel=1"


def quick_jit(input_bytes: int | None) -> bool:
    """Whether a local job over ``input_bytes`` of archive (None: unknown) takes the quick
    compiler only. Measured on local[2], CPU of the whole run (JVM and Python workers), C1 only
    against the tiered compilers: 1 M rows (13 MB), payloads 21-22 s instead of 32-35; 10 M rows
    (129 MB), even (traffic 28 and 22 s against 30 and 38, payloads 70 and 67 against 70 and
    73); 100 M rows (1.3 GB), traffic 147 s instead of 69 and payloads 480 instead of 305 (C2's
    code is that much faster on long loops). ``MQTTMESH_SPARK_JIT`` = quick, full or auto (the
    default: by size) decides otherwise."""
    mode = os.environ.get("MQTTMESH_SPARK_JIT", "auto").lower()
    if mode == "quick":
        return True
    if mode == "full" or input_bytes is None:
        return False
    return input_bytes < QUICK_JIT_BYTES


def archive_bytes(roots: list[str], kinds: tuple[str, ...], since=None, until=None) -> int | None:
    """The bytes of the Parquet files a job reads of the ``kinds`` logs of local archive
    ``roots``: those of the ``date=``/``hour=`` folders that may hold rows in [since, until),
    as ``extract.list_files`` prunes them (a Delta log's files not yet vacuumed too: an
    estimate); None when a root is a URI."""
    from .extract import list_files

    total = 0
    for root in roots:
        if "://" in root and not root.startswith("file://"):
            return None
        for kind in kinds:
            for path in list_files([root], kind, since, until):
                try:
                    total += os.path.getsize(path)
                except OSError:
                    pass
    return total


def driver_options(master: str | None, input_bytes: int | None) -> str:
    """The JVM options of a driver this process starts: the class data archive, and for a local
    master the quick compiler when ``quick_jit`` says (on a cluster the executors' JVMs do the
    work, and they are the cluster's)."""
    options = [class_archive() or ""]
    if master and master.startswith("local") and quick_jit(input_bytes):
        options.append(QUICK_JIT)
    return " ".join(o for o in options if o)


def build_session(
    app: str,
    master: str | None = None,
    shuffle_partitions: int | None = None,
    conf: dict | None = None,
    input_bytes: int | None = None,
):
    """A session for ``app``. Under spark-submit (``PYSPARK_GATEWAY_PORT`` is set) the master
    and resources come from spark-submit unless ``master`` is given. ``input_bytes``: how much
    archive the job reads, if known (``quick_jit``)."""
    from pyspark.sql import SparkSession

    # executors' Python workers must be this interpreter (the one with pyarrow), not `python3`
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = SparkSession.builder.appName(app)
    if master:
        builder = builder.master(master)
    elif "PYSPARK_GATEWAY_PORT" not in os.environ:
        builder = builder.master("local[*]")
        master = "local[*]"
    if "PYSPARK_GATEWAY_PORT" not in os.environ:  # (this process starts the driver's JVM)
        option = driver_options(master, input_bytes)
        if option:
            extra = (conf or {}).get("spark.driver.extraJavaOptions", "")
            conf = {**(conf or {}), "spark.driver.extraJavaOptions": f"{extra} {option}".strip()}
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
