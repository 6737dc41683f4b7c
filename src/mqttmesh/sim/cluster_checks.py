"""mode = "cluster": what the whole cluster is judged by, while the run goes and at its end.

Part of the Simulator (core.py), as a mixin; what the clients do is sim/sessions.py's,
and it writes their history (sim/history.py), which is judged here, with the nodes' state
and the wills counted where they are published.

Invariants (docs/simulation.md, "The whole cluster"):
- ``cluster.single_registration``: once quiet (no fault and no membership change for
  register_interval + claim_timeout + gather_timeout, no claim in progress, routing
  converged), no ClientId has connected Channels on two nodes, nor connected
  registrations naming two nodes, for longer than ``clients.double_grace``;
- ``cluster.handover_loss``: sim/history.py ``check_handover``;
- ``cluster.wills_once``: sim/history.py ``check_wills``, wills counted where they are
  published (the node's ArchivePort sees every message published there: a Channel's
  will, or the registrar's);
- ``cluster.session_present``: sim/history.py ``check_sessions_resumed``: a persistent
  client accepted again after its first acceptance finds its session (an MQTT 5 one: while
  its session has not expired, sim/history5.py ``check_session_expiry``);
- MQTT 5 (sim/history5.py): ``cluster.message_expiry`` (no message delivered after its
  Message Expiry Interval, allowing ``expiry_slack`` for the way from node to client),
  ``cluster.message_expiry_left`` (no PUBLISH says more of its life is left than is),
  ``cluster.session_expiry`` (an expired session is not resumed; Clean Start 1 gets no
  session), ``cluster.will_delay`` (a delayed will: at most once, never before its delay,
  never after a reconnection within it, surely without one).
(``cluster.error``, a cluster handler that raised, is reported by the node: sessions.py.)
"""

from __future__ import annotations

import hashlib
from typing import Any

from ..message import Message
from .checks import components
from .history import check_handover, check_order, check_sessions_resumed, check_wills
from .history5 import check_message_expiry, check_session_expiry, check_will_delay, delayed_wills
from .model import CCHECK, Node, SimulatorPart

__all__ = ["ClusterChecksMixin"]

_CONNECTED = "connected"  # channel.CONNECTED


class ClusterChecksMixin(SimulatorPart):
    def _init_cluster_checks(self) -> None:
        self.handover_result: Any = None
        self.wills_result: Any = None
        self.expiry_result: Any = None  # MQTT 5 (history5.py)
        self.session_expiry_result: Any = None
        self.will_delay_result: Any = None
        self.will_times: dict[str, list[float]] = {}  # connection id -> when each of its wills was published
        self.will_nodes: dict[str, list[str]] = {}  # connection id -> where each of its wills was published
        self.taken: dict[str, float] = {}  # message id -> when a node first took it (MQTT 5 runs)
        # (time, node -> its component) after every fault (the paths that exist) and at every
        # check_every (the peer connections both ends hold open: a stalled node's peers close
        # theirs), in MQTT 5 runs and runs with persistent members of groups (members.py):
        # which nodes could reach which, for the checks across a cut
        self.reach_log: list[tuple[float, dict[str, str]]] = []
        self.order_result: Any = None
        self.not_resumed: list[tuple[float, str, str, str]] = []
        self.will_counts: dict[str, int] = {}  # connection id -> wills published
        # connection id -> for each will published: the side of the node that published it
        # (the first node of what it could reach) if it could not reach the connection's
        # node (a partition, or that node was down), else None
        self.will_sides: dict[str, list[str | None]] = {}
        self._conn_nodes: dict[str, str] = {}  # connection id -> its node (from the history)
        self._will_ids: dict[str, set[tuple[str, int]]] = {}  # connection id -> will message ids
        self._conn_ops_seen = 0
        self.last_fault_at = 0.0
        self.double_seen: dict[str, tuple[frozenset[str], float]] = {}
        self.registration_checks = 0

    # ------------------------------------------------------------------ what the checks record

    def _on_fault(self, i: int) -> None:
        """(the quiet time of single_registration counts from the last fault)"""
        self.last_fault_at = self.now
        super()._on_fault(i)
        if self._logs_reach():
            up = [n for n in self.names if self.nodes[n].up]
            self.reach_log.append(
                (self.now, components(up, ((lk.a, lk.b) for lk in self.links.values() if self._avail(lk))))
            )

    def _logs_reach(self) -> bool:
        """Whether the run keeps ``reach_log`` (engine-mode runs too pass through ``_on_fault``)."""
        c = self.sc.clients
        return self.cluster_mode and bool(c.mqtt5 or (c.groups and c.member_persistent))

    def _log_reach(self) -> None:
        up = [n for n in self.names if self.nodes[n].up]
        held = ((lk.a, lk.b) for lk in self.links.values() if lk.alive and lk.side[lk.a] and lk.side[lk.b])
        self.reach_log.append((self.now, components(up, held)))

    def apart(self, a: str, b: str) -> list[tuple[float, float]]:
        """The windows in which nodes ``a`` and ``b`` had no path between them (a partition,
        links down or closed, one of them down), as ``reach_log`` saw them."""
        out: list[tuple[float, float]] = []
        since: float | None = None
        for t, comp in self.reach_log:
            cut = a not in comp or b not in comp or comp[a] != comp[b]
            if cut and since is None:
                since = t
            elif not cut and since is not None:
                out.append((since, t))
                since = None
        if since is not None:
            out.append((since, float("inf")))
        return out

    def _published(self, node: Node, msg: Message) -> None:
        """A message published at ``node`` (its _NodeIO, sessions.py): the wills are counted."""
        if msg.topic.startswith("will/"):
            # a will is one message (its id reserved at CONNECT): published by its node and by
            # a registrar, it reaches each subscriber once (the duplicate filters): counted once
            conn = msg.payload.decode()
            ids = self._will_ids.setdefault(conn, set())
            if (msg.origin, msg.seq) in ids:
                return
            ids.add((msg.origin, msg.seq))
            self.will_counts[conn] = self.will_counts.get(conn, 0) + 1
            self.will_times.setdefault(conn, []).append(self.now)
            self.will_nodes.setdefault(conn, []).append(node.name)
            self.will_sides.setdefault(conn, []).append(self._across_cut(node.name, conn))
        elif self.sc.clients.mqtt5:
            # when its node took it: its Message Expiry Interval counts from then [MQTT-3.3.2-5];
            # a persistent publisher's re-send (DUP=1) on another node is taken there again with
            # the interval its client gave it, so the last take counts (a copy of the first may
            # come earlier, never later: the bound stays sound)
            msg_id = msg.payload.decode()
            publisher = self.clients.get(msg_id.rpartition(":")[0])
            if publisher is not None and publisher.publisher and publisher.persistent:
                self.taken[msg_id] = self.now
            else:
                self.taken.setdefault(msg_id, self.now)

    def _across_cut(self, publisher: str, conn: str) -> str | None:
        """The side of ``publisher`` (the first node it can reach) if it has lost sight of
        ``conn``'s node, else None. Lost sight: it cannot reach that node now (a partition,
        or the node is down), the node lost the life the connection was made in (it crashed
        and restarted since: a DISCONNECT it read just before may never have reached the
        registrar), or the publisher's own view does not have the node live yet (a registrar
        learns of a heal some time after it: docs/simulation.md, finding 8's rule)."""
        ops = self.history.ops
        for op in ops[self._conn_ops_seen :]:
            if op[3] == "connect" and op[2] == "invoke":
                self._conn_nodes[op[4]] = op[5]
        self._conn_ops_seen = len(ops)
        where = self._conn_nodes.get(conn)
        if where is None or where == publisher:
            return None
        # what the publisher can reach over the peer connections both ends hold open (a
        # partition closes them, and so does a stall long enough for the peers to give up)
        comp = components(
            (n for n in self.names if self.nodes[n].up),
            ((lk.a, lk.b) for lk in self.links.values() if lk.alive and lk.side[lk.a] and lk.side[lk.b]),
        )
        root = comp.get(publisher)
        side = min(n for n, r in comp.items() if r == root) if root is not None else publisher
        if root is None or comp.get(where) != root:
            return side
        sconn = self.sconns.get(conn)
        if sconn is not None and sconn.gen != self.nodes[where].gen:
            return side  # (the connection's node crashed and restarted since)
        core = self.nodes[publisher].core
        if core is not None and where not in core.cluster.members.live:
            return side  # (reachable, but not in the publisher's view yet)
        return None

    # ------------------------------------------------------------------ invariants

    def _on_ccheck(self) -> None:
        c = self.sc.clients
        if self.now < self.end:
            self._at(self.now + c.check_every, CCHECK)
        if self._logs_reach() and self.now >= c.start + 1.0:  # (once every client has connected: the mesh has formed)
            self._log_reach()
        s = self.cluster_settings
        quiet = s.register_interval + s.claim_timeout + s.gather_timeout
        last_change = max([self.last_fault_at] + [n.core.membership_at for n in self.nodes.values() if n.up])
        if self.now - last_change < quiet or self.episode is not None:
            self.double_seen.clear()
            return
        live: dict[str, set[str]] = {}
        registered: dict[str, set[str]] = {}
        for name in self.names:
            node = self.nodes[name]
            if not node.up:
                continue
            for conn in node.conns.values():
                ch = conn.channel
                if ch.claiming:
                    self.double_seen.clear()
                    return  # a claim in progress: not converged
                if ch.state == _CONNECTED and ch.session is not None and ch.session.channel is ch:
                    live.setdefault(ch.client_id, set()).add(f"{name}:{conn.id}")
            for cid, reg in node.core.cluster.clients()["registrations"].items():
                if reg["connected"]:
                    registered.setdefault(cid, set()).add(reg["node"])
        self.registration_checks += 1
        seen: dict[str, tuple[frozenset[str], float]] = {}
        for cid in sorted(set(live) | set(registered)):
            who = frozenset(
                [x for x in live.get(cid, ()) if len(live[cid]) > 1]
                + [f"registered at {x}" for x in registered.get(cid, ()) if len(registered[cid]) > 1]
            )
            if not who:
                continue
            first = self.double_seen.get(cid)
            since = first[1] if first is not None and first[0] == who else self.now
            seen[cid] = (who, since)
            if self.now - since >= c.double_grace:
                self.violations.add(
                    "cluster.single_registration",
                    f"t={self.now:.3f}s ClientId {cid!r} has two live registrations since {since:.3f}s: {sorted(who)}",
                )
                since = self.now  # once per grace period
                seen[cid] = (who, since)
        self.double_seen = seen

    def expiry_slack(self) -> float:
        """What a delivery may come after its message's expiry: the way from the node to the
        client (its one-way latency at most), and 10 ms."""
        return self.sc.clients.latency_ms[1] / 1000.0 + 0.01

    def detect_bound(self) -> float:
        """How long after a node's crash the mesh may count a session's expiry and a will's
        delay from (docs/design.md 3.7): its peers notice within 3 keepalives and a tick,
        membership takes ``will_delay`` more to call it dead, the registrar's upkeep a tick;
        and a second for the news on its way."""
        sc = self.sc
        return 3 * sc.node.keepalive + 2 * sc.node.tick + self.cluster_settings.will_delay + 1.0

    def _finish_cluster(self) -> None:
        v = self.violations
        h, end = self.history, self.sc.duration
        ho = check_handover(h, self.sc.clients.settle, end)
        wills = check_wills(h, self.will_counts, self.will_sides, set(delayed_wills(h)))
        self.handover_result, self.wills_result = ho, wills
        self.order_result = check_order(h)
        persistent = {name for name, cl in self.clients.items() if cl.persistent and cl.v5 is None}
        self.not_resumed = check_sessions_resumed(h, persistent)
        self._finish_mqtt5()
        self._finish_shared()  # (members.py)
        for msg_id, client, t in ho.lost[:20]:
            v.add("cluster.handover_loss", f"{msg_id} (acknowledged at {t:.3f}s) never reached {client}")
        for msg_id, client in ho.qos2_twice[:20]:
            v.add("cluster.handover_loss", f"QoS 2 message {msg_id} reached {client} more than once")
        for conn in wills.missing[:20]:
            v.add("cluster.wills_once", f"connection {conn} ended without DISCONNECT and its will was never published")
        for conn, n in wills.twice[:20]:
            v.add("cluster.wills_once", f"the will of connection {conn} was published {n} times")
        for conn, why in wills.unwanted[:20]:
            v.add("cluster.wills_once", f"connection {conn}: {why}")
        for t, client, conn, node in self.not_resumed[:20]:
            v.add(
                "cluster.session_present",
                f"t={t:.3f}s {conn}: {node} accepted {client} (CleanSession=0, accepted before) with session present 0",
            )

    def _finish_mqtt5(self) -> None:
        v, h = self.violations, self.history
        ex = self.expiry_result = check_message_expiry(h, self.taken, self.expiry_slack())
        se = self.session_expiry_result = check_session_expiry(h, self.detect_bound(), 1.0, self.apart)
        wd = self.will_delay_result = check_will_delay(
            h, self.will_times, self.will_sides, self.sc.duration, self.detect_bound(), 1.0, self.will_nodes, self.apart
        )
        for msg_id, client, late in ex.late[:20]:
            v.add("cluster.message_expiry", f"{msg_id} reached {client} {late:.3f}s after it expired")
        for msg_id, client, over in ex.overlong[:20]:
            v.add("cluster.message_expiry_left", f"{msg_id} reached {client} saying {over:.3f}s more life than it had")
        for t, client, conn, node, why in se.wrongly_present[:20]:
            v.add("cluster.session_expiry", f"t={t:.3f}s {conn}: {node} accepted {client} with {why}")
        for t, client, conn, node in se.lost[:20]:
            v.add(
                "cluster.session_present",
                f"t={t:.3f}s {conn}: {node} accepted {client} (Clean Start 0, its session not expired) "
                f"with session present 0",
            )
        for conn, before in wd.early[:20]:
            v.add("cluster.will_delay", f"the delayed will of connection {conn} was published {before:.3f}s early")
        for conn, n in wd.after_reconnect[:20]:
            v.add(
                "cluster.will_delay",
                f"the delayed will of connection {conn} was published ({n}x) though its client came back in time",
            )
        for conn, n in wd.twice[:20]:
            v.add("cluster.will_delay", f"the delayed will of connection {conn} was published {n} times")
        for conn in wd.missing[:20]:
            v.add("cluster.will_delay", f"connection {conn} ended without DISCONNECT and its delayed will never came")
        for conn, why in wd.unwanted[:20]:
            v.add("cluster.will_delay", f"connection {conn}: {why}")

    def cluster_summary(self) -> dict[str, Any]:
        ho, wills = self.handover_result, self.wills_result
        ex, se, wd = self.expiry_result, self.session_expiry_result, self.will_delay_result
        ops = self.history.ops
        counters: dict[str, int] = {}
        for name in self.names:
            node = self.nodes[name]
            if node.up:
                for k, val in node.core.cluster.status()["counters"].items():
                    counters[k] = counters.get(k, 0) + val
        accepted = [op[1] for op in ops if op[3] == "connect" and op[2] == "ok" and self.clients[op[1]].persistent]
        return {
            "clients": len(self.clients),
            # a persistent client's later CONNACK with session present 0: its session was lost
            "sessions_not_present": len(self.not_resumed),
            "sessions_resumed_checked": len(accepted) - len(set(accepted)),
            "connections": len(self.sconns),
            "moves": dict(self.moves),
            "persistent_publishers": sum(1 for cl in self.clients.values() if cl.publisher and cl.persistent),
            "publisher_moves": self.publisher_moves,
            "publisher_resends": self.publisher_resends,
            "published": sum(1 for op in ops if op[3] == "publish" and op[2] == "invoke"),
            "acknowledged": sum(1 for op in ops if op[3] == "publish" and op[2] == "ok"),
            "received": sum(1 for op in ops if op[3] == "receive"),
            "handover_checked": ho.checked,
            "handover_lost": len(ho.lost),
            "qos2_twice": len(ho.qos2_twice),
            "qos1_again": ho.qos1_again,
            "not_moved": ho.not_moved,
            "not_moved_lost": ho.not_moved_lost,
            "order_checked": self.order_result.checked,
            "reorders_same_connection": len(self.order_result.same_connection),
            "reorders_across_connections": len(self.order_result.across_connections),
            "wills_checked": wills.checked,
            "wills_published": sum(self.will_counts.values()),
            "wills_missing": len(wills.missing),
            "wills_twice": len(wills.twice),
            "wills_unwanted": len(wills.unwanted),
            "registration_checks": self.registration_checks,
            # MQTT 5 (history5.py)
            "mqtt5_clients": sum(1 for cl in self.clients.values() if cl.v5 is not None),
            "expiring_checked": ex.checked,
            "expiring_dropped": ex.dropped,
            "delivered_after_expiry": len(ex.late) + len(ex.overlong),
            "begun_before_expiry": ex.begun_before_expiry,
            "handover_may_expire": ho.may_expire,
            "handover_session_ended": ho.session_ended,
            "sessions_expired_checked": se.expired,
            "sessions_unexpired_checked": se.resumed,
            "sessions_expiry_broken": len(se.wrongly_present) + len(se.lost),
            "wills_delayed_checked": wd.checked,
            "wills_delayed_cancelled": wd.cancelled,
            "wills_delayed_due": wd.due,
            "wills_delayed_broken": len(wd.early)
            + len(wd.after_reconnect)
            + len(wd.twice)
            + len(wd.missing)
            + len(wd.unwanted),
            "cluster_errors": self.cluster_errors,
            "cluster_counters": counters,
            # every client operation in order, with its time: equal digests, equal runs
            "history_digest": hashlib.sha256(repr(ops).encode()).hexdigest(),
            **({"shared": self.shared_summary()} if self.sc.clients.groups else {}),  # (members.py)
        }
