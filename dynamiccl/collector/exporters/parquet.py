"""Rolling parquet history of raw decoded records.

Layout: ``DIR/job_id=<job>/date=YYYY-MM-DD/hour=HH/part-<unix_ms>-<pid>-<n>.parquet`` (UTC,
by event time). Columns: every ``EVENT_DTYPE`` field except ``reserved*``, plus ``host``,
``job_id``, ``comm_name`` (dictionary-encoded strings). Part files are written to
``<name>.tmp.<pid>`` and ``os.replace``d, so readers never see a partial file. A part file is
finished when it holds ``flush_rows`` rows or its first row is ``flush_interval_s`` old; at most
``max_open_files`` are open at once (opening one more finishes the least recently used).

Where the work happens: ``consume`` (the pipeline's parquet queue thread) only copies each batch
into a shared-memory slab of ``row_group_rows`` raw records (one memcpy) and notes which part
file and host its rows belong to. A full slab goes to the writer — by default a child process
(:mod:`dynamiccl.collector.exporters.parquet_writer`), so column building, encoding and compression run on
the other core, outside the collector's GIL — which appends it to the open part files as a row
group and hands the slab back. Memory is bounded by ``max_buffered_rows`` (the slabs, 128 bytes
per row); when every slab is in use ``consume`` waits for one (the queue in front of it drops
and counts ``parquet_queue_full``, so the receivers never wait).

The writer dying is survived: what it had not finished (open part files, slabs in flight) is
counted in ``records_dropped_total{reason="parquet_write_failed"}`` and
``parquet_write_errors_total`` (files), the death in ``parquet_writer_deaths_total``, it is
logged once, and a new writer is started; after 3 deaths within a minute the writer runs as a
thread of the collector instead. A writer that hands no slab back for ``writer_timeout_s`` is
killed and treated the same way. If the collector dies, the writer finishes the files it holds
and exits.
"""
from __future__ import annotations

import itertools
import logging
import math
import os
import time
from collections import deque
from typing import Callable

import numpy as np

from dynamiccl.collector.component import RecordBatch
from dynamiccl.collector.config import ParquetConfig
from dynamiccl.collector.exporters.parquet_channel import ProcessChannel, ThreadChannel, WriterDied
from dynamiccl.collector.exporters.parquet_files import PartFile, check_writable, safe_partition_value
from dynamiccl.collector.exporters.parquet_replies import DEATH_WINDOW_S, DEATHS_BEFORE_THREAD, WriterReplies
from dynamiccl.collector.exporters.parquet_writer import RECORD_COLUMNS, SlabMemory
from dynamiccl.collector.metrics import SelfMetrics
from dynamiccl.collector.records import event_time_ns
from dynamiccl.collector.wire_format import EVENT_DTYPE

__all__ = ["ParquetExporter", "RECORD_COLUMNS", "safe_partition_value", "DEATHS_BEFORE_THREAD", "DEATH_WINDOW_S"]

log = logging.getLogger(__name__)
_HOUR_NS = 3600 * 10**9
_RAW = np.dtype(f"V{EVENT_DTYPE.itemsize}")
MAX_SLABS = 64


class ParquetExporter(WriterReplies):
    """Exporter: consumes RecordBatch. Not thread-safe (the pipeline gives it one worker)."""

    def __init__(self, config: ParquetConfig, *, metrics: SelfMetrics | None = None,
                 clock: Callable[[], float] = time.monotonic):
        config.validate()
        if config.directory is None:
            raise ValueError("parquet.directory must be set to use the parquet exporter")
        self.config = config
        self.metrics = metrics or SelfMetrics()
        self._clock = clock
        self.slab_rows = config.row_group_rows
        self.n_slabs = min(MAX_SLABS, max(2, math.ceil(config.max_buffered_rows / config.row_group_rows)))
        self._mem: SlabMemory | None = None
        self._channel: ProcessChannel | ThreadChannel | None = None
        self._files: dict[tuple[str, int], PartFile] = {}   # open, by (job_id, hour)
        self._closing: dict[int, PartFile] = {}             # close sent, not yet confirmed
        self._free: list[int] = []
        self._ids = itertools.count()
        self._deaths: deque[float] = deque(maxlen=DEATHS_BEFORE_THREAD)
        self._logged: set[str] = set()
        self._stopping = False
        self._next_due = math.inf
        self.waiting_for_slab = False  # consume is waiting for the writer (observable in tests)
        self._reset_slab()

    # -- lifecycle ------------------------------------------------------------------------------
    def start(self) -> None:
        if self._channel is not None:
            return
        check_writable(self.config.directory)
        self._mem = SlabMemory(self.n_slabs, self.slab_rows)
        self._free = list(range(self.n_slabs))
        self._stopping = False
        self._channel = self._new_channel(self.config.writer)

    @property
    def writer_pid(self) -> int | None:
        """PID of the writer process (None for an in-process writer or when stopped)."""
        return None if self._channel is None else self._channel.pid

    @property
    def writer_kind(self) -> str | None:
        return None if self._channel is None else self._channel.kind

    def shutdown(self, timeout: float | None = None) -> None:
        """Hand every buffered row to the writer, finish every part file, stop the writer."""
        if self._channel is None:
            return
        timeout = self.config.writer_timeout_s if timeout is None else timeout
        self._send_slab()
        for f in list(self._files.values()):
            self._close_file(f)
        self._stopping = True
        self._send(("exit",))
        if self._channel is not None and not self.sync(timeout):
            self._log_once("shutdown", logging.ERROR, "parquet: writer did not finish within %.0f s; killed",
                           timeout)
            self._channel.kill()
            self._on_death(WriterDied("timed out at shutdown"))
        if self._channel is not None:
            self._channel.close(timeout)
            self._channel = None
        self._mem.close()
        self._mem = None

    def sync(self, timeout: float = 30.0) -> bool:
        """Wait until the writer has handed back every slab sent and confirmed every close."""
        deadline = time.monotonic() + timeout
        while self._channel is not None and (self._closing or self._in_flight()):
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            self._poll(min(left, 0.05))
        return True

    # -- data -------------------------------------------------------------------------------------
    def consume(self, batch: RecordBatch) -> None:
        ev = batch.events
        if len(ev) == 0:
            return
        if self._channel is None:
            raise RuntimeError("ParquetExporter.consume before start() or after shutdown()")
        now = self._clock()
        if ev.dtype == EVENT_DTYPE:  # copy bytes, not field by field (6x cheaper)
            ev = ev.view(_RAW)
        hours = event_time_ns(batch.events) // _HOUR_NS
        lo, hi = int(hours.min()), int(hours.max())
        if lo == hi:
            self._add(batch, ev, lo, now)
        else:
            for h in np.unique(hours).tolist():
                self._add(batch, ev[hours == h], h, now)
        if now >= self._next_due:
            self.tick(now)

    def tick(self, now: float | None = None) -> None:
        """Finish part files whose first row is ``flush_interval_s`` old; read the writer's replies."""
        now = self._clock() if now is None else now
        if self._channel is None:
            return
        self._poll(0.0)
        channel = self._channel
        if channel is not None and not channel.alive():  # gone, whether or not we saw the end of file
            self._poll(0.0)  # its last replies (and perhaps the death itself)
            if self._channel is channel:
                self._on_death(WriterDied("the writer exited"))
        interval = self.config.flush_interval_s
        for f in [f for f in self._files.values() if now - f.since >= interval]:
            self._close_file(f)
        self._next_due = min((f.since for f in self._files.values()), default=math.inf) + interval

    def path_for(self, job_id: str, hour: int) -> str:
        t = time.gmtime(hour * 3600)
        return os.path.join(self.config.directory, f"job_id={safe_partition_value(job_id)}",
                            time.strftime("date=%Y-%m-%d", t), time.strftime("hour=%H", t))

    # -- filling slabs ------------------------------------------------------------------------------
    def _reset_slab(self) -> None:
        self._cur: int | None = None
        self._fill = 0
        self._segs: list[tuple[int, int, int, int]] = []
        self._slab_files: dict[PartFile, int] = {}
        self._hosts: dict[str, int] = {}
        self._maps: dict[int, object] = {}

    def _new_path(self, key) -> tuple[int, str]:
        file_id = next(self._ids)
        name = f"part-{int(time.time() * 1000)}-{os.getpid()}-{file_id:06d}.parquet"
        return file_id, os.path.join(self.path_for(*key), name)

    def _add(self, batch: RecordBatch, ev: np.ndarray, hour: int, now: float) -> None:
        key = (batch.job_id, hour)
        f = self._files.pop(key, None)  # re-inserted last: the dict is in least-recently-used order
        if f is None:
            while len(self._files) >= self.config.max_open_files:
                self._close_file(next(iter(self._files.values())))
            f = PartFile(*self._new_path(key), key=key, job_id=batch.job_id, since=now)
            self._next_due = min(self._next_due, now + self.config.flush_interval_s)
        self._files[key] = f
        pos, n = 0, len(ev)
        while pos < n:
            if self._cur is None:
                self._cur = self._take_slab()
            k = min(self.slab_rows - self._fill, n - pos)
            slab = self._mem.records[self._cur]
            if ev.dtype == _RAW:
                slab = slab.view(_RAW)
            slab[self._fill:self._fill + k] = ev[pos:pos + k]
            fi = self._slab_files.setdefault(f, len(self._slab_files))
            hi = self._hosts.setdefault(batch.host, len(self._hosts))
            if batch.comm_names:
                self._maps[id(batch.comm_names)] = batch.comm_names
            self._segs.append((self._fill, k, fi, hi))
            self._fill += k
            f.rows += k
            pos += k
            if self._fill == self.slab_rows:
                self._send_slab()
        if f.rows >= self.config.flush_rows:
            self._close_file(f)

    def _take_slab(self) -> int:
        if not self._free:
            self._poll(0.0)
        deadline = time.monotonic() + self.config.writer_timeout_s
        self.waiting_for_slab = True
        try:
            while not self._free:
                left = deadline - time.monotonic()
                if left <= 0 and self._channel.kind == "process":
                    self._log_once("hung", logging.ERROR, "parquet: writer returned no slab for %.0f s; killed "
                                   "(counted in parquet_writer_deaths_total; further cases counted only)",
                                   self.config.writer_timeout_s)
                    self._channel.kill()
                    self._on_death(WriterDied("hung"))
                    continue
                self._poll(min(max(left, 0.0), 0.05) or 0.05)
        finally:
            self.waiting_for_slab = False
        return self._free.pop()

    def _send_slab(self) -> None:
        """Hand the slab being filled to the writer. If the writer turns out to be dead, the rows
        are still here: they go to its replacement (one retry), else they are counted lost."""
        if self._cur is None:
            return
        if self._fill == 0:
            self._free.append(self._cur)
            self._reset_slab()
            return
        segs = np.array(self._segs, np.int64)
        per_file = np.bincount(segs[:, 2], weights=segs[:, 1], minlength=len(self._slab_files))
        comm: dict[int, str] = {}
        for mapping in self._maps.values():
            comm.update(mapping)
        for _attempt in range(2):
            if self._channel is None:
                break
            files = [(f.id, f.tmp, f.path, f.job_id) for f in self._slab_files]
            try:
                self._channel.send(("append", self._cur, self._fill, segs, files, list(self._hosts), comm))
            except WriterDied as exc:
                self._on_death(exc)  # keeps self._cur: the rows are in our memory
                continue
            for f, i in self._slab_files.items():
                f.sent += int(per_file[i])
            self._reset_slab()
            self._poll(0.0)  # slabs handed back, files confirmed (also on tick)
            return
        for f, i in self._slab_files.items():
            f.rows -= int(per_file[i])
        self.metrics.drop("parquet_write_failed", self._fill)
        self._free.append(self._cur)
        self._reset_slab()

    def _close_file(self, f: PartFile) -> None:
        if self._files.get(f.key) is f:
            del self._files[f.key]
        if f in self._slab_files:
            self._send_slab()
        if f.sent == 0:  # nothing of it reached the writer (or what did was lost with it)
            return
        self._closing[f.id] = f
        self._send(("close", f.id))

    def _in_flight(self) -> int:
        return self.n_slabs - len(self._free) - (self._cur is not None)

    # -- the writer ---------------------------------------------------------------------------------
    def _new_channel(self, kind: str):
        if kind == "process":
            try:
                return ProcessChannel(self._mem, compression=self.config.compression)
            except OSError as exc:
                self._log_once("spawn", logging.ERROR, "parquet: cannot start the writer process (%s); "
                               "writing in a thread of the collector", exc)
        return ThreadChannel(self._mem, compression=self.config.compression)

    def _send(self, msg: tuple) -> None:
        if self._channel is None:
            return
        try:
            self._channel.send(msg)
        except WriterDied as exc:
            self._on_death(exc)

    def _poll(self, timeout: float) -> None:
        if self._channel is None:
            return
        try:
            replies = self._channel.poll(timeout)
        except WriterDied as exc:
            self._on_death(exc)
            return
        self._handle(replies)

    def _log_once(self, what: str, level: int, msg: str, *args) -> None:
        if what not in self._logged:
            self._logged.add(what)
            log.log(level, msg, *args)
