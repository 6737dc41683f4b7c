"""End to end: a three-node mesh archiving with the delivery log on, a known workload published on
all nodes, then the traffic and audit jobs: counts match the workload exactly, nothing lost or
duplicated, and a subscriber disconnected on purpose misses exactly what was published while
it was away."""

from __future__ import annotations

import csv
import os

import pytest

pq = pytest.importorskip("pyarrow.parquet")

from mqttmesh.pipeline.jobs import job_options, run_audit, run_traffic  # noqa: E402
from support.mesh import Subscriber, publish, start_mesh, status, wait_converged, wait_interest  # noqa: E402
from support.processes import wait_for  # noqa: E402

pytestmark = [pytest.mark.process, pytest.mark.spark]

NAMES = ["a", "b", "c"]
EDGES = [("b", "a"), ("c", "a"), ("c", "b")]


def read_csv(path):
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def published_payloads(archive):
    """msg_id -> payload, from the archive files themselves."""
    out = {}
    for dirpath, _, names in os.walk(os.path.join(archive, "publish")):
        for n in names:
            if n.endswith(".parquet") and not n.startswith("."):
                for r in pq.read_table(os.path.join(dirpath, n), columns=["msg_id", "payload"]).to_pylist():
                    out[r["msg_id"]] = r["payload"]
    return out


def interest_gone(nodes, topic_filter, at):
    return all(topic_filter not in status(n)["nodes"].get(at, {}).get("filters", []) for n in nodes.values())


def test_traffic_and_audit_match_the_workload_and_name_what_a_disconnected_subscriber_missed(
    broker_factory, tmp_path, spark
):
    archive = str(tmp_path / "archive")
    flags = [
        "--archive",
        "true",
        "--archive-dir",
        archive,
        "--archive-delivery-log",
        "true",
        "--archive-flush-interval",
        "1",
    ]
    nodes = start_mesh(broker_factory, NAMES, EDGES, extra=flags, connect="all")
    wait_converged(nodes, EDGES)
    subs = {n: Subscriber(nodes[n], f"sub-{n}", "load/#", qos=1) for n in NAMES}
    for n in NAMES:
        wait_interest(nodes, "load/#", n)

    # phase 1: every node publishes; all three subscribers get everything
    phase1 = {"a": ("pub-a", "load/a/x", 30, 1), "b": ("pub-b", "load/b/y", 20, 2), "c": ("pub-c", "load/c/z", 10, 1)}
    for node, (client, topic, count, qos) in phase1.items():
        publish(nodes[node], topic, [f"1-{node}-{i}".encode() for i in range(count)], qos=qos, client_id=client)
    for s in subs.values():
        s.wait_count(60)

    # phase 2: sub-b leaves (CleanSession=1); what is published meanwhile is what it misses
    subs["b"].close()
    wait_for(lambda: interest_gone(nodes, "load/#", "b"), 10, what="b's interest in load/# to be withdrawn")
    missed = [f"2-a-{i}".encode() for i in range(15)] + [f"2-c-{i}".encode() for i in range(5)]
    publish(nodes["a"], "load/a/x", missed[:15], qos=1, client_id="pub-a")
    publish(nodes["c"], "load/c/z", missed[15:], qos=1, client_id="pub-c")
    for n in ("a", "c"):
        subs[n].wait_count(80)

    # phase 3: sub-b is back, clean, and gets what follows
    subs["b"] = Subscriber(nodes["b"], "sub-b", "load/#", qos=1)
    wait_interest(nodes, "load/#", "b")
    publish(nodes["b"], "load/b/y", [f"3-b-{i}".encode() for i in range(10)], qos=1, client_id="pub-b")
    subs["b"].wait_count(10)
    for n in ("a", "c"):
        subs[n].wait_count(90)
    for s in subs.values():
        s.close()
    for node in nodes.values():
        assert node.stop() == 0  # a graceful stop writes everything each node holds

    out = tmp_path / "reports"
    traffic = run_traffic(spark, job_options(archive=[archive], out=str(out / "traffic"), window=3600), print)
    assert traffic.summary["messages"] == 90 and traffic.summary["nodes"] == 3 and traffic.summary["publishers"] == 3
    nodes_table = {r["origin"]: int(r["messages"]) for r in read_csv(traffic.tables["nodes"].csv)}
    assert nodes_table == {"a": 45, "b": 30, "c": 15}
    topics = {r["topic"]: int(r["messages"]) for r in read_csv(traffic.tables["topics"].csv)}
    assert topics == {"load/a/x": 45, "load/b/y": 30, "load/c/z": 15}
    talkers = [
        (r["rank"], r["publisher"], r["origin"], r["messages"]) for r in read_csv(traffic.tables["top_talkers"].csv)
    ]
    assert talkers == [("1", "pub-a", "a", "45"), ("2", "pub-b", "b", "30"), ("3", "pub-c", "c", "15")]
    assert os.path.exists(traffic.html) and os.listdir(os.path.join(traffic.out, "charts"))

    expect = [f"sub-{n}=load/#" for n in NAMES]
    audit = run_audit(spark, job_options(archive=[archive], out=str(out / "audit"), expect=expect), print)
    per_sub = {r["client_id"]: r for r in read_csv(audit.tables["audit_subscribers"].csv)}
    assert set(per_sub) == {"sub-a", "sub-b", "sub-c"}
    for n in ("a", "c"):
        r = per_sub[f"sub-{n}"]
        assert (r["expected"], r["delivered"], r["lost"], r["duplicated"], r["unexpected"], r["unknown"]) == (
            "90",
            "90",
            "0",
            "0",
            "0",
            "0",
        )
    r = per_sub["sub-b"]
    assert (r["expected"], r["delivered"], r["lost"], r["duplicated"]) == ("90", "70", "20", "0")
    payload_of = published_payloads(archive)
    lost = read_csv(audit.tables["lost_messages"].csv)
    assert {x["client_id"] for x in lost} == {"sub-b"}
    assert sorted(payload_of[x["msg_id"]] for x in lost) == sorted(missed)
    streams = {
        (x["client_id"], x["publisher"]): (x["expected"], x["lost"])
        for x in read_csv(audit.tables["audit_streams"].csv)
    }
    assert streams[("sub-b", "pub-a")] == ("45", "15") and streams[("sub-b", "pub-c")] == ("15", "5")
    assert streams[("sub-b", "pub-b")] == ("30", "0")
