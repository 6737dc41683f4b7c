"""The routes of the operator's HTTP listener: the console, /metrics, the JSON admin API.

The I/O layer (http.py parses the requests, this module answers them). Every route is a
row of ``ROUTES``: method, path pattern, whether it changes anything (then it needs the
admin token, not the read token), its handler and its OpenAPI description, from which
``/api/v1/openapi.json`` is written, so the document cannot drift from the routes.

Mesh-wide listings (clients, sessions, subscriptions, retained messages) ask every node
the mesh routes to (ops.py) and are paged by cursor: ``?limit=N`` (1..1000, default 100)
and ``?after=CURSOR`` from the previous page's ``next``; ``missing`` names the nodes that did
not answer within ``http.mesh_timeout``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from importlib import resources
from typing import Any
from urllib.parse import unquote

from .. import __version__
from ..auth import ConfigError
from ..mesh.routing.spf import shortest_paths
from .metrics import render
from .ops import MAX_LIMIT, decode_cursor

# the server/node.py Node, typed loosely: node.py imports this module (no circle)
Node = Any

PROMETHEUS = "text/plain; version=0.0.4; charset=utf-8"
JSON = "application/json"


@dataclass
class Reply:
    status: int
    content_type: str
    body: bytes
    headers: list[tuple[str, str]] | None = None


def _json(status: int, value: Any) -> Reply:
    return Reply(status, JSON, json.dumps(value, sort_keys=True).encode() + b"\n")


def _error(status: int, why: str) -> Reply:
    return _json(status, {"error": why})


class BadRequest(Exception):
    pass


Handler = Callable[[Node, dict[str, str], dict[str, str]], Awaitable[Reply]]


@dataclass
class Route:
    method: str
    pattern: str  # the path, with {name} for a path parameter
    changes: bool  # needs the admin token
    handler: Handler
    summary: str
    params: tuple[str, ...] = ()  # query parameters (described in PARAMS)
    public: bool = False  # served without a token (the console's own files: no data in them)

    def __post_init__(self) -> None:
        self.regex = re.compile("^" + re.sub(r"\{(\w+)\}", r"(?P<\1>[^/]+)", self.pattern) + "$")


# --------------------------------------------------------------------------- handlers


def _page_args(query: dict[str, str]) -> dict[str, Any]:
    try:
        limit = int(query.get("limit", "100"))
    except ValueError:
        raise BadRequest("limit: not a number") from None
    if not 1 <= limit <= MAX_LIMIT:
        raise BadRequest(f"limit: from 1 to {MAX_LIMIT}")
    after = query.get("after", "")
    try:
        key = decode_cursor(after) if after else ""
    except ValueError as exc:
        raise BadRequest(f"after: {exc}") from None
    return {"limit": limit, "after": key}


async def _console(node: Node, path: dict[str, str], query: dict[str, str]) -> Reply:
    return Reply(200, "text/html; charset=utf-8", _asset("index.html"))


async def _console_js(node: Node, path: dict[str, str], query: dict[str, str]) -> Reply:
    return Reply(200, "text/javascript; charset=utf-8", _asset("console.js"))


def _asset(name: str) -> bytes:
    return resources.files(__package__).joinpath("console", name).read_bytes()


async def _metrics(node: Node, path: dict[str, str], query: dict[str, str]) -> Reply:
    return Reply(200, PROMETHEUS, render(node).encode())


async def _healthz(node: Node, path: dict[str, str], query: dict[str, str]) -> Reply:
    return Reply(200, "text/plain", b"ok\n")


async def _status(node: Node, path: dict[str, str], query: dict[str, str]) -> Reply:
    return _json(200, node.http_status())


def _graph(node: Node) -> dict[str, dict[str, int]]:
    """Every node's advertised links (peer -> cost), as this node's routing engine has them."""
    if node.mesh is None or node.mesh.engine is None:
        return {node.node_id: {}}
    return {n: dict(r.links) for n, r in node.mesh.engine.routers.items()}


async def _nodes(node: Node, path: dict[str, str], query: dict[str, str]) -> Reply:
    graph = _graph(node)
    _, distance, _ = shortest_paths(node.node_id, graph)
    answers, missing = await node.inquiries.ask_all("stats", {})
    items = []
    for n in sorted(graph):
        links = [
            {"peer": peer, "cost": cost, "up": n in graph.get(peer, {}) and n in distance and peer in distance}
            for peer, cost in sorted(graph[n].items())
        ]
        items.append(
            {
                "id": n,
                "self": n == node.node_id,
                "status": "up" if n in distance else "down",
                "distance": distance.get(n),
                "links": links,
                "stats": answers.get(n),
            }
        )
    return _json(200, {"node": node.node_id, "nodes": items, "missing": missing})


async def _routes(node: Node, path: dict[str, str], query: dict[str, str]) -> Reply:
    graph = _graph(node)
    root = query.get("from", node.node_id)
    if root not in graph:
        return _error(404, f"no node {root!r} in the mesh this node knows")
    next_hop, distance, parent = shortest_paths(root, graph)
    return _json(
        200,
        {
            "from": root,
            "parent": parent,
            "distance": distance,
            "next_hop": next_hop,
            "unreachable": sorted(set(graph) - set(distance)),
        },
    )


def _listing(what: str) -> Handler:
    async def handler(node: Node, path: dict[str, str], query: dict[str, str]) -> Reply:
        args = _page_args(query)
        if what == "retained":
            args["filter"] = query.get("filter", "#")
        return _json(200, await node.inquiries.page(what, args))

    return handler


async def _client(node: Node, path: dict[str, str], query: dict[str, str]) -> Reply:
    cid = path["client_id"]
    answers, missing = await node.inquiries.ask_all("clients", {"client_id": cid, "limit": 1})
    for found in answers.values():
        if found:
            return _json(200, found[0])
    return _json(404, {"error": f"client {cid!r} is not connected to any node that answered", "missing": missing})


async def _kick(node: Node, path: dict[str, str], query: dict[str, str]) -> Reply:
    cid = path["client_id"]
    answers, missing = await node.inquiries.ask_all("kick", {"client_id": cid})
    kicked = sorted(n for n, done in answers.items() if done is True)
    if kicked:
        return _json(200, {"client_id": cid, "disconnected_on": kicked})
    return _json(404, {"error": f"client {cid!r} is not connected to any node that answered", "missing": missing})


async def _reload(node: Node, path: dict[str, str], query: dict[str, str]) -> Reply:
    if node.reread is None:
        return _error(503, "this node was not started from the command line: nothing to re-read")
    try:
        kept = node.reread()
    except ConfigError as exc:
        return _error(422, f"{exc}; the configuration in force is kept")
    return _json(200, {"reloaded": True, "kept_after_error": kept})


async def _openapi(node: Node, path: dict[str, str], query: dict[str, str]) -> Reply:
    return _json(200, openapi())


ROUTES: list[Route] = [
    Route("GET", "/", False, _console, "the web console (HTML)", public=True),
    Route("GET", "/console.js", False, _console_js, "the console's script", public=True),
    Route("GET", "/metrics", False, _metrics, "metrics in the Prometheus text format"),
    Route("GET", "/healthz", False, _healthz, "200 while the node serves", public=True),
    Route("GET", "/api/v1/status", False, _status, "this node's counters and the mesh as it sees it"),
    Route("GET", "/api/v1/nodes", False, _nodes, "every node of the mesh: status, links and costs, message counts"),
    Route("GET", "/api/v1/routes", False, _routes, "the shortest-path tree a message from a node follows", ("from",)),
    Route(
        "GET",
        "/api/v1/clients",
        False,
        _listing("clients"),
        "clients connected anywhere in the mesh",
        ("limit", "after"),
    ),
    Route("GET", "/api/v1/clients/{client_id}", False, _client, "one client, wherever it is connected"),
    Route("DELETE", "/api/v1/clients/{client_id}", True, _kick, "disconnect a client wherever it is connected"),
    Route(
        "GET",
        "/api/v1/sessions",
        False,
        _listing("sessions"),
        "sessions held in the mesh, with the nodes holding them",
        ("limit", "after"),
    ),
    Route(
        "GET",
        "/api/v1/subscriptions",
        False,
        _listing("subscriptions"),
        "subscriptions of every session",
        ("limit", "after"),
    ),
    Route(
        "GET",
        "/api/v1/retained",
        False,
        _listing("retained"),
        "retained messages (newest version of each topic)",
        ("limit", "after", "filter"),
    ),
    Route("POST", "/api/v1/reload", True, _reload, "re-read the configuration, passwords, ACL, TLS files (as SIGHUP)"),
    Route("GET", "/api/v1/openapi.json", False, _openapi, "this document"),
]

PARAMS = {
    "limit": ("integer", f"items per page, 1 to {MAX_LIMIT} (default 100)"),
    "after": ("string", "the `next` cursor of the previous page"),
    "filter": ("string", "a topic filter the retained topics must match (default #)"),
    "from": ("string", "the node the tree starts at (default: this node)"),
}


def openapi() -> dict[str, Any]:
    """The OpenAPI 3.0 document of ``ROUTES``."""
    paths: dict[str, Any] = {}
    for r in ROUTES:
        if not r.pattern.startswith("/api/"):
            continue
        op: dict[str, Any] = {
            "summary": r.summary,
            "security": [{"bearer": []}],
            "responses": {
                "200": {"description": "OK", "content": {JSON: {"schema": {"type": "object"}}}},
                "401": {"description": "no bearer token"},
                "403": {"description": "a wrong token, or the read token on a route that changes something"},
            },
        }
        params = [
            {"name": p, "in": "query", "required": False, "description": PARAMS[p][1], "schema": {"type": PARAMS[p][0]}}
            for p in r.params
        ]
        params += [
            {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
            for name in re.findall(r"\{(\w+)\}", r.pattern)
        ]
        if params:
            op["parameters"] = params
        if "{" in r.pattern:
            op["responses"]["404"] = {"description": "not found on any node that answered"}
        if r.params[:2] == ("limit", "after"):
            op["responses"]["400"] = {"description": "a bad limit or cursor"}
        paths.setdefault(r.pattern, {})[r.method.lower()] = op
    return {
        "openapi": "3.0.3",
        "info": {"title": "mqttmesh admin API", "version": __version__},
        "components": {"securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
        "paths": paths,
    }


async def answer(node: Node, method: str, target: str, role: str | None) -> Reply:
    """The reply to a request. ``role``: "admin", "read", or None (no valid token, when
    one is needed: only public routes are served)."""
    raw_path, _, raw_query = target.partition("?")
    query: dict[str, str] = {}
    for part in raw_query.split("&") if raw_query else ():
        k, _, v = part.partition("=")
        query[unquote(k.replace("+", " "))] = unquote(v.replace("+", " "))
    allowed = []
    for r in ROUTES:
        m = r.regex.match(raw_path)  # (a path parameter is unquoted once matched: it may hold %2F)
        if m is None:
            continue
        allowed.append(r.method)
        if r.method != method and not (method == "HEAD" and r.method == "GET"):
            continue
        if not r.public:
            if role is None:
                return Reply(401, "text/plain", b"Unauthorized\n", [("WWW-Authenticate", "Bearer")])
            if r.changes and role != "admin":
                return _error(403, "this token may only read")
        params = {k: unquote(v) for k, v in m.groupdict().items()}
        try:
            return await r.handler(node, params, query)
        except BadRequest as exc:
            return _error(400, str(exc))
    if allowed:
        return Reply(405, "text/plain", b"method not allowed\n", [("Allow", ", ".join(sorted(set(allowed))))])
    return Reply(404, "text/plain", b"not found\n")


__all__ = ["answer", "openapi", "ROUTES", "Reply"]
