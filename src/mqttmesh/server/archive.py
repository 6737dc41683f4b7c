"""The archive on a running node: broker hooks, the flush timer, the writer thread, $SYS.

This is the asyncio side of ``mqttmesh.archive``: the Recorder (pure) takes the
records on the hot path, this module ticks it on a timer and logs what it drops,
and the ArchiveWriter thread writes the files. Nothing here waits for the disk
except ``stop``, which flushes everything once the clients are gone.
"""

from __future__ import annotations

import asyncio
import logging
import os

from ..archive.recorder import ArchiveLimits, Recorder
from ..auth import ConfigError
from ..config import Config

log = logging.getLogger("mqttmesh.archive")


class ArchiveService:
    def __init__(self, node, config: Config):
        self.node = node
        self.loop = node.loop
        get = config.get
        directory = get("archive.dir") or (os.path.join(config.data_dir, "archive") if config.data_dir else "")
        if not directory:
            raise ConfigError("archive.dir: the archive needs a directory (set archive.dir, or data_dir "
                              "to use DATA_DIR/archive)")
        self.directory = os.path.abspath(directory)
        limits = ArchiveLimits(flush_interval=get("archive.flush_interval"), flush_rows=get("archive.flush_rows"),
                               flush_bytes=get("archive.flush_bytes"),
                               max_queue_rows=get("archive.max_queue_rows"),
                               max_queue_bytes=get("archive.max_queue_bytes"))
        for problem in limits.problems():
            raise ConfigError(f"archive.{problem}")
        try:
            from ..archive.writer import ArchiveWriter
        except ImportError as exc:
            raise ConfigError(f"archive.enabled: the archive needs pyarrow ({exc}); "
                              f"install it with: pip install 'mqttmesh[pipeline]'") from None
        self.delivery_log = get("archive.delivery_log")
        loop_time, broker = self.loop.time, node.broker

        def clock() -> float:  # the clock of message timestamps (channel.py), so latencies compare
            return loop_time() + broker.wall_offset

        try:
            self.recorder = Recorder(limits, self._submit, clock, get("archive.filters"), self.delivery_log)
        except ValueError as exc:
            raise ConfigError(f"archive.filters: {exc}") from None
        self.limits = limits
        self.log_interval = get("archive.log_interval")
        self.sys_interval = get("sys.interval")
        self.writer = ArchiveWriter(self.directory, self.recorder, get("archive.compression"))
        self._timer: asyncio.TimerHandle | None = None
        self._logged_at = 0.0
        self._sys_at = 0.0
        self._dropped_since_log = 0
        # hooks go in now: sessions restored from the store pick up the delivery hook
        broker = node.broker
        broker.on_publish.append(self.recorder.publish_hook)
        if self.delivery_log:
            broker.delivery_hook = self.recorder.delivery_hook

    def _submit(self, chunk) -> None:
        self.writer.submit(chunk)

    def start(self) -> None:
        """Start the writer once the node knows its id and incarnation (they name the files)."""
        try:
            self.writer.start(self.node.node_id, self.node.incarnation)
        except OSError as exc:
            raise ConfigError(f"archive.dir: cannot write to {self.directory}: {exc.strerror or exc}") from None
        self._sys_at = self.loop.time()
        self._logged_at = self._sys_at - self.log_interval  # the first drops are reported at once
        self._timer = self.loop.call_later(self.limits.flush_interval / 4, self._tick)
        log.info("archive: writing %s%s to %s (filters %s; a file at least every %gs or %d records)",
                 "published messages", " and deliveries" if self.delivery_log else "", self.directory,
                 ", ".join(self.recorder.filters), self.limits.flush_interval, self.limits.flush_rows)

    def _tick(self) -> None:
        self.recorder.tick()
        now = self.loop.time()
        self._dropped_since_log += self.recorder.take_drops()
        if self._dropped_since_log and now - self._logged_at >= self.log_interval:
            rows, nbytes = self.recorder.queued()
            log.warning("archive: dropped %d records in the last %.0fs: the writer is behind "
                        "(%d records, %d payload bytes queued; archive.max_queue_rows=%d, "
                        "archive.max_queue_bytes=%d)%s", self._dropped_since_log, now - self._logged_at,
                        rows, nbytes, self.limits.max_queue_rows, self.limits.max_queue_bytes,
                        f"; last write error: {self.writer.last_error}" if self.writer.last_error else "")
            self._dropped_since_log = 0
            self._logged_at = now
        if self.sys_interval > 0 and now - self._sys_at >= self.sys_interval:
            self._sys_at = now
            self.publish_sys()
        self._timer = self.loop.call_later(self.limits.flush_interval / 4, self._tick)

    def publish_sys(self) -> None:
        for key, value in self.recorder.stats().items():
            self.node.publish_sys(f"$SYS/broker/archive/{key}", str(value))

    async def stop(self) -> None:
        """Hand over everything buffered and wait until the writer has written it."""
        if self._timer is not None:
            self._timer.cancel()
        self.recorder.flush()
        await self.loop.run_in_executor(None, self.writer.close)
        s = self.recorder.stats()
        dropped = s["publish/dropped"] + s["delivery/dropped"]
        failed = s["publish/failed"] + s["delivery/failed"]
        log.info("archive: %d published%s records written in %d files (%d bytes) under %s%s",
                 s["publish/written"], f" and {s['delivery/written']} delivery" if self.delivery_log else "",
                 s["files"], s["bytes"], self.directory,
                 f"; {dropped} dropped (queue full), {failed} lost to write errors" if dropped or failed else "")
