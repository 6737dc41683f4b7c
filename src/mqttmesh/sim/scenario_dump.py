"""Scenarios written back as TOML: what the fuzzer draws and shrinks, replayable by ``mqttmesh simulate FILE``.

Pure. ``scenario_dict`` is the document ``scenario.parse_scenario`` reads back into an
equal Scenario (only what differs from the defaults is written, so a shrunk scenario
shows what matters); ``dump_toml`` writes such a document (tomllib only reads). The
file name and the writing are the caller's.
"""

from __future__ import annotations

import json
import math
from dataclasses import fields
from typing import Any

from .scenario import Checks, Clients, NodeModel, Scenario, Topology, Workload

__all__ = ["scenario_dict", "dump_toml", "dump_scenario"]

_SECTIONS: tuple[tuple[str, type], ...] = (
    ("topology", Topology),
    ("node", NodeModel),
    ("workload", Workload),
    ("checks", Checks),
    ("clients", Clients),
)


def _plain(value: Any) -> Any:
    """A TOML value: tuples (``[min, max]`` keys) become lists."""
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    return value


def scenario_dict(sc: Scenario) -> dict[str, Any]:
    """The TOML document of ``sc``: its values that differ from the defaults, and its faults."""
    base = Scenario()
    doc: dict[str, Any] = {}
    for key in ("name", "description", "seed", "duration", "drain", "mode"):
        value = getattr(sc, key)
        if value != getattr(base, key) or key in ("name", "seed", "duration"):
            doc[key] = value
    for section, cls in _SECTIONS:
        obj, default = getattr(sc, section), cls()
        table = {
            f.name: _plain(getattr(obj, f.name))
            for f in fields(cls)
            if getattr(obj, f.name) != getattr(default, f.name)
        }
        if table:
            doc[section] = table
    if sc.engine:
        doc["engine"] = dict(sc.engine)
    faults = []
    for f in sc.faults:
        entry: dict[str, Any] = {"at": f.at, "kind": f.kind}
        entry.update({k: _plain(v) for k, v in f.params.items()})
        if f.label:
            entry["label"] = f.label
        faults.append(entry)
    if faults:
        doc["faults"] = faults
    return doc


def _value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v) or math.isinf(v):
            return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)  # JSON's escapes (\n, \", \\, \uXXXX) are TOML's basic string escapes
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    raise TypeError(f"no TOML value for {v!r}")


def dump_toml(doc: dict[str, Any]) -> str:
    """A TOML document: top-level keys, then a table per dict, then an array of tables per
    list of dicts (one level deep: what a scenario needs)."""
    lines = [f"{k} = {_value(v)}" for k, v in doc.items() if not isinstance(v, (dict, list)) or _is_array(v)]
    for key, value in doc.items():
        if isinstance(value, dict):
            lines += ["", f"[{key}]"] + [f"{k} = {_value(v)}" for k, v in value.items()]
    for key, value in doc.items():
        if isinstance(value, list) and not _is_array(value):
            for table in value:
                lines += ["", f"[[{key}]]"] + [f"{k} = {_value(v)}" for k, v in table.items()]
    return "\n".join(lines) + "\n"


def _is_array(value: Any) -> bool:
    """A plain array (of values), not an array of tables."""
    return isinstance(value, list) and not (value and all(isinstance(v, dict) for v in value))


def dump_scenario(sc: Scenario) -> str:
    return dump_toml(scenario_dict(sc))
