"""mqttmesh's benchmark harness: `make bench` (python -m bench).

mqttproto  the little MQTT 3.1.1 the load generator speaks (independent of mqttmesh.codec)
loadgen    publisher/subscriber processes and one run of a workload
workloads  fanin, fanout, p2p, latency
brokers    start/stop mqttmesh (one node or several), Mosquitto and amqtt; Target = endpoints
report     summaries, targets, the table, latest.json and BENCHMARKS.md
"""
