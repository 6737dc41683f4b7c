"""The simulator's parts: scenario checking, topologies, workload, wire reader, Dijkstra, the command."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from mqttmesh.mesh.routing.envelope import Envelope, encode_batch
from mqttmesh.message import Message
from mqttmesh.sim.checks import dijkstra, tree_edges
from mqttmesh.sim.observe import read_envelope_heads
from mqttmesh.sim.scenario import ScenarioError, Topology, Workload, parse_scenario
from mqttmesh.sim.topology import build_topology
from mqttmesh.sim.workload import TopicSpace

ROOT = Path(__file__).resolve().parents[2]


# ---------------------------------------------------------------- scenarios


@pytest.mark.parametrize(
    "raw,message",
    [
        ({"topolgy": {}}, "unknown key 'topolgy'"),
        ({"topology": {"nodes": "ten"}}, "topology.nodes: expected an integer"),
        ({"topology": {"kind": "torus"}}, "topology.kind: unknown 'torus'"),
        ({"topology": {"kind": "full", "nodes": 1000}}, "at most 300 nodes"),
        ({"topology": {"latency_ms": [5, 1]}}, "0 <= min <= max"),
        ({"engine": {"hop_limt": 3}}, "unknown key 'hop_limt'"),
        ({"workload": {"qos": [0, 0, 0]}}, "workload.qos"),
        ({"workload": {"subscribe": "later"}}, "workload.subscribe"),
        ({"faults": [{"at": 1.0, "kind": "meteor"}]}, "unknown kind 'meteor'"),
        ({"mode": "whole"}, 'mode: "engine" or "cluster"'),
        ({"clients": {"targets": "near"}}, "clients.targets"),
        ({"clients": {"persistant": 3}}, "unknown key 'persistant'"),
        ({"clients": {"move_how": [0, 0, 0]}}, "clients.move_how"),
        ({"faults": [{"at": 1.0, "kind": "crash", "link": ["a", "b"]}]}, "crash takes no 'link'"),
        ({"faults": [{"at": 1.0, "kind": "partition"}]}, "exactly one of groups"),
        ({"faults": [{"kind": "heal"}]}, "needs 'at'"),
        ({"duration": 5.0, "faults": [{"at": 9.0, "kind": "heal"}]}, "after the end"),
    ],
)
def test_scenario_errors_name_the_key(raw, message):
    with pytest.raises(ScenarioError, match=message):
        parse_scenario(raw, "test.toml")


def test_every_shipped_scenario_parses():
    from mqttmesh.sim.scenario import load_scenario

    files = sorted((ROOT / "scenarios").glob("*.toml"))
    assert len(files) >= 8
    for f in files:
        load_scenario(f)


# ---------------------------------------------------------------- topologies


def _connected(g) -> bool:
    adj = {n: set() for n in g.names}
    for a, b in g.edges:
        adj[a].add(b)
        adj[b].add(a)
    seen, stack = {g.names[0]}, [g.names[0]]
    while stack:
        for v in adj[stack.pop()] - seen:
            seen.add(v)
            stack.append(v)
    return len(seen) == len(g.names)


@pytest.mark.parametrize(
    "kind,nodes,extra,edges",
    [
        ("ring", 12, {}, 12),
        ("line", 12, {}, 11),
        ("star", 12, {}, 11),
        ("full", 10, {}, 45),
        ("random", 1000, {"degree": 4.0}, 2000),  # average degree 4: n * 4 / 2 links
        ("ba", 50, {"m": 2}, 3 + 2 * 47),  # a triangle, then 2 links per new node
    ],
)
def test_topology_sizes(kind, nodes, extra, edges):
    g = build_topology(Topology(kind=kind, nodes=nodes, **extra), random.Random(1))
    assert len(g.edges) == edges
    assert _connected(g)
    assert len(set(g.edges)) == len(g.edges) and all(a < b for a, b in g.edges)


def test_rgg_and_sites_are_connected_with_their_latencies():
    g = build_topology(Topology(kind="rgg", nodes=200, degree=4, latency_ms=(1.0, 50.0)), random.Random(2))
    assert _connected(g)
    assert all(0.001 <= lat <= 0.050 + 1e-12 for lat in g.latency.values())
    t = Topology(
        kind="sites",
        nodes=24,
        sites=3,
        site_kind="full",
        long_links=2,
        latency_ms=(1.0, 1.0),
        long_latency_ms=(40.0, 40.0),
    )
    g = build_topology(t, random.Random(3))
    assert _connected(g)
    assert sorted(set(g.site_of.values())) == [0, 1, 2]
    long = [e for e in g.edges if g.site_of[e[0]] != g.site_of[e[1]]]
    assert all(g.latency[e] == 0.040 for e in long) and 1 <= len(long) <= 6  # 2 per neighbouring pair
    assert all(g.latency[e] == 0.001 for e in g.edges if e not in long)


# ---------------------------------------------------------------- workload


def test_distinct_filters_are_reached_and_valid():
    names = [f"n{i}" for i in range(50)]
    w = Workload(filters_per_node=0, distinct_filters=3000, levels=[20, 50, 100], cross_site=0.05)
    subs = TopicSpace(w, names).subscriptions(random.Random(4), names)
    every = [f for fs in subs.values() for f in fs]
    assert len(every) == len(set(every)) == 3000
    assert max(len(fs) for fs in subs.values()) - min(len(fs) for fs in subs.values()) <= 1
    for f in every:
        levels = f.split("/")
        assert "#" not in levels[:-1] and all(lv in ("+", "#") or ("+" not in lv and "#" not in lv) for lv in levels), f


# ---------------------------------------------------------------- the wire reader


def test_envelope_heads_read_from_the_engine_encoding():
    m1 = Message("s/1", b"payload", 1, False, "n07", (3 << 32) + 5, "client", 12.5)
    m2 = Message("s/2", b"", 0, True, "n08", 9, "c2", 0.0)
    batch = encode_batch([Envelope(m1, ["n01", "n02"], 30, 0), Envelope(m2, ["n03"], 7, 2)], 0.0)
    assert read_envelope_heads(batch) == [("n07", (3 << 32) + 5, 0, 30, ("n01", "n02")), ("n08", 9, 2, 7, ("n03",))]
    with pytest.raises(ValueError):
        read_envelope_heads(batch + b"x")


# ---------------------------------------------------------------- Dijkstra


def test_dijkstra_and_the_tree_union():
    #   a --1-- b --1-- d
    #   |               |
    #   +--3-- c --1----+      a-c 3, c-d 1, a-d via b 2, a-c via b-d-c 3 (tie: parent a < d)
    adj = {"a": {"b": 1, "c": 3}, "b": {"a": 1, "d": 1}, "c": {"a": 3, "d": 1}, "d": {"b": 1, "c": 1}}
    dist, parent, hops = dijkstra("a", adj)
    assert dist == {"a": 0, "b": 1, "d": 2, "c": 3}
    assert parent == {"b": "a", "d": "b", "c": "a"}
    assert hops == {"a": 0, "b": 1, "d": 2, "c": 1}
    assert tree_edges("a", parent, ["d", "c"]) == {("a", "b"), ("b", "d"), ("a", "c")}
    assert tree_edges("a", parent, ["d", "b"]) == {("a", "b"), ("b", "d")}


# ---------------------------------------------------------------- the command


@pytest.mark.process
def test_command_writes_json_and_plots(tmp_path):
    out = tmp_path / "out"
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "mqttmesh",
            "simulate",
            str(ROOT / "scenarios" / "ring-12.toml"),
            "--out",
            str(out),
            "--json",
            "-",
            "-q",
            "--duration",
            "12",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr
    summary = json.loads(p.stdout)
    assert summary["invariants"]["ok"] is True
    assert summary["scenario"]["nodes"] == 12 and summary["mqtt_st"]["copies_per_message"] == 11
    assert {f.name for f in out.iterdir()} >= {
        "summary.json",
        "summary.txt",
        "traffic.png",
        "convergence.png",
        "copies.png",
    }
    assert (out / "traffic.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.process
def test_command_reports_a_bad_scenario(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[topology]\nkind = 'torus'\n")
    p = subprocess.run([sys.executable, "-m", "mqttmesh.sim", str(bad)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2
    assert "topology.kind: unknown 'torus'" in p.stderr


def test_command_without_matplotlib_says_how_to_install_it(tmp_path, monkeypatch, capsys):
    # matplotlib is the `sim` extra: a run that would end in plots stops before it starts
    from mqttmesh.sim.cli import main

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # what find_spec reports when it is absent
    rc = main([str(ROOT / "scenarios" / "ring-12.toml"), "--out", str(tmp_path / "out"), "-q"])
    assert rc == 2
    assert "plots need matplotlib: pip install 'mqttmesh[sim]' (or --no-plots)" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@pytest.mark.process
def test_runs_are_the_same_across_processes_and_hash_seeds(tmp_path):
    # sets and dicts iterate in hash order, which changes with PYTHONHASHSEED: nothing the
    # simulator or the engine decides may depend on it
    outputs = []
    for seed in ("1", "2"):
        out = tmp_path / f"s{seed}.json"
        env = dict(os.environ, PYTHONHASHSEED=seed)
        p = subprocess.run(
            [
                sys.executable,
                "-m",
                "mqttmesh.sim",
                str(ROOT / "scenarios" / "random-30.toml"),
                "-q",
                "--json",
                str(out),
                "--duration",
                "20",
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert p.returncode == 0, p.stderr
        s = json.loads(out.read_text())
        for key in ("run", "spf"):  # wall-clock and CPU times
            s.pop(key)
        for e in s["convergence"]:
            e.pop("spf_seconds"), e.pop("spf_ms_per_run")
        outputs.append(s)
    assert outputs[0] == outputs[1]
