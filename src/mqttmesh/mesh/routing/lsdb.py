"""The advertisement database: what every node says of its links and of its subscribers' filters.

Pure. A part of ``MeshEngine`` (engine.py, a mixin over engine_base.EngineState):
originating our router and interest advertisements, flooding, installing what
neighbours send, the database exchange when a link comes up (dbsum, lsreq), our own
advertisements echoed from an earlier life, and forgetting nodes unreachable for
``max_age``. It leaves the links, the clock and the bytes on the wire to the engine's
caller; what it queues leaves at the engine's next ``flush``.
"""

from __future__ import annotations

import sys
import zlib
from collections.abc import Iterable
from typing import Any

from .actions import Send
from .engine_base import EngineState
from .records import Control, InterestState, Lsa, RouterLsa
from .wire import MeshProtocolError

__all__ = ["RouterLsa", "InterestState", "Control", "newest_only", "LsdbMixin"]


def _filter_tuple(filters: Iterable[str]) -> tuple[str, ...]:
    """Distinct interned filters; TypeError for anything that is not a string."""
    return tuple({sys.intern(f) for f in filters})


def newest_only(lsas: list[Lsa]) -> list[Lsa]:
    """What of a neighbour's queue is worth sending: the newest router advertisement of each
    node, and of a node's interest the newest full one and the deltas after it.

    Several versions of one advertisement queued in the same flush (a burst of link events,
    teach-backs crossing each other) would otherwise each be sent, each cross the others and
    each be answered with the newer one: floods that feed themselves.
    """
    router: dict[str | None, tuple[int, int]] = {}  # (node is None only in a malformed advertisement)
    full: dict[str | None, tuple[int, int]] = {}
    for lsa in lsas:
        kind, node = lsa.get("t"), lsa.get("node")
        if kind == "router":
            key = (lsa["inc"], lsa["seq"])
            if router.get(node, key) <= key:
                router[node] = key
        elif "full" in lsa:
            key = (lsa["inc"], lsa["ver"])
            if full.get(node, key) <= key:
                full[node] = key
    out = []
    sent: set[tuple[str, str | None]] = set()
    for lsa in lsas:
        kind, node = lsa.get("t"), lsa.get("node")
        if kind == "router":
            if (lsa["inc"], lsa["seq"]) == router[node] and ("r", node) not in sent:
                sent.add(("r", node))
                out.append(lsa)
            continue
        newest = full.get(node)
        key = (lsa["inc"], lsa["ver"])
        if newest is None or key > newest:
            out.append(lsa)  # no full one queued, or a delta that follows it
        elif "full" in lsa and key == newest and ("i", node) not in sent:
            sent.add(("i", node))
            out.append(lsa)
    return out


class LsdbMixin(EngineState):
    # ------------------------------------------------------------------ local interest

    def local_filter_added(self, topic_filter: str) -> None:
        if topic_filter in self._local_filters:
            return
        self._local_filters.add(topic_filter)
        if topic_filter.startswith("$share/"):
            self._share_added(topic_filter, self.node_id)
        if topic_filter in self._pending_del:
            self._pending_del.discard(topic_filter)
        else:
            self._pending_add.add(topic_filter)

    def local_filter_removed(self, topic_filter: str) -> None:
        if topic_filter not in self._local_filters:
            return
        self._local_filters.discard(topic_filter)
        if topic_filter.startswith("$share/"):
            self._share_removed(topic_filter, self.node_id)
        if topic_filter in self._pending_add:
            self._pending_add.discard(topic_filter)
        else:
            self._pending_del.add(topic_filter)

    # ------------------------------------------------------------------ origination and flooding

    def _originate_router(self, now: float) -> None:
        self._seq += 1
        lsa = RouterLsa(self.node_id, self.incarnation, self._seq, list(self.addresses), dict(self._links), now)
        self.routers[self.node_id] = lsa
        self._last_refresh = now
        # the next refresh, jittered (deterministically: the engine has no randomness of its
        # own) to 75-100 % of the interval, so refreshes that a mass event aligned (the mesh
        # forming, a heal) drift apart instead of flooding the mesh together every interval
        spread = zlib.crc32(f"{self.node_id}/{self.incarnation}/{self._seq}".encode()) / 2**32
        self._next_refresh = now + self.settings.refresh_interval * (1.0 - 0.25 * spread)
        self.counters["lsa_originated"] += 1
        self.changes += 1
        self._flood(lsa.to_json(), exclude=None)

    def _originate_interest(self) -> None:
        """Our first interest advertisement (``start``), with the filters subscribed before it."""
        self._interest_ver = 1
        mine = InterestState(self.node_id, self.incarnation, 1, _filter_tuple(self._local_filters))
        self.interests[self.node_id] = mine

    def _originate_interest_delta(self) -> None:
        if not self._pending_add and not self._pending_del:
            return
        mine = self.interests[self.node_id]
        base = self._interest_ver
        self._interest_ver += 1
        mine.ver = self._interest_ver
        mine.filters = _filter_tuple(self._local_filters)
        delta = {
            "t": "interest",
            "node": self.node_id,
            "inc": self.incarnation,
            "ver": self._interest_ver,
            "base": base,
            "add": sorted(self._pending_add),
            "del": sorted(self._pending_del),
        }
        self._pending_add.clear()
        self._pending_del.clear()
        self.counters["lsa_originated"] += 1
        self.counters["interest_originated"] += 1
        self.changes += 1
        self._flood(delta, exclude=None)

    def _flood(self, lsa: Lsa, exclude: str | None) -> None:
        for peer in self._links:
            if peer != exclude:
                self._flood_out.setdefault(peer, []).append(lsa)

    def _send_control(self, peer: str, kind: str, body: Any) -> None:
        if kind == "lsa":
            self._flood_out.setdefault(peer, []).extend(body)
        else:
            self._control_out.append(Control(peer, kind, body))

    # ------------------------------------------------------------------ what neighbours send

    def _receive_lsas(self, peer: str, lsas: list[Lsa], now: float) -> None:
        requests: list[list[str]] = []
        wanted = self._wanted.get(peer)
        for lsa in lsas:
            self.counters["lsa_received"] += 1
            kind = lsa.get("t")
            node = lsa.get("node")
            if not isinstance(node, str):
                raise MeshProtocolError("advertisement without node")
            if node == self.node_id:
                self._own_lsa_echo(lsa, now)
                continue
            if kind == "router":
                self._install_router(peer, lsa, now)
            elif kind == "interest":
                need = self._install_interest(peer, lsa)
                if need:
                    requests.append([node, "interest"])
                    continue  # (a delta we could not apply: still wanted, asked again)
            else:
                raise MeshProtocolError(f"unknown advertisement type {kind!r}")
            if wanted:
                wanted.discard((node, kind))
        if requests:
            self._send_control(peer, "lsreq", requests)
        if wanted is not None and not wanted:
            self._synced_with(peer)

    def _synced_with(self, peer: str) -> None:
        """Every advertisement ``peer``'s summary named is here: we know what it knows."""
        self._wanted.pop(peer, None)
        if not self.synced:
            self.synced = True
            self.changes += 1  # (the cluster hears of it with the next membership check)

    def _own_lsa_echo(self, lsa: Lsa, now: float) -> None:
        """An advertisement of ours from an earlier life: out-number it."""
        if lsa.get("t") == "router":
            inc, seq = lsa.get("inc", 0), lsa.get("seq", 0)
            if (inc, seq) > (self.incarnation, self._seq):
                if inc > self.incarnation:
                    self.incarnation = inc + 1  # cannot happen with a store; defensive
                self._seq = seq
                self._originate_router(now)
        elif lsa.get("t") == "interest":
            if (lsa.get("inc", 0), lsa.get("ver", 0)) > (self.incarnation, self._interest_ver):
                self._interest_ver = lsa["ver"] + 1
                mine = self.interests[self.node_id]
                mine.ver = self._interest_ver
                full = mine.full_json()
                self._flood(full, exclude=None)

    def _install_router(self, peer: str, lsa: Lsa, now: float) -> None:
        node = lsa["node"]
        key = (lsa["inc"], lsa["seq"])
        have = self.routers.get(node)
        if have is not None and (have.inc, have.seq) >= key:
            if (have.inc, have.seq) > key:
                self._send_control(peer, "lsa", [have.to_json()])  # teach the neighbour
            return
        links = {str(k): int(v) for k, v in lsa.get("links", {}).items()}
        self.routers[node] = RouterLsa(node, lsa["inc"], lsa["seq"], list(lsa.get("addr", [])), links, now)
        if have is None or have.links != links:
            # the shortest paths depend on the links alone: a refresh (every node re-originates
            # every refresh_interval) changes nothing, and at a thousand nodes recomputing for
            # each of them would cost a Dijkstra per node every few milliseconds
            self._spf_dirty = True
        if have is not None and have.inc != lsa["inc"]:
            # a new incarnation: what we knew of its interest is from its earlier life. Not
            # what we delivered of its messages: a new life numbers its messages above the
            # old one's (assembly.py seq_base), and what it retransmits from its restored
            # custody is the old life's, delivered here maybe, its acknowledgement lost
            old = self.interests.get(node)
            if old is not None and old.inc < lsa["inc"]:
                self._set_interest(node, None)
        self.changes += 1
        self.counters["lsa_flooded"] += 1
        self._flood(lsa, exclude=peer)

    def _install_interest(self, peer: str, lsa: Lsa) -> bool:
        """Apply a full or delta interest advertisement; True when we must ask for a full one."""
        node, inc, ver = lsa["node"], lsa["inc"], lsa["ver"]
        have = self.interests.get(node)
        if have is not None and (have.inc, have.ver) >= (inc, ver):
            return False
        if "full" in lsa:
            self._set_interest(node, InterestState(node, inc, ver, _filter_tuple(lsa["full"])))
        else:
            if have is None or have.inc != inc or have.ver != lsa.get("base"):
                return True  # a gap: we cannot apply this delta
            filters = set(have.filters)
            filters.difference_update(lsa.get("del", []))
            filters.update(lsa.get("add", []))
            self._set_interest(node, InterestState(node, inc, ver, _filter_tuple(filters)))
        self.counters["lsa_flooded"] += 1
        self._flood(lsa, exclude=peer)
        return False

    def _set_interest(self, node: str, state: InterestState | None) -> None:
        old = self.interests.get(node)
        old_filters = old.filters if old is not None else ()
        new_filters = state.filters if state is not None else ()
        if node != self.node_id:
            self._shares_of(node, old_filters, new_filters)  # (ours: local_filter_added)
        remote = self.remote
        if not old_filters:
            remote.add_all(new_filters, node)
        elif not new_filters:
            for f in old_filters:
                remote.remove(f, node)
        else:
            old_set, new_set = set(old_filters), set(new_filters)
            for f in old_set - new_set:
                remote.remove(f, node)
            remote.add_all(new_set - old_set, node)
        if state is None:
            self.interests.pop(node, None)
        else:
            self.interests[node] = state
        self._route_cache.clear()
        self.changes += 1

    # ------------------------------------------------------------------ database exchange

    def _summary(self) -> dict[str, list[int]]:
        """The versions of every advertisement we hold (sent on link up, OSPF-style).

        A node's router and interest advertisements travel independently, so we may hold its
        interest before its router advertisement: it is summarised too ([-1, -1, ...]), or it
        would never cross the new link.
        """
        summary = {}
        interests = self.interests
        for node, r in self.routers.items():
            i = interests.get(node)
            summary[node] = [r.inc, r.seq, i.inc if i else -1, i.ver if i else -1]
        for node, i in interests.items():
            if node not in summary:
                summary[node] = [-1, -1, i.inc, i.ver]
        return summary

    def _receive_dbsum(self, peer: str, summary: dict[str, list[int]], now: float) -> None:
        requests = []
        push = []
        for node, versions in summary.items():
            if node == self.node_id:
                continue
            r_inc, r_seq, i_inc, i_ver = versions
            have_r = self.routers.get(node)
            if r_inc >= 0 and (have_r is None or (have_r.inc, have_r.seq) < (r_inc, r_seq)):
                requests.append([node, "router"])
            elif have_r is not None and (have_r.inc, have_r.seq) > (r_inc, r_seq):
                push.append(have_r.to_json())
            have_i = self.interests.get(node)
            if i_inc >= 0 and (have_i is None or (have_i.inc, have_i.ver) < (i_inc, i_ver)):
                requests.append([node, "interest"])
            elif have_i is not None and (have_i.inc, have_i.ver) > (i_inc, i_ver):
                push.append(have_i.full_json())
        for node, r in self.routers.items():
            if node not in summary:
                push.append(r.to_json())
        for node, i in self.interests.items():
            if node not in summary:
                push.append(i.full_json())
        if push:
            self._send_control(peer, "lsa", push)
        if requests:
            self._send_control(peer, "lsreq", requests)
            self._wanted[peer] = {(node, kind) for node, kind in requests}
        else:
            self._synced_with(peer)

    def _receive_lsreq(self, peer: str, requests: list[list[str]], now: float) -> None:
        out = []
        for node, kind in requests:
            if kind == "router" and node in self.routers:
                out.append(self.routers[node].to_json())
            elif kind == "interest" and node in self.interests:
                out.append(self.interests[node].full_json())
        if out:
            self._send_control(peer, "lsa", out)

    # ------------------------------------------------------------------ ageing

    def _age_out(self, now: float) -> None:
        self._ensure_spf()
        if len(self.next_hop) >= len(self.routers) - 1:
            return  # every node we know is reachable (the scan costs O(nodes) at every tick)
        for node in [
            n
            for n, r in self.routers.items()
            if n != self.node_id and n not in self.next_hop and now - r.received > self.settings.max_age
        ]:
            del self.routers[node]
            self._set_interest(node, None)
            self._spf_dirty = True
            self._release_custody(node)

    # ------------------------------------------------------------------ output (engine.flush)

    def _flush_control(self, sends: list[Send]) -> None:
        control, self._control_out = self._control_out, []
        dumps = self.codec.dumps
        for peer, kind, body in control:
            if peer in self._links:
                payload = dumps(body).encode()
                stats = self._stats(peer)
                stats.control_out += 1
                stats.control_bytes_out += len(payload)
                sends.append(Send(peer, kind, payload, 1))

    def _flush_floods(self, sends: list[Send]) -> None:
        flood, self._flood_out = self._flood_out, {}
        dumps = self.codec.dumps
        # a flooded advertisement goes to every neighbour but one: encode it once.
        # The bytes are those of json.dumps(lsas), whose list separator is ", "
        encoded: dict[int, bytes] = {}
        for peer, lsas in flood.items():
            if peer in self._links:
                if len(lsas) > 1:
                    lsas = newest_only(lsas)
                parts = []
                for lsa in lsas:
                    raw = encoded.get(id(lsa))
                    if raw is None:
                        raw = encoded[id(lsa)] = dumps(lsa).encode()
                    parts.append(raw)
                payload = b"[" + b", ".join(parts) + b"]"
                stats = self._stats(peer)
                stats.control_out += 1
                stats.control_bytes_out += len(payload)
                sends.append(Send(peer, "lsa", payload, 1))
