"""What forwarding a partition's windows to its job's retuner costs (``dynamiccl central --partitions
JOB=P --retune``; scaleout/retuner_feed.py): bytes per window and per ``keys`` row in the note, CPU to
encode one partition's window (each partition's shard), CPU to decode and join one job window of P
partitions (partition 0's owner). Seeded synthetic windows of ROWS rows per partition (the retuner's 13
columns, full-precision floats). ``pass``: the rows cost at most 160 bytes each (JSON columns; the
forwarded window must stay far below the partials it summarises) and every joined window holds every
partition's rows in communicator order.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

os.environ.setdefault("POLARS_MAX_THREADS", "1")
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import polars as pl  # noqa: E402

from dynamiccl.collector.features import KEYS_SCHEMA, WindowFeatures, empty_ranks  # noqa: E402
from dynamiccl.scaleout.combiner import Note, decode_note, encode_note  # noqa: E402
from dynamiccl.scaleout.retuner_feed import WindowJoin, rows_frame, window_rows  # noqa: E402


def window(rng, rows: int, w: int) -> WindowFeatures:
    d = {"job_id": ["j"] * rows, "comm_hash": np.sort(rng.integers(1, 1 << 62, rows)).tolist(), "comm_name": [""] * rows,
         "func": ["AllReduce"] * rows, "algo": ["RING"] * rows, "proto": ["SIMPLE"] * rows,
         "size_bucket": rng.integers(10, 30, rows).tolist(), "nranks": [8] * rows, "nnodes": [1] * rows,
         "instances": rng.integers(1, 100, rows).tolist(), "lat_mean_s": rng.random(rows).tolist(),
         "lat_p50_s": rng.random(rows).tolist(), "lat_p90_s": rng.random(rows).tolist(), "tuner_config_version": [0] * rows}
    return WindowFeatures(float(w), 1.0, pl.DataFrame(d, schema={k: KEYS_SCHEMA[k] for k in d}), empty_ranks(),
                          {"inputs_authenticated": 1})


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=30, help="keys rows per partition window")
    ap.add_argument("--partitions", type=int, default=2)
    ap.add_argument("--windows", type=int, default=200)
    ap.add_argument("--seed", type=int, default=3)
    a = ap.parse_args()
    rng = np.random.default_rng(a.seed)
    wfs = [[window(rng, a.rows, w) for _ in range(a.partitions)] for w in range(a.windows)]
    t = time.process_time()
    notes = [[encode_note(Note("j", p, w + 1.0, (), window_rows(x))) for p, x in enumerate(ws)] for w, ws in enumerate(wfs)]
    enc = time.process_time() - t
    bare = len(encode_note(Note("j", 0, 1.0)))
    extra = np.mean([len(n) - bare for ns in notes for n in ns])
    join, ok = WindowJoin("j", a.partitions, lambda: 0.0), True
    t = time.process_time()
    for ns in notes:
        for p, n in enumerate(ns):
            join.add(p, rows_frame("j", decode_note(n).window))
        wf = join.pop(join.peek(), bus_authenticated=True)
        ok &= wf.keys.height == a.rows * a.partitions and wf.keys["comm_hash"].is_sorted()
    dec = time.process_time() - t
    per_row = extra / a.rows if a.rows else 0.0
    print(f"load {os.getloadavg()}")
    print(f"rows={a.rows} partitions={a.partitions} windows={a.windows} bytes_per_partition_window={extra:.0f} "
          f"bytes_per_row={per_row:.0f} encode_ms_per_partition_window={1e3 * enc / a.windows / a.partitions:.2f} "
          f"join_ms_per_job_window={1e3 * dec / a.windows:.2f} pass={int(ok and per_row <= 160)}")
    return 0 if ok and per_row <= 160 else 1


if __name__ == "__main__":
    sys.exit(main())
