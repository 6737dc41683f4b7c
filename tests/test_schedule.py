"""The order make test's workers start the modules in (tests/support/schedule.py)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from support.schedule import Recorder, costliest_first, load_costs, module_of, spark_together


def _items(*nodeids: str) -> list[pytest.Item]:
    return cast(Any, [SimpleNamespace(nodeid=n) for n in nodeids])


def test_the_costliest_modules_come_first_and_the_rest_keep_their_order() -> None:
    items = _items("a.py::t1", "b.py::t1", "a.py::t2", "c.py::t1", "d.py::t1", "c.py::t2")
    costliest_first(items, {"c.py": 200.0, "b.py": 50.0})
    assert [i.nodeid for i in items] == ["c.py::t1", "c.py::t2", "b.py::t1", "a.py::t1", "a.py::t2", "d.py::t1"]


def test_without_costs_nothing_moves() -> None:
    items = _items("b.py::t", "a.py::t")
    costliest_first(items, {})
    assert [i.nodeid for i in items] == ["b.py::t", "a.py::t"]


def test_a_missing_or_broken_file_orders_nothing(tmp_path: Path) -> None:
    assert load_costs(tmp_path / "absent.json") == {}
    (tmp_path / "bad.json").write_text("{not json")
    assert load_costs(tmp_path / "bad.json") == {}
    (tmp_path / "odd.json").write_text('{"a.py": 3, "b.py": "x"}')
    assert load_costs(tmp_path / "odd.json") == {"a.py": 3.0}


def test_the_recorder_adds_setup_call_and_teardown_by_module(tmp_path: Path) -> None:
    out = tmp_path / "cache" / "costs.json"  # (its directory made if need be)
    rec = Recorder(out)
    for nodeid, seconds in [("x.py::a", 1.25), ("x.py::a", 2.0), ("y.py::b[1]", 0.5), ("x.py::c", 0.04)]:
        rec.pytest_runtest_logreport(cast(Any, SimpleNamespace(nodeid=nodeid, duration=seconds)))
    rec.pytest_sessionfinish(cast(Any, None))
    assert json.loads(out.read_text()) == {"x.py": 3.3, "y.py": 0.5}
    assert list(json.loads(out.read_text())) == ["x.py", "y.py"] and load_costs(out) == {"x.py": 3.3, "y.py": 0.5}


def test_the_module_of_a_parametrized_test_in_a_class() -> None:
    assert module_of("tests/sim/test_sim_fuzz.py::Test::test_x[3-a::b]") == "tests/sim/test_sim_fuzz.py"


def test_the_spark_modules_share_one_work_unit_under_loadscope() -> None:
    loadscope = cast(
        Any, SimpleNamespace(getoption=lambda name, default=None: "loadscope", getvalue=lambda name: ["3*popen"])
    )
    scheduler = spark_together(loadscope, None)
    assert scheduler is not None
    scopes = {
        n: scheduler._split_scope(n)
        for n in [
            "tests/pipeline/test_stream.py::test_kill",
            "tests/pipeline/test_payloads.py::test_x[2]",
            "tests/sim/test_sim_fuzz.py::test_seed[3]",
            "tests/unit/test_codec_unit.py::TestX::test_y",
        ]
    }
    assert scopes == {
        "tests/pipeline/test_stream.py::test_kill": "tests/pipeline/",
        "tests/pipeline/test_payloads.py::test_x[2]": "tests/pipeline/",
        "tests/sim/test_sim_fuzz.py::test_seed[3]": "tests/sim/test_sim_fuzz.py",
        "tests/unit/test_codec_unit.py::TestX::test_y": "tests/unit/test_codec_unit.py::TestX",
    }
    each = cast(Any, SimpleNamespace(getoption=lambda name, default=None: "load"))
    assert spark_together(each, None) is None  # (another mode: xdist's own scheduler)
