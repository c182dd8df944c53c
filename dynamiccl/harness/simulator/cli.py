"""``dynamiccl simulate``: run a simulated training job through the real profiler plugin, or benchmark it.

    dynamiccl simulate run --workload llama7b-tp8-dp2 --scenario demo [--fast] [--collector unix:PATH]
    dynamiccl simulate bench [--duration 20]

Both print a last line of ``key=value`` pairs.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

__all__ = ["register", "run_cmd", "bench_cmd", "bench"]

TARGET_RPS = 200_000


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("simulate", help="simulated GPUs + NCCL + network driving the real profiler plugin",
                              description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="simulate_command", metavar="ACTION")
    r = sub.add_parser("run", help="run a simulated job against a collector")
    _common(r)
    r.add_argument("--scenario", default="demo", help="scenario preset or YAML path (default: demo)")
    r.add_argument("--duration", type=float, default=None, help="simulated seconds (default: the scenario's)")
    r.add_argument("--fast", action="store_true", help="as fast as possible (default: paced to the wall clock)")
    from dynamiccl.contracts.addresses import COLLECTOR_LISTEN
    r.add_argument("--collector", default=COLLECTOR_LISTEN,
                   help=f"unix:PATH or tcp:HOST:PORT (default {COLLECTOR_LISTEN}: the collector's per-user default)")
    r.add_argument("--out", default="runs/sim", help="directory for truth.jsonl and run.json (default: runs/sim)")
    r.set_defaults(func=run_cmd)
    b = sub.add_parser("bench", help="fast-mode throughput through the real plugin (per-rank collectives/s)")
    _common(b)
    b.add_argument("--scenario", default="stationary")
    b.add_argument("--duration", type=float, default=20.0, help="simulated seconds (default: 20)")
    b.add_argument("--collector", default=None,
                   help="send to this collector instead of the built-in counting sink")
    b.set_defaults(func=bench_cmd)
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workload", default="llama7b-tp8-dp2", help="workload preset or YAML path")
    p.add_argument("--topology", default=None, help="topology preset overriding the workload's")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--plugin", default=None, help="profiler plugin .so (default: the built one)")


def _workload(args: argparse.Namespace):
    from dynamiccl.harness.simulator import workload

    return workload.load(args.workload, topology=args.topology)


def run_cmd(args: argparse.Namespace) -> int:
    from dynamiccl.harness.simulator.driver import DriverError, SimulatedJob

    wl = _workload(args)
    job = SimulatedJob(wl, args.scenario, collector=args.collector, seed=args.seed, duration_s=args.duration,
                       realtime=not args.fast, out_dir=args.out, plugin=args.plugin)
    try:
        job.start()
    except DriverError as exc:
        print(f"dynamiccl simulate: error: {exc}", file=sys.stderr)
        return 2
    print(f"simulating {wl.name} on {wl.topology.name} ({wl.topology.n_nodes} node processes), "
          f"{'fast' if args.fast else 'real-time'}; truth -> {Path(args.out) / 'truth.jsonl'}", flush=True)
    try:
        res = job.wait()
    except KeyboardInterrupt:
        job.stop()
        res = job.wait()
    tot = res.totals()
    print(f"steps={res.steps} records={res.records} sim_s={res.sim_seconds:.2f} wall_s={res.wall_seconds:.2f} "
          f"sent={tot.get('records_sent', 0)} dropped={tot.get('records_dropped_ring_full', 0)} "
          f"undelivered={tot.get('records_undelivered', 0)} out={args.out}")
    return 0


def bench(*, workload: Any = "llama7b-tp8-dp2", scenario: Any = "stationary", duration_s: float = 20.0,
          seed: int = 0, collector: str | None = None, plugin: str | None = None) -> dict[str, float]:
    """Engine alone (baseline), then engine → node workers → real plugin → socket sink, in fast mode."""
    from dynamiccl.harness.simulator import scenario as sc_mod
    from dynamiccl.harness.simulator import workload as wl_mod
    from dynamiccl.harness.simulator.driver import SimulatedJob, WireSink
    from dynamiccl.harness.simulator.engine import Engine

    wl = workload if not isinstance(workload, str) else wl_mod.load(workload)
    sc = scenario if not isinstance(scenario, str) else sc_mod.load(scenario)
    eng = Engine(wl, sc, seed=seed, duration_s=duration_s)
    t = time.perf_counter()
    n_engine = sum(len(b.ops) for b in eng.steps())
    engine_s = time.perf_counter() - t
    tmp = None
    sink = None
    if collector is None:
        tmp = tempfile.TemporaryDirectory(prefix="dccl-bench-")
        collector = f"unix:{tmp.name}/sink.sock"
        sink = WireSink(collector, keep=False)
    try:
        t = time.perf_counter()
        res = SimulatedJob(wl, sc, collector=collector, seed=seed, duration_s=duration_s, plugin=plugin).start().wait()
        if sink is not None:
            sink.wait_for(res.records, timeout=10.0)
        wall = time.perf_counter() - t
        received = sink.count if sink is not None else -1
    finally:
        if sink is not None:
            sink.close()
        if tmp is not None:
            tmp.cleanup()
    tot = res.totals()
    return {
        "workload": wl.name, "nodes": wl.topology.n_nodes, "ranks": wl.topology.n_ranks, "sim_s": res.sim_seconds,
        "records": res.records, "engine_rps": n_engine / engine_s, "e2e_rps": res.records / res.wall_seconds,
        "e2e_rps_incl_startup": res.records / wall, "received": received,
        "sent": tot.get("records_sent", 0), "dropped": tot.get("records_dropped_ring_full", 0)
        + tot.get("events_dropped_pool_full", 0), "undelivered": tot.get("records_undelivered", 0),
        "wall_s": res.wall_seconds, "engine_s_in_run": res.engine_seconds,
    }


def bench_cmd(args: argparse.Namespace) -> int:
    r = bench(workload=_workload(args), scenario=args.scenario, duration_s=args.duration, seed=args.seed,
              collector=args.collector, plugin=args.plugin)
    print(f"workload {r['workload']}: {r['nodes']} node processes, {r['ranks']} ranks, {r['sim_s']:.1f} simulated s, "
          f"{r['records']:,} per-rank collectives")
    print(f"  engine alone (baseline):        {r['engine_rps']:>12,.0f} records/s")
    print(f"  engine + plugin + sink (fast):  {r['e2e_rps']:>12,.0f} records/s over {r['wall_s']:.2f} s "
          f"(target {TARGET_RPS:,})")
    print(f"  received by sink {r['received']:,}, plugin sent {r['sent']:,}, dropped {r['dropped']:,}, "
          f"undelivered {r['undelivered']:,}")
    keys = ("records", "engine_rps", "e2e_rps", "e2e_rps_incl_startup", "received", "sent", "dropped", "undelivered")
    print(" ".join(f"{k}={r[k]:.0f}" if isinstance(r[k], float) else f"{k}={r[k]}" for k in keys)
          + f" target={TARGET_RPS} pass={int(r['e2e_rps'] >= TARGET_RPS and r['dropped'] == 0)}")
    return 0
