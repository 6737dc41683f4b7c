"""Summaries, ratios, targets, the stdout table, latest.json and BENCHMARKS.md."""

from __future__ import annotations

import json
import os
import platform
import statistics
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# the metrics summarised over the runs of a cell (median in the table, min/max in the JSON)
METRICS = [
    "delivered_per_s",
    "delivered_fraction",
    "p50_ms",
    "p99_ms",
    "max_ms",
    "lost",
    "dups",
    "broker_cpu_us_per_msg",
    "broker_cpu_util",
    "gen_cpu_util",
    "machine_busy",
    "published_per_s",
    "gen_cpu_s",
    "drain_s",
]


def summarize(runs: list[dict]) -> dict:
    ok = [r for r in runs if r.get("ok")]
    out: dict = {"runs_ok": len(ok), "runs": len(runs)}
    for m in METRICS:
        values = [r[m] for r in ok if r.get(m) is not None]
        if values:
            out[m] = {"median": statistics.median(values), "min": min(values), "max": max(values)}
        else:
            out[m] = None
    # loss and duplicates matter in every run, not in the median one
    out["lost_total"] = sum(r.get("lost", 0) for r in ok)
    out["dups_total"] = sum(r.get("dups", 0) for r in ok)
    out["errors"] = sorted({e for r in runs for e in ([r["error"]] if r.get("error") else []) + r.get("errors", [])})[
        :20
    ]
    return out


def med(cell: dict | None, metric: str):
    if not cell or cell.get("na") or not cell.get("summary"):
        return None
    s = cell["summary"].get(metric)
    return s["median"] if s else None


def ratios(cells: list[dict]) -> None:
    """Add mqttmesh/mosquitto and mqttmesh/amqtt (median delivered msgs/s) to the mqttmesh cells."""
    by_key = {(c["broker"], c["workload"], c["qos"]): c for c in cells}
    for c in cells:
        if c["broker"] == "mesh2":
            ours = med(c, "delivered_per_s")
            same = med(by_key.get(("mqttmesh", c["workload"], c["qos"])), "delivered_per_s")
            c["vs_same_node"] = (ours / same) if ours is not None and same else None
            continue
        if c["broker"] != "mqttmesh":
            continue
        ours = med(c, "delivered_per_s")
        for other in ("mosquitto", "mosquitto-default", "amqtt"):
            theirs = med(by_key.get((other, c["workload"], c["qos"])), "delivered_per_s")
            c[f"vs_{other}"] = (ours / theirs) if ours is not None and theirs else None


def evaluate_targets(cells: list[dict], paced: set[str], without_amqtt: frozenset[str] = frozenset()) -> list[dict]:
    """The issue's targets with pass / fail / n/a and the numbers behind them
    (``without_amqtt``: workloads amqtt does not run)."""
    by_key = {(c["broker"], c["workload"], c["qos"]): c for c in cells}
    targets = []

    def verdict(ok):
        return "n/a" if ok is None else ("PASS" if ok else "FAIL")

    def ratio_target(broker, ratio, floor, label):
        for q in (0, 1):
            c = by_key.get((broker, "fanin", q))
            r = c.get(ratio) if c else None
            targets.append(
                {
                    "target": label.format(q=q, floor=floor),
                    "result": verdict(None if r is None else r >= floor),
                    "value": f"{r:.2f} x" if r is not None else "not measured",
                }
            )

    ratio_target("mqttmesh", "vs_mosquitto", 0.5, "fanin QoS {q}: delivered msgs/s >= {floor} x Mosquitto")

    # issue 20: more than the node can deliver, every broker at its default limits; what counts
    # is what arrives, and that nothing acknowledged is dropped
    for q, other, label in ((0, "mosquitto-default", "Mosquitto default"), (1, "mosquitto", "Mosquitto tuned")):
        c = by_key.get(("mqttmesh", "saturation", q))
        r = c.get(f"vs_{other}") if c else None
        frac = med(c, "delivered_fraction")
        worst = c["summary"]["delivered_fraction"]["min"] if r is not None and frac is not None else None
        targets.append(
            {
                "target": f"saturation QoS {q}: delivered msgs/s >= 1.3 x {label}"
                + (", >= 99 % of acknowledged messages delivered" if q else ""),
                "result": verdict(None if r is None else (r >= 1.3 and (q == 0 or (worst or 0) >= 0.99))),
                "value": f"{r:.2f} x, {frac * 100:.1f} % delivered (worst run {worst * 100:.1f} %)"
                if r is not None and frac is not None and worst is not None
                else "not measured",
            }
        )

    amqtt_ratios = [
        (c["workload"], c["qos"], c.get("vs_amqtt"))
        for c in cells
        if c["broker"] == "mqttmesh" and c["workload"] not in paced and c["workload"] not in without_amqtt
    ]
    measured = [(w, q, r) for w, q, r in amqtt_ratios if r is not None]
    if measured:
        worst = min(measured, key=lambda t: t[2])
        ok = all(r >= 20 for _, _, r in measured)
        value = f"lowest {worst[2]:.1f} x ({worst[0]} QoS {worst[1]}) over {len(measured)} cells"
        if len(measured) < len(amqtt_ratios):
            value += f"; {len(amqtt_ratios) - len(measured)} cells not comparable"
    else:
        ok, value = None, "not measured"
    targets.append(
        {"target": ">= 20 x amqtt delivered msgs/s on every throughput workload", "result": verdict(ok), "value": value}
    )

    for name in sorted(paced):
        for q in (0, 1):
            c = by_key.get(("mqttmesh", name, q))
            p99 = med(c, "p99_ms")
            rate = med(c, "delivered_per_s")
            worst = c["summary"]["p99_ms"]["max"] if c and not c.get("na") and c["summary"].get("p99_ms") else None
            targets.append(
                {
                    "target": f"{name} (paced 10,000 msgs/s) QoS {q}: p99 <= 2 ms",
                    "result": verdict(None if p99 is None else p99 <= 2.0),
                    "value": (f"median p99 {p99:.2f} ms (worst run {worst:.2f} ms), {rate:,.0f} msgs/s delivered")
                    if p99 is not None
                    else "not measured",
                }
            )

    # issue 3: a message crossing a peer link, against the same workload on one node
    ratio_target("mesh2", "vs_same_node", 0.7, "cross-node fanin QoS {q}: delivered msgs/s >= {floor} x same-node")
    for name in sorted(paced):
        for q in (0, 1):
            c = by_key.get(("mesh2", name, q))
            p99 = med(c, "p99_ms")
            targets.append(
                {
                    "target": f"cross-node {name} (paced 10,000 msgs/s) QoS {q}: p99 <= 3 ms",
                    "result": verdict(None if p99 is None else p99 <= 3.0),
                    "value": f"median p99 {p99:.2f} ms" if p99 is not None else "not measured",
                }
            )

    ours = [c for c in cells if c["broker"] in ("mqttmesh", "mesh2") and c["qos"] >= 1]
    if ours:
        lost = sum(c["summary"]["lost_total"] for c in ours if not c.get("na"))
        runs = sum(c["summary"]["runs_ok"] for c in ours if not c.get("na"))
        failed = sum(c["summary"]["runs"] - c["summary"]["runs_ok"] for c in ours if not c.get("na"))
        failed += sum(1 for c in ours if c.get("na"))
        ok = lost == 0 and failed == 0
        value = f"{lost} lost over {runs} runs"
        if failed:
            value += f"; {failed} runs/cells failed (see errors)"
        targets.append(
            {
                "target": "zero lost QoS 1/2 messages in every run (mqttmesh and mesh2)",
                "result": verdict(ok),
                "value": value,
            }
        )
    else:
        targets.append(
            {
                "target": "zero lost QoS 1/2 messages in every run (mqttmesh and mesh2)",
                "result": "n/a",
                "value": "not measured",
            }
        )
    return targets


# --------------------------------------------------------------------------- formatting


def _f(v, fmt: str, none: str = "-") -> str:
    return none if v is None else format(v, fmt)


def table_rows(cells: list[dict]) -> tuple[list[str], list[list[str]]]:
    head = [
        "workload",
        "QoS",
        "broker",
        "msgs/s",
        "delivered",
        "sent/s",
        "p50 ms",
        "p99 ms",
        "lost",
        "dups",
        "CPU µs/msg",
        "broker CPU",
        "gen CPU",
        "runs",
        "× mosquitto",
        "× amqtt",
        "× same node",
    ]
    rows = []
    for c in cells:
        if c.get("na"):
            rows.append([c["workload"], str(c["qos"]), c["broker"], f"n/a ({c['na']})"] + [""] * (len(head) - 4))
            continue
        s = c["summary"]
        util = med(c, "broker_cpu_util")
        gen = med(c, "gen_cpu_util")
        rows.append(
            [
                c["workload"],
                str(c["qos"]),
                c["broker"],
                _f(med(c, "delivered_per_s"), ",.0f"),
                _f(None if (fr := med(c, "delivered_fraction")) is None else fr * 100, ".1f")
                + ("%" if fr is not None else ""),
                _f(med(c, "published_per_s"), ",.0f"),
                _f(med(c, "p50_ms"), ".2f"),
                _f(med(c, "p99_ms"), ".2f"),
                str(s["lost_total"]),
                str(s["dups_total"]),
                _f(med(c, "broker_cpu_us_per_msg"), ".2f"),
                _f(None if util is None else util * 100, ".0f") + ("%" if util is not None else ""),
                _f(None if gen is None else gen * 100, ".0f") + ("%" if gen is not None else ""),
                f"{s['runs_ok']}/{s['runs']}",
                _f(c.get("vs_mosquitto-default" if c["workload"] == "saturation" else "vs_mosquitto"), ".2f")
                if c["broker"] == "mqttmesh"
                else "",
                _f(c.get("vs_amqtt"), ".1f") if c["broker"] == "mqttmesh" else "",
                _f(c.get("vs_same_node"), ".2f") if c["broker"] == "mesh2" else "",
            ]
        )
    return head, rows


def text_table(head: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(head[k]), *(len(r[k]) for r in rows)) if rows else len(head[k]) for k in range(len(head))]
    # an n/a reason spans the rest of its row: do not let it widen the msgs/s column
    widths[3] = max([len(head[3])] + [len(r[3]) for r in rows if not r[3].startswith("n/a")])
    lines = [
        "  ".join(h.ljust(wd) for h, wd in zip(head, widths, strict=False)).rstrip(),
        "  ".join("-" * wd for wd in widths),
    ]
    for r in rows:
        lines.append(
            "  ".join(
                v.rjust(wd) if k >= 3 and not v.startswith("n/a") else v.ljust(wd)
                for k, (v, wd) in enumerate(zip(r, widths, strict=False))
            ).rstrip()
        )
    return "\n".join(lines)


def md_table(head: list[str], rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(head) + " |", "|" + "|".join("---" if k < 3 else "---:" for k in range(len(head))) + "|"]
    for r in rows:
        out.append("| " + " | ".join(v.replace("|", "/") for v in r) + " |")
    return "\n".join(out)


def targets_text(targets: list[dict]) -> str:
    return "\n".join(f"  [{t['result']:>4}] {t['target']}: {t['value']}" for t in targets)


# --------------------------------------------------------------------------- machine


def machine_info() -> dict:
    model = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = "?"
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                mem = f"{int(line.split()[1]) / 1024 / 1024:.1f} GiB"
    except (OSError, ValueError):
        pass
    try:
        import uvloop

        uv = uvloop.__version__
    except ImportError:
        uv = "not installed"
    return {
        "nproc": os.cpu_count(),
        "cpu_model": model,
        "memory": mem,
        "kernel": platform.release(),
        "python": platform.python_version(),
        "uvloop": uv,
    }


# --------------------------------------------------------------------------- files


def write_json(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=False, default=str))
    tmp.replace(path)


def _busy_note(meta: dict) -> str:
    load = meta.get("loadavg_before")
    if not load or load[0] < 0.5:
        return ""
    return (
        f"\n**Other work was running on the machine** (load average {load[0]:.2f} before the benchmark "
        "started): the numbers are noisier than on an idle machine, latencies most of all."
    )


def _load(values) -> str:
    return " ".join(f"{x:.2f}" for x in values) if values else "?"


def write_markdown(path: Path, data: dict) -> None:
    meta = data["meta"]
    m = meta["machine"]
    v = meta["versions"]
    o = meta["options"]
    head, rows = table_rows(data["cells"])
    targets = data["targets"]
    problems = []
    for c in data["cells"]:
        for line in c.get("broker_log_problems", []):
            problems.append(f"- {c['broker']} {c['workload']} QoS {c['qos']} (log): `{line}`")
        if c.get("summary"):
            for e in c["summary"]["errors"]:
                problems.append(f"- {c['broker']} {c['workload']} QoS {c['qos']}: {e.splitlines()[0][:300]}")
    if len(problems) > 60:
        problems = problems[:60] + [f"- ... {len(problems) - 60} more in bench/results/latest.json"]

    text = (
        f"""# Benchmarks

*Written by `make bench` (bench/report.py) on {meta["date"]}; do not edit by hand, re-run instead.*
Command: `{meta["command"]}`{" — **quick smoke run, not a measurement**" if o.get("quick") else ""}

## How to reproduce

```sh
make bench                                   # everything, 3 repeats (~10-15 min on 2 cores)
.venv/bin/python -m bench --quick            # smoke test: 1 repeat, short windows (~2-3 min)
.venv/bin/python -m bench --brokers mqttmesh,mosquitto --workloads fanin --qos 0,1
.venv/bin/python -m bench --help             # windows, flow-control and mesh options
.venv/bin/python -m bench.selftest           # checks the generator's loss/duplicate counting
```

Needs `/usr/sbin/mosquitto` (`apt-get install mosquitto`). amqtt {v.get("amqtt_wanted", "0.12.1")} is installed
into its own venv `.venv-amqtt/` on first use. Raw numbers of every run: `bench/results/latest.json`;
broker logs: `bench/results/logs/`.

## Machine

| | |
|---|---|
| CPUs (nproc) | {m["nproc"]} |
| CPU model | {m["cpu_model"]} |
| memory | {m["memory"]} |
| kernel | {m["kernel"]} |
| Python (harness and mqttmesh) | {m["python"]}, uvloop {m["uvloop"]} |
| mqttmesh | {v.get("mqttmesh", "?")} |
| Mosquitto | {v.get("mosquitto", "?")} |
| amqtt | {v.get("amqtt", "?")} |
| load average before / after | {_load(meta.get("loadavg_before"))} / {_load(meta.get("loadavg_after"))} |
| total time | {meta.get("elapsed_s", 0) / 60:.1f} min |

## Targets

| target | result | measured |
|---|---|---|
"""
        + "\n".join(f"| {t['target']} | **{t['result']}** | {t['value']} |" for t in targets)
        + f"""

## Results

Median of {o["repeat"]} run(s) per row; `lost` and `dups` are totals over all runs. Windows: {o["warmup"]:g} s
warm-up then {o["duration"]:g} s measured; 64-byte payloads; loopback.{_busy_note(meta)}

{md_table(head, rows)}

- **msgs/s**: distinct messages received by all subscribers inside the measurement window, per second
  (goodput: what arrived, not what was published). **delivered**: the share of the messages sent at
  QoS 0, or acknowledged at QoS 1/2, that reached every subscriber they should have, by the end of the
  drain. **sent/s**: messages the publishers sent per second over warm-up and window.
- **p50/p99 ms**: publish-to-receive latency of the messages received in the window (CLOCK_MONOTONIC
  stamped in the payload by the publisher process, read by the subscriber process). In unpaced rows it is
  mostly queueing inside the end-to-end window, so only the `latency` rows say how fast a message gets through.
- **lost**: sent at QoS 0, or acknowledged at QoS 1/2, and never received by a subscriber that should have.
- **CPU µs/msg**: the broker's utime+stime (/proc/PID/stat) from start to end of the run, per message delivered.
  **broker CPU**: that CPU time over the run's wall time (100 % = one core busy). A broker well below 100 % while
  the generator uses the other core is not the bottleneck: that row measured the load generator.
  **gen CPU**: the same for all load-generator processes together (200 % = both cores). Both figures come
  from /proc/PID/stat, which does not charge the kernel's loopback TCP work (softirq) to any process.
- **× mosquitto / × amqtt**: mqttmesh's msgs/s over theirs, same workload and QoS; in the
  `saturation` rows, over Mosquitto at its stock limits (`mosquitto-default`).
- **mesh2 / × same node**: two mqttmesh nodes linked as a mesh (`--cluster-secret`, the second
  `--peer`s the first), publishers on the first and subscribers on the second, so every message
  crosses a peer link; the ratio is its msgs/s over the single-node mqttmesh row. Both nodes and
  the load generator share the machine's two cores, and the broker CPU column adds up both nodes.

{{KEPT}}## Method

- Brokers: mqttmesh (`python -m mqttmesh broker --sys-interval 0 --max-inflight 1000 --max-queued 1000000`,
  uvloop), Mosquitto (`set_tcp_nodelay true`, `max_inflight_messages 1000`, `max_queued_messages 1000000`,
  no persistence), amqtt (anonymous-auth plugin only). Each (workload, QoS) starts a fresh broker process on
  a free loopback port; the repeats of that row run against it one after the other.
- Load generator (bench/loadgen.py): raw asyncio Protocols on uvloop, its own MQTT encoder (bench/mqttproto.py),
  publishers and subscribers in separate OS processes (2 publisher processes where there are several publishers,
  2 subscriber processes for 50 subscribers); each client writes everything it has for one loop iteration at once.
- Workloads: `saturation` 4 publishers → 1 subscriber on `bench/#` with no end-to-end window (the
  publishers send as fast as the broker reads them) and every broker at its default limits: mqttmesh
  without the two limits above, Mosquitto both tuned (`mosquitto`) and as it comes
  (`mosquitto-default`: no `set_tcp_nodelay`, 20 in flight, 1,000 queued); `fanin` 4 publishers →
  1 subscriber on `bench/#`; `fanout` 1 publisher → 50 subscribers of one topic;
  `p2p` 50 publishers → 50 subscribers, one topic per pair; `latency` like fanin but paced at 10,000 msgs/s total.
  Subscribers subscribe at the QoS of the run and acknowledge everything (PUBACK; PUBREC/PUBREL/PUBCOMP).
- Flow control: QoS 1/2 publishers keep at most {o.get("inflight_desc", "500 (p2p: 100)")} PUBLISHes unacknowledged.
  At every QoS a publisher also stays at most {o.get("e2e_desc", "1000 (p2p: 100)")} messages ahead of the slowest
  of its subscribers (counters in shared memory): publishing "as fast as the broker takes them" otherwise only
  measures how much a broker buffers or drops. Publishers also stop writing while their socket buffer is full.
- A run: subscribers connect and subscribe, publishers connect, all start at once; publish for warm-up + window;
  publishers wait for their acks; subscribers wait until everything arrived, or {o["quiet"]:g} s without
  progress, or {o["drain_timeout"]:g} s. Every phase has a deadline and every process is killed by PID at the end.

## Errors and warnings seen

"""
        + ("\n".join(problems) if problems else "None.")
        + "\n"
    )
    path.write_text(text.replace("{KEPT}", kept_sections(path)))


KEPT_BEGIN, KEPT_END = "<!-- BEGIN kept", "<!-- END kept -->"


def kept_sections(path: Path) -> str:
    """The sections of ``path`` between KEPT_BEGIN and KEPT_END markers, each with its markers:
    figures other benchmarks wrote (bench/shared.py's), which a new ``make bench`` keeps."""
    if not path.exists():
        return ""
    old = path.read_text()
    out = []
    at = old.find(KEPT_BEGIN)
    while at >= 0:
        end = old.find(KEPT_END, at)
        if end < 0:
            break
        out.append(old[at : end + len(KEPT_END)] + "\n\n")
        at = old.find(KEPT_BEGIN, end)
    return "".join(out)
