"""A/B wall clock of profiler builds on the emulator: interleaved runs, minimum per build.

Runs `test/build/emulate PLUGIN --colls 50000 --warmup 20000 --threads 1` for every build given,
one after the other, for --rounds rounds, and prints each build's minimum and median ns per
collective, and each one's minimum minus the first build's (the baseline, usually the no-op plugin).
A build is LABEL=PATH.so, or LABEL=PATH.so,CHAINED.so to run it with DYNAMICCL_PROFILER_CHAIN, and either
may end in @VAR=VALUE (repeatable) for its own environment (the floors' FLOOR_FIRST / FLOOR_SECOND:
bench/floor_plugin.c).
Records go nowhere (DYNAMICCL_COLLECTOR is a missing socket; the ring holds a run), so this compares
builds, the benchmark (benchmarks/plugin_overhead.py) states the goals.

Usage (from this directory, after `make emulator`):
  python bench/interleave.py --rounds 41 noop=test/build/libnccl-profiler-noop.so old=/tmp/old.so new=./libnccl-profiler-dynamiccl.so
  python bench/interleave.py --abi 7 --flags 0x400 --mask 32838 noop=... new=...      (v7 + KernelPhase)
  python bench/interleave.py noop=test/build/libnccl-profiler-noop.so ours=./libnccl-profiler-dynamiccl.so \
    fwd=test/build/libnccl-profiler-fwd.so@FLOOR_FIRST=./libnccl-profiler-dynamiccl.so \
    fwd2=test/build/libnccl-profiler-fwd.so@FLOOR_FIRST=./libnccl-profiler-dynamiccl.so@FLOOR_SECOND=test/build/libnccl-profiler-noop.so
Last line: LABEL_added_ns=... for every build after the first, and load1.
"""
from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
from pathlib import Path

EMULATE = Path(__file__).resolve().parent.parent / "test" / "build" / "emulate"


def run(plugin: str, chained: str | None, extra: dict[str, str], args: argparse.Namespace) -> float:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DYNAMICCL_", "FLOOR_"))}
    env.update(extra)
    env.update(DYNAMICCL_COLLECTOR="unix:/nonexistent/dccl-interleave.sock", DYNAMICCL_RING_SIZE="262144")
    if args.mask:
        env["DYNAMICCL_EVENT_MASK"] = str(args.mask)
    if chained:
        env["DYNAMICCL_PROFILER_CHAIN"] = chained
    out = subprocess.run([str(EMULATE), plugin, "--abi", str(args.abi), "--flags", str(int(args.flags, 0)),
                          "--colls", str(args.colls), "--warmup", "20000", "--threads", "1", "--reps", "1",
                          "--channels", str(args.channels)], capture_output=True, text=True, env=env, check=True).stdout
    m = re.search(r"ns_per_coll_median=([\d.]+)", out)
    if m is None:
        raise SystemExit(f"no timing in the emulator's output for {plugin}: {out[-500:]}")
    return float(m.group(1))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("builds", nargs="+", help="LABEL=PLUGIN.so[,CHAINED.so][@VAR=VALUE...]; the first is the baseline")
    ap.add_argument("--rounds", type=int, default=21)
    ap.add_argument("--colls", type=int, default=50000)
    ap.add_argument("--abi", type=int, default=6)
    ap.add_argument("--flags", default="0", help="emulator flags (0x400: KernelPhase)")
    ap.add_argument("--mask", type=int, default=0, help="DYNAMICCL_EVENT_MASK (0: the default)")
    ap.add_argument("--channels", type=int, default=8)
    args = ap.parse_args()
    builds = []
    for b in args.builds:
        label, _, spec = b.partition("=")
        spec, *assigns = spec.split("@")
        plugin, _, chained = spec.partition(",")
        extra = dict(a.split("=", 1) for a in assigns if "=" in a)
        if not label or not plugin or len(extra) != len(assigns):
            ap.error(f"a build is LABEL=PLUGIN.so[,CHAINED.so][@VAR=VALUE...], not {b!r}")
        builds.append((label, plugin, chained or None, extra))
    times: dict[str, list[float]] = {b[0]: [] for b in builds}
    for _ in range(args.rounds):
        for label, plugin, chained, extra in builds:
            times[label].append(run(plugin, chained, extra, args))
    base = min(times[builds[0][0]])
    for label, *_ in builds:
        t = times[label]
        print(f"{label:>14}: min {min(t):7.1f}  median {statistics.median(t):7.1f}  ns/coll  "
              f"min - {builds[0][0]} {min(t) - base:+7.1f}")
    print(" ".join(f"{label}_added_ns={min(times[label]) - base:.1f}" for label, *_ in builds[1:]) +
          f" load1={os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
