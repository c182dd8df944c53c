"""Decode + aggregate throughput on one core (seeded, no network).

Baseline, in the same process: copying the same frames' records out with np.frombuffer.
Rates are given per wall second and per CPU second of this process (``time.process_time``; one
thread does the work, so CPU seconds are one core's seconds; on a busy machine the CPU-second rate
is the one that still measures this code rather than the neighbours). The target is judged on the
CPU-second rate; both are printed.

Decode + aggregation runs twice over the same streams, each time with a fresh aggregator: "cold" is
the first run in the process (it pays the allocator's first-touch page faults for window-sized
buffers), "steady" the second — what a collector that has been up for more than a window does. The
target is judged on the steady figure; both are printed. Last line: machine-readable key=value
(``decode_aggregate_cpu_rps`` = steady, ``decode_aggregate_cold_cpu_rps`` = cold).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("POLARS_MAX_THREADS", "1")
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import numpy as np  # noqa: E402

from dynamiccl.collector.component import RecordBatch  # noqa: E402
from dynamiccl.collector.config import WindowConfig  # noqa: E402
from dynamiccl.collector.decode import StreamDecoder  # noqa: E402
from dynamiccl.collector.metrics import SelfMetrics  # noqa: E402
from dynamiccl.collector.processors.window_agg import WindowAggregator  # noqa: E402
from dynamiccl.harness.collector_testing import (NopConsumer, encode_frame, encode_frames, process_record,  # noqa: E402
                               synthetic_events)
from dynamiccl.collector.wire_format import EVENT_DTYPE  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=4_000_000)
    ap.add_argument("--nranks", type=int, default=8)
    ap.add_argument("--rate", type=float, default=2e6, help="records per second of event time")
    ap.add_argument("--frame", type=int, default=1024, help="records per frame")
    ap.add_argument("--chunk", type=int, default=1 << 20, help="bytes per read")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {0})
    ev = synthetic_events(args.records // args.nranks, nranks=args.nranks, seed=args.seed,
                          rate_per_s=args.rate / args.nranks)
    # one stream per rank, as the plugin sends them
    streams = []
    for r in range(args.nranks):
        mine = ev[ev["rank"] == r]
        streams.append(encode_frame(process_record("node0", "bench", 1000 + r)) +
                       encode_frames(mine, per_frame=args.frame))
    n = len(ev)
    total_bytes = sum(len(s) for s in streams)

    # baseline: raw record copy out of the frames (header skipping done with one view per frame)
    t0 = time.perf_counter()
    c0 = time.process_time()
    copied = 0
    per = 16 + args.frame * 128
    for s in streams:
        mv = memoryview(s)
        for off in range(16 + 144, len(s), per):
            cnt = min(args.frame, (len(s) - off) // 128)
            copied += len(np.frombuffer(mv, EVENT_DTYPE, cnt, off).copy())
    t_base = time.perf_counter() - t0
    c_base = time.process_time() - c0

    # decode only
    def run(aggregate: bool) -> tuple[float, int]:
        m = SelfMetrics()
        agg = WindowAggregator(WindowConfig(window_s=1.0), next_consumer=NopConsumer(),
                               metrics=m) if aggregate else None
        decs = [StreamDecoder() for _ in streams]
        pos = [0] * len(streams)
        decoded = 0
        t = time.perf_counter()
        c = time.process_time()
        active = True
        while active:  # round-robin over the per-rank streams, one chunk each, like the selector loop
            active = False
            for i, s in enumerate(streams):
                if pos[i] >= len(s):
                    continue
                active = True
                buf = memoryview(s)[pos[i]:pos[i] + args.chunk + per]
                res = decs[i].feed(buf)
                pos[i] += res.consumed
                if res.events is not None:
                    decoded += len(res.events)
                    if agg is not None:
                        agg.consume(RecordBatch(res.events, decs[i].host, decs[i].job_id, decs[i].comm_names))
        if agg is not None:
            agg.shutdown()
            assert m.aggregated == n, (m.aggregated, n, m.dropped)
        return time.perf_counter() - t, time.process_time() - c, decoded

    t_dec, c_dec, d1 = run(False)
    t_cold, c_cold, d2 = run(True)
    t_all, c_all, d3 = run(True)
    assert d1 == d2 == d3 == n
    base_rate, dec_rate, all_rate = copied / t_base, n / t_dec, n / t_all
    cbase, cdec, call, ccold = copied / c_base, n / c_dec, n / c_all, n / c_cold
    print(f"records={n} bytes={total_bytes} frames_of={args.frame} polars_threads={os.environ['POLARS_MAX_THREADS']}")
    print("                              per wall s            per CPU s")
    print(f"baseline np.frombuffer copy : {base_rate / 1e6:8.2f} M records/s  {cbase / 1e6:8.2f} M records/s")
    print(f"decode (StreamDecoder)      : {dec_rate / 1e6:8.2f} M records/s  {cdec / 1e6:8.2f} M records/s  ratio {cdec / cbase:.2f}")
    print(f"decode + aggregation, cold  : {n / t_cold / 1e6:8.2f} M records/s  {ccold / 1e6:8.2f} M records/s  ratio {ccold / cbase:.2f}")
    print(f"decode + aggregation, steady: {all_rate / 1e6:8.2f} M records/s  {call / 1e6:8.2f} M records/s  ratio {call / cbase:.2f}")
    print(f"load average (1 min) {os.getloadavg()[0]:.2f}")
    print(f"baseline_rps={base_rate:.0f} decode_rps={dec_rate:.0f} decode_aggregate_rps={all_rate:.0f} "
          f"decode_aggregate_cpu_rps={call:.0f} decode_aggregate_cold_cpu_rps={ccold:.0f} "
          f"ratio_vs_baseline={call / cbase:.3f} target_rps=2000000 meets_target={int(call >= 2e6)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
