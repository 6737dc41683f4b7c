"""What the tests share, importable as ``support.X`` (pytest puts tests/ on the path:
``pythonpath`` in pyproject.toml; the benchmarks in bench/ do the same in bench/__init__.py).

processes    wait_for, free_port, BrokerProcess: real broker processes on loopback
mqttraw      MQTT 3.1.1 bytes and a blocking raw client, independent of mqttmesh.codec
faultrelay   a TCP relay between two nodes that can block, cut or delay the link
mesh         start wired nodes, wait for convergence, subscribe, publish, count envelopes
integration  the black-box tests' raw client, paho wrapper, log waits and CLI runs
frames       the pure cores' unit tests: frames split without our codec, a fake network
sim          the simulator tests: the scenario directory and one run
probes       the hostile suite's measuring side: canary, /proc probes, plain clients
attacks      the attacks of the hostile suite (and of ``python -m bench.hostile``)
hostile      the hostile suite's node registry, log checks, password files
pipeline     the pipeline tests' timestamps and archive readers

Fixtures are in the conftest.py files, which import from here.
"""
