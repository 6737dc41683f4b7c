"""When a node writes its peer links (server/mesh_node.py MeshNode): at the end of the loop
turn for what others wait on (flush_soon: the cluster's steps, interest, link changes),
within mesh.batch_delay for what can wait (flush_later: envelopes routed, end-to-end
acknowledgements), and once for all of it. A real event loop, turns counted (no timing);
the flush itself recorded."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from types import SimpleNamespace

from mqttmesh.config import load_config
from mqttmesh.server.mesh_node import MeshNode

LONG = 30.0  # a batch delay no turn of the loop comes near, however loaded the machine (set
# on the node past the option's maximum, 0.1 s, which a preempted test process could reach)


@contextmanager
def _mesh(delay: float) -> Iterator[tuple[MeshNode, list[int], asyncio.AbstractEventLoop]]:
    loop = asyncio.new_event_loop()
    try:
        config = load_config(None, {"mesh.cluster_secret": "s3cret", "mesh.batch_delay": min(delay, 0.1)})
        mesh = MeshNode(SimpleNamespace(loop=loop), config)
        mesh._batch_delay = delay
        flushed: list[int] = []
        mesh._send = lambda: flushed.append(1)  # type: ignore[method-assign]
        yield mesh, flushed, loop
    finally:
        loop.close()


def _turns(loop: asyncio.AbstractEventLoop, n: int = 3) -> None:
    for _ in range(n):
        loop.run_until_complete(asyncio.sleep(0))


def test_what_can_wait_waits_for_the_batch_delay_and_goes_once() -> None:
    with _mesh(LONG) as (mesh, flushed, loop):
        for _ in range(3):
            mesh.flush_later()
        _turns(loop)
        assert flushed == []
        assert mesh._flush_handle is not None and mesh._flush_delayed


def test_the_delayed_flush_comes() -> None:
    with _mesh(0.01) as (mesh, flushed, loop):
        mesh.flush_later()
        mesh.flush_later()
        loop.run_until_complete(asyncio.wait_for(_until(lambda: bool(flushed)), 10))
        _turns(loop)
        assert flushed == [1] and mesh._flush_handle is None


async def _until(cond) -> None:
    while not cond():
        await asyncio.sleep(0.005)


def test_what_others_wait_on_takes_the_waiting_along_at_the_end_of_the_turn() -> None:
    with _mesh(LONG) as (mesh, flushed, loop):
        mesh.flush_later()
        mesh.flush_soon()
        mesh.flush_later()
        _turns(loop)
        assert flushed == [1] and mesh._flush_handle is None


def test_without_a_delay_everything_goes_at_the_end_of_the_turn() -> None:
    with _mesh(0.0) as (mesh, flushed, loop):
        mesh.flush_later()
        mesh.flush_soon()
        _turns(loop)
        assert flushed == [1]


def test_a_flush_asked_for_during_a_flush_is_that_flush() -> None:
    with _mesh(LONG) as (mesh, flushed, loop):

        def send() -> None:  # (the links are handed their sends: they mark themselves dirty)
            flushed.append(1)
            mesh.flush_soon()
            mesh.flush_later()

        mesh._send = send  # type: ignore[method-assign]
        mesh.flush_soon()
        _turns(loop)
        assert flushed == [1] and mesh._flush_handle is None
        mesh.flush_soon()  # and the next one is asked for as before
        _turns(loop)
        assert flushed == [1, 1]
