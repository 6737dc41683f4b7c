"""The Markdown table of the runs."""

from __future__ import annotations

from typing import Any

COLUMNS = (
    "broker",
    "seed",
    "nodes",
    "msgs/s",
    "pid range",
    "s",
    "acked",
    "lost",
    "QoS 2 dup (in/out/other)",
    "QoS 1 dup",
    "reorders (same / other connection)",
    "pid reuse",
    "wrong session present",
    "refusals",
    "ClientIds not on 1 connection",
    "delivered after expiry + begun before it + framed before a stop of the node (of expiring)",
    "reconvergence s, median / max: lone heals; all heals (unmeasured)",
)


# the shared-subscription workload (--shared, issue 24): one group, judged by sharecheck.py
SHARED_COLUMNS = (
    "broker",
    "seed",
    "nodes",
    "msgs/s",
    "MQTT",
    "s",
    "members (persistent + clean)",
    "acked",
    "lost",
    "re-sends to a 2nd member: unacked / member left / node killed / node paused / cut off / link lost / inbound",
    "of them QoS 2 (inbound, unexplained)",
    "unexplained",
    "QoS 2 dup same member",
    "QoS 1 dup same member",
    "pid reuse",
    "wrong session present",
    "spread min / max",
    "refusals",
    "ClientIds not on 1 connection",
    "reconvergence s, median / max: lone heals; all heals (unmeasured)",
)


def table_header(shared: bool = False) -> str:
    cols = SHARED_COLUMNS if shared else COLUMNS
    return "| " + " | ".join(cols) + " |\n|" + "---|" * len(cols)


def _reconvergence(r: dict[str, Any]) -> str:
    reconv = "; ".join(
        "-" if med is None else f"{med:.2f} / {mx:.2f}"
        for med, mx in (
            (r["reconvergence_alone_median_s"], r["reconvergence_alone_max_s"]),
            (r["reconvergence_median_s"], r["reconvergence_max_s"]),
        )
    )
    return reconv + f" ({r['reconvergence_unmeasured']})"


def shared_row(r: dict[str, Any]) -> str:
    v = "5" if r.get("mqtt5") else "3.1.1"
    head = [r["broker"], str(r["seed"]), str(r["nodes"]), f"{r['rate']:g}", v, f"{r['duration']:g}"]
    if not r.get("completed"):
        return "| " + " | ".join(head + ["did not complete"] + [""] * (len(SHARED_COLUMNS) - len(head) - 1)) + " |"
    c = r["check"]
    clean = sum(1 for m in c["members"] if r["clients"].get(m, {}).get("clean"))
    by, by2 = c["resends_by_class"], c["resends_qos2_by_class"]
    explained = " / ".join(str(by[k]) for k in list(by)[:-1])
    spread = "-" if c["spread"] is None else f"{c['spread'][0]:.2f} / {c['spread'][1]:.2f}"
    conns = c["connections_per_client"]
    cells = head + [
        f"{len(c['members']) - clean} + {clean}",
        f"{c['acked']:,}",
        f"{c['lost']:,}",
        f"{c['resends']:,}: {explained}",
        f"{c['resends_qos2']:,} ({by2['inbound']}, {by2['unexplained']})",
        f"{c['unexplained']:,}",
        f"{c['qos2_duplicates']:,}",
        f"{c['qos1_duplicates']:,}",
        f"{c['pid_reuse']:,}",
        f"{c['wrong_session_present']:,}",
        spread,
        ", ".join(f"{k}: {v}" for k, v in c["refusals"].items()) or "0",
        "n/a" if conns is None else str(len(c["not_one_connection"])),
        _reconvergence(r),
    ]
    return "| " + " | ".join(cells) + " |"


def row(r: dict[str, Any]) -> str:
    if r.get("shared"):
        return shared_row(r)
    head = [r["broker"], str(r["seed"]), str(r["nodes"]), f"{r['rate']:g}", str(r["pid_range"]), f"{r['duration']:g}"]
    if not r.get("completed"):
        return "| " + " | ".join(head + ["did not complete"] + [""] * (len(COLUMNS) - len(head) - 1)) + " |"
    c = r["check"]
    by = c["qos2_duplicates_by_class"]
    refusals = ", ".join(f"{k}: {v}" for k, v in c["refusals"].items()) or "0"
    conns = c["connections_per_client"]
    one = "n/a" if conns is None else str(len(c["not_one_connection"]))
    reconv = _reconvergence(r)
    cells = head + [
        f"{c['acked']:,}",
        f"{c['lost']:,}",
        f"{c['qos2_duplicates']:,} ({by['inbound']}/{by['outbound']}/{by['other']})",
        f"{c['qos1_duplicates']:,}",
        f"{c['reorders']:,} ({c.get('reorders_same_connection', '?')} / {c.get('reorders_across_connections', '?')})",
        f"{c['pid_reuse']:,}",
        f"{c['wrong_session_present']:,}",
        refusals,
        one,
        f"{c['delivered_after_expiry']} + {c.get('begun_before_expiry', 0)} + {c.get('framed_before_pause', 0)}"
        f" ({c['expiring']:,})"
        if r.get("mqtt5")
        else "n/a (3.1.1)",
        reconv,
    ]
    return "| " + " | ".join(cells) + " |"


def audit_lines(a: dict[str, Any]) -> str:
    """The audit of a run's archives beside its checker (``run._audit``), a small table."""
    p, m, k = a["pairs"], a["messages"], a["packets"]
    lines = [
        "| | checker (clients' history) | audit (nodes' archives) | differences, each explained |",
        "|---|---|---|---|",
        f"| lost, of {p['both']:,} (message, subscriber) pairs both judge | {a['lost']['checker']:,} "
        f"| {a['lost']['audit']:,} | written, not read: {a['lost_checker_only_written_not_read']}; "
        f"read, not logged: {a['lost_audit_only_read_not_logged']}; archived under another id (a defect): "
        f"{a['lost_audit_only_misattributed']} |",
        f"| QoS 2 duplicates, same pairs | {a['qos2_duplicates']['checker']:,} | {a['qos2_duplicates']['audit']:,} "
        f"| re-sends read as new: {a['qos2_dup_resend_taken_as_new']}; pairs differing: "
        f"{a['qos2_dup_differing_pairs']} |",
        f"| messages | acked {m['acked']:,} | archived {m['archived']:,} ({m['archived_copies']:,} rows) "
        f"| acked, not archived: {m['acked_not_archived']}; archived, not acked: {m['archived_not_acked']} |",
        f"| PUBLISH packets to subscribers | read {k['reads']:,} | written {k['rows']:,} | matched "
        f"{k['matched']:,}; written, not read {k['written_not_read']}; read, not logged {k['read_not_logged']} |",
    ]
    verdict = "agrees" if a["agrees"] else "DISAGREES"
    return "\n".join(lines) + f"\naudit: {verdict}, {a['unexplained']} unexplained difference(s)"
