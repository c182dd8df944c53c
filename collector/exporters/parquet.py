"""Rolling parquet history of raw decoded records.

Layout: ``DIR/job_id=<job>/date=YYYY-MM-DD/hour=HH/part-<unix_ms>-<pid>-<n>.parquet`` (UTC,
by event time). Columns: every ``EVENT_DTYPE`` field except ``reserved*``, plus ``host``,
``job_id``, ``comm_name`` (dictionary-encoded strings). Part files are written to
``<name>.tmp.<pid>`` and ``os.replace``d, so readers never see a partial file. A partition is
written when it holds ``flush_rows`` rows or its oldest row is ``flush_interval_s`` old; when all
buffers together exceed ``max_buffered_rows`` the largest is written early (bounded memory).
"""
from __future__ import annotations

import itertools
import logging
import os
import re
import time
from typing import Callable

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from collector.component import RecordBatch
from collector.config import ParquetConfig
from collector.metrics import SelfMetrics
from collector.records import event_time_ns
from collector.wire_format import EVENT_DTYPE

__all__ = ["ParquetExporter", "RECORD_COLUMNS", "safe_partition_value"]

log = logging.getLogger(__name__)
RECORD_COLUMNS = tuple(f for f in EVENT_DTYPE.names if not f.startswith("reserved"))
_HOUR_NS = 3600 * 10**9


def safe_partition_value(value: str) -> str:
    """A directory-safe rendering of a partition value (the exact value is in the file).

    >>> safe_partition_value("job/../x y")
    'job_.._x_y'
    """
    s = re.sub(r"[^A-Za-z0-9._-]", "_", value)[:100]
    return s if s not in ("", ".", "..") else "_"


def _dict_column(codes: np.ndarray, values: list[str]) -> pa.DictionaryArray:
    return pa.DictionaryArray.from_arrays(pa.array(codes.astype(np.int32)), pa.array(values, pa.string()))


def to_table(batch: RecordBatch) -> pa.Table:
    ev = batch.events
    n = len(ev)
    cols = {name: pa.array(np.ascontiguousarray(ev[name])) for name in RECORD_COLUMNS}
    zeros = np.zeros(n, np.int32)
    cols["host"] = _dict_column(zeros, [batch.host])
    cols["job_id"] = _dict_column(zeros, [batch.job_id])
    ch = ev["comm_hash"]
    if n and (ch == ch[0]).all():
        cols["comm_name"] = _dict_column(zeros, [batch.comm_names.get(int(ch[0]), "")])
    else:
        uniq, inv = np.unique(ch, return_inverse=True)
        cols["comm_name"] = _dict_column(inv, [batch.comm_names.get(int(c), "") for c in uniq.tolist()])
    return pa.table(cols)


class _Partition:
    __slots__ = ("tables", "rows", "since")

    def __init__(self, since: float):
        self.tables: list[pa.Table] = []
        self.rows = 0
        self.since = since


class ParquetExporter:
    """Exporter: consumes RecordBatch. Not thread-safe (the pipeline gives it one worker)."""

    def __init__(self, config: ParquetConfig, *, metrics: SelfMetrics | None = None,
                 clock: Callable[[], float] = time.monotonic):
        config.validate()
        if config.directory is None:
            raise ValueError("parquet.directory must be set to use the parquet exporter")
        self.config = config
        self.metrics = metrics or SelfMetrics()
        self._clock = clock
        self._parts: dict[tuple[str, int], _Partition] = {}
        self._buffered = 0
        self._seq = itertools.count()
        self._error_logged = False

    def start(self) -> None:
        os.makedirs(self.config.directory, exist_ok=True)

    def shutdown(self) -> None:
        for key in list(self._parts):
            self._write(key)

    def consume(self, batch: RecordBatch) -> None:
        if len(batch.events) == 0:
            return
        now = self._clock()
        table = to_table(batch)
        hours = event_time_ns(batch.events) // _HOUR_NS
        lo, hi = int(hours.min()), int(hours.max())
        if lo == hi:
            self._add((batch.job_id, lo), table, now)
        else:
            for h in np.unique(hours).tolist():
                self._add((batch.job_id, h), table.filter(pa.array(hours == h)), now)
        self.tick(now)

    def _add(self, key, table: pa.Table, now: float) -> None:
        part = self._parts.get(key)
        if part is None:
            part = self._parts[key] = _Partition(now)
        part.tables.append(table)
        part.rows += table.num_rows
        self._buffered += table.num_rows
        if part.rows >= self.config.flush_rows:
            self._write(key)

    def tick(self, now: float | None = None) -> None:
        now = self._clock() if now is None else now
        for key, part in list(self._parts.items()):
            if now - part.since >= self.config.flush_interval_s:
                self._write(key)
        while self._buffered > self.config.max_buffered_rows and self._parts:
            self._write(max(self._parts, key=lambda k: self._parts[k].rows))

    def path_for(self, job_id: str, hour: int) -> str:
        t = time.gmtime(hour * 3600)
        return os.path.join(self.config.directory, f"job_id={safe_partition_value(job_id)}",
                            time.strftime("date=%Y-%m-%d", t), time.strftime("hour=%H", t))

    def _write(self, key) -> None:
        part = self._parts.pop(key, None)
        if part is None:
            return
        self._buffered -= part.rows
        job_id, hour = key
        directory = self.path_for(job_id, hour)
        name = f"part-{int(time.time() * 1000)}-{os.getpid()}-{next(self._seq):06d}.parquet"
        path = os.path.join(directory, name)
        tmp = f"{path}.tmp.{os.getpid()}"
        try:
            os.makedirs(directory, exist_ok=True)
            table = pa.concat_tables(part.tables).unify_dictionaries()
            pq.write_table(table, tmp, compression=None if self.config.compression == "none"
                           else self.config.compression)
            os.replace(tmp, path)
        except Exception as exc:
            with self.metrics._lock:
                self.metrics.parquet_errors += 1
            if not self._error_logged:
                self._error_logged = True
                log.error("parquet: cannot write %s (%s); %d rows lost (further errors counted only)",
                          path, exc, part.rows)
            try:
                os.unlink(tmp)
            except OSError:
                pass
            return
        with self.metrics._lock:
            self.metrics.parquet_files += 1
            self.metrics.parquet_rows += part.rows
