"""mode = "cluster": members of shared groups, joining and leaving (issue 24), and their checks.

Part of the Simulator (core.py), as a mixin beside sim/sessions.py. ``clients.groups``
groups ``$share/g<k>/sh/#``, each of ``clients.members`` MQTT 3.1.1 members ``g<k>m<i>``,
placed on ``clients.member_nodes`` nodes of the group (0: spread over every node) and asking
for a QoS drawn from ``clients.member_qos``. Every ``clients.member_churn`` seconds a member
leaves, by UNSUBSCRIBE, DISCONNECT, a dropped connection or a move to another node of its
group, and joins again ``clients.member_away`` seconds later; node faults end memberships
too. Every draw is from the stream ``{seed}/shared``, so a scenario without groups runs as
before.

A share of the members (``clients.member_persistent``, each drawn from its own stream
``{seed}/member/{name}``) connect with CleanSession=0 (docs/design.md 3.8, "Persistent
members in a mesh"): such a member subscribes once, and a connection whose CONNACK says its
session is present finds it a member again without a SUBSCRIBE (the history's ``resume``);
its leaves by DISCONNECT, a dropped connection or a move (half of them a takeover: a new
connection elsewhere while the old one lives until the node ends it) leave its session a
member, queueing for it; an UNSUBSCRIBE ends that until it subscribes again. It acknowledges
as any client (sim/mqttclient.py: PUBACK, PUBREC/PUBCOMP, a DUP re-send on a packet id that
awaits PUBREL acknowledged again and recorded as a ``repeat``), has no will, and its
receptions carry their packet ids.

The history records each join (SUBSCRIBE sent, SUBACK) and leave, with the time its node
takes it (the connection is FIFO: its arrival); the simulator reads off the wire every
interest delta that adds or removes a group, and its copies. sim/shared_checks.py and
sim/shared_spread.py (``shared.spread``, ``shared.control``) judge them at the end:
``shared.once`` (no second copy without a leave or a fault to explain it),
``shared.lost`` (none missed while a member was certainly in reach, a persistent member's
session queueing for its client included), ``shared.qos2_once`` (a QoS 2 message once to a
member's session [MQTT-4.3.3-2]), ``shared.spread``, ``shared.control``, ``shared.refused``
(a member's SUBSCRIBE refused: a mesh lets both kinds of session join a group), and from the
nodes' state at the end ``shared.home`` (a persistent member's session a member of its group
on the node its client is on, and on no other).
"""

from __future__ import annotations

import json
import random
from typing import Any

from .model import CLIENT, SimulatorPart
from .shared_checks import check_once, check_sessions_once
from .shared_spread import check_control, check_spread
from .simclient import SimClient, SimConnection

__all__ = ["MembersMixin", "SHARE_TOPIC"]

SHARE_TOPIC = "sh"  # the groups' filter is "sh/#"; publications "sh/<publisher>/<n mod 4>"
_LEAVES = ("unsubscribe", "disconnect", "drop", "move")


class MembersMixin(SimulatorPart):
    def _init_members(self) -> None:
        sc = self.sc
        c = sc.clients
        self.rng_shared = random.Random(f"{sc.seed}/shared")
        self.member_leaves = dict.fromkeys(_LEAVES, 0)
        self.member_refused: list[tuple[float, str, str, int]] = []
        # (node, incarnation, version) of an interest delta that adds or removes a group ->
        # [its changes ("+share", "-share"), its copies on the links]
        self.share_deltas: dict[tuple[str, int, int], tuple[list[str], int]] = {}
        self.shared_results: dict[str, Any] = {}
        for k in range(c.groups):
            share = f"$share/g{k}/{SHARE_TOPIC}/#"
            if c.member_nodes and c.member_nodes < len(self.names):
                nodes = sorted(self.rng_shared.sample(self.names, c.member_nodes))
            else:
                nodes = list(self.names)
                self.rng_shared.shuffle(nodes)
            for i in range(c.members):
                name = f"g{k}m{i}"
                persistent = bool(c.member_persistent) and _draw(sc.seed, name) < c.member_persistent
                cl = SimClient(name, persistent, c.keepalive, nodes[i % len(nodes)])
                cl.mqtt.report_repeats = persistent  # (a re-send it had taken: recorded, sim/history.py)
                cl.share = share
                cl.share_qos = self.rng_shared.choices((0, 1, 2), c.member_qos)[0]
                cl.share_nodes = nodes
                self.clients[name] = cl

    # ------------------------------------------------------------------ the members' events

    def _arrives(self, conn: SimConnection) -> float:
        """When what the client writes now reaches its node (sessions.py _client_send)."""
        return max(self.now + conn.latency, conn.to_node)

    def _member_event(self, client: SimClient, conn: SimConnection, event: tuple[Any, ...]) -> None:
        kind = event[0]
        h = self.history
        if kind == "connack":
            rc = event[1]
            if rc:
                h.connect(self.now, client.name, "fail", conn.id, conn.node, rc)
                return
            present = event[2]
            h.connect(self.now, client.name, "ok", conn.id, conn.node, present)
            # (a member asking for QoS 0 may send nothing else: it pings within its keepalive,
            # on this connection, as a client must [MQTT-3.1.2-23]; the clients' shared ping
            # of sessions.py may come up to twice the keepalive after the start)
            self._at(self.now + client.mqtt.keepalive / 2, CLIENT, "mping", f"{client.name} {client.k}")
            if client.persistent and present and client.share_held:
                self._member_resume(client, conn)  # (its session kept the subscription [MQTT-3.1.2-4])
            else:
                self._member_join(client)
        elif kind == "suback":
            code = event[2][0]
            share = client.share
            assert share is not None
            if code >= 0x80:
                # a member of either kind may join in a mesh (docs/design.md 3.8): a violation
                h.joined(self.now, client.name, conn.id, conn.node, share, code, -1.0, "fail")
                self.member_refused.append((self.now, client.name, conn.node, code))
                return
            client.member = True
            client.share_held, client.share_granted = client.persistent, code
            h.joined(self.now, client.name, conn.id, conn.node, share, code, -1.0, "ok")
            self._member_churn(client)
        elif kind == "repeat":
            topic, payload, qos, dup, pid = event[1:6]
            h.repeated(self.now, client.name, payload.decode(), topic, qos, dup, conn.id, pid)
        elif kind == "closed":
            client.member = False
            self._client_lost(client)

    def _member_join(self, client: SimClient) -> None:
        conn = client.conn
        if conn is None or not client.mqtt.connected or client.member or client.share is None:
            return
        client.mqtt.subscribe([(client.share, client.share_qos)])
        client.share_held = False  # (until its SUBACK)
        at = self._arrives(conn)
        self.history.joined(
            self.now, client.name, conn.id, conn.node, client.share, -1, at, "invoke", client.persistent
        )
        self._client_send(client)

    def _member_resume(self, client: SimClient, conn: SimConnection) -> None:
        """A persistent member's connection found its session, a member again: since its node
        sent the CONNACK (the claim made it a member at its new home, docs/design.md 3.8)."""
        share = client.share
        assert share is not None
        client.member = True
        at = self.now - conn.latency
        self.history.joined(self.now, client.name, conn.id, conn.node, share, client.share_granted, at, "resume", True)
        self._member_churn(client)

    def _member_churn(self, client: SimClient) -> None:
        """The member's next leave, if members leave."""
        lo, hi = self.sc.clients.member_churn
        if hi > 0:
            t = self.now + self.rng_shared.uniform(lo, hi)
            if t < self.client_stop:
                client.move_at = t
                self._at(t, CLIENT, "leave", client.name)

    def _member_ping(self, arg: str) -> None:
        name, _, k = arg.partition(" ")
        client = self.clients[name]
        if client.conn is None or client.k != int(k) or self.now >= self.end:
            return  # (another connection has its own)
        if client.mqtt.connected:
            client.mqtt.ping()
            self._client_send(client)
        self._at(self.now + client.mqtt.keepalive / 2, CLIENT, "mping", arg)

    def _member_action(self, action: str, client: SimClient) -> None:
        if action == "rejoin":
            self._member_join(client)
            return
        conn = client.conn
        if self.now != client.move_at or conn is None or not client.member or self.now >= self.client_stop:
            return
        c = self.sc.clients
        how = self.rng_shared.choices(_LEAVES, c.member_leave)[0]
        self.member_leaves[how] += 1
        share = client.share
        assert share is not None
        self.history.left(self.now, client.name, conn.id, conn.node, share, how, self._arrives(conn))
        client.member = False
        away = self.rng_shared.uniform(*c.member_away)
        if how == "unsubscribe":
            client.mqtt.unsubscribe([share])
            client.share_held = False  # (its session leaves the group for good [MQTT-3.10.4-1])
            self._client_send(client)
            self._at(self.now + away, CLIENT, "rejoin", client.name)
            return
        if how == "move" and client.persistent and self.rng_shared.random() < 0.5:
            # a takeover: a new connection elsewhere, the old one left as it is for the node
            # to end when the claim reaches it (its session, queue and packet ids go with it)
            client.mqtt.connection_lost()
            client.conn = None
            target = self._pick_client_node(self._member_move_target(client, conn.node))
            if target is None:
                self._reconnect(client)
            else:
                self._open(client, target)
            return
        if how == "drop":
            self._client_send(client, None)
            client.mqtt.connection_lost()
        else:
            client.mqtt.disconnect()
            self._client_send(client)
        client.conn = None
        client.connect_due = True
        if how == "move":
            client.home = self._member_move_target(client, conn.node)
            away = self.rng_shared.uniform(*c.reconnect_delay)
        self._at(self.now + away, CLIENT, "connect", client.name)

    def _member_move_target(self, client: SimClient, node: str) -> str:
        others = [n for n in client.share_nodes if n != node] or [n for n in self.names if n != node]
        return str(self.rng_shared.choice(others))

    # ------------------------------------------------------------------ what the wire says

    def _share_lsa(self, payload: bytes) -> None:
        """A routing control message on a link: the interest deltas in it that add or remove
        a group are counted (their first copy, at their origin, says what they change)."""
        if b"$share/" not in payload and b'"base"' not in payload:
            return
        for lsa in json.loads(payload):
            if lsa.get("t") != "interest" or "base" not in lsa:
                continue
            key = (lsa["node"], lsa["inc"], lsa["ver"])
            seen = self.share_deltas.get(key)
            if seen is not None:
                self.share_deltas[key] = (seen[0], seen[1] + 1)
                continue
            changes = [f"+{f}" for f in lsa.get("add", ()) if f.startswith("$share/")]
            changes += [f"-{f}" for f in lsa.get("del", ()) if f.startswith("$share/")]
            if changes:
                self.share_deltas[key] = (changes, 1)

    # ------------------------------------------------------------------ the checks

    def fault_windows(self) -> list[tuple[float, float]]:
        """When each fault of the scenario disturbed the mesh: from a crash to its restart, a
        partition to its heal, a link down to up, a slowed link to its old latency, a stall
        for its seconds (a closing fault pairs with the opening one that names the same node
        or link, else with the first open one of its kind: "random" ones)."""
        out: list[tuple[float, float]] = []
        opened: list[tuple[str, Any, float]] = []  # (kind, node or link, since)
        closes = {"restart": "crash", "heal": "partition", "link_up": "link_down"}
        for f in sorted(self.sc.faults, key=lambda f: f.at):
            p = f.params
            what = p.get("node", str(p.get("link", "")))
            kind = closes.get(f.kind, f.kind)
            if f.kind == "stall":
                out.append((f.at, f.at + float(p["seconds"])))
            elif f.kind in ("crash", "partition", "link_down") or (
                f.kind == "latency" and not any(k == kind and w == what for k, w, _t in opened)
            ):
                opened.append((kind, what, f.at))
            elif f.kind in ("restart", "heal", "link_up", "latency"):
                same = [o for o in opened if o[0] == kind and o[1] == what] or [o for o in opened if o[0] == kind]
                if same:
                    opened.remove(same[0])
                    out.append((same[0][2], f.at))
                else:
                    out.append((f.at, f.at))
            else:
                out.append((f.at, f.at))
        out += [(t0, self.sc.duration) for _k, _w, t0 in opened]
        return sorted(out)

    def _stalls(self, node: str) -> list[tuple[float, float]]:
        """The windows in which ``node`` ran nothing (stall.py), from when a publication that
        reached it during one may have been sent (its client's one-way latency before)."""
        lead = self.sc.clients.latency_ms[1] / 1000.0
        return [(a - lead, b) for a, b in self.stall_log.get(node, [])]

    def _finish_shared(self) -> None:
        c = self.sc.clients
        if not c.groups:
            return
        v, h = self.violations, self.history
        faults = self.fault_windows()
        margin = self.detect_bound() + self.settings.shared_reroute
        settle = c.settle
        lossy = self.sc.topology.loss > 0
        # (with persistent members, whose runs end with every client back: a fault excuses a
        # lost message no more where its origin kept a path to a member; cluster_checks.py apart)
        apart = self.apart if c.member_persistent else None
        once = check_once(
            h, faults, settle, settle, margin, lossy, self.detect_bound(), self.sc.duration, apart, self._stalls
        )
        sessions = check_sessions_once(h)
        spread = check_spread(h, self.settings.shared_strategy, faults, settle, settle, margin)
        control = check_control(h, self.share_deltas, len(self.links), apart=apart, detect=self.detect_bound())
        self.shared_results = {"once": once, "spread": spread, "control": control, "sessions": sessions}
        for msg_id, share, why in once.twice[:20]:
            v.add("shared.once", f"{msg_id} {share}: {why}")
        for msg_id, share, why in once.lost[:20]:
            v.add("shared.lost", f"{msg_id} reached no member of {share}: {why}")
        for msg_id, _client, why in sessions.twice[:20]:
            v.add("shared.qos2_once", f"{msg_id}: {why}")
        for share, what in spread.broken[:20]:
            v.add("shared.spread", f"{share} ({self.settings.shared_strategy}): {what}")
        for node, share, what in control.extra[:20]:
            v.add("shared.control", f"{node} {share}: {what}")
        for delta, copies, bound in control.heavy[:20]:
            v.add("shared.control", f"interest delta {delta} crossed the links {copies} times (bound {bound})")
        for what in self._stale_homes()[:20]:
            v.add("shared.home", what)
        for t, name, node, code in self.member_refused[:20]:
            v.add("shared.refused", f"t={t:.3f}s {node} refused {name}'s shared subscription (0x{code:02x})")

    def _stale_homes(self) -> list[str]:
        """At the end (every member back, after a quiet tail), a persistent member's session is
        a member of its group on the node its client is on and on no other: a member at its
        home only (docs/design.md 3.8); a copy that is one elsewhere takes the group's messages
        for a client that is not there."""
        out = []
        for name, cl in sorted(self.clients.items()):
            conn = cl.conn
            if cl.share is None or not cl.persistent or conn is None or not cl.mqtt.connected:
                continue
            for n in self.names:
                node = self.nodes[n]
                if n == conn.node or not node.up or node.core is None:
                    continue
                for group in node.core.broker.shared.groups.values():
                    for s in group.members:
                        if s.client_id == name:
                            out.append(
                                f"{name}'s session is a member of {group.share} on {n} ({len(s.queue)} queued, "
                                f"{len(s.inflight)} in flight) while its client is on {conn.node}"
                            )
        return out

    def shared_summary(self) -> dict[str, Any]:
        r = self.shared_results
        if not r:
            return {}
        once, spread, control, sessions = r["once"], r["spread"], r["control"], r["sessions"]
        counters: dict[str, int] = {}
        for name in self.names:
            node = self.nodes[name]
            if node.up and node.core is not None:
                e = node.core.engine.counters
                for k in ("shared_unreachable", "shared_rerouted"):
                    counters[k] = counters.get(k, 0) + e.get(k, 0)
                sh = node.core.broker.shared
                for k in ("dropped", "redispatched", "resent", "abandoned", "kept_once", "passed_over", "kept_sent"):
                    counters[k] = counters.get(k, 0) + getattr(sh, k)
        return {
            "groups": self.sc.clients.groups,
            "members": sum(1 for cl in self.clients.values() if cl.share is not None),
            "persistent_members": sum(1 for cl in self.clients.values() if cl.share is not None and cl.persistent),
            "strategy": self.settings.shared_strategy,
            "member_leaves": dict(self.member_leaves),
            "once_checked": once.checked,
            "once_delivered": once.delivered,
            "unreachable": once.unreachable,
            "may_expire": once.may_expire,
            "resent_after_leave": once.resent_after_leave,
            "resent_after_fault": once.resent_after_fault,
            "resent_by_publisher": once.resent_by_publisher,
            "republished": once.republished,
            "owed_from_some_send": once.owed_from_some_send,
            "again_to_session": once.again,
            "reached_while_queueing": once.queued,
            "qos2_checked": sessions.checked,
            "qos2_repeats": sessions.repeats,
            "qos2_twice": len(sessions.twice),
            "spread_intervals": spread.intervals,
            "spread_counted": spread.counted,
            "spread_worst_nodes": spread.worst_nodes,
            "spread_worst_members": spread.worst_members,
            "membership_changes": control.changes,
            "first_or_last": control.needed,
            "share_deltas": control.deltas,
            "share_delta_copies": control.copies,
            "share_delta_worst_copies": control.worst_copies,
            "links": len(self.links),
            "node_counters": counters,
        }


def _draw(seed: int, name: str) -> float:
    """Member ``name``'s own draw: whether it is persistent, whatever the others' are."""
    return random.Random(f"{seed}/member/{name}").random()
