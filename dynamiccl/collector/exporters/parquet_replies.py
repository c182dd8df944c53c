"""The parquet exporter's side of its writer: the writer's replies (a slab handed back, a part
file finished or failed) and its death (what it had not finished is counted as dropped, a part
file it finished but could not confirm is counted from its own footer, and a new writer starts;
after `DEATHS_BEFORE_THREAD` deaths within `DEATH_WINDOW_S` it runs as a thread instead)."""
from __future__ import annotations

import logging
import os
import time

import pyarrow.parquet as pq

__all__ = ["WriterReplies", "DEATHS_BEFORE_THREAD", "DEATH_WINDOW_S"]

DEATHS_BEFORE_THREAD = 3  # writer deaths within DEATH_WINDOW_S before falling back to a thread
DEATH_WINDOW_S = 60.0


class WriterReplies:
    """Mixin of `dynamiccl.collector.exporters.parquet.ParquetExporter`."""

    def _handle(self, replies: list[tuple]) -> None:
        m = self.metrics
        for r in replies:
            if r[0] == "free":
                self._free.append(r[1])
            elif r[0] == "closed":
                self._closing.pop(r[1], None)
                with m._lock:
                    m.parquet_files += 1
                    m.parquet_rows += r[2]
            elif r[0] == "failed":
                f = self._closing.pop(r[1], None)
                kept = r[4] if len(r) > 4 else 0
                with m._lock:
                    m.parquet_errors += 1
                    m.parquet_files += kept > 0
                    m.parquet_rows += kept
                m.drop("parquet_write_failed", r[2])
                self._log_once("write", logging.ERROR, "parquet: cannot write %s (%s); %d rows lost, %d kept "
                               "in a partial file (further errors counted only)", f.path if f else r[1], r[3],
                               r[2], kept)

    def _on_death(self, exc: BaseException) -> None:
        """The writer is gone: count what it had not finished, start another (unless stopping)."""
        if self._channel is not None:
            self._channel.kill()
            self._handle(self._channel.drain())  # what it finished before it went
        self._count_finished_unconfirmed()
        lost_files = [f for f in self._files.values() if f.sent] + list(self._closing.values())
        lost_rows = sum(f.sent for f in self._files.values()) + sum(f.rows for f in self._closing.values())
        channel, self._channel = self._channel, None
        for f in lost_files:
            try:
                os.unlink(f.tmp)
            except OSError:
                pass
        self._closing.clear()
        for f in self._files.values():
            if f.sent:
                f.rows -= f.sent
                f.sent = 0
                f.rename(*self._new_path(f.key))
        self._free = [i for i in range(self.n_slabs) if i != self._cur]
        if self._stopping and not lost_rows:
            return  # the normal end after ("exit",)
        m = self.metrics
        with m._lock:
            m.parquet_errors += len(lost_files)
            m.parquet_writer_deaths += 1
        m.drop("parquet_write_failed", lost_rows)
        self._log_once("death", logging.ERROR, "parquet: the writer died (%s); %d rows in %d unfinished part "
                       "files lost; restarting it (further deaths counted only)", exc, lost_rows, len(lost_files))
        if self._stopping:
            return
        now = time.monotonic()
        self._deaths.append(now)
        kind = channel.kind if channel is not None else self.config.writer
        if kind == "process" and len(self._deaths) == DEATHS_BEFORE_THREAD \
                and now - self._deaths[0] < DEATH_WINDOW_S:
            self._log_once("degrade", logging.ERROR, "parquet: the writer process died %d times within %.0f s; "
                           "writing in a thread of the collector from now on", DEATHS_BEFORE_THREAD, DEATH_WINDOW_S)
            kind = "thread"
        self._channel = self._new_channel(kind)

    def _count_finished_unconfirmed(self) -> None:
        """A close whose reply died with the writer: the writer renames a part file to its final
        name only once it is complete and on disk, so a file found under that name was finished
        (its rows are counted as written, from its own footer) and only the rest is lost."""
        m = self.metrics
        for file_id, f in list(self._closing.items()):
            try:
                kept = pq.read_metadata(f.path).num_rows
            except Exception:  # not there (or unreadable): not finished
                continue
            del self._closing[file_id]
            with m._lock:
                m.parquet_files += 1
                m.parquet_rows += kept
            if kept < f.rows:
                with m._lock:
                    m.parquet_errors += 1
                m.drop("parquet_write_failed", f.rows - kept)
