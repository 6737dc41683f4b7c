"""mqttmesh's benchmark harness: `make bench` (python -m bench).

mqttproto  the little MQTT 3.1.1 the load generator speaks (independent of mqttmesh.codec)
loadgen    publisher/subscriber processes and one run of a workload
workloads  fanin, fanout, p2p, latency
brokers    start/stop mqttmesh (one node or several), Mosquitto and amqtt; Target = endpoints
report     summaries, targets, the table, latest.json and BENCHMARKS.md
"""

import sys
from pathlib import Path

# The figures and the hostile bench reuse the test helpers (tests/support: the raw MQTT client,
# the fault relay, the attacks), which are not installed: `support` is importable from here on,
# as pytest's `pythonpath` makes it for the tests.
_TESTS = str(Path(__file__).resolve().parent.parent / "tests")
if _TESTS not in sys.path:
    sys.path.append(_TESTS)
