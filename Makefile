# The two commands of the README: `make run` and `make test`.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: run test bench venv clean simulate-scale fuzz hostile-bench

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

venv: $(STAMP)

run: $(STAMP)
	$(PY) -m mqttmesh run-local

test: $(STAMP)
	$(PY) -m pytest -q

bench: $(STAMP)
	$(PY) -m bench

# the fuzz target of tests/hostile for 5 minutes (MQTTMESH_FUZZ_SEED=N repeats a run)
fuzz: $(STAMP)
	MQTTMESH_FUZZ_SECONDS=300 $(PY) -m pytest -q -s tests/hostile/test_fuzz.py

# the hostile attacks against mqttmesh and Mosquitto, side by side (a Markdown table)
hostile-bench: $(STAMP)
	$(PY) -m bench.hostile

# 1,000 simulated nodes, 100,000 filters, a fault schedule (docs/simulation.md)
simulate-scale: $(STAMP)
	$(PY) -m mqttmesh.sim scenarios/scale-1000.toml --out sim-out/scale-1000

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
