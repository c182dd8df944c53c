"""Bad input on real records: each labelled test-bed corpus run replayed clean and with one fault
injected (`dynamiccl.harness.bad_input`: a 30 s checkpoint pause, one host's clock stepping 5 s
ahead or back, a rank whose records stop, a rank whose records start late, 1 % absurd
durations), at the run's quietest point. The baseline is the same run replayed clean in the same
process.

Per fault: the labelled changes reported within 5 s, as a share of those the clean replay reported
(``kept_<fault>``), and the false alarms the fault added (``extra_fa_<fault>``: perturbed minus
clean, summed over runs, a run's fewer not offsetting another's more). Goal (issue 17, "Bad input":
counted and handled, never a regime change by themselves, never a crash): every fault keeps
>= 0.9 of the changes, adds no false alarm, raises nothing.

    python benchmarks/bad_input_replay.py [--half eval] [--seeds 1,3] [--faults jump,vanish]

Last line: ``runs=… kept_<fault>=… extra_fa_<fault>=… … errors=… pass=0|1``
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("POLARS_MAX_THREADS", "1")

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from dynamiccl.harness.bad_input import FAULTS, replay_run  # noqa: E402
from dynamiccl.harness.corpus import DEFAULT_CORPUS, load_runs  # noqa: E402

KEEP_GOAL = 0.9


def _args(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", default=str(DEFAULT_CORPUS))
    ap.add_argument("--half", choices=("dev", "eval", "all"), default="eval")
    ap.add_argument("--seeds", default="", help="comma-separated seeds of that half (default: all)")
    ap.add_argument("--faults", default=",".join(FAULTS))
    return ap.parse_args(argv)


def _runs(args):
    runs = load_runs(args.corpus, half=None if args.half == "all" else args.half)
    if args.seeds:
        want = {int(s) for s in args.seeds.split(",")}
        runs = [(s, d) for s, d in runs if s in want]
    if not runs:
        raise SystemExit("no corpus run selected")
    return runs


def main(argv=None) -> int:
    args = _args(argv)
    faults = [f for f in args.faults.split(",") if f]
    unknown = sorted(set(faults) - set(FAULTS))
    if unknown:
        raise SystemExit(f"unknown fault(s) {unknown}; known: {', '.join(FAULTS)}")
    runs = _runs(args)
    kept = {f: [0, 0] for f in faults}      # perturbed detected, clean detected
    extra = {f: 0 for f in faults}
    errors = 0
    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="dynamiccl-bad-input-") as tmp:
        for seed, run_dir in runs:
            clean = replay_run(seed, Path(run_dir), "clean", Path(tmp))
            print(f"seed {seed}: clean {clean.detected}/{clean.changes}, {clean.false_alarms} false alarms; "
                  f"faults at {clean.at_s} s", flush=True)
            for f in faults:
                try:
                    r = replay_run(seed, Path(run_dir), f, Path(tmp))
                except Exception as e:  # noqa: BLE001 - a crash is the finding, counted and shown
                    errors += 1
                    print(f"  {f:9s} ERROR {e!r}", flush=True)
                    continue
                kept[f][0] += r.detected
                kept[f][1] += clean.detected
                extra[f] += max(0, r.false_alarms - clean.false_alarms)
                new = [x for x in r.false if x not in clean.false] if r.false_alarms > clean.false_alarms else []
                print(f"  {f:9s} {r.detected}/{r.changes} reported, {r.false_alarms} false alarms"
                      + (f"; not in the clean replay: {new}" if new else ""), flush=True)
    share = {f: (k / c if c else 1.0) for f, (k, c) in kept.items()}
    ok = errors == 0 and all(share[f] >= KEEP_GOAL and extra[f] == 0 for f in faults)
    print(f"{len(runs)} runs of the {args.half} half, {time.perf_counter() - t_start:.0f} s; "
          f"goal: kept >= {KEEP_GOAL}, no added false alarm, no error")
    parts = " ".join(f"kept_{f}={share[f]:.3f} extra_fa_{f}={extra[f]}" for f in faults)
    print(f"runs={len(runs)} {parts} errors={errors} pass={int(ok)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
