"""The `mqttmesh` command: broker, passwd, and the tools around them."""

from __future__ import annotations

import argparse
import asyncio
import getpass
import logging
import os
import signal
import sys
import threading
import time

from . import __version__
from .auth import SALT_BYTES, ConfigError, PasswordFile
from .config import add_flags, load_config, overrides_from_args, reference_markdown

log = logging.getLogger("mqttmesh")


class _LogFormat(logging.Formatter):
    """The standard formatter, its time text made once a second: a node logs a line or two
    per connection, and at thousands of connections a second localtime and strftime for
    each line were a measurable part of a connect (issue 26). The text is the same."""

    _second: int | None = None
    _text = ""

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:  # noqa: N802
        if datefmt is not None:
            return super().formatTime(record, datefmt)
        second = int(record.created)
        if second != self._second:
            self._text = time.strftime(self.default_time_format, self.converter(second))
            self._second = second
        msec = self.default_msec_format
        return msec % (self._text, record.msecs) if msec else self._text


class _TurnFlush(logging.StreamHandler):
    """The standard stream handler, whose lines written on the event loop's thread reach the
    stream's file once that turn of the loop is over, together (``attach``): a node logs a
    line or two per connection, and a system call to write each was a measurable part of a
    connect (issue 26). From another thread, before ``attach`` and once the loop has stopped,
    a line is flushed at once, as the standard handler does; a line waits at most for the
    end of its turn (the node's housekeeping turns the loop every second)."""

    def __init__(self) -> None:
        super().__init__()
        self.loop: asyncio.AbstractEventLoop | None = None
        self._thread = 0
        self._due = False  # a flush is scheduled at the end of this turn

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        stream = self.stream
        try:
            fd = stream.fileno()
        except (AttributeError, OSError, ValueError):
            fd = -1  # (a stream of no file: nothing to save)
        if fd >= 0:
            # stderr writes each line at once (unbuffered when it is no terminal): the same
            # file, buffered, for this handler's lines (closefd=False: stderr stays open)
            self.setStream(
                open(fd, "w", buffering=1 << 16, encoding=stream.encoding, errors=stream.errors, closefd=False)  # noqa: SIM115
            )
        self.loop = loop
        self._thread = threading.get_ident()

    def flush(self) -> None:
        loop = self.loop
        if loop is not None and threading.get_ident() == self._thread and loop.is_running():
            if not self._due:
                self._due = True
                loop.call_soon(self._flush_now)
            return
        super().flush()

    def _flush_now(self) -> None:
        self._due = False
        super().flush()


def _setup_logging(level: str) -> _TurnFlush:
    handler = _TurnFlush()
    handler.setFormatter(_LogFormat("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=getattr(logging, level.upper()), handlers=[handler])
    # what no line of the format shows is not gathered for each record (the logging HOWTO's
    # "Optimization"): the caller's file and line (a walk up the stack), thread and process
    logging._srcfile = None
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    return handler


def _install_loop_policy() -> str:
    try:
        import uvloop
    except ImportError:
        return "asyncio"
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    return "uvloop"


def cmd_broker(args: argparse.Namespace) -> int:
    from .server.node import Node
    from .server.sqlite_store import StoreError

    try:
        config = load_config(args.config, overrides_from_args(args))
    except ConfigError as exc:
        print(f"mqttmesh: config error: {exc}", file=sys.stderr)
        return 2
    handler = _setup_logging(config.log_level)
    loop_kind = _install_loop_policy()

    async def serve() -> int:
        loop = asyncio.get_running_loop()
        handler.attach(loop)
        # signals first: a SIGTERM that arrives while we start still stops us gracefully
        stop = asyncio.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        try:
            node = Node(config, loop)
            await node.start()
        except (ConfigError, StoreError) as exc:
            print(f"mqttmesh: {exc}", file=sys.stderr)
            return 2
        except OSError as exc:
            print(f"mqttmesh: cannot listen on {config.host}:{config.port}: {exc.strerror or exc}", file=sys.stderr)
            return 1
        log.info("event loop: %s", loop_kind)

        def reread() -> list[str]:
            # files and log level again (Node.reload); a config file with an error changes
            # nothing (ConfigError, for the caller)
            return node.reload(load_config(args.config, overrides_from_args(args)))

        def reload() -> None:  # SIGHUP
            try:
                reread()
            except ConfigError as exc:
                log.error("reload: %s; the configuration in force is kept", exc)

        node.reread = reread
        loop.add_signal_handler(signal.SIGHUP, reload)
        await stop.wait()
        log.info("stopping")
        await node.stop()
        return 0

    return asyncio.run(serve())


def cmd_passwd(args: argparse.Namespace) -> int:
    try:
        pwfile = PasswordFile.load(args.file, missing_ok=True)
        if args.delete:
            if not pwfile.delete(args.user):
                print(f"mqttmesh passwd: no user {args.user!r} in {args.file}", file=sys.stderr)
                return 1
        else:
            if args.password is not None:
                password = args.password
            elif args.stdin or not sys.stdin.isatty():
                password = sys.stdin.readline().rstrip("\r\n")
            else:
                password = getpass.getpass(f"Password for {args.user}: ")
                if getpass.getpass("Again: ") != password:
                    print("mqttmesh passwd: passwords differ", file=sys.stderr)
                    return 1
            if not password:
                print("mqttmesh passwd: empty password refused", file=sys.stderr)
                return 1
            pwfile.set(args.user, password, args.iterations, salt=os.urandom(SALT_BYTES))
        pwfile.save()
    except ConfigError as exc:
        print(f"mqttmesh passwd: {exc}", file=sys.stderr)
        return 2
    return 0


def cmd_config_reference(args: argparse.Namespace) -> int:
    sys.stdout.write(reference_markdown())
    return 0


def cmd_mesh_status(args: argparse.Namespace) -> int:
    import json

    from .admin import fetch_status, format_status

    try:
        password = args.password if args.password is not None else os.environ.get("MQTTMESH_PASSWORD")
        status = fetch_status(
            args.host, args.port, args.timeout, args.username, password.encode() if password is not None else None
        )
    except (OSError, ValueError) as exc:
        print(f"mqttmesh mesh status: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(status, indent=2, sort_keys=True) if args.json else format_status(status))
    return 0


def cmd_cluster_up(args: argparse.Namespace) -> int:
    from .admin import LocalMesh

    try:
        cluster = LocalMesh(
            args.nodes,
            args.topology,
            args.base_port,
            args.host,
            args.secret,
            args.workdir,
            args.data,
            args.extra or [],
            args.seed,
            http_base_port=args.http_base_port,
            ws_base_port=args.ws_base_port,
        )
    except ValueError as exc:
        print(f"mqttmesh cluster up: {exc}", file=sys.stderr)
        return 2
    stop = []
    signal.signal(signal.SIGTERM, lambda *a: stop.append(1))
    # a shell that starts us in the background leaves SIGINT ignored; kill -INT (like Ctrl-C)
    # must still stop every node
    signal.signal(signal.SIGINT, signal.default_int_handler)
    print(
        f"mqttmesh {__version__}: starting {args.nodes} nodes, topology {args.topology} (logs in {cluster.workdir})",
        flush=True,
    )
    cluster.start()
    try:
        took = cluster.wait_converged(args.timeout)
        print(f"\nthe mesh converged in {took:.1f}s:")
        for i, name in enumerate(cluster.names):
            peers = ", ".join(sorted(cluster.expected_neighbours(i)))
            more = "".join(
                f"   {kind}://{cluster.host}:{port}{path}"
                for kind, port, path in (("ws", cluster.ws_ports[i], "/mqtt"), ("http", cluster.http_ports[i], "/"))
                if port
            )
            print(f"  {name}  mqtt://{cluster.host}:{cluster.ports[i]}{more}   links: {peers}")
        a, b = cluster.ports[0], cluster.ports[-1]
        h = cluster.http_ports[0]
        console = (
            f"\nThe console (the mesh live, the clients, a kick button), and the same on the command line:"
            f"\n    http://{cluster.host}:{h}/\n    mqttmesh ctl status --url http://{cluster.host}:{h}"
            if h
            else ""
        )
        print(
            f"""
Subscribe on one node and publish on another:
    mosquitto_sub -h {cluster.host} -p {a} -t 'demo/#' -v
    mosquitto_pub -h {cluster.host} -p {b} -t demo/hello -m 'hello from {cluster.names[-1]}'
What a node knows of the mesh:
    mqttmesh mesh status --port {a}{console}
Another node joining this mesh:
    mqttmesh broker --port {cluster.ports[-1] + 1} --cluster-secret {cluster.secret} --peer {cluster.host}:{a}

Ctrl-C stops every node.""",
            flush=True,
        )
        while not stop and all(p.poll() is None for p in cluster.procs):
            time.sleep(0.2)
        for name, p in zip(cluster.names, cluster.procs, strict=False):
            if p.poll() is not None and not stop:
                print(f"node {name} exited with {p.returncode}", file=sys.stderr)
    except KeyboardInterrupt:
        pass
    except (TimeoutError, RuntimeError) as exc:
        print(f"mqttmesh cluster up: {exc}", file=sys.stderr)
        cluster.stop()
        return 1
    print("stopping the mesh", flush=True)
    cluster.stop()
    return 0


def cmd_archive(args: argparse.Namespace) -> int:
    from .archive.cli import run

    return run(args)


def cmd_analyze(args: argparse.Namespace) -> int:
    from .pipeline.cli import run  # pyspark is imported only here, not by the broker

    return run(args)


def cmd_demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    return run_demo(args)


def cmd_simulate(args: argparse.Namespace) -> int:
    from .sim.cli import run  # the simulator (and matplotlib) only when asked for

    return run(args)


def cmd_ctl(args: argparse.Namespace) -> int:
    from .config import read_first_line
    from .ctl import Ctl, CtlError, run

    try:
        token = read_first_line("--token-file", args.token_file) if args.token_file else args.token
        return run(Ctl(args.url, token, args.timeout), args.ctl_command, args.argument, args.json)
    except (CtlError, ConfigError) as exc:
        print(f"mqttmesh ctl: {exc}", file=sys.stderr)
        return getattr(exc, "code", 2)


def cmd_run_local(args: argparse.Namespace) -> int:
    """What `make run` starts: a three-node full mesh on 127.0.0.1:1883-1885, its consoles and
    admin API on 8080-8082, MQTT over WebSocket on 9001-9003."""
    return main(
        [
            "cluster",
            "up",
            "--nodes",
            str(args.nodes),
            "--topology",
            "full",
            "--base-port",
            str(args.port),
            "--host",
            args.host,
            "--http-base-port",
            str(args.http_port),
            "--ws-base-port",
            str(args.ws_port),
        ]
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mqttmesh", description=__doc__)
    parser.add_argument("--version", action="version", version=f"mqttmesh {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("broker", help="run one broker node")
    add_flags(p)
    p.set_defaults(func=cmd_broker)

    p = sub.add_parser("passwd", help="add, change or delete a user in a password file")
    p.add_argument("file")
    p.add_argument("user")
    p.add_argument("-D", "--delete", action="store_true", help="delete the user")
    p.add_argument("-b", "--password", help="the password (otherwise prompted, or read from stdin)")
    p.add_argument("--stdin", action="store_true", help="read the password from standard input")
    p.add_argument("--iterations", type=int, default=100_000, help="PBKDF2 iterations")
    p.set_defaults(func=cmd_passwd)

    p = sub.add_parser("config-reference", help="print the configuration reference (Markdown)")
    p.set_defaults(func=cmd_config_reference)

    p = sub.add_parser("analyze", help="run a Spark job of the data pipeline over the archive (docs/pipeline.md)")
    from .pipeline.cli import add_arguments as add_analyze_arguments  # argparse only, no pyspark

    add_analyze_arguments(p)
    p.set_defaults(func=cmd_analyze)

    p = sub.add_parser("archive", help="the archive's Delta tables: info, compact, expire, convert (docs/pipeline.md)")
    from .archive.cli import add_arguments as add_archive_arguments  # argparse only

    add_archive_arguments(p)
    p.set_defaults(func=cmd_archive)

    p = sub.add_parser("demo", help="a sensor workload on a local mesh, then its traffic and payload reports")
    from .demo import add_arguments as add_demo_arguments

    add_demo_arguments(p)
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("simulate", help="run a scenario on the discrete-event simulator (docs/simulation.md)")
    from .sim.cli import add_arguments as add_simulate_arguments  # argparse only

    add_simulate_arguments(p)
    p.set_defaults(func=cmd_simulate)

    p = sub.add_parser("run-local", help="what `make run` starts: a local three-node mesh")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=1883, help="port of the first node")
    p.add_argument("--nodes", type=int, default=3)
    p.add_argument("--http-port", type=int, default=8080, help="the first node's console and admin API (0: none)")
    p.add_argument("--ws-port", type=int, default=9001, help="the first node's MQTT over WebSocket (0: none)")
    p.set_defaults(func=cmd_run_local)

    p = sub.add_parser("mesh", help="what a mesh node knows")
    msub = p.add_subparsers(dest="mesh_command", required=True)
    q = msub.add_parser("status", help="nodes, links, costs, tree, filters, counters of one node")
    q.add_argument("--host", default="127.0.0.1")
    q.add_argument("--port", type=int, default=1883)
    q.add_argument("--json", action="store_true", help="the raw status document")
    q.add_argument("--timeout", type=float, default=5.0)
    q.add_argument(
        "--username",
        help="user name to log in with (the ClientIds in the status need "
        "a verified user or an ACL grant of $SYS/mesh/clients)",
    )
    q.add_argument("--password", help="its password (default: $MQTTMESH_PASSWORD)")
    q.set_defaults(func=cmd_mesh_status)

    p = sub.add_parser("ctl", help="ask a node's admin API: status, clients, kick ID, reload")
    p.add_argument("ctl_command", choices=("status", "clients", "kick", "reload"))
    p.add_argument("argument", nargs="?", help="kick: the ClientId")
    p.add_argument(
        "--url",
        default=os.environ.get("MQTTMESH_URL", "http://127.0.0.1:8080"),
        help="the node's HTTP listener (default $MQTTMESH_URL or http://127.0.0.1:8080)",
    )
    p.add_argument("--token", default=os.environ.get("MQTTMESH_TOKEN"), help="bearer token (default $MQTTMESH_TOKEN)")
    p.add_argument("--token-file", help="file whose first line is the token")
    p.add_argument("--json", action="store_true", help="print the API's JSON")
    p.add_argument("--timeout", type=float, default=10.0)
    p.set_defaults(func=cmd_ctl)

    p = sub.add_parser("cluster", help="run a local mesh of several node processes")
    csub = p.add_subparsers(dest="cluster_command", required=True)
    q = csub.add_parser("up", help="start N nodes, wait until the mesh converged, stop them on Ctrl-C")
    q.add_argument("--nodes", type=int, default=3)
    q.add_argument("--topology", default="full", choices=("full", "ring", "line", "star", "random"))
    q.add_argument("--base-port", type=int, default=1883)
    q.add_argument("--host", default="127.0.0.1")
    q.add_argument("--secret", help="cluster secret (default: a random one)")
    q.add_argument("--workdir", help="directory for logs and data (default: a new temporary one)")
    q.add_argument("--data", action="store_true", help="give each node a data directory")
    q.add_argument("--seed", type=int, default=1, help="seed of the random topology")
    q.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for convergence")
    q.add_argument(
        "--http-base-port",
        type=int,
        default=0,
        help="node i serves the console and admin API on this port + i (0: none)",
    )
    q.add_argument(
        "--ws-base-port", type=int, default=0, help="node i serves MQTT over WebSocket on this port + i (0: none)"
    )
    q.add_argument("extra", nargs="*", help="more `mqttmesh broker` flags for every node (after --)")
    q.set_defaults(func=cmd_cluster_up)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except KeyboardInterrupt:
        return 130
