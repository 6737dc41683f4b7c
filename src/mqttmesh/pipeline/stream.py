"""The ``stream`` job: the traffic and payload aggregates as Structured Streaming queries over
the archive directory, exactly once into Parquet.

Source: the publish log's files, as a file source (a file is read once; hidden
``.NAME.tmp`` files are skipped until they are renamed whole). Event time is the
message timestamp, with a watermark: a window is final, and written, once the newest
timestamp seen is ``watermark`` seconds past its end. Sink: Parquet in append mode,
whose ``_spark_metadata`` log together with the checkpoint makes each window appear
exactly once, also when the job is killed and started again from the checkpoint.
Readers of the sink must read it with Spark (or honour ``_spark_metadata``).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable

from pyspark.sql import types as T

from ..archive.schema import PUBLISH
from ..archive.table import is_table
from . import payloads as P
from . import traffic as TR
from .common import with_pattern
from .extract import ExtractError, is_uri, read_log
from .options import OptionError
from .schema import spark_schema

__all__ = ["run_stream", "stream_source"]


def _refuse_uri_table(spark, log_uri: str) -> None:
    """A Delta table at a URI is not streamed: pipeline/delta_source.py reads local files in the
    executors' Python, and a file source would take a compaction's files for new rows."""
    from .delta_uri import uri_is_table

    if uri_is_table(spark, log_uri):
        raise ExtractError(
            f"--archive: {log_uri} is a Delta table at a URI, which the stream job does not read yet (the batch "
            f"jobs do); stream a local or mounted path of it"
        )


def stream_source(spark, roots: list[str], max_files: int | None = None):
    """The publish log of ``roots`` as a streaming DataFrame: one source per root, a file source
    over a format-1 log directory, the commits of a Delta table (pipeline/delta_source.py)."""
    df = None
    for root in roots:
        log_dir = os.path.join(root, PUBLISH)
        if is_uri(root):
            _refuse_uri_table(spark, root.rstrip("/") + "/" + PUBLISH)
        elif is_table(log_dir):
            # (its commits, not its files: a file source would take a compaction's files for
            # new rows, and a killed writer's for rows at all; pipeline/delta_source.py)
            from .delta_source import register

            register(spark)
            reader = spark.readStream.format("mqttmesh-delta").option("kind", PUBLISH)
            if max_files:
                reader = reader.option("maxFilesPerTrigger", int(max_files))
            one = reader.load(os.path.abspath(log_dir))
            df = one if df is None else df.unionByName(one)
            continue
        reader = spark.readStream.schema(spark_schema(PUBLISH)).option("recursiveFileLookup", "true")
        if max_files:
            reader = reader.option("maxFilesPerTrigger", int(max_files))
        one = reader.parquet(os.path.join(root, PUBLISH))
        df = one if df is None else df.unionByName(one)
    return df


def _payload_schema(spark, opts, say) -> T.StructType | None:
    if opts.schema:
        return T.DataType.fromDDL(opts.schema)  # type: ignore[return-value]  # (a schema's DDL is a struct)
    try:  # a streaming source cannot infer: look at what the archive holds now
        sample = P.with_json_flag(read_log(spark, opts.archive, PUBLISH, on_corrupt="skip", say=say))
    except ExtractError:
        return None
    schema = P.infer_schema(spark, sample, opts.sample)
    return schema if schema.fields else None


def run_stream(spark, opts, say: Callable[[str], None] = print) -> dict:
    """Start the queries, wait for them (available-now: until the archive is read; an interval:
    until ``opts.timeout`` or SIGTERM/SIGINT), return {query: rows in its sink}."""
    out = os.path.abspath(opts.out)
    checkpoint = os.path.abspath(opts.checkpoint or os.path.join(out, "checkpoint"))
    for root in opts.archive:
        if "://" not in root and not os.path.isdir(os.path.join(root, PUBLISH)):
            raise ExtractError(f"--archive {root}: no {PUBLISH}/ directory (start a node with the archive on first)")
    w = int(opts.window)
    source = stream_source(spark, opts.archive, getattr(opts, "max_files_per_trigger", None)).withWatermark(
        "timestamp", f"{int(opts.watermark)} seconds"
    )
    queries = {"traffic": TR.traffic_by(source, ["topic"], w)}
    schema = _payload_schema(spark, opts, say)
    if schema is None:
        say("stream: no JSON payloads to learn a schema from and no --schema: the payloads query is not started")
    else:
        fields = P.numeric_fields(schema)
        if not fields:
            say("stream: the payload schema has no numeric field: the payloads query is not started")
        else:
            parsed = P.parse_payloads(P.with_json_flag(with_pattern(source, opts.patterns, opts.level)), schema)
            queries["payloads"] = P.payload_stats(P.melt_numeric(parsed.where("is_json"), fields), w)
    trigger: dict[str, bool | str]
    if opts.trigger == "available-now":
        trigger = {"availableNow": True}
    else:
        try:
            seconds = float(opts.trigger)
        except ValueError:
            raise OptionError(f"--trigger: {opts.trigger!r} is neither available-now nor a number of seconds") from None
        trigger = {"processingTime": f"{seconds:g} seconds"}
    running = []
    for name, df in queries.items():
        q = (
            df.writeStream.format("parquet")
            .outputMode("append")
            .option("path", os.path.join(out, "stream", name))
            .option("checkpointLocation", os.path.join(checkpoint, name))
            .queryName(f"mqttmesh_{name}")
            .trigger(**trigger)  # type: ignore[arg-type]  # (one keyword: availableNow or processingTime)
            .start()
        )
        running.append(q)
        say(
            f"stream: query {name} -> {os.path.join(out, 'stream', name)} (checkpoint {os.path.join(checkpoint, name)})"
        )
    stop = threading.Event()
    previous = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            previous[sig] = signal.signal(sig, lambda *a: stop.set())
    try:
        deadline = time.monotonic() + opts.timeout if getattr(opts, "timeout", None) else None
        while any(q.isActive for q in running) and not stop.is_set():
            if deadline is not None and time.monotonic() >= deadline:
                break
            for q in running:
                if q.exception() is not None:
                    raise q.exception()  # type: ignore[misc]  # (a StreamingQueryException: an exception at run time)
            stop.wait(0.2)
    finally:
        for q in running:
            if q.isActive:
                q.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    for q in running:
        if q.exception() is not None:
            raise q.exception()  # type: ignore[misc]  # (as above)
    counts = {}
    for name in queries:
        path = os.path.join(out, "stream", name)
        counts[name] = spark.read.parquet(path).count() if os.path.isdir(path) else 0
    return counts
