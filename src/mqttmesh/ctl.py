"""`mqttmesh ctl`: the admin API (server/api.py) on the command line.

    mqttmesh ctl [--url http://127.0.0.1:8080] [--token T | --token-file F] [--json] COMMAND
      status          the node's view of the mesh: every node, its status and links
      clients         every client connected anywhere in the mesh (all pages)
      kick CLIENT_ID  disconnect a client wherever it is connected
      reload          re-read the configuration and the files it names (as SIGHUP)

Exit status: 0, 1 when the node answered with an error (the message on stderr), 2 when it
could not be reached.
"""

from __future__ import annotations

import json
import sys
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, TextIO

__all__ = ["CtlError", "Ctl", "run"]


class CtlError(Exception):
    def __init__(self, message: str, code: int = 1):
        super().__init__(message)
        self.code = code


class Ctl:
    def __init__(self, url: str, token: str | None = None, timeout: float = 10.0):
        self.url = url.rstrip("/")
        self.token = token
        self.timeout = timeout

    def call(self, method: str, path: str) -> Any:
        request = urllib.request.Request(self.url + path, method=method)
        if self.token:
            request.add_header("Authorization", f"Bearer {self.token}")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as r:
                return json.loads(r.read() or b"null")
        except urllib.error.HTTPError as exc:
            body = exc.read()
            try:
                why = json.loads(body).get("error") or body.decode(errors="replace").strip()
            except (ValueError, AttributeError):
                why = body.decode(errors="replace").strip()
            raise CtlError(f"{method} {path}: {exc.code} {exc.reason}: {why}") from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise CtlError(f"cannot reach {self.url}: {reason}", 2) from None

    def clients(self, most: int = 100_000) -> list[dict[str, Any]]:
        """Every client of the mesh, following the pages."""
        items: list[dict[str, Any]] = []
        after = ""
        while len(items) < most:
            query = {"limit": "1000"} | ({"after": after} if after else {})
            page = self.call("GET", "/api/v1/clients?" + urllib.parse.urlencode(query))
            items += page["items"]
            if page.get("missing"):
                print(f"warning: no answer from {', '.join(page['missing'])}", file=sys.stderr)
            after = page.get("next")
            if not after:
                break
        return items


def _table(rows: list[list[str]], out: TextIO) -> None:
    if not rows:
        return
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip(), file=out)


def run(ctl: Ctl, command: str, argument: str | None, as_json: bool, out: TextIO = sys.stdout) -> int:
    if command == "status":
        doc = ctl.call("GET", "/api/v1/nodes")
        if as_json:
            print(json.dumps(doc, indent=2, sort_keys=True), file=out)
            return 0
        rows = [["NODE", "STATUS", "DISTANCE", "CLIENTS", "LINKS (peer:cost, * = down)"]]
        for n in doc["nodes"]:
            links = " ".join(f"{lk['peer']}:{lk['cost']}{'' if lk['up'] else '*'}" for lk in n["links"])
            stats = n.get("stats") or {}
            rows.append(
                [
                    n["id"] + (" (this)" if n["self"] else ""),
                    n["status"],
                    "-" if n["distance"] is None else str(n["distance"]),
                    str(stats.get("clients_connected", "-")),
                    links,
                ]
            )
        _table(rows, out)
        if doc.get("missing"):
            print(f"no answer from: {', '.join(doc['missing'])}", file=out)
        return 0
    if command == "clients":
        items = ctl.clients()
        if as_json:
            print(json.dumps(items, indent=2, sort_keys=True), file=out)
            return 0
        rows = [["CLIENT_ID", "NODE", "ADDRESS", "TRANSPORT", "SUBSCRIPTIONS"]]
        rows += [[c["client_id"], c["node"], c["address"], c["transport"], str(c["subscriptions"])] for c in items]
        _table(rows, out)
        return 0
    if command == "kick":
        if not argument:
            raise CtlError("kick: which ClientId?", 2)
        doc = ctl.call("DELETE", "/api/v1/clients/" + urllib.parse.quote(argument, safe=""))
        print(
            json.dumps(doc) if as_json else f"{argument}: disconnected on {', '.join(doc['disconnected_on'])}", file=out
        )
        return 0
    if command == "reload":
        doc = ctl.call("POST", "/api/v1/reload")
        kept = doc.get("kept_after_error") or []
        if as_json:
            print(json.dumps(doc), file=out)
        else:
            print("reloaded" + (f"; kept after an error: {', '.join(kept)}" if kept else ""), file=out)
        return 1 if kept else 0
    raise CtlError(f"unknown command {command!r}", 2)
