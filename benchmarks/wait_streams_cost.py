"""Window aggregation cost of the wait stand-ins (``WindowConfig.wait_streams``), on one core, seeded.

Two workloads of the same records: every record untimed (NCCL 2.31+ after a send/recv: every complete
collective instance gets waits, a second aggregation per window) and the usual mix (2 % untimed records,
almost no instance wholly untimed: the stand-ins cost one mask per window). Baseline, in the same run: the
same aggregator with ``wait_streams=False``. CPU seconds (``time.process_time``), the best of ``--repeats``.
Last line: key=value; ``pass`` when the untimed workload costs at most ``--max-untimed-ratio`` × the
baseline and the usual mix at most ``--max-mixed-ratio`` ×.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("POLARS_MAX_THREADS", "1")
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from dynamiccl.collector.component import RecordBatch  # noqa: E402
from dynamiccl.collector.config import WindowConfig  # noqa: E402
from dynamiccl.collector.metrics import SelfMetrics  # noqa: E402
from dynamiccl.collector.processors.window_agg import WindowAggregator  # noqa: E402
from dynamiccl.harness.collector_testing import NopConsumer, synthetic_events  # noqa: E402


def cost(ev, wait_streams: bool, repeats: int, batch: int = 8192) -> float:
    best = float("inf")
    for _ in range(repeats):
        agg = WindowAggregator(WindowConfig(window_s=1.0, wait_streams=wait_streams), next_consumer=NopConsumer(),
                               metrics=SelfMetrics())
        t0 = time.process_time()
        for lo in range(0, len(ev), batch):
            agg.consume(RecordBatch(ev[lo:lo + batch], "node0", "bench", {}))
        agg.shutdown()
        best = min(best, time.process_time() - t0)
    return best


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=2_000_000)
    ap.add_argument("--nranks", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-untimed-ratio", type=float, default=3.0)
    ap.add_argument("--max-mixed-ratio", type=float, default=1.25)
    args = ap.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {0})
    n_inst = args.records // args.nranks
    out = {}
    for name, untimed in (("untimed", 1.0), ("mixed", 0.02)):
        # 1 s of event time: one window of ``--records`` records
        ev = synthetic_events(n_inst, nranks=args.nranks, seed=args.seed, rate_per_s=n_inst,
                              untimed_fraction=untimed, cpu_timed_fraction=0.0 if untimed == 1.0 else 0.05)
        off = cost(ev, False, args.repeats)
        on = cost(ev, True, args.repeats)
        out[name] = (off, on, on / off)
        print(f"{name:8s} {len(ev):,} records: off {off:.3f} s, on {on:.3f} s CPU, ratio {on / off:.3f}", flush=True)
    ok = out["untimed"][2] <= args.max_untimed_ratio and out["mixed"][2] <= args.max_mixed_ratio
    print(" ".join([f"untimed_ratio={out['untimed'][2]:.3f}", f"mixed_ratio={out['mixed'][2]:.3f}",
                    f"untimed_on_s={out['untimed'][1]:.3f}", f"untimed_off_s={out['untimed'][0]:.3f}",
                    f"pass={ok}"]))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
