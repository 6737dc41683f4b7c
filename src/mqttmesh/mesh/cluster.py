"""One MQTT service across the mesh: ClientId registry, sessions, wills, retained messages.

Pure: no sockets, no asyncio, no clock (every entry point takes ``now``). It
leaves to its caller how unicasts reach other nodes (``send(dest, kind,
payload) -> bool``, over the routing engine), which nodes are alive (it is
told with ``membership``), and the wall clock (``wall`` in messages).

The pieces, all keyed by rendezvous hashing over the live nodes (hrw.py):

* **Registry.** Each ClientId has a registrar (the top node of its ranking)
  and a backup (the second). Connecting anywhere *claims* the id at the
  registrar, which hands out an increasing epoch and tells the previous
  holder to drop its connection (fencing: a kick names the connection it is
  for). The registrar also keeps the client's will: when the node holding
  the connection is found dead, the registrar publishes it, once.
* **Sessions.** A persistent session is held by its holders: the top
  ``replication`` nodes of the ClientId's ranking plus the node the client
  was last connected to. All holders subscribe, so each gets every message;
  the node the client is on delivers and tells the others what is settled.
  A client connecting elsewhere gathers the holders' copies (a union by
  message id) before its CONNACK, and the holders forward what still arrives
  for a while (redirect), the new node dropping what it already has.
* **Retained messages.** Each retained topic lives on the top
  ``replication`` nodes of the topic's ranking, newest version winning;
  a subscription asks those owners (exact filter) or every node (wildcards).
"""

from __future__ import annotations

import base64
import itertools
import json
from dataclasses import dataclass

from ..message import Message
from .hrw import owners
from .replica import ReplicaSessions, install, merge_snapshots, snapshot

__all__ = ["ClusterSettings", "Cluster"]


@dataclass
class ClusterSettings:
    replication: int = 2  # holders of a session, owners of a retained topic
    claim_timeout: float = 1.0  # without an answer from the registrar, connect anyway
    gather_timeout: float = 2.0  # wait this long for the other holders of a session
    will_delay: float = 0.5  # a node unreachable this long has lost its clients
    redirect_grace: float = 10.0  # holders forward late arrivals to a new node this long
    lookup_timeout: float = 1.0  # retained lookups wait this long for every answer
    tombstone_ttl: float = 3600.0  # deleted retained topics are remembered this long
    register_interval: float = 5.0  # local connections re-register with their registrar


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def _unb64(text: str) -> bytes:
    return base64.b64decode(text)


class _Claim:
    __slots__ = (
        "channel",
        "cid",
        "clean",
        "will",
        "conn",
        "started",
        "stage",
        "epoch",
        "prev",
        "waiting",
        "snaps",
        "deadline",
        "forwarded",
    )

    def __init__(self, channel, cid, clean, will, conn, now):
        self.channel, self.cid, self.clean, self.will, self.conn = channel, cid, clean, will, conn
        self.started = now
        self.stage = "claim"
        self.epoch = 0
        self.prev = None
        self.waiting: set[str] = set()
        self.snaps: list = []
        self.deadline = 0.0
        self.forwarded: list = []  # messages holders forwarded before the session is here


class _Local:
    __slots__ = ("channel", "conn", "epoch", "will", "clean", "at")

    def __init__(self, channel, conn, epoch, will, clean, at):
        self.channel, self.conn, self.epoch, self.will, self.clean, self.at = channel, conn, epoch, will, clean, at


class _Lookup:
    __slots__ = ("session", "filter", "granted", "waiting", "items", "deadline")

    def __init__(self, session, topic_filter, granted, waiting, deadline):
        self.session, self.filter, self.granted = session, topic_filter, granted
        self.waiting, self.items, self.deadline = waiting, {}, deadline


def _will_json(will) -> dict | None:
    if will is None:
        return None
    return {"topic": will.topic, "payload": _b64(will.payload), "qos": will.qos, "retain": will.retain}


class Cluster:
    def __init__(self, node_id: str, incarnation: int, broker, send, settings: ClusterSettings | None = None):
        self.node_id = node_id
        self.incarnation = incarnation
        self.broker = broker
        self._send_fn = send
        self.settings = settings or ClusterSettings()
        self.live: list[str] = [node_id]
        self.incs: dict[str, int] = {node_id: incarnation}
        self.entries: dict[str, dict] = {}  # registry entries we keep (registrar or backup)
        self.suspect: dict[str, float] = {}  # unreachable node -> since
        self.local: dict[str, _Local] = {}  # our connected clients
        self.claims: dict[str, _Claim] = {}  # conn -> claim in progress
        self.redirects: dict[str, tuple[str, float]] = {}  # cid -> (new node, until)
        self.lookups: dict[int, _Lookup] = {}
        self._ids = itertools.count(1)
        self._settles: dict[str, list] = {}
        self._ret_out: dict[str, list] = {}
        self._last_register = 0.0
        self.wall = 0.0  # wall-clock seconds, kept current by the caller
        self.counters = {
            "claims": 0,
            "kicks": 0,
            "wills_published": 0,
            "sessions_gathered": 0,
            "redirected": 0,
            "retained_lookups": 0,
            "claim_timeouts": 0,
        }
        broker.cluster = self
        # CleanSession=0 sessions are replicated (mesh/replica.py)
        self.session_factory = broker.session_factory = ReplicaSessions(
            broker.settings.limits,
            broker.journal,
            broker.congestion,
            self._on_settled,
            None if broker.archive is None else broker.archive.sent,  # the archive's delivery log
        )

    # ------------------------------------------------------------------ plumbing

    def _send(self, dest: str, kind: str, body: dict) -> bool:
        if dest == self.node_id:
            self.receive(self.node_id, kind, json.dumps(body).encode(), self._now)
            return True
        return self._send_fn(dest, kind, json.dumps(body).encode())

    _now = 0.0

    def registrars(self, cid: str) -> list[str]:
        return owners(cid, self.live, 2)

    def holders(self, cid: str, last: str | None = None) -> list[str]:
        h = owners(cid, self.live, self.settings.replication)
        if last and last in self.live and last not in h:
            h.append(last)
        return h

    # ------------------------------------------------------------------ membership

    def membership(self, live: list[str], incs: dict[str, int], now: float) -> None:
        """The reachable nodes (with incarnations) changed."""
        self._now = now
        old_live = set(self.live)
        restarted = {n for n, inc in incs.items() if n in self.incs and self.incs[n] != inc}
        self.live = sorted(set(live) | {self.node_id})
        self.incs.update(incs)
        for node in self.live:
            self.suspect.pop(node, None)
        for node in old_live - set(self.live):
            self.suspect.setdefault(node, now)
        for node in restarted:
            self.suspect[node] = now - self.settings.will_delay  # its old connections are gone
        self._rebalance_registry()
        self._register_local(now)
        self._rebalance_sessions(old_live, now)
        self._rebalance_retained()
        self._retry_claims(now)

    def _retry_claims(self, now: float) -> None:
        """Claims and gathers waiting on nodes that just became unreachable move on."""
        live = set(self.live)
        for claim in list(self.claims.values()):
            if claim.stage == "claim" and claim.prev is None:
                registrar = self.registrars(claim.cid)[0]
                if claim.waiting and not claim.waiting & live:
                    claim.waiting = {registrar}
                    if not self._send(registrar, "reg.claim", self._claim_body(claim)):
                        self._granted(claim, 0, None, now)
            elif claim.stage == "gather":
                claim.waiting &= live
                if not claim.waiting:
                    self._finish(claim, now)

    def _rebalance_registry(self) -> None:
        for cid, entry in list(self.entries.items()):
            regs = self.registrars(cid)
            for r in regs:
                if r != self.node_id:
                    self._send(r, "reg.copy", {"entries": [entry]})
            if self.node_id not in regs:
                del self.entries[cid]

    def _register_local(self, now: float) -> None:
        self._last_register = now
        for cid, local in self.local.items():
            self._send(self.registrars(cid)[0], "reg.register", self._registration(cid, local))

    def _registration(self, cid: str, local: _Local) -> dict:
        return {
            "cid": cid,
            "node": self.node_id,
            "inc": self.incarnation,
            "conn": local.conn,
            "epoch": local.epoch,
            "clean": local.clean,
            "will": _will_json(local.will),
            "at": local.at,
        }

    # ------------------------------------------------------------------ connecting

    def connect(self, channel, cid: str, clean: bool, will, now: float) -> None:
        """A client passed authentication; finish with ``channel.claimed(session, present, now)``."""
        self._now = now
        self.counters["claims"] += 1
        conn = f"{self.node_id}/{self.incarnation}/{next(self._ids)}"
        claim = _Claim(channel, cid, clean, will, conn, now)
        claim.deadline = now + self.settings.claim_timeout
        self.claims[conn] = claim
        registrar = self.registrars(cid)[0]
        claim.waiting = {registrar}
        if not self._send(registrar, "reg.claim", self._claim_body(claim)):
            self._granted(claim, 0, None, now)  # registrar unreachable: serve anyway

    def _claim_body(self, claim: _Claim) -> dict:
        return {
            "cid": claim.cid,
            "node": self.node_id,
            "inc": self.incarnation,
            "conn": claim.conn,
            "clean": claim.clean,
            "will": _will_json(claim.will),
            "at": self.wall,
        }

    def _granted(self, claim: _Claim, epoch: int, prev: str | None, now: float) -> None:
        if claim.stage != "claim":
            return
        claim.epoch = epoch
        claim.prev = prev
        if claim.clean:
            # a clean start discards the persistent session wherever it is [MQTT-3.1.2-6]
            for node in set(self.holders(claim.cid, prev)) - {self.node_id}:
                self._send(node, "sess.discard", {"cid": claim.cid, "epoch": epoch})
            self._finish(claim, now)
            return
        targets = (set(self.holders(claim.cid, prev)) | ({prev} if prev else set())) - {self.node_id}
        targets &= set(self.live)
        claim.stage = "gather"
        claim.waiting = set()
        for node in targets:
            if self._send(
                node, "sess.fetch", {"cid": claim.cid, "conn": claim.conn, "epoch": epoch, "to": self.node_id}
            ):
                claim.waiting.add(node)
        claim.deadline = now + self.settings.gather_timeout
        if not claim.waiting:
            self._finish(claim, now)

    def _finish(self, claim: _Claim, now: float) -> None:
        self.claims.pop(claim.conn, None)
        claim.stage = "done"
        channel = claim.channel
        if channel.state != "claiming":
            self._release(claim.cid, claim.conn, claim.epoch)
            return
        broker = self.broker
        merged = None
        if not claim.clean:
            # our own copy as it is now (it kept queueing while we gathered), and the others'
            own = broker.sessions.get(claim.cid)
            snaps = list(claim.snaps)
            if own is not None and getattr(own, "replicated", False):
                snaps.append(snapshot(own))
            merged = merge_snapshots(snaps)
        session, present = broker.open_session(channel, claim.cid, claim.clean)
        if not claim.clean and getattr(session, "replicated", False):
            if merged is not None:
                self.counters["sessions_gathered"] += 1
                install(session, merged)
                for f in list(session.subscriptions):
                    if f not in merged["subs"]:
                        broker.unsubscribe(session, f)
                for f, q in merged["subs"].items():
                    if session.subscriptions.get(f) != q:
                        broker.subscribe(session, f, q)
                present = True
            session.active_node = self.node_id
            session.epoch = max(session.epoch, claim.epoch)
            for body in claim.forwarded:  # what holders forwarded while we gathered
                self._sess_fwd(body)
        self.local[claim.cid] = _Local(channel, claim.conn, claim.epoch, claim.will, claim.clean, self.wall)
        channel.claimed(session, present, now)
        if not claim.clean and getattr(session, "replicated", False):
            self._copy_to_holders(session)

    def _copy_to_holders(self, session) -> None:
        snap = snapshot(session)
        for node in self.holders(session.client_id, self.node_id):
            if node != self.node_id:
                self._send(node, "sess.copy", snap)

    def disconnected(self, channel, now: float) -> None:
        """A local connection ended; its will, if due, was published here by the Channel."""
        self._now = now
        cid = channel.client_id
        local = self.local.get(cid)
        if local is None or local.channel is not channel:
            return
        del self.local[cid]
        self._release(cid, local.conn, local.epoch)

    def _release(self, cid: str, conn: str, epoch: int) -> None:
        self._send(
            self.registrars(cid)[0], "reg.release", {"cid": cid, "conn": conn, "epoch": epoch, "node": self.node_id}
        )

    # ------------------------------------------------------------------ the registrar

    def _reg_claim(self, msg: dict, now: float) -> None:
        cid = msg["cid"]
        entry = self.entries.get(cid)
        epoch = (entry["epoch"] if entry else 0) + 1
        prev = entry["node"] if entry else None
        if entry and entry["connected"] and entry["conn"] != msg["conn"]:
            self.counters["kicks"] += 1
            self._send(
                entry["node"], "reg.kick", {"cid": cid, "conn": entry["conn"], "epoch": epoch, "by": msg["node"]}
            )
        new = {
            "cid": cid,
            "node": msg["node"],
            "inc": msg["inc"],
            "conn": msg["conn"],
            "epoch": epoch,
            "clean": msg["clean"],
            "will": msg["will"],
            "connected": True,
            "at": msg["at"],
        }
        self._store_entry(new)
        self._send(msg["node"], "reg.grant", {"cid": cid, "conn": msg["conn"], "epoch": epoch, "prev": prev})

    def _reg_register(self, msg: dict) -> None:
        """A holder of a connection says so (after membership changes, and periodically)."""
        cid = msg["cid"]
        entry = self.entries.get(cid)
        if entry is None or entry["conn"] == msg["conn"] or not entry["connected"] or entry["node"] not in self.live:
            if (
                entry is None
                or msg["epoch"] >= entry["epoch"]
                or not entry["connected"]
                or entry["node"] not in self.live
            ):
                self._store_entry(
                    {**msg, "connected": True, "epoch": max(msg["epoch"], entry["epoch"] if entry else 0)}
                )
            return
        # two live connections for one ClientId (e.g. made on both sides of a split): one goes
        mine = (entry["epoch"], entry["at"], entry["node"])
        theirs = (msg["epoch"], msg["at"], msg["node"])
        winner, loser = (entry, msg) if mine >= theirs else (msg, entry)
        self.counters["kicks"] += 1
        self._send(
            loser["node"],
            "reg.kick",
            {"cid": cid, "conn": loser["conn"], "epoch": winner["epoch"], "by": winner["node"]},
        )
        self._store_entry({**winner, "connected": True})

    def _reg_release(self, msg: dict) -> None:
        entry = self.entries.get(msg["cid"])
        if entry is not None and entry["conn"] == msg["conn"]:
            entry = {**entry, "connected": False, "will": None}
            self._store_entry(entry)

    def _store_entry(self, entry: dict) -> None:
        self.entries[entry["cid"]] = entry
        for r in self.registrars(entry["cid"]):
            if r != self.node_id:
                self._send(r, "reg.copy", {"entries": [entry]})

    def _reg_copy(self, msg: dict) -> None:
        for entry in msg["entries"]:
            have = self.entries.get(entry["cid"])
            if have is None or (entry["epoch"], not entry["connected"]) >= (have["epoch"], not have["connected"]):
                self.entries[entry["cid"]] = entry

    def _publish_lost_wills(self, now: float) -> None:
        """Clients of nodes found dead: their wills, published once, by their registrar."""
        dead = {n for n, since in self.suspect.items() if now - since >= self.settings.will_delay}
        if not dead:
            return
        for cid, entry in list(self.entries.items()):
            if not entry["connected"]:
                continue
            node_dead = entry["node"] in dead or (
                entry["node"] in self.live and self.incs.get(entry["node"]) != entry["inc"]
            )
            if not node_dead or self.registrars(cid)[0] != self.node_id:
                continue
            will = entry.get("will")
            self._store_entry({**entry, "connected": False, "will": None})
            if will is not None:
                self.counters["wills_published"] += 1
                msg = Message(
                    will["topic"], _unb64(will["payload"]), will["qos"], will["retain"], self.node_id, 0, cid, self.wall
                )
                self.broker.seq += 1
                msg.seq = self.broker.seq
                self.broker.publish(msg)

    def _kick(self, msg: dict) -> None:
        cid, conn = msg["cid"], msg["conn"]
        local = self.local.get(cid)
        if local is not None and local.conn == conn:
            local.channel.kick(f"ClientId {cid!r} connected on node {msg.get('by')}")  # [MQTT-3.1.4-2]
            return
        claim = self.claims.get(conn)
        if claim is not None:
            claim.stage = "done"
            self.claims.pop(conn, None)
            claim.channel.close(f"ClientId {cid!r} connected on node {msg.get('by')} meanwhile")

    # ------------------------------------------------------------------ session holders

    def _sess_fetch(self, frm: str, msg: dict, now: float) -> None:
        cid = msg["cid"]
        local = self.local.get(cid)
        if local is not None and local.conn != msg["conn"]:
            local.channel.kick(f"ClientId {cid!r} taken over by node {frm}")  # stops delivery first
        session = self.broker.sessions.get(cid)
        snap = snapshot(session) if session is not None and getattr(session, "replicated", False) else None
        self._send(frm, "sess.state", {"cid": cid, "conn": msg["conn"], "snap": snap})
        if frm != self.node_id:
            self.redirects[cid] = (frm, now + self.settings.redirect_grace)

    def _sess_state(self, frm: str, msg: dict, now: float) -> None:
        claim = self.claims.get(msg["conn"])
        if claim is None or claim.stage != "gather":
            return
        if msg["snap"] is not None:
            claim.snaps.append(msg["snap"])
        claim.waiting.discard(frm)
        if not claim.waiting:
            self._finish(claim, now)

    def _replica(self, cid: str, create: bool = True):
        session = self.broker.sessions.get(cid)
        if session is not None and getattr(session, "replicated", False):
            return session
        if session is not None or not create:
            return None
        session = self.session_factory.restored(cid)
        self.broker.restore_session(session)
        return session

    def _apply_subs(self, session, subs: dict) -> None:
        broker = self.broker
        for f in list(session.subscriptions):
            if f not in subs:
                broker.unsubscribe(session, f)
        for f, q in subs.items():
            if session.subscriptions.get(f) != q:
                broker.subscribe(session, f, q)

    def _sess_copy(self, frm: str, snap: dict, merge: bool) -> None:
        cid = snap["cid"]
        session = self._replica(cid)
        if session is None or session.channel is not None:
            if session is not None and merge is False and snap["epoch"] > session.epoch:
                session.channel.kick(f"ClientId {cid!r} is active on node {frm}")
                session = self._replica(cid)
            if session is None or session.channel is not None:
                return
        if merge:
            # (merged is never None: merge_snapshots has a session's snapshot to merge)
            merged = merge_snapshots([snapshot(session), snap])
            install(session, merged)  # type: ignore[arg-type]
            self._apply_subs(session, merged["subs"])  # type: ignore[index]
        else:
            if snap["epoch"] < session.epoch:
                return
            install(session, snap)
            self._apply_subs(session, snap["subs"])
            session.subs_version = snap["subs_version"]
        session.active_node = snap["active"]
        session.epoch = max(session.epoch, snap["epoch"])

    def _sess_settle(self, msg: dict) -> None:
        session = self._replica(msg["cid"], create=False)
        if session is None or session.channel is not None:
            return
        for origin, seq, state, pid in msg["items"]:
            session.settle((origin, seq), state, pid)

    def _sess_subs(self, frm: str, msg: dict) -> None:
        session = self._replica(msg["cid"])
        if session is None or session.channel is not None or msg["version"] <= session.subs_version:
            return
        session.subs_version = msg["version"]
        session.active_node = frm
        self._apply_subs(session, msg["subs"])

    def _sess_discard(self, msg: dict) -> None:
        session = self.broker.sessions.get(msg["cid"])
        if session is not None and getattr(session, "replicated", False) and session.channel is None:
            self.broker.discard_session(session)

    def _on_settled(self, session, key: tuple, state: str, pid: int) -> None:
        self._settles.setdefault(session.client_id, []).append([key[0], key[1], state, pid])

    def subs_changed(self, session) -> None:
        """The connected client of a replicated session subscribed or unsubscribed."""
        session.subs_version += 1
        body = {"cid": session.client_id, "version": session.subs_version, "subs": session.subscriptions}
        for node in self.holders(session.client_id, self.node_id):
            if node != self.node_id:
                self._send(node, "sess.subs", body)

    def _rebalance_sessions(self, old_live: set, now: float) -> None:
        live = set(self.live)
        for cid, session in list(self.broker.sessions.items()):
            if not getattr(session, "replicated", False):
                continue
            active = session.active_node
            holders = self.holders(cid, active)
            if session.channel is not None:
                # the client is here: make sure every holder has a copy
                new = set(holders) - old_live - {self.node_id}
                if new or set(holders) - (set(old_live)):
                    self._copy_to_holders(session)
            elif active is None or active not in live or active == self.node_id:
                # nobody coordinates this offline session: holders pool what they have
                snap = snapshot(session)
                for node in holders:
                    if node != self.node_id:
                        self._send(node, "sess.merge", snap)
            if self.node_id not in holders and session.channel is None and active != self.node_id:
                # not ours to keep any more: the holders have (or just got) it
                for node in holders:
                    self._send(node, "sess.merge", snapshot(session))
                self.broker.discard_session(session)

    # ------------------------------------------------------------------ retained messages

    def retain(self, msg: Message) -> None:
        """A retained message (or an empty one, a deletion) published here [MQTT-3.3.1-5, -10]."""
        item = [msg.topic, _b64(msg.payload), msg.qos, msg.timestamp, msg.origin, msg.seq, msg.publisher]
        # kept here too (durable before the PUBACK) until an owner confirms it has it; a
        # copy lost on the way is sent again from here at the next rebalance
        self._store_retained(item)
        for node in owners(msg.topic, self.live, self.settings.replication):
            if node != self.node_id:
                self._ret_out.setdefault(node, []).append(item)

    def _store_retained(self, item: list) -> None:
        topic, payload, qos, ts, origin, seq, publisher = item
        broker = self.broker
        have = broker.retained.get(topic)
        version = (ts, origin, seq)
        if have is not None and (have.timestamp, have.origin, have.seq) >= version:
            return  # we hold a newer one (the newest wins after a split)
        msg = Message(topic, _unb64(payload), qos, True, origin, seq, publisher, ts)
        broker.retained.set(topic, msg)  # an empty payload stays as a tombstone
        broker.journal.retained_put(topic, msg)

    def _retained_acked(self, items: list) -> None:
        """An owner has these: our interim copies of topics we do not own can go."""
        broker = self.broker
        for topic, ts, origin, seq in items:
            if self.node_id in owners(topic, self.live, self.settings.replication):
                continue
            have = broker.retained.get(topic)
            if have is not None and (have.timestamp, have.origin, have.seq) == (ts, origin, seq):
                broker.retained.delete(topic)
                broker.journal.retained_delete(topic)

    def retained_lookup(self, session, topic_filter: str, granted: int) -> int:
        """Send a new subscription the retained messages matching it, from their owners."""
        self.counters["retained_lookups"] += 1
        wildcard = "+" in topic_filter or "#" in topic_filter
        targets = set(self.live) if wildcard else set(owners(topic_filter, self.live, self.settings.replication))
        qid = next(self._ids)
        lookup = _Lookup(session, topic_filter, granted, set(), self._now + self.settings.lookup_timeout)
        self.lookups[qid] = lookup
        for node in targets:
            if node == self.node_id:
                self._add_items(lookup, self._local_retained(topic_filter))
            elif self._send(node, "ret.query", {"qid": qid, "filter": topic_filter}):
                lookup.waiting.add(node)
        if not lookup.waiting:
            self._deliver_lookup(qid)
        return 0

    def _local_retained(self, topic_filter: str) -> list:
        return [
            [m.topic, _b64(m.payload), m.qos, m.timestamp, m.origin, m.seq, m.publisher]
            for _, m in self.broker.retained.match(topic_filter)
        ]

    def _add_items(self, lookup: _Lookup, items: list) -> None:
        for item in items:
            have = lookup.items.get(item[0])
            if have is None or (item[3], item[4], item[5]) > (have[3], have[4], have[5]):
                lookup.items[item[0]] = item

    def _deliver_lookup(self, qid: int) -> None:
        lookup = self.lookups.pop(qid, None)
        if lookup is None:
            return
        session = lookup.session
        if session.subscriptions.get(lookup.filter) is None:
            return  # unsubscribed meanwhile
        auth = self.broker.auth
        for topic, payload, qos, ts, origin, seq, publisher in sorted(lookup.items.values()):
            if not payload:
                continue  # a tombstone
            if auth.acl is not None and not auth.can_receive(session.username, session.client_id, topic):
                continue
            msg = Message(topic, _unb64(payload), qos, True, origin, seq, publisher, ts)
            session.deliver(msg, min(qos, lookup.granted), retain=True)  # [MQTT-3.3.1-6, -8]

    def _rebalance_retained(self) -> None:
        for topic, msg in list(self.broker.retained.items()):
            if topic.startswith("$"):
                continue
            own = owners(topic, self.live, self.settings.replication)
            item = [topic, _b64(msg.payload), msg.qos, msg.timestamp, msg.origin, msg.seq, msg.publisher]
            for node in own:
                if node != self.node_id:
                    self._ret_out.setdefault(node, []).append(item)
            if self.node_id not in own:
                self.broker.retained.delete(topic)
                self.broker.journal.retained_delete(topic)

    # ------------------------------------------------------------------ input and time

    def receive(self, frm: str, kind: str, payload: bytes, now: float) -> None:
        """A unicast from node ``frm`` (kinds ``reg.*``, ``sess.*``, ``ret.*``)."""
        self._now = now
        msg = json.loads(payload)
        if kind == "reg.claim":
            self._reg_claim(msg, now)
        elif kind == "reg.grant":
            claim = self.claims.get(msg["conn"])
            if claim is not None:
                self._granted(claim, msg["epoch"], msg["prev"], now)
        elif kind == "reg.kick":
            self.counters["kicks"] += frm != self.node_id
            self._kick(msg)
        elif kind == "reg.release":
            self._reg_release(msg)
        elif kind == "reg.register":
            self._reg_register(msg)
        elif kind == "reg.copy":
            self._reg_copy(msg)
        elif kind == "sess.fetch":
            self._sess_fetch(frm, msg, now)
        elif kind == "sess.state":
            self._sess_state(frm, msg, now)
        elif kind == "sess.copy":
            self._sess_copy(frm, msg, merge=False)
        elif kind == "sess.merge":
            self._sess_copy(frm, msg, merge=True)
        elif kind == "sess.settle":
            self._sess_settle(msg)
        elif kind == "sess.subs":
            self._sess_subs(frm, msg)
        elif kind == "sess.discard":
            self._sess_discard(msg)
        elif kind == "sess.fwd":
            self._sess_fwd(msg)
        elif kind == "ret.set":
            for item in msg["items"]:
                self._store_retained(item)
            self._send(frm, "ret.ack", {"items": [[i[0], i[3], i[4], i[5]] for i in msg["items"]]})
        elif kind == "ret.ack":
            self._retained_acked(msg["items"])
        elif kind == "ret.query":
            self._send(frm, "ret.reply", {"qid": msg["qid"], "items": self._local_retained(msg["filter"])})
        elif kind == "ret.reply":
            lookup = self.lookups.get(msg["qid"])
            if lookup is not None:
                self._add_items(lookup, msg["items"])
                lookup.waiting.discard(frm)
                if not lookup.waiting:
                    self._deliver_lookup(msg["qid"])
        else:
            raise ValueError(f"unknown cluster message kind {kind!r}")

    def tick(self, now: float) -> None:
        self._now = now
        for claim in list(self.claims.values()):
            if now >= claim.deadline:
                if claim.stage == "claim":
                    self.counters["claim_timeouts"] += 1
                    self._granted(claim, 0, None, now)
                elif claim.stage == "gather":
                    self._finish(claim, now)
        for qid, lookup in list(self.lookups.items()):
            if now >= lookup.deadline:
                self._deliver_lookup(qid)
        for cid, (_, until) in list(self.redirects.items()):
            if now >= until:
                del self.redirects[cid]
        self._publish_lost_wills(now)
        if now - self._last_register >= self.settings.register_interval:
            self._register_local(now)
        self._expire_tombstones()

    def _expire_tombstones(self) -> None:
        horizon = self.wall - self.settings.tombstone_ttl
        broker = self.broker
        for topic, msg in list(broker.retained.items()):
            if not msg.payload and msg.timestamp < horizon:
                broker.retained.delete(topic)
                broker.journal.retained_delete(topic)

    def flush(self) -> None:
        """Send what accumulated: settlements to holders, retained sets to owners."""
        if self._settles:
            settles, self._settles = self._settles, {}
            for cid, items in settles.items():
                session = self.broker.sessions.get(cid)
                epoch = session.epoch if session is not None else 0
                for node in self.holders(cid, self.node_id):
                    if node != self.node_id:
                        self._send(node, "sess.settle", {"cid": cid, "epoch": epoch, "items": items})
        if self._ret_out:
            out, self._ret_out = self._ret_out, {}
            for node, items in out.items():
                self._send(node, "ret.set", {"items": items})

    # ------------------------------------------------------------------ redirect during hand-over

    def delivered_here(self, session, msg: Message) -> None:
        """Hook: a message reached a local replica whose client just moved elsewhere."""
        target = self.redirects.get(session.client_id)
        if target is None:
            return
        self.counters["redirected"] += 1
        self._send(
            target[0],
            "sess.fwd",
            {
                "cid": session.client_id,
                "msg": [
                    msg.topic,
                    _b64(msg.payload),
                    msg.qos,
                    msg.retain,
                    msg.origin,
                    msg.seq,
                    msg.publisher,
                    msg.timestamp,
                ],
            },
        )

    def _sess_fwd(self, body: dict) -> None:
        topic, payload, qos, retain, origin, seq, publisher, ts = body["msg"]
        session = self.broker.sessions.get(body["cid"])
        if session is None or not getattr(session, "replicated", False):
            for claim in self.claims.values():
                if claim.cid == body["cid"] and claim.stage == "gather":
                    claim.forwarded.append(body)  # the session is still being gathered: for _finish
            return
        granted = None
        from ..topics import filter_matches

        for f, q in session.subscriptions.items():
            if filter_matches(f, topic):
                granted = q if granted is None else max(granted, q)
        if granted is None:
            return
        msg = Message(topic, _unb64(payload), qos, False, origin, seq, publisher, ts)
        session.deliver(msg, min(qos, granted))  # a duplicate by id is dropped there

    # ------------------------------------------------------------------ status

    def status(self) -> dict:
        """Counters and live nodes: nothing that names a client."""
        return {"counters": dict(self.counters), "live": self.live}

    def clients(self) -> dict:
        """The ClientIds this node registers (as their first registrar) and serves."""
        mine = {
            cid: {"node": e["node"], "epoch": e["epoch"], "connected": e["connected"]}
            for cid, e in sorted(self.entries.items())
            if self.registrars(cid)[0] == self.node_id
        }
        return {"registrations": mine, "local_clients": sorted(self.local)}
