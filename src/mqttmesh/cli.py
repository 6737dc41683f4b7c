"""The `mqttmesh` command: broker, passwd, and the tools around them."""

from __future__ import annotations

import argparse
import asyncio
import getpass
import logging
import signal
import sys

from . import __version__
from .auth import ConfigError, PasswordFile
from .config import add_flags, load_config, overrides_from_args, reference_markdown

log = logging.getLogger("mqttmesh")


def _setup_logging(level: str) -> None:
    logging.basicConfig(level=getattr(logging, level.upper()),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")


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
    _setup_logging(config.log_level)
    loop_kind = _install_loop_policy()

    async def serve() -> int:
        loop = asyncio.get_running_loop()
        try:
            node = Node(config, loop)
            await node.start()
        except (ConfigError, StoreError) as exc:
            print(f"mqttmesh: {exc}", file=sys.stderr)
            return 2
        except OSError as exc:
            print(f"mqttmesh: cannot listen on {config.host}:{config.port}: {exc.strerror or exc}",
                  file=sys.stderr)
            return 1
        log.info("event loop: %s", loop_kind)
        stop = asyncio.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
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
            pwfile.set(args.user, password, args.iterations)
        pwfile.save()
    except ConfigError as exc:
        print(f"mqttmesh passwd: {exc}", file=sys.stderr)
        return 2
    return 0


def cmd_config_reference(args: argparse.Namespace) -> int:
    sys.stdout.write(reference_markdown())
    return 0


def cmd_run_local(args: argparse.Namespace) -> int:
    """What `make run` starts: a broker on 127.0.0.1:1883 with a how-to."""
    print(f"""
mqttmesh {__version__}: starting a broker on {args.host}:{args.port}  (Ctrl-C stops it)

Try it from another terminal:
    mosquitto_sub -h {args.host} -p {args.port} -t 'demo/#' -v
    mosquitto_pub -h {args.host} -p {args.port} -t demo/hello -m 'hello mesh'
""", flush=True)
    argv = ["--host", args.host, "--port", str(args.port)]
    if args.data_dir:
        argv += ["--data-dir", args.data_dir]
    return main(["broker", *argv])


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

    p = sub.add_parser("run-local", help="start a local broker and print how to try it")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=1883)
    p.add_argument("--data-dir", default="")
    p.set_defaults(func=cmd_run_local)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except KeyboardInterrupt:
        return 130
