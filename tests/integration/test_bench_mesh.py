"""The mesh-cost and WAN benchmarks (bench/mesh_cost.py, bench/wan.py), small: they run to
the end, every message arrives, and the figures are there. No timing is judged."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from support.faultrelay import FaultRelay

pytestmark = [pytest.mark.process]

REPO = Path(__file__).resolve().parents[2]


def _bench(module: str, *args: str, timeout: float) -> str:
    run = subprocess.run(
        [sys.executable, "-m", module, *args], cwd=REPO, capture_output=True, text=True, timeout=timeout
    )
    assert run.returncode == 0, run.stderr[-2000:]
    return run.stdout


def test_mesh_cost_runs_same_node_and_across_two(tmp_path):
    out = tmp_path / "cost.json"
    printed = _bench(
        "bench.mesh_cost",
        *("--rounds", "1", "--groups", "paced,persistent", "--qos", "1", "--brokers", "same,cross"),
        *("--warmup", "0.2", "--duration", "0.5", "--idle", "0", "--out", str(out)),
        timeout=180,
    )
    cells = json.loads(out.read_text())["cells"]
    assert len(cells) == 2 + 2 * 2 + 2 * 2  # paced at 100, 1k and 10k; persistent and clean at 2k
    for key, cell in cells.items():
        s = cell["summary"]
        assert (s["ok"], s["lost"], s["delivered_fraction"]) == (1, 0, 1.0), (key, s)
        assert s["broker_cpu_us_per_msg"] is not None, key
    assert "| 1,000 | 1 |" in printed and "cross / same" in printed


def test_wan_measures_acks_and_both_deliveries(tmp_path):
    out = tmp_path / "wan.json"
    _bench(
        "bench.wan",
        *("--rounds", "1", "--messages", "5", "--rate", "20", "--qos", "2", "--sessions", "clean"),
        *("--delay", "0.01", "--jitter", "0.002", "--out", str(out)),
        timeout=180,
    )
    rows = json.loads(out.read_text())["results"]
    assert sorted(r["delay"] for r in rows) == [0.0, 0.01]
    for r in rows:
        assert (r["missing"], r["dups"]) == (0, 0), r
        assert len(r["acked"]) == len(r["completed"]) == len(r["local"]) == len(r["remote"]) == 5, r


def test_a_jittered_relay_keeps_the_bytes_in_order():
    """FaultRelay.delay with jitter: each read later by its own random amount, never before
    the one read before it (a TCP stream reordered would be another stream)."""
    server = socket.create_server(("127.0.0.1", 0))
    got = bytearray()
    sent = b"".join(b"%05d" % i for i in range(300))

    def echo_sink():
        conn, _ = server.accept()
        with conn:
            while len(got) < len(sent):
                data = conn.recv(65536)
                if not data:
                    break
                got.extend(data)

    thread = threading.Thread(target=echo_sink, daemon=True)
    thread.start()
    relay = FaultRelay("127.0.0.1", server.getsockname()[1])
    try:
        relay.delay(0.01, jitter=0.009)
        with socket.create_connection(("127.0.0.1", relay.port)) as c:
            c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            for i in range(0, len(sent), 5):
                c.sendall(sent[i : i + 5])
            thread.join(10)
    finally:
        relay.close()
        server.close()
    assert bytes(got) == sent
