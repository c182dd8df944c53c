"""Simulator throughput, seeded: the engine alone (baseline, same process) vs the full fast-mode path
(engine -> one worker process per node -> emulator -> real profiler plugin -> Unix socket -> counting sink).

    python benchmarks/simulator_throughput.py [--workload llama7b-tp8-dp2] [--duration 60] [--seed 0]

Prints a table and a last line of key=value pairs. Target: >= 200,000 simulated per-rank collectives/s.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dynamiccl.harness.simulator.cli import TARGET_RPS, bench  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", action="append", default=None,
                    help="workload preset (repeatable; default: llama7b-tp8-dp2 and llama70b-fsdp)")
    ap.add_argument("--duration", type=float, default=60.0, help="simulated seconds per workload")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    rows = [bench(workload=w, duration_s=args.duration, seed=args.seed)
            for w in (args.workload or ["llama7b-tp8-dp2", "llama70b-fsdp"])]
    print(f"{'workload':<18} {'nodes':>5} {'records':>10} {'engine rec/s':>14} {'e2e rec/s':>12} "
          f"{'received':>10} {'dropped':>8}")
    for r in rows:
        print(f"{r['workload']:<18} {r['nodes']:>5} {r['records']:>10,} {r['engine_rps']:>14,.0f} "
              f"{r['e2e_rps']:>12,.0f} {r['received']:>10,} {r['dropped']:>8,}")
    worst = min(r["e2e_rps"] for r in rows)
    ok = all(r["dropped"] == 0 and r["received"] == r["records"] for r in rows)
    print(" ".join(f"{r['workload']}_engine_rps={r['engine_rps']:.0f} {r['workload']}_e2e_rps={r['e2e_rps']:.0f}"
                   for r in rows) + f" min_e2e_rps={worst:.0f} target={TARGET_RPS} lossless={int(ok)} "
          f"pass={int(ok and worst >= TARGET_RPS)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
