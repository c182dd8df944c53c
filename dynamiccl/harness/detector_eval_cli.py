"""`dynamiccl detector evaluate`'s command line: the simulated suite (`detector_eval`) or the
test-bed corpus (`corpus`), the report and its last line."""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

from dynamiccl.contracts.atomic import atomic_write
from dynamiccl.harness.detector_eval import cusum_updates_per_s, run_one, score
from dynamiccl.harness.detector_suite import EVENT_KINDS, WORKLOADS, build_suite

__all__ = ["add_arguments", "run"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    from dynamiccl.progress import add_progress_flag
    add_progress_flag(p)
    p.add_argument("--quick", action="store_true", help="a small suite for tests (< 60 s)")
    p.add_argument("--suite", choices=("simulated", "testbed"), default="simulated",
                   help="simulated (default) or testbed: the recorded test-bed corpus (docs/corpus.md)")
    p.add_argument("--corpus", default=None, help="testbed suite: corpus folder or .tar.xz (default the shipped one)")
    p.add_argument("--half", choices=("eval", "dev"), default="eval", help="testbed suite: which half (default eval)")
    p.add_argument("--seeds", type=int, default=2, help="seeds per workload (default 2)")
    p.add_argument("--jobs", type=int, default=1, help="parallel worker processes (default 1)")
    p.add_argument("--stationary-hours", type=float, default=None,
                   help="simulated hours of stationary llama70b-fsdp training, plus 1/12 of it for each "
                        "2-node workload (default 24; quick 0.15; 0: event runs only)")
    p.add_argument("--workloads", default=None, metavar="W[,W...]",
                   help=f"subset for iteration: only these workloads ({', '.join(WORKLOADS)})")
    p.add_argument("--kinds", default=None, metavar="K[,K...]",
                   help=f"subset: only event runs holding these kinds, scored on them ({', '.join(EVENT_KINDS)})")
    p.add_argument("--magnitudes", default=None, metavar="M[,M...]",
                   help="subset: only event runs holding these magnitudes (e.g. 1.05,1.1), scored on them")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a detector setting by dotted key for this evaluation (repeatable), "
                        "e.g. fusion.persist_ratio=1.5")
    p.add_argument("--window", type=float, default=None, metavar="S",
                   help="window length, s of event time, for both suites (default the collector's window.window_s)")
    p.add_argument("--out", default=None, help="write the full report (JSON) here, and every run's changes "
                                                  "next to it (NAME.runs.json)")


def _fmt(v, nd=3):
    return "nan" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.{nd}f}"


def _overridden(args: argparse.Namespace):
    """The detector config with ``--set`` applied, or None when there is no ``--set``."""
    from dynamiccl.detector.config import DetectorConfig, parse_overrides
    overrides = parse_overrides(getattr(args, "set", None) or [])
    if not overrides:
        return None
    print(f"config overrides: {overrides}", flush=True)
    return DetectorConfig().with_overrides(overrides)


def _window(args: argparse.Namespace) -> float | None:
    """``--window``, checked; None: the collector's default window."""
    w = getattr(args, "window", None)
    if w is not None and not (math.isfinite(w) and w > 0):
        raise ValueError(f"--window must be > 0 s, got {w!r}")
    return w


def run(args: argparse.Namespace) -> int:
    from dynamiccl.detector.config import DetectorConfig
    if args.seeds < 1:
        raise ValueError(f"--seeds must be >= 1, got {args.seeds}")
    if getattr(args, "suite", "simulated") == "testbed":
        return _run_testbed(args)
    cfg = _overridden(args) or DetectorConfig()
    hours = None
    if args.stationary_hours is not None:
        h = args.stationary_hours
        hours = {"llama70b-fsdp": h} if args.quick else {"llama70b-fsdp": h, "llama7b-tp8-dp2": h / 12,
                                                          "eval-mixed": h / 12}
    t0 = time.perf_counter()
    def _list(v, conv=str):
        return tuple(conv(x) for x in v.split(",") if x.strip()) if v else None
    subset = {"workloads": _list(getattr(args, "workloads", None)), "kinds": _list(getattr(args, "kinds", None)),
              "magnitudes": _list(getattr(args, "magnitudes", None), float)}
    if any(subset.values()):
        print(f"subset: { {k: v for k, v in subset.items() if v} } (not the full suite)", flush=True)
    suite = build_suite(1 if args.quick else args.seeds, quick=args.quick, stationary_hours=hours, **subset)
    print(f"suite: {sum(not r.stationary for r in suite)} event runs "
          f"({sum(len(r.meta) for r in suite)} events), {sum(r.stationary for r in suite)} stationary runs "
          f"({sum(r.duration_s for r in suite if r.stationary) / 3600:.1f} simulated hours)", flush=True)
    from dynamiccl.progress import enabled_for, progress
    results = []
    with progress(len(suite), "detector evaluate", enabled=enabled_for(args)) as step:
        if args.jobs > 1:
            import functools
            from concurrent.futures import ProcessPoolExecutor
            with ProcessPoolExecutor(args.jobs) as ex:
                for res in ex.map(functools.partial(run_one, config=cfg, window_s=_window(args)), suite):
                    results.append(res)
                    _progress(res)
                    step()
        else:
            for spec in suite:
                res = run_one(spec, cfg, _window(args))
                results.append(res)
                _progress(res)
                step()
    rep = score(results, cfg)
    ups = cusum_updates_per_s()
    rep["updates_per_s"] = ups
    windows = sum(r["windows"] for r in results)
    det_cpu = sum(r["detector_cpu_s"] for r in results)
    rep["detector_cpu_per_window_ms"] = det_cpu / max(windows, 1) * 1e3
    rep["wall_s"] = time.perf_counter() - t0
    _print_report(rep)
    if args.out:
        path = Path(args.out)
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, json.dumps(rep, indent=1, default=str), fsync=False)
        raw = path.with_name(path.stem + ".runs.json")     # every run's changes, for re-scoring
        atomic_write(raw, json.dumps(results, default=str), fsync=False)
    print(f"precision={rep['precision']:.3f} recall={rep['recall']:.3f} "
          f"delay_ratio_median={_fmt(rep['delay_ratio_median'], 2)} "
          f"false_alarms_per_day={_fmt(rep['false_alarms_per_day'], 2)} "
          f"straggler_top1={_fmt(rep['straggler_top1'])} updates_per_s={ups:.0f}", flush=True)
    return 0


def _run_testbed(args: argparse.Namespace) -> int:
    from dynamiccl.harness import corpus
    rep = corpus.run_suite(args.corpus or corpus.DEFAULT_CORPUS, args.half, config=_overridden(args),
                           window_s=_window(args))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(rep, indent=1, default=str))
    print(corpus.line(rep), flush=True)
    return 0


def _progress(res: dict) -> None:
    s = res["spec"]
    print(f"  {s['name']}: {res['windows']} windows, {len(res['changes'])} changes, "
          f"{res['wall_s']:.1f} s", file=sys.stderr, flush=True)


def _print_report(rep: dict) -> None:
    print("\nper magnitude (target slowdown of the dominant affected collective):")
    print(f"  {'magnitude':>9} {'events':>6} {'recall':>7} {'delay_s':>8} {'ratio':>6} {'shift_sigma':>11} {'kind_ok':>7}")
    for m, r in rep["per_magnitude"].items():
        print(f"  {m:>8.2f}x {r['events']:>6} {r['recall']:>7.3f} {_fmt(r['delay_s_median'], 2):>8} "
              f"{_fmt(r['delay_ratio_median'], 2):>6} {_fmt(r['delta_sigma_median'], 1):>11} {r['kind_ok']:>7.3f}")
    print("per kind:")
    for k, r in rep["per_kind"].items():
        print(f"  {k:>13} events={r['events']:<4} recall={r['recall']:.3f} kind_ok={r['kind_ok']:.3f} "
              f"recovery_within_5s={r['recovered_within_5s']:.3f}")
    print("per workload:", ", ".join(f"{w}: recall {r['recall']:.3f} ({r['events']})" for w, r in rep["per_workload"].items()))
    print(f"recovery recall (within 5 s of the end): {rep['recovery_recall']:.3f}; "
          f"kind accuracy of detected events: {rep['kind_accuracy']:.3f}")
    if rep.get("windows_dropped_error"):
        print(f"WARNING: {rep['windows_dropped_error']:.0f} windows dropped by internal errors (a bug)")
    print(f"stationary: {rep['stationary_false_alarms']} false regime changes ({rep['stationary_changes']} changes "
          f"with their recoveries) in {rep['stationary_hours']:.2f} simulated hours; "
          f"detector CPU {rep['detector_cpu_per_window_ms']:.2f} ms/window; wall {rep['wall_s']:.0f} s")
    for c in rep["false_positive_changes"][:10]:
        print(f"  unmatched: {c['run']} {c['kind']} at {c['t_det']:.1f} s mag={c['magnitude']} comms={c['comm_names'][:3]}")
