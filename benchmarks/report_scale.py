"""`dynamiccl report` at scale: time and peak memory to reduce a generated recorded run and write
the HTML report, against a plain polars scan of the same columns in the same process.

The run is generated (seeded) by ``dynamiccl.harness.synthetic_run.write_run`` through the collector's own
parquet exporter: 16 ranks on 2 hosts, 11 communicators, zstd part files of 1 M rows, at
10,000 records/s of event time (100 M records ≈ 2.8 hours). Generation is not timed; pass
``--data DIR`` to keep and reuse it (a manifest records the parameters).

Measured in a fresh child process (so generation memory does not count), in this order:

1. baseline: ``pl.scan_parquet(files).select(<the 14 columns the report reads>.sum())`` with the
   streaming engine — the cost of reading and decoding the data once;
2. report: ``summarise`` (two streaming scans: per-stream bins, and a sample of instances) +
   rendering + writing the HTML file.

RSS is sampled every 20 ms; each phase's peak is reported. Default 10 M records; ``--full`` for
100 M. Last line: machine-readable key=value.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

COLUMNS = ("kind", "func", "algo", "proto", "timing_source", "rank", "nranks", "tuner_config_version",
           "comm_hash", "seq_number", "bytes", "enqueue_ns", "gpu_start_ns", "gpu_end_ns", "cpu_end_ns")


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


class Sampler:
    def __init__(self, period: float = 0.02):
        self.period = period
        self.peak = rss_mb()
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self):
        while not self._stop.wait(self.period):
            self.peak = max(self.peak, rss_mb())

    def reset(self) -> float:
        self.peak = rss_mb()
        return self.peak

    def stop(self):
        self._stop.set()
        self._t.join()


def generate(directory: str, records: int, seed: int) -> dict:
    from dynamiccl.harness.synthetic_run import write_run

    manifest = os.path.join(directory, "manifest.json")
    want = {"records": records, "seed": seed, "generator": "dynamiccl.harness.synthetic_run.write_run v3"}
    if os.path.exists(manifest):
        with open(manifest) as f:
            have = json.load(f)
        if {k: have.get(k) for k in want} == want:
            print(f"reusing generated run in {directory}", flush=True)
            return have
        shutil.rmtree(directory)
    os.makedirs(directory, exist_ok=True)
    t = time.perf_counter()
    last = [0.0]

    def progress(n):
        if time.perf_counter() - last[0] > 10:
            last[0] = time.perf_counter()
            print(f"  generated {n:,} / {records:,} records", flush=True)

    info = write_run(os.path.join(directory, "parquet"), records=records, seed=seed, progress=progress)
    info.update(want, generate_s=time.perf_counter() - t)
    with open(manifest, "w") as f:
        json.dump(info, f)
    print(f"generated {info['records']:,} records in {info['generate_s']:.0f} s", flush=True)
    return info


def measure(directory: str) -> dict:
    import glob

    import polars as pl

    from dynamiccl.report.html import write_report
    from dynamiccl.report.sidecars import load_sidecars
    from dynamiccl.report.summary import ScanConfig, summarise

    pq_dir = os.path.join(directory, "parquet")
    files = sorted(glob.glob(os.path.join(pq_dir, "**", "*.parquet"), recursive=True))
    sampler = Sampler()
    base_rss = sampler.reset()
    # 1. baseline: read + decode the same columns once
    t = time.perf_counter()
    n = pl.scan_parquet(files).select(pl.len()).collect().item()
    count_s = time.perf_counter() - t
    sampler.reset()
    load0 = os.getloadavg()[0]
    t, c = time.perf_counter(), time.process_time()
    pl.scan_parquet(files).select(pl.col(c).cast(pl.Float64).sum() for c in COLUMNS).collect(engine="streaming")
    scan_s, scan_cpu = time.perf_counter() - t, time.process_time() - c
    scan_peak = sampler.peak
    # 2. the report
    sampler.reset()
    t, c = time.perf_counter(), time.process_time()
    summ = summarise(pq_dir, ScanConfig())
    reduce_s = time.perf_counter() - t
    side = load_sidecars(pq_dir)
    out = os.path.join(directory, "report.html")
    write_report(summ, side, out)
    report_s, report_cpu = time.perf_counter() - t, time.process_time() - c
    report_peak = sampler.peak
    sampler.stop()
    return {"records": n, "reduced": summ.records, "files": len(files), "count_s": count_s, "scan_s": scan_s,
            "reduce_s": reduce_s, "report_s": report_s, "render_s": report_s - reduce_s,
            "streams_s": summ.timings.get("streams_s", 0), "sample_s": summ.timings.get("sample_scan_s", 0)
            + summ.timings.get("instances_s", 0), "sample_k": summ.sample_k,
            "rss_start_mb": base_rss, "scan_peak_mb": scan_peak, "report_peak_mb": report_peak,
            "scan_cpu_s": scan_cpu, "report_cpu_s": report_cpu, "range_s": summ.timings.get("range_s", 0),
            "load_before": load0, "load_after": os.getloadavg()[0], "cores": os.cpu_count(),
            "html_mb": os.path.getsize(out) / 2**20, "out": out}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=10_000_000)
    ap.add_argument("--full", action="store_true", help="100 million records")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--data", default=None, help="directory for the generated run (kept and reused)")
    ap.add_argument("--measure-only", metavar="DIR", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.measure_only:
        print("RESULT " + json.dumps(measure(args.measure_only)), flush=True)
        return 0
    records = 100_000_000 if args.full else args.records
    directory = args.data or tempfile.mkdtemp(prefix="dccl-report-bench-")
    try:
        info = generate(directory, records, args.seed)
        proc = subprocess.run([sys.executable, __file__, "--measure-only", directory], capture_output=True, text=True)
        line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
        if proc.returncode != 0 or line is None:
            print(proc.stdout, proc.stderr, file=sys.stderr)
            return 1
        r = json.loads(line[7:])
    finally:
        if args.data is None:
            shutil.rmtree(directory, ignore_errors=True)
    span_h = info["duration_s"] / 3600
    print(f"run: {r['records']:,} records in {r['files']} part files ({span_h:.2f} h of event time at 10,000 records/s)")
    print(f"machine: {r['cores']} cores, load average {r['load_before']:.1f} before / {r['load_after']:.1f} after "
          f"(other processes compete for the cores: wall times below include waiting; CPU s do not)")
    print(f"  baseline: polars scan + count (footers only)            {r['count_s']:7.2f} s")
    print(f"  baseline: streaming scan of {len(COLUMNS)} columns (sum)          {r['scan_s']:7.2f} s wall "
          f"{r['scan_cpu_s']:7.2f} s CPU  peak RSS {r['scan_peak_mb']:5.0f} MB")
    print(f"  report: reduce = range {r['range_s']:.1f} s + streams {r['streams_s']:.1f} s + instance sample "
          f"1/{r['sample_k']} {r['sample_s']:.1f} s = {r['reduce_s']:.2f} s wall")
    print(f"  report: total incl. HTML ({r['html_mb']:.1f} MB, render {r['render_s']:.1f} s)  {r['report_s']:7.2f} s wall "
          f"{r['report_cpu_s']:7.2f} s CPU  peak RSS {r['report_peak_mb']:5.0f} MB  "
          f"({r['records'] / r['report_s'] / 1e6:.1f} M records/s)")
    print(f"  ratio report / column scan: {r['report_s'] / r['scan_s']:.2f}x wall, "
          f"{r['report_cpu_s'] / r['scan_cpu_s']:.2f}x CPU;  goal: 100 M records < 60 s")
    print(f"records={r['records']} report_s={r['report_s']:.2f} report_cpu_s={r['report_cpu_s']:.2f} "
          f"reduce_s={r['reduce_s']:.2f} scan_s={r['scan_s']:.2f} scan_cpu_s={r['scan_cpu_s']:.2f} "
          f"ratio={r['report_s'] / r['scan_s']:.2f} report_peak_mb={r['report_peak_mb']:.0f} "
          f"scan_peak_mb={r['scan_peak_mb']:.0f} load={r['load_before']:.1f} "
          f"pass={int(r['records'] < 100e6 or r['report_s'] < 60)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
