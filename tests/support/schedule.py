"""The order the suite's modules start in: the costliest first, so that ``make test``'s
workers (pytest-xdist, ``--dist loadscope``: a module's tests stay in one worker) do not
start a four-minute module when the rest of the suite is nearly done.

xdist's own order (``--loadscope-reorder``) starts the modules with the most tests first,
which puts a module of one long test (a Spark cluster, a sweep of simulator seeds) at the
end. ``make test`` passes ``--no-loadscope-reorder`` and tests/conftest.py sorts the
collected items by the seconds each module took in a recorded run (``tests/module_costs.json``;
a module not in it counts as free and keeps its place among the others): the scheduler then
hands the modules out in that order, the longest-processing-time-first rule.

One scope for Spark: every module of tests/pipeline shares the worker's session-wide
SparkSession (a JVM of 1 GB on ``local[2]``), so under loadscope each worker that ran one of
them started its own JVM, and with three at once on two cores those modules took twice their
recorded time (a stream test timed out). ``make test`` puts them in one work unit
(``SparkTogether``): one JVM, the other workers running the rest of the suite beside it.

Recording: ``pytest --record-module-costs FILE`` adds up every test's setup, call and teardown
by module in the process that sees every report (the controller when xdist runs) and writes
them, rounded to a tenth of a second; ``make test`` writes .pytest_cache/module_costs.json
and ``make test-costs`` copies it over tests/module_costs.json. The figures only order the
modules; a stale file orders them less well, never changes what runs.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import pytest

COSTS = Path(__file__).resolve().parent.parent / "module_costs.json"
OPTION = "--record-module-costs"


def module_of(nodeid: str) -> str:
    """The test file of ``nodeid`` (``tests/sim/test_sim_fuzz.py::test_x[3]`` -> its path)."""
    return nodeid.split("::", 1)[0]


def load_costs(path: Path = COSTS) -> dict[str, float]:
    """The recorded seconds by module; an absent or unreadable file orders nothing."""
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return {str(k): float(v) for k, v in raw.items() if isinstance(v, int | float)}


def costliest_first(items: list[pytest.Item], costs: dict[str, float]) -> None:
    """Sort ``items`` in place: modules by recorded cost, descending; the tests of a module,
    and modules of equal cost (every unrecorded one), keep their collected order."""
    if costs:
        items.sort(key=lambda item: -costs.get(module_of(item.nodeid), 0.0))


class Recorder:
    """Seconds by module, from the test reports this process sees."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.seconds: dict[str, float] = defaultdict(float)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.seconds[module_of(report.nodeid)] += report.duration

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        ordered = sorted(self.seconds.items(), key=lambda kv: (-kv[1], kv[0]))
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps({k: round(v, 1) for k, v in ordered}, indent=1) + "\n")


def add_option(parser: pytest.Parser) -> None:
    parser.addoption(OPTION, metavar="FILE", help="write the seconds each test module took to FILE (JSON)")


def register_recorder(config: pytest.Config) -> None:
    """Record when asked, in the process that sees every report (not in an xdist worker)."""
    path = config.getoption(OPTION)
    if path and not hasattr(config, "workerinput"):
        config.pluginmanager.register(Recorder(Path(path)), "module-costs-recorder")


SPARK_MODULES = "tests/pipeline/"


def spark_together(config: pytest.Config, log):
    """The loadscope scheduler with every module under tests/pipeline in one scope; any other
    ``--dist`` mode is left to xdist (None)."""
    if config.getoption("dist", "no") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class SparkTogether(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            if nodeid.startswith(SPARK_MODULES):
                return SPARK_MODULES
            return super()._split_scope(nodeid)

    return SparkTogether(config, log)
