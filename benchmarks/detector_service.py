"""Detector service cost at scale: 512 nodes × 200 keys (102,400 streams) at one window per second.

Per window the service decodes the collector's NDJSON line (columnar JSON → polars) and runs
`Detector.process` (stream grouping and lookup, two CUSUM banks, workload checks, fusion, the
autoencoder, metrics). Both are measured in CPU seconds of this process (one core: numpy/polars
work here is single-threaded at these sizes; polars is pinned to 1 thread below), first during
the baseline warm-up, then while monitoring, with a congestion event in the middle (so the fusion
path that handles thousands of alarms is in the measurement).

Baseline (same process): `CUSUMBank.update_many` alone on the same number of streams, i.e. the
least a per-stream CUSUM must cost.

    python benchmarks/detector_service.py [--nodes 512] [--keys 200] [--windows 120] [--seed 0]

Last line: ``streams=… cpu_per_window_ms=… decode_ms=… process_ms=… core_fraction=… bank_ms=…``
"""
from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("POLARS_MAX_THREADS", "1")

import numpy as np  # noqa: E402
import polars as pl  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from dynamiccl.collector.features import KEYS_SCHEMA, RANKS_SCHEMA, WindowFeatures, decode_line, encode_line  # noqa: E402
from dynamiccl.detector.feature_decode import decode  # noqa: E402
from dynamiccl.detector.config import AutoencoderConfig, DetectorConfig  # noqa: E402
from dynamiccl.detector.cusum_bank import CUSUMBank  # noqa: E402
from dynamiccl.detector.service import Detector  # noqa: E402

EPOCH = 1_767_225_600.0


def build(nodes: int, keys_per_node: int, rng) -> tuple[dict, dict, np.ndarray]:
    """Static columns of the keys and ranks frames of one big job, plus base latencies."""
    n = nodes * keys_per_node
    node = np.repeat(np.arange(nodes), keys_per_node)
    k = np.tile(np.arange(keys_per_node), nodes)
    comm_local = k // 10                      # 20 communicators per node …
    combo = k % 10                            # … × 10 (collective, size) combos each
    comm_hash = (node.astype(np.uint64) << np.uint64(16)) | comm_local.astype(np.uint64)
    funcs = np.array(["AllReduce", "AllGather", "ReduceScatter", "Broadcast", "AllReduce"])[combo % 5]
    sb = (10 + 2 * combo).astype(np.int32)
    nnodes = np.where(comm_local < 4, 1, np.where(comm_local < 12, 2, 8)).astype(np.int32)
    base = 2e-5 + (2.0 ** sb) / 20e9 * nnodes
    keys = {
        "job_id": ["bigjob"] * n, "comm_name": [f"c{a}-{b}" for a, b in zip(node.tolist(), comm_local.tolist())],
        "func": funcs.tolist(), "algo": ["RING"] * n, "proto": ["SIMPLE"] * n, "comm_hash": comm_hash,
        "size_bucket": sb, "nranks": (nnodes * 8).astype(np.int32), "nnodes": nnodes,
        "records": np.full(n, 64, np.int64), "instances": np.full(n, 8, np.int64),
        "bytes_total": (64 * 2.0 ** sb).astype(np.int64),
    }
    # ranks: 8 GPUs per node, one row per (comm, rank) for the node's first 3 communicators
    r_comm = np.repeat((np.arange(nodes).astype(np.uint64) << np.uint64(16)), 8 * 3) | np.tile(
        np.repeat(np.arange(3, dtype=np.uint64), 8), nodes)
    m = len(r_comm)
    ranks = {"job_id": ["bigjob"] * m, "comm_hash": r_comm, "rank": np.tile(np.arange(8, dtype=np.int32), nodes * 3),
             "host": [f"node-{i:03d}" for i in np.repeat(np.arange(nodes), 24).tolist()],
             "records": np.full(m, 64, np.int64), "lat_mean_s": np.full(m, 1e-3), "rel_lat_mean": np.ones(m),
             "instances_complete": np.full(m, 8, np.int64)}
    return keys, ranks, base


def window(keys, ranks, base, t, rng, slow=None) -> WindowFeatures:
    lat = base * np.exp(rng.normal(0.0, 0.01, len(base)))
    if slow is not None:
        lat = lat * slow
    kf = pl.DataFrame({**keys, "lat_mean_s": lat, "lat_p50_s": lat, "lat_p90_s": lat * 1.1, "lat_p99_s": lat * 1.3,
                       "lat_max_s": lat * 1.5, "algbw_Bps": 1e9 / lat, "busbw_Bps": 1e9 / lat,
                       "spread_p50_s": lat * 0.02, "spread_max_s": lat * 0.1,
                       "tuner_config_version": np.zeros(len(lat), np.uint32)}, schema=KEYS_SCHEMA)
    m = len(ranks["rank"])
    rf = pl.DataFrame({**ranks, "shortest_count": rng.integers(0, 2, m)}, schema=RANKS_SCHEMA)
    return WindowFeatures(EPOCH + t, 1.0, kf, rf, {})


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=512)
    ap.add_argument("--keys", type=int, default=200)
    ap.add_argument("--windows", type=int, default=120, help="windows after the 60-window warm-up")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-autoencoder", action="store_true")
    args = ap.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    keys, ranks, base = build(args.nodes, args.keys, rng)
    n = len(base)
    cfg = DetectorConfig(autoencoder=AutoencoderConfig(enabled=not args.no_autoencoder))
    det = Detector(cfg)
    # a handful of pre-encoded lines (encoding is the collector's cost, not the detector's)
    lines = [encode_line(window(keys, ranks, base, i, rng)) for i in range(4)]
    slow = np.where(np.asarray(keys["nnodes"]) > 1, 1.5, 1.0)
    lines_slow = [encode_line(window(keys, ranks, base, i, rng, slow)) for i in range(2)]
    warmup = cfg.baseline.warmup
    total = warmup + args.windows
    dec_cpu = np.zeros(total)
    proc_cpu = np.zeros(total)
    changes = []
    for t in range(total):
        congested = warmup + args.windows // 2 <= t < warmup + args.windows // 2 + 20
        line = lines_slow[t % 2] if congested else lines[t % 4]
        c0 = time.process_time()
        decode(line)                          # what the service pays per window (pre-encoded lines)
        c1 = time.process_time()
        # the detector gets fresh noise every window (cycled lines would repeat the noise)
        wf = window(keys, ranks, base, t, rng, slow if congested else None)
        c2 = time.process_time()
        changes += [f"{c.kind}@{t}" for c in det.process(wf)]
        c3 = time.process_time()
        dec_cpu[t], proc_cpu[t] = c1 - c0, c3 - c2
    warm = slice(0, warmup)
    mon = slice(warmup, total)
    # baseline: the banks alone
    bank = CUSUMBank(n_streams=n, warmup=warmup, min_value=None)
    x = np.log(base)[None, :] + rng.normal(0, 0.01, (8, n))
    for i in range(warmup + 1):
        bank.update_many(x[i % 8])
    c0 = time.process_time()
    reps = 20
    for i in range(reps):
        bank.update_many(x[i % 8])
    bank_ms = (time.process_time() - c0) / reps * 1e3 * len(cfg.cusum.deltas)
    c0 = time.process_time()
    decode_line(lines[0])
    ref_decode_ms = (time.process_time() - c0) * 1e3
    dec_ms = dec_cpu[mon].mean() * 1e3
    proc_ms = proc_cpu[mon].mean() * 1e3
    per_window = dec_ms + proc_ms
    print(f"{args.nodes} nodes x {args.keys} keys = {n} streams, line {len(lines[0]) / 1e6:.1f} MB, "
          f"autoencoder {'on' if cfg.autoencoder.enabled else 'off'}; changes {changes} "
          f"(one congestion event, windows {warmup + args.windows // 2}-{warmup + args.windows // 2 + 19})")
    print(f"warm-up windows:    decode {dec_cpu[warm].mean() * 1e3:7.1f} ms  process {proc_cpu[warm].mean() * 1e3:7.1f} ms CPU")
    print(f"monitoring windows: decode {dec_ms:7.1f} ms  process {proc_ms:7.1f} ms CPU "
          f"(p95 process {np.percentile(proc_cpu[mon], 95) * 1e3:.1f} ms, max {proc_cpu[mon].max() * 1e3:.1f} ms)")
    print(f"baseline: CUSUMBank.update_many x{len(cfg.cusum.deltas)} banks on {n} streams: {bank_ms:.1f} ms "
          f"(process/baseline = {proc_ms / bank_ms:.1f}x)")
    print(f"decode: dynamiccl.detector.feature_decode {dec_ms:.0f} ms vs dynamiccl.collector.features.decode_line {ref_decode_ms:.0f} ms")
    print(f"at one window per second: {per_window / 10:.1f} % of one core (target < 50 %)")
    print(f"streams={n} cpu_per_window_ms={per_window:.1f} decode_ms={dec_ms:.1f} process_ms={proc_ms:.1f} "
          f"core_fraction={per_window / 1000:.3f} bank_ms={bank_ms:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
