"""The node's metrics in the Prometheus text format (version 0.0.4), served at ``/metrics``.

Everything is read when Prometheus scrapes: the counters the node keeps anyway (the
Broker's Stats, the sessions' drops, the routing engine's and the cluster's counters, the
links' figures), so counting costs the hot path nothing (the messages by QoS are the
Broker's counters of messages in and out, kept per QoS: a list index where there was a
plain counter). Two figures are
measured for this page: the store's commit latency (``Histogram``, observed once per group
commit) and each dialled peer link's round trips (once per keepalive).
Names follow Prometheus's conventions: ``mqttmesh_`` first, ``_total`` on counters, base
units (seconds, bytes).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from typing import Any

__all__ = ["Histogram", "render", "COMMIT_BUCKETS", "RTT_BUCKETS"]

# seconds: a group commit of SQLite in WAL mode takes from tens of microseconds to, on a
# slow disk under load, tens of milliseconds
COMMIT_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)


# seconds: a round trip on loopback takes tens of microseconds, across a WAN tens to
# hundreds of milliseconds
RTT_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class Histogram:
    """Cumulative buckets, their sum and count, as Prometheus reads a histogram."""

    __slots__ = ("bounds", "counts", "sum", "count")

    def __init__(self, bounds: Iterable[float]):
        self.bounds = tuple(sorted(bounds))
        self.counts = [0] * len(self.bounds)  # per bucket (not cumulative): cumulated at render
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        i = bisect.bisect_left(self.bounds, value)
        if i < len(self.counts):
            self.counts[i] += 1
        self.sum += value
        self.count += 1

    def lines(self, name: str, labels: str = "") -> list[str]:
        """``labels``: ``key="value"`` pairs, escaped, for every sample."""
        out, running = [], 0
        inner = f"{labels}," if labels else ""
        plain = f"{{{labels}}}" if labels else ""
        for bound, n in zip(self.bounds, self.counts, strict=True):
            running += n
            out.append(f'{name}_bucket{{{inner}le="{bound:g}"}} {running}')
        out.append(f'{name}_bucket{{{inner}le="+Inf"}} {self.count}')
        out.append(f"{name}_sum{plain} {self.sum:.9g}")
        out.append(f"{name}_count{plain} {self.count}")
        return out


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(labels: dict[str, str]) -> str:
    return ",".join(f'{k}="{_label(v)}"' for k, v in labels.items())


class _Page:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def metric(self, name: str, kind: str, help_text: str, samples: Iterable[tuple[dict[str, str], float]]) -> None:
        self.lines.append(f"# HELP {name} {help_text}")
        self.lines.append(f"# TYPE {name} {kind}")
        for labels, value in samples:
            if labels:
                self.lines.append(f"{name}{{{_labels(labels)}}} {_number(value)}")
            else:
                self.lines.append(f"{name} {_number(value)}")

    def one(self, name: str, kind: str, help_text: str, value: float) -> None:
        self.metric(name, kind, help_text, [({}, value)])

    def histogram(self, name: str, help_text: str, h: Histogram) -> None:
        self.histograms(name, help_text, [({}, h)])

    def histograms(self, name: str, help_text: str, series: Iterable[tuple[dict[str, str], Histogram]]) -> None:
        self.lines.append(f"# HELP {name} {help_text}")
        self.lines.append(f"# TYPE {name} histogram")
        for labels, h in series:
            self.lines.extend(h.lines(name, _labels(labels)))


def _number(value: float) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    return f"{value:.9g}"


def render(node: Any) -> str:
    """The page for ``node`` (server/node.py Node), now."""
    page = _Page()
    broker = node.broker
    s = broker.stats
    table = broker.table
    sessions = list(broker.sessions.values())
    queue_full = table.ended.queue_full + sum(x.dropped for x in sessions)
    slow_qos0 = table.ended.slow_qos0 + sum(x.dropped_qos0 for x in sessions)
    expired = s.expired + table.ended.expired + sum(x.expired for x in sessions)
    page.metric(
        "mqttmesh_info",
        "gauge",
        "this node: its id and version",
        [({"node": node.node_id, "version": node.version}, 1)],
    )
    page.one("mqttmesh_uptime_seconds", "gauge", "seconds since the node started", node.uptime())
    page.one(
        "mqttmesh_clients_connected", "gauge", "connections past CONNACK (peer links included)", table.connected_count
    )
    page.one(
        "mqttmesh_sessions",
        "gauge",
        "sessions held (connected or not; in a mesh, copies of other nodes' too)",
        len(sessions),
    )
    page.one("mqttmesh_subscriptions", "gauge", "distinct (filter, session) subscriptions", len(broker.trie))
    page.one("mqttmesh_retained_messages", "gauge", "retained messages held here", len(broker.retained))
    page.one(
        "mqttmesh_queued_messages",
        "gauge",
        "messages queued in sessions (behind the window or offline)",
        sum(len(x.queue) for x in sessions),
    )
    page.one(
        "mqttmesh_inflight_messages",
        "gauge",
        "outbound QoS 1/2 messages awaiting acknowledgement",
        sum(len(x.inflight) for x in sessions),
    )
    for name, help_text, counts in (
        ("messages_received", "PUBLISH packets received from clients, by QoS", s.received),
        ("messages_sent", "messages handed to sessions for delivery, by the QoS they were published at", s.sent),
    ):
        page.metric(f"mqttmesh_{name}_total", "counter", help_text, [({"qos": str(q)}, counts[q]) for q in range(3)])
    page.one("mqttmesh_bytes_received_total", "counter", "bytes read from clients", s.bytes_received)
    page.one("mqttmesh_bytes_sent_total", "counter", "bytes written to clients", s.bytes_sent)
    page.metric(
        "mqttmesh_messages_dropped_total",
        "counter",
        "messages dropped, by reason (too_large: over an MQTT 5 client's Maximum Packet Size; "
        "expired: past its MQTT 5 Message Expiry before it could be sent)",
        [
            ({"reason": "queue_full"}, queue_full),
            ({"reason": "slow_qos0"}, slow_qos0),
            ({"reason": "too_large"}, s.too_large),
            ({"reason": "expired"}, expired),
        ],
    )
    shared = broker.shared
    page.metric(
        "mqttmesh_shared_messages_total",
        "counter",
        "messages of shared subscriptions moved or lost with their members (redispatched: "
        "queued for a member that left, given to another; resent: in flight to it, QoS 1, "
        "given to another, perhaps twice; abandoned: QoS 2 in flight to a member whose session "
        "ended; dropped: no member could take it; kept_once: a re-send a member already had, "
        "not given again; passed_over: handed on, not given back to a member that gave it away; "
        "kept_sent: QoS 2, kept by a member that left while its holders had not confirmed it sent)",
        [
            ({"what": "redispatched"}, shared.redispatched),
            ({"what": "resent"}, shared.resent),
            ({"what": "abandoned"}, shared.abandoned),
            ({"what": "dropped"}, shared.dropped),
            ({"what": "kept_once"}, shared.kept_once),
            ({"what": "passed_over"}, shared.passed_over),
            ({"what": "kept_sent"}, shared.kept_sent),
        ],
    )
    page.one("mqttmesh_shared_groups", "gauge", "shared subscription groups with a member here", len(shared))
    page.one(
        "mqttmesh_shared_members",
        "gauge",
        "members of the shared subscription groups here (a session in two groups counts twice)",
        sum(len(g.members) for g in shared.groups.values()),
    )
    page.one(
        "mqttmesh_publish_denied_total",
        "counter",
        "PUBLISHes the ACL or a $ topic refused (acknowledged, dropped)",
        s.publish_denied,
    )
    page.one("mqttmesh_connections_total", "counter", "connections that reached CONNACK 0", s.connections_total)
    page.one("mqttmesh_connections_refused_total", "counter", "connections refused by a limit", s.connections_refused)
    page.one("mqttmesh_protocol_errors_total", "counter", "connections closed for a protocol error", s.protocol_errors)
    page.one("mqttmesh_slow_consumers_total", "counter", "clients reset for not reading", s.slow_consumers)
    page.one("mqttmesh_wills_published_total", "counter", "wills published", s.wills_published)
    page.metric(
        "mqttmesh_logins_failed_total",
        "counter",
        "logins refused, by how",
        [
            ({"how": "bad_credentials"}, s.auth_failures),
            ({"how": "throttled"}, s.auth_throttled),
            ({"how": "busy"}, s.auth_busy),
        ],
    )
    logins = node.logins
    if logins is not None:
        page.metric(
            "mqttmesh_logins_unanswered",
            "gauge",
            "password logins not answered yet, by stage",
            [
                ({"stage": "checking"}, logins.pending),
                ({"stage": "failure_held"}, logins.held),
                ({"stage": "waiting_turn"}, len(logins.waiting)),
            ],
        )
    page.one("mqttmesh_buffered_bytes", "gauge", "bytes held in connections' buffers", node.buffered)
    page.one("mqttmesh_memory_pauses_total", "counter", "times reading paused for buffer memory", s.memory_pauses)
    page.histogram("mqttmesh_store_commit_seconds", "time of one group commit of the store", node.commit_latency)
    mesh = node.mesh
    if mesh is not None:
        _mesh(page, mesh.status())
        page.histograms(
            "mqttmesh_mesh_link_rtt_sample_seconds",
            "round trips of the links this node dialled, one sample per keepalive",
            [({"peer": p}, h) for p, h in sorted(mesh.rtt.items())],
        )
    return "\n".join(page.lines) + "\n"


def _mesh(page: _Page, status: dict[str, Any]) -> None:
    nodes = status["nodes"]
    page.one("mqttmesh_mesh_nodes", "gauge", "nodes known to this node", len(nodes))
    page.one(
        "mqttmesh_mesh_nodes_reachable",
        "gauge",
        "nodes this node can route to (itself included)",
        sum(1 for n in nodes.values() if n["reachable"]),
    )
    neighbours = status["neighbours"]
    rtt = {p: n["srtt_us"] / 1e6 for p, n in neighbours.items() if n.get("srtt_us") is not None}
    for name, kind, help_text, values in (
        ("link_up", "gauge", "a peer link to this neighbour is up", dict.fromkeys(neighbours, 1)),
        ("link_cost", "gauge", "the link's routing cost", {p: n["cost"] for p, n in neighbours.items()}),
        ("link_rtt_seconds", "gauge", "smoothed round trip of the link, measured by its keepalives", rtt),
        *(
            (f"link_{key}_total", "counter", f"{what} on the link", {p: n[key] for p, n in neighbours.items()})
            for key, what in (
                ("envelopes_out", "routed messages sent"),
                ("envelopes_in", "routed messages received"),
                ("control_out", "control messages sent"),
                ("control_in", "control messages received"),
            )
        ),
    ):
        page.metric(f"mqttmesh_mesh_{name}", kind, help_text, [({"peer": p}, v) for p, v in values.items()])
    page.one(
        "mqttmesh_mesh_custody_messages",
        "gauge",
        "QoS 1/2 messages held here until their destinations acknowledge them",
        status["custody"],
    )
    page.one(
        "mqttmesh_mesh_held_messages", "gauge", "messages held back for an earlier one of their origin", status["held"]
    )
    page.one(
        "mqttmesh_mesh_shared_holds",
        "gauge",
        "other nodes' messages members of shared groups here took and have not acknowledged yet "
        "(their end-to-end acknowledgement waits)",
        status.get("shared_holds", 0),
    )
    for name, value in sorted(status["counters"].items()):
        page.one(f"mqttmesh_mesh_{name}_total", "counter", f"routing engine: {name.replace('_', ' ')}", value)
    cluster = status.get("cluster")
    if cluster:
        for name, value in sorted(cluster["counters"].items()):
            page.one(f"mqttmesh_cluster_{name}_total", "counter", f"cluster: {name.replace('_', ' ')}", value)
