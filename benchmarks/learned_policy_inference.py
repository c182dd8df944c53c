"""Inference cost of the learned retuning policy per decision (issue 21 target: <= 1 ms on one core).

Seeded decisions from the training generator (held-out seed space excluded), each ranked by the learned
policy (LSTM + MLP in numpy, the shipped weights) and, as the baseline in the same run, by NCCL's refitted cost
model (what the model-guided planner ranks with). CPU time per decision (process time, so other tenants of a
shared machine do not count); the load average is printed with it.

    python benchmarks/learned_policy_inference.py [--n 400] [--seed 7]

Last line: ``key=value ... pass=0|1``; pass = learned p99 <= budget_ms (the target is every decision within
the budget, so the tail is what is judged).
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")     # one core: set before numpy loads its BLAS

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dynamiccl.retuner.learned.policy import LearnedPolicy  # noqa: E402
from dynamiccl.retuner.learned.train import dataset  # noqa: E402
from dynamiccl.retuner.model import CommModel  # noqa: E402
from dynamiccl.harness.simulator.topology import preset  # noqa: E402


def _cpu_per_call(fn, items) -> np.ndarray:
    out = []
    for it in items:
        t0 = time.process_time_ns()
        fn(it)
        out.append((time.process_time_ns() - t0) / 1e6)
    return np.asarray(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=400)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--budget-ms", type=float, default=1.0)
    ap.add_argument("--weights", default=None)
    args = ap.parse_args()
    pol = LearnedPolicy.load(args.weights) if args.weights else LearnedPolicy.load()
    ds, _ = dataset(args.n, 2, args.seed)
    cm = CommModel(preset("h100-2x8"), nnodes=2, nranks=16)
    for d in ds[:20]:
        pol.rank(d)                                          # warm-up
    learned = _cpu_per_call(pol.rank, ds)
    model = _cpu_per_call(lambda d: cm.ranked(d.func, 1 << d.size_bucket, cm.refit("latency", d.func, 1 << d.size_bucket,
                                                                                    ("RING", "SIMPLE"), 1.5)), ds)
    p50, p99 = float(np.percentile(learned, 50)), float(np.percentile(learned, 99))
    ok = p99 <= args.budget_ms
    la = os.getloadavg()
    print(f"decisions={len(ds)} learned_p50_ms={p50:.4f} learned_p99_ms={p99:.4f} model_p50_ms="
          f"{np.percentile(model, 50):.4f} ratio_p50={p50 / max(np.percentile(model, 50), 1e-9):.2f} "
          f"budget_ms={args.budget_ms} load1={la[0]:.1f} pass={int(ok)}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
