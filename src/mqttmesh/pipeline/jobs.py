"""The batch jobs: extract -> transforms -> load, with paths and settings from the options.

Each ``run_JOB(spark, opts, say)`` reads the archive, writes its tables, charts and
``report.html`` under ``opts.out`` and returns a JobResult. ``opts`` is the namespace
pipeline/cli.py parses (the tests build one with ``job_options``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from pyspark.sql import DataFrame
from pyspark.sql import types as T

from ..archive.schema import DELIVERY, PUBLISH
from . import audit as A
from . import payloads as P
from . import traffic as TR
from .common import with_pattern
from .extract import local_roots, log_files, read_files, read_log
from .load import Table, write_arrow, write_table
from .options import OptionError, parse_expectation
from .payload_schema import local_sample
from .report import bar_chart, grouped_bars, html_page, line_chart

__all__ = [
    "JobResult",
    "Prepared",
    "prepare_traffic",
    "prepare_payloads",
    "run_traffic",
    "run_payloads",
    "run_audit",
    "BATCH_JOBS",
    "PREPARE",
    "job_options",
]


@dataclass
class JobResult:
    job: str
    out: str
    html: str = ""
    tables: dict[str, Table] = field(default_factory=dict)
    summary: dict[str, object] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0


@dataclass
class Prepared:
    """What a job learns of a local archive on the driver, without Spark (cli.py has it done
    while the JVM starts): the publish log's files (``extract.log_files``) and the notes on
    them; for payloads the sample (unless --schema and --fields are given), and when no
    --schema is given its schema and the fields."""

    files: list[str]
    notes: list[str] = field(default_factory=list)
    sample: list | None = None
    schema: T.StructType | None = None
    fields: list[tuple[str, ...]] = field(default_factory=list)
    left_out: dict[str, str] = field(default_factory=dict)


def job_options(**values) -> argparse.Namespace:
    """The options of a job with every default (what the command line gives when not told)."""
    defaults: dict[str, object] = dict(
        archive=[],
        out="",
        since=None,
        until=None,
        master=None,
        window=60,
        level=2,
        top=10,
        patterns=None,
        schema=None,
        sample=10_000,
        expect=[],
        grace=60.0,
        on_corrupt="skip",
        verify="footer",
        as_of=None,
        shuffle_partitions=None,
        checkpoint=None,
        fields=None,
        trigger="available-now",
        watermark=60.0,
        max_files_per_trigger=None,
        timeout=None,
    )
    defaults.update(values)
    return argparse.Namespace(**defaults)


def _rows(table: Table) -> list[dict]:
    """A written table's rows, as dicts, in its order (what the charts and the summary read)."""
    return table.data.to_pylist()


def _series(rows: list[dict], key: str, value: str, keys: list) -> dict[str, tuple[list, list]]:
    """{key: (window starts, values)} for the given keys, from a per-window table's rows."""
    out: dict[str, tuple[list, list]] = {str(k): ([], []) for k in keys}
    for r in sorted((r for r in rows if str(r[key]) in out), key=lambda r: r["window_start"]):
        xs, ys = out[str(r[key])]
        xs.append(r["window_start"])
        ys.append(r[value])
    return out


def _partial(rows: list[dict]) -> set:
    """The window starts of a per-window table's partial windows."""
    return {r["window_start"] for r in rows if not r["complete"]}


def _note_partial(result: JobResult, rows: list[dict], w: int) -> None:
    partial = sorted(_partial(rows))
    if partial:
        at = ", ".join(x.isoformat() for x in partial[:4]) + (" ..." if len(partial) > 4 else "")
        result.notes.append(
            f"{len(partial)} of the {w}s windows are partial (complete = false in the per-window tables;"
            f" open markers in the charts): the range covers only part of them ({at})"
        )


def _top(rows: list[dict], key: str, measure: str, n: int) -> list:
    """The ``n`` values of ``key`` with the largest sum of ``measure``, ties by value."""
    sums: dict = {}
    for r in rows:
        sums[r[key]] = sums.get(r[key], 0) + (r[measure] or 0)
    return [k for k, _ in sorted(sums.items(), key=lambda kv: (-kv[1], str(kv[0])))[:n]]


def _load_charts_meanwhile() -> None:
    """Imports matplotlib (half a second) on a thread while the driver waits for Spark."""
    import threading

    from .report import load_plotting

    threading.Thread(target=load_plotting, name="load-plotting", daemon=True).start()


def _begin(opts, job: str) -> tuple[JobResult, str, float]:
    out = os.path.abspath(opts.out)
    charts = os.path.join(out, "charts")
    os.makedirs(charts, exist_ok=True)
    return JobResult(job, out), charts, time.monotonic()


def _page(result: JobResult, opts, title: str, chart_list: list) -> None:
    """The job's report.html: its summary, charts and tables."""
    result.html = html_page(
        os.path.join(result.out, "report.html"),
        title,
        _range_text(opts),
        list(result.summary.items()),
        chart_list,
        list(result.tables.values()),
        result.notes,
    )


def _range_text(opts) -> str:
    a = opts.since.isoformat() if opts.since else "the beginning"
    b = opts.until.isoformat() if opts.until else "the end"
    return f"archive {', '.join(opts.archive)}; from {a} to {b}"


def _read(spark, opts, kind, result: JobResult, say, **kw) -> DataFrame:
    def note(text: str) -> None:
        result.notes.append(text)
        say(text)

    return read_log(
        spark,
        opts.archive,
        kind,
        kw.get("since", opts.since),
        kw.get("until", opts.until),
        opts.on_corrupt,
        note,
        verify=getattr(opts, "verify", "footer"),
        as_of=getattr(opts, "as_of", None),
    )


def _prepared_files(opts, say) -> Prepared | None:
    """The publish log's files of a local archive, checked (None: a URI, which Spark lists)."""
    if not local_roots(opts.archive):
        return None
    notes: list[str] = []

    def note(text: str) -> None:
        notes.append(text)
        say(text)

    files = log_files(
        opts.archive,
        PUBLISH,
        opts.since,
        opts.until,
        opts.on_corrupt,
        note,
        verify=getattr(opts, "verify", "footer"),
        as_of=getattr(opts, "as_of", None),
    )
    return Prepared(files, notes)


def _read_prepared(spark, opts, prepared: Prepared | None, result: JobResult, say) -> DataFrame:
    """The publish log: the files ``prepared`` names, or (None) as ``_read`` finds them."""
    if prepared is None:
        return _read(spark, opts, PUBLISH, result, say)
    result.notes.extend(prepared.notes)
    return read_files(spark, prepared.files, PUBLISH, opts.since, opts.until, opts.on_corrupt)


# -- traffic ---------------------------------------------------------------------------------------


def prepare_traffic(opts, say: Callable[[str], None] = print) -> Prepared | None:
    """``run_traffic``'s work before Spark: the files (None: an archive at a URI)."""
    return _prepared_files(opts, say)


def run_traffic(spark, opts, say: Callable[[str], None] = print, prepared: Prepared | None = None) -> JobResult:
    """``prepared``: what ``prepare_traffic`` found, if it ran already (cli.py)."""
    result, charts, started = _begin(opts, "traffic")
    _load_charts_meanwhile()
    if prepared is None:
        prepared = prepare_traffic(opts, say)
    pub = _read_prepared(spark, opts, prepared, result, say)
    pub = pub.select("timestamp", "origin", "publisher", "topic", "payload_size")
    w = int(opts.window)
    # one Spark query: the messages rolled up per window, node, publisher and topic, and that
    # along every table's keys; the driver cuts the tables out of it (traffic.split_rollups)
    data = TR.traffic_rollups(TR.traffic_base(pub, w), opts.level).toArrow()
    s = TR.rollup_summary(data)
    first, last = TR.rollup_span(data)
    start = opts.since if opts.since else first
    end = opts.until if opts.until else last
    span = (end - start).total_seconds() if start is not None and end is not None else 0.0
    result.summary = {
        **s,
        "first": first.isoformat() if first is not None else "-",
        "last": last.isoformat() if last is not None else "-",
        "span_s": round(span, 3),
        "msgs_per_s": round(s["messages"] / span, 3) if span > 0 else None,
    }
    tables = TR.split_rollups(data, w, span, start, end, opts.top)
    titles = {
        "per_node": "Per node and window",
        "per_prefix": f"Per topic prefix (level {opts.level}) and window",
        "per_topic": "Per topic and window",
        "per_publisher": "Per publisher and window",
        "top_talkers": f"Top {opts.top} talkers",
        "topics": "Topics over the whole range",
        "nodes": "Nodes over the whole range",
    }
    for name, title in titles.items():
        result.tables[name] = write_arrow(tables[name], result.out, name, title)
    chart_list = []
    if s["messages"]:
        nodes = [r["origin"] for r in _rows(result.tables["nodes"])]
        per_node = _rows(result.tables["per_node"])
        _note_partial(result, per_node, w)
        chart_list.append(
            (
                "Messages per second, per node",
                line_chart(
                    os.path.join(charts, "traffic_nodes.png"),
                    f"messages/s per node ({w}s windows)",
                    _series(per_node, "origin", "msgs_per_s", nodes[:8]),
                    "msgs/s",
                    _partial(per_node),
                ),
            )
        )
        per_prefix = _rows(result.tables["per_prefix"])
        prefixes = _top(per_prefix, "prefix", "messages", 8)
        chart_list.append(
            (
                f"Messages per second, per topic prefix (level {opts.level})",
                line_chart(
                    os.path.join(charts, "traffic_prefixes.png"),
                    f"messages/s per topic prefix ({w}s windows)",
                    _series(per_prefix, "prefix", "msgs_per_s", prefixes),
                    "msgs/s",
                    _partial(per_prefix),
                ),
            )
        )
        top = _rows(result.tables["topics"])[:20]  # (most messages first, then by topic)
        chart_list.append(
            (
                "Busiest topics",
                bar_chart(
                    os.path.join(charts, "traffic_topics.png"),
                    "messages per topic (top 20)",
                    [r["topic"] for r in top],
                    [r["messages"] for r in top],
                    "messages",
                ),
            )
        )
        talkers = _rows(result.tables["top_talkers"])  # (by rank)
        chart_list.append(
            (
                "Top talkers",
                bar_chart(
                    os.path.join(charts, "traffic_talkers.png"),
                    f"messages per publisher (top {opts.top})",
                    [f"{r['publisher']} @ {r['origin']}" for r in talkers],
                    [r["messages"] for r in talkers],
                    "messages",
                ),
            )
        )
    else:
        result.notes.append("no messages in the archive for this range")
    _page(result, opts, "mqttmesh traffic", chart_list)
    result.seconds = time.monotonic() - started
    return result


# -- payloads --------------------------------------------------------------------------------------


def _schema(spark, opts, sample: list) -> T.StructType:
    if opts.schema:
        try:
            schema = T.DataType.fromDDL(opts.schema)
        except Exception as exc:
            raise OptionError(f"--schema: {opts.schema!r} is not a schema ({str(exc).splitlines()[0][:200]})") from None
        if not isinstance(schema, T.StructType):
            raise OptionError(f"--schema: {opts.schema!r} is not a list of fields (name type, ...)")
        return schema
    return P.schema_of([text for _, _, text in sample])


def _fields(opts, schema: T.StructType, sample: list) -> tuple[list[tuple[str, ...]], dict[str, str]]:
    """The numeric fields the statistics are of (--fields, else all but identifiers and
    counters: payloads.measurements), and those left out, with why."""
    numeric = P.numeric_fields(schema)
    chosen = getattr(opts, "fields", None)
    if not chosen:
        return P.measurements(numeric, sample)
    if chosen.strip() == "all":
        return numeric, {}
    by_name = {".".join(p): p for p in numeric}
    names = [n.strip() for n in chosen.split(",") if n.strip()]
    unknown = [n for n in names if n not in by_name]
    if unknown:
        have = ", ".join(by_name) or "none"
        raise OptionError(f"--fields: {', '.join(unknown)} not a numeric field of the payloads (they have: {have})")
    return [by_name[n] for n in names], {n: "not in --fields" for n in by_name if n not in names}


def prepare_payloads(opts, say: Callable[[str], None] = print) -> Prepared | None:
    """``run_payloads``'s work before Spark: the files, and unless --schema is given the
    sample (read with pyarrow), its schema and the fields (None: an archive at a URI)."""
    prepared = _prepared_files(opts, say)
    if prepared is None:
        return None
    if not (opts.schema and getattr(opts, "fields", None)):
        # (None: a file pyarrow cannot read; Spark samples them)
        prepared.sample = local_sample(prepared.files, int(opts.sample), opts.since, opts.until)
    if prepared.sample is not None and not opts.schema:  # (a --schema's DDL is parsed by the JVM)
        prepared.schema = P.schema_of([text for _, _, text in prepared.sample])
        prepared.fields, prepared.left_out = _fields(opts, prepared.schema, prepared.sample)
    return prepared


def run_payloads(spark, opts, say: Callable[[str], None] = print, prepared: Prepared | None = None) -> JobResult:
    """``prepared``: what ``prepare_payloads`` found, if it ran already (cli.py)."""
    result, charts, started = _begin(opts, "payloads")
    _load_charts_meanwhile()
    P.warm_workers(spark)
    if prepared is None:
        prepared = prepare_payloads(opts, say)
    pub = _read_prepared(spark, opts, prepared, result, say).select("timestamp", "origin", "topic", "payload")
    patterned = with_pattern(pub, opts.patterns, opts.level)
    # a sample of the JSON payloads: their schema (unless --schema), which fields are counters
    if prepared is not None and prepared.sample is not None:
        sample = prepared.sample
    elif opts.schema and getattr(opts, "fields", None):
        sample = []
    else:
        sample = P.sample_payloads(P.with_json_flag(patterned), opts.sample, pub.inputFiles(), opts.since, opts.until)
    if prepared is not None and prepared.schema is not None:
        schema, fields, left_out = prepared.schema, prepared.fields, prepared.left_out
    else:
        schema = _schema(spark, opts, sample)
        fields, left_out = _fields(opts, schema, sample)
    w = int(opts.window)
    # one pass over the payloads: parsed once, classified, aggregated per window and pattern
    passed = P.payload_pass(patterned.select("timestamp", "pattern", "payload"), schema, fields, w).persist()
    try:
        # every table in one Spark query; the driver cuts them apart (its tasks wait for the
        # Python workers warm_workers starts, as long as those take: the planning need not)
        data = P.tables_of(passed, fields).toArrow()
    finally:
        passed.unpersist()
    first, last = P.table_span(data)
    parts = P.split_tables(data, opts.since or first, opts.until or last)
    quality = write_arrow(parts["payload_quality"], result.out, "payload_quality", "Payloads per topic pattern")
    quality_rows = _rows(quality)
    messages = sum(r["messages"] for r in quality_rows)
    non_json = sum(r["non_json"] for r in quality_rows)
    result.summary = {
        "messages": messages,
        "json_objects": messages - non_json,
        "non_json": non_json,
        "numeric_fields": ", ".join(".".join(p) for p in fields) or "-",
        "left_out": ", ".join(left_out) or "-",
        "schema": schema.simpleString() if schema.fields else "-",
        "patterns": ", ".join(opts.patterns) if opts.patterns else f"topic level {opts.level}",
    }
    if left_out:
        result.notes.append(
            "left out of the statistics (--fields chooses): "
            + "; ".join(f"{name} ({why})" for name, why in left_out.items())
        )
        say(result.notes[-1])
    if non_json:
        result.notes.append(
            f"{non_json} payloads are not JSON objects: counted in payload_quality, left out of the statistics"
        )
        say(result.notes[-1])
    result.tables["payload_stats"] = write_arrow(
        parts["payload_stats"], result.out, "payload_stats", f"Numeric fields per topic pattern and {w}s window"
    )
    result.tables["payload_totals"] = write_arrow(
        parts["payload_totals"], result.out, "payload_totals", "Numeric fields per topic pattern, whole range"
    )
    result.tables["payload_quality"] = quality
    chart_list = []
    stats = _rows(result.tables["payload_stats"])
    _note_partial(result, stats, w)
    for i, name in enumerate(_top(_rows(result.tables["payload_totals"]), "field", "count", 4)):
        of_field = [r for r in stats if r["field"] == name]
        series = _series(of_field, "pattern", "mean", _top(of_field, "pattern", "count", 8))
        path = os.path.join(charts, f"payload_{i}.png")
        chart_list.append(
            (
                f"{name}: mean per pattern and window",
                line_chart(path, f"{name}: mean per {w}s window", series, name, _partial(of_field)),
            )
        )
    q = sorted(quality_rows, key=lambda r: (-r["messages"], r["pattern"]))[:15]
    if q:
        chart_list.append(
            (
                "JSON and non-JSON payloads per pattern",
                grouped_bars(
                    os.path.join(charts, "payload_quality.png"),
                    "payloads per topic pattern",
                    [r["pattern"] for r in q],
                    {"JSON objects": [r["json"] for r in q], "not JSON": [r["non_json"] for r in q]},
                    "messages",
                ),
            )
        )
    _page(result, opts, "mqttmesh payloads", chart_list)
    result.seconds = time.monotonic() - started
    return result


# -- audit -------------------------------------------------------------------------------------------


def run_audit(spark, opts, say: Callable[[str], None] = print) -> JobResult:
    result, charts, started = _begin(opts, "audit")
    _load_charts_meanwhile()
    now = time.time()
    expectations = [e if not isinstance(e, str) else parse_expectation(e, now) for e in opts.expect]
    pub = _read(spark, opts, PUBLISH, result, say)
    grace = dt.timedelta(seconds=float(opts.grace))
    dlv = _read(
        spark,
        opts,
        DELIVERY,
        result,
        say,
        since=opts.since - grace if opts.since else None,
        until=opts.until + grace if opts.until else None,
    )
    if expectations:
        expected = A.expected_from_filters(pub, A.expectations_frame(spark, expectations))
        mode = "expectations: " + "; ".join(f"{e.client_id}={','.join(e.filters)}" for e in expectations)
    else:
        expected = A.expected_from_gaps(pub, dlv)
        mode = "inferred from what each subscriber received (gaps only; give --expect for exact counts)"
    rows = A.audit_deliveries(expected, A.first_deliveries(dlv)).persist()
    try:
        specs = [
            (
                "audit_subscribers",
                "Per subscriber",
                A.audit_subscribers(rows, A.unexpected_deliveries(dlv, expected, pub)),
            ),
            ("audit_streams", "Per subscriber and publisher stream", A.audit_streams(rows)),
            ("audit_publishers", "Per publisher stream", A.audit_publishers(rows)),
            ("lost_messages", "Messages that did not reach their subscriber", A.lost_messages(rows)),
        ]
        for name, title, df in specs:
            result.tables[name] = write_table(df, result.out, name, title)
        subs = sorted(_rows(result.tables["audit_subscribers"]), key=lambda r: r["client_id"])
        counted = (
            "expected",
            "delivered",
            "lost",
            "duplicated",
            "redelivered",
            "out_of_order",
            "unexpected",
            "unknown",
        )
        total = {k: sum(int(r[k] or 0) for r in subs) for k in counted}
        result.summary = {"mode": mode, "subscribers": len(subs), **total}
        chart_list = []
        if subs:
            labels = [r["client_id"] for r in subs[:30]]
            chart_list.append(
                (
                    "Expected, delivered, lost and duplicated messages per subscriber",
                    grouped_bars(
                        os.path.join(charts, "audit_counts.png"),
                        "messages per subscriber",
                        labels,
                        {k: [r[k] for r in subs[:30]] for k in ("expected", "delivered", "lost", "duplicated")},
                        "messages",
                    ),
                )
            )
            chart_list.append(
                (
                    "Latency from publish to first delivery",
                    grouped_bars(
                        os.path.join(charts, "audit_latency.png"),
                        "latency per subscriber (ms)",
                        labels,
                        {k: [r[f"latency_{k}_ms"] or 0 for r in subs[:30]] for k in ("p50", "p95", "p99")},
                        "ms",
                    ),
                )
            )
        _page(result, opts, "mqttmesh delivery audit", chart_list)
    finally:
        rows.unpersist()
    result.seconds = time.monotonic() - started
    return result


BATCH_JOBS: dict[str, Callable[..., JobResult]] = {"traffic": run_traffic, "payloads": run_payloads, "audit": run_audit}
# the jobs with work to do before Spark: cli.py runs it while the JVM starts, and passes its
# result to the job as ``prepared``
PREPARE = {"traffic": prepare_traffic, "payloads": prepare_payloads}
