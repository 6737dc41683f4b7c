"""Loopback ports for the nodes the benchmarks and tests start, below the kernel's ephemeral range.

A port the kernel picked (bind to 0) is in its ephemeral range (32768-60999 by default), which
it also hands out as the local port of outgoing connections: while a node is stopped or killed,
an outgoing connection may take its port, and the restart fails with "address already in use"
(seen on a clean-clone test run); and a client that keeps dialling a stopped node's port may
be given that very port as its own and connect to itself. Ports here come from 20000-31999
instead, never the same one twice in a process, drawn from a stream seeded by the PID so that
two processes rarely meet; a port something listens on now is skipped.
"""

from __future__ import annotations

import os
import random
import socket

__all__ = ["free_port"]

LOW, HIGH = 20000, 32000
_given: set[int] = set()
_pick = random.Random(os.getpid())


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port of ``host`` nobody listens on now, outside the ephemeral range."""
    for _ in range(1000):
        port = _pick.randrange(LOW, HIGH)
        if port in _given:
            continue
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
        _given.add(port)
        return port
    raise RuntimeError(f"no free port in {LOW}-{HIGH - 1}")
