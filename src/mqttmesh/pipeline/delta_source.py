"""A streaming source over an archive log that is a Delta table (archive.format = delta), with
Spark 4's Python Data Source API: ``spark.readStream.format("mqttmesh-delta").load(PATH)``.

An offset is a table version. A micro-batch reads the data files that the commits after its
start version, up to its end version, added *as new data* (``dataChange``): a flush's files,
never a compaction's (the same rows rewritten) nor a vacuum's, and never a file no commit names
(a writer killed mid-write). Replaying a batch after a failure lists the same files again, so
Spark's checkpoint and an idempotent sink give each row once. Each file is read as Arrow
record batches, handed to Spark as they are (no per-row Python). A file that a vacuum deleted
before the query read it (a query stopped for longer than ``archive.vacuum_retention``, with a
compaction in between) is an error that says so.
"""

from __future__ import annotations

import os

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow

from ..archive.schema import COLUMNS
from ..archive.table import commit_actions

__all__ = ["DeltaLogSource", "register", "added_files"]


def register(spark) -> None:
    spark.dataSource.register(DeltaLogSource)


def added_files(path: str, after: int, upto: int) -> list[str]:
    """The data files that commits ``after``+1 .. ``upto`` of the table at ``path`` added as new
    data, oldest first (absolute paths)."""
    out: list[str] = []
    for version in range(after + 1, upto + 1):
        try:
            actions = commit_actions(path, version)
        except FileNotFoundError:
            raise RuntimeError(
                f"{path}: the table's log no longer has version {version} (its log was cleaned up past "
                f"what this query read): start the query again with a new checkpoint"
            ) from None
        for a in actions:
            add = a.get("add")
            if add is not None and add.get("dataChange", True):
                p = add["path"]
                out.append(p if os.path.isabs(p) else os.path.join(path, p))
    return out


class _Files(InputPartition):
    def __init__(self, files: list[str]):
        super().__init__(files)
        self.files = files


class DeltaLogSource(DataSource):
    """Options: the table's path (``load(PATH)`` or ``.option("path", PATH)``), ``kind``
    (publish, the default, or delivery: the columns), ``files_per_partition`` (8)."""

    @classmethod
    def name(cls) -> str:
        return "mqttmesh-delta"

    def schema(self):
        from .schema import spark_schema

        return spark_schema(self.options.get("kind", "publish"))

    def streamReader(self, schema):
        return DeltaLogStreamReader(dict(self.options))


class DeltaLogStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """``maxFilesPerTrigger`` (option): a micro-batch ends at the first version that brings
    its files to that many or more (a version is never split: at least one). With the
    available-now trigger the query reads up to the version current when it started (and, as
    for any source that supports that trigger, Spark then runs the batch without data that
    lets the watermark close the last windows)."""

    def __init__(self, options: dict):
        self.path = os.path.abspath(options["path"])
        self.kind = options.get("kind", "publish")
        self.per_partition = max(1, int(options.get("files_per_partition", 8)))
        self.max_files = int(options["maxFilesPerTrigger"]) if options.get("maxFilesPerTrigger") else None
        self.target: int | None = None  # (available-now: the version it reads up to)

    def prepareForTriggerAvailableNow(self) -> None:
        from deltalake import DeltaTable

        self.target = DeltaTable(self.path).version()

    def initialOffset(self) -> dict:
        return {"version": -1}

    def getDefaultReadLimit(self):
        from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxFiles

        return ReadMaxFiles(self.max_files) if self.max_files else ReadAllAvailable()

    def latestOffset(self, start: dict | None = None, limit=None) -> dict:  # (Spark 4.0 passes neither)
        from deltalake import DeltaTable

        head = DeltaTable(self.path).version() if self.target is None else self.target
        most = getattr(limit, "max_files", None)
        if start is None or not most:
            return {"version": head}
        version, files = int(start["version"]), 0
        while version < head and files < most:
            version += 1
            files += len(added_files(self.path, version - 1, version))
        return {"version": version}

    def partitions(self, start: dict, end: dict):
        files = added_files(self.path, int(start["version"]), int(end["version"]))
        n = self.per_partition
        return [_Files(files[i : i + n]) for i in range(0, len(files), n)]

    def read(self, partition):
        import pyarrow as pa
        import pyarrow.parquet as pq

        columns = [name for name, _, _ in COLUMNS[self.kind]]
        target: pa.Schema | None = None  # (the files' columns, nullable as Spark's schema says)
        for path in partition.files:
            try:
                handle = pq.ParquetFile(path)
            except FileNotFoundError:
                raise RuntimeError(
                    f"{path}: deleted by a vacuum before this query read it (the query was stopped longer "
                    f"than archive.vacuum_retention while the table was compacted or expired)"
                ) from None
            for batch in handle.iter_batches(columns=columns):
                if target is None:
                    target = pa.schema([f.with_nullable(True) for f in batch.schema])
                yield pa.RecordBatch.from_arrays(batch.columns, schema=target)

    def commit(self, end: dict) -> None:
        pass
