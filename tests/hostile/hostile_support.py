"""pytest glue for the hostile suite: nodes under attack, their logs, password files.

Deliberately not a ``conftest.py`` (see tests/integration/itsupport.py): a second
module named ``conftest`` would shadow ``tests/conftest.py``. Test modules import
what they need from here, fixtures included (pytest finds fixtures in a module's
globals, the autouse ``log_guard`` too).

Every node a hostile test starts is registered; after each test, the part of each
node's log written during the test must hold no unhandled exception (issue 13:
"No unhandled exception appears in the node's log during the suite").
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
TESTS = HERE.parent
for p in (str(TESTS), str(HERE), str(TESTS / "mesh")):
    if p not in sys.path:
        sys.path.insert(0, p)

import attacks  # noqa: E402
import probes  # noqa: E402
from probes import Target  # noqa: E402


def _root_conftest():
    """tests/conftest.py as a module, whatever other ``conftest`` modules are loaded."""
    path = TESTS / "conftest.py"
    mod = sys.modules.get("conftest")
    if mod is not None and Path(getattr(mod, "__file__", "")).resolve() == path:
        return mod
    spec = importlib.util.spec_from_file_location("_mqttmesh_tests_root_conftest", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


_conftest = _root_conftest()
wait_for = _conftest.wait_for
free_port = _conftest.free_port
BrokerProcess = _conftest.BrokerProcess

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


@pytest.fixture(autouse=True)
def log_guard():
    """After each test: no unhandled exception in what any node logged during it."""
    marks = REGISTRY.marks()
    yield
    problems = REGISTRY.problems_since(marks)
    if problems:
        pytest.fail("unhandled exceptions in the node logs:\n" + "\n".join(problems), pytrace=False)


def _factory(workdir_of, prefix: str):
    started: list[BrokerProcess] = []

    def make(*args: str, name: str | None = None, start: bool = True) -> BrokerProcess:
        b = BrokerProcess(workdir_of(), name or f"{prefix}{len(started) + 1}", list(args))
        started.append(b)
        REGISTRY.add(b)
        return b.start() if start else b

    return make, started


@pytest.fixture
def nodes(tmp_path):
    """``nodes(*args, name=None, start=True)`` starts a node for this test (same signature
    as ``broker_factory``, so tests/mesh/meshutil.py helpers take it); all are stopped at
    teardown, and their logs checked by ``log_guard``."""
    make, started = _factory(lambda: tmp_path, "node")
    yield make
    for b in started:
        b.stop(timeout=5)  # log_guard, set up before this fixture, checks what they wrote


@pytest.fixture(scope="module")
def module_nodes(tmp_path_factory):
    """Nodes shared by the tests of one module; their logs are checked after each test
    and once more after they stop."""
    d = tmp_path_factory.mktemp("hostile")
    make, started = _factory(lambda: d, "shared")
    yield make
    marks = {id(b): REGISTRY.checked.get(id(b), 0) for b in started}
    for b in started:
        b.stop(timeout=5)
    problems = REGISTRY.problems_since(marks)
    for b in started:
        REGISTRY.remove(b)
    if problems:
        pytest.fail("unhandled exceptions in the node logs at shutdown:\n" + "\n".join(problems), pytrace=False)


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
