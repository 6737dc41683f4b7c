"""The summary of a run, as a JSON-able dict and as text; MQTT-ST full replication for comparison.

Pure: reads a finished Simulator. Memory is measured with sys.getsizeof over
the engine's routing structures, each string counted once per node (in one
simulator process engines share interned strings; on real nodes they do not).
"""

from __future__ import annotations

import json
import statistics
import sys
import time

from .checks import dijkstra
from .core import ATTRIBUTED

__all__ = ["summarize", "format_text", "engine_memory", "mqtt_st"]


def _size(obj, seen: set) -> int:
    """getsizeof of obj and what it holds (dicts, lists, tuples, sets, strings, simple objects)."""
    total = 0
    stack = [obj]
    for _ in range(10_000_000):  # bounded walk
        if not stack:
            break
        o = stack.pop()
        if id(o) in seen or o is None or isinstance(o, (bool, int, float)) and -5 <= o <= 256:
            continue
        seen.add(id(o))
        total += sys.getsizeof(o)
        if isinstance(o, dict):
            stack.extend(o.keys())
            stack.extend(o.values())
        elif isinstance(o, (list, tuple, set, frozenset)):
            stack.extend(o)
        elif hasattr(o, "__dict__"):
            stack.extend(vars(o).values())
        elif hasattr(o, "__slots__"):
            stack.extend(getattr(o, s) for s in o.__slots__ if hasattr(o, s))
    return total


def engine_memory(engine) -> dict:
    """Bytes of one node's routing state: the router LSDB, the interest LSDB, the interest index."""
    seen: set = set()
    lsdb = _size(engine.routers, seen)
    interests = _size(engine.interests, seen)
    index = engine.remote
    index_bytes = _size(index._holders, seen) + _size(index._shapes, seen)
    db = sum(len(json.dumps(r.to_json())) for r in engine.routers.values())
    db += sum(len(json.dumps(i.full_json())) for i in engine.interests.values())
    return {
        "lsdb_bytes": lsdb,
        "interest_bytes": interests,
        "index_bytes": index_bytes,
        "routing_state_bytes": lsdb + interests + index_bytes,
        "advert_db_bytes": db,
        "routers": len(engine.routers),
        "filters_indexed": len(index),
    }


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def mqtt_st(sim) -> dict:
    """What MQTT-ST's full replication would cost on the same graph and the same messages.

    MQTT-ST elects a root (the smallest id) and floods every message to every
    broker along one spanning tree (the root's shortest-latency tree): each
    message costs one copy per tree link, and travels tree paths, not shortest
    paths. Computed over the messages the mesh delivered in steady state.
    """
    up = [n for n in sim.names if sim.nodes[n].up]
    adj: dict[str, dict[str, float]] = {n: {} for n in up}
    for link in sim.links.values():
        if link.a in adj and link.b in adj and sim._avail(link):
            adj[link.a][link.b] = adj[link.b][link.a] = link.latency
    root = min(up)
    dist, parent, depth = dijkstra(root, adj)
    tree_nodes = set(dist)
    tdeg = {n: 0 for n in tree_nodes}
    for child, par in parent.items():
        tdeg[child] += 1
        tdeg[par] += 1

    def tree_latency(a: str, b: str) -> float:
        total = 0.0
        for _ in range(2 * len(tree_nodes)):  # climb to the lowest common ancestor
            if a == b:
                return total
            if depth[a] >= depth[b]:
                total += adj[a][parent[a]]
                a = parent[a]
            else:
                total += adj[b][parent[b]]
                b = parent[b]
        return total

    messages = [r for r in sim.msgs.values() if r.checked and r.expected and r.origin in tree_nodes]
    stretch: list[float] = []
    for rec in messages[:2000]:
        lat = dijkstra(rec.origin, adj)[0] if len(stretch) < 20000 else None
        if lat is None:
            break
        for d in rec.expected:
            if d in tree_nodes and lat.get(d):
                stretch.append(tree_latency(rec.origin, d) / lat[d])
    per_message = len(tree_nodes) - 1
    m = sum(sim.checked_by_origin.get(n, 0) for n in tree_nodes)
    sends = {n: m * (tdeg[n] - 1) + sim.checked_by_origin.get(n, 0) for n in tree_nodes}
    busiest = max(sorted(sends), key=lambda n: sends[n]) if sends else None  # ties: the smallest id
    mesh_sends = sim.node_sends
    mesh_busiest = max(sorted(mesh_sends), key=lambda n: mesh_sends[n]) if mesh_sends else None
    uninterested = [len(tree_nodes) - 1 - len(r.expected) for r in messages]
    return {
        "root": root,
        "copies_per_message": per_message,
        "uninterested_receivers_per_message": statistics.fmean(uninterested) if uninterested else None,
        "path_stretch_mean": statistics.fmean(stretch) if stretch else None,
        "path_stretch_p95": _pct(stretch, 0.95),
        "busiest_node": busiest,
        "busiest_node_sends_per_message": sends[busiest] / m if m and busiest else None,
        "mesh_busiest_node": mesh_busiest,
        "mesh_busiest_node_sends_per_message": mesh_sends[mesh_busiest] / m if m and mesh_busiest else None,
        "messages_compared": m,
    }


def summarize(sim, memory_sample: int = 3) -> dict:
    sc = sim.sc
    n = len(sim.names)
    wall = time.perf_counter() - sim.wall_start
    up = [x for x in sim.names if sim.nodes[x].up]
    # --- convergence: every episode a fault (or the start) opened
    episodes = [e.as_dict(n) for e in sim.episodes]
    faults = [e for e in episodes if e["kind"] != "change"]
    # --- traffic
    routing = ("lsa", "dbsum", "lsreq", "cost")
    control_kinds = {k: {"messages": v[0], "bytes": v[1]} for k, v in sim.sent.items() if k != "fwd"}
    control_msgs = sum(sim.sent[k][0] for k in routing)
    control_bytes = sum(sim.sent[k][1] for k in routing)
    # --- forwarding efficiency on steady messages
    steady = sim.results_steady
    copies = sum(c for c, _o, _d, _q in steady)
    optimum = sum(o for _c, o, _d, _q in steady)
    ratios = [c / o for c, o, _d, _q in steady if o]
    # --- deliveries
    recs = sim.msgs.values()
    expected = sum(len(r.expected) for r in recs)
    delivered = sum(1 for r in recs for d in r.delivered if d in r.expected)
    dups = sum(c - 1 for r in recs for c in r.delivered.values() if c > 1)
    lost_transient = sum(e["lost"] for e in episodes)
    late = sum(r.late for r in recs)
    # --- memory and database size on a sample of live nodes
    sample = up[:: max(1, len(up) // memory_sample)][:memory_sample] if up else []
    mem = [engine_memory(sim.nodes[x].engine) for x in sample]
    memory: dict[str, object] = {k: statistics.fmean(m[k] for m in mem) for k in mem[0]} if mem else {}
    memory["sampled_nodes"] = sample
    runs, secs = sim._spf_totals()
    topo_eps = [
        e for e in episodes if e["kind"] in ("link_down", "link_up", "crash", "restart", "partition", "heal", "latency")
    ]
    sub_eps = [e for e in episodes if e["kind"] == "subscription" and e["end"] is not None]
    distinct = sim.initial_distinct
    summary = {
        "scenario": {
            "name": sc.name,
            "source": sc.source,
            "seed": sc.seed,
            "nodes": n,
            "links": len(sim.links),
            "topology": sc.topology.kind,
            "average_degree": 2 * len(sim.links) / n,
            "duration_s": sc.duration,
            "hop_limit": sim.settings.hop_limit,
            "loss": sc.topology.loss,
        },
        "run": {
            "events": sim.events,
            "wall_seconds": wall,
            "simulated_seconds": sim.now,
            "speedup": sim.now / wall if wall else None,
            "settle_window_s": sim.settle,
        },
        "workload": {
            "distinct_filters": distinct,
            "subscriptions": sum(len(sim.nodes[x].filters) for x in up),
            "published": len(sim.msgs),
            "with_remote_subscribers": sum(1 for r in recs if r.expected),
            "mean_destinations": statistics.fmean(len(r.expected) for r in recs) if sim.msgs else 0,
        },
        "convergence": faults,
        "reconvergences_without_fault": sum(1 for e in episodes if e["kind"] == "change"),
        # re-costing after RTT samples (docs/simulation.md, finding 2): what it cost
        "reconvergence_control": {
            "messages": sum(e["control_msgs"] for e in episodes if e["kind"] == "change"),
            "bytes": sum(e["control_bytes"] for e in episodes if e["kind"] == "change"),
        },
        "control": {
            "messages": control_msgs,
            "bytes": control_bytes,
            "messages_per_node": control_msgs / n,
            "bytes_per_node": control_bytes / n,
            "steady_bytes_per_node_per_s": (
                sim.steady_control_bytes / n / sim.steady_time if sim.steady_time else None
            ),
            "by_kind": control_kinds,
            "lost_transmissions": sim.lost_transmissions,
            "link_retransmissions": sim.retransmissions,
            "sent_on_dead_connections": sim.dead_sends,
            "dropped_before_hello": sim.not_ready_drops,
        },
        "subscription_change": {
            "changes": len(sub_eps),
            "converged_after_mean_s": statistics.fmean(e["converged_after"] for e in sub_eps) if sub_eps else None,
            "advert_copies_mean": statistics.fmean(e["attributed_msgs"] for e in sub_eps) if sub_eps else None,
            "advert_bytes_mean": statistics.fmean(e["attributed_bytes"] for e in sub_eps) if sub_eps else None,
        },
        "memory": memory,
        "forwarding": {
            "steady_messages_checked": len(steady),
            "copies_per_message": copies / len(steady) if steady else None,
            "optimum_per_message": optimum / len(steady) if steady else None,
            "copies_over_optimum": copies / optimum if optimum else None,
            "at_optimum_share": sum(1 for c, o, _d, _q in steady if c <= o) / len(steady) if steady else None,
            "worst_ratio": max(ratios) if ratios else None,
            "data_bytes": sim.sent["fwd"][1],
        },
        "stretch": {
            "latency_mean": statistics.fmean(sim.stretch) if sim.stretch else None,
            "latency_p95": _pct(sim.stretch, 0.95),
            "latency_max": max(sim.stretch) if sim.stretch else None,
            "samples": len(sim.stretch),
        },
        "deliveries": {
            "expected": expected,
            "delivered": delivered,
            "lost_during_convergence": lost_transient,
            "duplicates": dups,
            "late": late,
        },
        "spf": {
            "runs": runs,
            "cpu_seconds": secs,
            "ms_per_run": 1000 * secs / runs if runs else None,
            "per_topology_change": [
                {
                    "cause": e["cause"],
                    "runs": e["spf_runs"],
                    "runs_per_node": e["spf_runs"] / n,
                    "ms_per_run": e["spf_ms_per_run"],
                }
                for e in topo_eps
            ],
        },
        "mqtt_st": mqtt_st(sim),
        "invariants": {
            "route_checks": sim.route_checks,
            "message_checks": sim.msg_checks,
            "violations": sim.violations.items,
            "violation_counts": sim.violations.count,
            "ok": not sim.violations.count,
        },
        "custody_at_end": {
            "total": sum(len(sim.nodes[x].engine.custody) for x in up),
            "max_per_node": max((len(sim.nodes[x].engine.custody) for x in up), default=0),
        },
        "engine_counters": {
            k: sim.counter_total(k)
            for k in (
                "routed",
                "delivered",
                "duplicates",
                "hop_limit_drops",
                "unreachable_drops",
                "custody_retransmits",
                "custody_expired",
                "custody_overflow",
                "lsa_originated",
                "lsa_received",
                "spf_runs",
            )
        },
    }
    if getattr(sim, "cluster_mode", False):
        summary["cluster"] = sim.cluster_summary()
    summary["stalls"] = dict(sim.stall_counts)  # sim/stall.py
    return summary


def _f(x, spec=".3f", none="-"):
    return none if x is None else format(x, spec)


def format_text(s: dict) -> str:
    sc, run = s["scenario"], s["run"]
    out = [
        f"scenario {sc['name']} ({sc['source']}), seed {sc['seed']}: {sc['nodes']} nodes, {sc['links']} links "
        f"({sc['topology']}, mean degree {sc['average_degree']:.2f}), {sc['duration_s']:g}s simulated",
        f"run: {run['events']:,} events in {run['wall_seconds']:.1f}s wall ({_f(run['speedup'], '.1f')}x real time)",
        "",
    ]
    w = s["workload"]
    out.append(
        f"workload: {w['distinct_filters']:,} distinct filters, {w['subscriptions']:,} subscriptions, "
        f"{w['published']:,} messages ({w['with_remote_subscribers']:,} with remote subscribers, "
        f"{w['mean_destinations']:.2f} destination nodes on average)"
    )
    out.append("")
    out.append("convergence (simulated time from the fault; rounds of advertisement exchange):")
    out.append(
        f"  {'cause':44s} {'at':>8s} {'after':>9s} {'detect->':>9s} {'rounds':>6s} "
        f"{'ctl msgs':>9s} {'ctl KB/node':>11s} {'SPF/node':>8s} {'ms/SPF':>7s} {'lost':>5s}"
    )
    for e in s["convergence"]:
        after = "never" if e["converged_after"] is None else f"{e['converged_after']:.3f}s"
        det = "-" if e["after_detection"] is None else f"{e['after_detection']:.3f}s"
        mine = e["kind"] in ATTRIBUTED  # else every control message of the episode is its own
        kb = e["attributed_bytes_per_node"] if mine else e["control_bytes_per_node"]
        out.append(
            f"  {e['cause'][:44]:44s} {e['start']:7.2f}s {after:>9s} {det:>9s} {e['rounds']:6d} "
            f"{(e['attributed_msgs'] if mine else e['control_msgs']):9,d} "
            f"{kb / 1024:11.2f} {e['spf_runs'] / sc['nodes']:8.2f} "
            f"{_f(e['spf_ms_per_run'], '.3f'):>7s} {e['lost']:5d}"
        )
    c = s["control"]
    if s["reconvergences_without_fault"]:
        rc = s["reconvergence_control"]
        out.append(
            f"  and {s['reconvergences_without_fault']} re-convergences no fault caused "
            f"(link costs re-advertised after RTT samples): {rc['messages']:,} control messages, "
            f"{rc['bytes'] / 1e6:.2f} MB"
        )
    out += [
        "",
        f"routing control traffic: {c['messages']:,} messages, {c['bytes'] / 1e6:.2f} MB "
        f"({c['messages_per_node']:.0f} messages, {c['bytes_per_node'] / 1024:.1f} KB per node); "
        f"steady background {_f(c['steady_bytes_per_node_per_s'], '.0f')} B/s per node",
        "  all links messages by kind: "
        + ", ".join(
            f"{k} {v['messages']:,}/{v['bytes'] / 1024:.0f}KB" for k, v in c["by_kind"].items() if v["messages"]
        ),
    ]
    if c["lost_transmissions"] or c["sent_on_dead_connections"]:
        out.append(
            f"  network: {c['lost_transmissions']:,} transmissions lost, {c['link_retransmissions']:,} "
            f"link retransmissions, {c['sent_on_dead_connections']:,} sent on dead connections, "
            f"{c['dropped_before_hello']:,} dropped before the hello"
        )
    sub = s["subscription_change"]
    if sub["changes"]:
        out.append(
            f"subscription changes: {sub['changes']}, converged after {_f(sub['converged_after_mean_s'])}s, "
            f"{_f(sub['advert_copies_mean'], '.0f')} advertisement copies, "
            f"{_f(sub['advert_bytes_mean'], '.0f')} bytes on average"
        )
    m = s["memory"]
    if m.get("routers"):
        out.append(
            f"routing state per node: {m['routing_state_bytes'] / 1024:.0f} KB "
            f"(router LSDB {m['lsdb_bytes'] / 1024:.0f} KB, interest LSDB {m['interest_bytes'] / 1024:.0f} KB, "
            f"interest index {m['index_bytes'] / 1024:.0f} KB); advertisement database "
            f"{m['advert_db_bytes'] / 1024:.0f} KB as JSON; {m['routers']:.0f} routers, "
            f"{m['filters_indexed']:.0f} filters indexed"
        )
    f = s["forwarding"]
    out += [
        "",
        f"forwarding ({f['steady_messages_checked']:,} messages published in steady state): "
        f"{_f(f['copies_per_message'], '.2f')} copies per message vs "
        f"{_f(f['optimum_per_message'], '.2f')} on the shortest-path tree "
        f"(ratio {_f(f['copies_over_optimum'], '.3f')}, "
        f"{_f(f['at_optimum_share'] and 100 * f['at_optimum_share'], '.1f')}% "
        f"at the optimum, worst {_f(f['worst_ratio'], '.2f')})",
    ]
    st = s["stretch"]
    out.append(
        f"path stretch (latency of the path taken / shortest latency): mean {_f(st['latency_mean'])}, "
        f"p95 {_f(st['latency_p95'])}, max {_f(st['latency_max'])} over {st['samples']:,} deliveries"
    )
    d = s["deliveries"]
    out.append(
        f"deliveries: {d['delivered']:,} of {d['expected']:,} expected; lost during convergence "
        f"{d['lost_during_convergence']:,}, duplicates {d['duplicates']:,}, late {d['late']:,}"
    )
    cu = s["custody_at_end"]
    if cu["total"]:
        out.append(
            f"custody: {cu['total']:,} QoS 1/2 messages still held by their origins at the end "
            f"(at most {cu['max_per_node']:,} at one node), "
            f"{s['engine_counters']['custody_overflow']:,} refused for a full custody"
        )
    sp = s["spf"]
    out.append(f"shortest paths: {sp['runs']:,} runs, {sp['cpu_seconds']:.2f}s CPU, {_f(sp['ms_per_run'])} ms per run")
    q = s["mqtt_st"]
    out += [
        "",
        f"MQTT-ST full replication on the same graph (root {q['root']}): "
        f"{q['copies_per_message']} copies per message (mesh: {_f(f['copies_per_message'], '.2f')}), "
        f"{_f(q['uninterested_receivers_per_message'], '.1f')} uninterested receivers per message, "
        f"path stretch mean {_f(q['path_stretch_mean'])} p95 {_f(q['path_stretch_p95'])}; "
        f"busiest node sends {_f(q['busiest_node_sends_per_message'], '.2f')} copies per message "
        f"(mesh: {_f(q['mesh_busiest_node_sends_per_message'], '.2f')})",
    ]
    cl = s.get("cluster")
    if cl is not None:
        out += [
            "",
            f"whole cluster: {cl['clients']} clients, {cl['connections']} connections, moves {cl['moves']}; "
            f"{cl['published']:,} published, {cl['acknowledged']:,} acknowledged, {cl['received']:,} received",
            f"  hand-over: {cl['handover_checked']:,} (message, moved subscriber) pairs checked, "
            f"{cl['handover_lost']} lost, {cl['qos2_twice']} QoS 2 twice, {cl['qos1_again']} QoS 1 again; "
            f"without a move after the ack: {cl['not_moved']:,} pairs, {cl['not_moved_lost']} lost",
            f"  persistent clients reconnected to no session (session present 0): {cl['sessions_not_present']}",
            *(
                [
                    f"  persistent publishers: {cl['persistent_publishers']}, {cl['publisher_moves']} moves, "
                    f"{cl['publisher_resends']} PUBLISH (DUP) or PUBREL sent again on a new connection"
                ]
                if cl.get("persistent_publishers")
                else []
            ),
            f"  wills: {cl['wills_checked']} connections checked, {cl['wills_published']} published, "
            f"{cl['wills_missing']} missing, {cl['wills_twice']} twice, {cl['wills_unwanted']} unwanted; "
            f"single registration checked {cl['registration_checks']} times; cluster errors {cl['cluster_errors']}",
            f"  cluster counters: {json.dumps(cl['cluster_counters'], sort_keys=True)}",
        ]
        sh = cl.get("shared")
        if sh:  # (sim/members.py, docs/simulation.md section 9)
            out.append(
                f"  shared groups: {sh['groups']} of {sh['members']} members ({sh['strategy']}), leaves "
                f"{json.dumps(sh['member_leaves'], sort_keys=True)}; {sh['once_checked']:,} (message, group) "
                f"pairs, {sh['once_delivered']:,} delivered, {sh['unreachable']} with no member in reach, "
                f"{sh['may_expire']} that may have expired on the way, "
                f"re-sent after a leave {sh['resent_after_leave']}, after a fault {sh['resent_after_fault']}, "
                f"after its publisher sent it again {sh.get('resent_by_publisher', 0)}; "
                f"spread: {sh['spread_intervals']} stable intervals, worst nodes {sh['spread_worst_nodes']}, "
                f"members {sh['spread_worst_members']}; {sh['membership_changes']} membership changes, "
                f"{sh['first_or_last']} first or last, {sh['share_deltas']} deltas, "
                f"{sh['share_delta_copies']:,} copies (most {sh['share_delta_worst_copies']}, {sh['links']} links)"
            )
            if sh["persistent_members"]:
                out.append(
                    f"  persistent members: {sh['persistent_members']}; {sh['reached_while_queueing']} messages "
                    f"reached a member while only a session queued for them, {sh['again_to_session']} copies "
                    f"again to one session; QoS 2: {sh['qos2_checked']:,} (message, session) pairs, "
                    f"{sh['qos2_twice']} twice, {sh['qos2_repeats']} re-sends taken as such"
                )
    st = s.get("stalls")
    if st and st["stalls"]:
        out.append(
            f"stalled nodes: {st['stalls']} stalls, {st['held']:,} events held until their loop ran again, "
            f"{st['silenced']} links closed by peers that heard nothing for 3 keepalives"
        )
    inv = s["invariants"]
    out += [
        "",
        f"invariants: {inv['route_checks']:,} route tables and {inv['message_checks']:,} messages checked: "
        + ("all hold" if inv["ok"] else "VIOLATED " + json.dumps(inv["violation_counts"])),
    ]
    for v in inv["violations"][:20]:
        out.append(f"  {v}")
    return "\n".join(out) + "\n"
