"""The node's options: one schema for the TOML keys, the command-line flags and the docs.

Data only: each ``Option`` (option.py) names its section and key, type, default, limits and
help text. Those of who may connect and how (``auth``, ``tls``, ``websocket``, ``http``) are
in options_access.py, those of MQTT 5 and shared subscriptions (``mqtt``) in options_mqtt5.py.
config.py reads a file and flags against it; docs/operations.md embeds
the reference it generates (``config.reference_markdown``), in the order of ``OPTIONS``.
"""

from __future__ import annotations

from .option import Option
from .options_access import AUTH_OPTIONS, LISTENER_OPTIONS
from .options_mqtt5 import MQTT5_OPTIONS

__all__ = ["Option", "OPTIONS"]


_MiB = 1024 * 1024

_NODE: list[Option] = [
    Option("", "host", str, "127.0.0.1", "address to listen on for MQTT clients"),
    Option("", "port", int, 1883, "TCP port for MQTT clients (0 picks a free one)", 0, 65535),
    Option("", "node_id", str, "", "name of this node in the mesh and in logs (default: host-port)"),
    Option("", "data_dir", str, "", "directory of the durable store; empty runs in memory"),
    Option("", "log_level", str, "info", "logging level", choices=("debug", "info", "warning", "error")),
    Option("", "port_file", str, "", "write the bound port to this file once listening"),
    Option(
        "limits",
        "max_packet_size",
        int,
        _MiB,
        "largest packet accepted, in bytes; larger closes the connection",
        16,
        268_435_460,
    ),
    Option("limits", "max_inflight", int, 100, "outbound QoS 1/2 messages in flight per client", 1, 65535),
    Option(
        "limits",
        "max_queued",
        int,
        10_000,
        "messages queued per session (behind the inflight window or while offline)",
        0,
        100_000_000,
    ),
    Option("limits", "queue_qos0", bool, False, "queue QoS 0 messages for offline persistent sessions"),
    Option("limits", "drop_policy", str, "oldest", "what a full session queue drops", choices=("oldest", "newest")),
    Option("limits", "max_awaiting_rel", int, 1000, "inbound QoS 2 messages awaiting PUBREL per client", 1, 65535),
    Option("limits", "max_connections", int, 100_000, "simultaneous client connections (0 = no limit)", 0),
    Option(
        "limits",
        "connection_rate",
        float,
        0.0,
        "new connections accepted per second, burst of one second (0 = no limit)",
        0,
    ),
    Option("limits", "max_client_id_length", int, 65535, "longest ClientId accepted, in bytes", 23, 65535),
    Option(
        "limits",
        "connect_timeout",
        float,
        10.0,
        "seconds from accepting a connection to its CONNECT "
        "(the TLS handshake included; a peer link, either side: to finish the peer handshake)",
        0.1,
    ),
    Option(
        "limits",
        "max_write_buffer",
        int,
        16 * _MiB,
        "bytes waiting to be sent to one client; above "
        "it QoS 0 messages for that client are dropped (counted), and a client above it for longer "
        "than slow_consumer_timeout is disconnected",
        65536,
    ),
    Option(
        "limits",
        "slow_consumer_timeout",
        float,
        5.0,
        "seconds an online client may stay unable to take "
        "messages (congested without progress, or over max_write_buffer) before it is disconnected "
        "(TCP reset)",
        0.1,
    ),
    Option(
        "limits",
        "backpressure_timeout",
        float,
        1.0,
        "seconds a congested client may make no "
        "progress at all before it stops holding back the publishers that feed it (until then "
        "they are read no faster than it drains); after it that client's messages are queued or "
        "dropped by its own limits (0 = publishers are never held back)",
        0,
    ),
    Option(
        "limits",
        "read_slice",
        float,
        0.25,
        "seconds of clients' input a node handles in one turn of its event loop; what it read "
        "beyond waits, in order, for the next turn (reading those clients paused meanwhile), so "
        "its timers (link keepalives, the cluster's clock) run however many publishers flood it",
        0.001,
        10.0,
    ),
    Option(
        "limits",
        "buffer_memory",
        int,
        512 * _MiB,
        "bytes all connections together may hold in "
        "input and output buffers; above it the node stops reading from clients until they are "
        "below three quarters of it",
        _MiB,
    ),
    Option(
        "limits",
        "max_connect_size",
        int,
        65536,
        "largest CONNECT accepted, in bytes: before CONNACK nothing else is read",
        128,
        268_435_460,
    ),
    Option(
        "limits",
        "preauth_memory",
        int,
        32 * _MiB,
        "bytes all connections that have not been "
        "answered CONNACK yet may hold together; a connection that would go beyond it is closed",
        65536,
    ),
    Option("limits", "max_qos", int, 2, "highest QoS granted to subscriptions", 0, 2),
]

_STORE_AND_MESH: list[Option] = [
    Option(
        "store",
        "synchronous",
        str,
        "normal",
        "SQLite synchronous mode: normal survives a crash of the process, full also a power loss",
        choices=("normal", "full"),
        flag_name="--store-synchronous",
    ),
    Option(
        "store",
        "commit_interval",
        float,
        0.005,
        "seconds at least from the start of one group commit to the next: under steady load a "
        "commit carries more changes (a message queued and removed within one cancels out) for "
        "at most this much more wait before an acknowledgement that needs the store; a commit "
        "due when the last started longer ago starts at once. 0: as soon as the last ended "
        "(docs/performance.md section 2)",
        0.0,
        0.1,
        flag_name="--store-commit-interval",
    ),
    Option("mesh", "peers", list, [], "peer nodes to dial, HOST:PORT (repeat --peer)", flag_name="--peer"),
    Option(
        "mesh",
        "cluster_secret",
        str,
        "",
        "shared secret that peer links prove they hold; setting it (or secret_file) makes this node a mesh node",
    ),
    Option("mesh", "secret_file", str, "", "file holding the cluster secret (first line)"),
    Option(
        "mesh",
        "connect",
        str,
        "all",
        "dial nodes learned from advertisements (all: a full mesh) or only the configured peers",
        choices=("all", "configured"),
    ),
    Option("mesh", "advertise", str, "", "HOST:PORT other nodes should dial to reach this one (default: host:port)"),
    Option(
        "mesh",
        "keepalive",
        float,
        1.0,
        "seconds between PINGREQs on a peer link; a link silent for 3 x this is dead",
        0.05,
        600,
        flag_name="--mesh-keepalive",
    ),
    Option(
        "mesh",
        "hop_limit",
        int,
        255,
        "hops an envelope may travel before it is dropped (a safety net: the duplicate filter stops loops)",
        1,
        255,
    ),
    Option(
        "mesh",
        "retransmit_after",
        float,
        2.0,
        "seconds before a QoS 1/2 message not acknowledged end to end is sent again (doubling up to 30 s)",
        0.05,
    ),
    Option(
        "mesh",
        "custody_limit",
        int,
        100_000,
        "QoS 1/2 messages an origin node holds until their destinations acknowledge them",
        0,
    ),
    Option(
        "mesh",
        "custody_timeout",
        float,
        3600.0,
        "seconds an origin keeps trying to reach a destination of a QoS 1/2 message",
        1,
    ),
    Option(
        "mesh",
        "shared_reroute",
        float,
        5.0,
        "seconds a node chosen for a shared group's QoS 1/2 message may be out of reach (its "
        "members gone with it, most likely) before the group's member is chosen again on "
        "another node (a re-send, under a new id)",
        0.5,
        3600.0,
    ),
    Option(
        "mesh",
        "reorder_wait",
        float,
        10.0,
        "seconds a QoS 1/2 message that overtook an earlier one of its origin waits for it before it is "
        "delivered anyway (the origin is asked for the earlier one at once)",
        0,
    ),
    Option(
        "mesh",
        "reorder_limit",
        int,
        50_000,
        "QoS 1/2 messages a node holds back at most while they wait for an earlier one of their origin "
        "(beyond it the oldest is delivered out of order)",
        0,
    ),
    Option(
        "mesh",
        "replication",
        int,
        3,
        "nodes that hold each persistent session (its home: a majority of them must be in reach to serve it) "
        "and each retained topic (rendezvous hashing)",
        1,
        16,
    ),
    Option(
        "mesh",
        "will_delay",
        float,
        0.5,
        "seconds a node must stay unreachable before the wills of its clients are published by their registrar",
        0,
    ),
    Option(
        "mesh",
        "claim_timeout",
        float,
        1.0,
        "seconds a CONNECT waits for the ClientId's registrar before the node serves the client anyway "
        "(a clean session) or refuses it (a persistent one); also how long a node still forming its "
        "links lets a CONNECT wait for them",
        0.1,
    ),
    Option(
        "mesh",
        "dedup_window",
        int,
        262144,
        "recent message ids each node remembers per origin to drop duplicates (retransmissions, transient loops)",
        1024,
    ),
    Option(
        "mesh",
        "max_age",
        float,
        3600.0,
        "seconds an unreachable node is remembered before its advertisements are forgotten",
        10,
    ),
    Option("mesh", "status_interval", float, 1.0, "seconds between $SYS/mesh/status updates", 0.05),
    Option(
        "mesh",
        "batch_delay",
        float,
        0.005,
        "seconds a node gathers the messages it routes to its peers and its acknowledgements "
        "before writing them: fewer, fuller link writes and fewer wake-ups of the peers, for at "
        "most this much more latency per hop (timers count whole milliseconds; at 1,000 msgs/s "
        "2 ms cost a hop 1.2-1.4 times the CPU of 5 ms: docs/performance.md); 0: written at the "
        "end of each loop turn. The cluster's steps that a client's frame waits for (a persistent "
        "session's QoS 2 steps, registrations) go at the end of the turn and take what waits "
        "along, and so do 32 messages routed in one turn; the steps nothing waits for (a "
        "persistent subscriber's QoS 1 acknowledgements), their answers and the messages a "
        "holder forwards to a client's new node wait like the rest",
        0.0,
        0.1,
        flag_name="--mesh-batch-delay",
    ),
]

_MESH_TLS_SYS_ARCHIVE: list[Option] = [
    Option(
        "mesh",
        "tls",
        bool,
        False,
        "dial peers with TLS (their advertised or configured addresses "
        "are then TLS ports) and check their certificates against tls.ca_file",
        flag_name="--mesh-tls",
    ),
    Option(
        "mesh",
        "tls_check_hostname",
        bool,
        False,
        "also check that a peer's certificate names the host dialled",
        flag_name="--mesh-tls-check-hostname",
    ),
    Option(
        "mesh",
        "tls_mutual",
        bool,
        False,
        "with mesh.tls: the TLS listener asks for client certificates "
        "(clients may still connect without one) and a peer link needs one signed by tls.ca_file",
        flag_name="--mesh-tls-mutual",
    ),
    Option(
        "sys",
        "interval",
        float,
        10.0,
        "seconds between $SYS/broker/... updates (0 = off)",
        0,
        flag_name="--sys-interval",
    ),
    Option(
        "archive",
        "enabled",
        bool,
        False,
        "write the messages published at this node (and, with "
        "delivery_log, what it delivered) as Parquet for the pipeline (docs/pipeline.md)",
        flag_name="--archive",
    ),
    Option("archive", "dir", str, "", "archive directory (default: DATA_DIR/archive)", flag_name="--archive-dir"),
    Option(
        "archive",
        "filters",
        list,
        ["#"],
        "topic filters of the messages archived (repeat --archive-filter)",
        flag_name="--archive-filter",
    ),
    Option(
        "archive",
        "delivery_log",
        bool,
        False,
        "also log every PUBLISH sent to a client: message id, ClientId, node, time, QoS, DUP",
        flag_name="--archive-delivery-log",
    ),
    Option(
        "archive",
        "flush_interval",
        float,
        10.0,
        "longest time, in seconds, a record waits in memory before it is written",
        0.1,
        86400,
        flag_name="--archive-flush-interval",
    ),
    Option(
        "archive",
        "flush_rows",
        int,
        200_000,
        "records per file; a busy node writes a file when it has "
        "this many (fewer, larger files also cost the event loop less)",
        1,
        100_000_000,
        flag_name="--archive-flush-rows",
    ),
    Option(
        "archive",
        "flush_bytes",
        int,
        64 * _MiB,
        "payload bytes per file (with every topic archived, bytes of the clients' packets)",
        1024,
        flag_name="--archive-flush-bytes",
    ),
    Option(
        "archive",
        "max_queue_rows",
        int,
        1_000_000,
        "records handed to the writer and not yet in a "
        "file (at least 2 x flush_rows); beyond it new records are dropped and counted",
        2,
        flag_name="--archive-max-queue-rows",
    ),
    Option(
        "archive",
        "max_queue_bytes",
        int,
        256 * _MiB,
        "their bytes, counted as for flush_bytes (at "
        "least 2 x flush_bytes); beyond it new records are dropped and counted",
        2048,
        flag_name="--archive-max-queue-bytes",
    ),
    Option(
        "archive",
        "compression",
        str,
        "zstd",
        "Parquet compression",
        choices=("zstd", "snappy", "gzip", "none"),
        flag_name="--archive-compression",
    ),
    Option(
        "archive",
        "format",
        str,
        "delta",
        "parquet: each log a directory of date=/hour= folders of Parquet files (format 1); delta: "
        "each log a Delta Lake table, a flush one atomic commit, compacted and expired by the "
        "writer (docs/pipeline.md)",
        choices=("parquet", "delta"),
        flag_name="--archive-format",
    ),
    Option(
        "archive",
        "compact_interval",
        float,
        3600.0,
        "delta: seconds between two compactions of each log by the writer (0 = never; "
        "`mqttmesh archive compact` does one at any time)",
        0,
        flag_name="--archive-compact-interval",
    ),
    Option(
        "archive",
        "compact_target_bytes",
        int,
        128 * _MiB,
        "delta: the size a compaction makes its files (small files of one hour merged up to it)",
        _MiB,
        flag_name="--archive-compact-target-bytes",
    ),
    Option(
        "archive",
        "retention",
        float,
        0.0,
        "delta: seconds of messages kept; older hours are removed at each compaction (0 = keep "
        "everything; 2592000 = 30 days; `mqttmesh archive expire` does it at any time)",
        0,
        flag_name="--archive-retention",
    ),
    Option(
        "archive",
        "vacuum_retention",
        float,
        3600.0,
        "delta: seconds a file removed from a table (compacted, expired) stays on disk for the "
        "readers of an older version, and a file no commit names (a writer killed mid-write) "
        "before it is deleted",
        0,
        flag_name="--archive-vacuum-retention",
    ),
    Option(
        "archive",
        "log_interval",
        float,
        10.0,
        "seconds between two log lines about dropped records",
        0.1,
        flag_name="--archive-log-interval",
    ),
    Option(
        "archive",
        "stop_timeout",
        float,
        60.0,
        "seconds a stopping node waits for the archive writer to write what it holds before it kills the writer",
        0.1,
        flag_name="--archive-stop-timeout",
    ),
    Option(
        "archive",
        "writer_nice",
        int,
        10,
        "CPU priority the archive writer process gives up (nice): on a "
        "saturated machine delivery goes first and a writer that falls behind drops",
        0,
        19,
        flag_name="--archive-writer-nice",
    ),
    Option(
        "archive",
        "writer_idle",
        bool,
        True,
        "run the archive writer at idle CPU priority (Linux "
        "SCHED_IDLE) while it keeps up, so that it only takes CPU time nothing else wants; once its "
        "pipe backs up it runs at writer_nice until it has caught up",
        flag_name="--archive-writer-idle",
    ),
]

# the order of the reference in docs/operations.md
OPTIONS: list[Option] = [
    *_NODE,
    *MQTT5_OPTIONS,
    *AUTH_OPTIONS,
    *_STORE_AND_MESH,
    *LISTENER_OPTIONS,
    *_MESH_TLS_SYS_ARCHIVE,
]
