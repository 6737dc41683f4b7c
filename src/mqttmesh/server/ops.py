"""What an operator asks the mesh: this node's answers, and every node's, gathered.

The I/O layer behind the admin API (server/api.py). Each question has a local answer,
read from what this node holds (its connections, its sessions and their copies, its
retained messages) and bounded by a page: at most ``limit`` items whose key comes after
``after``, in key order. A question for the whole mesh is asked of every node this node
can route to, as an ``ops.ask`` unicast over the mesh (the same routed path as the
cluster's messages, so no node needs to reach another's HTTP port); each answers with an
``ops.answer``. The answers are merged by key, duplicates folded (a persistent session is
held on several nodes), and cut to the page: since each node sent its first ``limit`` keys
after the cursor, the first ``limit`` of the union are the mesh's. A node that does not
answer within ``http.mesh_timeout`` is named in ``missing``.

Kinds on the wire (JSON bodies): ``ops.ask`` ``{"q": id, "what": name, "args": {...}}``,
``ops.answer`` ``{"q": id, "answer": ...}`` or ``{"q": id, "error": why}``.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import logging
from collections.abc import Callable, Iterable
from typing import Any

from ..channel import CONNECTED
from ..session import NO_LOCAL, RETAIN_AS_PUBLISHED, SUB_ID_SHIFT, SUB_QOS
from .websocket import is_websocket

# the server/node.py Node, typed loosely: node.py imports this module (no circle)
Node = Any

log = logging.getLogger("mqttmesh.ops")

ASK, ANSWER = "ops.ask", "ops.answer"
MAX_LIMIT = 1000  # items one page may hold (a node's answer is one unicast)
PREVIEW = 256  # bytes of a retained payload a listing shows

Item = dict[str, Any]


# --------------------------------------------------------------------------- local answers


def _page(items: Iterable[Item], key: Callable[[Item], str], after: str, limit: int) -> list[Item]:
    chosen = sorted((i for i in items if key(i) > after), key=key)
    return chosen[:limit]


def _transport(conn) -> str:
    t = conn.transport
    ws = is_websocket(t)
    tls = t is not None and t.get_extra_info("ssl_object") is not None
    return ("wss" if tls else "ws") if ws else ("tls" if tls else "tcp")


def _client_connections(node: Node) -> Iterable[Any]:
    for conn in node.connections:
        channel = conn.channel
        if channel is not None and channel.state is CONNECTED and not channel.is_peer:
            yield conn


def local_clients(node: Node, after: str = "", limit: int = 100, client_id: str | None = None) -> list[Item]:
    """The clients connected here (not the peer links), by ClientId."""
    out = []
    for conn in _client_connections(node):
        channel = conn.channel
        if client_id is not None and channel.client_id != client_id:
            continue
        session = channel.session
        out.append(
            {
                "client_id": channel.client_id,
                "node": node.node_id,
                "address": conn.peer,
                "connected_since": round((conn.connected_at or 0.0) + node.broker.wall_offset, 3),
                "username": channel.username,
                "transport": _transport(conn),
                "keepalive": channel.keepalive,
                "clean_session": bool(session.clean) if session is not None else True,
                "subscriptions": len(session.subscriptions) if session is not None else 0,
                "queued": len(session.queue) if session is not None else 0,
                "inflight": len(session.inflight) if session is not None else 0,
            }
        )
    return _page(out, lambda i: i["client_id"], after, limit)


def local_kick(node: Node, client_id: str) -> bool:
    """Disconnect the client connected here with this ClientId (its will is published, as
    for any connection the server ends); False if it is not connected here."""
    for conn in list(_client_connections(node)):
        if conn.channel.client_id == client_id:
            log.warning("client %r from %s disconnected by an operator (admin API)", client_id, conn.peer)
            why = "disconnected by an operator (admin API)"
            conn.channel.close_because(0x98, why, node.loop.time())  # (Administrative action)
            return True
    return False


def local_sessions(node: Node, after: str = "", limit: int = 100) -> list[Item]:
    """The sessions held here: of clients connected here, persistent sessions of clients
    gone, and the copies held for other nodes' clients."""
    out = []
    for cid, session in node.broker.sessions.items():
        if cid <= after:
            continue
        connected = session.channel is not None
        out.append(
            {
                "client_id": cid,
                "clean_session": bool(session.clean),
                "connected_here": connected,
                "held_by": [node.node_id],
                "subscriptions": len(session.subscriptions),
                "queued": len(session.queue),
                "inflight": len(session.inflight),
            }
        )
    return _page(out, lambda i: i["client_id"], after, limit)


def _sub_key(i: Item) -> str:
    return f"{i['client_id']}\x00{i['filter']}"


def local_subscriptions(node: Node, after: str = "", limit: int = 100) -> list[Item]:
    out = []
    for cid, session in node.broker.sessions.items():
        if cid < after.split("\x00", 1)[0]:
            continue
        for topic_filter, value in session.subscriptions.items():
            item = {"client_id": cid, "filter": topic_filter, "qos": value & SUB_QOS}
            if value > SUB_QOS:  # an MQTT 5 subscription's options
                item["no_local"] = bool(value & NO_LOCAL)
                item["retain_as_published"] = bool(value & RETAIN_AS_PUBLISHED)
                item["retain_handling"] = (value >> 4) & 0x03
                if value >> SUB_ID_SHIFT:
                    item["subscription_id"] = value >> SUB_ID_SHIFT
            out.append(item)
    return _page(out, _sub_key, after, limit)


def local_retained(node: Node, after: str = "", limit: int = 100, topic_filter: str = "#") -> list[Item]:
    """The retained messages held here (in a mesh: of the topics this node owns), not $SYS."""
    out = []
    trie = node.broker.retained
    for topic, msg in trie.match(topic_filter) if topic_filter != "#" else trie.items():
        if topic <= after or topic.startswith("$") or not msg.payload:
            continue  # (an empty payload is a deletion's tombstone)
        payload = bytes(msg.payload)
        item: Item = {
            "topic": topic,
            "qos": msg.qos,
            "bytes": len(payload),
            "origin": msg.origin,
            "timestamp": round(msg.timestamp, 3),
            "version": [msg.timestamp, msg.origin, msg.seq],
        }
        try:
            item["payload"] = payload[:PREVIEW].decode("utf-8")
        except UnicodeDecodeError:
            item["payload_base64"] = base64.b64encode(payload[:PREVIEW]).decode()
        out.append(item)
    return _page(out, lambda i: i["topic"], after, limit)


def answer_locally(node: Node, what: str, args: dict[str, Any]) -> Any:
    """This node's answer to a question (for the admin API, or for another node)."""
    after = str(args.get("after", ""))
    limit = max(1, min(MAX_LIMIT, int(args.get("limit", 100))))
    if what == "stats":
        stats = node.broker.stats
        return {
            "messages_received": stats.messages_received,
            "messages_sent": stats.messages_sent,
            "clients_connected": sum(1 for _ in _client_connections(node)),  # (not the peer links)
            "uptime_s": round(node.uptime(), 3),
        }
    if what == "clients":
        cid = args.get("client_id")
        return local_clients(node, after, limit, None if cid is None else str(cid))
    if what == "kick":
        return local_kick(node, str(args["client_id"]))
    if what == "sessions":
        return local_sessions(node, after, limit)
    if what == "subscriptions":
        return local_subscriptions(node, after, limit)
    if what == "retained":
        return local_retained(node, after, limit, str(args.get("filter", "#")))
    raise ValueError(f"unknown question {what!r}")


# --------------------------------------------------------------------------- merging


def _merge_sessions(items: list[Item]) -> list[Item]:
    by: dict[str, Item] = {}
    for i in items:
        seen = by.get(i["client_id"])
        if seen is None:
            by[i["client_id"]] = dict(i)
            continue
        seen["held_by"] = sorted(set(seen["held_by"]) | set(i["held_by"]))
        if i["connected_here"] and not seen["connected_here"]:
            for k in ("subscriptions", "queued", "inflight", "clean_session"):
                seen[k] = i[k]  # the copy its client is connected to is the one in use
        seen["connected_here"] = seen["connected_here"] or i["connected_here"]
    return list(by.values())


def _merge_retained(items: list[Item]) -> list[Item]:
    by: dict[str, Item] = {}
    for i in items:
        seen = by.get(i["topic"])
        if seen is None or i["version"] > seen["version"]:
            by[i["topic"]] = i  # the newest version wins, as between the owners
    return list(by.values())


def _first(items: list[Item]) -> list[Item]:
    by: dict[str, Item] = {}
    for i in items:
        by.setdefault(i["client_id"], i)
    return list(by.values())


def _by_sub(items: list[Item]) -> list[Item]:
    by: dict[str, Item] = {}
    for i in items:
        by.setdefault(_sub_key(i), i)
    return list(by.values())


# what: (the key of an item, how answers from several nodes fold into one list)
MERGES: dict[str, tuple[Callable[[Item], str], Callable[[list[Item]], list[Item]]]] = {
    "clients": (lambda i: i["client_id"], _first),
    "sessions": (lambda i: i["client_id"], _merge_sessions),
    "subscriptions": (_sub_key, _by_sub),
    "retained": (lambda i: i["topic"], _merge_retained),
}


def encode_cursor(key: str) -> str:
    return base64.urlsafe_b64encode(key.encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> str:
    """The key a page's ``next`` cursor stands for; ValueError if it is none."""
    try:
        return base64.b64decode(cursor + "=" * (-len(cursor) % 4), altchars=b"-_", validate=True).decode()
    except (ValueError, UnicodeDecodeError):
        raise ValueError("not a cursor this API gave") from None


# --------------------------------------------------------------------------- the mesh


class Inquiries:
    """Questions to every node of the mesh this node can route to, and their answers."""

    def __init__(self, node: Node, timeout: float):
        self.node = node
        self.timeout = timeout
        self._ids = itertools.count(1)
        self._waiting: dict[int, tuple[asyncio.Future, dict[str, Any], set[str]]] = {}

    def _gateway(self) -> Any:
        mesh = self.node.mesh
        return None if mesh is None else mesh.gateway

    def _reachable(self) -> list[str]:
        gateway = self._gateway()
        mesh = self.node.mesh
        if gateway is None or mesh is None or mesh.engine is None:
            return []
        return [n for n in mesh.engine.routers if n != self.node.node_id and gateway.reachable(n)]

    async def ask_all(self, what: str, args: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
        """Every reachable node's answer (this one's included), and the nodes that did not
        answer in time."""
        node = self.node
        answers: dict[str, Any] = {node.node_id: answer_locally(node, what, args)}
        others = self._reachable()
        if not others:
            return answers, []
        q = next(self._ids)
        future: asyncio.Future = node.loop.create_future()
        got: dict[str, Any] = {}
        self._waiting[q] = (future, got, set(others))
        body = json.dumps({"q": q, "what": what, "args": args}).encode()
        gateway = self._gateway()
        for dest in others:
            gateway.unicast(dest, ASK, body)
        try:
            await asyncio.wait_for(asyncio.shield(future), self.timeout)
        except TimeoutError:
            pass
        finally:
            self._waiting.pop(q, None)
        answers.update(got)
        return answers, sorted(set(others) - set(got))

    async def page(self, what: str, args: dict[str, Any]) -> dict[str, Any]:
        """A page of a listing over the whole mesh: ``items``, ``next`` (a cursor, or None
        on the last page) and ``missing`` (nodes that did not answer)."""
        answers, missing = await self.ask_all(what, args)
        key, merge = MERGES[what]
        items: list[Item] = []
        for answer in answers.values():
            if isinstance(answer, list):
                items += answer
        merged = sorted(merge(items), key=key)
        limit = max(1, min(MAX_LIMIT, int(args.get("limit", 100))))
        page = merged[:limit]
        for i in page:
            i.pop("version", None)
        more = len(merged) > limit or any(isinstance(a, list) and len(a) >= limit for a in answers.values())
        return {
            "items": page,
            "next": encode_cursor(key(page[-1])) if page and more else None,
            "missing": missing,
        }

    # -- the unicasts ----------------------------------------------------------------------

    def receive(self, frm: str, kind: str, payload: bytes) -> None:
        """An ``ops.*`` unicast from node ``frm``."""
        try:
            body = json.loads(payload)
            q = int(body["q"])
        except (ValueError, KeyError, TypeError) as exc:
            log.warning("node %s sent an invalid %s: %r", frm, kind, exc)
            return
        if kind == ASK:
            try:
                reply: dict[str, Any] = {"q": q, "answer": answer_locally(self.node, str(body["what"]), body["args"])}
            except (ValueError, KeyError, TypeError) as exc:
                reply = {"q": q, "error": str(exc)}
            gateway = self._gateway()
            if gateway is not None:
                gateway.unicast(frm, ANSWER, json.dumps(reply).encode())
        elif kind == ANSWER:
            waiting = self._waiting.get(q)
            if waiting is None:
                return  # (too late)
            future, got, expected = waiting
            if frm in expected:
                got[frm] = body.get("answer")
                if len(got) == len(expected) and not future.done():
                    future.set_result(None)
        else:
            log.warning("node %s sent an unknown kind %s", frm, kind)


__all__ = ["Inquiries", "answer_locally", "encode_cursor", "decode_cursor", "MAX_LIMIT"]
