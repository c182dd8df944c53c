"""Memory under a long run: a simulated run at 100,000 records/s (default 60 minutes of event
time), generated as fast as possible, through decode + aggregation + every exporter (Prometheus
state, feature stream subscriber, parquet history) — sampling RSS.

Baseline, in the same process: RSS after imports and after generating the one-second template.
Last line: machine-readable key=value.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import numpy as np  # noqa: E402


def rss_mb(pid: int | str = "self") -> float:
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:  # the writer process has exited
        return 0.0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=60.0, help="simulated minutes of event time")
    ap.add_argument("--rate", type=int, default=100_000, help="records per simulated second")
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    from dynamiccl.collector.component import RecordBatch
    from dynamiccl.collector.config import default_config
    from dynamiccl.collector.decode import StreamDecoder
    from dynamiccl.collector.pipeline import Pipeline
    from dynamiccl.harness.collector_testing import advance, encode_frame, encode_frames, process_record, synthetic_events

    rss_import = rss_mb()
    inst = args.rate // args.ranks
    template = synthetic_events(inst, nranks=args.ranks, seed=args.seed, rate_per_s=inst,
                                start_ns=1_700_000_000 * 10**9)
    masks = [template["rank"] == r for r in range(args.ranks)]
    rss_base = rss_mb()
    d = tempfile.mkdtemp(prefix="dcm")
    cfg = default_config().replace(receiver={"listen": ()}, prometheus={"address": None},
                                   features={"address": None}, parquet={"directory": os.path.join(d, "pq")})
    pipe = Pipeline(cfg).start()
    sub = pipe.subscribe(max_queue=8)
    decs = [StreamDecoder() for _ in range(args.ranks)]
    for r, dec in enumerate(decs):
        dec.feed(encode_frame(process_record(f"node{r // 8}", "mem", 7000 + r)))
    samples: list[tuple[float, float]] = []
    writer_samples: list[float] = []
    writer_pid = pipe.parquet.writer_pid
    stop = threading.Event()

    def sampler():
        t0 = time.monotonic()
        while not stop.wait(0.2):
            samples.append((time.monotonic() - t0, rss_mb()))
            if writer_pid is not None:
                writer_samples.append(rss_mb(writer_pid))

    def drain():
        while not stop.is_set():
            sub.get(timeout=0.2)

    threads = [threading.Thread(target=sampler, daemon=True), threading.Thread(target=drain, daemon=True)]
    for t in threads:
        t.start()
    seconds = int(args.minutes * 60)
    t0 = time.monotonic()
    for step in range(seconds):
        ev = advance(template, step, period_ns=10**9, instances=inst)
        for r, dec in enumerate(decs):
            res = dec.feed(encode_frames(ev[masks[r]], per_frame=1024))
            pipe.ingest(RecordBatch(res.events, dec.host, dec.job_id, dec.comm_names), block=True)
    pipe.shutdown()
    elapsed = time.monotonic() - t0
    stop.set()
    for t in threads:
        t.join()
    m = pipe.metrics.snapshot()
    files = sum(len(f) for _, _, f in os.walk(os.path.join(d, "pq")))
    size = sum(os.path.getsize(os.path.join(p, f)) for p, _, fs in os.walk(os.path.join(d, "pq")) for f in fs)
    shutil.rmtree(d, ignore_errors=True)
    rss = np.array([s[1] for s in samples]) if samples else np.array([rss_mb()])
    peak = float(rss.max())
    steady = float(np.median(rss[len(rss) // 2:]))
    n = seconds * len(template)
    lost = n - m["records_aggregated_total"]
    print(f"simulated {seconds} s x {len(template)} records = {n} records in {elapsed:.1f} s "
          f"({n / elapsed:.0f} rec/s through decode+aggregate+exporters)")
    print(f"windows={m['windows_emitted_total']} parquet_files={files} parquet_bytes={size} "
          f"dropped={m['records_dropped_total']}")
    print(f"RSS MB: after imports {rss_import:.0f}, baseline (template) {rss_base:.0f}, "
          f"peak {peak:.0f}, steady (median of 2nd half) {steady:.0f}; peak/baseline {peak / rss_base:.2f}")
    wr = np.array(writer_samples) if writer_samples else np.zeros(1)
    w_peak, w_steady = float(wr.max()), float(np.median(wr[len(wr) // 2:]))
    print(f"parquet writer process (pid {writer_pid}) RSS MB: peak {w_peak:.0f}, steady {w_steady:.0f} "
          f"(includes the shared slabs, also counted in the collector's RSS: "
          f"{pipe.parquet.n_slabs} x {pipe.parquet.slab_rows} rows x 128 B = "
          f"{pipe.parquet.n_slabs * pipe.parquet.slab_rows * 128 / 2**20:.0f} MB at most)")
    first_q = float(np.median(rss[: max(1, len(rss) // 4)]))
    print(f"records={n} seconds_simulated={seconds} elapsed_s={elapsed:.1f} rps={n / elapsed:.0f} "
          f"rss_baseline_mb={rss_base:.0f} rss_peak_mb={peak:.0f} rss_steady_mb={steady:.0f} "
          f"rss_first_quarter_mb={first_q:.0f} growth_mb={steady - first_q:.0f} "
          f"writer_rss_peak_mb={w_peak:.0f} writer_rss_steady_mb={w_steady:.0f} "
          f"parquet_rows={pipe.metrics.parquet_rows} lost={lost}")
    return 0 if lost == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
