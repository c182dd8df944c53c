"""``dynamiccl validate-nccl``: check DynamICCL's plugins inside the NCCL that PyTorch ships.

From a source checkout on a bare GPU machine (only PyTorch, numpy and a C compiler)::

    python -m dynamiccl.validate --ranks 4 --out validate-out

Exit status: 0 every check passed (or was skipped with its reason), 1 a check failed, 2 bad
arguments, 3 no GPU on this machine, 4 the environment cannot run the kit (no torch, no NCCL in
it, plugins cannot be built).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import sys
import tempfile
import time

import numpy as np

from dynamiccl.contracts.atomic import atomic_write

from .extras import PROBE, extra_launches
from .launch import KitError, Launch, build_plugins, plan_ranks, probe_gpu, run_launch

__all__ = ["main", "build_parser", "make_spec", "register"]

SIZES = (8, 64, 512, 4 << 10, 32 << 10, 256 << 10, 1 << 20, 16 << 20, 128 << 20, 256 << 20)
MIB = 1 << 20


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--ranks", type=int, default=4, help="ranks to start (default 4; more than GPUs: they share)")
    p.add_argument("--out", default=None, help="output folder (default validate-nccl-YYYYmmdd-HHMMSS)")
    p.add_argument("--max-bytes", type=int, default=256 * MIB, help="largest message of the sweep (default 256 MiB)")
    p.add_argument("--reps", type=int, default=3, help="timed repetitions per (collective, size) (default 3)")
    p.add_argument("--timeout", type=float, default=360.0, help="seconds a launch may take before its ranks "
                   "count as hung and are killed (default 360)")
    p.add_argument("--analyse", metavar="DIR", default=None,
                   help="only re-run the checks on a saved run's folder (no GPU needed)")
    p.add_argument("--no-extras", action="store_true",
                   help="skip the extra launches (TSC record clock, per-peer timing, chained profiler)")
    p.add_argument("--no-overhead", action="store_true",
                   help="skip the interleaved overhead launches (check 5 is then SKIP); for a second NCCL "
                        "version in the same GPU session, where check 5 was measured on the first")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dynamiccl validate-nccl", description=__doc__.splitlines()[0])
    add_arguments(p)
    return p


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("validate-nccl", help="check the plugins inside a real NCCL on this machine's GPUs")
    add_arguments(p)
    p.set_defaults(func=lambda args: run(args))


def make_spec(args: argparse.Namespace, ranks: int, shared: bool = False) -> dict:
    from .worker import TUNED_BYTES
    rule = lambda func, algo, proto, ch, lo=TUNED_BYTES, hi=TUNED_BYTES: {  # noqa: E731
        "func": func, "min_bytes": lo, "max_bytes": hi, "algo": algo, "proto": proto, "n_channels": ch}
    disabled = rule("AllGather", "NVLS", "SIMPLE", 0, 0, (1 << 64) - 1)   # NVLS: never enabled across hosts
    return {
        "sizes": [s for s in SIZES if s <= args.max_bytes], "reps": max(1, args.reps),
        "tuned_bytes": TUNED_BYTES,
        "tuner_versions": [{"version": 1, "rules": [rule("AllReduce", "RING", "SIMPLE", 1), disabled]},
                           {"version": 2, "rules": [rule("AllReduce", "TREE", "LL", 1), disabled]}],
        "reload": {"steps": 24, "write_at_step": 8,
                   "version": {"version": 3, "rules": [rule("AllReduce", "RING", "LL", 1)]}},
        # a size no tuner rule above covers, so the phase runs on NCCL's own choice
        "slow": {"bytes": 256 << 10, "base_s": 15.0, "slow_s": 10.0, "gap_s": 0.01, "delay_s": 0.005,
                 "delay_ratio": 1.0, "slow_rank": ranks - 1},
        "probe": PROBE,
        # shared GPU: each call waits for time slices (ms), so fewer calls per round
        "overhead": {"sizes": [[MIB, 50], [64 * MIB, 10]] if shared else [[MIB, 500], [64 * MIB, 100]],
                     "rounds": 3 if shared else 7, "metric": "enqueue_us" if shared else "overhead_us",
                     "skip": bool(getattr(args, "no_overhead", False))},
    }


def _launch_all(args, plan, spec, paths) -> list[Launch]:
    from .receiver import KitReceiver

    launches, notes = [], []
    with KitReceiver(paths["socket"]) as rx:
        def go(la: Launch) -> Launch:
            paths["tuner_config"] = os.path.join(paths["out"], f"tuner.{la.name}.conf")
            shown = " ".join(f"{k}={v}" for k, v in la.env.items() if k.startswith(("DYNAMICCL_", "NCCL_PROF")))
            print(f"validate-nccl: launch {la.name} ({', '.join(la.phases)}; plugins {'on' if la.plugins else 'off'}"
                  f"{'; ' + shown if shown else ''}) ...", flush=True)
            la = run_launch(plan, la, spec, paths, args.timeout)
            print(f"validate-nccl:   {'ok' if la.ok else 'FAILED'} in {la.wall_s:.0f} s", flush=True)
            launches.append(la)
            return la

        go(Launch("main", ["sweep", "tuner", "reload", "slow", "alltoall"], True, debug=True))
        for i in range(0 if spec["overhead"]["skip"] else 2 if plan.shared else 3):  # without, with, ...
            go(Launch(f"bare{i}", ["overhead"], False))
            go(Launch(f"plug{i}", ["overhead"], True))
        if not getattr(args, "no_extras", False) and launches[0].ok:
            extras, notes = extra_launches()
            for la in extras:
                go(la)
        time.sleep(0.5)
        rx.close()
        np.save(os.path.join(paths["out"], "events.npy"), rx.events())
        np.save(os.path.join(paths["out"], "peers.npy"), rx.peers())
        saved = {"stats": {str(k): v for k, v in rx.stats_table().items()}, "hosts": rx.hosts,
                 "protocol_errors": rx.protocol_errors, "connections": rx.connections, "notes": notes}
    saved["launches"] = [{"name": la.name, "phases": la.phases, "plugins": la.plugins, "env": la.env, "ok": la.ok,
                          "timed_out": la.timed_out, "returncodes": la.returncodes, "wall_s": la.wall_s,
                          "results": la.results, "stderr_tail": la.stderr_tail} for la in launches]
    atomic_write(os.path.join(paths["out"], "run.json"), json.dumps(saved))
    return launches


def run(args: argparse.Namespace) -> int:
    from .analyse import analyse

    if args.analyse:
        missing = [f for f in ("run.json", "env.json", "events.npy") if not os.path.isfile(os.path.join(args.analyse, f))]
        if missing:
            print(f"validate-nccl: error: {args.analyse} is not a validate-nccl run folder (missing "
                  f"{', '.join(missing)})", file=sys.stderr)
            return 2
        return 0 if analyse(args.analyse) else 1
    if args.ranks < 2:
        print("validate-nccl: error: --ranks must be at least 2", file=sys.stderr)
        return 2
    t0 = time.monotonic()
    try:
        gpu = probe_gpu()
        plugins = build_plugins()
    except KitError as e:
        print(f"validate-nccl: {e}", file=sys.stderr)
        return e.code
    out = os.path.abspath(args.out or datetime.datetime.now().strftime("validate-nccl-%Y%m%d-%H%M%S"))
    os.makedirs(out, exist_ok=True)
    sock_dir = tempfile.mkdtemp(prefix="dccl-validate-")        # short path: sun_path is 108 bytes
    paths = dict(plugins, out=out, socket=os.path.join(sock_dir, "collector.sock"))
    plan = plan_ranks(args.ranks, gpu.count)
    spec = make_spec(args, plan.ranks, plan.shared)
    print(f"validate-nccl: {gpu.count} GPU(s) {gpu.names[0]}, torch {gpu.torch_version}, NCCL {gpu.nccl_version}; "
          f"{plan.ranks} ranks{'; ' + plan.note if plan.note else ''}; output in {out}", flush=True)
    launches = _launch_all(args, plan, spec, paths)
    if plan.shared and not launches[0].results:
        print("validate-nccl: ranks sharing a GPU could not start; retrying one rank per GPU", flush=True)
        plan = plan_ranks(args.ranks, gpu.count, allow_shared=False)
        if plan.ranks < 2:
            print(f"validate-nccl: {plan.note}; one GPU cannot hold a 2-rank job here:\n{launches[0].stderr_tail}",
                  file=sys.stderr)
        else:
            spec = make_spec(args, plan.ranks)
            launches = _launch_all(args, plan, spec, paths)
    env = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
           "gpu": f"{gpu.count} x {gpu.names[0]}", "nccl": gpu.nccl_version, "torch": gpu.torch_version,
           "ranks": plan.ranks, "plan_note": plan.note, "spec": spec,
           "command": "dynamiccl validate-nccl " + shlex.join(sys.argv[1:]),
           "wall_s": time.monotonic() - t0}
    with open(os.path.join(out, "env.json"), "w") as f:
        json.dump(env, f, indent=1)
    return 0 if analyse(out) else 1


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return run(args)
