"""Real broker processes on loopback, free ports, condition waits.

Every broker runs as its own process (``python -m mqttmesh broker``) on a port
from ``free_port`` (bench/ports.py: below the kernel's ephemeral range; the node
writes the bound port to a file), which it keeps across restarts.
Whoever starts a ``BrokerProcess`` stops it (the ``broker_factory`` fixture of
tests/conftest.py does so at teardown, by PID).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from bench.ports import free_port


def wait_for(predicate, timeout: float = 10.0, interval: float = 0.01, what: str = "condition"):
    """Poll ``predicate`` until it returns a truthy value; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


class BrokerProcess:
    """One `mqttmesh broker` process; start/stop/kill/restart keep the same port and data."""

    def __init__(self, workdir: Path, name: str, args: list[str]):
        self.workdir = workdir
        self.name = name
        self.args = list(args)
        self.host = "127.0.0.1"
        self.port = 0
        self.proc: subprocess.Popen | None = None
        self.log_path = workdir / f"{name}.log"
        self.port_file = workdir / f"{name}.port"

    def start(self, timeout: float = 15.0) -> BrokerProcess:
        if self.port_file.exists():
            self.port_file.unlink()
        if not self.port:
            self.port = free_port()
        port = str(self.port)
        cmd = [
            sys.executable,
            "-m",
            "mqttmesh",
            "broker",
            "--host",
            self.host,
            "--port",
            port,
            "--port-file",
            str(self.port_file),
            "--node-id",
            self.name,
            "--sys-interval",
            "0",
            *self.args,
        ]
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, cwd=self.workdir, env={**os.environ, "PYTHONUNBUFFERED": "1"}
        )
        log.close()

        def ready():
            if self.proc.poll() is not None:
                raise AssertionError(f"broker {self.name} exited with {self.proc.returncode}:\n{self.log()}")
            return self.port_file.exists() and self.port_file.read_text().strip()

        self.port = int(wait_for(ready, timeout, what=f"broker {self.name} to listen"))
        return self

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout: float = 10.0) -> int | None:
        """Graceful stop (SIGTERM), then SIGKILL if it does not end in time."""
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else None
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait(5)

    def kill(self) -> None:
        """kill -9: no chance to flush or say goodbye."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)

    def restart(self) -> BrokerProcess:
        self.stop()
        return self.start()
