"""The archive: what each node published (and delivered) as Parquet, for the pipeline.

``schema`` (the columns), ``recorder`` (hot-path hooks and chunks, pure), ``wire`` (the
pipe to the writer, pure), ``writer`` and ``worker`` (the writer process: Arrow and
Parquet). The node's side is server/archive.py; docs/operations.md says how to run it.
"""
