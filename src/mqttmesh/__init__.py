"""mqttmesh: a mesh of peer MQTT 3.1.1 brokers that route like routers."""

__version__ = "0.1.0"
