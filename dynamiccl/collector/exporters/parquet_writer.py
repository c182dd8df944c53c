"""The parquet part-file writer: turns slabs of raw records into row groups of open part files.

It runs in a child process (``python -m dynamiccl.collector.exporters.parquet_writer``, the default: the
encoding and compression then use the second core without the collector's GIL) or in a thread of
the collector (``ParquetConfig.writer = "thread"``, and the fallback after repeated child deaths).
:class:`dynamiccl.collector.exporters.parquet.ParquetExporter` is the only client; it owns the policy
(partitions, file names, when a file is closed), this module only executes.

Records travel in shared memory: ``SlabMemory`` is a ``memfd`` holding ``n_slabs`` slabs of
``slab_rows`` raw ``EVENT_DTYPE`` records; the parent copies batches in (one memcpy per batch)
and names a full slab to the writer. Commands and replies are small pickles over a socket pair
(``multiprocessing.connection.Connection``):

* ``("append", slab, n, segments, files, hosts, comm_names)`` — rows ``[0, n)`` of ``slab``;
  ``segments`` is an int64 array of ``(start, length, file index, host index)`` rows covering
  ``[0, n)`` in order; ``files[i] = (file_id, tmp_path, path, job_id)``; ``hosts`` the host
  names; ``comm_names`` comm_hash → name. The writer copies the rows out column by column,
  replies ``("free", slab)`` at once, then appends one row group per file to ``tmp_path``
  (opened on first use).
* ``("close", file_id)`` — finish the file, ``os.replace`` it to its path, reply
  ``("closed", file_id, rows)`` or ``("failed", file_id, rows_lost, error, rows_kept)`` (a write
  error keeps the row groups written before it as a partial part file when it can).
* ``("exit",)`` — close every open file and stop. End of file on the command channel (the
  collector died) does the same, so what reached the writer is never left in a ``.tmp`` file.

The child ignores SIGINT and SIGTERM: it stops when the collector closes the channel or exits
(a terminal's Ctrl-C or a service manager's SIGTERM to the whole group must not kill it before
the collector has handed over its last rows).
"""
from __future__ import annotations

import argparse
import logging
import mmap
import os
import queue
import signal
import sys
import threading
from typing import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from dynamiccl.collector.wire_format import EVENT_DTYPE

__all__ = ["RECORD_COLUMNS", "STRING_COLUMNS", "SCHEMA", "SlabMemory", "WriterCore", "main"]

log = logging.getLogger(__name__)

RECORD_COLUMNS = tuple(f for f in EVENT_DTYPE.names if not f.startswith("reserved"))
STRING_COLUMNS = ("host", "job_id", "comm_name")
#: file schema: every record column, then dictionary-encoded strings (unchanged since issue 2)
SCHEMA = pa.schema([pa.field(n, pa.from_numpy_dtype(EVENT_DTYPE[n].newbyteorder("="))) for n in RECORD_COLUMNS]
                   + [pa.field(s, pa.dictionary(pa.int32(), pa.string())) for s in STRING_COLUMNS])
#: columns that take a new value on (nearly) every record: parquet dictionary encoding on them
#: costs a hash table and is then abandoned, so they are written plain
HIGH_CARDINALITY = ("seq_number", "enqueue_ns", "gpu_start_ns", "gpu_end_ns", "cpu_end_ns", "record_seq")
#: dictionary pages for the rest (enums, ranks, pids, communicators, message sizes, strings):
#: on the e2e data with lz4 0.30 CPU-s and 22 B per 1 M records, vs 0.73 s and 31 B for
#: dictionaries everywhere (pyarrow's default) and 0.28 s and 29 B for none but the enums
DICT_COLUMNS = tuple(n for n in RECORD_COLUMNS if n not in HIGH_CARDINALITY) + STRING_COLUMNS
#: min/max statistics for the columns readers select on (time ranges, communicator, op, rank)
STATS_COLUMNS = ("kind", "func", "rank", "comm_hash", "seq_number", "enqueue_ns", "gpu_start_ns",
                 "record_seq") + STRING_COLUMNS
_CHUNK = 8192  # rows transposed at a time (1 MB of records: stays in cache)


class SlabMemory:
    """``n_slabs`` × ``slab_rows`` raw records in a memfd shared with the writer process."""

    def __init__(self, n_slabs: int, slab_rows: int, fd: int | None = None):
        if n_slabs <= 0 or slab_rows <= 0:
            raise ValueError("n_slabs and slab_rows must be > 0")
        self.n_slabs, self.slab_rows = n_slabs, slab_rows
        size = n_slabs * slab_rows * EVENT_DTYPE.itemsize
        if fd is None:
            fd = os.memfd_create("dynamiccl-parquet-slabs")
            os.ftruncate(fd, size)
        self.fd = fd
        self._mm = mmap.mmap(fd, size)
        self.records = np.frombuffer(self._mm, EVENT_DTYPE).reshape(n_slabs, slab_rows)

    def close(self) -> None:
        self.records = None
        try:
            self._mm.close()
        except BufferError:  # a view is still alive somewhere; the mapping goes with it
            pass
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class _OpenFile:
    __slots__ = ("writer", "tmp", "path", "rows", "written", "kept", "error")

    def __init__(self, tmp: str, path: str):
        self.writer = None
        self.tmp, self.path = tmp, path
        self.rows = 0      # rows given to this file
        self.written = 0   # rows in row groups written without error
        self.kept = 0      # rows kept on disk after a failure (a partial part file)
        self.error: str | None = None


def _dict_array(codes: np.ndarray, values) -> pa.DictionaryArray:
    return pa.DictionaryArray.from_arrays(pa.array(codes, pa.int32()), pa.array(values, pa.string()))


def build_table(cols: dict[str, np.ndarray], host_codes: np.ndarray, hosts: list[str], job_id: str,
                comm_names: dict[int, str]) -> pa.Table:
    """One file's rows as an Arrow table with :data:`SCHEMA` (columns are used without copy)."""
    n = len(host_codes)
    arrays = [pa.array(cols[name]) for name in RECORD_COLUMNS]
    enc = pc.dictionary_encode(arrays[RECORD_COLUMNS.index("comm_hash")])
    names = [comm_names.get(h, "") for h in enc.dictionary.to_pylist()]
    arrays += [_dict_array(host_codes, hosts), _dict_array(np.zeros(n, np.int32), [job_id]),
               pa.DictionaryArray.from_arrays(enc.indices.cast(pa.int32()), pa.array(names, pa.string()))]
    return pa.Table.from_arrays(arrays, schema=SCHEMA)


def _fsync(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class WriterCore:
    """Executes the commands above; ``reply`` sends a reply tuple (errors there are ignored)."""

    def __init__(self, memory: SlabMemory, *, compression: str, reply: Callable[[tuple], None]):
        self.memory = memory
        self.compression = None if compression == "none" else compression
        self._reply = reply
        self.files: dict[int, _OpenFile] = {}

    def reply(self, msg: tuple) -> None:
        try:
            self._reply(msg)
        except (OSError, EOFError, ValueError):
            pass  # the collector is gone; keep writing what we have

    def handle(self, msg: tuple) -> bool:
        """Run one command; False after ``exit``."""
        op = msg[0]
        if op == "append":
            self.append(*msg[1:])
        elif op == "close":
            self.close(msg[1])
        elif op == "exit":
            self.close_all()
            return False
        else:
            log.error("parquet writer: unknown command %r", op)
        return True

    def append(self, slab: int, n: int, segments: np.ndarray, files: list, hosts: list[str],
               comm_names: dict[int, str]) -> None:
        rows = self.memory.records[slab, :n]
        cols = {name: np.empty(n, EVENT_DTYPE[name]) for name in RECORD_COLUMNS}
        for i in range(0, n, _CHUNK):
            blk = rows[i:i + _CHUNK]
            for name in RECORD_COLUMNS:
                cols[name][i:i + _CHUNK] = blk[name]
        del rows
        self.reply(("free", slab))
        seg = np.asarray(segments, np.int64).reshape(-1, 4)
        host_codes = np.repeat(seg[:, 3].astype(np.int32), seg[:, 1])
        which = seg[:, 2]
        for f in np.unique(which).tolist():
            if len(files) == 1:
                part, codes = cols, host_codes
            else:
                m = which == f
                take = np.concatenate([np.arange(s, s + k) for s, k in zip(seg[m, 0].tolist(), seg[m, 1].tolist())])
                part = {name: c[take] for name, c in cols.items()}
                codes = host_codes[take]
            file_id, tmp, path, job_id = files[f]
            self._write(file_id, tmp, path, build_table(part, codes, hosts, job_id, comm_names))

    def _write(self, file_id: int, tmp: str, path: str, table: pa.Table) -> None:
        f = self.files.get(file_id)
        if f is None:
            f = self.files[file_id] = _OpenFile(tmp, path)
        f.rows += table.num_rows
        if f.error is not None:
            return
        try:
            if f.writer is None:
                os.makedirs(os.path.dirname(tmp), exist_ok=True)
                f.writer = pq.ParquetWriter(tmp, SCHEMA, compression=self.compression,
                                            use_dictionary=list(DICT_COLUMNS),
                                            write_statistics=list(STATS_COLUMNS))
            f.writer.write_table(table, row_group_size=max(1, table.num_rows))
            f.written += table.num_rows
        except Exception as exc:  # disk full, permissions: keep what was written, the writer goes on
            self._fail(f, exc)

    def _fail(self, f: _OpenFile, exc: BaseException) -> None:
        """Finish the row groups written before the error as a (partial) part file if its footer
        can still be written and read back; otherwise remove it. Rows after the error are lost."""
        f.error = f"{type(exc).__name__}: {exc}"
        try:
            if f.writer is not None:
                f.writer.close()
            if f.written and pq.read_metadata(f.tmp).num_rows == f.written:
                _fsync(f.tmp)
                os.replace(f.tmp, f.path)
                _fsync(os.path.dirname(f.path))
                f.kept = f.written
                return
        except Exception:
            pass
        try:
            os.unlink(f.tmp)
        except OSError:
            pass

    def close(self, file_id: int) -> None:
        f = self.files.pop(file_id, None)
        if f is None:
            self.reply(("closed", file_id, 0))
            return
        if f.error is None:
            try:
                f.writer.close()
                _fsync(f.tmp)              # the data is on disk before the name says it is complete
                os.replace(f.tmp, f.path)
                _fsync(os.path.dirname(f.path))
            except Exception as exc:
                self._fail(f, exc)
        if f.error is None:
            self.reply(("closed", file_id, f.rows))
        else:
            self.reply(("failed", file_id, f.rows - f.kept, f.error, f.kept))

    def close_all(self) -> None:
        for file_id in list(self.files):
            self.close(file_id)


def main(argv: list[str] | None = None) -> int:
    """Child-process entry point (started by the parquet exporter, not by users)."""
    from multiprocessing.connection import Connection

    ap = argparse.ArgumentParser(description="dynamiccl parquet writer (child of the collector)")
    ap.add_argument("--ctl-fd", type=int, required=True)
    ap.add_argument("--slab-fd", type=int, required=True)
    ap.add_argument("--slabs", type=int, required=True)
    ap.add_argument("--slab-rows", type=int, required=True)
    ap.add_argument("--compression", required=True)
    args = ap.parse_args(argv)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s parquet-writer %(levelname)s %(message)s")
    conn = Connection(args.ctl_fd)
    # Replies go out from their own thread: this loop never blocks on a full reply buffer while
    # the collector blocks sending a command (the two would wait on each other for ever).
    replies: queue.SimpleQueue = queue.SimpleQueue()
    sender = threading.Thread(target=_send_replies, args=(conn, replies), daemon=True)
    sender.start()
    core = WriterCore(SlabMemory(args.slabs, args.slab_rows, fd=args.slab_fd),
                      compression=args.compression, reply=replies.put)
    parent = os.getppid()
    while True:
        try:
            # the end of file is the signal that the collector is gone; the parent check also
            # covers a copy of the channel held by some other process the collector forked
            if not conn.poll(1.0):
                if os.getppid() != parent:
                    raise EOFError
                continue
            msg = conn.recv()
        except (EOFError, OSError):
            core.close_all()  # the collector is gone: finish what we were given
            break
        if not core.handle(msg):
            break
    replies.put(None)
    sender.join(timeout=10)
    return 0


def _send_replies(conn, replies: "queue.SimpleQueue") -> None:
    while (msg := replies.get()) is not None:
        try:
            conn.send(msg)
        except (OSError, EOFError, ValueError):
            return  # the collector is gone


if __name__ == "__main__":
    sys.exit(main())
