"""The archive's file format: the columns of the publish log and of the delivery log.

Pure data. The writer (archive/writer.py) maps the type names to Arrow types, the
pipeline (pipeline/schema.py) to Spark types, and docs/pipeline.md shows the table
``schema_markdown()`` gives (a test keeps it in step).
"""

from __future__ import annotations

__all__ = [
    "FORMAT_VERSION",
    "PUBLISH",
    "DELIVERY",
    "KINDS",
    "PUBLISH_COLUMNS",
    "DELIVERY_COLUMNS",
    "COLUMNS",
    "schema_markdown",
]

# Written into every file's key-value metadata (``mqttmesh.archive``); a reader refuses
# other versions by name instead of misreading them.
FORMAT_VERSION = 1

PUBLISH, DELIVERY = "publish", "delivery"
KINDS = (PUBLISH, DELIVERY)

# (column, Arrow type, meaning)
PUBLISH_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("timestamp", "timestamp[us, UTC]", "when the node took the message from its publisher (that node's wall clock)"),
    ("msg_id", "string", "mesh-wide unique message id, `origin:seq`"),
    (
        "origin",
        "string",
        "node the message was published at: the node that archived it, but for a message it "
        "routed under another node's id (a QoS 2 message its first node had not routed, a dead node's will)",
    ),
    ("seq", "int64", "the origin's sequence number of the message"),
    ("publisher", "string", "publishing ClientId"),
    ("topic", "string", "topic name"),
    ("qos", "int8", "QoS of the PUBLISH from the publisher"),
    ("retain", "bool", "RETAIN flag of the PUBLISH"),
    ("payload", "binary", "the payload bytes"),
    ("payload_size", "int32", "payload length in bytes"),
)

DELIVERY_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("timestamp", "timestamp[us, UTC]", "when the node wrote the PUBLISH to the client"),
    ("msg_id", "string", "id of the delivered message, `origin:seq` (joins the publish log)"),
    ("origin", "string", "node the message was published at"),
    ("seq", "int64", "the origin's sequence number of the message"),
    ("topic", "string", "topic name"),
    ("published", "timestamp[us, UTC]", "the message's timestamp at its origin"),
    ("node", "string", "node the receiving client is connected to (the node that logged it)"),
    ("client_id", "string", "receiving ClientId"),
    ("qos", "int8", "QoS of this PUBLISH: min(publish QoS, granted QoS)"),
    ("dup", "bool", "DUP flag: a re-sent QoS 1/2 PUBLISH"),
    ("log_seq", "int64", "order in which this node logged its deliveries (per node and run)"),
)

COLUMNS = {PUBLISH: PUBLISH_COLUMNS, DELIVERY: DELIVERY_COLUMNS}


def schema_markdown() -> str:
    """Both logs as Markdown tables (docs/pipeline.md embeds them)."""
    out = []
    for kind in KINDS:
        out.append(f"`{kind}/` (format version {FORMAT_VERSION}):\n")
        out.append("| column | type | meaning |")
        out.append("|---|---|---|")
        for name, typ, meaning in COLUMNS[kind]:
            out.append(f"| `{name}` | `{typ}` | {meaning} |")
        out.append("")
    return "\n".join(out)
