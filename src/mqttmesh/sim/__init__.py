"""The mesh at scale, in simulation: thousands of unmodified routing engines in one process.

``Simulator`` (core.py) runs a ``Scenario`` (scenario.py: topology, network
model, workload, faults, read from scenarios/*.toml) on a discrete-event
clock, checks the mesh's invariants against centralised truths (checks.py) and
summarises what it saw (report.py, plots.py). It leaves nothing to a caller:
no sockets, no asyncio, no wall clock except to measure CPU time.
"""
