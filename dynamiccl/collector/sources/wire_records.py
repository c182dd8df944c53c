"""The records and frames a Python source sends, in the plugin's wire format (``dynamiccl/collector/wire_format.py``).

Pure functions from the sender's state to numpy records (one record per array row) and to a frame
(16-byte header + records); :class:`~dynamiccl.collector.sources.wire_sender.WireSender` owns the queue, the
socket and the counters. Strings are cut to their field's size (host 55, job id 47, communicator name 88
bytes) so a record is always well formed.
"""
from __future__ import annotations

import struct

import numpy as np

from dynamiccl.collector.wire_format import (
    COMM_DTYPE, EVENT_DTYPE, MAGIC, PROCESS_DTYPE, RECORD_SIZE, STATS_DTYPE, UNKNOWN, VERSION, Kind,
)

__all__ = ["EVENT_FIELDS", "STATS_FIELDS", "events", "comm", "stats", "process", "frame"]

_HEADER = struct.Struct("<IHHII")
#: layout of the tuples a source appends to the queue (``comm`` is a :class:`~.wire_sender.Comm`)
EVENT_FIELDS = ("comm", "kind", "func", "datatype", "root", "count", "bytes", "seq_number",
                "enqueue_ns", "end_ns", "timing_source")
#: the STATS counters, as the plugin reports them
STATS_FIELDS = ("events_dropped_pool_full", "records_dropped_ring_full", "records_undelivered", "records_sent",
                "records_emitted", "events_stale", "reconnects", "sampled_out", "kernel_ch_rejected")
_ABI_VERSION = 0  # PROCESS.abi_version: 0 = not an NCCL profiler plugin (a Python source)


def events(items: list[tuple], *, pid: int, first_seq: int) -> np.ndarray:
    """COLL / P2P records from ``EVENT_FIELDS`` tuples; ``record_seq`` counts up from ``first_seq``."""
    n = len(items)
    cols = list(zip(*items))
    rec = np.zeros(n, EVENT_DTYPE)
    comms = cols[0]
    if len({id(c) for c in comms}) == 1:
        c = comms[0]
        rec["comm_hash"], rec["rank"], rec["nranks"], rec["nnodes"] = c.comm_hash, c.rank, c.nranks, c.nnodes
    else:
        rec["comm_hash"] = [c.comm_hash for c in comms]
        rec["rank"] = [c.rank for c in comms]
        rec["nranks"] = [c.nranks for c in comms]
        rec["nnodes"] = [c.nnodes for c in comms]
    for i, name in enumerate(("kind", "func", "datatype"), start=1):
        rec[name] = cols[i]
    rec["algo"] = UNKNOWN
    rec["proto"] = UNKNOWN
    for i, name in enumerate(("root", "count", "bytes", "seq_number", "enqueue_ns", "cpu_end_ns",
                              "timing_source"), start=4):
        rec[name] = cols[i]
    rec["pid"] = pid
    rec["record_seq"] = np.arange(first_seq, first_seq + n, dtype=np.uint64)
    return rec


def comm(c, *, pid: int) -> np.ndarray:
    """The COMM record naming communicator ``c``."""
    r = np.zeros(1, COMM_DTYPE)
    r["kind"], r["pid"], r["comm_hash"] = Kind.COMM, pid, c.comm_hash
    r["rank"], r["nranks"], r["nnodes"] = c.rank, c.nranks, c.nnodes
    r["comm_name"] = c.name.encode()[:88]
    return r


def stats(counters: dict, *, pid: int, time_ns: int, conn_ordinal: int) -> np.ndarray:
    """A STATS record: ``counters[STATS_FIELDS]`` and the connection's ordinal in ``reserved[0]``."""
    r = np.zeros(1, STATS_DTYPE)
    r["kind"], r["pid"], r["time_ns"] = Kind.STATS, pid, time_ns
    r["reserved"][0][0] = conn_ordinal
    for k in STATS_FIELDS:
        r[k] = counters[k]
    return r


def process(*, pid: int, start_ns: int, host: str, job_id: str) -> np.ndarray:
    """The PROCESS record that opens every connection."""
    r = np.zeros(1, PROCESS_DTYPE)
    r["kind"], r["abi_version"], r["pid"], r["start_ns"] = Kind.PROCESS, _ABI_VERSION, pid, start_ns
    r["host"] = host.encode()[:55]
    r["job_id"] = job_id.encode()[:47]
    return r


def frame(body: bytes) -> bytes:
    """One frame: the header (magic, version, record size, record count, flags) then ``body``."""
    return _HEADER.pack(MAGIC, VERSION, RECORD_SIZE, len(body) // RECORD_SIZE, 0) + body
