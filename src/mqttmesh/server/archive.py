"""The archive on a running node: its port for the broker, the flush timer, the writer process, $SYS.

This is the asyncio side of ``mqttmesh.archive``. The Recorder (pure) takes the
records on the hot path and cuts them into chunks; this module sends each chunk
down a pipe to the archive writer process (archive/worker.py), reads its reports,
ticks the recorder on a timer and logs what it drops. Nothing here waits for the
writer: a chunk that does not fit the queue limits is dropped and counted, and the
pipe is written by the event loop as the writer reads it. Only ``stop`` waits, for
the writer to write everything, once the clients are gone.
"""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import os
import signal
import sys

from ..archive.capture import Capture
from ..archive.recorder import ArchiveLimits, Recorder
from ..archive.wire import WireError, decode_report, encode_chunk
from ..auth import ConfigError
from ..config import Config

log = logging.getLogger("mqttmesh.archive")

RESTART_DELAY = 1.0  # seconds before a writer process that died is started again


class ArchiveService:
    def __init__(self, node, config: Config):
        self.node = node
        self.loop = node.loop
        get = config.get
        directory = get("archive.dir") or (os.path.join(config.data_dir, "archive") if config.data_dir else "")
        if not directory:
            raise ConfigError(
                "archive.dir: the archive needs a directory (set archive.dir, or data_dir to use DATA_DIR/archive)"
            )
        self.directory = os.path.abspath(directory)
        limits = ArchiveLimits(
            flush_interval=get("archive.flush_interval"),
            flush_rows=get("archive.flush_rows"),
            flush_bytes=get("archive.flush_bytes"),
            max_queue_rows=get("archive.max_queue_rows"),
            max_queue_bytes=get("archive.max_queue_bytes"),
        )
        for problem in limits.problems():
            raise ConfigError(f"archive.{problem}")
        if importlib.util.find_spec("pyarrow") is None:
            raise ConfigError(
                "archive.enabled: the archive writer needs pyarrow; install it with: pip install 'mqttmesh[pipeline]'"
            )
        self.delivery_log = get("archive.delivery_log")
        loop_time = self.loop.time

        def clock() -> float:  # the clock of message timestamps (channel.py), so latencies compare
            return loop_time() + node.broker.wall_offset  # (the broker is built after this service)

        try:
            self.recorder = Recorder(limits, self._submit, clock, get("archive.filters"), self.delivery_log)
        except ValueError as exc:
            raise ConfigError(f"archive.filters: {exc}") from None
        self.limits = limits
        self.compression = get("archive.compression")
        self.format = get("archive.format")
        self.compact_interval = get("archive.compact_interval")
        self.compact_target = get("archive.compact_target_bytes")
        self.retention = get("archive.retention")
        self.vacuum_retention = get("archive.vacuum_retention")
        self.log_interval = get("archive.log_interval")
        self.stop_timeout = get("archive.stop_timeout")
        self.writer_nice = get("archive.writer_nice")
        self.writer_idle = get("archive.writer_idle")
        self.sys_interval = get("sys.interval")
        self.log_level = config.log_level
        self.process: asyncio.subprocess.Process | None = None
        self._pipe: asyncio.WriteTransport | None = None
        self.generation = 0
        self._reports: asyncio.Task | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._stopping = False
        self._logged_at = 0.0
        self._sys_at = 0.0
        self._dropped_since_log = 0
        # what the node's Broker is given (ports.ArchivePort): its sessions, those restored
        # from the store too, get the delivery hook from it
        self.capture = Capture(self.recorder)

    # -- life cycle -----------------------------------------------------------------------

    async def start(self) -> None:
        """Start the writer once the node knows its id and incarnation (they name the files)."""
        try:
            os.makedirs(self.directory, exist_ok=True)
            probe = os.path.join(self.directory, f".probe-{os.getpid()}")
            with open(probe, "wb"):
                pass
            os.unlink(probe)
        except OSError as exc:
            raise ConfigError(f"archive.dir: cannot write to {self.directory}: {exc.strerror or exc}") from None
        await self._start_writer()
        self._sys_at = self.loop.time()
        self._logged_at = self._sys_at - self.log_interval  # the first drops are reported at once
        self._timer = self.loop.call_later(self.limits.flush_interval / 4, self._tick)
        log.info(
            "archive: writing %s%s to %s (filters %s; a file at least every %gs or %d records; writer process pid %d)",
            "published messages",
            " and deliveries" if self.delivery_log else "",
            self.directory,
            ", ".join(self.recorder.filters),
            self.limits.flush_interval,
            self.limits.flush_rows,
            self.process.pid,  # type: ignore[union-attr]  # (the writer was just started)
        )

    async def _start_writer(self) -> None:
        lim = self.limits
        cmd = [
            sys.executable,
            "-m",
            "mqttmesh.archive.worker",
            "--dir",
            self.directory,
            "--node",
            self.node.node_id,
            "--incarnation",
            str(self.node.incarnation),
            "--generation",
            str(self.generation),
            "--compression",
            self.compression,
            "--format",
            self.format,
            "--compact-interval",
            repr(self.compact_interval),
            "--compact-target-bytes",
            str(self.compact_target),
            "--retention",
            repr(self.retention),
            "--vacuum-retention",
            repr(self.vacuum_retention),
            "--flush-interval",
            repr(lim.flush_interval),
            "--flush-rows",
            str(lim.flush_rows),
            "--flush-bytes",
            str(lim.flush_bytes),
            "--nice",
            str(self.writer_nice),
            "--idle",
            str(int(self.writer_idle)),
            "--log-level",
            self.log_level,
        ]
        r, w = os.pipe()
        try:  # a large pipe: fewer, larger writes of the chunks (Linux; elsewhere the default size)
            import fcntl

            fcntl.fcntl(w, getattr(fcntl, "F_SETPIPE_SZ", 1031), 1 << 20)
        except (ImportError, OSError):
            pass
        try:
            self.process = await asyncio.create_subprocess_exec(*cmd, stdin=r, stdout=asyncio.subprocess.PIPE)
        except BaseException:
            os.close(w)
            raise
        finally:
            os.close(r)
        self._pipe, _ = await self.loop.connect_write_pipe(asyncio.Protocol, os.fdopen(w, "wb", buffering=0))
        self._reports = self.loop.create_task(self._read_reports(self.process))

    def _submit(self, chunk) -> None:
        pipe = self._pipe
        if pipe is None or pipe.is_closing():
            # no writer right now (it died and is being restarted): these records are lost
            self.recorder.rows_done(chunk.kind, len(chunk), chunk.nbytes, 0, len(chunk))
            return
        pipe.writelines(encode_chunk(chunk))

    async def _read_reports(self, proc) -> None:
        recorder = self.recorder
        try:
            while True:
                line = await proc.stdout.readline()
                if not line:
                    break
                try:
                    r = decode_report(line)
                except WireError as exc:
                    log.error("archive writer: %s", exc)
                    continue
                recorder.rows_done(
                    r["kind"], r["records"], r["nbytes"], r["written"], r["failed"], r["files"], r["file_bytes"]
                )
        finally:
            code = await proc.wait()
        if not self._stopping and proc is self.process:
            self._pipe.abort()  # type: ignore[union-attr]  # (the pipe of the running writer)
            lost = recorder.abandon_queued()
            log.error(
                "archive: the writer process (pid %d) exited with status %s; %d records it had "
                "not written are lost; starting it again in %gs",
                proc.pid,  # type: ignore[union-attr]  # (the running writer)
                code,
                lost,
                RESTART_DELAY,
            )
            self.generation += 1
            self.loop.call_later(RESTART_DELAY, lambda: self.loop.create_task(self._restart()))

    async def _restart(self) -> None:
        if self._stopping:
            return
        try:
            await self._start_writer()
        except OSError as exc:
            log.error("archive: cannot start the writer process: %s; trying again in %gs", exc, RESTART_DELAY)
            self.loop.call_later(RESTART_DELAY, lambda: self.loop.create_task(self._restart()))

    def _tick(self) -> None:
        self.recorder.tick()
        now = self.loop.time()
        self._dropped_since_log += self.recorder.take_drops()
        if self._dropped_since_log and now - self._logged_at >= self.log_interval:
            rows, nbytes = self.recorder.queued()
            log.warning(
                "archive: dropped %d records in the last %.0fs: the writer is behind "
                "(%d records, %d payload bytes queued; archive.max_queue_rows=%d, "
                "archive.max_queue_bytes=%d)",
                self._dropped_since_log,
                now - self._logged_at,
                rows,
                nbytes,
                self.limits.max_queue_rows,
                self.limits.max_queue_bytes,
            )
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
        """Hand over everything buffered, close the pipe, wait for the writer to finish."""
        if self._timer is not None:
            self._timer.cancel()
        self.recorder.flush()
        self._stopping = True
        proc = self.process
        if proc is not None and proc.returncode is None:
            # sends what is buffered; the writer writes it all and exits at the end
            self._pipe.close()  # type: ignore[union-attr]  # (the pipe of the running writer)
            try:
                await asyncio.wait_for(asyncio.shield(self._reports), self.stop_timeout)  # type: ignore[arg-type]  # (started with the writer)
            except TimeoutError:
                log.error(
                    "archive: the writer process (pid %d) did not finish within archive.stop_timeout (%gs); killing it",
                    proc.pid,
                    self.stop_timeout,
                )
                try:
                    os.kill(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                await self._reports  # type: ignore[misc]  # (started with the writer)
                self.recorder.abandon_queued()
        s = self.recorder.stats()
        dropped = s["publish/dropped"] + s["delivery/dropped"]
        failed = s["publish/failed"] + s["delivery/failed"]
        log.info(
            "archive: %d published%s records written in %d files (%d bytes) under %s%s",
            s["publish/written"],
            f" and {s['delivery/written']} delivery" if self.delivery_log else "",
            s["files"],
            s["bytes"],
            self.directory,
            f"; {dropped} dropped (queue full), {failed} not written (writer errors)" if dropped or failed else "",
        )
