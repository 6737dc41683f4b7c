# The two commands of the README: `make run` and `make test`.
# While working: `make check` (lint, types, the tests that start no process: seconds),
# `make fmt` (format and sort imports), `make lint`, `make typecheck`.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
# code ruff checks and formats; mypy's files are in pyproject.toml
LINTED := src tests bench
# the tests that start no process, JVM or mosquitto tool, and no long simulation
# (tests/conftest.py refuses a test that needs one of these markers and lacks it)
FAST   := not process and not spark and not interop and not slow and not hostile

.PHONY: run test test-costs check lint typecheck fmt bench bench-ws bench-mesh venv clean simulate-scale simulate-shared fuzz hostile-bench chaos sim-sweep system-deps js-deps

$(STAMP): pyproject.toml
	PYTHON=$(PYTHON) scripts/system-deps venv
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

venv: $(STAMP)

run: $(STAMP)
	scripts/system-deps run
	$(PY) -m mqttmesh run-local

# what CI runs (.ci/run): the Debian tools the tests use (installed as root, else named),
# lint, types, then the whole suite, in TEST_WORKERS processes (pytest-xdist; a module's
# tests stay in one, so its fixtures start once): most tests wait on sockets and timers, so
# three share two cores well (1.35 of them busy on average; one process took 20 minutes).
# Four were 8 % faster but starved the hostile suite's latency judgements (a congestion test
# saw 2 s delays that it takes for a held publisher). TEST_WORKERS=0: one process
TEST_WORKERS ?= 3
# The modules start costliest first (tests/support/schedule.py, from tests/module_costs.json);
# every run records what each module took in .pytest_cache/module_costs.json, which
# `make test-costs` (a run, then the copy) makes the order of the next runs
test: system-deps js-deps lint typecheck
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadscope --no-loadscope-reorder --record-module-costs .pytest_cache/module_costs.json

test-costs: test
	cp .pytest_cache/module_costs.json tests/module_costs.json

# Debian packages (mosquitto, mosquitto-clients, a JRE for PySpark, openssl, Node and npm):
# apt-get as root; otherwise a message naming them, and the tests that need them are skipped
system-deps:
	scripts/system-deps test

# the JavaScript clients the tests drive (MQTT.js), pinned by js/package-lock.json, into
# js/node_modules; without npm, a message (the tests that need them are skipped)
JS_STAMP := js/node_modules/.installed
$(JS_STAMP): js/package.json js/package-lock.json
	@if command -v npm >/dev/null 2>&1; then \
		cd js && npm ci --no-audit --no-fund --loglevel=error && touch node_modules/.installed; \
	else echo "js-deps: npm is missing (Debian nodejs, npm): the MQTT.js tests are skipped"; fi

js-deps: $(JS_STAMP)

check: lint typecheck
	$(PY) -m pytest -q -m "$(FAST)"

lint: $(STAMP)
	$(PY) -m ruff check $(LINTED)
	$(PY) -m ruff format --check $(LINTED)

typecheck: $(STAMP)
	$(PY) -m mypy

fmt: $(STAMP)
	$(PY) -m ruff check --select I --fix $(LINTED)
	$(PY) -m ruff format $(LINTED)

bench: $(STAMP) system-deps
	$(PY) -m bench

# MQTT over WebSocket beside Mosquitto's WebSocket listener (and both over TCP, in the same
# run): the run goes into a private network namespace (Mosquitto 2.0's ws listener binds
# every interface), so it needs root; figures in bench/results/ws.json
bench-ws: $(STAMP) system-deps
	$(PY) -m bench --brokers mqttmesh-ws,mosquitto-ws,mqttmesh,mosquitto --workloads fanin,fanout,p2p,latency \
		--qos 0,1 --json bench/results/ws.json --no-md

# what the mesh hop and persistent sessions cost (issue 26): same node vs cross-node vs
# Mosquitto (paced 1k/10k and unpaced, QoS 0-2), persistent vs clean sessions, the 7-node
# persistent workload and an idle 7-node mesh (bench/mesh_cost.py, about 20 min); then the same 3-node mesh with
# 25 ms (± 5) links and without (bench/wan.py, about 5 min); both write their kept sections
# of BENCHMARKS.md
bench-mesh: $(STAMP) system-deps
	$(PY) -m bench.mesh_cost --md
	$(PY) -m bench.wan --md

# the fuzz target of tests/hostile for 5 minutes (MQTTMESH_FUZZ_SEED=N repeats a run)
fuzz: $(STAMP)
	MQTTMESH_FUZZ_SECONDS=300 $(PY) -m pytest -q -s tests/hostile/test_fuzz.py

# the hostile attacks against mqttmesh and Mosquitto, side by side (a Markdown table)
hostile-bench: $(STAMP) system-deps
	$(PY) -m bench.hostile

# the fault harness of issue 15 (bench/chaos/README.md): 2 runs of 120 s (seeds 1 and 2) of
# 5 real nodes, every fault kind; prints the table, writes chaos-out/*.json; exit 1 while
# acknowledged messages are lost or QoS 2 messages delivered twice. CHAOS_ARGS adds options
# (e.g. CHAOS_ARGS="--broker mqttmesh,mosquitto" or "--rate 400 --pid-range 8")
CHAOS_ARGS ?=
chaos: $(STAMP) system-deps
	$(PY) -m bench.chaos --seeds 1,2 --duration 120 --nodes 5 --out chaos-out $(CHAOS_ARGS)

# 1,000 simulated nodes, 100,000 filters, a fault schedule (docs/simulation.md)
simulate-scale: $(STAMP)
	$(PY) -m mqttmesh.sim scenarios/scale-1000.toml --out sim-out/scale-1000

# shared groups at 1,000 whole nodes: 8 groups of 12 members leaving and joining, a crash, a
# link flap, every invariant and the shared checks (docs/simulation.md, section 9)
simulate-shared: $(STAMP)
	$(PY) -m mqttmesh.sim scenarios/shared-1000.toml --no-plots --out sim-out/shared-1000

# the cluster fuzzer (`mqttmesh simulate --fuzz`) over 1,000 seeds on one core, the first
# failing seed of each invariant shrunk (docs/simulation.md, section 8): a table, then
# sim-out/sweep.json and the failing scenarios in sim-out/sweep/; SWEEP_ARGS adds options
SWEEP_ARGS ?=
sim-sweep: $(STAMP)
	$(PY) -m bench.sim_sweep --seeds 1000 --jobs 1 --out sim-out/sweep.json --out-dir sim-out/sweep $(SWEEP_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis .mypy_cache .ruff_cache
