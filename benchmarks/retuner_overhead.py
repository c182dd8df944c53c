"""Retuner CPU cost per measurement batch (seeded, no network, no clock in the policy).

A synthetic job with 64 targets (8 cohorts of 8 equivalent communicators) sends one observation per target
per "step" for 2,000 steps; two regime changes and their recoveries make the retuner explore, commit and
revert (the second regime is a recurrence, recognised from the measurements). Reported: µs of retuner CPU per
observation, against a baseline in the same process that only builds the same observations, the same retuner with
regime recognition off, and the number of decisions taken. Last line: ``key=value`` pairs.

    python benchmarks/retuner_overhead.py [--steps 2000]
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from dynamiccl.detector.events import RegimeChange  # noqa: E402
from dynamiccl.retuner.agent import Retuner  # noqa: E402
from dynamiccl.retuner.config import PolicyConfig, RetunerConfig  # noqa: E402
from dynamiccl.retuner.types import Observation, Target  # noqa: E402

CELLS = [("RING", "SIMPLE"), ("TREE", "SIMPLE"), ("RING", "LL128"), ("TREE", "LL128"), ("RING", "LL"), ("TREE", "LL")]


def make_obs(targets, t, cands, regime, rng):
    out = []
    for tg in targets:
        c = cands.get(tg.key)
        cell = (c.algo, c.proto) if c is not None else CELLS[0]
        base = 1e-3 * (2.0 if regime else 1.0) * (1.0 + 0.1 * CELLS.index(cell)) * (0.7 if regime and cell == CELLS[3] else 1)
        x = base * rng.lognormal(0.0, 0.02, 64)
        out.append(Observation(tg, t, t + 0.25, 64, float(x.mean()), float(x.var()), cell[0], cell[1]))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    targets = [Target(0x100 + i, "AllReduce", 20 + i // 8, nranks=16, nnodes=2, comm_name=f"c{i}") for i in range(64)]
    d = tempfile.mkdtemp()
    cfg = RetunerConfig(dry_run=False, tuner_config_path=os.path.join(d, "t.conf"), audit_path=os.path.join(d, "a.jsonl"),
                        policy=PolicyConfig(tune_at_start=True, max_targets=64))
    comms = [t.comm_hex for t in targets]
    events = {a.steps // 5: ("rc-1", "latency", None), 2 * a.steps // 5: ("rc-2", "recovery", "rc-1"),
              3 * a.steps // 5: ("rc-3", "latency", None), 4 * a.steps // 5: ("rc-4", "recovery", "rc-3")}

    def run(with_retuner: bool, recognize: bool = True) -> tuple[float, int, Retuner | None]:
        rng = np.random.default_rng(a.seed)
        rt = Retuner(cfg.replace(policy={"recognize": recognize}), clock=lambda: 0.0) if with_retuner else None
        regime = False
        spent = 0.0
        n = 0
        for s in range(a.steps):
            t = s * 0.25
            cands = rt.current() if rt is not None else {}
            obs = make_obs(targets, t, cands, regime, rng)
            n += len(obs)
            if s in events:
                rid, kind, rec = events[s]
                regime = kind != "recovery"
            if rt is not None:
                t0 = time.process_time()
                rt.observe(obs)
                if s in events:
                    rt.on_change(RegimeChange(id=rid, kind=kind, job_id="b", start_s=t, detected_s=t + 0.25,
                                              magnitude=2.0 if regime else 0.5, comms=comms, recovers=rec))
                spent += time.process_time() - t0
        return spent, n, rt

    t0 = time.process_time()
    run(False)
    base = time.process_time() - t0
    spent, n, rt = run(True)
    spent_off, _, _ = run(True, recognize=False)
    dec = sum(rt.metrics.decisions.values())
    us = spent / n * 1e6
    print(f"observations: {n} over {a.steps} steps, 64 targets; decisions {dec}, pushes {rt.metrics.counters['pushes']}")
    print(f"retuner CPU: {spent:.3f} s = {us:.2f} us per observation "
          f"({spent / a.steps * 1e3:.3f} ms per step of 64 observations)")
    print(f"baseline (building the observations only): {base:.3f} s; retuner / baseline = {spent / base:.2f}x")
    print(f"without regime recognition (policy.recognize=false): {spent_off / n * 1e6:.2f} us per observation; "
          f"recognition adds {(spent - spent_off) / n * 1e6:.2f} us ({spent / spent_off:.2f}x); recognised switches "
          f"{sum(1 for x in rt.audit.recent if x.get('recognized') is True and x['action'] in ('revert', 'reuse'))}")
    print(f"us_per_observation={us:.2f} ms_per_step={spent / a.steps * 1e3:.3f} ratio_to_baseline={spent / base:.2f} "
          f"decisions={dec} recognize_off_us_per_observation={spent_off / n * 1e6:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
