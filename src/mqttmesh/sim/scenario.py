"""Scenario files: what to simulate, read from TOML and checked before anything runs.

Pure. A scenario names a topology, a network model (latency, loss), a workload
(subscriptions, publications), the node model (keepalive, tick, batching), the
engine settings and a fault schedule. Every unknown key and every wrong type is
an error that names the key, so a typo never silently falls back to a default.
See scenarios/README.md for the full list with defaults.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, TypeVar

from ..mesh.routing.engine import MeshSettings

__all__ = [
    "ScenarioError",
    "Scenario",
    "Topology",
    "NodeModel",
    "Workload",
    "Checks",
    "Fault",
    "Clients",
    "load_scenario",
    "parse_scenario",
    "FAULT_KINDS",
]


class ScenarioError(ValueError):
    """A scenario that cannot run; the message names the offending key."""


@dataclass
class Topology:
    kind: str = "random"  # full ring line star random rgg ba sites
    nodes: int = 10
    degree: float = 4.0  # random, rgg: target average degree
    m: int = 2  # ba: links of each new node
    sites: int = 4  # sites: number of sites
    site_kind: str = "full"  # sites: topology inside a site (full ring random rgg ba)
    long_links: int = 2  # sites: links between two neighbouring sites
    latency_ms: tuple[float, float] = (1.0, 1.0)  # one way, per link, drawn uniformly
    long_latency_ms: tuple[float, float] = (30.0, 80.0)  # sites: links between sites
    loss: float = 0.0  # probability that one transmission is lost
    retransmit_ms: float = 200.0  # a lost QoS 1 transmission arrives again after this
    bandwidth_mbps: float = 0.0  # 0: unlimited (no serialisation delay)


@dataclass
class NodeModel:
    keepalive: float = 1.0  # PINGREQ interval on a link (RTT sample); dead after 3x
    tick: float = 0.25  # engine.tick period, as server/mesh_node.py
    flush_delay_ms: float = 0.2  # one event-loop iteration: events within it share a flush
    # mesh.batch_delay: what may wait (acknowledgements, a lone routed message, answers nobody
    # waits for) goes within this, with whatever goes sooner (MeshIO.flush_later)
    batch_delay_ms: float = 5.0
    redial_max: float = 2.0  # a dialler retries with backoff up to this (mesh_node Dialler)
    handshake_rtts: int = 3  # TCP + CONNECT/CONNACK + SUBSCRIBE/SUBACK before hello
    start_spread: float = 0.1  # nodes start at random times in [0, this)
    rtt_jitter: float = 0.0  # RTT samples vary by up to this fraction
    # simulated CPU: a node handles one message at a time and flushes when idle, as the
    # asyncio loop does, so a busy node batches more (0 and 0: infinitely fast nodes)
    cpu_us_per_message: float = 20.0
    cpu_us_per_kb: float = 10.0


@dataclass
class Workload:
    levels: list[int] = field(default_factory=lambda: [10, 20, 50])  # values per topic level
    zipf: float = 1.0  # popularity skew of level values (0 = uniform)
    filters_per_node: int = 5
    distinct_filters: int = 0  # > 0: add filters until the mesh has this many distinct ones
    plus: float = 0.2  # probability that a filter has a '+' level
    hash: float = 0.2  # probability that a filter ends with '#'
    cross_site: float = 0.1  # probability that a filter watches every site ('+' site)
    site_skew: float = 0.0  # zipf exponent over the watched site (0 = uniform)
    publish_rate: float = 1.0  # messages per second per publishing node (Poisson)
    publishers: float = 1.0  # fraction of nodes with publishers
    qos: list[float] = field(default_factory=lambda: [0.5, 0.5, 0.0])  # share of QoS 0, 1, 2
    payload_bytes: int = 32
    start: float = 5.0  # publishing (and churn) starts
    churn: float = 0.0  # subscription changes per node per second
    resubscribe: bool = True  # a restarted node gets its subscriptions back (sessions)
    # "start": each node has its subscriptions when it starts (restored persistent sessions);
    # "converged": clients subscribe once the mesh has formed (see docs/simulation.md, finding 1)
    subscribe: str = "start"


@dataclass
class Checks:
    resolution: float = 0.01  # convergence is checked this often while unconverged
    settle: float = 0.0  # a message's delivery window; 0: from the topology
    routes: int = 0  # nodes whose routes are checked at each convergence; 0: all
    fail: bool = True  # a violated invariant fails the run
    max_convergence: float = 30.0  # still converging this long after a disturbance: a violation
    attribute: bool = True  # parse advertisements to attribute control traffic to faults
    shared_decoding: bool = True  # decode a payload once for all the engines it reaches (core.py)


@dataclass
class Clients:
    """mode = "cluster": MQTT clients of the whole nodes (sim/sessions.py, docs/simulation.md)."""

    persistent: int = 10  # CleanSession=0 subscribers, each with a will, moving between nodes
    publishers: int = 4  # publishers, CleanSession=1 unless publisher_persistent makes them 0
    publish_rate: float = 2.0  # messages per second per publisher (Poisson)
    qos: list[float] = field(default_factory=lambda: [0.0, 0.5, 0.5])  # shares of QoS 0, 1, 2 published
    shared: float = 0.2  # share of publications to the topic every subscriber has ("all"); else c/<one of them>
    start: float = 2.0  # clients connect from this time on (over one second)
    move_every: tuple[float, float] = (2.0, 5.0)  # seconds between two moves of a subscriber; 0: no moves
    move_how: list[float] = field(default_factory=lambda: [1.0, 1.0, 1.0])  # shares: clean, abrupt, takeover
    targets: str = "any"  # where a move goes: "any" node, or "far": across the partition when there is one
    reconnect_delay: tuple[float, float] = (0.05, 0.3)  # after a drop or a clean disconnect
    keepalive: int = 3  # seconds (MQTT keepalive; the server closes a silent connection after 1.5x)
    latency_ms: tuple[float, float] = (1.0, 1.0)  # client to node, one way
    commit_ms: float = 2.0  # a journal batch becomes durable this long after its first change
    settle: float = 2.0  # hand-over check: a message counts from this long after the SUBACK
    check_every: float = 0.5  # the single-registration check runs this often
    double_grace: float = 1.0  # two live connections of one ClientId seen for longer: a violation
    replication: int = 3  # ClusterSettings (mesh.replication)
    register_interval: float = 5.0
    claim_timeout: float = 1.0
    gather_timeout: float = 2.0
    will_delay: float = 0.5  # (ClusterSettings: a node unreachable this long has lost its clients)
    redirect_grace: float = 10.0
    # MQTT 5 (issue 23; docs/simulation.md, "MQTT 5 clients"): the share of the clients that
    # speak it, each chosen from its own stream; 0: every client speaks 3.1.1
    mqtt5: float = 0.0
    session_expiry: list[float] = field(
        default_factory=lambda: [5.0, 600.0]
    )  # an MQTT 5 subscriber's interval: one of these
    clean_start: float = 0.0  # share of the MQTT 5 subscribers that connect with Clean Start 1 (and an interval)
    will_delay_interval: list[float] = field(default_factory=lambda: [0.0, 3.0])  # per connection: one of these
    expiring: float = 0.5  # share of an MQTT 5 publisher's messages with a Message Expiry Interval
    message_expiry: list[float] = field(default_factory=lambda: [2.0, 600.0])  # its interval: one of these
    away: tuple[float, float] = (2.0, 12.0)  # an "away" move (move_how's 4th share): seconds without a connection
    # shared subscriptions (issue 24; docs/simulation.md, "Shared groups"): ``groups`` groups
    # "$share/g<k>/sh/#" of ``members`` CleanSession=1 members each, on ``member_nodes``
    # nodes per group (0: any node); a member leaves every ``member_churn`` seconds (0: never)
    # by one of ``member_leave`` (shares: UNSUBSCRIBE, DISCONNECT, a dropped connection, a
    # move to another node) and comes back ``member_away`` seconds later; ``to_groups`` of the
    # publications go to "sh/<publisher>/<n mod 4>". The strategy is engine.shared_strategy.
    # ``member_persistent`` of the members (each drawn from its own stream) connect with
    # CleanSession=0: their sessions stay members while their clients are away.
    groups: int = 0
    members: int = 4
    member_nodes: int = 0
    member_qos: list[float] = field(default_factory=lambda: [0.2, 0.4, 0.4])  # shares of QoS 0, 1, 2 asked
    member_churn: tuple[float, float] = (0.0, 0.0)
    member_leave: list[float] = field(default_factory=lambda: [1.0, 1.0, 1.0, 1.0])
    member_away: tuple[float, float] = (0.5, 3.0)
    to_groups: float = 0.5
    member_persistent: float = 0.0
    # persistent publishers (docs/simulation.md, "Persistent publishers"): the share of the
    # publishers (each drawn from its own stream ``{seed}/publisher/{name}``) that connect with
    # CleanSession=0 (MQTT 5: Clean Start 0 and the longest ``session_expiry``), move between
    # nodes as the subscribers do (``move_every``, ``move_how``) and, on each reconnection, send
    # again what was not acknowledged (PUBLISH with DUP=1) or completed (PUBREL) [MQTT-4.4.0-1]
    publisher_persistent: float = 0.0


FAULT_KINDS = {
    "link_down": {"link"},
    "link_up": {"link"},
    "crash": {"node", "how"},
    "restart": {"node", "resubscribe"},
    "partition": {"groups", "isolate", "isolate_site", "half", "grow"},
    "heal": set(),
    "latency": {"link", "latency_ms"},
    "subscribe": {"node", "filter"},
    "unsubscribe": {"node", "filter"},
    "stall": {"node", "seconds"},
}


@dataclass
class Fault:
    at: float
    kind: str
    params: dict = field(default_factory=dict)
    label: str = ""


@dataclass
class Scenario:
    name: str = "scenario"
    description: str = ""
    seed: int = 1
    duration: float = 30.0
    drain: float = 8.0  # publishing stops this long before the end
    topology: Topology = field(default_factory=Topology)
    node: NodeModel = field(default_factory=NodeModel)
    workload: Workload = field(default_factory=Workload)
    checks: Checks = field(default_factory=Checks)
    engine: dict = field(default_factory=dict)
    faults: list[Fault] = field(default_factory=list)
    source: str = ""
    mode: str = "engine"  # "engine": MeshEngines only; "cluster": whole nodes and MQTT clients
    clients: Clients = field(default_factory=Clients)

    def settings(self) -> MeshSettings:
        return MeshSettings(**self.engine)


_TOPOLOGY_KINDS = {"full", "ring", "line", "star", "random", "rgg", "ba", "sites"}


def _typed(section: str, key: str, value, default):
    where = f"{section}.{key}" if section else key
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise ScenarioError(f"{where}: expected true or false, got {value!r}")
        return value
    if isinstance(default, tuple):  # a number, or [min, max]
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            value = [value, value]
        if (
            not isinstance(value, list)
            or len(value) != 2
            or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)
        ):
            raise ScenarioError(f"{where}: expected a number or [min, max], got {value!r}")
        lo, hi = float(value[0]), float(value[1])
        if lo < 0 or hi < lo:
            raise ScenarioError(f"{where}: expected 0 <= min <= max, got {value!r}")
        return (lo, hi)
    if isinstance(default, list):
        if not isinstance(value, list) or not all(isinstance(v, (int, float)) for v in value):
            raise ScenarioError(f"{where}: expected a list of numbers, got {value!r}")
        return list(value)
    if isinstance(default, float):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ScenarioError(f"{where}: expected a number, got {value!r}")
        if value < 0:
            raise ScenarioError(f"{where}: must not be negative, got {value!r}")
        return float(value)
    if isinstance(default, int):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ScenarioError(f"{where}: expected an integer, got {value!r}")
        if value < 0:
            raise ScenarioError(f"{where}: must not be negative, got {value!r}")
        return value
    if isinstance(default, str):
        if not isinstance(value, str):
            raise ScenarioError(f"{where}: expected a string, got {value!r}")
        return value
    raise ScenarioError(f"{where}: unsupported value {value!r}")


_T = TypeVar("_T")


def _section(cls: type[_T], section: str, raw: Any) -> _T:
    if raw is None:
        return cls()
    if not isinstance(raw, dict):
        raise ScenarioError(f"[{section}] must be a table")
    obj = cls()
    known = {f.name for f in fields(cls)}  # type: ignore[arg-type]  # (cls is a dataclass)
    for key, value in raw.items():
        if key not in known:
            raise ScenarioError(f"[{section}]: unknown key {key!r} (known: {', '.join(sorted(known))})")
        setattr(obj, key, _typed(section, key, value, getattr(obj, key)))
    return obj


def parse_scenario(raw: dict, source: str = "<scenario>") -> Scenario:
    """A checked Scenario from the parsed TOML document ``raw``."""
    top_known = {
        "name",
        "description",
        "seed",
        "duration",
        "drain",
        "topology",
        "node",
        "workload",
        "checks",
        "engine",
        "faults",
        "mode",
        "clients",
    }
    for key in raw:
        if key not in top_known:
            raise ScenarioError(f"{source}: unknown key {key!r} (known: {', '.join(sorted(top_known))})")
    sc = Scenario(source=source)
    for key in ("name", "description", "seed", "duration", "drain", "mode"):
        if key in raw:
            setattr(sc, key, _typed("", key, raw[key], getattr(sc, key)))
    sc.topology = _section(Topology, "topology", raw.get("topology"))
    sc.node = _section(NodeModel, "node", raw.get("node"))
    sc.workload = _section(Workload, "workload", raw.get("workload"))
    sc.checks = _section(Checks, "checks", raw.get("checks"))
    sc.clients = _section(Clients, "clients", raw.get("clients"))
    engine = raw.get("engine", {})
    if not isinstance(engine, dict):
        raise ScenarioError("[engine] must be a table")
    defaults = MeshSettings()
    for key, value in engine.items():
        if not hasattr(defaults, key):
            known = ", ".join(f.name for f in fields(MeshSettings))
            raise ScenarioError(f"[engine]: unknown key {key!r} (MeshSettings fields: {known})")
        default = getattr(defaults, key)
        sc.engine[key] = _typed("engine", key, value, float(default) if isinstance(default, float) else default)
    faults = raw.get("faults", [])
    if not isinstance(faults, list):
        raise ScenarioError("faults must be an array of tables ([[faults]])")
    for i, f in enumerate(faults):
        sc.faults.append(_fault(i, f))
    sc.faults.sort(key=lambda f: f.at)
    _validate(sc)
    return sc


def _fault(i: int, raw) -> Fault:
    where = f"faults[{i}]"
    if not isinstance(raw, dict):
        raise ScenarioError(f"{where}: must be a table")
    if "at" not in raw or "kind" not in raw:
        raise ScenarioError(f"{where}: needs 'at' (seconds) and 'kind'")
    kind = raw["kind"]
    if kind not in FAULT_KINDS:
        raise ScenarioError(f"{where}: unknown kind {kind!r} (known: {', '.join(sorted(FAULT_KINDS))})")
    at = _typed(where, "at", raw["at"], 0.0)
    params = {}
    for key, value in raw.items():
        if key in ("at", "kind", "label"):
            continue
        if key not in FAULT_KINDS[kind]:
            raise ScenarioError(
                f"{where}: {kind} takes no {key!r} (it takes: {', '.join(sorted(FAULT_KINDS[kind])) or 'nothing'})"
            )
        params[key] = value
    if kind in ("link_down", "link_up", "latency"):
        link = params.get("link", "random")
        if link != "random" and not (
            isinstance(link, list) and len(link) == 2 and all(isinstance(x, str) for x in link)
        ):
            raise ScenarioError(f'{where}: link must be "random" or ["a", "b"], got {link!r}')
    if kind == "latency" and "latency_ms" not in params:
        raise ScenarioError(f"{where}: latency needs latency_ms")
    if kind == "crash" and params.get("how", "kill") not in ("kill", "power"):
        raise ScenarioError(
            f'{where}: how must be "kill" (peers see the reset) or "power" (peers time out), got {params["how"]!r}'
        )
    if kind == "stall":
        seconds = params.get("seconds")
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or seconds <= 0:
            raise ScenarioError(f"{where}: stall needs seconds, a positive number, got {seconds!r}")
    if kind == "partition" and len(params) != 1:
        raise ScenarioError(f"{where}: partition needs exactly one of groups, isolate, isolate_site, half, grow")
    label = raw.get("label", "")
    if not isinstance(label, str):
        raise ScenarioError(f"{where}: label must be a string")
    return Fault(at, kind, params, label)


def _validate(sc: Scenario) -> None:
    t = sc.topology
    if t.kind not in _TOPOLOGY_KINDS:
        raise ScenarioError(f"topology.kind: unknown {t.kind!r} (known: {', '.join(sorted(_TOPOLOGY_KINDS))})")
    if t.site_kind not in _TOPOLOGY_KINDS - {"sites"}:
        raise ScenarioError(f"topology.site_kind: unknown {t.site_kind!r}")
    if t.nodes < 2:
        raise ScenarioError("topology.nodes: at least 2")
    if t.nodes > 20000:
        raise ScenarioError("topology.nodes: at most 20000")
    if t.kind == "full" and t.nodes > 300:
        raise ScenarioError("topology.kind = full: at most 300 nodes (n^2/2 links)")
    if t.kind == "sites" and not 1 <= t.sites <= t.nodes:
        raise ScenarioError("topology.sites: between 1 and the number of nodes")
    if not 0.0 <= t.loss < 1.0:
        raise ScenarioError("topology.loss: a probability below 1")
    if sc.mode not in ("engine", "cluster"):
        raise ScenarioError(f'mode: "engine" or "cluster", got {sc.mode!r}')
    c = sc.clients
    if c.targets not in ("any", "far"):
        raise ScenarioError(f'clients.targets: "any" or "far", got {c.targets!r}')
    if len(c.qos) != 3 or sum(c.qos) <= 0 or len(c.move_how) not in (3, 4) or sum(c.move_how) <= 0:
        raise ScenarioError(
            "clients.qos: three shares; clients.move_how: three or four (clean, abrupt, takeover, away); not all zero"
        )
    for key in ("mqtt5", "clean_start", "expiring"):
        if not 0.0 <= getattr(c, key) <= 1.0:
            raise ScenarioError(f"clients.{key}: a share, between 0 and 1")
    for key in ("session_expiry", "will_delay_interval", "message_expiry"):
        values = getattr(c, key)
        if not values or any(v < 0 or v != int(v) or v > 0xFFFFFFFF for v in values):
            raise ScenarioError(f"clients.{key}: whole seconds to choose from, at least one, none negative")
    if any(v == 0 for v in c.message_expiry):
        raise ScenarioError("clients.message_expiry: a Message Expiry Interval of 0 is none; leave it out")
    if c.groups < 0 or c.members < 1 or c.member_nodes < 0 or not 0.0 <= c.to_groups <= 1.0:
        raise ScenarioError("clients.groups: 0 or more; clients.members: 1 or more; clients.to_groups: a share")
    for key in ("member_persistent", "publisher_persistent"):
        if not 0.0 <= getattr(c, key) <= 1.0:
            raise ScenarioError(f"clients.{key}: a share, between 0 and 1")
    if len(c.member_qos) != 3 or sum(c.member_qos) <= 0 or len(c.member_leave) != 4 or sum(c.member_leave) <= 0:
        raise ScenarioError("clients.member_qos: three shares; clients.member_leave: four; not all zero")
    if c.replication < 1 or c.check_every <= 0:
        raise ScenarioError("clients.replication and clients.check_every must be positive")
    w = sc.workload
    if w.subscribe not in ("start", "converged"):
        raise ScenarioError(f'workload.subscribe: "start" or "converged", got {w.subscribe!r}')
    if len(w.qos) != 3 or sum(w.qos) <= 0:
        raise ScenarioError("workload.qos: three shares (QoS 0, 1, 2), not all zero")
    if not w.levels or any(v < 1 for v in w.levels):
        raise ScenarioError("workload.levels: at least one level, each with at least one value")
    for key in ("plus", "hash", "cross_site", "publishers"):
        if not 0.0 <= getattr(w, key) <= 1.0:
            raise ScenarioError(f"workload.{key}: a probability")
    if sc.node.keepalive <= 0 or sc.node.tick <= 0:
        raise ScenarioError("node.keepalive and node.tick must be positive")
    if sc.checks.resolution <= 0:
        raise ScenarioError("checks.resolution must be positive")
    if sc.duration <= 0:
        raise ScenarioError("duration must be positive")
    for f in sc.faults:
        if f.at > sc.duration:
            raise ScenarioError(f"a {f.kind} fault at {f.at}s is after the end ({sc.duration}s)")


def load_scenario(path: str | Path) -> Scenario:
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ScenarioError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ScenarioError(f"{path}: invalid TOML: {exc}") from None
    return parse_scenario(raw, str(path))
