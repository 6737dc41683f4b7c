"""What the simulator tests share: the scenario directory and running one scenario."""

from __future__ import annotations

from pathlib import Path

from mqttmesh.sim.core import Simulator
from mqttmesh.sim.scenario import load_scenario

SCENARIOS = Path(__file__).resolve().parents[2] / "scenarios"


def run(name: str, fail: bool | None = None, **changes) -> Simulator:
    """Run ``scenarios/NAME.toml`` with some scenario attributes changed (``fail``: whether a
    broken invariant stops the run, the scenario's own choice if None)."""
    sc = load_scenario(SCENARIOS / f"{name}.toml")
    for key, value in changes.items():
        setattr(sc, key, value)
    if fail is not None:
        sc.checks.fail = fail
    return Simulator(sc).run()
