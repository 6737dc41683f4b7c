"""The cluster: membership, the ClientId registry, session holders and replicas, retained
messages, wills, and their messages (one MQTT service across the mesh, pure)."""
