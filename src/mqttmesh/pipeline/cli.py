"""``mqttmesh analyze JOB --archive DIR --out DIR [...]``, also run by spark-submit (submit.py).

Importing this module does not import pyspark: the broker's command line builds its
parser from ``add_arguments`` and only ``run`` starts Spark.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

__all__ = ["JOBS", "add_arguments", "build_parser", "run", "main"]

JOBS = ("traffic", "payloads", "audit", "stream")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("job", choices=JOBS, help="traffic, payloads, audit (batch) or stream")
    p.add_argument(
        "--archive",
        action="append",
        required=True,
        metavar="DIR",
        help="archive directory (archive.dir of the nodes; repeat for several); a URI "
        "(hdfs://, s3a://) is read by Spark's Hadoop FileSystem, a Delta table there through its log",
    )
    p.add_argument("--out", required=True, metavar="DIR", help="where tables, charts and report.html go")
    p.add_argument(
        "--since",
        metavar="T",
        help="first instant: ISO 8601 (UTC unless a zone is given), epoch seconds, or relative: --since=-30m, -2h, -1d",
    )
    p.add_argument("--until", metavar="T", help="end of the range (exclusive), same forms")
    p.add_argument(
        "--as-of",
        metavar="VERSION|T",
        help="read each log (a Delta table: archive.format = delta) as it was at this version "
        "number or time (same forms as --since), not as it is now",
    )
    p.add_argument("--master", metavar="URL", help="Spark master (default local[*], or what spark-submit set)")
    p.add_argument("--window", type=int, default=60, metavar="S", help="seconds per time window (60)")
    p.add_argument(
        "--level",
        type=int,
        default=2,
        metavar="N",
        help="topic levels of a prefix (traffic) and of a pattern when no --pattern is given (2)",
    )
    p.add_argument("--top", type=int, default=10, metavar="N", help="top talkers to list (10)")
    p.add_argument(
        "--pattern",
        dest="patterns",
        action="append",
        metavar="FILTER",
        help="payloads/stream: group topics by these MQTT filters, first match wins (repeat)",
    )
    p.add_argument(
        "--schema",
        metavar="DDL",
        help="payloads/stream: JSON schema, e.g. 'temp DOUBLE, rh DOUBLE' (default: inferred from a sample)",
    )
    p.add_argument(
        "--fields",
        metavar="LIST",
        help="payloads: statistics of these numeric fields (dotted paths, comma-separated), or 'all' "
        "(default: every numeric field but identifiers and counters, such as seq, id, *_id)",
    )
    p.add_argument("--sample", type=int, default=10_000, metavar="N", help="payloads inferred from N payloads")
    p.add_argument(
        "--expect",
        action="append",
        default=[],
        metavar="CLIENT=FILTER[,...][@SINCE[..UNTIL]]",
        help="audit: what a subscriber should have received (repeat); without it the audit "
        "infers it from gaps in what each subscriber received",
    )
    p.add_argument(
        "--grace", type=float, default=60.0, metavar="S", help="audit: deliveries are read from SINCE-S to UNTIL+S (60)"
    )
    p.add_argument(
        "--on-corrupt",
        choices=("skip", "fail"),
        default="skip",
        help="a corrupt or truncated archive file: name it and skip it (default), or stop",
    )
    p.add_argument(
        "--verify",
        choices=("footer", "full"),
        default="footer",
        help="check each local archive file's footer (default), or read every page once first",
    )
    p.add_argument("--shuffle-partitions", type=int, metavar="N", help="spark.sql.shuffle.partitions")
    p.add_argument("--checkpoint", metavar="DIR", help="stream: checkpoint directory (default OUT/checkpoint)")
    p.add_argument(
        "--trigger",
        default="available-now",
        metavar="available-now|SECONDS",
        help="stream: read what is there and stop (default), or a micro-batch every SECONDS",
    )
    p.add_argument(
        "--watermark",
        type=float,
        default=60.0,
        metavar="S",
        help="stream: a window is final S seconds of event time after its end (60)",
    )
    p.add_argument("--max-files-per-trigger", type=int, metavar="N", help="stream: files per micro-batch")
    p.add_argument("--timeout", type=float, metavar="S", help="stream with an interval trigger: stop after S seconds")


def build_parser(prog: str = "mqttmesh analyze") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog, description="Run a job of the mqttmesh data pipeline on Spark (docs/pipeline.md)."
    )
    add_arguments(p)
    return p


def _say(job: str):
    def say(text: str) -> None:
        print(f"mqttmesh analyze {job}: {text}", file=sys.stderr, flush=True)

    return say


def _spark_error(exc: BaseException) -> str | None:
    """The first useful line of a Spark/Py4J error, or None if ``exc`` is not one."""
    names = {c.__name__ for c in type(exc).__mro__}
    if not names & {
        "PySparkException",
        "Py4JJavaError",
        "Py4JError",
        "StreamingQueryException",
        "CapturedException",
        "AnalysisException",
    }:
        return None
    text = str(exc).strip()
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith(("at ", "JVM stacktrace", "Traceback")):
            return line[:500]
    return text[:500]


def run(args: argparse.Namespace) -> int:
    from .options import OptionError, parse_time

    say = _say(args.job)
    now = time.time()
    try:
        args.since = parse_time(args.since, "--since", now) if isinstance(args.since, str) else args.since
        args.until = parse_time(args.until, "--until", now) if isinstance(args.until, str) else args.until
        if isinstance(getattr(args, "as_of", None), str):
            from .options import parse_as_of

            args.as_of = parse_as_of(args.as_of, now)
        if args.since and args.until and args.since >= args.until:
            raise OptionError("--since must be before --until")
        for name in ("window", "level", "top", "sample"):
            if getattr(args, name) < 1:
                raise OptionError(f"--{name} must be at least 1")
        if args.job == "audit":
            from .options import parse_expectation

            args.expect = [parse_expectation(e, now) if isinstance(e, str) else e for e in args.expect]
        if args.patterns:
            from .options import filter_regex

            for f in args.patterns:
                filter_regex(f)
    except OptionError as exc:
        print(f"mqttmesh analyze: {exc}", file=sys.stderr)
        return 2
    try:
        from .session import archive_bytes, build_session
    except ImportError as exc:
        print(
            f"mqttmesh analyze: the pipeline needs pyspark, pyarrow and matplotlib ({exc}); "
            f"install them with: pip install 'mqttmesh[pipeline]'",
            file=sys.stderr,
        )
        return 2
    os.makedirs(args.out, exist_ok=True)
    # the job's work that needs no Spark (listing and checking a local archive's files, the
    # payloads' sample and schema) runs while the JVM starts
    prepared = _Meanwhile(args, say) if args.job in ("traffic", "payloads") else None
    try:
        # (a batch job's size picks the JVM's compiler; a stream runs on: the full one)
        kinds = {"traffic": ("publish",), "payloads": ("publish",), "audit": ("publish", "delivery")}.get(args.job)
        size = archive_bytes(args.archive, kinds, args.since, args.until) if kinds else None
        spark = build_session(f"mqttmesh-{args.job}", args.master, args.shuffle_partitions, input_bytes=size)
    except Exception as exc:  # no Java, a master that does not answer
        print(
            f"mqttmesh analyze: cannot start Spark ({type(exc).__name__}: {str(exc).splitlines()[0][:300]}); "
            f"it needs Java 17 or later (JAVA_HOME or java on PATH)",
            file=sys.stderr,
        )
        return 1
    done = False
    try:
        code = _run_job(spark, args, say, prepared)
        done = code == 0 and args.job != "stream"
        return code
    finally:
        # A batch job that wrote its report and printed its result leaves its SparkContext to
        # the JVM this process started: when this process exits, the JVM reads the end of its
        # pipe, exits, and its shutdown hook stops the context (the Python workers with it).
        # Measured, 1 M rows: the command ends without the second spark.stop() takes, the JVM
        # about a second after it, nothing printed after, every output file written before.
        # Under spark-submit, a stream, or a failure: stopped here, as before.
        if not (done and "PYSPARK_GATEWAY_PORT" not in os.environ):
            spark.stop()


class _Meanwhile:
    """``jobs.PREPARE[job](args, say)`` on a thread; ``result()`` waits for it and returns what
    it returned or raises what it raised (a daemon thread: a run that ends before, Spark
    not starting, does not wait for it)."""

    def __init__(self, args: argparse.Namespace, say) -> None:
        import threading

        self._value: object = None
        self._error: BaseException | None = None

        def work() -> None:
            try:
                from .jobs import PREPARE

                self._value = PREPARE[args.job](args, say)
            except BaseException as exc:  # (raised again by result(), on the main thread)
                self._error = exc

        self._thread = threading.Thread(target=work, name=f"prepare-{args.job}", daemon=True)
        self._thread.start()

    def result(self) -> object:
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._value


def _run_job(spark, args, say, prepared: _Meanwhile | None = None) -> int:
    from .extract import ExtractError
    from .options import OptionError

    try:
        if args.job == "stream":
            from .stream import run_stream

            started = time.monotonic()
            counts = run_stream(spark, args, say)
            for name, rows in counts.items():
                print(f"{name}: {rows} rows in {os.path.join(os.path.abspath(args.out), 'stream', name)}")
            print(f"stream: done in {time.monotonic() - started:.1f}s")
            return 0
        from .jobs import BATCH_JOBS

        if prepared is not None:
            result = BATCH_JOBS[args.job](spark, args, say, prepared=prepared.result())
        else:
            result = BATCH_JOBS[args.job](spark, args, say)
    except (ExtractError, OptionError) as exc:
        print(f"mqttmesh analyze {args.job}: {exc}", file=sys.stderr)
        return 1 if isinstance(exc, ExtractError) else 2
    except Exception as exc:
        message = _spark_error(exc)
        if message is None:
            raise
        print(f"mqttmesh analyze {args.job}: Spark failed: {message}", file=sys.stderr)
        return 1
    for key, value in result.summary.items():
        print(f"{key}: {value}")
    for name, t in result.tables.items():
        print(f"table {name}: {t.rows} rows ({t.csv})")
    print(f"report: {result.html}")
    print(f"{args.job}: done in {result.seconds:.1f}s")
    return 0


def main(argv: list[str] | None = None) -> int:
    return run(build_parser().parse_args(argv))
