"""The hostile suite's side of the nodes under attack: their registry, logs, password files.

Every node a hostile test starts is registered (the ``nodes`` and ``module_nodes``
fixtures of tests/hostile/conftest.py); after each test, the part of each node's
log written during the test must hold no unhandled exception (issue 13: "No
unhandled exception appears in the node's log during the suite"): the autouse
``log_guard`` fixture checks it with ``REGISTRY``.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from support import attacks, probes
from support.probes import Target
from support.processes import BrokerProcess

PYTHON = sys.executable
SECRET = "hostile-secret"


# --------------------------------------------------------------------------- options the node has


def optional_flags(**settings) -> list[str]:
    """``--flag value`` for each setting the node knows; see attacks.optional_flags.

    Settings that issue 13 adds are passed this way, so that a test runs on today's
    node too and fails on what the node does, not on an unknown flag."""
    return attacks.optional_flags(PYTHON, **settings)


# --------------------------------------------------------------------------- logs


LOG_PROBLEMS = probes.LOG_PROBLEMS
log_problems = probes.log_problems


class _Registry:
    """Every node started by this suite, with how much of its log was checked already."""

    def __init__(self):
        self.nodes: list[BrokerProcess] = []
        self.checked: dict[int, int] = {}

    def add(self, b: BrokerProcess) -> None:
        self.nodes.append(b)
        self.checked[id(b)] = 0

    def marks(self) -> dict[int, int]:
        return {id(b): len(b.log()) for b in self.nodes}

    def problems_since(self, marks: dict[int, int]) -> list[str]:
        out = []
        for b in self.nodes:
            text = b.log()
            new = text[marks.get(id(b), 0) :]
            found = log_problems(new)
            if found:
                out.append(f"node {b.name} ({b.log_path}):\n  " + "\n  ".join(found))
            self.checked[id(b)] = len(text)
        for b in [b for b in self.nodes if not b.alive()]:
            self.remove(b)  # stopped: checked to the end, nothing more will come
        return out

    def remove(self, b: BrokerProcess) -> None:
        if b in self.nodes:
            self.nodes.remove(b)
        self.checked.pop(id(b), None)


REGISTRY = _Registry()


def node_factory(workdir_of, prefix: str):
    """``make(*args, name=None, start=True)`` as ``broker_factory`` has, registering each node;
    and the list of the nodes it started (for the fixture to stop)."""
    started: list[BrokerProcess] = []

    def make(*args: str, name: str | None = None, start: bool = True) -> BrokerProcess:
        b = BrokerProcess(workdir_of(), name or f"{prefix}{len(started) + 1}", list(args))
        started.append(b)
        REGISTRY.add(b)
        return b.start() if start else b

    return make, started


def target_of(b: BrokerProcess, **kw) -> Target:
    """The attack-side description of a running node (``kw``: Target's fields)."""
    return Target(name="mqttmesh", host=b.host, port=b.port, pid=b.pid, log=b.log, **kw)


def run(target: Target, attack, *args, **kw) -> probes.Outcome:
    """``probes.run_attack`` with its report printed (pytest shows it with -s or on failure)."""
    outcome = probes.run_attack(target, attack, *args, **kw)
    print(outcome.report())
    return outcome


def check(outcome: probes.Outcome) -> None:
    assert outcome.held, outcome.report()


# --------------------------------------------------------------------------- files


def password_file(path: Path, users: dict[str, str], iterations: int | None = None) -> Path:
    """A password file made by ``mqttmesh passwd`` (default iterations unless given): one
    file per user, made in parallel, then joined (the format is one ``user:hash`` line each)."""
    extra = ["--iterations", str(iterations)] if iterations else []
    procs = []
    for i, (user, password) in enumerate(users.items()):
        part = path.with_name(f"{path.name}.{i}")
        procs.append(
            (
                part,
                subprocess.Popen(
                    [PYTHON, "-m", "mqttmesh", "passwd", str(part), user, "-b", password, *extra],
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                ),
            )
        )
    lines = []
    for part, proc in procs:
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        lines.append(part.read_text())
        part.unlink()
    path.write_text("".join(lines))
    path.chmod(0o600)
    return path
