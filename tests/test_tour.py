"""The README's five-minute tour, run as written (issue 22 point 7).

The tour's code block is read from README.md and run by bash against a real local mesh
started by ``mqttmesh cluster up`` as ``make run`` starts it (three nodes, their HTTP and
WebSocket listeners), on free ports instead of 1883-1885 and 8080-8082. Two things are
added to the script, never changed in it: after each command that leaves a subscriber in
the background, a wait until the mesh has that subscription (asked of the admin API, with
a deadline), as a person typing the next command would have waited; and a marker after
each command, with its exit status. Every ``-> EXPECTED`` the README promises must appear in
the output, and no command may fail but those the tour expects to end by timeout
(``mosquitto_sub -W``: its exit status is 27).
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from support.processes import wait_for

pytestmark = [pytest.mark.process, pytest.mark.interop]

ROOT = Path(__file__).resolve().parents[1]
TIMED_OUT = 27  # mosquitto_sub -W: "timed out" (the tour's step 4 leaves that way on purpose)


def tour_script() -> str:
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## A five-minute tour") :]
    return section[section.index("```sh\n") + 6 : section.index("\n```", section.index("```sh\n"))]


def free_run(count: int) -> int:
    """A base port whose ``count`` consecutive ports are free now."""
    for _ in range(200):
        base = 20000 + (int.from_bytes(os.urandom(2), "big") % 20000)
        socks = []
        try:
            for p in range(base, base + count):
                s = socket.socket()
                s.bind(("127.0.0.1", p))
                socks.append(s)
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no run of free ports")


WAIT_SUB = r"""
wait_sub() {  # the mesh has a subscription to $1 (the admin API of the first node), 10 s at most
  "$PY" - "$1" <<'PYEOF'
import json, sys, time, urllib.request, os
deadline = time.monotonic() + 10
while time.monotonic() < deadline:
    try:
        with urllib.request.urlopen(os.environ["MQTTMESH_URL"] + "/api/v1/subscriptions?limit=1000", timeout=2) as r:
            if any(i["filter"] == sys.argv[1] for i in json.load(r)["items"]):
                sys.exit(0)
    except OSError:
        pass
    time.sleep(0.05)
sys.exit("no subscription to " + sys.argv[1])
PYEOF
}
"""


def instrumented(script: str, ports: dict[int, int]) -> tuple[str, list[str]]:
    """The tour with its ports replaced, a status marker after each command, and a wait
    after each background subscriber; and what its ``->`` comments promise."""
    expected = [m.group(1).strip() for m in re.finditer(r"->\s+(.+?)(?:\s{2,}|$)", script, re.M)]
    out = ["set -u", WAIT_SUB]
    for n, line in enumerate(script.splitlines()):
        for old, new in ports.items():
            line = re.sub(rf"(-p |--port ){old}\b", rf"\g<1>{new}", line)
        out.append(line)
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue  # a comment (a continued one too)
        if re.search(r"&\s*(#.*)?$", stripped):  # a subscriber left in the background
            topic = re.search(r"-t ('[^']*'|\S+)", stripped).group(1).strip("'")
            out.append(f"wait_sub '{topic}' || echo 'TOUR-FAIL {n}: no subscription'")
        else:
            out.append(f'echo "TOUR-STATUS {n} $?"')
    return "\n".join(out) + "\n", expected


def test_the_readme_tour_works_as_written(tmp_path):
    base, http_base, ws_base = free_run(3), free_run(3), free_run(3)
    mesh_log = tmp_path / "mesh.log"
    with open(mesh_log, "wb") as log:
        mesh = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "mqttmesh",
                "cluster",
                "up",
                "--nodes",
                "3",
                "--topology",
                "full",
                "--base-port",
                str(base),
                "--http-base-port",
                str(http_base),
                "--ws-base-port",
                str(ws_base),
                "--workdir",
                str(tmp_path / "mesh"),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            start_new_session=True,
        )
    tour = None
    try:
        wait_for(lambda: b"the mesh converged" in mesh_log.read_bytes(), 90, what="the mesh up (cluster up)")
        script, expected = instrumented(tour_script(), {1883: base, 1884: base + 1, 1885: base + 2})
        assert len(expected) >= 5, expected
        env = {**os.environ, "MQTTMESH_URL": f"http://127.0.0.1:{http_base}", "PY": sys.executable}
        out_path = tmp_path / "tour.out"
        with open(out_path, "wb") as out:
            tour = subprocess.Popen(
                ["bash", "-c", script], stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, env=env, start_new_session=True
            )
            tour.wait(120)

        def seen() -> bool:
            text = out_path.read_text(errors="replace")
            return all(e in text for e in expected)

        try:
            wait_for(seen, 20, what="every output the tour promises")
        except AssertionError:
            text = out_path.read_text(errors="replace")
            missing = [e for e in expected if e not in text]
            raise AssertionError(f"the tour's output lacks {missing}; its output:\n{text}") from None
        text = out_path.read_text(errors="replace")
        statuses = [(int(n), int(rc)) for n, rc in re.findall(r"TOUR-STATUS (\d+) (\d+)", text)]
        lines = tour_script().splitlines()
        failed = [(lines[n], rc) for n, rc in statuses if rc not in (0, TIMED_OUT)]
        assert not failed, text
        assert all(rc == 0 or "-W" in lines[n] for n, rc in statuses), text
        assert "TOUR-FAIL" not in text and "command not found" not in text, text
    finally:
        for proc in (tour, mesh):
            if proc is not None and proc.poll() is None:
                os.killpg(proc.pid, signal.SIGINT if proc is mesh else signal.SIGKILL)
        if tour is not None:
            try:
                os.killpg(tour.pid, signal.SIGKILL)  # (the subscribers it left in the background)
            except ProcessLookupError:
                pass
        try:
            mesh.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(mesh.pid, signal.SIGKILL)
            mesh.wait(10)
