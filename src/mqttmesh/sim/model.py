"""The simulated network's parts: nodes, links, and the decoding the engines of a run share.

Pure data, no behaviour of the mesh: the routing is the engines' (mesh/routing/engine.py).
"""

from __future__ import annotations

import json
from collections import OrderedDict
from typing import Any

from ..mesh.routing.engine import MeshEngine
from ..mesh.routing.lsdb import InterestState

__all__ = ["SharedDecoding", "Node", "Link", "SimulatorPart"]

# The base of the Simulator's mixins (clients, convergence, faults, verify): object at run
# time. What a mixin reads from ``self`` lives on the Simulator (core.py); until the simulator
# has a typed state (issue 14, S8), a type checker takes those attributes as Any.
SimulatorPart: Any = object

# the simulator's event kinds (the third field of a heap entry)
(ARRIVE, FLUSH, TICK, PING, DIAL, DETECT, FAULT, PUBLISH, CHURN, CHECK, MSGCHECK, START, DRAIN, TALLY, END) = range(15)
# mode = "cluster" (sim/sessions.py): bytes to a node, bytes to a client, a journal commit, a
# client's next action, the single-registration check, a dialled peer link's handshake done
(TO_NODE, TO_CLIENT, COMMIT, CLIENT, CCHECK, LINK_READY) = range(15, 21)
# a stall fault (sim/stall.py): the stalled node's loop runs again; a peer gave up on its silence
(STALL_END, SILENT) = range(21, 23)


class SharedDecoding:
    """The ``json`` the engines of one simulation use: a payload decoded once for all its receivers.

    A node floods the same advertisements to several neighbours, so the same bytes arrive at
    several engines, and the same decoded advertisement is then flooded on by each of them;
    in one process both need doing once. This is safe because the engine only reads what it
    decodes and passes the same objects on to be encoded, unchanged: the simulator checks this
    with checks.shared_decoding = false giving the very same run (tests/sim). Results are
    exactly those of the json module.
    """

    def __init__(self, size: int = 16384, max_bytes: int = 64 << 20):
        self._decoded: OrderedDict[bytes, object] = OrderedDict()
        self._decoded_bytes = 0
        self.max_bytes = max_bytes  # payloads of a database push are large
        self._encoded: OrderedDict[int, tuple] = OrderedDict()  # id(obj) -> (obj, text)
        self.size = size
        self.hits = 0
        self.misses = 0

    def loads(self, payload):
        cache = self._decoded
        hit = cache.get(payload)
        if hit is not None:
            self.hits += 1
            return hit
        self.misses += 1
        value = json.loads(payload)
        while cache and (len(cache) >= self.size or self._decoded_bytes > self.max_bytes):
            old, _ = cache.popitem(last=False)  # the oldest: copies of a flush arrive within ms
            self._decoded_bytes -= len(old)
        cache[payload] = value
        self._decoded_bytes += len(payload)
        return value

    def dumps(self, obj):
        if type(obj) is not dict:
            return json.dumps(obj)
        cache = self._encoded
        hit = cache.get(id(obj))
        if hit is not None and hit[0] is obj:  # held in the cache, so its id cannot be reused
            return hit[1]
        text = json.dumps(obj)
        if len(cache) >= self.size:
            cache.popitem(last=False)
        cache[id(obj)] = (obj, text)
        return text


class Node:
    __slots__ = (
        "name",
        "up",
        "inc",
        "engine",
        "filters",
        "gen",
        "count",
        "flush_due",
        "flush_at",
        "depth_out",
        "seen_inc",
        "seen_seq",
        "seen_links",
        "seen_interest",
        "seen_seq_i",
        "links",
        "restarted_at",
        "down_since",
        "busy_until",
        "inbox",
        "drain_due",
        "core",
        "store",
        "conns",
        "commit_due",
        "plinks",
        "stalled_until",
        "held",
    )

    def __init__(self, name: str):
        self.name = name
        self.up = False
        self.inc = 0
        self.engine: MeshEngine | None = None
        self.filters: list[str] = []
        self.gen = 0  # bumps at every start: events of an earlier life are ignored
        self.count = 0  # messages published in this life
        self.flush_due = False
        self.flush_at = 0.0  # (when the FLUSH due comes)
        self.depth_out = 0  # advertisement round to stamp on what the next flush sends
        self.seen_inc = self.seen_seq = -1
        self.seen_links: dict | None = None
        self.links: list[Link] = []
        self.restarted_at = -1.0
        self.down_since = -1.0
        self.seen_interest: InterestState | None = None
        self.seen_seq_i = -1
        self.busy_until = 0.0  # simulated CPU: the node handles nothing else before then
        self.inbox: list = []  # what arrived while it was busy, in order
        self.drain_due = False
        # mode = "cluster": the whole node (sim/cluster.py), its disk, its client connections
        self.core: Any = None
        self.store: Any = None
        self.conns: dict[str, Any] = {}
        self.commit_due = False
        self.plinks: dict[str, Any] = {}  # peer -> this side's sim/cluster.py SimLink of the current connection
        # a stall fault (sim/stall.py): the node's event loop runs nothing before then; the
        # events it would have handled wait here, in order
        self.stalled_until = 0.0
        self.held: list[tuple[Any, ...]] = []


class Link:
    __slots__ = (
        "a",
        "b",
        "latency",
        "admin",
        "conn",
        "alive",
        "side",
        "dial_due",
        "arrive",
        "free",
        "established_at",
        "broken_at",
    )

    def __init__(self, a: str, b: str, latency: float):
        self.a, self.b, self.latency = a, b, latency  # a < b: a dials
        self.admin = True  # false while a link_down fault holds it
        self.conn = 0  # connection number: what travelled on an older one is gone
        self.alive = False  # a connection exists (handshaking or established)
        self.side = {a: False, b: False}  # that side's engine has the link up
        self.dial_due = False
        self.arrive = [0.0, 0.0]  # FIFO: last arrival time per direction (a->b, b->a)
        self.free = [0.0, 0.0]  # serialisation: the direction is busy until then
        self.established_at = -1.0
        self.broken_at = -1.0

    def peer(self, n: str) -> str:
        return self.b if n == self.a else self.a
