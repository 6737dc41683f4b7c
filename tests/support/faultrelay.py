"""A fault-injecting TCP relay for mesh tests: put it between two nodes, then break the link.

It runs its own asyncio loop on a thread. Faults:
    block()    stop forwarding both ways but keep the connections open (a black hole:
               only keepalives can tell the link is dead)
    unblock()  forward again (what was held back is dropped, like a network that lost it)
    cut()      close every relayed connection and refuse new ones until unblock()
    delay(s, jitter=j)
               add s seconds (± j, uniformly, never reordering a direction's bytes) of one-way
               latency to everything forwarded

With ``record()`` it keeps every byte it forwards, per direction, for captures.
"""

from __future__ import annotations

import asyncio
import random
import threading
from collections import deque


class _Pipe(asyncio.Protocol):
    def __init__(self, relay: FaultRelay):
        self.relay = relay
        self.transport = None
        self.other: _Pipe | None = None
        self.pending: list[bytes] = []
        self.due = 0.0  # when the last delayed read is forwarded (a later one never before it)
        # the delayed reads, oldest first: forwarded in this order by ``_drain`` (timers due at
        # the same instant run in no promised order: asyncio's heap; a load made two reads due
        # at once swap places, test_bench_mesh.py)
        self.delayed: deque[bytes] = deque()

    def connection_made(self, transport):
        self.transport = transport
        self.relay._pipes.add(self)

    def data_received(self, data):
        relay = self.relay
        if relay.blocked:
            return  # lost in the black hole
        if relay.recording is not None:
            relay.recording.append((isinstance(self, _Inbound), data))
        if relay.latency or self.delayed:  # (behind what a delay still holds, if it was just lifted)
            now = relay.loop.time()
            jitter = relay.rng.uniform(-relay.jitter, relay.jitter) if relay.jitter else 0.0
            self.due = max(self.due, now + relay.latency + jitter)
            self.delayed.append(data)
            relay.loop.call_at(self.due, self._drain)
        else:
            self._forward(data)

    def _drain(self):
        """One delayed read is due: the oldest goes (each read has its timer, due no earlier
        than the one before it, so the k-th timer to run finds the k-th read's time come)."""
        self._forward(self.delayed.popleft())

    def _forward(self, data):
        other = self.other
        if other is None or other.transport is None:
            self.pending.append(data)
        elif not other.transport.is_closing() and not self.relay.blocked:
            other.transport.write(data)

    def connection_lost(self, exc):
        self.relay._pipes.discard(self)
        if self.other is not None and self.other.transport is not None:
            self.other.transport.close()


class _Inbound(_Pipe):
    def connection_made(self, transport):
        super().connection_made(transport)
        if self.relay.refusing:
            transport.close()
            return
        self.relay.loop.create_task(self._dial())

    async def _dial(self):
        relay = self.relay
        try:
            _, out = await relay.loop.create_connection(lambda: _Pipe(relay), relay.target_host, relay.target_port)
        except OSError:
            self.transport.close()
            return
        out.other, self.other = self, out
        for data in self.pending:
            out.transport.write(data)
        self.pending.clear()


class FaultRelay:
    def __init__(self, target_host: str, target_port: int, host: str = "127.0.0.1"):
        self.target_host, self.target_port = target_host, target_port
        self.host = host
        self.blocked = False
        self.refusing = False
        self.latency = 0.0
        self.jitter = 0.0
        self.rng = random.Random(target_port)  # the jitter: one seeded stream per relay
        self.recording: list[tuple[bool, bytes]] | None = None  # (from the dialling side?, bytes)
        self._pipes: set[_Pipe] = set()
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True, name="faultrelay")
        self._thread.start()
        self._server = self._call(self._listen())
        self.port = self._server.sockets[0].getsockname()[1]

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def _call(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(10)

    async def _listen(self):
        return await self.loop.create_server(lambda: _Inbound(self), self.host, 0)

    def _run(self, fn):
        async def go():
            fn()

        self._call(go())

    def block(self) -> None:
        self._run(lambda: setattr(self, "blocked", True))

    def unblock(self) -> None:
        def go():
            self.blocked = False
            self.refusing = False

        self._run(go)

    def cut(self) -> None:
        def go():
            self.refusing = True
            for pipe in list(self._pipes):
                if pipe.transport is not None:
                    pipe.transport.abort()

        self._run(go)

    def record(self) -> None:
        self._run(lambda: setattr(self, "recording", []))

    def captured(self, from_dialler: bool) -> bytes:
        """Everything forwarded in one direction so far."""
        out = []

        async def go():
            out.append(b"".join(d for side, d in (self.recording or []) if side == from_dialler))

        self._call(go())
        return out[0]

    def delay(self, seconds: float, jitter: float = 0.0) -> None:
        def go():
            self.latency = seconds
            self.jitter = min(jitter, seconds)

        self._run(go)

    def close(self) -> None:
        def go():
            self._server.close()
            for pipe in list(self._pipes):
                if pipe.transport is not None:
                    pipe.transport.abort()

        try:
            self._run(go)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(5)
            self.loop.close()
