"""One run: start the nodes, the workload and the nemesis; drain; judge; clean up."""

from __future__ import annotations

import os
import random
import shutil
import statistics
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mqttmesh.sim.history import History

from .checker import check
from .cluster import Cluster
from .nemesis import KINDS, Nemesis, schedule, windows_of
from .nodelogs import link_losses
from .sharecheck import check_shared
from .workload import Options, Workload


@dataclass
class RunConfig:
    broker: str = "mqttmesh"
    nodes: int = 5
    seed: int = 1
    duration: float = 90.0  # seconds of load and faults
    max_pause: float = 5.0
    tail: float = 30.0  # longest wait for the drain after the last heal
    quiet: float = 3.0  # the drain: no message received for this long
    settle: float = 2.0
    startup_timeout: float = 60.0
    # after the drain, each ClientId on one node at most within this (a connection whose client
    # left without a word, through a node that was paused or cut off, ends when the node sees
    # its keep alive run out: 1.5 x Options.keepalive, then the node's sweep)
    one_connection_within: float = 15.0
    keep: bool = False  # keep the nodes' directory (logs, stores)
    workload: Options | None = None
    kinds: tuple[str, ...] | None = None  # only these fault kinds, each once (nemesis.schedule)
    # each node archives under archive/nodes/NODE, and the audit job (its tables and report in
    # archive/audit) is reconciled with the checker after the nodes stopped (auditcheck.py)
    archive: Path | None = None
    flush_interval: float = 1.0  # the nodes' archive.flush_interval
    spark: Any = None  # the audit's SparkSession (None: a local one for the audit)


def wait_until(predicate: Callable[[], bool], timeout: float, interval: float = 0.05) -> bool:
    """Poll ``predicate`` until it holds or ``timeout`` passes; whether it held."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(interval)
    return True


def run(cfg: RunConfig, log: Callable[[str], None] = print) -> dict[str, Any]:
    wopts = cfg.workload or Options()
    rng = random.Random(cfg.seed)
    log(
        f"chaos: broker {cfg.broker}, seed {cfg.seed}, {cfg.nodes} nodes, {wopts.rate:g} msgs/s, "
        f"pid range {wopts.pid_range}, {cfg.duration:g} s" + (", shared group" if wopts.shared else "")
    )
    workdir = Path(tempfile.mkdtemp(prefix=f"chaos-{cfg.broker}-{cfg.seed}-"))
    history = History()
    cluster: Cluster | None = None
    wl: Workload | None = None
    out: dict[str, Any] = {
        "broker": cfg.broker,
        "seed": cfg.seed,
        "nodes": cfg.nodes,
        "rate": wopts.rate,
        "pid_range": wopts.pid_range,
        "mqtt5": wopts.mqtt5,
        "shared": wopts.shared,
        "duration": cfg.duration,
        "settle": cfg.settle,
        "completed": False,
        "wall0": None,  # the wall-clock time of the history's 0
    }
    t_begin = time.monotonic()
    try:
        archive_nodes = None if cfg.archive is None else cfg.archive / "nodes"
        cluster = Cluster(cfg.broker, cfg.nodes, workdir, archive_nodes, cfg.flush_interval)
        faults = schedule(
            random.Random(rng.getrandbits(64)),
            cluster.names,
            cluster.pairs(),
            cfg.duration,
            cfg.max_pause,
            kinds=cfg.kinds,
        )
        cluster.start()
        t0 = time.monotonic()
        out["wall0"] = wall0 = time.time()  # (the archive's times are the nodes' wall clocks)
        wl = Workload(cluster.ports, history, random.Random(rng.getrandbits(64)), wopts, t0)
        wl.start()
        wl.heal("start-up", wl.now())
        workload = wl
        if not wait_until(
            lambda: workload.snapshot()["measuring"] == 0 and workload.measurements[0].t_done is not None,
            cfg.startup_timeout,
        ):
            raise RuntimeError(f"the nodes did not link up within {cfg.startup_timeout}s ({workdir})")
        log(f"chaos: linked up {wl.measurements[0].t_done:.2f}s after the nodes listened")
        wl.persistent_on = True
        if not wait_until(lambda: workload.snapshot()["subscribed"] == wopts.subscribers, 30):
            raise RuntimeError("the subscribers did not subscribe within 30s")
        t_start = wl.now()
        for f in faults:
            f.start += t_start
            f.end += t_start
            f.toggles = [t + t_start for t in f.toggles]
        wl.publishing = wl.moving = True
        nemesis = Nemesis(cluster, faults, wl.heal, log)
        nemesis.run(t0, stop=lambda: bool(workload.errors))
        while wl.now() < t_start + cfg.duration and not wl.errors:  # the load runs its length
            time.sleep(0.05)
        wl.publishing = wl.moving = False
        t_tail = wl.now()
        log(f"[{t_tail:7.2f}s] chaos: load over, draining (at most {cfg.tail:g}s)")

        def drained() -> bool:
            s = workload.snapshot()
            return bool(
                s["connected"] == s["clients"]
                and s["unacked"] == 0
                and s["quiet_for"] >= cfg.quiet
                and s["measuring"] == 0
            )

        out["drained"] = wait_until(drained, cfg.tail)
        out["drain_s"] = round(wl.now() - t_tail, 2)
        out["drain_state"] = wl.snapshot()
        persistent = {a.name for a in wl.persistent()}
        connections = None
        t_one = wl.now()

        def one_each() -> bool:  # (the clients stay connected meanwhile)
            nonlocal connections
            connections = cluster.connections_per_client()
            if connections is None:
                return True
            return all(n <= 1 for n in connections.values()) and all(connections.get(c, 0) == 1 for c in persistent)

        try:
            if wait_until(one_each, cfg.one_connection_within, interval=0.25):
                out["one_connection_s"] = round(wl.now() - t_one, 2)
            elif connections is not None:  # (which nodes list a ClientId that is not on one)
                out["connections_where"] = {c: n for c, n in cluster.where.items() if len(n) != 1}
        except (OSError, ConnectionError) as exc:
            out["connections_error"] = repr(exc)
        wl.stop()
        if wl.errors:
            raise RuntimeError("; ".join(wl.errors))
        windows = windows_of(nemesis.events, nemesis.faults)
        if wopts.shared:
            lost_links = link_losses(_node_logs(cluster), wall0, wl.now())
            out["link_losses"] = dict(Counter(w["reason"] for w in lost_links))
            out["link_loss_windows"] = lost_links
            shared = check_shared(history, persistent, cfg.settle, connections, nemesis.pauses(), windows + lost_links)
            result, summary = shared.base, shared.summary()
            out["shared_samples"] = {
                "lost": shared.lost[:50],
                "lost_context": shared.lost_context[:50],
                "unexplained": shared.unexplained[:50],
                "qos2_inbound": shared.qos2_inbound[:50],
                "resends": shared.resends[:50],
            }
        else:
            result = check(history, persistent, cfg.settle, connections, nemesis.pauses())
            summary = result.summary()
        heals = [m.as_dict() for m in wl.measurements]
        times = [h["reconverged_s"] for h in heals[1:] if h["reconverged_s"] is not None]
        alone = [h["reconverged_s"] for h in heals[1:] if h["reconverged_s"] is not None and h["alone"]]
        out.update(
            {
                "completed": True,
                "check": summary,
                "samples": {
                    "lost": result.lost[:20],
                    "qos2_duplicates": result.qos2_dups[:20],
                    "pid_reuse": result.pid_reuse[:20],
                    "wrong_session_present": result.wrong_session_present[:20],
                },
                "faults": [f.as_dict() for f in faults],
                "events": nemesis.events,
                "applied": nemesis.applied,
                "healed": nemesis.healed,
                "every_kind_applied_and_healed": all(
                    nemesis.applied[k] > 0 and nemesis.applied[k] == nemesis.healed[k] for k in KINDS
                ),
                "reconvergence": heals,
                "reconvergence_median_s": round(statistics.median(times), 3) if times else None,
                "reconvergence_max_s": max(times) if times else None,
                "reconvergence_alone_median_s": round(statistics.median(alone), 3) if alone else None,
                "reconvergence_alone_max_s": max(alone) if alone else None,
                "reconvergence_alone_heals": sum(1 for h in heals[1:] if h["alone"]),
                "reconvergence_unmeasured": sum(1 for h in heals[1:] if h["reconverged_s"] is None),
                "clients": {
                    a.name: {
                        "connections": a.conns,
                        "moves": a.moves,
                        "published": a.n,
                        "skipped": a.skipped,
                        "clean": a.clean,
                        "resets": a.resets,
                    }
                    for a in wl.clients()
                },
                "node_starts": {n: node.starts for n, node in cluster.nodes.items()},
                "history_ops": len(history.ops),
            }
        )
    finally:
        if wl is not None:
            wl.stop()
        if cluster is not None:
            cluster.close()
            out["left_running"] = [n for n, node in cluster.nodes.items() if node.alive()]
            out["stopped"] = cluster.stopped
        out["wall_s"] = round(time.monotonic() - t_begin, 1)
        out["history"] = history.ops
        if cfg.keep:
            out["workdir"] = str(workdir)
            log(f"chaos: nodes' directory kept: {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    if cfg.archive is not None and not wopts.shared:
        out["audit"] = _audit(cfg, history, result, wall0, windows, log)
    return out


def _audit(
    cfg: RunConfig,
    history: History,
    result: Any,
    wall0: float,
    windows: list[dict[str, Any]],
    log: Callable[[str], None],
) -> dict[str, Any]:
    """The audit job on the nodes' archives, reconciled with the checker's ``result``."""
    from .auditcheck import local_spark, read_audit, reconcile

    assert cfg.archive is not None
    first_suback: dict[str, float] = {}
    for op in history.ops:
        if op[3] == "subscribe":
            first_suback.setdefault(op[1], op[0])
    since = {c: wall0 + t + cfg.settle for c, t in first_suback.items()}
    roots = sorted(str(p) for p in (cfg.archive / "nodes").iterdir() if p.is_dir())
    t_begin = time.monotonic()
    spark = cfg.spark or local_spark()
    try:
        archived = read_audit(spark, roots, since, str(cfg.archive / "audit"))
    finally:
        if cfg.spark is None:
            spark.stop()
    kills = [(w["node"], w["start"]) for w in windows if w["kind"] == "kill"]
    # a node hands its records to its writer every flush_interval / 4: what a kill -9 can take
    # is younger than that, and flush_interval leaves the event loop of a loaded machine slack
    rec = reconcile(history, result, archived, wall0, kills, cfg.flush_interval)
    s = rec.summary()
    s["seconds"] = round(time.monotonic() - t_begin, 1)
    s["flush_interval"] = cfg.flush_interval
    log(
        f"chaos: audit of the archives ({s['seconds']:g} s): lost {rec.lost_audit} (checker {rec.lost_checker}), "
        f"QoS 2 duplicates {rec.qos2_dup_audit} (checker {rec.qos2_dup_checker}) on {rec.pairs_both:,} pairs; "
        f"packets written {rec.rows:,}, read {rec.reads:,}, matched {rec.matched:,}, written not read "
        f"{len(rec.written_not_read)}, read not logged {len(rec.read_not_logged)}; acked not archived "
        f"{len(rec.acked_not_archived)}; unexplained {rec.unexplained}: " + ("agrees" if rec.agrees else "DISAGREES")
    )
    return s


def _node_logs(cluster: Any) -> dict[str, list[str]]:
    """Each node's log lines (every life of it: a restart appends)."""
    return node_logs({name: node.log_path for name, node in cluster.nodes.items()})


def node_logs(paths: dict[str, Any]) -> dict[str, list[str]]:
    out = {}
    for name, path in paths.items():
        if os.path.exists(path):
            with open(path, encoding="utf-8", errors="replace") as f:
                out[name] = f.read().splitlines()
    return out
