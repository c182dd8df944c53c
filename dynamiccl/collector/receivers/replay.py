"""Replay receiver: reads parquet history (written by the parquet exporter) back into the pipeline.

Files are read in path order (partition directories sort by job, date, hour, then part name),
batch by batch; rows are rebuilt into ``EVENT_DTYPE`` records and pushed per (host, job_id)
with the comm names found in the file. Replay waits for queue room instead of dropping.
"""
from __future__ import annotations

import glob
import logging
import os
import threading
from typing import Callable, Iterable

import numpy as np
import pyarrow.parquet as pq

from dynamiccl.collector.component import RecordBatch
from dynamiccl.collector.wire_format import EVENT_DTYPE

__all__ = ["ReplayReceiver", "parquet_files", "read_batches"]

log = logging.getLogger(__name__)


def parquet_files(paths: Iterable[str]) -> list[str]:
    out: list[str] = []
    for p in paths:
        if os.path.isdir(p):
            out.extend(sorted(glob.glob(os.path.join(p, "**", "*.parquet"), recursive=True)))
        elif os.path.isfile(p):
            out.append(p)
        else:
            raise FileNotFoundError(f"replay: no such file or directory: {p}")
    return out


def _strings(column) -> tuple[np.ndarray, list[str]]:
    """(codes, values) for a (possibly dictionary-encoded) string column."""
    import pyarrow as pa
    arr = column.combine_chunks() if hasattr(column, "combine_chunks") else column
    if not pa.types.is_dictionary(arr.type):
        arr = arr.dictionary_encode()
    return arr.indices.to_numpy(zero_copy_only=False).astype(np.int64), arr.dictionary.to_pylist()


def read_batches(path: str, *, batch_rows: int = 65536):
    """Yield RecordBatch objects rebuilt from one parquet part file."""
    pf = pq.ParquetFile(path)
    for rb in pf.iter_batches(batch_size=batch_rows):
        n = rb.num_rows
        rec = np.zeros(n, EVENT_DTYPE)
        names = set(rb.schema.names)
        for f in EVENT_DTYPE.names:
            if f in names:
                rec[f] = rb.column(f).to_numpy(zero_copy_only=False)
        hcodes, hosts = _strings(rb.column("host"))
        jcodes, jobs = _strings(rb.column("job_id"))
        ccodes, cnames = _strings(rb.column("comm_name"))
        comm_names: dict[int, str] = {}
        if n:
            uniq, first = np.unique(rec["comm_hash"], return_index=True)
            for ch, i in zip(uniq.tolist(), first.tolist()):
                if cnames[ccodes[i]]:
                    comm_names[ch] = cnames[ccodes[i]]
        group = hcodes * max(len(jobs), 1) + jcodes
        for g in np.unique(group).tolist():
            m = group == g
            yield RecordBatch(rec[m], hosts[g // max(len(jobs), 1)], jobs[g % max(len(jobs), 1)], comm_names)


class ReplayReceiver:
    """Receiver: pushes every record of ``paths`` (files or directories) once, then stops."""

    def __init__(self, paths: Iterable[str], *, ingest: Callable[..., int], batch_rows: int = 65536):
        self.paths = tuple(paths)
        self._ingest = ingest
        self.batch_rows = batch_rows
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self.done = threading.Event()
        self.records = 0
        self.files = parquet_files(self.paths)  # fail fast on a missing path

    def start(self) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="dynamiccl-replay", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            for path in self.files:
                try:
                    for batch in read_batches(path, batch_rows=self.batch_rows):
                        if self._stop.is_set():
                            return
                        self.records += self._ingest(batch, block=True)
                except Exception as exc:
                    log.error("replay: skipping %s: %s", path, exc)
            log.info("replay: %d records from %d files", self.records, len(self.files))
        finally:
            self.done.set()

    def shutdown(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None
