"""/metrics rendering: the collector's fast text (prom_text.py) against prometheus_client's generate_latest.

A seeded exporter state like the forged-label attack leaves it (``--jobs`` jobs with a histogram label
set per collective, algorithm and size, up to the default series budget) is rendered both ways in
the same process. Printed: body size, seconds per render for generate_latest (the baseline), the fast
text built cold (no label text kept), rebuilt (first scrape after a window: label text kept from the
last render) and reused (later scrapes in the same window). ``pass=1`` when the bytes are identical
and the cold build is at least ``--min-speedup`` times faster than the baseline.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from prometheus_client import CollectorRegistry, generate_latest  # noqa: E402

from dynamiccl.collector.component import RecordBatch  # noqa: E402
from dynamiccl.collector.config import PrometheusConfig, WindowConfig  # noqa: E402
from dynamiccl.collector.exporters.prom_text import Renderer  # noqa: E402
from dynamiccl.collector.exporters.prometheus import PrometheusExporter  # noqa: E402
from dynamiccl.collector.metrics import SelfMetrics  # noqa: E402
from dynamiccl.collector.processors.window_agg import WindowAggregator  # noqa: E402
from dynamiccl.harness.collector_testing import synthetic_events  # noqa: E402


def build(jobs: int, seed: int) -> PrometheusExporter:
    m = SelfMetrics()
    exp = PrometheusExporter(PrometheusConfig(address=None), metrics=m, registry=CollectorRegistry(),
                             clock=lambda: 1000.0)
    agg = WindowAggregator(WindowConfig(), next_consumer=exp, metrics=m, clock=lambda: 1000.0)
    for j in range(jobs):
        ev = synthetic_events(64, nranks=2, seed=seed + j, start_ns=1_700_000_000 * 10**9,
                              funcs=("AllReduce", "AllGather", "ReduceScatter"), log2_bytes=(10, 24))
        agg.consume(RecordBatch(ev, f"host-{j}", f"job-{j}", {}))
    agg.shutdown()
    return exp


def per_call(fn, min_s: float = 1.0) -> float:
    n, t0 = 0, time.perf_counter()
    while True:
        fn()
        n += 1
        if time.perf_counter() - t0 >= min_s:
            return (time.perf_counter() - t0) / n


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--min-speedup", type=float, default=3.0)
    args = ap.parse_args()
    exp = build(args.jobs, args.seed)
    c = exp.collector
    only = CollectorRegistry()
    only.register(c)
    base_body, fast_body = generate_latest(only), c.render()
    base_s = per_call(lambda: generate_latest(only))
    cold_s = per_call(lambda: (setattr(c, "_cached", None), setattr(c, "_renderer", Renderer()), c.render()))
    rebuilt_s = per_call(lambda: (setattr(c, "_cached", None), c.render()))
    reused_s = per_call(c.render)
    identical = int(base_body == fast_body)
    ok = identical and base_s / cold_s >= args.min_speedup
    fields = {"bytes": len(fast_body), "series_label_sets": len(exp.state.hist), "identical": identical,
              "generate_latest_s": f"{base_s:.4f}", "fast_cold_s": f"{cold_s:.4f}",
              "fast_rebuilt_s": f"{rebuilt_s:.4f}", "fast_reused_s": f"{reused_s:.5f}",
              "speedup_cold": f"{base_s / cold_s:.1f}", "speedup_rebuilt": f"{base_s / rebuilt_s:.1f}",
              "speedup_reused": f"{base_s / reused_s:.0f}", "load1": f"{os.getloadavg()[0]:.2f}", "pass": int(ok)}
    print(" ".join(f"{k}={v}" for k, v in fields.items()))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
