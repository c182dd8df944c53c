"""Test doubles and synthetic plugin data (the OTel ``consumertest`` idea).

Everything here builds records from the numpy dtypes in ``dynamiccl.collector.wire_format``, so tests and
benchmarks never depend on the C plugin being built.

>>> ev = synthetic_events(4, nranks=2, seed=0)
>>> len(ev), int(ev["nranks"][0]), sorted(set(ev["rank"].tolist()))
(8, 2, [0, 1])
>>> frame = encode_frame(ev)
>>> len(frame) == 16 + 8 * 128
True
"""
from __future__ import annotations

import threading
from typing import Any, Sequence

import numpy as np

from dynamiccl.collector.wire_format import (
    COMM_DTYPE, EVENT_DTYPE, FUNCS, HEADER_DTYPE, Kind, MAGIC, MAX_RECORDS_PER_FRAME,
    PROCESS_DTYPE, RECORD_SIZE, STATS_DTYPE, TimingSource, UNKNOWN, VERSION,
)

__all__ = [
    "SinkConsumer", "NopConsumer", "synthetic_events", "encode_frame", "encode_frames",
    "process_record", "comm_record", "stats_record", "header",
]

F = {name: i for i, name in enumerate(FUNCS)}
DEFAULT_FUNCS = ("AllReduce", "AllGather", "ReduceScatter", "Broadcast")


class SinkConsumer:
    """Thread-safe consumer that keeps every item it receives."""

    def __init__(self):
        self.items: list[Any] = []
        self._lock = threading.Lock()
        self._cv = threading.Condition(self._lock)

    def consume(self, item: Any) -> None:
        with self._cv:
            self.items.append(item)
            self._cv.notify_all()

    def wait_for(self, predicate, timeout: float = 10.0) -> bool:
        with self._cv:
            return self._cv.wait_for(lambda: predicate(self.items), timeout)

    def start(self) -> None:
        pass

    def shutdown(self) -> None:
        pass


class NopConsumer:
    def consume(self, item: Any) -> None:
        pass

    def start(self) -> None:
        pass

    def shutdown(self) -> None:
        pass


def synthetic_events(n_instances: int, *, nranks: int = 8, nnodes: int = 1, seed: int = 0,
                     start_ns: int = 1_700_000_000_000_000_000, rate_per_s: float = 1000.0,
                     comm_hashes: Sequence[int] = (0x1111_2222_3333_4444, 0xF00D_0000_0000_0001),
                     funcs: Sequence[str] = DEFAULT_FUNCS, log2_bytes: tuple[int, int] = (10, 27),
                     straggler_rank: int | None = None, straggler_delay_s: float = 2e-4,
                     untimed_fraction: float = 0.02, cpu_timed_fraction: float = 0.05,
                     pid_base: int = 1000, seq_base: int = 1, p2p_fraction: float = 0.0
                     ) -> np.ndarray:
    """``n_instances`` collective instances × ``nranks`` records, ordered by instance.

    Each rank is one process (pid = pid_base + rank) whose ``record_seq`` counts up from
    ``seq_base``. A straggler arrives ``straggler_delay_s`` late, so its own durations are
    *shorter* and everyone else's longer by the delay.
    """
    # the parts draw from one generator in a fixed order (instances, then arrivals, then timing
    # sources): a seed gives the same records as it always did
    rng = np.random.default_rng(seed)
    n = n_instances
    ins = _draw_instances(rng, n, comm_hashes, funcs, log2_bytes, p2p_fraction)
    rec = np.zeros(n * nranks, dtype=EVENT_DTYPE)
    rank = np.tile(np.arange(nranks, dtype=np.int32), n)
    inst = np.repeat(np.arange(n), nranks)
    _fill_identity(rec, ins, inst, rank, nranks=nranks, nnodes=nnodes, pid_base=pid_base)
    t_inst = start_ns + (np.arange(n) * (1e9 / rate_per_s)).astype(np.int64)
    base_dur = 2e-5 + ins["nbytes"] / 20e9  # seconds
    start_abs, end_abs = _draw_times(rng, t_inst, base_dur, inst, rank, n, nranks,
                                     straggler_rank, straggler_delay_s)
    _fill_timing(rec, rng, start_abs, end_abs, untimed_fraction, cpu_timed_fraction)
    rec["record_seq"] = seq_base + np.repeat(np.arange(n, dtype=np.uint64), nranks)
    return rec


def _draw_instances(rng: np.random.Generator, n: int, comm_hashes: Sequence[int], funcs: Sequence[str],
                    log2_bytes: tuple[int, int], p2p_fraction: float) -> dict[str, np.ndarray]:
    """Per instance: communicator, function (SendRecv for the p2p share), seqNumber, size
    (a power of two in ``log2_bytes``), algorithm and protocol (UNKNOWN for p2p)."""
    comm_idx = rng.integers(0, len(comm_hashes), n)
    func_codes = np.array([F[f] for f in funcs], dtype=np.uint8)[rng.integers(0, len(funcs), n)]
    is_p2p = rng.random(n) < p2p_fraction
    func_codes = np.where(is_p2p, F["SendRecv"], func_codes).astype(np.uint8)
    lb = rng.integers(log2_bytes[0], log2_bytes[1] + 1, n)
    nbytes = (2 ** lb).astype(np.uint64)
    algo = rng.integers(0, 2, n).astype(np.uint8)  # TREE / RING
    proto = rng.integers(0, 3, n).astype(np.uint8)
    algo = np.where(is_p2p, UNKNOWN, algo).astype(np.uint8)
    proto = np.where(is_p2p, UNKNOWN, proto).astype(np.uint8)
    return {"comm_idx": comm_idx, "func": func_codes, "is_p2p": is_p2p,
            "seq": _seq_numbers(comm_idx, func_codes), "nbytes": nbytes, "algo": algo, "proto": proto,
            "comm_hashes": np.asarray(comm_hashes, dtype=np.uint64)}


def _seq_numbers(comm_idx: np.ndarray, func_codes: np.ndarray) -> np.ndarray:
    """seqNumber per (comm, func), as NCCL counts it: the cumcount within the key."""
    n = comm_idx.size
    key = comm_idx.astype(np.int64) * 256 + func_codes
    order = np.argsort(key, kind="stable")
    sorted_key = key[order]
    starts = np.r_[0, np.flatnonzero(np.diff(sorted_key)) + 1]
    run_len = np.diff(np.r_[starts, n])
    cum = np.arange(n) - np.repeat(starts, run_len)
    seq = np.empty(n, np.uint64)
    seq[order] = cum
    return seq


def _fill_identity(rec: np.ndarray, ins: dict[str, np.ndarray], inst: np.ndarray, rank: np.ndarray, *,
                   nranks: int, nnodes: int, pid_base: int) -> None:
    """Each record's what and who: its instance's operation, and its rank's process."""
    is_p2p = ins["is_p2p"]
    rec["kind"] = np.where(is_p2p[inst], Kind.P2P, Kind.COLL)
    rec["func"] = ins["func"][inst]
    rec["datatype"] = 6  # ncclFloat32
    rec["algo"] = ins["algo"][inst]
    rec["proto"] = ins["proto"][inst]
    rec["n_channels"] = 4
    rec["n_warps"] = 16
    rec["rank"] = rank
    rec["nranks"] = nranks
    rec["nnodes"] = nnodes
    rec["pid"] = pid_base + rank
    rec["root"] = np.where(is_p2p[inst], (rank + 1) % nranks, 0)
    rec["comm_hash"] = ins["comm_hashes"][ins["comm_idx"][inst]]
    rec["seq_number"] = ins["seq"][inst]
    rec["bytes"] = ins["nbytes"][inst]
    rec["count"] = ins["nbytes"][inst] // 4


def _draw_times(rng: np.random.Generator, t_inst: np.ndarray, base_dur: np.ndarray, inst: np.ndarray,
                rank: np.ndarray, n: int, nranks: int, straggler_rank: int | None,
                straggler_delay_s: float) -> tuple[np.ndarray, np.ndarray]:
    """(start, end) ns of each record: ranks arrive with a little jitter (the straggler
    ``straggler_delay_s`` late) and everyone finishes together once the last rank arrived."""
    arrive = rng.exponential(5e-6, n * nranks)
    if straggler_rank is not None:
        arrive = arrive + np.where(rank == straggler_rank, straggler_delay_s, 0.0)
    last_arrival = arrive.reshape(n, nranks).max(axis=1)[inst]
    # everyone finishes together once the last rank arrived (plus a little noise)
    finish = last_arrival + base_dur[inst] * rng.lognormal(0.0, 0.1, n * nranks)
    start_abs = t_inst[inst] + (arrive * 1e9).astype(np.int64)
    end_abs = t_inst[inst] + (finish * 1e9).astype(np.int64)
    return start_abs, end_abs


def _fill_timing(rec: np.ndarray, rng: np.random.Generator, start_abs: np.ndarray, end_abs: np.ndarray,
                 untimed_fraction: float, cpu_timed_fraction: float) -> None:
    """Each record's timing source (untimed, CPU-timed or GPU-timed in the given shares) and the
    timestamps that source provides."""
    u = rng.random(rec.size)
    timing = np.where(u < untimed_fraction, TimingSource.NONE,
                      np.where(u < untimed_fraction + cpu_timed_fraction, TimingSource.KERNEL_CPU,
                               TimingSource.KERNEL_GPU)).astype(np.uint8)
    rec["timing_source"] = timing
    rec["enqueue_ns"] = start_abs - 3000
    gpu = timing == TimingSource.KERNEL_GPU
    rec["gpu_start_ns"] = np.where(gpu, start_abs, 0)
    rec["gpu_end_ns"] = np.where(gpu, end_abs, 0)
    rec["cpu_end_ns"] = np.where(timing != TimingSource.NONE, end_abs + 1000, 0)
    rec["channels_seen"] = np.where(timing == TimingSource.NONE, 0, 4)

def header(n_records: int, *, magic: int = MAGIC, version: int = VERSION,
           record_size: int = RECORD_SIZE, flags: int = 0) -> bytes:
    h = np.zeros(1, HEADER_DTYPE)
    h["magic"], h["version"], h["record_size"], h["n_records"], h["flags"] = (
        magic, version, record_size, n_records, flags)
    return h.tobytes()


def encode_frame(records: np.ndarray, **header_kw) -> bytes:
    """One frame: header + the records' raw bytes (any 128-byte dtype)."""
    return header(len(records), **header_kw) + np.ascontiguousarray(records).tobytes()


def encode_frames(records: np.ndarray, *, per_frame: int = 1024) -> bytes:
    per_frame = min(per_frame, MAX_RECORDS_PER_FRAME)
    return b"".join(encode_frame(records[i:i + per_frame])
                    for i in range(0, len(records), per_frame))


def process_record(host: str, job_id: str, pid: int, *, start_ns: int = 1, record_seq: int = 0
                   ) -> np.ndarray:
    r = np.zeros(1, PROCESS_DTYPE)
    r["kind"], r["abi_version"], r["pid"], r["start_ns"] = Kind.PROCESS, 6, pid, start_ns
    r["record_seq"], r["host"], r["job_id"] = record_seq, host.encode(), job_id.encode()
    return r


def comm_record(comm_hash: int, name: str, *, pid: int, rank: int = 0, nranks: int = 8,
                nnodes: int = 1, record_seq: int = 0) -> np.ndarray:
    r = np.zeros(1, COMM_DTYPE)
    r["kind"], r["pid"], r["comm_hash"], r["rank"] = Kind.COMM, pid, comm_hash, rank
    r["nranks"], r["nnodes"], r["record_seq"], r["comm_name"] = nranks, nnodes, record_seq, name.encode()
    return r


def stats_record(pid: int, *, record_seq: int = 0, **values: int) -> np.ndarray:
    r = np.zeros(1, STATS_DTYPE)
    r["kind"], r["pid"], r["record_seq"] = Kind.STATS, pid, record_seq
    for k, v in values.items():
        r[k] = v
    return r


def advance(template: np.ndarray, step: int, *, period_ns: int, instances: int) -> np.ndarray:
    """A copy of ``template`` moved ``step`` periods later in event time, with record_seq and
    seq_number continued (for long synthetic runs built from one generated second)."""
    ev = template.copy()
    dt = np.uint64(step * period_ns)
    for f in ("enqueue_ns", "gpu_start_ns", "gpu_end_ns", "cpu_end_ns"):
        col = ev[f]
        col[col > 0] += dt
    ev["record_seq"] += np.uint64(step * instances)
    ev["seq_number"] += np.uint64(step * instances)
    return ev
