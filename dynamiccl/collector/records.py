"""Vectorised per-record derivations shared by the aggregator, exporters and tests.

All functions take a ``wire_format.EVENT_DTYPE`` array and never loop over records in Python.
"""
from __future__ import annotations

import numpy as np

from dynamiccl.collector.wire_format import ALGOS, FUNCS, PROTOS, UNKNOWN, Kind, TimingSource
from dynamiccl.contracts.collectives import COLLECTIVES, FULL_BUFFER_FUNCS

__all__ = ["valid_mask", "event_time_ns", "duration_s", "size_bucket", "traffic_bytes",
           "busbw_factor", "BUSBW_FACTOR_KIND", "FUNC_CODE"]

FUNC_CODE = {name: i for i, name in enumerate(FUNCS)}
# contracts' busbw kind per wire code: 0: factor 1; 1: 2(n-1)/n (AllReduce); 2: (n-1)/n (AllGather,
# ReduceScatter, AlltoAll)
BUSBW_FACTOR_KIND = np.zeros(256, np.int8)
BUSBW_FACTOR_KIND[:len(COLLECTIVES)] = [c.busbw for c in COLLECTIVES]
# AllGather / ReduceScatter: traffic S = per-rank bytes × nranks (nccl-tests)
_TRAFFIC_TIMES_NRANKS = np.zeros(256, bool)
_TRAFFIC_TIMES_NRANKS[[FUNC_CODE[f] for f in FULL_BUFFER_FUNCS]] = True


def valid_mask(ev: np.ndarray) -> np.ndarray:
    """Records a well-behaved plugin can produce (enum codes in range, rank < nranks)."""
    kind = ev["kind"]
    algo, proto = ev["algo"], ev["proto"]
    rank, nranks = ev["rank"], ev["nranks"]
    return (((kind == Kind.COLL) | (kind == Kind.P2P))
            & (ev["func"] < len(FUNCS))
            & ((algo < len(ALGOS)) | (algo == UNKNOWN))
            & ((proto < len(PROTOS)) | (proto == UNKNOWN))
            & (ev["timing_source"] <= TimingSource.KERNEL_CPU)
            & (nranks > 0) & (rank >= 0) & (rank < nranks))


def event_time_ns(ev: np.ndarray) -> np.ndarray:
    """gpu_start_ns for KERNEL_GPU records, else enqueue_ns (docs/architecture.md)."""
    gpu = ev["timing_source"] == TimingSource.KERNEL_GPU
    return np.where(gpu, ev["gpu_start_ns"], ev["enqueue_ns"]).astype(np.int64)


def duration_s(ev: np.ndarray) -> np.ndarray:
    """GPU end − start (KERNEL_GPU), cpu_end − enqueue (KERNEL_CPU), NaN otherwise or if < 0."""
    ts = ev["timing_source"]
    gpu = ts == TimingSource.KERNEL_GPU
    cpu = ts == TimingSource.KERNEL_CPU
    end = np.where(gpu, ev["gpu_end_ns"], ev["cpu_end_ns"]).view(np.int64)
    start = np.where(gpu, ev["gpu_start_ns"], ev["enqueue_ns"]).view(np.int64)
    d = (end - start).astype(np.float64) * 1e-9
    d[~(gpu | cpu) | (d < 0)] = np.nan
    return d


def size_bucket(nbytes: np.ndarray) -> np.ndarray:
    """floor(log2(bytes)) as int32; -1 for 0 bytes.

    >>> size_bucket(np.array([0, 1, 2, 3, 1024, 1025, 2**40], np.uint64)).tolist()
    [-1, 0, 1, 1, 10, 10, 40]
    """
    return (np.frexp(nbytes.astype(np.float64))[1] - 1).astype(np.int32)


def traffic_bytes(func: np.ndarray, nbytes: np.ndarray, nranks: np.ndarray) -> np.ndarray:
    """nccl-tests "S": AllGather/ReduceScatter = bytes × nranks, else bytes (float64)."""
    b = nbytes.astype(np.float64)
    return np.where(_TRAFFIC_TIMES_NRANKS[func], b * nranks, b)


def busbw_factor(func: np.ndarray, nranks: np.ndarray) -> np.ndarray:
    """2(n−1)/n AllReduce; (n−1)/n AllGather/ReduceScatter/AlltoAll; 1 otherwise.

    >>> busbw_factor(np.array([1, 0, 3]), np.array([8, 8, 8])).tolist()
    [1.75, 0.875, 1.0]
    """
    n = np.asarray(nranks, np.float64)
    k = BUSBW_FACTOR_KIND[np.asarray(func)]
    return np.where(k == 1, 2 * (n - 1) / n, np.where(k == 2, (n - 1) / n, 1.0))
