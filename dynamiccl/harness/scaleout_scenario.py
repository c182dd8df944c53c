"""The scale-out detection scenario: a bandwidth drop on every rank and one straggler (records).

Used by tests/scaleout/test_shard_loop.py and benchmarks/fanin_detect.py to check that a central
shard reports the regime changes the single collector reports on the same records.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dynamiccl.collector.records import event_time_ns
from dynamiccl.harness.collector_testing import synthetic_events

__all__ = ["Scenario", "drop_then_straggler"]

START_NS = 1_700_000_000_000_000_000


@dataclass(frozen=True)
class Scenario:
    nranks: int = 16
    nnodes: int = 2
    windows: int = 70
    rate_per_s: float = 150.0        # instances per second (each: one record per rank)
    drop_at_s: float = 40.0          # every duration x drop_factor from here
    drop_factor: float = 2.5
    straggler_at_s: float = 55.0     # this rank arrives straggler_delay_s late from here
    straggler: int = 11
    straggler_delay_s: float = 2e-3
    straggler_until_s: float = float("inf")   # the straggler catches up here
    comm_hashes: tuple[int, ...] = (0x1111_2222_3333_4444,)   # instances spread evenly over these


def drop_then_straggler(sc: Scenario, seed: int = 3) -> np.ndarray:
    """The records of ``sc`` (its communicators, AllReduce of 1-4 MiB, every record timed)."""
    kw = dict(nranks=sc.nranks, nnodes=sc.nnodes, rate_per_s=sc.rate_per_s, untimed_fraction=0.0,
              log2_bytes=(20, 22), comm_hashes=sc.comm_hashes, funcs=("AllReduce",), start_ns=START_NS)
    n = int(sc.rate_per_s * sc.windows)
    ev = synthetic_events(n, seed=seed, **kw)
    late = synthetic_events(n, seed=seed, straggler_rank=sc.straggler, straggler_delay_s=sc.straggler_delay_s, **kw)
    t = (event_time_ns(ev) - START_NS) / 1e9
    ev = np.where((t >= sc.straggler_at_s) & (t < sc.straggler_until_s), late, ev)
    t = (event_time_ns(ev) - START_NS) / 1e9
    slow = t >= sc.drop_at_s
    for end, start in (("gpu_end_ns", "gpu_start_ns"), ("cpu_end_ns", "enqueue_ns")):
        d = ev[end].astype(np.int64) - ev[start].astype(np.int64)
        ev[end] = np.where(slow & (ev[end] > 0),
                           ev[start].astype(np.int64) + (d * sc.drop_factor).astype(np.int64), ev[end])
    return ev
