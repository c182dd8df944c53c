"""DYNAMICCL_CLOCK=1 (the TSC record clock, clock.h) end to end: the real plugin under the emulator,
records streamed to a fake collector; their host timestamps are CLOCK_REALTIME readings."""
from __future__ import annotations

import time

import numpy as np

from dynamiccl.collector import wire_format as wf
from dynamiccl.nccl_profiler_plugin.emulator import FLAGS

from test_emulator_stream import make_ops


def test_tsc_clock_records_are_realtime(run_scenario, collector_factory, sock_addr):
    col = collector_factory(sock_addr)
    ops = make_ops(200, flags=FLAGS["NO_GPU_TIMER"])  # KERNEL_CPU: cpu_end_ns is a host reading too
    t0 = time.time_ns()
    res = run_scenario([{"op": "init", "hash": 0xC10C}, {"op": "sleep", "s": 0.1},  # the sender's rate
                        {"op": "run", "ops": ops}, {"op": "finalize"}], sock_addr, env={"DYNAMICCL_CLOCK": "1"})
    t1 = time.time_ns()
    assert res["ok"], res
    ev = col.events()
    assert len(ev) == 200 and np.all(ev["timing_source"] == wf.TimingSource.KERNEL_CPU)
    enq, end = ev["enqueue_ns"].astype(np.int64), ev["cpu_end_ns"].astype(np.int64)
    assert enq.min() >= t0 and end.max() <= t1, (enq.min() - t0, t1 - end.max())
    # an emulated operation lasts microseconds: its host interval is short and, within the anchor's
    # error (tens of ns), not negative
    assert np.all(end - enq > -1_000) and np.all(end - enq < 50_000_000), (end - enq).min()
