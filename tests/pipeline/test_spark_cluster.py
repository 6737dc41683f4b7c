"""The batch jobs on a real standalone Spark cluster: a master and two one-core workers started
from the PySpark installation, all on loopback; the project packaged and submitted as
docs/pipeline.md section 3 says. Every table each job writes there equals the same job's on
``local[2]`` over the same Delta archive, and the cluster did the work (each worker ran an
executor for each job). ``traffic`` runs there once more on the archive given as a URI (a
``viewfs://`` mount, in the Hadoop configuration of the driver and the executors; see
test_archive_delta_uri.py), its publish table compacted and not vacuumed: read through its
Delta log by the cluster's JVMs, it writes what it writes from the local path."""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

pq = pytest.importorskip("pyarrow.parquet")
pytest.importorskip("deltalake")

from mqttmesh.archive.recorder import ArchiveLimits, Chunk  # noqa: E402
from mqttmesh.archive.schema import DELIVERY, PUBLISH  # noqa: E402
from mqttmesh.archive.table import compact  # noqa: E402
from mqttmesh.archive.writer import FileWriter  # noqa: E402
from support.spark_cluster import HOST, NOT_LOOPBACK, QUICK_JVM, SparkCluster, run_group, spark_env, spark_home  # noqa: E402

pytestmark = [pytest.mark.spark, pytest.mark.process, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
T0 = 1769867940.0  # 2026-01-31T13:59:00Z: the archive spans two hours (two partitions)
MESSAGES = 120  # 60 per node, one every 2 s

# the job's arguments (docs/pipeline.md section 2), the same on both masters
JOBS = {
    "traffic": ["--window", "60"],
    "payloads": ["--window", "60"],
    "audit": ["--expect", "s1=sensors/n1/#", "--expect", "s2=sensors/n2/#"],
}
TABLES = {
    "traffic": {"per_node", "per_prefix", "per_topic", "per_publisher", "top_talkers", "topics", "nodes"},
    "payloads": {"payload_stats", "payload_totals", "payload_quality"},
    "audit": {"audit_subscribers", "audit_streams", "audit_publishers", "lost_messages"},
}


def write_archive(root: Path) -> None:
    """Two nodes' Delta archive, three flushes each (six commits per log): JSON readings (values
    that add up exactly in any order, so that sums over partitions do not depend on how they
    were split) and one non-JSON payload in ten; s1 on n1 gets everything but one message and
    one copy twice, s2 on n2 gets n2's messages."""
    for node in ("n1", "n2"):
        pubs, dlvs = [], []
        for i in range(MESSAGES // 2):
            seq, t = i + 1, T0 + 2 * i + (0.5 if node == "n2" else 0.0)
            payload = b"legacy %d" % i if i % 10 == 9 else b'{"temp": %.2f, "rh": %d}' % (20 + (i % 8) * 0.25, 40 + i)
            topic = f"sensors/{node}/{'temp' if i % 2 else 'room'}"
            pubs.append((t, seq, f"dev-{node}-{i % 3}", topic, 1, False, payload))
            if node == "n1" and seq != 17:  # (n1:17 is lost)
                dlvs.append((t + 0.003, node, seq, topic, t, "s1", 1, False))
                if seq == 30:
                    dlvs.append((t + 0.5, node, seq, topic, t, "s1", 1, True))
            if node == "n2":
                dlvs.append((t + 0.004, node, seq, topic, t, "s2", 1, False))
        for k in range(3):
            w = FileWriter(str(root), node, k + 1, ArchiveLimits(), fmt="delta")
            part = pubs[k * 20 : (k + 1) * 20]
            w.add(Chunk(PUBLISH, part, sum(len(r[6]) for r in part), 0), now=0.0)
            third = len(dlvs) // 3 + 1
            w.add(Chunk(DELIVERY, dlvs[k * third : (k + 1) * third], 0, k * third + 1), now=0.0)
            w.close()


def package(out: Path) -> Path:
    """The project as docs/pipeline.md section 3 packages it: ``python -m zipfile -c mqttmesh.zip src/mqttmesh``."""
    zipped = out / "mqttmesh.zip"
    cmd = [sys.executable, "-m", "zipfile", "-c", str(zipped), str(ROOT / "src" / "mqttmesh")]
    subprocess.run(cmd, check=True, timeout=60)
    return zipped


def submit(
    master: str, job: str, zipped: Path, archive: Path | str, out: Path, *conf: str
) -> subprocess.CompletedProcess:
    cmd = [
        os.path.join(spark_home(), "bin", "spark-submit"),
        "--master",
        master,
        "--py-files",
        str(zipped),
        "--conf",
        "spark.ui.enabled=false",  # (the driver's UI would take port 4040 and up)
        "--conf",
        f"spark.driver.extraJavaOptions={QUICK_JVM}",
        "--conf",
        f"spark.executor.extraJavaOptions={QUICK_JVM}",
        *conf,
        str(ROOT / "src" / "mqttmesh" / "pipeline" / "submit.py"),
        job,
        "--archive",
        str(archive),
        "--out",
        str(out),
        "--shuffle-partitions",
        "2",
        *JOBS[job],
    ]
    done = run_group(cmd, 150, env=spark_env(), cwd=out.parent)
    assert done.returncode == 0, f"{job} on {master}:\n{done.stdout}\n{done.stderr[-5000:]}"
    assert NOT_LOOPBACK not in done.stderr, done.stderr[-3000:]
    return done


def tables(out: Path) -> dict[str, tuple[object, list]]:
    """name -> (schema, rows sorted) of each Parquet table a job wrote under OUT/tables."""
    found = {}
    for entry in sorted((out / "tables").iterdir()):
        if entry.is_dir():
            t = pq.read_table(entry)
            rows = sorted((tuple(r.values()) for r in t.to_pylist()), key=repr)
            found[entry.name] = (t.schema, rows)
    return found


@pytest.fixture
def cluster(tmp_path):
    c = SparkCluster(tmp_path / "cluster", workers=2, cores=1, memory="1g")
    try:
        yield c.start()
    finally:
        c.stop()


@pytest.mark.timeout(400)
def test_the_batch_jobs_on_a_standalone_cluster_write_what_they_write_on_local_2(cluster, tmp_path):
    listening = cluster.listening()
    assert set(cluster.ports) <= {port for _, port in listening}, listening
    assert {addr for addr, _ in listening} == {HOST}, listening
    archive = tmp_path / "archive"
    write_archive(archive)
    # (the replaced files stay on disk: read as a directory, the URI would count them twice)
    assert compact(str(archive / PUBLISH)).files_removed == 8  # (into one file per hour)
    zipped = package(tmp_path)
    (tmp_path / "cluster-out").mkdir()
    (tmp_path / "local-out").mkdir()
    executor = ("--executor-memory", "512m", "--total-executor-cores", "2")
    # one job at a time on the cluster (each takes both its cores); the local[2] runs go
    # meanwhile, in a thread, and fill the cluster's waits (JVM starts, executors registering)
    with ThreadPoolExecutor(1) as beside:
        local = beside.submit(
            lambda: [submit("local[2]", job, zipped, archive, tmp_path / "local-out" / job) for job in JOBS]
        )
        for job in JOBS:
            submit(cluster.url, job, zipped, archive, tmp_path / "cluster-out" / job, *executor)
        mount = ("--conf", f"spark.hadoop.fs.viewfs.mounttable.arc.link./arc=file://{archive}")
        uri_out = tmp_path / "cluster-out" / "traffic-uri"
        done = submit(cluster.url, "traffic", zipped, "viewfs://arc/arc", uri_out, *executor, *mount)
        local.result()
    assert "viewfs://arc/arc/publish: Delta table, version 6, 2 files in the time range" in done.stdout + done.stderr
    assert tables(uri_out) == tables(tmp_path / "cluster-out" / "traffic")

    for job, names in TABLES.items():
        on_cluster, on_local = tables(tmp_path / "cluster-out" / job), tables(tmp_path / "local-out" / job)
        assert set(on_cluster) == set(on_local) == names
        for name in names:
            assert on_cluster[name][0] == on_local[name][0], f"{job} {name}: schemas differ"
            assert on_cluster[name][1], f"{job} {name}: no rows"
            assert on_cluster[name][1] == on_local[name][1], f"{job} {name}: rows differ"
    # not vacuous: the tables hold the archive's workload
    nodes = {r[0]: r[1] for r in tables(tmp_path / "cluster-out" / "traffic")["nodes"][1]}
    assert nodes == {"n1": MESSAGES // 2, "n2": MESSAGES // 2}, nodes
    quality = tables(tmp_path / "cluster-out" / "payloads")["payload_quality"][1]
    assert sum(r[3] for r in quality) == MESSAGES // 10, quality  # (non_json: one payload in ten)
    lost = tables(tmp_path / "cluster-out" / "audit")["lost_messages"][1]
    assert [(r[0], r[1]) for r in lost] == [("s1", "n1:17")]

    # the cluster ran them: four applications finished, each with an executor on each worker
    apps = cluster.state()["completedapps"]
    finished = sorted((a["name"], a["state"]) for a in apps)
    assert finished == sorted([(f"mqttmesh-{job}", "FINISHED") for job in [*JOBS, "traffic"]]), apps
    for i in (1, 2):
        runs = [d for d in cluster.work_dir(i).iterdir() if d.name.startswith("app-")]
        assert len(runs) == 4, f"worker{i} ran executors for {len(runs)} applications"
        for d in runs:
            for stderr in d.glob("*/stderr"):
                assert NOT_LOOPBACK not in stderr.read_text(errors="replace"), stderr
    for name in ("master", "worker1", "worker2"):
        assert NOT_LOOPBACK not in cluster.log(name), name
