"""The data pipeline: PySpark jobs over the archive the nodes write (docs/pipeline.md).

Each job is extract (pipeline/extract.py) -> pure ``DataFrame -> DataFrame``
transforms (traffic.py, payloads.py, audit.py) -> load (pipeline/load.py, report.py).
Nothing here is imported by a broker node: ``mqttmesh analyze`` imports it lazily.
"""
