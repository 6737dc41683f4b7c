"""Load: a job's tables as Parquet (written by Spark) and CSV (one local file each).

The output directory is local to the driver for the CSV files, the charts and the HTML
page; the Parquet tables go wherever ``out`` points for Spark (on a cluster: a path the
executors can reach as well, or a URI).
"""

from __future__ import annotations

import csv
import datetime as dt
import os
from dataclasses import dataclass, field

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

__all__ = ["Table", "write_table", "PREVIEW_ROWS"]

PREVIEW_ROWS = 50


@dataclass
class Table:
    name: str
    title: str
    columns: list[str]
    rows: int = 0
    preview: list[tuple] = field(default_factory=list)
    parquet: str = ""
    csv: str = ""


def _printable(df: DataFrame) -> DataFrame:
    """Timestamps as ISO 8601 UTC text (collect() would turn them into naive local times)."""
    cols = []
    for f in df.schema.fields:
        if isinstance(f.dataType, (T.TimestampType, T.TimestampNTZType)):
            cols.append(F.date_format(F.col(f.name), "yyyy-MM-dd'T'HH:mm:ss.SSSSSS'Z'").alias(f.name))
        else:
            cols.append(F.col(f.name))
    return df.select(*cols)


def _cell(value):
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, (bytes, bytearray)):
        return value.hex()
    if isinstance(value, dt.datetime):
        return value.isoformat()
    return "" if value is None else value


def write_table(df: DataFrame, out: str, name: str, title: str = "") -> Table:
    """Writes ``out/tables/NAME/`` (Parquet) and ``out/tables/NAME.csv``; keeps a preview."""
    tables = os.path.join(out, "tables")
    os.makedirs(tables, exist_ok=True)
    t = Table(name, title or name, df.columns)
    t.parquet = os.path.join(tables, name)
    t.csv = os.path.join(tables, f"{name}.csv")
    df = df.persist()
    try:
        df.write.mode("overwrite").parquet(t.parquet)
        with open(t.csv, "w", newline="") as fh:
            w = csv.writer(fh)
            w.writerow(df.columns)
            # (one partition: one Spark job for the rows, not one per partition; order kept)
            for row in _printable(df).coalesce(1).toLocalIterator():
                values = tuple(_cell(v) for v in row)
                w.writerow(values)
                if len(t.preview) < PREVIEW_ROWS:
                    t.preview.append(values)
                t.rows += 1
    finally:
        df.unpersist()
    return t
