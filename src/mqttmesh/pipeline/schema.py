"""Spark schemas of the archive, from the one definition in archive/schema.py."""

from __future__ import annotations

from pyspark.sql import types as T

from ..archive.schema import COLUMNS, DELIVERY, PUBLISH

__all__ = ["spark_schema", "PUBLISH_SCHEMA", "DELIVERY_SCHEMA"]

_SPARK_TYPES = {
    "timestamp[us, UTC]": T.TimestampType(),
    "string": T.StringType(),
    "int64": T.LongType(),
    "int32": T.IntegerType(),
    "int8": T.ByteType(),
    "bool": T.BooleanType(),
    "binary": T.BinaryType(),
}


def spark_schema(kind: str) -> T.StructType:
    return T.StructType([T.StructField(name, _SPARK_TYPES[typ], True) for name, typ, _ in COLUMNS[kind]])


PUBLISH_SCHEMA = spark_schema(PUBLISH)
DELIVERY_SCHEMA = spark_schema(DELIVERY)
