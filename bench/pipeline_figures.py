"""Figures of the data pipeline (docs/pipeline.md, "Figures").

    .venv/bin/python -m bench.pipeline_figures archive [--rounds 3] [--workloads fanin,fanout] [--qos 0,1]
            [--formats parquet,delta]
        broker throughput with the archive off and on in each format, alternating, in the
        benchmark harness; archive bytes per message of the runs with the archive on
    .venv/bin/python -m bench.pipeline_figures spark [--rows 10000000] [--master local[2]]
        a synthetic archive in the archive's exact schema and encoding (pyarrow, vectorised),
        then the traffic and payloads jobs on it: rows per second and per core
    .venv/bin/python -m bench.pipeline_figures bytes DIR
        bytes per message of an existing archive (e.g. the one `mqttmesh demo` wrote)

Every process it starts is ended by PID (the harness does the same for its own).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def archive_bytes(directory: str, kind: str = "publish") -> tuple[int, int, int]:
    """(files, rows, bytes) of the archive files of ``kind`` under ``directory``."""
    import pyarrow.parquet as pq

    files = rows = size = 0
    for dirpath, _, names in os.walk(os.path.join(directory, kind)):
        for n in names:
            if n.endswith(".parquet") and not n.startswith("."):
                path = os.path.join(dirpath, n)
                files += 1
                rows += pq.read_metadata(path).num_rows
                size += os.path.getsize(path)
    return files, rows, size


# -- broker throughput, archive off and on ---------------------------------------------------------


def _bench_once(workload: str, qos: int, extra: str, duration: float, out: Path) -> dict:
    cmd = [
        sys.executable,
        "-m",
        "bench",
        "--brokers",
        "mqttmesh",
        "--workloads",
        workload,
        "--qos",
        str(qos),
        "--repeat",
        "1",
        "--duration",
        str(duration),
        "--json",
        str(out),
        "--no-md",
    ]
    if extra:
        cmd += ["--mqttmesh-args", extra]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        _, err = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if proc.returncode != 0:
        raise RuntimeError(f"bench failed: {err[-2000:]}")
    cell = json.loads(out.read_text())["cells"][0]["summary"]
    return {"msgs_per_s": cell["delivered_per_s"]["median"], "cpu_us": cell["broker_cpu_us_per_msg"]["median"]}


def figures_archive(args) -> int:
    """Broker throughput with the archive off and on in each format of ``--formats``, the
    modes alternating within every round (off, then each format, the order turned round
    every other round)."""
    work = Path(tempfile.mkdtemp(prefix="mqttmesh-archive-figures-"))
    formats = [f for f in args.formats.split(",") if f]
    modes = ["off", *formats]
    results = []
    try:
        for workload in args.workloads.split(","):
            for qos in (int(q) for q in args.qos.split(",")):
                runs: dict[str, list[dict]] = {m: [] for m in modes}
                sizes: dict[str, list[tuple[int, int]]] = {m: [] for m in formats}
                for r in range(args.rounds):
                    for mode in modes if r % 2 == 0 else modes[::-1]:
                        arch = work / f"{workload}-{qos}-{r}-{mode}"
                        shutil.rmtree(arch, ignore_errors=True)
                        extra = (
                            ""
                            if mode == "off"
                            else f"--archive true --archive-dir {shlex.quote(str(arch))} --archive-format {mode}"
                        )
                        res = _bench_once(workload, qos, extra, args.duration, work / "run.json")
                        runs[mode].append(res)
                        if mode != "off":
                            _, rows, size = archive_bytes(str(arch))
                            sizes[mode].append((rows, size))
                            shutil.rmtree(arch, ignore_errors=True)
                        print(
                            f"{workload} QoS {qos} round {r + 1} archive {mode:7}: {res['msgs_per_s']:>10,.0f} "
                            f"msgs/s, broker {res['cpu_us']:.2f} us/msg",
                            flush=True,
                        )
                m_off = statistics.median(x["msgs_per_s"] for x in runs["off"])
                c_off = statistics.median(x["cpu_us"] for x in runs["off"])
                for mode in formats:
                    m_on = statistics.median(x["msgs_per_s"] for x in runs[mode])
                    rows = sum(n for n, _ in sizes[mode])
                    size = sum(b for _, b in sizes[mode])
                    results.append(
                        (
                            workload,
                            qos,
                            mode,
                            m_off,
                            m_on,
                            (m_on - m_off) / m_off * 100,
                            c_off,
                            statistics.median(x["cpu_us"] for x in runs[mode]),
                            size / rows if rows else float("nan"),
                        )
                    )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"\nmedian of {args.rounds} alternating runs each ({args.duration:g} s windows):")
    print(
        "| workload | QoS | format | archive off msgs/s | archive on msgs/s | change | broker µs/msg off | on "
        "| archive bytes/msg |"
    )
    print("|---|---:|---|---:|---:|---:|---:|---:|---:|")
    for w, q, f, a, b, d, ca, cb, bpm in results:
        print(f"| {w} | {q} | {f} | {a:,.0f} | {b:,.0f} | {d:+.1f} % | {ca:.2f} | {cb:.2f} | {bpm:.1f} |")
    return 0


# -- Spark throughput on a synthetic archive --------------------------------------------------------


def synthesize(
    directory: str,
    rows: int,
    nodes: int = 3,
    devices: int = 1000,
    sites: int = 10,
    per_file: int = 200_000,
    span_s: float = 7200.0,
    start: float = 1769860800.0,
) -> int:
    """An archive of ``rows`` JSON sensor readings in the archive's exact schema and encoding,
    built with vectorised Arrow calls; returns the number of files."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from mqttmesh.archive.recorder import file_name, partition_dir
    from mqttmesh.archive.schema import PUBLISH
    from mqttmesh.archive.writer import _ENCODING, arrow_schema

    rng = np.random.default_rng(1)
    n_files = 0
    incarnation = int(start * 16)
    per_node = rows // nodes
    for node_index in range(nodes):
        node = f"n{node_index + 1}"
        count = per_node + (rows - per_node * nodes if node_index == nodes - 1 else 0)
        seq0 = incarnation << 28
        for lo in range(0, count, per_file):
            n = min(per_file, count - lo)
            idx = np.arange(lo, lo + n)
            ts_us = (start + idx * (span_s / count)) * 1e6 + rng.integers(0, 1000, n)
            dev = rng.integers(0, devices // nodes, n) * nodes + node_index  # each device on one node
            site = dev % sites
            temp = 17.0 + 2.5 * site + rng.normal(0, 1.0, n)
            rh = rng.uniform(30, 70, n)
            batt = rng.uniform(10, 100, n)
            fmt = lambda a, d: pc.cast(pa.array(np.round(a, d)), pa.string())  # noqa: E731
            payload = pc.binary_join_element_wise(
                '{"temperature": ', fmt(temp, 2), ', "humidity": ', fmt(rh, 1), ', "battery": ', fmt(batt, 1), "}", ""
            )
            dev_s = pc.cast(pa.array(dev), pa.string())
            site_s = pc.cast(pa.array(site), pa.string())
            publisher = pc.binary_join_element_wise("dev-", dev_s, "")
            topic = pc.binary_join_element_wise("sensors/site-", site_s, "/dev-", dev_s, "/reading", "")
            seq = pa.array(seq0 + idx, pa.int64())
            origin = pa.array([node] * n, pa.string())
            payload_b = payload.cast(pa.binary())
            table = pa.Table.from_arrays(
                [
                    pa.array(ts_us.astype("int64"), pa.int64()).cast(pa.timestamp("us", tz="UTC")),
                    pc.binary_join_element_wise(origin, pc.cast(seq, pa.string()), ":"),
                    origin,
                    seq,
                    publisher,
                    topic,
                    pa.array(np.ones(n, dtype="int8")),
                    pa.array(np.zeros(n, dtype=bool)),
                    payload_b,
                    pc.binary_length(payload_b).cast(pa.int32()),
                ],
                schema=arrow_schema(PUBLISH, node),
            )
            hours = pc.divide(table.column("timestamp").cast(pa.int64()), 3_600_000_000)
            for h in sorted(set(pc.unique(hours).to_pylist())):
                part = table.filter(pc.equal(hours, h))
                folder = os.path.join(directory, partition_dir(PUBLISH, h))
                os.makedirs(folder, exist_ok=True)
                n_files += 1
                pq.write_table(
                    part,
                    os.path.join(folder, file_name(node, incarnation, n_files)),
                    compression="zstd",
                    **_ENCODING[PUBLISH],
                )
    return n_files


class _Profile:
    """Where a job's time goes: each step's wall time and Spark jobs, by wrapping the
    functions the job module calls (measurement only: the job runs unchanged)."""

    STEPS = (
        "prepare_traffic",
        "prepare_payloads",
        "read_log",
        "read_files",
        "write_table",
        "write_arrow",
        "line_chart",
        "bar_chart",
        "grouped_bars",
        "html_page",
        "_series",
        "_schema",
        "_rows",
    )

    def __init__(self, spark) -> None:
        self.spark = spark
        self.rows: dict[str, list[float]] = {}  # step -> [calls, seconds, spark jobs]
        self.saved: list[tuple[object, str, object]] = []

    def _jobs(self) -> int:
        tracker = self.spark.sparkContext.statusTracker()
        return len(tracker.getJobIdsForGroup(None) or [])  # (every job so far: none has a group)

    def install(self) -> None:
        from mqttmesh.pipeline import jobs, load, payloads

        for name in self.STEPS:
            self._wrap(jobs, name)
        for name in ("sample_payloads", "payload_pass", "tables_of", "split_tables"):
            self._wrap(payloads, name, label=f"payloads.{name}")
        self._wrap(load, "_text_columns", label="write_table: CSV text")

    def _wrap(self, module, name: str, label: str | None = None) -> None:
        fn = getattr(module, name)
        label = label or name
        prof = self

        def timed(*a, **kw):
            t, j = time.monotonic(), prof._jobs()
            try:
                return fn(*a, **kw)
            finally:
                # (a table's write is named by its table)
                key = f"{label} {a[2]}" if name in ("write_table", "write_arrow") and len(a) > 2 else label
                row = prof.rows.setdefault(key, [0, 0.0, 0])
                row[0] += 1
                row[1] += time.monotonic() - t
                row[2] += prof._jobs() - j

        self.saved.append((module, name, fn))
        setattr(module, name, timed)

    def uninstall(self) -> None:
        for module, name, fn in reversed(self.saved):
            setattr(module, name, fn)
        self.saved.clear()

    def table(self, job: str, total: float, jobs: int) -> list[str]:
        out = [f"{job}: {total:.1f}s, {jobs} Spark jobs", "| step | calls | seconds | Spark jobs |"]
        out.append("|---|---:|---:|---:|")
        for label, (calls, secs, n) in sorted(self.rows.items(), key=lambda kv: -kv[1][1]):
            out.append(f"| {label} | {calls} | {secs:.2f} | {n} |")
        self.rows = {}
        return out


def figures_spark(args) -> int:
    from mqttmesh.pipeline.jobs import job_options, run_payloads, run_traffic
    from mqttmesh.pipeline.session import build_session

    work = Path(args.workdir or tempfile.mkdtemp(prefix="mqttmesh-spark-figures-"))
    archive = work / "archive"
    try:
        if not archive.exists() or args.regenerate:
            shutil.rmtree(archive, ignore_errors=True)
            t = time.monotonic()
            files = synthesize(str(archive), args.rows)
            print(f"synthesized {args.rows:,} rows in {files} files in {time.monotonic() - t:.0f}s", flush=True)
        files, rows, size = archive_bytes(str(archive))
        print(f"archive: {rows:,} rows, {files} files, {size / 1e6:.0f} MB ({size / rows:.1f} bytes/row)", flush=True)
        cores = (
            int(args.master[len("local[") : -1])
            if args.master.startswith("local[") and args.master[6:-1].isdigit()
            else os.cpu_count()
        )
        spark = build_session(
            "mqttmesh-figures", args.master, args.shuffle_partitions, {"spark.driver.memory": args.driver_memory}
        )
        profile = _Profile(spark) if args.profile else None
        try:
            out = []
            profiles: list[str] = []
            if profile:
                profile.install()
            for name, job in (("traffic", run_traffic), ("payloads", run_payloads)):
                if args.jobs and name not in args.jobs.split(","):
                    continue
                opts = job_options(archive=[str(archive)], out=str(work / "out" / name), window=60)
                t, jobs0 = time.monotonic(), profile._jobs() if profile else 0
                result = job(spark, opts, lambda s: None)
                took = time.monotonic() - t
                if profile:
                    profiles += profile.table(name, took, profile._jobs() - jobs0) + [""]
                assert result.summary["messages"] == rows, result.summary
                out.append((name, took, rows / took, rows / took / cores))
                print(
                    f"{name}: {took:.1f}s, {rows / took:,.0f} rows/s, {rows / took / cores:,.0f} rows/s per core",
                    flush=True,
                )
        finally:
            if profile:
                profile.uninstall()
            spark.stop()
        if profile:
            print("\n" + "\n".join(profiles))
        print(f"\n{rows:,} archived messages on {args.master} ({cores} cores), every table, chart and report written:")
        print("| job | seconds | rows/s | rows/s per core |")
        print("|---|---:|---:|---:|")
        for name, took, rps, rpc in out:
            print(f"| {name} | {took:.0f} | {rps:,.0f} | {rpc:,.0f} |")
    finally:
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)
    return 0


def figures_upkeep(args) -> int:
    """A Delta publish log of ``--commits`` flushes (a node's day at a flush interval: each
    flush spread over ``--hours``), then the times of ``compact`` and of ``expire`` (half the
    hours, and a full vacuum), as `mqttmesh archive compact|expire` runs them."""
    import datetime as dt

    import pyarrow as pa

    from mqttmesh.archive.schema import PUBLISH
    from mqttmesh.archive.table import TableWriter, compact, expire, snapshot_files
    from mqttmesh.archive.writer import publish_table, records_array

    work = Path(tempfile.mkdtemp(prefix="mqttmesh-upkeep-"))
    try:
        w = TableWriter(str(work), "n1", PUBLISH)
        start, span = 1769860800.0, args.hours * 3600.0
        per, seq = args.rows, 0
        t = time.monotonic()
        for i in range(args.commits):
            at = start + span * i / args.commits
            records = [
                (at + j * 0.001, seq + j, f"dev-{j % 50}", f"s/{j % 10}/dev-{j % 50}", 1, False, b'{"t": 21.5}')
                for j in range(per)
            ]
            seq += per
            w.append(publish_table(pa.chunked_array([records_array(PUBLISH, records)]), "n1"))
        made = time.monotonic() - t
        log = str(work / PUBLISH)
        _, files = snapshot_files(log)
        print(f"{args.commits:,} commits of {per:,} rows over {args.hours} hours: {len(files):,} files ({made:.1f}s)")
        t = time.monotonic()
        c = compact(log, args.target_bytes)
        took = time.monotonic() - t
        _, after = snapshot_files(log)
        print(
            f"compact: {took:.2f}s, {c.files_removed:,} files merged into {c.files_added:,}; {len(after):,} files now"
        )
        t = time.monotonic()
        e = expire(log, dt.datetime.fromtimestamp(start + span / 2, dt.UTC), vacuum_hours=0.0)
        took = time.monotonic() - t
        print(
            f"expire (half the hours, then vacuum): {took:.2f}s, {e.rows_removed:,} rows removed,"
            f" {e.files_vacuumed:,} files deleted"
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


def figures_bytes(args) -> int:
    for kind in ("publish", "delivery"):
        files, rows, size = archive_bytes(args.dir, kind)
        if rows:
            print(f"{kind}: {rows:,} rows in {files} files, {size:,} bytes: {size / rows:.1f} bytes per row")
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.pipeline_figures",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = p.add_subparsers(dest="what", required=True)
    a = sub.add_parser("archive", help="broker throughput with the archive off and on")
    a.add_argument("--rounds", type=int, default=3)
    a.add_argument("--workloads", default="fanin,fanout")
    a.add_argument("--qos", default="0,1")
    a.add_argument("--duration", type=float, default=3.0)
    a.add_argument("--formats", default="parquet,delta", help="archive formats to run beside no archive")
    a.set_defaults(func=figures_archive)
    s = sub.add_parser("spark", help="traffic and payloads on a synthetic archive")
    s.add_argument("--rows", type=int, default=10_000_000)
    s.add_argument("--master", default="local[2]")
    s.add_argument("--shuffle-partitions", type=int, default=8)
    s.add_argument("--driver-memory", default="4g")
    s.add_argument("--workdir", help="keep the archive and reports here (default: a temporary directory)")
    s.add_argument("--regenerate", action="store_true", help="write the archive again even if --workdir has one")
    s.add_argument("--profile", action="store_true", help="each step's seconds and Spark jobs")
    s.add_argument("--jobs", default="", help="only these jobs (traffic,payloads)")
    s.set_defaults(func=figures_spark)
    u = sub.add_parser("upkeep", help="compaction and retention of a Delta log of many small flushes")
    u.add_argument("--commits", type=int, default=8640, help="flushes (8,640: a day at 10 s)")
    u.add_argument("--rows", type=int, default=100, help="rows per flush")
    u.add_argument("--hours", type=int, default=24)
    u.add_argument("--target-bytes", type=int, default=128 << 20)
    u.set_defaults(func=figures_upkeep)
    b = sub.add_parser("bytes", help="bytes per message of an archive")
    b.add_argument("dir")
    b.set_defaults(func=figures_bytes)
    args = p.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
