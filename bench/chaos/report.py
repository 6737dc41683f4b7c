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


def table_header() -> str:
    return "| " + " | ".join(COLUMNS) + " |\n|" + "---|" * len(COLUMNS)


def row(r: dict[str, Any]) -> str:
    head = [r["broker"], str(r["seed"]), str(r["nodes"]), f"{r['rate']:g}", str(r["pid_range"]), f"{r['duration']:g}"]
    if not r.get("completed"):
        return "| " + " | ".join(head + ["did not complete"] + [""] * (len(COLUMNS) - len(head) - 1)) + " |"
    c = r["check"]
    by = c["qos2_duplicates_by_class"]
    refusals = ", ".join(f"{k}: {v}" for k, v in c["refusals"].items()) or "0"
    conns = c["connections_per_client"]
    one = "n/a" if conns is None else str(len(c["not_one_connection"]))
    reconv = "; ".join(
        "-" if med is None else f"{med:.2f} / {mx:.2f}"
        for med, mx in (
            (r["reconvergence_alone_median_s"], r["reconvergence_alone_max_s"]),
            (r["reconvergence_median_s"], r["reconvergence_max_s"]),
        )
    )
    reconv += f" ({r['reconvergence_unmeasured']})"
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
