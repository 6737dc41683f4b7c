"""Load: a job's tables as Parquet and CSV, written on the driver from one Arrow collect.

A job's tables are its results (rows per window and key, per subscriber, ...), not its
input: each is computed by Spark and brought to the driver once, as Arrow batches
(``DataFrame.toArrow``: one Spark job, no row objects), then written there as
``out/tables/NAME/part-00000.parquet`` and ``out/tables/NAME.csv``; the charts and the
HTML page read the same Arrow table (``Table.data``) instead of asking Spark again. The
output directory is therefore the driver's (it always was: the CSV files, charts and page
are written there); on a cluster, point ``--out`` at a directory of the machine that runs
the driver.
"""

from __future__ import annotations

import csv
import datetime as dt
import os
import shutil
from dataclasses import dataclass, field
from typing import Any

from pyspark.sql import DataFrame

__all__ = ["Table", "write_table", "write_arrow", "PREVIEW_ROWS"]

PREVIEW_ROWS = 50
PARQUET_FILE = "part-00000.parquet"


@dataclass
class Table:
    name: str
    title: str
    columns: list[str]
    rows: int = 0
    preview: list[tuple] = field(default_factory=list)
    parquet: str = ""
    csv: str = ""
    # the table's rows as the driver has them (a pyarrow.Table; None in a Table built by hand)
    data: Any = field(default=None, repr=False, compare=False)


def _cell(value):
    """A value as the HTML preview and the CSV file show it."""
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, (bytes, bytearray)):
        return value.hex()
    if isinstance(value, dt.datetime):
        return value.isoformat()
    return "" if value is None else value


def _text_columns(data) -> list:
    """Each column of ``data`` (pyarrow) as the CSV has it: integers and text as they are;
    timestamps as ISO 8601 UTC (``2026-02-01T12:00:00.000000Z``); floats with 6 significant
    digits (``%.6g``); booleans as True/False; anything else as its Python text."""
    import pyarrow as pa
    import pyarrow.compute as pc

    out = []
    for col in data.columns:
        t = col.type
        if pa.types.is_integer(t) or pa.types.is_string(t) or pa.types.is_large_string(t):
            out.append(col)
        elif pa.types.is_timestamp(t):
            # (%S of microseconds has the fraction; a zone's time is shown as UTC)
            us = col.cast(pa.timestamp("us", tz="UTC" if t.tz else None))
            out.append(pc.strftime(us, format="%Y-%m-%dT%H:%M:%SZ"))
        elif pa.types.is_floating(t):
            g = "{:.6g}".format
            out.append(pa.array([None if v is None else g(v) for v in col.to_pylist()], pa.string()))
        else:
            values = col.to_pylist()
            if pa.types.is_boolean(t):
                text = [None if v is None else str(v) for v in values]
            else:
                text = [None if v is None else str(_cell(v)) for v in values]
            out.append(pa.array(text, pa.string()))
    return out


def write_table(df: DataFrame, out: str, name: str, title: str = "") -> Table:
    """Writes ``out/tables/NAME/`` (Parquet) and ``out/tables/NAME.csv``; keeps the rows
    (``Table.data``) and a preview. The rows keep ``df``'s order."""
    return write_arrow(df.toArrow(), out, name, title)  # (one Spark job: Arrow batches, in order)


def write_arrow(data, out: str, name: str, title: str = "") -> Table:
    """``write_table`` of rows the driver has (a pyarrow.Table), in their order."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    tables = os.path.join(out, "tables")
    os.makedirs(tables, exist_ok=True)
    t = Table(name, title or name, list(data.column_names))
    t.parquet = os.path.join(tables, name)
    t.csv = os.path.join(tables, f"{name}.csv")
    if os.path.isdir(t.parquet):
        shutil.rmtree(t.parquet)
    os.makedirs(t.parquet)
    pq.write_table(data, os.path.join(t.parquet, PARQUET_FILE), compression="zstd")
    text = pa.table(_text_columns(data), names=data.column_names)
    with open(t.csv, "w", newline="") as fh:  # (quoted where needed only, as people write CSV)
        w = csv.writer(fh, lineterminator="\n")
        w.writerow(data.column_names)
        w.writerows(zip(*(col.to_pylist() for col in text.columns), strict=True))
    t.rows = data.num_rows
    t.preview = [tuple("" if v is None else v for v in row.values()) for row in text.slice(0, PREVIEW_ROWS).to_pylist()]
    t.data = data
    return t
