"""The links the nodes lost on their own (issue 24): windows read from the nodes' logs.

Pure: lines in, windows out. A node logs ``link to P down: REASON`` when a peer link ends and
``link to P up`` when one is up again (mesh/link/links.py). Beside the faults the nemesis
injects, a link also ends when its peer stays silent past the keepalive: a node starved of CPU
(seven nodes on two cores) or one a fault paused. An origin that loses its route to the node
it chose for a group's message sends it again elsewhere after ``mesh.shared_reroute``: the
shared checker (sharecheck.py) takes each window as a ``link lost`` fault of the link, after
the injected ones, so a re-send that only such a loss explains is counted as that, not as a
finding.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from datetime import datetime
from typing import Any

__all__ = ["link_losses"]

_LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) \S+ \S+: link to (\S+) (down|up)\b:? ?(.*)$")


def link_losses(logs: dict[str, Iterable[str]], wall0: float, end: float) -> list[dict[str, Any]]:
    """Each (node, peer) link's time down, on the history's clock (``wall0``: the wall-clock
    time of its 0; a node's log times are its local wall clock, as ``logging`` writes them): a
    window from a ``down`` line to the next ``up`` of that peer on that node, or ``end``."""
    out: list[dict[str, Any]] = []
    for node, lines in sorted(logs.items()):
        down: dict[str, tuple[float, str]] = {}
        for line in lines:
            m = _LINE.match(line)
            if m is None:
                continue
            at = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp() - wall0
            peer, what = m.group(2), m.group(3)
            if what == "down":
                down.setdefault(peer, (at, m.group(4)))
            elif peer in down:
                start, reason = down.pop(peer)
                out.append(_window(node, peer, start, at, reason))
        out += [_window(node, peer, start, end, reason) for peer, (start, reason) in sorted(down.items())]
    return sorted(out, key=lambda w: (w["start"], w["link"]))


def _window(node: str, peer: str, start: float, end: float, reason: str) -> dict[str, Any]:
    return {
        "kind": "link lost",
        "link": [node, peer],
        "start": start,
        "end": end,
        "reason": reason,
        "what": f"link {node}-{peer} lost ({reason})",
    }
