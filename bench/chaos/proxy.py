"""Fault proxies for peer links: one TCP proxy per ordered pair a->b (a dials the proxy).

All proxies share one asyncio loop on one thread (``ProxyLoop``). A proxy's state comes
from the faults that hold it, so overlapping faults compose: any ``cut`` holding it makes
it close every relayed connection and refuse new ones; otherwise any ``blackhole`` keeps
the connections and drops every byte (only keepalives can tell); with none it forwards.
``hold(token, mode)`` / ``release(token)`` are called from any thread. At a heal, a relayed
connection that lost bytes in the black hole is closed: its byte stream has a gap no TCP
would let through, as a real connection would have timed out.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

CUT, BLACKHOLE = "cut", "blackhole"


class _Pipe(asyncio.Protocol):
    def __init__(self, proxy: FaultProxy, inbound: bool):
        self.proxy = proxy
        self.inbound = inbound
        self.transport: asyncio.Transport | None = None
        self.other: _Pipe | None = None
        self.pending: list[bytes] = []
        self.lost = False

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        self.proxy.pipes.add(self)
        if self.inbound:
            if self.proxy.mode == CUT:
                transport.abort()
                return
            self.proxy.loop.create_task(self._dial())

    async def _dial(self) -> None:
        proxy = self.proxy
        try:
            transport, out = await proxy.loop.create_connection(
                lambda: _Pipe(proxy, False), "127.0.0.1", proxy.target_port
            )
        except OSError:
            if self.transport is not None:
                self.transport.abort()
            return
        if self.transport is None or self.transport.is_closing() or proxy.mode == CUT:
            transport.abort()
            return
        out.other, self.other = self, out
        for data in self.pending:
            transport.write(data)
        self.pending.clear()

    def data_received(self, data: bytes) -> None:
        proxy = self.proxy
        if proxy.mode is not None:
            proxy.dropped += len(data)
            self.lost = True
            return  # lost in the black hole
        proxy.forwarded += len(data)
        other = self.other
        if other is None or other.transport is None:
            self.pending.append(data)
        elif not other.transport.is_closing():
            other.transport.write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.proxy.pipes.discard(self)
        if self.other is not None and self.other.transport is not None:
            self.other.transport.abort()


class FaultProxy:
    """Listens on its own free port on 127.0.0.1 and relays to ``target_port``."""

    def __init__(self, owner: ProxyLoop, name: str, target_port: int):
        self.owner = owner
        self.loop = owner.loop
        self.name = name
        self.target_port = target_port
        self.holds: dict[str, str] = {}  # token -> mode
        self.mode: str | None = None
        self.pipes: set[_Pipe] = set()
        self.forwarded = 0
        self.dropped = 0
        self.server = owner.call(self._listen())
        self.port: int = self.server.sockets[0].getsockname()[1]

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def _listen(self) -> asyncio.base_events.Server:
        return await self.loop.create_server(lambda: _Pipe(self, True), "127.0.0.1", 0)

    def _apply(self) -> None:
        modes = set(self.holds.values())
        self.mode = CUT if CUT in modes else (BLACKHOLE if modes else None)
        for pipe in list(self.pipes):
            if pipe.transport is not None and (self.mode == CUT or (self.mode is None and pipe.lost)):
                pipe.transport.abort()

    def hold(self, token: str, mode: str) -> None:
        def go() -> None:
            self.holds[token] = mode
            self._apply()

        self.owner.run(go)

    def release(self, token: str) -> None:
        def go() -> None:
            self.holds.pop(token, None)
            self._apply()

        self.owner.run(go)

    def close(self) -> None:
        def go() -> None:
            self.server.close()
            for pipe in list(self.pipes):
                if pipe.transport is not None:
                    pipe.transport.abort()

        self.owner.run(go)


class ProxyLoop:
    """The thread and event loop every proxy of a run lives on."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True, name="chaos-proxies")
        self.thread.start()
        self.proxies: list[FaultProxy] = []

    def call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(10)

    def run(self, fn: Any) -> None:
        async def go() -> None:
            fn()

        self.call(go())

    def proxy(self, name: str, target_port: int) -> FaultProxy:
        p = FaultProxy(self, name, target_port)
        self.proxies.append(p)
        return p

    def close(self) -> None:
        try:
            for p in self.proxies:
                p.close()
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(5)
            if not self.thread.is_alive():
                self.loop.close()
