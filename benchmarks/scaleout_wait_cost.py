"""Scale-out cost of the wait stand-ins (``NodeConfig.wait_streams``, scaleout/waits.py), on one core, seeded.

Two nodes of ``--per-node`` ranks, ``--windows`` windows of 1 s at ``--rate`` instances/s, two workloads of
the same records: every record untimed (NCCL 2.31+ after a send/recv: every record travels in the partial's
``waitq`` and the merger forms the waits) and the usual mix (2 % untimed records). Baseline, in the same run:
the same partials with waits off. Measured: the partials' bytes on the wire (``encode_messages``), the node's
partial cost (``node_partial`` + encoding) and the merger's (``read_partial`` → ``frames_of`` →
``merge_partials`` → ``window_features``), CPU seconds (``time.process_time``), the best of ``--repeats``.
Last line: key=value; ``pass`` when every cost ratio on the mixed workload is at most ``--max-mixed-ratio``
and the untimed workload's merger and node ratios at most ``--max-untimed-ratio`` (its bytes are reported,
not bounded: carrying each untimed record is what the waits need).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("POLARS_MAX_THREADS", "1")
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import numpy as np  # noqa: E402

from dynamiccl.collector.records import event_time_ns  # noqa: E402
from dynamiccl.harness.collector_testing import synthetic_events  # noqa: E402
from dynamiccl.scaleout.features import window_features  # noqa: E402
from dynamiccl.scaleout.partials import merge_partials, node_partial  # noqa: E402
from dynamiccl.scaleout.wire import encode_messages, frames_of, read_partial  # noqa: E402


def windows(ev, per_node: int) -> list[tuple[int, list[np.ndarray]]]:
    w = event_time_ns(ev) // 1_000_000_000
    out = [(win, [ev[(w == win) & (ev["rank"] // per_node == n)] for n in (0, 1)]) for win in np.unique(w).tolist()]
    return [(win, evs) for win, evs in out if all(len(e) for e in evs)]     # whole windows of both nodes


def run(wins, waits: bool, repeats: int) -> tuple[float, float, int, int]:
    """(node CPU s, merger CPU s, bytes sent, wait instances) over every window, the best of ``repeats``."""
    node_s = merge_s = float("inf")
    for _ in range(repeats):
        t0 = time.process_time()
        msgs = [(win, [m for n, ev in enumerate(evs) for m in encode_messages(
            node_partial(ev, node=f"node{n}", job_id="bench", window=win, window_s=1.0, waits=waits), "bench")])
            for win, evs in wins]
        t1 = time.process_time()
        inst = 0
        for _win, ms in msgs:
            wf = window_features(merge_partials([frames_of([read_partial(m) for m in ms])]))
            inst += int(wf.counters.get("wait_instances", 0))
        t2 = time.process_time()
        node_s, merge_s = min(node_s, t1 - t0), min(merge_s, t2 - t1)
    return node_s, merge_s, sum(len(m) for _, ms in msgs for m in ms), inst


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--per-node", type=int, default=8)
    ap.add_argument("--rate", type=float, default=550.0, help="instances per second")
    ap.add_argument("--windows", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-untimed-ratio", type=float, default=4.0)
    ap.add_argument("--max-mixed-ratio", type=float, default=1.25)
    args = ap.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {0})
    nranks = 2 * args.per_node
    out = {}
    for name, untimed in (("untimed", 1.0), ("mixed", 0.02)):
        ev = synthetic_events(int(args.rate * args.windows), nranks=nranks, nnodes=2, seed=args.seed,
                              rate_per_s=args.rate, untimed_fraction=untimed)
        wins = windows(ev, args.per_node)
        off, on = run(wins, False, args.repeats), run(wins, True, args.repeats)
        r = {"node": on[0] / off[0], "merger": on[1] / off[1], "bytes": on[2] / off[2]}
        out[name] = r
        print(f"{name:8s} {len(ev):,} records, {len(wins)} windows: node {off[0]:.3f} -> {on[0]:.3f} s "
              f"(x{r['node']:.2f}), merger {off[1]:.3f} -> {on[1]:.3f} s (x{r['merger']:.2f}), bytes "
              f"{off[2]:,} -> {on[2]:,} (x{r['bytes']:.2f}), wait instances {on[3]:,}", flush=True)
    ok = (out["mixed"]["node"] <= args.max_mixed_ratio and out["mixed"]["merger"] <= args.max_mixed_ratio
          and out["untimed"]["node"] <= args.max_untimed_ratio and out["untimed"]["merger"] <= args.max_untimed_ratio)
    print(" ".join(f"{w}_{k}_ratio={v:.3f}" for w, r in out.items() for k, v in r.items()) + f" pass={ok}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
